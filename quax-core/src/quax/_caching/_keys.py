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
  in place (compiled code keys its plain inputs otherwise: see `ConstKey`);
- values, for compiled code (compiled eager programs, nested `jit` bodies): by
  their strict structure (`value_structure`: type and static fields, one object
  per text and treedef) and, where a program is checked for one shape, their
  leaves' avals; plain inputs that compiled code closes over by `ConstKey`;
- the context every key holds (`CONTEXT`): the settings rules read (declared
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

import dataclasses
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax.tree_util as jtu
import numpy as np
from jax import Array

from .._compat import NUMPY_ARRAYS, Tracer, frozen_bytes, trace_context, typeof
from .._dispatch import _registry
from .._foundation import _caches, _debug, _journal


__all__ = [
    "ARRAY_LEAVES",
    "CONTEXT",
    "JAXPR",
    "PROGRAM",
    "CONSTANT_MAX_SIZE",
    "MAX_CONSTANT_SIZE",
    "ConstKey",
    "add_setting",
    "constant_key",
    "field_layout",
    "float_key",
    "jaxpr_key",
    "key",
    "params_key",
    "program_key",
    "static_key",
    "strict_structure",
    "value_structure",
]

# The components of every key's context, in the order `program_key` gives them.
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
    code: Any, inputs: Any, leaves: Sequence[Any] = ()
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The key of a program, and its components (`PROGRAM`).

    **Arguments:**

    - `code`: what the program runs, as each cache names it: never a jaxpr itself,
        which the key would keep alive, but its `id` in a `Table` that drops the
        entry with it.
    - `inputs`: the types, static fields and avals of values, the plain inputs'
        avals or `constant_key`s.
    - `leaves`: the leaves that the program is given, whose `aliasing` (which are
        one object) the key holds: rules may see it (`x * x`; a closed form for `K
        + K` that `K + K2` has not).

    **Returns:**

    The key (less any component in `omitted`) and its components: `code`,
    `inputs`, the aliasing (the place of each leaf's object among the distinct
    ones, in order; `None` when each is there once), and the context: the
    settings rules read (see `add_setting`), JAX's trace context, the debug-check
    flag (`quax.set_debug_checks`: rules raise otherwise with it) and the
    registry's generation.
    """
    # One function builds the whole key, its settings read without a frame each
    # where they are C callables: this runs on every eager library call.
    if len(set(map(id, leaves))) == len(leaves):
        aliasing = None
    else:
        firsts: dict[int, int] = {}
        aliasing = tuple(firsts.setdefault(id(t), len(firsts)) for t in leaves)
    parts = (
        code,
        inputs,
        aliasing,
        tuple(map(operator.call, _settings)),
        trace_context(),
        _debug.is_enabled(),
        _registry._generation,
    )
    return (key(PROGRAM, parts) if omitted else parts), parts


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


# Plain inputs of compiled code (`ConstKey`): a JAX array of more elements than this
# is keyed by identity; a compiled eager program keeps plain inputs up to this size
# as its constants, and a nested `jit`'s body those it knows now.
MAX_CONSTANT_SIZE = 64

# The leaves that a value flattens to, and the plain inputs, that compiled code
# takes: arrays and Python scalars.
ARRAY_LEAVES = (Array, np.ndarray, np.generic, int, float, complex)


class ConstKey:
    """A constant (plain) input of compiled code as part of a cache key, and the
    value the code closes over (`value`): equal to another of the same type, aval
    and bits.

    A NumPy array, which its owner may change in place, is keyed by a copy of its
    bytes whatever its size, never by identity, and `value` is a read-only array
    of that copy: an array changed afterwards is another key, and code kept under
    this key (traced again for another structure of its other inputs) sees the
    values of the key. A JAX array is immutable: one of more than
    `MAX_CONSTANT_SIZE` elements is keyed by identity (and kept alive, so that its
    `id` is not reused), sparing a copy from its device on every call.

    The type counts, not only the aval and the bits: JAX stages a NumPy constant
    (`np.float32(2)`) as a literal and a `jax.Array` (`jnp.float32(2)`) as a
    constant of the program, so the two stage different equations.

    Its rules differ from `constant_key`'s on purpose. A replayed recording stages
    its caller's constants afresh and only reads a key: `constant_key` copies the
    bits of scalars and small arrays on each bind and keys no NumPy array of one or
    more dimensions (copying one on every bind would cost what the replay saves).
    Compiled code closes over the constant itself, traced once for the key and
    then reused: `ConstKey` keys any NumPy array it is given by a copy of its bytes
    (the code closes over that copy, `value`), as compiled code takes plain inputs
    up to a small size or those a rule asked about."""

    __slots__ = ("aval", "data", "hash", "kind", "value")

    def __init__(self, value: Any) -> None:
        self.kind = type(value)
        self.aval = typeof(value)
        if isinstance(value, np.ndarray):
            self.data = value.tobytes()  # a copy, in C order
            self.value = frozen_bytes(value, self.data)
        elif isinstance(value, Array) and value.size > MAX_CONSTANT_SIZE:
            self.value, self.data = value, id(value)
        else:  # an immutable scalar or a small JAX array
            self.value, self.data = value, np.asarray(value).tobytes()
        # Hashing every byte of a large array costs about 2 ms per 4 MB on every
        # call, where comparing them with an equal key's costs a tenth of that: the
        # hash reads a sample of evenly spaced bytes, and equality every byte.
        sample = self.data
        if type(sample) is bytes and len(sample) > _HASHED_BYTES:
            sample = sample[:: len(sample) // _HASHED_BYTES]
        self.hash = hash((self.kind, self.aval, sample))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ConstKey)
            and self.hash == other.hash
            and self.kind is other.kind
            and self.aval == other.aval
            and self.data == other.data
        )

    def __hash__(self) -> int:
        return self.hash


# The most bytes of a constant that `ConstKey` hashes (it compares all of them).
_HASHED_BYTES = 4096


class _Structure:
    """One strict value structure, as a part of program keys: equal only to itself,
    as `intern` gives one per text and treedef."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"_Structure({self.text})"


# Every structure seen, by its text and treedef; and, for values whose fields are
# all set and whose dynamic fields all hold arrays (most value types), by their type
# and the identities of their static fields (kept alive here, so that their `id`s
# are not reused): the same objects have the same text and compare equal, and the
# structure follows from them without flattening the value. Each keeps at most
# `MAX_STRUCTURES` entries, the oldest dropped first (a structure interned again is
# another key of programs: a miss, never a wrong hit).
MAX_STRUCTURES = 4096
_structures = _caches.Table("value structures", MAX_STRUCTURES, coded=False)
_by_fields = _caches.Table("value structures by fields", MAX_STRUCTURES, coded=False)

# Per value type: the names of its dynamic and static fields and its field count.
_fields: dict[type, tuple[tuple[str, ...], tuple[str, ...], int]] = {}
# The types of the concrete array leaves seen that carry their aval (`jax.Array`s).
_leaf_types: set[type] = set()
_attribute = object.__getattribute__  # not the value's own, slower lookup
_aval = operator.attrgetter("aval")


def field_layout(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """The names of the value type `cls`'s dynamic and static fields, and its field
    count (cached)."""
    layout = _fields.get(cls)
    if layout is not None:
        return layout
    fields = dataclasses.fields(cls)
    static = tuple(f.name for f in fields if f.metadata.get("static", False))
    dynamic = tuple(f.name for f in fields if not f.metadata.get("static", False))
    _fields[cls] = layout = (dynamic, static, len(fields))
    return layout


def intern(leaves: Sequence[Any], treedef: Any) -> _Structure | None:
    """The structure of a value flattened to `leaves`, `treedef`: its text (static
    fields may compare loosely by `==`, as quax-units' display units) and its
    treedef (or strictly, as quax-named's anonymous axes, alike in text). `None`
    when a leaf is not an array or a static field cannot be hashed: such a value has
    no compiled program."""
    if not all(isinstance(leaf, ARRAY_LEAVES) for leaf in leaves):
        return None
    key = (repr(treedef), treedef)
    try:
        structure = _structures.get(key)
    except TypeError:  # a static field that cannot be hashed
        return None
    if structure is None:
        structure = _Structure(key[0])
        _structures.put(key, structure)
        _leaf_types.update(
            type(x)
            for x in leaves
            if isinstance(x, Array) and not isinstance(x, Tracer)
        )
    return structure


def value_structure(x: Any) -> tuple[_Structure | None, Sequence[Any], list[Any]]:
    """The strict structure of the value `x` (see `intern`), its leaves and their
    avals."""
    cls = type(x)
    dynamic, static, count = field_layout(cls)
    fields = _attribute(x, "__dict__")
    if len(fields) == count:
        try:
            leaves = tuple([fields[name] for name in dynamic])
            statics = tuple([fields[name] for name in static])
        except KeyError:  # other attributes than its fields
            statics = None
        if statics is not None and _leaf_types.issuperset(map(type, leaves)):
            key = (cls, *map(id, statics))
            kept = _by_fields.read(key)
            if kept is not None:
                return kept[0], leaves, list(map(_aval, leaves))
            flat, treedef = jtu.tree_flatten(x)
            structure = intern(flat, treedef)
            if (
                structure is not None
                and len(flat) == len(leaves)
                and all(map(operator.is_, flat, leaves))
            ):
                _by_fields.put(key, (structure, statics))
            return structure, flat, list(map(_aval, leaves))
    flat, treedef = jtu.tree_flatten(x)
    structure = intern(flat, treedef)
    return structure, flat, [] if structure is None else list(map(typeof, flat))


def strict_structure(x: Any) -> Any:
    """The strict structure of the value `x` (see `value_structure`), or, for a value
    that has none (a leaf that is not an array), the text of its treedef."""
    structure = value_structure(x)[0]
    return repr(jtu.tree_structure(x)) if structure is None else structure


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
        so keep it cheap: a `ContextVar`'s bound `get` costs least, called with no
        Python frame.

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
