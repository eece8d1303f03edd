"""The cache layer: its tables, its switch, its one invalidation path, and its
verify mode.

Quax keeps what rules computed, so as not to compute it again: the dispatch cache
(`quax._dispatch._registry`); programs, each a `Table` whose entries go with
their code and keyed by `quax._caching._keys.program_key`: compiled eager programs
(`quax._caching._eager`), the equations rules staged while a program is staged
(`quax._caching._replay`) and the jitted bodies of nested `jit`s
(`quax._caching._nested`); and what it works out once (`remembered`), per jaxpr
(the interpreter's steps, `quax._transform._interpreter`; whether a jaxpr stages a
value, `quax._caching._per_jaxpr`; the quaxified functions of higher-order
primitives' bodies, `quax._rules._bodies`; which registered function a `jit` body
is, `quax._rules._functions`) or per small evaluation (the signs of symbolic
zeros, `quax.zero._rules`). Each entry is keyed by everything the rules may read (see
`quax._caching._keys`), and a cache may only return what running the rules would
return: the same staged equations, the same output types and static fields.

- Every table that grows with the programs it sees is a `Table`: bounded, safe
  under threads, its entries dropped with their code; `python -m quax caches`
  reports each one's size and bound (`report`).
- `invalidate` is the one path by which entries are dropped: registering a rule
  and declaring a setting call it (a change of JAX's configuration is part of every
  key instead, through its trace context).
- `quax.caching(False)`, or `QUAX_CACHING=0` in the environment, turns every cache
  off: rules then run for every primitive, every time. The switch holds in the
  context that sets it (a `contextvars.ContextVar`, as NumPy's `np.errstate`): the
  thread, and the asyncio tasks it starts from then on; other threads keep their
  own, so that blocks of two threads that overlap each restore their own setting.
- With `QUAX_VERIFY_CACHES=1` in the environment, every cache hit is also
  recomputed by the rules and compared with what the cache gave (what it stages,
  and its outputs' types and static fields); a mismatch raises a
  `CacheMismatchError` naming the cache and the key components that differ from
  when the entry was made (a key that leaves out one of them). What each entry was
  made with is kept in one table (`made_with`, `check`).
"""

import contextvars
import operator
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .._compat import without_unused


__all__ = [
    "ADDRESS",
    "CacheMismatchError",
    "Table",
    "alike",
    "caching",
    "check",
    "invalidate",
    "is_enabled",
    "made_with",
    "mismatch",
    "on_invalidate",
    "remembered",
    "report",
    "staged",
    "verify_dispatch",
    "verifying",
]

_MISSING: Any = object()


class Table:
    """One bounded table of a cache: keys to entries, each dropped with the code it
    was made for, where given (a jaxpr, a library function, which the key holds
    weakly: a `weakref.ref`, or its `id` while it lives), so that the table keeps no
    jaxpr alive; and beyond `bound` entries, the oldest first, as a read (on the hot
    paths) takes no lock and does not reorder. Every write holds the table's lock.

    **Arguments:**

    - `name`: what `python -m quax caches` calls it.
    - `bound`: the most entries it keeps.
    - `coded`: whether its entries may go with a code (`put`'s `code`). A table
        whose entries never do has no dead keys to drop before a read, so that
        `read` is its dict's own `get`, one C call on the hot paths.
    """

    __slots__ = (
        "__weakref__",
        "_data",
        "_dead",
        "_finalizers",
        "_lock",
        "bound",
        "coded",
        "name",
        "read",
    )

    def __init__(self, name: str, bound: int, coded: bool = True) -> None:
        self.name = name
        self.bound = bound
        self.coded = coded
        self._data: OrderedDict[Any, Any] = OrderedDict()
        # `get`, or where no entry goes with a code, the dict's own.
        self.read: Callable[..., Any] = self.get if coded else self._data.get
        self._lock = threading.RLock()  # a key's `__eq__` may read another table
        self._finalizers: dict[Any, weakref.finalize] = {}
        # Keys whose code died, dropped at the next `get` or `put`: a finalizer
        # runs wherever the garbage collector does, perhaps inside this table's
        # own operations, so it only appends here.
        self._dead: list[Any] = []
        _tables.append(self)

    def get(self, key: Any, default: Any = None) -> Any:
        """The entry of `key`, or `default`: a read of a dict, which is atomic.
        Raises `TypeError` for a key that cannot be hashed."""
        if self._dead:
            self._drop_dead()
        return self._data.get(key, default)

    def put(self, key: Any, entry: Any, code: Any = None) -> None:
        """Keep `entry` under `key`, until `code` (the object the key holds weakly,
        if any) dies or the entry is the oldest beyond the bound."""
        if code is not None and not self.coded:
            raise ValueError(f"The entries of {self.name!r} go with no code.")
        with self._lock:
            if self._dead:
                self._drop_dead()
            if code is not None and key not in self._finalizers:
                self._finalizers[key] = weakref.finalize(code, self._dead.append, key)
            self._data[key] = entry
            self._data.move_to_end(key)
            while len(self._data) > self.bound:
                self.pop(next(iter(self._data)))

    def pop(self, key: Any, default: Any = None) -> Any:
        """Drop the entry of `key` and return it (`default` when there is none)."""
        with self._lock:
            finalizer = self._finalizers.pop(key, None)
            if finalizer is not None:
                finalizer.detach()
            return self._data.pop(key, default)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            for finalizer in self._finalizers.values():
                finalizer.detach()
            self._finalizers.clear()
            self._dead.clear()
            self._data.clear()

    def __len__(self) -> int:
        if self._dead:
            self._drop_dead()
        return len(self._data)

    def __repr__(self) -> str:
        return f"Table({self.name!r}, {len(self)}/{self.bound})"

    def _drop_dead(self) -> None:
        with self._lock:
            while self._dead:
                self.pop(self._dead.pop())


_tables: list[Table] = []


def report() -> list[tuple[str, int, str]]:
    """Each cache table's name, size (entries) and bound (as text)."""
    rows = [(name, *measure()) for name, measure in _measured]
    return rows + [(t.name, len(t), str(t.bound)) for t in _tables]


# Tables that are not a `Table` (the dispatch cache, read on every primitive), by
# name, with what measures their size and gives their bound.
_measured: list[tuple[str, Callable[[], tuple[int, str]]]] = []


def measured(name: str, measure: Callable[[], tuple[int, str]]) -> None:
    """List the table `name`, whose size and bound `measure()` gives, in `report`."""
    _measured.append((name, measure))


# Switching caches off ----------------------------------------------------------------

# Whether the caches keep and return entries, in each context (read on every lookup,
# through `is_enabled`); a thread starts from the environment's setting.
_enabled = contextvars.ContextVar(
    "quax_caching", default=os.environ.get("QUAX_CACHING", "1") != "0"
)
# Whether every hit is also recomputed and compared (see the module's docstring).
verifying = os.environ.get("QUAX_VERIFY_CACHES", "") not in ("", "0")

# Whether the caches keep and return entries in this context (`quax.caching`):
# `_enabled.get`, bound once, so that `is_enabled()` is one C call.
is_enabled: Callable[[], bool] = _enabled.get

_hooks: list[Callable[[], None]] = []


def on_invalidate(hook: Callable[[], None]) -> None:
    """Call `hook` whenever the caches are invalidated (a cache whose tables are
    not `Table`s drops its entries there)."""
    _hooks.append(hook)


def invalidate() -> None:
    """Drop every entry of every cache: after a `register`, a new setting, or when
    the caches are switched."""
    for table in list(_tables):
        table.clear()
    for hook in list(_hooks):
        hook()


class caching:
    """Turn every quax cache on or off: the dispatch cache, compiled eager
    programs, replayed recordings and nested `jit` bodies. With caches off, rules
    run for every primitive, every time: slower, and a way to tell whether a
    result comes from a cache.

    ```python
    quax.caching(False)  # off from now on, in this thread
    with quax.caching(False):  # off inside the block only
        ...
    ```

    On by default; off from the start with `QUAX_CACHING=0` in the environment.
    The setting belongs to the context that sets it, as NumPy's `np.errstate`
    does (a `contextvars.ContextVar`): this thread, and the asyncio tasks it starts
    afterwards. Other threads keep their own setting, so that two threads whose
    blocks overlap each have theirs off inside their block and back as it was
    after it; a new thread starts from the environment's setting. Every cache is
    emptied whenever the setting is set.

    **Arguments:**

    - `enabled`: whether the caches keep and return entries.

    **Returns:**

    An object that restores the previous setting (of this context) when used as a
    context manager (`with quax.caching(False): ...`); `previous` holds that
    setting.
    """

    def __init__(self, enabled: bool) -> None:
        self.previous = _set(enabled)

    def __enter__(self) -> "caching":
        return self

    def __exit__(self, *exc: object) -> None:
        _set(self.previous)


def _set(on: bool) -> bool:
    previous = _enabled.get()
    _enabled.set(bool(on))
    invalidate()
    return previous


# Verify mode --------------------------------------------------------------------------


class CacheMismatchError(AssertionError):
    """A cache hit differed from what the rules give when run afresh (in verify
    mode, `QUAX_VERIFY_CACHES=1`): the cache's key leaves out something the rules
    read. A bug of quax (or of a family's `add_setting`): report it."""


def mismatch(
    cache: str,
    what: str,
    names: Sequence[str],
    made: tuple[Any, ...],
    now: tuple[Any, ...],
) -> CacheMismatchError:
    """The error for a hit of `cache` that differs from a fresh run in `what`: it
    names the key components (`names`) whose values differ between when the entry
    was made (`made`) and now (`now`)."""
    differing = [n for n, a, b in zip(names, made, now, strict=True) if not _same(a, b)]
    if differing:
        which = (
            f"The key components that differ from when the entry was made: "
            f"{', '.join(differing)}; the key leaves "
            f"{'it' if len(differing) == 1 else 'them'} out."
        )
    else:
        which = (
            "No key component differs from when the entry was made: the rules "
            "read something that no key holds."
        )
    return CacheMismatchError(
        f"Verify mode (QUAX_VERIFY_CACHES=1): a hit of quax's cache of {cache} "
        f"differs from running the rules afresh, in {what}. {which} This is a bug "
        "of quax's caches (or of a setting that a family reads without declaring "
        "it with `quax.plugins.add_setting`): please report it. Meanwhile, "
        "`quax.caching(False)` (or `QUAX_CACHING=0`) turns the caches off."
    )


def alike(a: Any, b: Any) -> bool:
    """Whether `a` and `b` (what a cache entry gives, as its outputs' static fields
    or treedef) are equal by `==` and alike in text: a type may make its equality
    looser than what rules read (quax-units' display units) or stricter than its
    text (quax-named's anonymous axes). `False` where they cannot be compared."""
    try:
        return bool(a == b) and repr(a) == repr(b)
    except Exception:  # fields that cannot be compared
        return False


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and repr(a) == repr(b)
    except Exception:  # components that cannot be compared: by text
        return repr(a) == repr(b)


# An object's address in its text (`<function f at 0x7f...>`): another trace of the
# same code makes other objects.
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def staged(traced: Any) -> str:
    """Verify mode: what a traced `jax.jit` (`jax.jit(f).trace(...)`) stages and
    gives, as text comparable across traces: its jaxpr less the equations nothing
    reads (whether a trace still holds them depends on when the garbage collector
    ran, and verify mode itself runs rules whose equations it drops), its
    constants, and its outputs' types, static fields and avals; without objects'
    addresses."""
    closed = traced.jaxpr
    jaxpr = without_unused(closed.jaxpr)
    return ADDRESS.sub("", f"{jaxpr}\n{closed.consts!r}\n{traced.out_info!r}")


# What each entry of every cache was made with, in verify mode: its key's
# components and what it gave or staged (its evidence), by the cache's name and the
# entry's key; each goes with the code its entry was made for.
_made = Table("verify mode: what each cache entry was made with", 16384)


def made_with(
    cache: str, key: Any, parts: tuple[Any, ...], evidence: Any, code: Any = None
) -> None:
    """Verify mode: keep what the entry `key` of `cache` was made with, its key's
    components `parts` and `evidence` (what it gives or stages, comparable with
    `==`), until `code` (what it was made for, if held weakly) dies."""
    if verifying:
        _made.put((cache, key), (parts, evidence), code)


def check(
    cache: str,
    key: Any,
    names: Sequence[str],
    parts: tuple[Any, ...],
    evidence: Any,
    what: str,
    same: Callable[[Any, Any], bool] = operator.eq,
) -> None:
    """Verify mode: raise a `CacheMismatchError` when `evidence`, what a hit of the
    entry `key` of `cache` gives when computed afresh, is not the `same` as what the
    entry was made with (`made_with`; an entry made before verify mode was on is
    not checked). `names` name the key's components `parts`; `what` says what the
    evidence is, for the error."""
    made = _made.get((cache, key))
    if made is not None and not same(made[1], evidence):
        raise mismatch(cache, what, names, made[0], parts)


def remembered(
    table: Table,
    key: Any,
    names: Sequence[str],
    parts: tuple[Any, ...],
    compute: Callable[[], Any],
    what: str,
    same: Callable[[Any, Any], bool] = operator.eq,
    code: Any = None,
) -> Any:
    """`compute()`, kept in `table` under `key` (whose components `parts` are
    named by `names`) while the caches are on, until `code` (what `compute` reads,
    held weakly by the key) dies. In verify mode, a hit is computed
    afresh and raises a `CacheMismatchError` when it is not the `same` (`what`
    says what is compared). A key that cannot be hashed is not kept."""
    if not _enabled.get():
        return compute()
    try:
        out = table.get(key, _MISSING)
    except TypeError:  # a key that cannot be hashed
        return compute()
    if out is _MISSING:
        out = compute()
        table.put(key, out, code)
        made_with(table.name, key, parts, out, code)
    elif verifying:
        check(table.name, key, names, parts, compute(), what, same)
    return out


_DISPATCH_KEY = ("primitive and input types", "rules generation")


def verify_dispatch(key: Any, resolution: Any, generation: int) -> None:
    """Verify mode: compare the `resolution` (a `quax.Resolution`) of the dispatch
    cache's `key`, made at the registry's `generation`, with the first one made
    for that key, and raise when they chose otherwise (the dispatch cache stays
    empty in verify mode)."""
    cache, parts = "rules (the dispatch cache)", (key, generation)
    made = _made.get((cache, key))
    if made is None:
        return made_with(cache, key, parts, resolution)
    what = f"the rule chosen ({resolution.reason}, where it chose {made[1].reason})"
    check(cache, key, _DISPATCH_KEY, parts, resolution, what, _same_rule)


def _same_rule(a: Any, b: Any) -> bool:
    return (a.kind, a.function) == (b.kind, b.function)
