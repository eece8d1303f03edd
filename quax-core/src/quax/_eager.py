"""Eager quax: library code on values runs as one compiled program per call.

Outside any `jit`, plain JAX runs each `jax.numpy` function as one compiled, cached
program. Quax, run eagerly, would bind the function's equations one by one, each an
op-by-op dispatch. Instead, library code called on values eagerly (an inlined `jit`,
a Python operator on a traced value, `quax.quaxify` of a jitted function or of an
`operator` function) runs as the compiled program of its quaxified body, cached by
the code, the values' types and static fields (each program sees one text of
them, as a type may make their equality loose), the plain inputs, and the settings
that rules read (`quax.zero.ieee_strict`).

This is opt-in ([`quax.set_eager_compilation`][], or `QUAX_EAGER_COMPILE=1`): in a
compiled program, rules see the leaves of values as tracers, not concrete arrays. A
rule that reads concrete leaves may then answer otherwise: a sparse product sizes
its result for the worst case instead of exactly, and a tag that depends on a
known scalar is dropped. A rule that needs a concrete leaf (JAX raises a
concretization error) makes that call, and later calls of the same code and
structure, run equation by equation instead. Rules that read global settings
other than the zeros' `ieee_strict` must not be used with it.

Plain inputs stay constants of the program, as they are when the code runs equation
by equation (rules may need their values: an exponent, a known fill), so they are
part of the cache key: only small ones (`MAX_CONSTANT_SIZE` elements), and at most
`MAX_PROGRAMS` sets of them per code and structure; beyond that, and while
materialisations are tracked (the report names each primitive as it runs), the
code runs equation by equation as before. Only library code runs this way: the
user's own Python between calls runs as written, with its side effects.
"""

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from . import _registry
from ._compat import Tracer, typeof
from ._values import is_value, tracking


__all__ = [
    "MAX_CONSTANT_SIZE",
    "MAX_PROGRAMS",
    "ConstKey",
    "add_setting",
    "call_compiled",
    "set_eager_compilation",
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


_enabled = os.environ.get("QUAX_EAGER_COMPILE", "0") not in ("", "0")


def set_eager_compilation(enabled: bool) -> None:
    """Run library code called eagerly on values (every `jax.numpy` function, Python
    operators, `quax.quaxify` of a jitted function) as one compiled, cached program
    per code and value structure, instead of equation by equation. Off by default
    (or as the environment variable `QUAX_EAGER_COMPILE=1` sets it).

    Results are exact either way, and the user's own Python (side effects,
    `jax.debug` calls) runs as written. But inside a compiled program the rules see
    the leaves of values as tracers: a rule that reads concrete leaves (through
    [`quax.known_constant`][] or `==` on leaves) may pick a more general answer, such
    as a sparse product sized for its worst case. Rules that need a concrete leaf
    (JAX raises a concretization error) fall back to running equation by equation.
    Turn it on when the value types in use have rules that depend only on their
    types, static fields and small plain constants.

    **Arguments:**

    - `enabled`: whether eager library code runs compiled.

    **Returns:**

    Nothing. Compiled programs are dropped whenever the setting changes.
    """
    global _enabled
    _enabled = bool(enabled)
    _programs.clear()


# Raised while tracing a program whose rules needed a concrete leaf.
_NEEDS_CONCRETE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
)
# In a program table: this code and structure run equation by equation.
_BY_EQUATION: Any = object()


# The registry empties its dispatch cache whenever a rule is registered: an entry of
# this module's there says that no rule was registered since the programs were built.
_RULES_SEEN: Any = ("quax._eager", "rules seen")
_registry_cache: dict[Any, Any] = _registry._cache

# The programs of each code, by its `id` (a `WeakKeyDictionary` would compare keys
# with `__eq__`, which `jax.numpy`'s ufuncs make slow), dropped with the code.
_programs: dict[int, tuple[Any, dict[Any, Any]]] = {}


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
    code: Any, quaxified: Callable[[], Callable[..., Any]], args: Sequence[Any]
) -> tuple[bool, Any]:
    """Run `quaxified()(*args)` as one compiled program, if it can.

    **Arguments:**

    - `code`: what the program is cached under (a jaxpr, a library function).
    - `quaxified`: builds the quaxified function to compile (called once per
        program).
    - `args`: its inputs: values, and plain arrays or Python scalars.

    **Returns:**

    `(True, output)`, or `(False, None)` when the call must run as before
    (materialisations tracked, no value, a large or traced plain input, a value
    with other leaves than arrays, or too many programs for `code` already).
    """
    if not _enabled or tracking():
        return False, None
    if _RULES_SEEN not in _registry_cache:
        # A rule was registered since the programs were compiled: they may dispatch
        # otherwise now.
        _programs.clear()
        _registry_cache[_RULES_SEEN] = None
    leaves, treedef = jtu.tree_flatten(tuple(args), is_leaf=is_value)
    dynamic = []
    consts: list[ConstKey | None] = []
    structures = []
    for x in leaves:
        if is_value(x):
            dynamic.append(x)
            consts.append(None)
            structures.append(repr(jtu.tree_structure(x)))
        elif (
            isinstance(x, _ARRAY_LEAVES)
            and not isinstance(x, Tracer)
            and np.size(x) <= MAX_CONSTANT_SIZE
        ):
            consts.append(ConstKey(x))
        else:
            return False, None
    if not dynamic:
        return False, None
    programs = _programs_of(code)
    if programs is None:
        return False, None
    # `jax.jit` compares static fields with `==`, which a type may make loose (all
    # of quax-units' display units compare equal, so that `jit` compiles once per
    # dimension): eagerly, each call's static fields are its own, so programs are
    # keyed by their text too.
    key = (treedef, tuple(consts), tuple(structures), _modes())
    program = programs.get(key)
    if program is _BY_EQUATION:
        return False, None
    if program is None:
        if len(programs) >= MAX_PROGRAMS:
            return False, None
        program = _compile(quaxified(), treedef, consts)
        programs[key] = program
    try:
        return True, program(*dynamic)
    except _NEEDS_CONCRETE:
        programs[key] = _BY_EQUATION
        return False, None
    except TypeError as e:
        # A value with a leaf that is not an array (JAX says so before tracing).
        if str(e).startswith(_NOT_AN_ARRAY):
            return False, None
        raise


_NOT_AN_ARRAY = "Error interpreting argument"


# The settings that rules read while they trace, which a compiled program fixes (the
# core's symbolic zeros add their `ieee_strict` when they are imported).
_settings: list[Callable[[], Any]] = []


def add_setting(read: Callable[[], Any]) -> None:
    """Make the setting that `read()` returns part of every compiled program's key."""
    _settings.append(read)


def _modes() -> tuple[Any, ...]:
    return tuple(read() for read in _settings)


def _compile(
    fn: Callable[..., Any], treedef: Any, consts: list[ConstKey | None]
) -> Callable[..., Any]:
    def body(*dynamic: Any) -> Any:
        it = iter(dynamic)
        leaves = [next(it) if c is None else c.value for c in consts]
        return fn(*jtu.tree_unflatten(treedef, leaves))

    body.__name__ = body.__qualname__ = getattr(fn, "__name__", "quaxified")
    return jax.jit(body)
