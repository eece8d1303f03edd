"""The jitted bodies of nested `jit`s, kept per key.

A `jit` inside a quaxified function that no `quax.register_function` rule runs for
(see `quax._rules._functions`) is bound as a `jit` of its quaxified body, so that
JAX compiles it once, as it would without quax. The jitted body is
kept per `program_key` (see `quax._caching._keys`): the code (the jaxpr's `id`, the
`jit`'s name, `keep_unused`, shardings and donated arguments), the inputs (the
plain arguments' slots: a `ConstKey` for a constant, an aval for an argument passed
in, and the values' strict structures) and the context; JAX's own cache keys the
rest (the avals of what is passed in), and traces a kept body once per structure
of its arguments.

Plain arguments known now up to `quax._caching._keys.MAX_CONSTANT_SIZE` elements
stay constants of the body; larger ones are passed in by their aval, until a rule
asks [`quax.known_constant`][] about one: the body then takes it by value, from
then on for this jaxpr and its arguments' structures (an entry of the same table,
under a key whose code starts with `_BY_VALUE`).

In verify mode (`QUAX_VERIFY_CACHES=1`, see `quax._foundation._caches`), a hit traces
a fresh body on the call's arguments too, and raises when its outputs' types or the
program it stages (`quax._foundation._caches.staged`) differ from those of the kept
body's trace for the same arguments (the trace JAX keeps and runs). The rule
that calls it (`quax._rules._control_flow`) gives the quaxified function of a
jaxpr, which this layer cannot build.
"""

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._compat import Tracer, is_unspecified, release_traces, typeof
from .._dispatch._known import ValueAsked, stand_in_token, standing_in
from .._foundation import _caches
from .._foundation._caches import Table
from .._values._value import is_value
from . import _keys
from ._keys import MAX_CONSTANT_SIZE, ConstKey, strict_structure


__all__ = ["MAX_NESTED_JITS", "call_body"]


def call_body(
    quaxify: Callable[[Any], Callable[..., Any]],
    jaxpr: Any,
    args: Sequence[Any],
    name: str,
    donated_invars: tuple[bool, ...],
    in_shardings: tuple[Any, ...],
    keep_unused: bool,
) -> list[Any]:
    """Call the jitted quaxified body of a nested `jit` on `args`, kept per key.

    **Arguments:**

    - `quaxify`: the quaxified function of a jaxpr (called when a body is traced).
    - `jaxpr`: the closed jaxpr of the `jit`'s body.
    - `args`: its inputs: values, tracers and concrete plain arrays or scalars.
    - `name`, `donated_invars`, `in_shardings`, `keep_unused`: the `jit`'s params.

    **Returns:**

    The body's outputs, as a list.
    """
    # Plain arguments known now (Python and NumPy scalars, concrete arrays) up to
    # `MAX_CONSTANT_SIZE` elements stay constants of the body, keyed by value, as
    # they would be without the `jit`: rules may need their values (an exponent, a
    # constant of NaNs). Larger ones are passed in as arguments, as JAX passes
    # them, and the body is keyed by their avals: an eager loop calling a jitted
    # library function on fresh data compiles it once. A rule that asks
    # `known_constant` for one of those would get its value without the `jit`:
    # the body then runs again with that argument as a constant too, keyed by
    # value (see `ConstKey`: a NumPy array by its bytes), from then on for this
    # jaxpr. Only the arguments rules asked about are keyed so: hashing the bytes
    # of every large array on every call would cost what the cache saves.
    known = [not is_value(a) and not isinstance(a, Tracer) for a in args]
    large = [
        k and typeof(a).size > MAX_CONSTANT_SIZE
        for a, k in zip(args, known, strict=True)
    ]
    common = (
        name,
        keep_unused,
        tuple(
            None if is_unspecified(s) or is_value(a) or k else s
            for s, a, k in zip(in_shardings, args, known, strict=True)
        ),
    )
    # The large arguments that rules asked about, by position: kept per jaxpr and
    # arguments' structures (in verify mode, found afresh and compared).
    asked: frozenset[int] = frozenset()
    hint = None
    if any(large) and _caches.is_enabled():
        hint = _keys.program_key(
            (_BY_VALUE, id(jaxpr), *common),
            tuple(strict_structure(a) if is_value(a) else typeof(a) for a in args),
        )
        kept = _bodies.get(hint[0])
        if kept is not None and not _caches.verifying:
            asked = kept
    while True:
        slots = tuple(
            (ConstKey(a) if not g or i in asked else typeof(a)) if k else None
            for i, (a, k, g) in enumerate(zip(args, known, large, strict=True))
        )
        # A token for each concrete argument passed in by its aval.
        tokens = {
            i: object()
            for i, s in enumerate(slots)
            if s is not None and type(s) is not ConstKey
        }
        try:
            out = _call(quaxify, jaxpr, common, donated_invars, slots, args, tokens)
        except ValueAsked as e:
            i = next((i for i, t in tokens.items() if t is e.token), None)
            if i is None:
                raise  # an enclosing `jit`'s argument
            release_traces(e)
            asked |= {i}
            continue
        if hint is not None:
            key, parts = hint
            kept = _bodies.get(key)
            if kept is None or (kept != asked and not _caches.verifying):
                _bodies.put(key, asked, jaxpr)
                _caches.made_with(_bodies.name, key, parts, asked, jaxpr)
            elif _caches.verifying:
                what = "the plain arguments whose values rules ask for"
                _caches.check(_bodies.name, key, _keys.PROGRAM, parts, asked, what)
        return out


# The jitted quaxified bodies, by `program_key` (the code: the jaxpr's `id`, the
# `jit`'s name, `keep_unused`, shardings and donated arguments; the inputs: the
# plain arguments' slots and the values' structures); and, per jaxpr and arguments'
# structures (a key whose code starts with `_BY_VALUE`), the large plain arguments
# whose value rules asked for (the body takes them by value). Each entry goes with
# its jaxpr, and so with the function whose `jit` made it (a compiled body holds
# megabytes), as well as beyond the bound, which both kinds of entry share.
MAX_NESTED_JITS = 256
_bodies = Table("nested jit bodies", MAX_NESTED_JITS)
_BY_VALUE = "plain arguments taken by value"


def _call(
    quaxify: Callable[[Any], Callable[..., Any]],
    jaxpr: Any,
    common: tuple[Any, ...],
    donated_invars: tuple[bool, ...],
    slots: tuple[Any, ...],
    args: Sequence[Any],
    tokens: dict[int, object],
) -> Any:
    """Call the jitted body of `jaxpr` on `args`: each slot is a constant (a
    `ConstKey`), or the aval of a concrete argument passed in (whose value the
    call with its token in `tokens` knows), or `None` for a traced or value
    argument."""
    dynamic = [i for i, c in enumerate(slots) if not isinstance(c, ConstKey)]
    # Concrete arguments are never donated: they stay the caller's.
    donate = tuple(
        j for j, i in enumerate(dynamic) if donated_invars[i] and slots[i] is None
    )
    stand_ins = [
        tokens[i] if slots[i] is not None else stand_in_token(args[i]) for i in dynamic
    ]
    passed = [args[i] for i in dynamic]
    # JAX keys the body's trace by the values' treedefs, whose static fields may
    # compare loosely (quax-units' display units): each text has its own body.
    structures = tuple(
        strict_structure(args[i]) if slots[i] is None and is_value(args[i]) else None
        for i in dynamic
    )
    # The settings rules read while the body traces, and the rest of the context.
    key, parts = _keys.program_key((id(jaxpr), *common, donate), (slots, structures))

    caching = _caches.is_enabled()
    jitted = _bodies.get(key) if caching else None
    made = None
    if jitted is None:
        jitted = made = _jitted(quaxify(jaxpr), common, donate, slots)
    previous = _pending.tokens
    _pending.tokens = stand_ins
    try:
        out = jitted(*passed)
        if made is None and _caches.verifying:
            # A hit: what the kept body stages on these arguments (JAX keeps the
            # trace it runs) against what a fresh body stages on them. The entry
            # was made with its key's components only, which the error compares.
            kept = _caches.staged(jitted.trace(*passed))
            fresh = _jitted(quaxify(jaxpr), common, donate, slots).trace(*passed)
            what = "its outputs' types or the program it stages"
            _caches.check(
                _bodies.name,
                key,
                _keys.PROGRAM,
                parts,
                _caches.staged(fresh),
                what,
                lambda _, now: now == kept,
            )
    finally:
        _pending.tokens = previous
    if made is not None and caching:  # kept once a call went through
        _bodies.put(key, made, jaxpr)
        _caches.made_with(_bodies.name, key, parts, None, jaxpr)
    return out


class _Pending(threading.local):
    # Per argument of the `jit` call being made: the token of the call that knows
    # its value, when it stands in for a concrete plain array (see `standing_in`).
    tokens: list[Any]

    def __init__(self) -> None:
        self.tokens = []


_pending = _Pending()


def _jitted(
    fn: Callable[..., Any],
    common: tuple[Any, ...],
    donate: tuple[int, ...],
    slots: tuple[Any, ...],
) -> Callable[..., Any]:
    """`jax.jit` of `fn` (a quaxified jaxpr), with the constants among `slots` (see
    `_call`) closed over, named, sharded and donating as `common` and `donate` say.
    Cached (see `_call`), so that JAX's own cache hits when the same nested `jit`
    comes back."""
    name, keep_unused, shardings = common

    def body(*dynamic: Any) -> Any:
        # While JAX traces it: `known_constant` asked about an argument standing in
        # for a concrete one raises for the call that knows its value.
        tokens = _pending.tokens
        marked = [i for i, t in enumerate(tokens) if t is not None]
        with standing_in([dynamic[i] for i in marked], [tokens[i] for i in marked]):
            it = iter(dynamic)
            return fn(
                *[c.value if isinstance(c, ConstKey) else next(it) for c in slots]
            )

    body.__name__ = body.__qualname__ = name
    kwargs: dict[str, Any] = {}
    if not all(s is None for s in shardings):
        kept = zip(shardings, slots, strict=True)
        kwargs["in_shardings"] = tuple(
            s for s, c in kept if not isinstance(c, ConstKey)
        )
    return jax.jit(body, donate_argnums=donate, keep_unused=keep_unused, **kwargs)
