"""Rules that keep a [`quax.zero.Zero`][] symbolic.

Every rule returns exactly what the primitive would give on the dense signed zeros
(its shape and dtype come from the primitive's own abstract evaluation), or hands
the case to the fallback, which materialises the zero, when the result is not known
to be a zero with one sign for all its elements.

Where a sign depends on how XLA computes (the sum of `-0.`s is `+0.` because the
reduction starts from `+0.`; the product of an even number of them is `+0.`), the
rule does not reason about it: it evaluates the primitive eagerly on small signed
zeros of the same dtypes, shrunk so that each dimension keeps its size up to 3 and
its parity beyond (`_shrunk`), and reads the signs off the result.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive, primitives as prims

from .._caching._keys import PROGRAM, params_key, program_key
from .._compat import Tracer
from .._dispatch._registry import fallback_rule, register, register_elementwise
from .._foundation._caches import Table, remembered
from .._foundation._zero_preserving import ZERO_PRESERVING
from .._transform._quaxify import quaxify
from .._values._value import Value, ValueLike
from ._value import Zero, is_ieee_strict, signed_zeros


__all__: list[str] = []


def _aval(x: ValueLike) -> Any:
    return x.aval() if isinstance(x, Value) else jax.typeof(x)


def _out_avals(
    primitive: Primitive, values: Sequence[ValueLike], params: dict[str, Any]
) -> Any:
    out, _ = primitive.abstract_eval(*map(_aval, values), **params)
    return out


def _zero(
    primitive: Primitive, values: Sequence[ValueLike], params: dict[str, Any]
) -> Any:
    """The primitive's output(s) on `values`, as unsigned `Zero`s (for outputs
    that cannot have a sign, or a sign that no operand can change)."""
    out = _out_avals(primitive, values, params)
    if primitive.multiple_results:
        return [Zero(a.shape, a.dtype) for a in out]
    return Zero(out.shape, out.dtype)


def _fallback(
    primitive: Primitive, values: Sequence[ValueLike], params: dict[str, Any]
) -> Any:
    return fallback_rule(primitive, values)(values, params)


def _as(x: ValueLike, aval: Any) -> Any:
    """`x` broadcast and converted to `aval`'s shape and dtype (a value stays one)."""
    here = _aval(x)
    if here.shape == aval.shape and here.dtype == aval.dtype:
        return x if isinstance(x, Value) else jnp.asarray(x)

    def convert(y: Any) -> Any:
        return jnp.broadcast_to(y, aval.shape).astype(aval.dtype)

    if isinstance(x, Value):
        return quaxify(convert)(x)
    return convert(x)


def _concrete(x: ValueLike) -> np.ndarray | None:
    """`x` as a NumPy array if it is known now (not a value or tracer), else `None`."""
    if isinstance(x, Value | Tracer):
        return None
    return np.asarray(x)


def _could_be_nonfinite(x: ValueLike) -> bool:
    if not jnp.issubdtype(_aval(x).dtype, jnp.inexact):
        return False
    known = _concrete(x)
    return known is None or not bool(np.all(np.isfinite(known)))


# Signs --------------------------------------------------------------------------------


def _signs(x: Zero) -> tuple[bool, bool]:
    return x._signs


def _signs_of(result: Any) -> tuple[bool, bool] | None:
    """The `(real, imaginary)` signs of `result` when it is all zeros with one sign
    per part (an empty array counts as `+0.`), else `None`."""
    r = np.asarray(result)
    if np.any(r != 0):  # also NaN
        return None
    if not jnp.issubdtype(r.dtype, jnp.inexact):
        return (False, False)
    if r.dtype.kind == "V" or not np.issubdtype(r.dtype, np.inexact):
        r = r.astype(np.float32)  # bfloat16, float8: exactly, sign included
    parts = _parts(r)
    signs = []
    for part in parts:
        negative = np.signbit(part)
        if np.all(negative) and negative.size:
            signs.append(True)
        elif not np.any(negative):
            signs.append(False)
        else:
            return None
    return (signs[0], len(signs) == 2 and signs[1])


def _parts(r: np.ndarray) -> tuple[np.ndarray, ...]:
    """The real and imaginary parts of a complex `r`; a real `r` alone."""
    return (np.real(r), np.imag(r)) if np.iscomplexobj(r) else (r,)


def _shrunk(d: int) -> int:
    """A dimension's size for the small signed zeros a rule evaluates: `d` itself up
    to 3, then 2 or 3 with `d`'s parity. A reduction's sign depends on whether it
    has no, one or several terms, and for a product on their parity, never on more."""
    return d if d <= 3 else 2 + d % 2


# An operand of the small evaluation: ("zero", shape, dtype, signs) for signed zeros,
# ("unit", shape, dtype, signs) for signed ones (a value whose sign is all the rule
# can know), or ("array", None, None, the concrete array).
_Operand = tuple[str, Any, Any, Any]


def _operand(kind: str, shape: Any, dtype: Any, signs: Any) -> _Operand:
    return (kind, shape, dtype, signs)


def _zero_operand(x: Zero, shape: tuple[int, ...] | None = None) -> _Operand:
    shape = tuple(map(_shrunk, x.shape)) if shape is None else shape
    return _operand("zero", shape, x.dtype, _signs(x))


def _positive_operand(x: ValueLike) -> _Operand:
    """A value known only when the program runs, read as a positive finite number
    (what a `Zero` annihilates it as)."""
    aval = _aval(x)
    return _operand("unit", tuple(map(_shrunk, aval.shape)), aval.dtype, (False, False))


def _build(operand: _Operand) -> Any:
    kind, shape, dtype, signs = operand
    if kind == "array":
        return signs
    if kind == "zero":
        return signed_zeros(shape, dtype, signs)
    # A real part of 1 and an imaginary part of 0, each with its sign in `signs`.
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.finfo(dtype).dtype
        real = jnp.full(shape, -1 if signs[0] else 1, part)
        return lax.complex(real, signed_zeros(shape, part, (signs[1], False)))
    return jnp.full(shape, -1 if signs[0] else 1, dtype)


def _evaluate_now(
    primitive: Primitive, operands: Sequence[_Operand], params: dict[str, Any]
) -> list[tuple[bool, bool] | None]:
    """The signs of each output of `primitive` on `operands`, evaluated eagerly (also
    inside a trace), or `None` for an output that is not a signed zero."""
    with jax.ensure_compile_time_eval():
        out = primitive.bind(*map(_build, operands), **params)
    outs = out if primitive.multiple_results else [out]
    return [_signs_of(o) for o in outs]


# The signs each small evaluation gave, by `program_key`: the primitive and its
# params (floats by their bits), the operands, the context.
_evaluations = Table("symbolic zeros: the signs of small evaluations", 4096)


def _evaluated_signs(
    primitive: Primitive, operands: Sequence[_Operand], params: dict[str, Any]
) -> Sequence[tuple[bool, bool] | None]:
    if any(o[0] == "array" for o in operands):
        return _evaluate_now(primitive, operands, params)
    key, parts = program_key((primitive, params_key(params)), tuple(operands))
    return remembered(
        _evaluations,
        key,
        PROGRAM,
        parts,
        lambda: _evaluate_now(primitive, operands, params),
        "the signs evaluated",
    )


def _by_evaluation(
    primitive: Primitive,
    values: Sequence[ValueLike],
    params: dict[str, Any],
    operands: Sequence[_Operand] | None = None,
) -> Any:
    """`primitive` on `values` as `Zero`s with the signs it gives on `operands` (by
    default each `Zero`'s small signed zeros and, for any other value, positive
    ones), or the fallback when an output is not a signed zero."""
    if operands is None:
        operands = [
            _zero_operand(v) if isinstance(v, Zero) else _positive_operand(v)
            for v in values
        ]
    signs = _evaluated_signs(primitive, operands, params)
    if any(s is None for s in signs):
        return _fallback(primitive, values, params)
    out = _out_avals(primitive, values, params)
    avals = out if primitive.multiple_results else [out]
    zeros = [
        Zero(a.shape, a.dtype, _negative(s, a.dtype))
        for a, s in zip(avals, signs, strict=True)
    ]
    return zeros if primitive.multiple_results else zeros[0]


def _negative(signs: Any, dtype: Any) -> bool | tuple[bool, bool]:
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return signs
    return signs[0] and bool(jnp.issubdtype(dtype, jnp.inexact))


def _with_signs(primitive: Primitive, values: Any, params: Any, signs: Any) -> Any:
    """The primitive's output(s) as `Zero`s with the signs `signs` (a mover's)."""
    out = _out_avals(primitive, values, params)
    if primitive.multiple_results:
        return [Zero(a.shape, a.dtype, _negative(signs, a.dtype)) for a in out]
    return Zero(out.shape, out.dtype, _negative(signs, out.dtype))


def _same_signs(zeros: Sequence[Zero]) -> tuple[bool, bool] | None:
    """The signs of `zeros` if they all have the same, else `None`."""
    signs = {_signs(z) for z in zeros}
    return signs.pop() if len(signs) == 1 else None


def _sanitised(known: np.ndarray, divisor: bool) -> np.ndarray:
    """`known` with each element a zero annihilates (non-finite; zero as a divisor)
    replaced by a one of its sign, so that it gives the annihilated zero's sign."""
    if not jnp.issubdtype(known.dtype, jnp.inexact):
        return known
    bad = ~np.isfinite(known)
    if divisor:
        bad |= known == 0
    if not np.any(bad):
        return known
    if np.iscomplexobj(known):  # 1 and 0 with the signs of the real and imaginary parts
        real, imag = _parts(known)
        pairs = np.stack([np.copysign(1, real), np.copysign(0, imag)], axis=-1)
        unit = np.ascontiguousarray(pairs).view(known.dtype)[..., 0]
    else:
        unit = np.copysign(1, known).astype(known.dtype)
    return np.where(bad, unit, known)


def _annihilated(
    values: Sequence[ValueLike], index: int, known: np.ndarray, divisor: bool
) -> tuple[list[ValueLike], np.ndarray]:
    """`values` and the concrete operand at `index` (`known`) with each element a
    zero annihilates replaced by a one of its sign (`_sanitised`): `known` for the
    signs, and in `values` in the operand's own dtype and weak type, for the dense
    product where those signs differ (which would otherwise read the element
    itself: `0 * inf`, `0 / 0`, NaN where the other elements decide nothing)."""
    sanitised = _sanitised(known, divisor)
    if sanitised is known:
        return list(values), known
    y = jnp.asarray(values[index])
    bad = ~jnp.isfinite(y)
    if divisor:
        bad = bad | (y == 0)
    if jnp.iscomplexobj(y):
        real, imag = jnp.real(y), jnp.imag(y)
        unit = lax.complex(
            jnp.copysign(jnp.ones_like(real), real),
            jnp.copysign(jnp.zeros_like(imag), imag),
        )
    else:
        unit = jnp.copysign(jnp.ones_like(y), y)
    changed = list(values)
    changed[index] = jnp.where(bad, unit, y)
    return changed, sanitised


def _with_known(
    primitive: Primitive,
    values: Sequence[ValueLike],
    params: dict[str, Any],
    index: int,
    known: np.ndarray,
    zero_shape: Callable[[Zero], tuple[int, ...]],
) -> Any:
    """`primitive` on a `Zero` and the concrete `known` at `index`: evaluated now
    (the `Zero` shaped by `zero_shape`), a `Zero` when the result is one signed
    zero, else the dense result."""
    operands = [
        _operand("array", None, None, known)
        if i == index
        else _zero_operand(v, zero_shape(v))  # type: ignore[arg-type]
        for i, v in enumerate(values)
    ]
    return _by_evaluation(primitive, values, params, operands)


# Zero in, zero out --------------------------------------------------------------------

# Structural operations that only move, copy or drop elements: each keeps the sign.
_MOVERS = [
    prims.broadcast_in_dim_p,
    prims.reshape_p,
    prims.squeeze_p,
    prims.transpose_p,
    prims.rev_p,
    prims.slice_p,
    lax.split_p,
    lax.unstack_p,
]


@register_elementwise(_MOVERS)
def _mover(primitive: Primitive, x: Zero, **params: Any) -> Any:
    return _with_signs(primitive, [x], params, _signs(x))


# f(0) = 0 elementwise (`quax.ZERO_PRESERVING`), conversions, and reductions and scans
# of zeros: the sign is the one the primitive gives on small signed zeros (`sin`,
# `sqrt` keep it, `abs` and `square` drop it, a sum of `-0.`s is `+0.`, a product
# follows the parity of its terms, and a scan whose signs differ materialises).
_ZERO_IN_ZERO_OUT = [
    *sorted(ZERO_PRESERVING, key=lambda p: p.name),
    prims.convert_element_type_p,
    prims.reduce_sum_p,
    prims.reduce_xor_p,
    prims.reduce_or_p,
    prims.argmax_p,
    prims.argmin_p,
    prims.cumsum_p,
    prims.cumprod_p,
    prims.cummax_p,
    prims.cummin_p,
]


# The signs of a complex product of zeros depend on the order of its terms, which XLA
# chooses by size: these are evaluated only for real zeros.
_ORDER_DEPENDENT = {prims.reduce_prod_p, prims.cumprod_p}


@register_elementwise(_ZERO_IN_ZERO_OUT)
def _unary(primitive: Primitive, x: Zero, **params: Any) -> Any:
    if primitive in _ORDER_DEPENDENT and jnp.issubdtype(x.dtype, jnp.complexfloating):
        return _fallback(primitive, [x], params)
    return _by_evaluation(primitive, [x], params)


@register(prims.bitcast_convert_type_p)
def _bitcast(x: Zero, **params: Any) -> Any:
    # `+0.` is all zero bits, so any reading of it is zero; `-0.` has its sign bit.
    if any(_signs(x)):
        return _fallback(prims.bitcast_convert_type_p, [x], params)
    return _zero(prims.bitcast_convert_type_p, [x], params)


# Reductions whose value over an empty axis is not zero (`max` of nothing is `-inf`).
_NONEMPTY_REDUCTIONS = [
    prims.reduce_max_p,
    prims.reduce_min_p,
    prims.reduce_prod_p,
    prims.reduce_and_p,
]


@register_elementwise(_NONEMPTY_REDUCTIONS)
def _reduction(
    primitive: Primitive, x: Zero, *, axes: Sequence[int], **params: Any
) -> Any:
    params = dict(params, axes=axes)
    complex_ = jnp.issubdtype(x.dtype, jnp.complexfloating)
    if all(x.shape[a] > 0 for a in axes) and not (
        primitive in _ORDER_DEPENDENT and complex_
    ):
        return _by_evaluation(primitive, [x], params)
    return _fallback(primitive, [x], params)


@register(prims.integer_pow_p)
def _integer_pow(x: Zero, *, y: int) -> Any:
    if y > 0:
        return _by_evaluation(prims.integer_pow_p, [x], {"y": y})
    return _fallback(prims.integer_pow_p, [x], {"y": y})


def _joined(primitive: Primitive, values: Sequence[ValueLike], params: Any, zeros: Any):
    """The primitive's output as a `Zero` when `zeros` (the operands it puts side by
    side) all have one sign, else the fallback."""
    signs = _same_signs(zeros)
    if signs is None:
        return _fallback(primitive, values, params)
    return _with_signs(primitive, values, params, signs)


@register(prims.concatenate_p)
def _concatenate(*operands: Zero, dimension: int) -> Any:
    params = {"dimension": dimension}
    return _joined(prims.concatenate_p, operands, params, operands)


@register(lax.stack_p)
def _stack(*operands: Zero, axis: int) -> Any:
    return _joined(lax.stack_p, operands, {"axis": axis}, operands)


@register(prims.select_n_p)
def _select_n(which: ValueLike, *cases: Zero) -> Any:
    # A zero predicate picks the first case everywhere.
    chosen = cases[:1] if isinstance(which, Zero) else cases
    return _joined(prims.select_n_p, [which, *cases], {}, chosen)


@register(prims.pad_p)
def _pad(operand: Zero, padding_value: ValueLike, *, padding_config: Any) -> Any:
    values = [operand, padding_value]
    params = {"padding_config": padding_config}
    known = _concrete(padding_value)
    if isinstance(padding_value, Zero):
        padding_signs = _signs(padding_value)
    elif known is not None:
        padding_signs = _signs_of(known)
    else:
        padding_signs = None
    if padding_signs is not None and padding_signs == _signs(operand):
        return _with_signs(prims.pad_p, values, params, padding_signs)
    return _fallback(prims.pad_p, values, params)


@register(prims.dynamic_slice_p)
def _dynamic_slice(operand: Zero, *indices: ValueLike, **params: Any) -> Zero:
    values = [operand, *indices]
    return _with_signs(prims.dynamic_slice_p, values, params, _signs(operand))


@register(prims.dynamic_update_slice_p)
def _dynamic_update_slice(operand: Zero, update: Zero, *indices: ValueLike) -> Any:
    values = [operand, update, *indices]
    return _joined(prims.dynamic_update_slice_p, values, {}, [operand, update])


@register(prims.gather_p)
def _gather(
    operand: Zero, indices: ValueLike, *, mode: Any, fill_value: Any, **params: Any
) -> Any:
    params = dict(params, mode=mode, fill_value=fill_value)
    values = [operand, indices]
    # Out-of-bounds reads in FILL_OR_DROP mode give `fill_value` (NaN by default).
    if mode != lax.GatherScatterMode.FILL_OR_DROP:
        return _with_signs(prims.gather_p, values, params, _signs(operand))
    if fill_value is not None:
        fill = np.asarray(fill_value, operand.dtype)
        if _signs_of(fill) == _signs(operand):
            return _with_signs(prims.gather_p, values, params, _signs(operand))
    return _fallback(prims.gather_p, values, params)


def _keeps(x_signs: tuple[bool, bool], added: tuple[bool, bool]) -> bool:
    """Whether adding zeros of the signs `added` to zeros of the signs `x_signs`
    leaves them as they are: only `-0. + +0.` changes (to `+0.`)."""
    return not any(x and not a for x, a in zip(x_signs, added, strict=True))


def _flipped(signs: tuple[bool, bool]) -> tuple[bool, bool]:
    return (not signs[0], not signs[1])


def _has_negative_zero(known: np.ndarray, where: tuple[bool, bool]) -> bool:
    """Whether `known` has a `-0.` in a part (real, imaginary) flagged in `where`."""
    if not jnp.issubdtype(known.dtype, jnp.inexact):
        return False
    if not np.issubdtype(known.dtype, np.inexact):
        known = known.astype(np.float32)  # bfloat16, float8: exactly
    parts = _parts(known)
    return any(
        flag and bool(np.any((part == 0) & np.signbit(part)))
        for part, flag in zip(parts, where, strict=False)
    )


def _plus_zero(
    primitive: Primitive,
    values: Sequence[ValueLike],
    params: dict[str, Any],
    x: ValueLike,
    added: tuple[bool, bool],
) -> Any:
    """`x` plus zeros of the signs `added` (elementwise or scattered): `x` itself,
    unless a `-0.` in a known `x` would become `+0.`. An `x` known only when the
    program runs is kept as it is, as XLA simplifies `x + 0`."""
    aval = _out_avals(primitive, values, params)
    if isinstance(x, Zero):
        if _keeps(_signs(x), added):
            return Zero(aval.shape, aval.dtype, _negative(_signs(x), aval.dtype))
        return _fallback(primitive, values, params)
    known = _concrete(x)
    positive = _flipped(added)
    if known is not None and _has_negative_zero(known, positive):
        return _fallback(primitive, values, params)
    return _as(x, aval)


def _scatter_nothing(primitive: Primitive, subtracts: bool) -> None:
    @register(primitive)
    def _(operand: ValueLike, indices: ValueLike, updates: Zero, **params: Any) -> Any:
        added = _flipped(_signs(updates)) if subtracts else _signs(updates)
        values = [operand, indices, updates]
        return _plus_zero(primitive, values, params, operand, added)


_scatter_nothing(prims.scatter_add_p, subtracts=False)
_scatter_nothing(lax.scatter_sub_p, subtracts=True)


# Binary arithmetic --------------------------------------------------------------------


def _identity_when_zero(primitive: Primitive) -> None:
    """`x op 0 = 0 op x = x` (add, or, xor), up to the sign of a zero in `x`."""

    @register(primitive)
    def _(x: Zero, y: Zero, **params: Any) -> Any:
        return _by_evaluation(primitive, [x, y], params)

    @register(primitive)
    def _(x: Zero, y: ValueLike, **params: Any) -> Any:
        return _plus_zero(primitive, [x, y], params, y, _signs(x))

    @register(primitive)
    def _(x: ValueLike, y: Zero, **params: Any) -> Any:
        return _plus_zero(primitive, [x, y], params, x, _signs(y))


for _p in (prims.add_p, prims.add_jaxvals_p, prims.or_p, prims.xor_p):
    _identity_when_zero(_p)


@register(prims.sub_p)
def _sub_zero_zero(x: Zero, y: Zero) -> Any:
    return _by_evaluation(prims.sub_p, [x, y], {})


@register(prims.sub_p)
def _sub_zero(x: ValueLike, y: Zero) -> Any:
    return _plus_zero(prims.sub_p, [x, y], {}, x, _flipped(_signs(y)))


@register(prims.sub_p)
def _zero_sub(x: Zero, y: ValueLike) -> Any:
    # `0 - y` is `-y`, except where `y` is `+0.` and `x` is `+0.` (`+0. - +0.` is
    # `+0.`, not `-0.`): a known `y` is computed now.
    values = [x, y]
    aval = _out_avals(prims.sub_p, values, {})
    known = _concrete(y)
    if known is not None:
        return _with_known(prims.sub_p, values, {}, 1, known, lambda z: z.shape)
    if isinstance(y, Value):
        negated: Any = quaxify(lax.neg)
        return _as(negated(y), aval)
    return _as(lax.neg(y), aval)


# A zero annihilates a product whatever the other operand is, so these rules win
# over another family's rule for "my type times any value" (`LoraArray @ Zero`).
_ANNIHILATING_PRECEDENCE = 1


def _free_dims_to_one(
    primitive: Primitive, params: dict[str, Any], index: int
) -> Callable[[Zero], tuple[int, ...]]:
    """The shape to evaluate the `Zero` operand at `index` with, next to a concrete
    operand: its own for `mul`, `div`, `and`; for `dot_general`, 1 for each dimension
    neither contracted nor batched (they only repeat the same signs)."""
    if primitive is not prims.dot_general_p:
        return lambda z: z.shape
    (contracting, batch) = params["dimension_numbers"]
    kept = set(contracting[index]) | set(batch[index])
    return lambda z: tuple(d if i in kept else 1 for i, d in enumerate(z.shape))


def _product(
    primitive: Primitive,
    values: Sequence[ValueLike],
    params: dict[str, Any],
    other: int,
    strict_sensitive: bool,
) -> Any:
    """`values[1 - other]`, a `Zero`, times `values[other]`: a concrete operand is
    evaluated now (its non-finite elements annihilated unless strict); an operand
    known only when the program runs is read as positive finite, or inside
    `ieee_strict()` computed densely when it could be non-finite."""
    y = values[other]
    known = _concrete(y)
    strict = strict_sensitive and is_ieee_strict()
    if known is not None:
        if not strict:
            values, known = _annihilated(values, other, known, divisor=False)
        shape = _free_dims_to_one(primitive, params, 1 - other)
        return _with_known(primitive, values, params, other, known, shape)
    if strict and _could_be_nonfinite(y):
        return _fallback(primitive, values, params)
    return _by_evaluation(primitive, values, params)


def _annihilating(primitive: Primitive, strict_sensitive: bool) -> None:
    """`0 op x = x op 0 = 0` (mul, dot_general, and), signed as IEEE signs it.

    With `strict_sensitive`, inside `ieee_strict()` the product is computed densely
    when the other operand could be non-finite."""

    @register(primitive, precedence=_ANNIHILATING_PRECEDENCE)
    def _(x: Zero, y: Zero, **params: Any) -> Any:
        return _by_evaluation(primitive, [x, y], params)

    @register(primitive, precedence=_ANNIHILATING_PRECEDENCE)
    def _(x: Zero, y: ValueLike, **params: Any) -> Any:
        return _product(primitive, [x, y], params, 1, strict_sensitive)

    @register(primitive, precedence=_ANNIHILATING_PRECEDENCE)
    def _(x: ValueLike, y: Zero, **params: Any) -> Any:
        return _product(primitive, [x, y], params, 0, strict_sensitive)


for _p in (prims.mul_p, prims.dot_general_p):
    _annihilating(_p, strict_sensitive=True)
_annihilating(prims.and_p, strict_sensitive=False)


def _zero_op_zero(primitive: Primitive) -> None:
    @register(primitive)
    def _(x: Zero, y: Zero, **params: Any) -> Any:
        return _by_evaluation(primitive, [x, y], params)


for _p in (prims.max_p, prims.min_p, prims.complex_p):
    _zero_op_zero(_p)


def _zero_first(primitive: Primitive) -> None:
    """`0 op x = 0` (shifts of zero)."""

    @register(primitive)
    def _(x: Zero, y: ValueLike, **params: Any) -> Zero:
        return _zero(primitive, [x, y], params)


for _p in (
    prims.shift_left_p,
    prims.shift_right_logical_p,
    prims.shift_right_arithmetic_p,
):
    _zero_first(_p)


@register(prims.div_p)
def _zero_div(x: Zero, y: ValueLike) -> Any:
    # `0 / y` is a zero signed by `y` for every nonzero finite `y`; for a floating
    # `y` that may be zero or non-finite, a symbolic zero annihilates (as for `mul`,
    # reading such a `y` as a one of its sign) unless strict. Integer division by
    # zero is not zero in XLA, so it must be known not to happen.
    values = [x, y]
    inexact = jnp.issubdtype(_aval(y).dtype, jnp.inexact)
    strict = is_ieee_strict()
    known = _concrete(y)
    if known is not None:
        if inexact and not strict:
            values, known = _annihilated(values, 1, known, divisor=True)
        if inexact or bool(np.all(known != 0)):
            return _with_known(prims.div_p, values, {}, 1, known, lambda z: z.shape)
        return _fallback(prims.div_p, values, {})
    if not inexact or strict:
        return _fallback(prims.div_p, values, {})
    # A zero divisor is read as a one of its sign; any other as a positive one.
    if isinstance(y, Zero):
        divisor = _operand("unit", tuple(map(_shrunk, y.shape)), y.dtype, _signs(y))
    else:
        divisor = _positive_operand(y)
    return _by_evaluation(prims.div_p, values, {}, [_zero_operand(x), divisor])
