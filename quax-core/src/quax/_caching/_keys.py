"""The one key builder of quax's caches.

Every cache that reuses what rules computed (compiled eager programs, replayed
recordings, nested `jit` bodies) keys its entries here, so that a key holds
everything the rules may read, alike in every cache:

- static fields: plain scalars, strings, dtypes and tuples of ints by value and
  type; Python and NumPy floats (real or complex) by their bits, since `0.0 ==
  -0.0` and `float.hex` gives one text for both signs of NaN, while rules may
  tell them apart; anything else by identity (`static_key`), but never a field
  that cannot be hashed (a NumPy array, a list: changed in place, it would keep
  its identity); a primitive's params alike (`params_key`);
- constants among a primitive's inputs (Python and NumPy scalars, 0-d NumPy
  arrays, small JAX arrays, as `x * 0.5`, `x / np.sqrt(d)` or `jnp.where(m, x,
  0.0)` pass them): by their type, aval and bits (`constant_key`), as rules may
  read their values; never a NumPy array by identity, as its owner may change it
  in place (see also `quax._caching._eager.ConstKey`);
- the context every key holds (`context`): the settings rules read (declared
  with `add_setting`, as `quax.zero.ieee_strict`), JAX's trace context (the
  settings JAX's own tracing caches key on: `enable_x64`, the default matmul
  precision, the mesh, ...), the debug-check flag, and the registry's
  generation (a key made before a `register` never meets one made after).
- what quax works out once per jaxpr (the interpreter's steps, whether it stages a
  value, the quaxified function of a higher-order primitive's body) is a function of
  the jaxpr's equations alone, and is keyed by the jaxpr alone, held weakly
  (`jaxpr_key`).

The three caches of programs (compiled eager programs, replayed recordings, nested
`jit` bodies) key an entry alike (`program_key`): the code (a jaxpr or a library
function, by identity while it lives; a primitive and its params), its inputs (each
value's type, static fields and leaves' avals, the plain inputs' avals or
constants), which of their leaves are one object, and the context.

A key is a tuple of named components (`key`): the caches' verify mode (see
`quax._foundation._caches`) compares the components an entry was made with against the
current ones, and names those that differ. Tests plant a key that leaves one
out (`omitted`), and check that verify mode catches it.
"""

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax import Array

from .._compat import NUMPY_ARRAYS, trace_context, typeof
from .._dispatch import _registry
from .._foundation import _caches, _debug, _journal


__all__ = [
    "CONTEXT",
    "JAXPR",
    "PROGRAM",
    "CONSTANT_MAX_SIZE",
    "add_setting",
    "aliasing",
    "constant_key",
    "context",
    "float_key",
    "jaxpr_key",
    "key",
    "params_key",
    "program_key",
    "static_key",
]

# The components of every key's context, in the order `context` gives them.
CONTEXT = ("settings", "trace context", "debug checks", "rules generation")

# Components that keys leave out. Always empty, except in the tests of the verify
# mode, which plant a key missing one.
omitted: frozenset[str] = frozenset()


def key(names: Sequence[str], parts: tuple[Any, ...]) -> tuple[Any, ...]:
    """The key of an entry from its components `parts`, named by `names` (one
    name each): the parts themselves, less any component in `omitted`."""
    if not omitted:
        return parts
    return tuple(p for n, p in zip(names, parts, strict=True) if n not in omitted)


# The components of the key of what is worked out once per jaxpr.
JAXPR = ("jaxpr",)


def jaxpr_key(jaxpr: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The key of what is worked out once per `jaxpr` (closed or open), and its
    components (`JAXPR`): the jaxpr, held by a `weakref.ref`, which is equal to
    another for the same living jaxpr and does not keep it alive. Raises `TypeError`
    for an object that cannot be weakly referenced."""
    parts = (weakref.ref(jaxpr),)
    return (key(JAXPR, parts) if omitted else parts), parts


# The components of the key of a program (see `program_key`).
PROGRAM = ("code", "inputs", "aliasing", *CONTEXT)


def program_key(
    code: Any, inputs: Any, aliasing: Any
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The key of a program, and its components (`PROGRAM`): its `code` (what it
    runs, as each cache names it: never a jaxpr itself, which the key would keep
    alive, but its `id` in a `JaxprTable` that drops the entry with it), its
    `inputs` (the types, static fields and avals of values, the plain inputs'
    avals or `constant_key`s), their `aliasing` (which leaves are one object, or
    `None`) and the `context`."""
    parts = (code, inputs, aliasing, *context())
    return key(PROGRAM, parts), parts


def aliasing(leaves: Sequence[Any]) -> tuple[int, ...] | None:
    """Which of `leaves` are one object, as the `aliasing` of `program_key`: the
    place of each leaf's object among the distinct ones, in order; `None` when each
    is there once. Rules may see it (`x * x`; a closed form for `K + K` that `K +
    K2` has not), so a program's key holds it."""
    if len(set(map(id, leaves))) == len(leaves):
        return None
    firsts: dict[int, int] = {}
    return tuple(firsts.setdefault(id(t), len(firsts)) for t in leaves)


def context() -> tuple[Any, ...]:
    """The components of `CONTEXT`, as they are now."""
    # The settings rules read (see `add_setting`).
    settings = tuple([read() for read in _settings])
    # The debug-check flag (`quax.set_debug_checks`): rules raise otherwise with it.
    return settings, trace_context(), _debug.is_enabled(), _registry._generation


_FLOATS = (float, complex, np.floating, np.complexfloating)
# Immutable scalars (JAX's typed literals subclass the first four).
_CONSTANTS = (bool, int, float, complex, np.generic)
_BY_VALUE = frozenset({bool, int, str, type(None)})


def float_key(x: Any) -> tuple[type, bytes]:
    """A float (Python's or NumPy's, real or complex) keyed by its type and bits,
    NaN payloads and signed zeros included."""
    return type(x), np.asarray(x).tobytes()


def params_key(params: dict[str, Any]) -> tuple[Any, ...]:
    """A primitive's `params` as a key, its floats (`gather`'s `fill_value`) by
    their bits."""
    return tuple(
        (name, float_key(v) if isinstance(v, _FLOATS) else v)
        for name, v in params.items()
    )


# Largest JAX array among a primitive's constant inputs that `constant_key` keys by
# value.
CONSTANT_MAX_SIZE = 1024


def constant_key(x: Any) -> tuple[Any, ...] | None:
    """A constant input of a primitive (a Python or NumPy scalar, a 0-d NumPy array,
    a JAX array: not a tracer) as a key: its type, its aval (shape, dtype, weak
    type), a JAX array's sharding, and its bits (NaN payloads and signed zeros
    included). `None` for one that is not keyed: a NumPy array of one or more
    dimensions, a JAX array of more than `CONSTANT_MAX_SIZE` elements or not wholly
    on this process's devices, or an object of another kind.

    A 0-d NumPy array (as `jax.numpy` converts a NumPy scalar: `x / np.sqrt(d)`) may
    be a view of an array that its owner changes afterwards; its bits are copied
    into the key here, and a recording keeps a read-only copy of each NumPy array
    it stages (`quax._compat.frozen_atom`), so that a replay stages the values of
    its key. Larger NumPy arrays are not keyed: copying their bits on every bind
    would cost what the replay saves."""
    try:
        if isinstance(x, Array):
            if x.size > CONSTANT_MAX_SIZE or not x.is_fully_addressable:
                return None
            return type(x), typeof(x), x.sharding, np.asarray(x).tobytes()
        if isinstance(x, _CONSTANTS):
            return type(x), typeof(x), np.asarray(x).tobytes()
        if type(x) in NUMPY_ARRAYS and x.ndim == 0:
            return type(x), typeof(x), x.tobytes()
    except Exception:  # no JAX type or no bits (an object array, a deleted array)
        pass
    return None


class Identity:
    """A static field that keys by identity."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is Identity and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)

    def __repr__(self) -> str:
        return f"Identity({self.value!r})"


def static_key(x: Any) -> Any:
    """A static field as a key: plain scalars, strings, dtypes and tuples of ints
    by value and type, floats by their bits, anything else that can be hashed by
    identity (an `Identity`: a type may make its equality looser than what rules
    read).

    Raises `TypeError` for a field that cannot be hashed (a NumPy array, a list, a
    tuple holding one): its owner may change it in place, so that its identity
    says nothing of what rules would read now; no cache keys it (nor can JAX's own
    caches, which hash static fields)."""
    kind = type(x)
    if kind in _BY_VALUE:
        return kind, x
    if isinstance(x, _FLOATS):
        return float_key(x)
    if isinstance(x, np.dtype):
        return np.dtype, x
    # The first element first: a tuple of objects (quax-named's axes) is keyed by
    # identity without a walk.
    if (
        kind is tuple
        and (not x or type(x[0]) is int)
        and all(type(e) is int for e in x)
    ):
        return tuple, x
    hash(x)  # a mutable field (a NumPy array, a list) raises: see the docstring
    return Identity(x)


# The settings that rules read while they trace, which a cached entry fixes (the
# core's symbolic zeros add their `ieee_strict` when they are imported).
_settings: list[Callable[[], Any]] = []


def add_setting(read: Callable[[], Any]) -> None:
    """Declare a setting that rules read while they trace: a mode that a context
    manager sets (as `quax.zero.ieee_strict` or `quax_named.axis_mapping` do).

    Quax reuses what rules traced once: compiled eager programs, and while a
    program is staged, the equations a rule (or a library `jit`'s body) staged for
    the same key. The setting's current value joins every such key, so that code
    traced under one value is never reused under another.

    **Arguments:**

    - `read`: returns the setting's current value, hashable. Called for every key,
        so keep it cheap (a thread-local read).

    **Returns:**

    Nothing.
    """
    _settings.append(read)
    _caches.invalidate()  # entries made before were keyed without it

    def take_back() -> None:
        _settings.remove(read)
        _caches.invalidate()

    # A family that fails to load takes its settings back (see
    # `quax._foundation._journal`).
    _journal.record(take_back, getattr(read, "__module__", None))
