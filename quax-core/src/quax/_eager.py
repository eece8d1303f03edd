"""Eager quax: library code on values runs as one compiled program per call.

Outside any `jit`, plain JAX runs each `jax.numpy` function as one compiled, cached
program. Quax, run eagerly, would bind the function's equations one by one, each an
op-by-op dispatch. Instead, library code called on values eagerly (an inlined `jit`,
a Python operator on a traced value, `quax.quaxify` of a jitted function or of an
`operator` function) runs as the compiled program of its quaxified body, cached by
the code, the values' types and static fields (strictly: each program sees one text
of them and fields equal by `==`, as a type may make their equality loose, or
stricter than their text, as an object equal only to itself), the plain inputs, and
the settings that rules read (`quax.zero.ieee_strict`).

In a compiled program, rules see the leaves of values as tracers, where equation by
equation they see concrete arrays. So that no rule answers otherwise there, the
first call of each code and structure runs equation by equation, and its program is
only traced: it is kept when it gives the same output structure (types, static
fields equal and alike in text, shapes and dtypes), and the code runs equation by
equation from then on when it does not, or when tracing it fails for any reason (a
rule needing a concrete leaf, a refusal, an error), or when a rule asks
[`quax.known_constant`][] for the value of a leaf of the program (equation by
equation it would be known). A rule that reads concrete leaves must do so through
`quax.known_constant`: the output check only sees the first call. On by default;
[`quax.set_eager_compilation`][] (or `QUAX_EAGER_COMPILE=0` in the environment)
turns it off.

Plain inputs stay constants of the program, as they are when the code runs equation
by equation (rules may need their values: an exponent, a known fill), so they are
part of the cache key: only small ones (`MAX_CONSTANT_SIZE` elements), and at most
`MAX_PROGRAMS` sets of them per code and structure; beyond that, and while
materialisations are tracked (the report names each primitive as it runs), the
code runs equation by equation as before. Only library code runs this way: the
user's own Python between calls runs as written, with its side effects.
"""

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from . import _registry
from ._compat import Tracer, current_trace, eager_program, typeof
from ._values import is_value, tracking


__all__ = [
    "MAX_CONSTANT_SIZE",
    "MAX_PROGRAMS",
    "ConcreteNeeded",
    "ConstKey",
    "add_setting",
    "call_compiled",
    "environment_setting",
    "require_concrete",
    "set_eager_compilation",
    "settings_key",
    "value_parts",
]

MAX_CONSTANT_SIZE = 64
MAX_PROGRAMS = 8

_ARRAY_LEAVES = (jax.Array, np.ndarray, np.generic, int, float, complex)


class ConstKey:
    """A constant (plain) input of compiled code as part of a cache key: equal to
    another for the same object, or for an equal small array of the same type."""

    __slots__ = ("aval", "data", "value")

    def __init__(self, value: Any) -> None:
        self.value = value  # kept alive, so that its `id` is not reused
        self.aval = typeof(value)
        array = np.asarray(value)
        self.data = array.tobytes() if array.size <= MAX_CONSTANT_SIZE else id(value)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ConstKey)
            and self.aval == other.aval
            and self.data == other.data
        )

    def __hash__(self) -> int:
        return hash((self.aval, self.data))


# The key text of each value seen, by `id` (kept off the value: an attribute would
# change its pytree structure), dropped with the value.
_keys: dict[int, tuple[Any, str, Any]] = {}


def value_parts(x: Any) -> tuple[str, list[Any], Any]:
    """A strict key of the value `x`'s pytree structure (its types and static
    fields, by their text: `==` may be loose, as for quax-units' display units), its
    leaves, and its treedef. The text is computed once per value, for as long as
    its treedef stays equal (the leaves are read each time). The key is `""` when a
    leaf is not an array: such a value has no compiled program."""
    leaves, treedef = jtu.tree_flatten(x)
    kept = _keys.get(id(x))
    if kept is not None and kept[0]() is x and kept[2] == treedef:
        return kept[1], leaves, treedef
    arrays = all(isinstance(leaf, _ARRAY_LEAVES) for leaf in leaves)
    key = repr(treedef) if arrays else ""
    ident = id(x)
    try:
        ref = weakref.ref(x, lambda _: _keys.pop(ident, None))
    except TypeError:  # not weakly referable: not kept
        return key, leaves, treedef
    _keys[ident] = (ref, key, treedef)
    return key, leaves, treedef


def environment_setting() -> bool:
    """The setting at import: on, unless the environment has `QUAX_EAGER_COMPILE=0`."""
    return os.environ.get("QUAX_EAGER_COMPILE", "1") != "0"


_enabled = environment_setting()


def set_eager_compilation(enabled: bool) -> bool:
    """Run library code called eagerly on values (every `jax.numpy` function, Python
    operators, `quax.quaxify` of a jitted function) as one compiled, cached program
    per code and value structure, instead of equation by equation. On by default
    (off with the environment variable `QUAX_EAGER_COMPILE=0`).

    Results are the same either way, and the user's own Python (side effects,
    `jax.debug` calls) runs as written. The first call of each code and structure
    runs equation by equation, and its program is kept only if it gives the same
    output structure; code whose rules need a concrete leaf (through
    [`quax.known_constant`][], or a JAX concretization error) keeps running equation
    by equation.

    **Arguments:**

    - `enabled`: whether eager library code runs compiled.

    **Returns:**

    The previous setting, to restore it (`quax.set_eager_compilation(previous)`).
    Compiled programs are dropped whenever the setting is set.
    """
    global _enabled
    previous = _enabled
    _enabled = bool(enabled)
    _programs.clear()
    return previous


class ConcreteNeeded(BaseException):
    """A rule asked for the value of a leaf of the compiled eager program being
    traced: equation by equation, it would be concrete, and the rule might answer
    otherwise. The code then runs equation by equation. A `BaseException`, so that
    a rule's `except Exception` cannot turn it into a more general answer."""


def require_concrete(x: Any) -> None:
    """Raise `ConcreteNeeded` when `x` is a tracer of the compiled eager program
    being traced (equation by equation, it would be a concrete array)."""
    trace = eager_program.trace
    if trace is not None and isinstance(x, Tracer) and x._trace is trace:
        raise ConcreteNeeded


# In a program table: this code and structure run equation by equation.
_BY_EQUATION: Any = object()


class _State(threading.local):
    # Whether this thread runs a first call equation by equation, to check its
    # program: code inside it runs equation by equation too.
    checking: bool = False


_state = _State()

# The programs of each code, by its `id` (a `WeakKeyDictionary` would compare keys
# with `__eq__`, which `jax.numpy`'s ufuncs make slow), dropped with the code, and
# all of them when a rule is registered (they may dispatch otherwise now).
_programs: dict[int, tuple[Any, dict[Any, Any]]] = {}
_programs_generation = _registry.rules_generation()


def _programs_of(code: Any) -> dict[Any, Any] | None:
    key = id(code)
    entry = _programs.get(key)
    if entry is not None and entry[0]() is code:
        return entry[1]
    try:
        ref = weakref.ref(code, lambda _, table=_programs: table.pop(key, None))
    except TypeError:  # not weakly referable: not cached
        return None
    programs: dict[Any, Any] = {}
    _programs[key] = (ref, programs)
    return programs


def call_compiled(
    code: Any,
    quaxified: Callable[[], Callable[..., Any]],
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
) -> tuple[bool, Any]:
    """Run `quaxified()(*args, **kwargs)` as one compiled program, if it can.

    **Arguments:**

    - `code`: what the program is cached under (a jaxpr, a library function).
    - `quaxified`: builds the quaxified function to compile (called once per
        program).
    - `args`, `kwargs`: its inputs: values, plain arrays or Python scalars, and
        pytrees of them.

    **Returns:**

    `(True, output)`, or `(False, None)` when the call must run as before
    (materialisations tracked, no value, a large or traced plain input, too many
    programs for `code` already, or code that runs equation by equation).
    """
    global _programs_generation
    if not _enabled or _state.checking or tracking():
        return False, None
    if _registry._generation != _programs_generation:
        # A rule was registered: the programs may dispatch otherwise now.
        _programs.clear()
        _programs_generation = _registry._generation
    if kwargs or not all(map(_is_input, args)):
        inputs, treedef = jtu.tree_flatten((tuple(args), kwargs), is_leaf=is_value)
    else:
        inputs, treedef = args, len(args)
    leaves: list[Any] = []
    key: list[Any] = [treedef]
    values = False
    for x in inputs:
        if is_value(x):
            structure, value_leaves, value_treedef = value_parts(x)
            if not structure:
                return False, None
            # Both the text and the treedef: static fields may compare loosely (by
            # `==`, as quax-units' display units) or strictly (by identity, as
            # quax-named's anonymous axes, whose text is alike).
            key.append(structure)
            key.append(value_treedef)
            leaves += value_leaves
            values = True
        elif (
            isinstance(x, _ARRAY_LEAVES)
            and not isinstance(x, Tracer)
            and np.size(x) <= MAX_CONSTANT_SIZE
        ):
            key.append(ConstKey(x))
        else:
            return False, None
    if not values:
        return False, None
    programs = _programs_of(code)
    if programs is None:
        return False, None
    program_key = (*key, *settings_key())
    try:
        program = programs.get(program_key)
    except TypeError:  # a static field that cannot be hashed
        return False, None
    if program is _BY_EQUATION:
        return False, None
    if program is not None:
        return True, program(*leaves)
    if len(programs) >= MAX_PROGRAMS:
        return False, None
    # The first call: equation by equation, with the program traced beside it.
    fn = quaxified()
    _state.checking = True
    try:
        out = fn(*args, **(kwargs or {}))
    finally:
        _state.checking = False
    programs[program_key] = _checked_program(fn, inputs, treedef, leaves, out)
    return True, out


def _is_input(x: Any) -> bool:
    """Whether `x` is one input (no pytree of them) of compiled code."""
    return is_value(x) or isinstance(x, _ARRAY_LEAVES)


def _checked_program(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    treedef: Any,
    leaves: list[Any],
    expected: Any,
) -> Any:
    """The compiled program of `fn` on `inputs` (the values among them are given as
    their leaves), if tracing it on `leaves` gives the structure of `expected`
    (what `fn` gave equation by equation); else `_BY_EQUATION`."""
    program = _compile(fn, inputs, treedef)
    try:
        traced = program.trace(*leaves)
    except (ConcreteNeeded, Exception):
        # A rule needed a concrete leaf or refused: equation by equation, it ran.
        return _BY_EQUATION
    got, got_tree = jtu.tree_flatten(traced.out_info)
    want, want_tree = jtu.tree_flatten(expected)
    try:
        same = got_tree == want_tree and repr(got_tree) == repr(want_tree)
    except Exception:  # static fields that cannot be compared
        same = False
    if not same or any(
        (g.shape, g.dtype, g.weak_type) != _shape_dtype(x)
        for g, x in zip(got, want, strict=True)
    ):
        return _BY_EQUATION
    return program


def _shape_dtype(x: Any) -> tuple[Any, ...]:
    aval = typeof(x)
    return aval.shape, aval.dtype, aval.weak_type


# The settings that rules read while they trace, which a compiled program fixes (the
# core's symbolic zeros add their `ieee_strict` when they are imported).
_settings: list[Callable[[], Any]] = []


def add_setting(read: Callable[[], Any]) -> None:
    """Make the setting that `read()` returns part of every compiled program's key
    (eager programs here, and the quaxified bodies of nested `jit`s)."""
    _settings.append(read)


def settings_key() -> tuple[Any, ...]:
    """The current values of the settings given to `add_setting`."""
    return tuple(read() for read in _settings)


def _compile(fn: Callable[..., Any], inputs: Sequence[Any], treedef: Any) -> Any:
    """`fn` on `inputs` as a jitted function of the leaves of the values among them
    (the other inputs are constants of the program)."""
    slots: list[tuple[Any, int]] = []  # per input: its treedef and leaf count, or
    for x in inputs:  # the constant itself
        if is_value(x):
            _, value_leaves, value_treedef = value_parts(x)
            slots.append((value_treedef, len(value_leaves)))
        else:
            slots.append((x, -1))

    def body(*leaves: Any) -> Any:
        rebuilt = []
        start = 0
        for x, count in slots:
            if count < 0:
                rebuilt.append(x)
            else:
                rebuilt.append(jtu.tree_unflatten(x, leaves[start : start + count]))
                start += count
        if isinstance(treedef, int):
            args, kwargs = rebuilt, {}
        else:
            args, kwargs = jtu.tree_unflatten(treedef, rebuilt)
        outer = eager_program.trace
        eager_program.trace = current_trace()
        try:
            return fn(*args, **kwargs)
        finally:
            eager_program.trace = outer

    body.__name__ = body.__qualname__ = getattr(fn, "__name__", "quaxified")
    return jax.jit(body)
