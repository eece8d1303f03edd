"""Replaying the equations that rules staged, while a program is staged.

Inside `jax.jit` or `make_jaxpr`, the quax trace runs a rule for each primitive bound
on values, and the rule stages its own equations. The next bind of the same
primitive, with the same params, on values of the same key stages the same
equations again. So the first run's staged equations are kept (they are read off
the staging trace, no second trace is run) and a later bind with the same key
stages copies of them on its own inputs, with no rule run. The same holds for a
whole inlined `jit` (every `jax.numpy` function is one), keyed by its jaxpr: its
equations are evaluated one by one, each dispatched to its rule.

The key is the primitive and its params (floats by their bits) or the jaxpr, for
each value input its type, its static fields (strictly: plain scalars, strings,
dtypes and tuples of ints by value and type, floats by their bits, anything else by
identity; a value with a static field that cannot be hashed, such as a NumPy array
its owner may change in place, is never replayed on) and the avals of its leaves,
the avals of the plain inputs, JAX's trace context (the settings its own tracing
caches key on: the default matmul precision, the mesh, `enable_x64`, ...), the
settings rules read (`quax.zero.ieee_strict`, and any that a family declares with
`quax.plugins.add_setting`), the debug-check flag and the registry's generation
(the context of every cache's key, see `quax._caching._keys`). Rules are functions
of these: a rule's Python runs once per key while staging. A body is only kept
when its first run shows that replaying it gives exactly what running it gives:

- every input (each plain one, each leaf of each value) is an input or an
  equation's output of the staging trace, or a plain constant input keyed by its
  value (a Python or NumPy scalar, a 0-d NumPy array, a small JAX array: `x * 0.5`,
  `x / np.sqrt(d)`; not a NumPy array of one or more dimensions); never a value's
  leaf that is a constant, which rules could fold or read. A recording keeps a
  read-only copy of each NumPy array it stages, as JAX stages the array itself,
  which its owner may change afterwards;
- the rules asked [`quax.known_constant`][] about no tracer (an answer the key
  does not hold; about a constant, the answer is a function of the key) and
  materialised nothing (so the materialisation reports are unchanged);
- every equation staged is first-order (no sub-jaxpr, no effect, no host
  callback, no own staging rule) and extends the caller's name stack (the replay
  extends the new caller's); a `jit` body's carry the tracebacks of its
  equations, which a replay keeps, while a primitive's replay carries the source
  info of its own bind, as its rule's equations would;
- every output is a value whose dynamic fields are arrays, or a plain array;
- its outputs' static fields are keyed by value, or are (or are tuples of)
  objects of the inputs' static fields. Others are objects the rules made, and a
  replay would give every bind the first run's (two anonymous axes would be one):
  the next run must give equal ones (by `==` and by text, as compiled eager
  programs check), else the body runs every time.

Inputs that are the same tracer (`x * x`) are part of the key too: which leaves
are one tracer, in which places (`T + T` and `T + U` with `U` sharing two of
`T`'s three diagonals have different keys).

In verify mode (`QUAX_VERIFY_CACHES=1`, see `quax._foundation._caches`), a hit runs the
rules instead of replaying, and raises when what they stage differs from the recording.

The values in a replay's output are rebuilt field by field, as `jax.tree_util`
rebuilds them, with the first run's static fields. Nothing is replayed (or kept)
while materialisations are tracked, inside `shard_map`, for a primitive with a
sub-jaxpr or a host callback, or when a `jit` body stages values (see
`quax._dispatch._staged`); registering a rule drops every recording.
"""

from typing import Any, NamedTuple

import jax
import numpy as np

from .._compat import (
    DynamicJaxprTracer,
    Primitive,
    Tracer,
    atom_tracer,
    current_source_info,
    emit_equation,
    frozen_atom,
    staged_atom,
    staged_count,
    staged_since,
    staged_var,
)
from .._dispatch._known import known_asks
from .._foundation import _caches
from .._foundation._caches import alike
from .._foundation._evaluation import (
    HOST_CALLBACKS,
    binds_directly,
    calls_jaxpr,
    evaluations,
)
from .._values import _value
from .._values._value import is_value, value_classes
from . import _keys
from ._keys import Identity, constant_key, field_layout, params_key, static_key
from ._per_jaxpr import jaxpr_holds_staged_values


__all__ = ["MAX_RECORDINGS", "bind", "inline"]

# Keys kept (of primitives, with their params, and of jaxprs, each with the
# structures of its inputs); beyond them, the oldest is dropped.
MAX_RECORDINGS = 4096

_object_getattribute = object.__getattribute__
_object_new = object.__new__
_object_setattr = object.__setattr__


class _Equation(NamedTuple):
    """A staged equation, less its inputs and outputs (which hold tracers)."""

    primitive: Any
    params: dict[str, Any]
    effects: Any
    source_info: Any
    ctx: Any
    out_avals: list[Any]


class _Recording(NamedTuple):
    """A body to replay. Inputs and equations' outputs are numbered in order (the
    environment); an atom is an index into it, or a `(kind, atom)` of
    `staged_atom` for a literal or a constant."""

    # Per equation: it, its inputs' atoms, its name stack less the caller's.
    equations: list[tuple[_Equation, list[Any], Any]]
    # Per output: `(None, atom)` for a plain one, else `(cls, fields)` with
    # `fields` a list of `(name, atom or None, constant)`.
    outputs: list[tuple[Any, Any]]
    # Whether the equations take the source info current when replayed (a
    # primitive's rule staged them there), not their own (a `jit` body's).
    here: bool


# Marks a key whose body runs its rules every time.
_RUN: Any = object()


class _Unconfirmed(NamedTuple):
    """A recording whose outputs hold static fields that its inputs do not: objects
    the rules made, which a replay would share. The next run confirms it when it
    gives equal ones (by `==` and by text)."""

    recording: _Recording
    statics: list[Any]


# The recordings (or `_RUN`, or an `_Unconfirmed` one), by `program_key`: the code is
# a primitive and its params, or a jaxpr's `id` (its entries go with it).
_recordings = _caches.Table("replayed recordings", MAX_RECORDINGS)
# Primitives never replayed: host callbacks, and those whose params hold a jaxpr.
_unreplayable: set[Primitive] = set(HOST_CALLBACKS)


def _variable(trace: Any, x: Any) -> bool:
    """Whether `x` is an input or an equation's output of the staging `trace`."""
    return type(x) is DynamicJaxprTracer and x._trace is trace and staged_var(trace, x)


def _key(trace: Any, code: Any, values: list[Any]) -> tuple[Any, list[Any], Any] | None:
    """The key of `code` on `values`, the tracers they stand on (plain inputs and
    leaves) and the key's components, or `None` when they cannot be replayed on."""
    parent = trace.parent_trace
    key: list[Any] = []
    leaves = []
    for x in values:
        if type(x) is DynamicJaxprTracer:
            if not _variable(parent, x):
                return None
            leaves.append(x)
            key.append(x.aval)  # a jaxpr's fixes it, a primitive's does not
            continue
        cls = type(x)
        if cls not in value_classes and not is_value(x):
            if isinstance(x, Tracer):
                return None
            # A constant (`x * 0.5`): by its value, which the rules may read.
            constant = constant_key(x)
            if constant is None:
                return None
            key.append(("constant", *constant))
            continue
        dynamic, static, _ = field_layout(cls)
        part: list[Any] = [cls]
        for name in dynamic:
            leaf = _object_getattribute(x, name)
            if not _variable(parent, leaf):
                return None
            leaves.append(leaf)
            part.append(leaf.aval)
        try:
            part += [static_key(_object_getattribute(x, name)) for name in static]
        except TypeError:  # a static field that cannot be hashed: never keyed
            return None
        key.append(tuple(part))
    # A tracer twice (`x * x`): rules may see that, and so does the key.
    key_, parts = _keys.program_key(code, tuple(key), leaves)
    return key_, leaves, parts


def inline(trace: Any, values: list[Any], jaxpr: Any, run: Any) -> list[Any]:
    """The outputs of the inlined `jit` of `jaxpr` on `values` (the quax `trace`'s
    inputs, as values and plain tracers): a replay of its recording, or `run()`
    (which evaluates it), recorded when it can be replayed."""
    return _replay_or_run(trace, id(jaxpr), values, jaxpr, run)


def bind(
    trace: Any,
    primitive: Primitive,
    values: list[Any],
    params: dict[str, Any],
    run: Any,
) -> Any:
    """The output of `primitive` bound on `values` (the quax `trace`'s inputs) with
    `params`, as `run()` (which applies its rule) gives it, or a replay of the
    equations that rule staged for the same key, with the current source info."""
    if primitive in _unreplayable:
        return run()
    many = primitive.multiple_results
    outs = _replay_or_run(
        trace,
        (primitive, params_key(params)),
        values,
        primitive,
        run if many else lambda: [run()],
    )
    return outs if many else outs[0]


def _replay_or_run(
    trace: Any, code: Any, values: list[Any], body: Any, run: Any
) -> list[Any]:
    """The outputs (a list) of `body` (a jaxpr, or a primitive; `code` in the key)
    on `values`: replayed from `_recordings`, or `run()` and recorded there.

    In verify mode (see `quax._foundation._caches`), a hit runs the rules afresh
    instead of replaying the recording, and raises when what they stage differs
    from it."""
    if _value._state.reports or not _caches.is_enabled():
        return run()
    found = _key(trace, code, values)
    if found is None:
        return run()
    key, leaves, parts = found
    try:
        recording = _recordings.get(key)
    except TypeError:  # a static field or a param that cannot be hashed
        return run()
    if recording is _RUN:
        return run()
    # The jaxpr an entry goes with (a primitive's live for ever).
    jaxpr = None if isinstance(body, Primitive) else body
    if (
        recording is not None
        and type(recording) is not _Unconfirmed
        and not _caches.verifying
    ):
        return _replay(trace, recording, leaves)
    # A jaxpr has entries only once it was found to stage no value (a function of
    # its equations alone): asked on a miss, not on a hit (verify mode, whose hits
    # run afresh, asks every time).
    if jaxpr is not None and jaxpr_holds_staged_values(jaxpr):
        return run()
    if type(recording) is _Unconfirmed:
        out = run()
        same = alike(_statics(trace, out), recording.statics)
        _recordings.put(key, recording.recording if same else _RUN, jaxpr)
        return out
    state = _value._state
    start = staged_count(trace.parent_trace)
    asked, materialised = known_asks(), state.count
    outer = current_source_info().name_stack
    out = run()
    if recording is not None:  # verify mode: what the rules staged afresh
        fresh = _record(trace, body, leaves, start, outer, out)
        name = body.name if jaxpr is None else "an inlined `jit`"
        now = None if fresh is None else _text(fresh)
        what = (
            f"the equations staged (of {name}) or the outputs' types and static fields"
        )
        _caches.check(_recordings.name, key, _keys.PROGRAM, parts, now, what)
    elif known_asks() != asked or state.count != materialised:
        _recordings.put(key, _RUN, jaxpr)
    elif jaxpr is None and calls_jaxpr(dict(parts[0][1])):
        _unreplayable.add(body)  # its keys would keep jaxprs alive
    else:
        recording = _record(trace, body, leaves, start, outer, out)
        if recording is not None and not _kept_statics(parts[1], recording):
            recording = _Unconfirmed(recording, _statics(trace, out))
        _recordings.put(key, recording or _RUN, jaxpr)
        if type(recording) is _Recording:
            _caches.made_with(_recordings.name, key, parts, _text(recording), jaxpr)
    return out


def _statics(trace: Any, out: list[Any]) -> list[Any]:
    """The type and static fields of each value among the outputs `out`."""
    statics = []
    for o in out:
        value = trace.to_value(o)
        if value is not o:
            names = field_layout(type(value))[1]
            fields = tuple(_object_getattribute(value, name) for name in names)
            statics.append((type(value), fields))
    return statics


def _kept_statics(key: Any, recording: _Recording) -> bool:
    """Whether each static field of the outputs of `recording` is keyed by value,
    or is (or holds in a tuple) objects that the inputs' static fields in `key`
    hold: then every run of the rules gives them."""
    held: set[int] = set()
    _held(key, held)

    def kept(x: Any) -> bool:
        if id(x) in held:
            return True
        try:
            if type(static_key(x)) is not Identity:
                return True
        except TypeError:  # cannot be hashed (a NumPy array): never shared
            return False
        return type(x) is tuple and all(map(kept, x))

    for cls, fields in recording.outputs:
        if cls is not None:
            names = field_layout(cls)[1]
            if not all(kept(c) for name, _, c in fields if name in names):
                return False
    return True


def _held(part: Any, held: set[int], inside: bool = False) -> None:
    """Add to `held` the ids of the objects that a part of a key holds by identity
    (and of those in the tuples it so holds)."""
    if type(part) is Identity:
        part, inside = part.value, True
    if inside:
        held.add(id(part))
    if type(part) is tuple:
        for x in part:
            _held(x, held, inside)


def _replay(trace: Any, recording: _Recording, leaves: list[Any]) -> list[Any]:
    parent = trace.parent_trace
    if recording.here:
        info = current_source_info()
        outer = info.name_stack
    else:
        info, outer = None, current_source_info().name_stack
        for report in evaluations.reports:
            report.total += 1
    env = list(leaves)
    for eqn, atoms, names in recording.equations:
        source_info = info or eqn.source_info
        tracers = [
            env[a] if type(a) is int else atom_tracer(parent, a[0], a[1], source_info)
            for a in atoms
        ]
        env += emit_equation(parent, eqn, tracers, outer + names, info)
    out = []
    for cls, fields in recording.outputs:
        if cls is None:
            out.append(_read(parent, env, *fields))
            continue
        value = _object_new(cls)
        for name, atom, constant in fields:
            _object_setattr(value, name, _read(parent, env, atom, constant))
        out.append(trace.wrap(value))
    return out


def _read(parent: Any, env: list[Any], atom: Any, constant: Any) -> Any:
    if atom is None:
        return constant
    if type(atom) is int:
        return env[atom]
    return atom_tracer(parent, atom[0], atom[1], None)


# Constants that an output may hold, shared by every replay.
_CONSTANTS = (jax.Array, np.generic, bool, int, float, complex, str, type(None))


def _record(
    trace: Any, body: Any, leaves: list[Any], start: int, outer: Any, out: list[Any]
) -> _Recording | None:
    """The recording of the `body` (a jaxpr, or a primitive) that staged the
    equations from `start` on in the parent of `trace`, on `leaves`, giving `out`;
    `None` when it cannot be replayed exactly."""
    parent = trace.parent_trace
    numbers: dict[Any, int] = {}
    for i, leaf in enumerate(leaves):
        numbers.setdefault(staged_atom(parent, leaf)[1], i)
    count = len(leaves)
    eqns = staged_since(parent, start)
    if eqns is None:
        return None
    here = isinstance(body, Primitive)
    # A jaxpr's equations are each staged with their own traceback (see the
    # interpreter, `quax._transform._interpreter`).
    sources = () if here else [eqn.source_info for eqn in body.jaxpr.eqns]
    tracebacks = {id(s.traceback) for s in sources if s.traceback is not None}

    def atom(t: Any) -> Any:
        """`(atom, constant)` for an input or output `t`; `None` if it has none."""
        if isinstance(t, _CONSTANTS) and not isinstance(t, Tracer):
            return None, t
        if type(t) is not DynamicJaxprTracer or t._trace is not parent:
            return None
        kind, x = staged_atom(parent, t)
        if kind == "const" and isinstance(x, Tracer):
            return None  # an enclosing trace's tracer, closed over
        if kind != "var":
            return (kind, frozen_atom(kind, x)), None
        number = numbers.get(x)
        return None if number is None else (number, None)

    equations = []
    for eqn in eqns:
        names = eqn.source_info.name_stack
        if (
            eqn.effects
            or eqn.primitive in HOST_CALLBACKS  # host code: its own each time
            or calls_jaxpr(eqn.params)
            or not binds_directly(eqn.primitive)
            or (not here and id(eqn.source_info.traceback) not in tracebacks)
            or names[: len(outer)] != outer
            or any(getattr(v.aval, "has_qdd", False) for v in eqn.outvars)
        ):
            return None
        atoms = [atom(t) for t in eqn.in_tracers]
        if None in atoms:
            return None
        copy = _Equation(
            eqn.primitive,
            eqn.params,
            eqn.effects,
            eqn.source_info,
            eqn.ctx,
            [v.aval for v in eqn.outvars],
        )
        equations.append((copy, [a for a, _ in atoms], names[len(outer) :]))
        for v in eqn.outvars:
            numbers[v] = count
            count += 1
    outputs: list[tuple[Any, Any]] = []
    for o in out:
        value = trace.to_value(o)
        if value is o:
            a = atom(o)
            if a is None:
                return None
            outputs.append((None, a))
            continue
        dynamic, static, _ = field_layout(type(value))
        fields = []
        for name in dynamic:
            a = atom(_object_getattribute(value, name))
            if a is None:
                return None
            fields.append((name, *a))
        fields += [(name, None, _object_getattribute(value, name)) for name in static]
        outputs.append((type(value), fields))
    return _Recording(equations, outputs, here)


def _text(recording: _Recording) -> str:
    """What a recording stages and gives, as text: its equations (primitive,
    params, inputs, output avals) and its outputs (types, static fields)."""
    equations = [
        (eqn.primitive, eqn.params, atoms, eqn.out_avals)
        for eqn, atoms, _ in recording.equations
    ]
    return repr((equations, recording.outputs))
