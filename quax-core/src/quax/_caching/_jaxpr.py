"""Evaluating jaxprs: the interpreter that runs a staged body at the current trace
(with constants folded), and the reader of a staged program's known constants.

Every higher-order rule evaluates its inner jaxprs with `eval_quaxified`, and so does
an inlined `jit` on the quax trace.
"""

import contextlib
import dataclasses
import functools as ft
import operator
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import jax
import jax.extend.core.primitives as jprim
import numpy as np

from .._compat import (
    EVAL_TRACE,
    AdZero,
    ClosedJaxpr,
    DynamicJaxprTracer,
    Jaxpr,
    Literal,
    Primitive,
    Tracer,
    call_at_trace,
    current_source_info,
    debug_callback_p,
    debug_print_p,
    eqn_context,
    eval_context,
    io_callback_p,
    manual_axes_active,
    pure_callback_p,
    staged_atom,
    staged_equation,
    tangent_pair,
    user_context,
    with_tangent,
)
from .._dispatch._staged import staged_value_p
from .._foundation import _caches
from .._foundation._caches import JaxprTable
from .._values._value import Value
from ._eager import require_concrete
from ._keys import JAXPR, jaxpr_key


__all__ = [
    "FOLD_MAX_SIZE",
    "EvaluationReport",
    "body_arg_names",
    "body_source",
    "eval_quaxified",
    "holds_staged_values",
    "jaxpr_holds_staged_values",
    "ValueAsked",
    "is_varying",
    "known_asks",
    "known_constant",
    "known_scale_invariant",
    "known_scaled_constant",
    "per_jaxpr",
    "stand_in_token",
    "standing_in",
    "track_evaluations",
]

# Equations on constants only, with outputs this small, are computed at trace time.
FOLD_MAX_SIZE = 1024

# How many jaxprs each table of what is worked out once per jaxpr keeps (beyond it,
# the least recently used is worked out again when it comes back).
MAX_JAXPRS = 4096

_T = TypeVar("_T")

# Largest output that `known_constant` computes (rather than views, as it does a
# broadcast), so that the trace-time work stays small: a million elements (a few
# milliseconds of NumPy), so that `jnp.eye(n)` (an `iota`, an `eq` and a conversion
# under `jit`) is known up to `n = 1024`.
_KNOWN_COMPUTE_MAX_SIZE = 2**20

# Host code runs when the program does, never at trace time (`eqx.error_if`'s error
# branch raises from a `pure_callback` on constant inputs).
_CALLBACKS = frozenset(
    {pure_callback_p, io_callback_p, debug_callback_p, debug_print_p}
)

# Tracers first: the common case, and `Value`'s check goes through its ABC.
_TRACED = (Tracer, Value)


def is_varying(aval: Any) -> bool:
    """Whether `aval` varies along some manual mesh axis (inside `shard_map`)."""
    mat = getattr(aval, "manual_axis_type", None)
    return mat is not None and bool(mat.varying)


def body_arg_names(jaxpr: Any) -> tuple[str, ...] | None:
    """The names of a traced body's arguments, as the user wrote them (`c[0]`, `i`),
    or `None` when JAX did not record them."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    return None if info is None else info.arg_names


def body_source(jaxpr: Any) -> str | None:
    """Where a traced body was defined (`f at file.py:12`), or `None`."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    return None if info is None else info.func_src_info


def _calls_jaxpr(params: dict[str, Any]) -> bool:
    return any(isinstance(p, ClosedJaxpr | Jaxpr) for p in params.values())


def binds_directly(primitive: Primitive) -> bool:
    """Whether `primitive` binds as `Primitive.bind` does by default: then, on valid
    tracers, outside `shard_map`, with no sub-jaxpr `is_high`, `bind`'s checks
    change nothing and `eval_quaxified` skips them."""
    cls = type(primitive)
    return (
        cls.bind is Primitive.bind
        and cls.bind_with_trace is Primitive.bind_with_trace
        and cls.is_high is Primitive.is_high
        and not {"bind", "bind_with_trace", "is_high"} & vars(primitive).keys()
    )


# What is worked out once per jaxpr ----------------------------------------------------


def per_jaxpr(
    table: JaxprTable,
    jaxpr: Any,
    compute: Callable[[Any], _T],
    same: Callable[[_T, _T], bool],
    what: str,
) -> _T:
    """`compute(jaxpr)`, kept in `table` while the caches are on (`quax.caching`),
    under the key of `jaxpr` (see `quax._caching._keys.jaxpr_key`). In verify mode
    a hit is computed afresh, and raises a `quax.CacheMismatchError` when `same`
    tells the two apart (`what` says what was compared).

    **Arguments:**

    - `table`: where the entries are kept.
    - `jaxpr`: the jaxpr (closed or open) `compute` reads.
    - `compute`: a function of the jaxpr alone.
    - `same`: whether a kept and a fresh result agree.
    - `what`: what `same` compares, for the error.

    **Returns:**

    `compute(jaxpr)`, or the result it gave before for this jaxpr.
    """
    if not _caches.is_enabled():
        return compute(jaxpr)
    try:
        key, parts = jaxpr_key(jaxpr)
    except TypeError:  # a jaxpr that is not weakly referable: not kept
        return compute(jaxpr)
    return _caches.remembered(
        table, key, JAXPR, parts, lambda: compute(jaxpr), what, same, jaxpr
    )


# Jaxprs that hold staged values -------------------------------------------------------

_holds = JaxprTable("jaxprs: whether each stages a value", MAX_JAXPRS)


def holds_staged_values(params: dict[str, Any]) -> bool:
    """Whether the sub-jaxprs among a primitive's `params` stage a value (see
    `quax._dispatch._staged`)."""
    return any(_param_holds(p) for p in params.values())


def jaxpr_holds_staged_values(jaxpr: Any) -> bool:
    """Whether a closed or open jaxpr (or its sub-jaxprs) stages a value; kept per
    jaxpr. For a primitive whose only sub-jaxpr is known (an inlined `jit`'s
    `jaxpr`), this is `holds_staged_values` without a walk over every param."""
    return _jaxpr_holds(jaxpr.jaxpr if type(jaxpr) is ClosedJaxpr else jaxpr)


def _param_holds(p: Any) -> bool:
    if isinstance(p, ClosedJaxpr):
        return _jaxpr_holds(p.jaxpr)
    if isinstance(p, Jaxpr):
        return _jaxpr_holds(p)
    if isinstance(p, tuple):
        return any(_param_holds(x) for x in p)
    return False


def _jaxpr_holds(jaxpr: Any) -> bool:
    return per_jaxpr(
        _holds, jaxpr, _walk_holds, operator.eq, "whether it stages a value"
    )


def _walk_holds(jaxpr: Any) -> bool:
    return any(
        eqn.primitive is staged_value_p or holds_staged_values(eqn.params)
        for eqn in jaxpr.eqns
    )


class _Step(NamedTuple):
    """How `eval_quaxified` binds one equation, worked out once per jaxpr."""

    primitive: Primitive
    invars: list[Any]
    outvars: list[Any]
    # The bind params, or `None` for a primitive with its own `get_bind_params`
    # (called on `eqn_params` each time: it may build new functions).
    params: dict[str, Any] | None
    eqn_params: dict[str, Any]
    # Whether the equation is computed now when its inputs are constants: it calls
    # no host callback and (bind params known) no sub-jaxpr, has no effects, and
    # its outputs are small and not device-varying (`pvary` of a constant, in
    # `shard_map`, has no value outside it).
    foldable: bool
    # Whether it may skip `bind`'s checks on tracers (see `binds_directly`).
    direct: bool
    traceback: Any
    names: Any
    ctx: Any
    multiple_results: bool


def _own_bind_params(primitive: Primitive) -> bool:
    return type(
        primitive
    ).get_bind_params is not Primitive.get_bind_params or "get_bind_params" in vars(
        primitive
    )


# Each jaxpr's steps, worked out once (the interpreter's hot path reads them).
_steps = JaxprTable("jaxpr interpreter: the steps of each jaxpr", MAX_JAXPRS)


def _steps_of(jaxpr: Any) -> list[_Step]:
    return per_jaxpr(_steps, jaxpr, _read_steps, _same_steps, "its equations' steps")


def _read_steps(jaxpr: Any) -> list[_Step]:
    """How `eval_quaxified` binds each equation of the open `jaxpr`."""
    steps = []
    for eqn in jaxpr.eqns:
        primitive = eqn.primitive
        params = None if _own_bind_params(primitive) else eqn.params
        foldable = (
            primitive not in _CALLBACKS
            and not eqn.effects
            and (params is None or not _calls_jaxpr(params))
            and all(
                getattr(v.aval, "size", FOLD_MAX_SIZE + 1) <= FOLD_MAX_SIZE
                for v in eqn.outvars
            )
            and not any(is_varying(v.aval) for v in eqn.outvars)
        )
        direct = (
            params is not None
            and binds_directly(primitive)
            and not (params and primitive.is_high(**params))
        )
        source_info = eqn.source_info
        steps.append(
            _Step(
                primitive,
                eqn.invars,
                eqn.outvars,
                params,
                eqn.params,
                foldable,
                direct,
                source_info.traceback,
                source_info.name_stack,
                eqn.ctx,
                primitive.multiple_results,
            )
        )
    return steps


def _same_steps(kept: list[_Step], fresh: list[_Step]) -> bool:
    """Whether two readings of a jaxpr's steps are of the same equations: every
    field the same object (the equation's own), or equal."""
    try:
        return len(kept) == len(fresh) and all(
            a is b or a == b
            for k, f in zip(kept, fresh, strict=True)
            for a, b in zip(k, f, strict=True)
        )
    except Exception:  # fields that cannot be compared: other equations
        return False


def _is_constant(x: Any) -> bool:
    return not isinstance(x, _TRACED)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, Tracer)


def eval_quaxified(
    jaxpr: Any, consts: Sequence[Any], *args: Any, trace: Any = None
) -> list[Any]:
    """Evaluate `jaxpr` at the current trace, as `jax.core.eval_jaxpr` does, except
    that an equation on constants only, calling no sub-jaxpr and no host callback,
    with every output of at most `FOLD_MAX_SIZE` elements, is computed now (as under
    `jax.ensure_compile_time_eval`): otherwise under an enclosing `jit` the
    constants a jaxpr computes (`convert_element_type(1.5)`, a `full` of NaNs) would
    reach the rules as tracers, whereas the Python program gave them as numbers.
    Under a quax trace, every other equation is dispatched.

    **Arguments:**

    - `jaxpr`: an open jaxpr.
    - `consts`: the values of its constvars.
    - `*args`: the values of its invars.
    - `trace`: the current trace, when the caller knows it and `args` passed a
        `bind` already (as an inlined `jit`'s did): equations on tracers then skip
        `bind`'s checks, which hold there.

    **Returns:**

    The values of its outvars.
    """
    if _evaluations.reports:
        for report in _evaluations.reports:
            report.total += 1
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    # Each equation's name stack extends the current one, which the loop leaves as it
    # finds it.
    outer_names = current_source_info().name_stack
    if trace is not None and manual_axes_active():
        trace = None  # `bind` may reshard inputs inside `shard_map`.
    for step in _steps_of(jaxpr):
        primitive = step.primitive
        invals = [v.val if type(v) is Literal else env[v] for v in step.invars]
        params = step.params
        if params is None:
            params = primitive.get_bind_params(step.eqn_params)
            # The constant check first: it usually declines at the first tracer.
            now = (
                step.foldable
                and all(map(_is_constant, invals))
                and not _calls_jaxpr(params)
            )
        else:
            now = step.foldable and all(map(_is_constant, invals))
        names = step.names
        with (
            user_context(
                step.traceback,
                name_stack=outer_names + names if names else outer_names,
            ),
            eqn_context(step.ctx),
        ):
            if now:
                with jax.ensure_compile_time_eval():
                    ans = primitive.bind(*invals, **params)
            elif trace is not None and step.direct and all(map(_is_tracer, invals)):
                # What `bind` does after its checks.
                process = ft.partial(trace.process_primitive, primitive)
                ans = call_at_trace(EVAL_TRACE, process, invals, params)
            else:
                ans = primitive.bind(*invals, **params)
        if step.multiple_results:
            env.update(zip(step.outvars, ans, strict=True))
        else:
            env[step.outvars[0]] = ans
    return [v.val if type(v) is Literal else env[v] for v in jaxpr.outvars]


class ValueAsked(BaseException):
    """A rule asked `known_constant` for the value of a plain argument of a nested
    `jit` that was concrete when called, but that quax passed in as an argument
    (keyed by its aval, see `quax._rules._control_flow`): the call with `token` runs
    again with it as a constant. A `BaseException`, so that a rule's `except
    Exception` cannot turn it into a more general answer."""

    def __init__(self, token: object) -> None:
        super().__init__(token)
        self.token = token


class _StandIns(threading.local):
    tokens: "dict[Any, object]"

    def __init__(self) -> None:
        # The staged variables that stand in for concrete plain arguments, each
        # with the token of the nested `jit` call that knows its value.
        self.tokens = {}


_stand_ins = _StandIns()


def stand_in_token(x: Any) -> object | None:
    """The token of the nested `jit` call whose concrete argument the staged
    tracer `x` stands in for, or `None`."""
    if not _stand_ins.tokens or type(x) is not DynamicJaxprTracer:
        return None
    kind, atom = staged_atom(x._trace, x)
    return _stand_ins.tokens.get(atom) if kind == "var" else None


@contextlib.contextmanager
def standing_in(tracers: Sequence[Any], tokens: Sequence[object]) -> Iterator[None]:
    """Within the block, `known_constant` asked about one of the staged `tracers`
    (inputs of a body being traced) raises `ValueAsked` with its token."""
    added = []
    for t, token in zip(tracers, tokens, strict=True):
        kind, atom = staged_atom(t._trace, t)
        if kind == "var" and atom not in _stand_ins.tokens:
            _stand_ins.tokens[atom] = token
            added.append(atom)
    try:
        yield
    finally:
        for atom in added:
            del _stand_ins.tokens[atom]


class _Asks(threading.local):
    count: int = 0


# How many times `known_constant` (or `known_scale_invariant`,
# `known_scaled_constant`) was asked about a tracer in this thread (see
# `quax._caching._replay`, which keys the constants among a primitive's inputs by
# value: an answer about a constant is a function of its key).
_asks = _Asks()


def known_asks() -> int:
    """How many times this thread asked `known_constant` (or
    `known_scale_invariant`, `known_scaled_constant`) about a tracer so far."""
    return _asks.count


def known_constant(x: Any, max_size: int = 1024) -> Any:
    """The value of `x`, when the program being staged shows it to be a constant.

    Inside `jax.jit` (and so inside a quaxified function under `jit`), a rule sees
    plain operands as tracers even when they are constants of the program: the zeros
    `jnp.where(x > 0, x, 0)` selects against, the fill of a `jnp.full_like`. A rule
    whose result depends on such a constant (a structure kept only against zeros, a
    fill that broadcasts like a scalar) asks here instead of refusing.

    **Arguments:**

    - `x`: a plain array or a tracer.
    - `max_size`: arrays of more elements are not looked at (`None` is returned).

    **Returns:**

    A NumPy array with `x`'s value when it is known now: `x` itself when it is not a
    tracer; for a jit-traced `x`, a literal, a broadcast, copy or conversion of one, or
    a small effect-free equation on such constants (`lax.switch` clamps a constant
    index). Otherwise `None`.

    Asked about an array computed from the leaves of values, in library code that
    quax runs eagerly as one compiled program (see [`quax.set_eager_compilation`][]),
    it makes that code run equation by equation instead, where the leaves are
    concrete: a rule that reads the numbers of a leaf asks here, so that it answers
    alike either way.
    """
    if not isinstance(x, Tracer):
        return np.asarray(x) if np.size(x) <= max_size else None
    _asks.count += 1
    out = _staged_values(max_size)(x)
    if out is None and np.size(x) <= max_size:
        # Computed from the leaves of an eager compiled program's values, which
        # equation by equation are known: that code runs equation by equation.
        require_concrete(x)
    return out


def _staged_values(max_size: int) -> Callable[[Any], Any]:
    """The reader behind `known_constant`: the value of a staged tracer when the
    program shows it to be a constant, else `None` (without asking an eager
    compiled program for concrete values). One reader remembers each tracer it
    looked at."""
    known: dict[int, Any] = {}  # by tracer id: each shared input is looked at once

    def value(t: Any) -> Any:
        if not isinstance(t, DynamicJaxprTracer):
            return None
        if id(t) not in known:
            known[id(t)] = evaluate(t)
        return known[id(t)]

    def evaluate(t: Any) -> Any:
        aval: Any = t.aval
        if aval.size > max_size:
            return None
        kind, atom = staged_atom(t._trace, t)
        if kind == "literal":
            return np.asarray(atom.val)
        if kind == "const":
            # A concrete constant, or a tracer of the program that holds this one's
            # inputs (a tangent program holds its primal program's arrays so).
            return value(atom) if isinstance(atom, Tracer) else np.asarray(atom)
        eqn = staged_equation(t)
        if eqn is None:
            if kind == "var" and _stand_ins.tokens:
                token = _stand_ins.tokens.get(atom)
                if token is not None:
                    # Concrete when called: with it as a constant, a rule could
                    # answer otherwise.
                    raise ValueAsked(token)
            return None
        primitive = eqn.primitive
        if primitive is jprim.copy_p:
            return value(eqn.in_tracers[0])
        if primitive is jprim.convert_element_type_p:
            operand = value(eqn.in_tracers[0])
            return None if operand is None else operand.astype(aval.dtype)
        if primitive is jprim.broadcast_in_dim_p and len(eqn.in_tracers) == 1:
            operand = value(eqn.in_tracers[0])
            if operand is None:
                return None
            dims = eqn.params["broadcast_dimensions"]
            kept = [
                operand.shape[dims.index(d)] if d in dims else 1
                for d in range(aval.ndim)
            ]
            return np.broadcast_to(operand.reshape(kept), aval.shape).astype(aval.dtype)
        if (
            aval.size > _KNOWN_COMPUTE_MAX_SIZE
            or primitive.multiple_results
            or eqn.effects
            or any(isinstance(p, Jaxpr | ClosedJaxpr) for p in eqn.params.values())
        ):
            return None
        operands = []
        for operand_tracer in eqn.in_tracers:
            operand = value(operand_tracer)
            if operand is None:
                return None
            operands.append(operand)
        # Evaluated now, whatever the current trace (none while a primitive is bound).
        with eval_context():
            return np.asarray(primitive.bind(*operands, **eqn.params))

    return value


def _scale_invariant_values(values: Any) -> bool:
    """Whether every element is zero, infinite or NaN."""
    return bool(np.all((values == 0) | ~np.isfinite(values)))


# How `known_scale_invariant` sees through an equation: its output is all zeros,
# infinities and NaNs when `"any"` (or `"all"`) of the operands at `positions`
# (`None`: every operand) are. A product or quotient with such an operand is one
# (`0 * x` is 0 or NaN, `inf / x` is infinite or NaN, `x / 0` is infinite or NaN);
# a sum, selection or rearrangement of only such operands is one too (`0 + inf` is
# infinite, `inf - inf` is NaN).
_INVARIANCE: dict[Primitive, tuple[str, tuple[int, int | None] | None]] = {
    jprim.mul_p: ("any", None),
    jprim.dot_general_p: ("any", None),
    jprim.div_p: ("any", None),  # for inexact dtypes only, see below
    **dict.fromkeys(
        [
            jprim.add_p,
            jprim.sub_p,
            jprim.max_p,
            jprim.min_p,
            jprim.neg_p,
            jprim.abs_p,
            jprim.copy_p,
            jprim.stop_gradient_p,
            jprim.convert_element_type_p,  # to an inexact dtype, see below
            jprim.broadcast_in_dim_p,
            jprim.reshape_p,
            jprim.squeeze_p,
            jprim.transpose_p,
            jprim.slice_p,
            jprim.rev_p,
            jprim.reduce_sum_p,
            jprim.reduce_max_p,
            jprim.reduce_min_p,
            jprim.concatenate_p,
        ],
        ("all", None),
    ),
    jprim.select_n_p: ("all", (1, None)),  # the cases, whatever the predicate
    jprim.pad_p: ("all", (0, 2)),
    jprim.dynamic_slice_p: ("all", (0, 1)),
    jprim.gather_p: ("all", (0, 1)),
}

# Equations `known_scale_invariant` looks through in one chain, at most: deeper
# it answers `False`, as for an unknown array.
_INVARIANCE_MAX_DEPTH = 32


def known_scale_invariant(x: Any, max_size: int = 1024) -> bool:
    """Whether every element of `x` is known at trace time to be zero, infinite or
    NaN: an array that multiplying by any positive number leaves unchanged.

    Such an array fits any scale: a units family adds it to a quantity in any unit
    (`x + dt * zeros`, where a solver starts from `jnp.zeros_like(x)`), as it
    does the constants of `known_constant`. This sees further than
    `known_constant`: the program need not show `x`'s value, only that each
    element is one of these. A product or quotient of such an array with any other
    array is one (`0 * dt` is zero, or NaN for an infinite or NaN `dt`); so is a
    sum, selection, reduction, conversion to an inexact dtype, broadcast or
    rearrangement of such arrays alone. Anything else is asked of
    `known_constant`.

    **Arguments:**

    - `x`: a plain array or a tracer.
    - `max_size`: the constants (and concrete arrays) of more elements are not
        looked at.

    **Returns:**

    `True` when every element is shown to be zero, infinite or NaN; `False` when
    the program does not show it (or some element is not).
    """
    if not isinstance(x, Tracer):
        return np.size(x) <= max_size and _scale_invariant_values(np.asarray(x))
    _asks.count += 1
    value = _staged_values(max_size)
    proven: dict[int, bool] = {}  # by tracer id: each shared input is looked at once

    def invariant(t: Any, depth: int) -> bool:
        if not isinstance(t, DynamicJaxprTracer):
            return False
        if id(t) not in proven:
            proven[id(t)] = prove(t, depth)
        return proven[id(t)]

    def prove(t: Any, depth: int) -> bool:
        eqn = staged_equation(t)
        rule = None if eqn is None else _INVARIANCE.get(eqn.primitive)
        dtype = t.aval.dtype
        if (
            eqn is not None
            and rule is not None
            and depth < _INVARIANCE_MAX_DEPTH
            and not np.issubdtype(dtype, np.complexfloating)
            and (
                np.issubdtype(dtype, np.inexact)
                or eqn.primitive not in (jprim.div_p, jprim.convert_element_type_p)
            )
        ):
            mode, positions = rule
            operands = eqn.in_tracers[slice(*positions) if positions else slice(None)]
            proofs = (invariant(o, depth + 1) for o in operands)
            if any(proofs) if mode == "any" else all(proofs):
                return True
        known = value(t)
        return known is not None and _scale_invariant_values(known)

    if invariant(x, 0):
        return True
    if np.size(x) <= max_size:
        # As `known_constant`: an eager compiled program's code runs equation by
        # equation, where `x` is concrete.
        require_concrete(x)
    return False


# How `known_scaled_constant` sees through an equation of one operand: the
# constant's part of it, as a function of the operand's (the scale passes through).
_SCALED_UNARY: dict[Primitive, Callable[[np.ndarray, Any, dict[str, Any]], Any]] = {
    jprim.neg_p: lambda c, aval, params: np.negative(c),
    jprim.copy_p: lambda c, aval, params: c,
    jprim.reshape_p: lambda c, aval, params: _reshaped(c, aval, params),
    jprim.broadcast_in_dim_p: lambda c, aval, params: np.broadcast_to(
        c.reshape(
            [
                c.shape[params["broadcast_dimensions"].index(d)]
                if d in params["broadcast_dimensions"]
                else 1
                for d in range(aval.ndim)
            ]
        ),
        aval.shape,
    ),
}


def _reshaped(c: np.ndarray, aval: Any, params: dict[str, Any]) -> np.ndarray:
    """`lax.reshape` of the constant `c`: transposed first by `dimensions`, when
    given."""
    dimensions = params.get("dimensions")
    if dimensions is not None:
        c = np.transpose(c, dimensions)
    return c.reshape(aval.shape)


def _scales_exactly(old: Any, new: Any) -> bool:
    """Whether converting `s * c` from dtype `old` to `new` is converting `s` and
    `c` (up to rounding): from a real floating dtype to a floating or complex one
    (not to an integer, which truncates, nor from a complex, whose imaginary part
    a real dtype drops)."""
    return np.issubdtype(old, np.floating) and np.issubdtype(new, np.inexact)


def known_scaled_constant(x: Any, max_size: int = 1024) -> tuple[Any, Any] | None:
    """`x` as a scalar times a known constant, when the program being traced shows
    it to be one: `noise * jnp.eye(n)` with a traced `noise`, where
    [`quax.known_constant`][] (which needs every number) sees nothing.

    A rule that keeps a structure against a constant (a diagonal added as a dense
    array, as Gaussian-process code adds `noise * jnp.eye(n)` with a noise it
    learns) asks here for the constant's pattern and the traced factor apart. The
    constant is read as `known_constant` reads one; the equations seen through are
    products of such parts (`s * C`, `C * s`, `(s * C) * t`, through the broadcast
    that `jnp` gives a scalar), quotients by one whose constant has no zero (`s *
    C / t`), negation, copies, reshapes, broadcasts and conversions from a real
    floating dtype to an inexact one. Under `jax.grad`, `jax.jvp` and
    `jax.linearize` (outside or inside `jit`) both the primal and the tangent must
    show it, with proportional constants: the scale then carries the derivative.

    **Arguments:**

    - `x`: a plain array or a tracer.
    - `max_size`: arrays of more elements are not looked at (`None` is returned).

    **Returns:**

    A pair `(scale, constant)` with `x == scale * constant` (up to rounding): the
    `scale` a 0-dimensional array of `x`'s dtype (NumPy's one when all of `x` is
    known, else a tracer that the caller's program may use, as it does `x`) and
    the `constant` a NumPy array of `x`'s shape and dtype. `x` itself (with a scale
    of one) when it is not a tracer. Otherwise `None`.

    Asked (as `known_constant` is) inside library code that quax runs eagerly as
    one compiled program (see [`quax.set_eager_compilation`][]) about an array
    whose scale comes from the leaves of values, it makes that code run equation
    by equation instead, where `x` is concrete and all known.

    !!! note

        A rule that asked here is never recorded for replay (the scale is a tracer
        of this program, and the next call's may differ): it runs at each bind,
        as one that asked `known_constant` does.
    """
    if not isinstance(x, Tracer):
        if np.size(x) > max_size:
            return None
        known = np.asarray(x)
        return np.ones((), known.dtype), known
    _asks.count += 1
    if np.size(x) > max_size:
        return None
    out = _ScaledReader(max_size).parts(x, 0)
    if out is None or out[0] is not None:
        # As `known_constant`: an eager compiled program's code runs equation by
        # equation, where `x` is concrete.
        require_concrete(x)
    if out is None:
        return None
    scale, constant = out
    dtype = x.dtype
    scale = np.ones((), dtype) if scale is None else scale
    return scale, np.broadcast_to(constant, np.shape(x)).astype(dtype, copy=False)


# A scale, as `_ScaledReader` passes it: `None` (one), a 0-dimensional NumPy array,
# or a 0-dimensional tracer.
_Parts = tuple[Any, np.ndarray]


class _ScaledReader:
    """The reader behind `known_scaled_constant`: a value as `(scale, constant)`,
    the arithmetic on traced scales bound at their own trace (a staged program's,
    a tangent's), never at the current one. Each tracer is looked at once."""

    def __init__(self, max_size: int) -> None:
        self.value = _staged_values(max_size)
        self.split: dict[int, _Parts | None] = {}  # by tracer id

    def parts(self, t: Any, depth: int) -> _Parts | None:
        if not isinstance(t, Tracer):
            return None, np.asarray(t)
        if id(t) not in self.split:
            self.split[id(t)] = self.read(t, depth)
        return self.split[id(t)]

    def read(self, t: Any, depth: int) -> _Parts | None:
        aval: Any = t.aval
        if depth >= _INVARIANCE_MAX_DEPTH:
            return None
        pair = tangent_pair(t)
        if pair is not None:
            return self.pair(t, *pair, depth)
        known = self.value(t)
        if known is not None:
            return None, known
        if aval.size == 1:  # a traced number: itself times one
            return _scale_op(_number, t), np.ones(aval.shape, aval.dtype)
        eqn = staged_equation(t)
        if eqn is None:
            return None
        primitive, operands = eqn.primitive, eqn.in_tracers
        if primitive in (jprim.mul_p, jprim.div_p):
            # Of the operands' dtype (not a product computed in another).
            if any(o.aval.dtype != aval.dtype for o in operands):
                return None
            left, right = (self.parts(o, depth + 1) for o in operands)
            if left is None or right is None:
                return None
            if primitive is jprim.mul_p:
                scale = _scale_op(operator.mul, left[0], right[0])
                return scale, np.multiply(left[1], right[1])
            # `c / 0` is not `(1 / 0) * c`, nor an integer quotient a product.
            if np.any(right[1] == 0) or not np.issubdtype(aval.dtype, np.inexact):
                return None
            scale = _scale_op(operator.truediv, left[0], right[0])
            return scale, np.divide(left[1], right[1])
        if primitive is jprim.convert_element_type_p:
            inner = self.parts(operands[0], depth + 1)
            if inner is None or not _scales_exactly(operands[0].aval.dtype, aval.dtype):
                return None
            scale = _scale_op(lambda s: s.astype(aval.dtype), inner[0])
            return scale, inner[1].astype(aval.dtype)
        rule = _SCALED_UNARY.get(primitive)
        if rule is None or len(operands) != 1:
            return None
        inner = self.parts(operands[0], depth + 1)
        if inner is None:
            return None
        return inner[0], rule(inner[1], aval, eqn.params)

    def pair(self, t: Any, primal: Any, tangent: Any, depth: int) -> _Parts | None:
        """A tracer of differentiation, with this `primal` and `tangent`: both a
        scale times a constant, the constants proportional (`Ct = k Cp`), so that
        `t` is `(sp, k st) * Cp`, or `(0, st) * Ct` where `Cp` is all zeros."""
        p = self.parts(primal, depth + 1)
        if p is None:
            return None
        if isinstance(tangent, AdZero):
            return p  # constant for this derivative: the primal's scale has none
        q = self.parts(tangent, depth + 1)
        if q is None:
            return None
        (sp, cp), (st, ct) = p, q
        if not np.any(ct):
            return p  # an instantiated zero tangent: as a symbolic one
        if not np.any(cp):
            zero = np.zeros((), t.aval.dtype)
            st = np.ones((), t.aval.dtype) if st is None else st  # a concrete tangent
            return with_tangent(t, zero, st), ct
        flat = np.abs(cp).reshape(-1)
        at = int(np.argmax(flat))
        k = ct.reshape(-1)[at] / cp.reshape(-1)[at]
        eps = np.finfo(np.result_type(ct.dtype, np.float16)).eps
        if not (
            np.isfinite(flat[at])
            and np.isfinite(k)
            and np.allclose(ct, k * cp, rtol=16 * eps, atol=0)
        ):
            return None
        sp = np.ones((), t.aval.dtype) if sp is None else sp
        st = np.ones((), t.aval.dtype) if st is None else st  # a concrete tangent
        tangent_scale = _scale_op(lambda s: s * k.astype(s.dtype), st)
        return with_tangent(t, sp, tangent_scale), cp


def _scale_op(fn: Callable[..., Any], *scales: Any) -> Any:
    """`fn` of the `scales` (`None` is one: a product or quotient with it is the
    other scale), bound at the trace of the traced ones (all of one trace)."""
    if fn in (operator.mul, operator.truediv) and scales[1] is None:
        return scales[0]
    if fn is operator.mul and scales[0] is None:
        return scales[1]
    if scales[0] is None:
        scales = (np.ones((), scales[1].dtype), *scales[1:])
    traced = [s for s in scales if isinstance(s, Tracer)]
    if not traced:
        return np.asarray(fn(*scales))
    return call_at_trace(traced[0]._trace, lambda v, _: fn(*v), scales, None)


def _number(t: Any) -> Any:
    """The array `t` of one element, 0-dimensional."""
    return t if np.ndim(t) == 0 else t.reshape(())


# Counting evaluations ----------------------------------------------------------------


@dataclasses.dataclass
class EvaluationReport:
    """How many jaxprs (bodies of higher-order primitives, inlined `jit`s) quax
    evaluated on values in a block: each is one re-trace of a body."""

    total: int = 0


class _Evaluations(threading.local):
    reports: list[EvaluationReport]

    def __init__(self) -> None:
        self.reports = []


_evaluations = _Evaluations()


@contextlib.contextmanager
def track_evaluations() -> Iterator[EvaluationReport]:
    """Count the jaxprs quax evaluates inside the block, in this thread.

    JAX traces a loop's or a branch's body once into a jaxpr; quax evaluates that
    jaxpr on the values once per branch or function, plus once per round of type
    joins. This counts those evaluations (benchmarks use it to measure re-traces).

    ```python
    with quax.plugins.track_evaluations() as report:
        quax.quaxify(f)(x)
    print(report.total)
    ```

    **Returns:**

    A [`quax.plugins.EvaluationReport`][], filled in as the block runs.
    """
    report = EvaluationReport()
    _evaluations.reports.append(report)
    try:
        yield report
    finally:
        _evaluations.reports.remove(report)
