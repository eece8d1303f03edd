"""What a rule can know of a plain operand at trace time: its value, when the program
being staged shows it to be a constant (`quax.known_constant`), whether every element
is zero, infinite or NaN (`quax.known_scale_invariant`), or a traced scalar times a
constant (`quax.known_scaled_constant`).

An answer the caches' keys do not hold is reported to them: asked about a leaf of the
compiled eager program being traced, these raise `ConcreteNeeded` (equation by
equation the leaf would be concrete, see `quax._caching._eager`); asked about a
plain argument of a nested `jit` that was concrete when called, `ValueAsked` (see
`quax._caching._nested`); and every question about a tracer is counted
(`known_asks`), so that a replayed recording never stands for a rule that asked (see
`quax._caching._replay`).
"""

import contextlib
import operator
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax.extend.core.primitives as jprim
import numpy as np

from .._compat import (
    AdZero,
    ClosedJaxpr,
    DynamicJaxprTracer,
    Jaxpr,
    Primitive,
    Tracer,
    call_at_trace,
    eager_program,
    eval_context,
    staged_atom,
    staged_equation,
    tangent_pair,
    with_tangent,
)


__all__ = [
    "ConcreteNeeded",
    "ValueAsked",
    "known_asks",
    "known_constant",
    "known_scale_invariant",
    "known_scaled_constant",
    "require_concrete",
    "stand_in_token",
    "standing_in",
]

# Largest output that `known_constant` computes (rather than views, as it does a
# broadcast), so that the trace-time work stays small: a million elements (a few
# milliseconds of NumPy), so that `jnp.eye(n)` (an `iota`, an `eq` and a conversion
# under `jit`) is known up to `n = 1024`.
_KNOWN_COMPUTE_MAX_SIZE = 2**20


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


class ValueAsked(BaseException):
    """A rule asked `known_constant` for the value of a plain argument of a nested
    `jit` that was concrete when called, but that quax passed in as an argument
    (keyed by its aval, see `quax._caching._nested`): the call with `token` runs
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
