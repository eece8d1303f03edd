"""Replaying an inlined `jit`'s quaxified body while a program is staged.

Every `jax.numpy` function is an inlined `jit`: inside `jax.jit` or `make_jaxpr`, the
quax trace evaluates its equations, dispatching each to its rule, which stages the
rule's own equations. The next call of the same function on values of the same
types stages the same equations again. So the first call's staged equations are
kept (they are read off the staging trace, no second trace is run) and a later
call with the same key stages copies of them on its own inputs, with no rule run.

The key is the jaxpr, for each value input its type, its static fields (strictly:
plain scalars, strings, dtypes and tuples of ints by value and type, anything else
by identity) and the avals of its leaves, the settings rules read
(`quax.zero.ieee_strict`) and the debug-check flag. A body is only kept when its
first run shows that replaying it gives exactly what running it gives:

- every input (each plain one, each leaf of each value) is an input or an
  equation's output of the staging trace: never a constant, which rules could
  fold or read;
- the rules asked [`quax.known_constant`][] nothing and materialised nothing (so
  the materialisation reports are unchanged);
- every equation staged is first-order (no sub-jaxpr, no effect, no host
  callback, no own staging rule), carries a traceback of the body's equations
  and extends the caller's name stack (the replay extends the new caller's);
- every output is a value whose dynamic fields are arrays, or a plain array.

Inputs that are the same tracer (`x * x`) are part of the key too.

The values in a replay's output are rebuilt field by field, as `jax.tree_util`
rebuilds them, with the first run's static fields. Nothing is replayed (or kept)
while materialisations are tracked, inside `shard_map`, or when the body stages
values (see `quax._staged`); registering a rule drops every recording.
"""

import weakref
from typing import Any, NamedTuple

import jax
import numpy as np

from . import _jaxpr, _registry, _values
from ._compat import (
    DynamicJaxprTracer,
    Tracer,
    atom_tracer,
    current_name_stack,
    emit_equation,
    staged_atom,
    staged_count,
    staged_since,
)
from ._eager import field_layout, settings_key
from ._jaxpr import binds_directly, known_asks
from ._staged import jaxpr_holds_staged_values
from ._values import is_value, value_classes


__all__ = ["MAX_RECORDINGS", "inline"]

# Structures kept per jaxpr; beyond them, other structures run their rules.
MAX_RECORDINGS = 8

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


# Marks a key whose body runs its rules every time.
_RUN: Any = object()


class _Identity:
    """A static field that keys by identity."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is _Identity and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


_BY_VALUE = frozenset({bool, int, float, complex, str, type(None)})


def _static_key(x: Any) -> Any:
    kind = type(x)
    if kind in _BY_VALUE:
        return kind, x
    if isinstance(x, np.dtype):
        return np.dtype, x
    if kind is tuple and all(type(e) is int for e in x):
        return tuple, x
    return _Identity(x)


_recordings: "weakref.WeakKeyDictionary[Any, dict[Any, Any]]" = (
    weakref.WeakKeyDictionary()
)
_generation = _registry.rules_generation()


def _variable(trace: Any, x: Any) -> bool:
    """Whether `x` is an input or an equation's output of the staging `trace`."""
    return (
        type(x) is DynamicJaxprTracer
        and x._trace is trace
        and staged_atom(trace, x)[0] == "var"
    )


def _key(trace: Any, values: list[Any], checks: bool) -> tuple[Any, list[Any]] | None:
    """The key of `values` and the tracers they stand on (plain inputs and leaves),
    or `None` when they cannot be replayed on."""
    parent = trace.parent_trace
    key: list[Any] = [checks, *settings_key()]
    leaves = []
    for x in values:
        if type(x) is DynamicJaxprTracer:
            if not _variable(parent, x):
                return None
            leaves.append(x)
            key.append(None)
            continue
        cls = type(x)
        if cls not in value_classes and not is_value(x):
            return None
        dynamic, static, _ = field_layout(cls)
        part: list[Any] = [cls]
        for name in dynamic:
            leaf = _object_getattribute(x, name)
            if not _variable(parent, leaf):
                return None
            leaves.append(leaf)
            part.append(leaf.aval)
        part += [_static_key(_object_getattribute(x, name)) for name in static]
        key.append(tuple(part))
    if len(set(map(id, leaves))) != len(leaves):
        # A tracer twice (`x * x`): rules may see that, and so does the key.
        firsts: dict[int, int] = {}
        key.append(tuple(firsts.setdefault(id(t), i) for i, t in enumerate(leaves)))
    return tuple(key), leaves


def inline(
    trace: Any, values: list[Any], jaxpr: Any, run: Any, checks: bool
) -> list[Any]:
    """The outputs of the inlined `jit` of `jaxpr` on `values` (the quax `trace`'s
    inputs, as values and plain tracers): a replay of its recording, or `run()`
    (which evaluates it), recorded when it can be replayed. `checks`: whether debug
    checks are on (part of the key)."""
    global _generation
    state = _values._state
    if state.reports or jaxpr_holds_staged_values(jaxpr):
        return run()
    if _registry._generation != _generation:
        _recordings.clear()
        _generation = _registry._generation
    found = _key(trace, values, checks)
    if found is None:
        return run()
    key, leaves = found
    table = _recordings.get(jaxpr)
    if table is None:
        table = _recordings[jaxpr] = {}
    try:
        recording = table.get(key)
    except TypeError:  # a static field that cannot be hashed
        return run()
    if recording is _RUN:
        return run()
    if recording is not None:
        for report in _jaxpr._evaluations.reports:
            report.total += 1
        return _replay(trace, recording, leaves)
    if len(table) >= MAX_RECORDINGS:
        return run()
    start = staged_count(trace.parent_trace)
    asked, materialised = known_asks(), state.count
    outer = current_name_stack()
    out = run()
    if known_asks() != asked or state.count != materialised:
        table[key] = _RUN
    else:
        table[key] = _record(trace, jaxpr, leaves, start, outer, out) or _RUN
    return out


def _replay(trace: Any, recording: _Recording, leaves: list[Any]) -> list[Any]:
    parent = trace.parent_trace
    outer = current_name_stack()
    env = list(leaves)
    for eqn, atoms, names in recording.equations:
        source_info = eqn.source_info
        tracers = [
            env[a] if type(a) is int else atom_tracer(parent, a[0], a[1], source_info)
            for a in atoms
        ]
        env += emit_equation(parent, eqn, tracers, outer + names)
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
    trace: Any, jaxpr: Any, leaves: list[Any], start: int, outer: Any, out: list[Any]
) -> _Recording | None:
    """The recording of the body that staged the equations from `start` on in the
    parent of `trace`, on `leaves`, giving `out`; `None` when it cannot be
    replayed exactly."""
    parent = trace.parent_trace
    numbers: dict[Any, int] = {}
    for i, leaf in enumerate(leaves):
        numbers.setdefault(staged_atom(parent, leaf)[1], i)
    count = len(leaves)
    eqns = staged_since(parent, start)
    if eqns is None:
        return None
    steps = _jaxpr._steps_of(jaxpr.jaxpr)
    tracebacks = {id(s.traceback) for s in steps if s.traceback is not None}

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
            return (kind, x), None
        number = numbers.get(x)
        return None if number is None else (number, None)

    equations = []
    for eqn in eqns:
        names = eqn.source_info.name_stack
        if (
            eqn.effects
            or eqn.primitive in _jaxpr._CALLBACKS  # host code: its own each time
            or _jaxpr._calls_jaxpr(eqn.params)
            or not binds_directly(eqn.primitive)
            or id(eqn.source_info.traceback) not in tracebacks
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
    return _Recording(equations, outputs)
