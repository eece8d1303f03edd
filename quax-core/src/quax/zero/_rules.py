"""Rules that keep a [`quax.zero.Zero`][] symbolic.

Every rule returns exactly what the primitive would give on dense zeros (its shape
and dtype come from the primitive's own abstract evaluation), or hands the case to
the fallback, which materialises the zero, when the result is not known to be zero.
"""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive, primitives as prims

from .._compat import Tracer
from .._dispatch._registry import fallback_rule, register, register_elementwise
from .._foundation._zero_preserving import ZERO_PRESERVING
from .._transform._quaxify import quaxify
from .._values._value import Value, ValueLike
from ._value import Zero, is_ieee_strict


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
    """The primitive's output(s) on `values`, as `Zero`s."""
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


# Zero in, zero out --------------------------------------------------------------------

# f(0) = 0 elementwise (`quax.ZERO_PRESERVING`), and structural operations that only
# move or drop elements.
_ZERO_IN_ZERO_OUT = [
    *sorted(ZERO_PRESERVING, key=lambda p: p.name),
    prims.convert_element_type_p,
    prims.bitcast_convert_type_p,
    prims.broadcast_in_dim_p,
    prims.reshape_p,
    prims.squeeze_p,
    prims.transpose_p,
    prims.rev_p,
    prims.slice_p,
    lax.split_p,
    lax.unstack_p,
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


@register_elementwise(_ZERO_IN_ZERO_OUT)
def _unary(primitive: Primitive, x: Zero, **params: Any) -> Any:
    return _zero(primitive, [x], params)


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
    if all(x.shape[a] > 0 for a in axes):
        return _zero(primitive, [x], params)
    return _fallback(primitive, [x], params)


@register(prims.integer_pow_p)
def _integer_pow(x: Zero, *, y: int) -> Any:
    if y > 0:
        return _zero(prims.integer_pow_p, [x], {"y": y})
    return _fallback(prims.integer_pow_p, [x], {"y": y})


@register(prims.concatenate_p)
def _concatenate(*operands: Zero, dimension: int) -> Zero:
    return _zero(prims.concatenate_p, operands, {"dimension": dimension})


@register(lax.stack_p)
def _stack(*operands: Zero, axis: int) -> Zero:
    return _zero(lax.stack_p, operands, {"axis": axis})


@register(prims.select_n_p)
def _select_n(which: ValueLike, *cases: Zero) -> Zero:
    return _zero(prims.select_n_p, [which, *cases], {})


@register(prims.pad_p)
def _pad(operand: Zero, padding_value: ValueLike, *, padding_config: Any) -> Any:
    values = [operand, padding_value]
    params = {"padding_config": padding_config}
    known = _concrete(padding_value)
    if isinstance(padding_value, Zero) or (known is not None and not np.any(known)):
        return _zero(prims.pad_p, values, params)
    return _fallback(prims.pad_p, values, params)


@register(prims.dynamic_slice_p)
def _dynamic_slice(operand: Zero, *indices: ValueLike, **params: Any) -> Zero:
    return _zero(prims.dynamic_slice_p, [operand, *indices], params)


@register(prims.dynamic_update_slice_p)
def _dynamic_update_slice(operand: Zero, update: Zero, *indices: ValueLike) -> Zero:
    return _zero(prims.dynamic_update_slice_p, [operand, update, *indices], {})


@register(prims.gather_p)
def _gather(
    operand: Zero, indices: ValueLike, *, mode: Any, fill_value: Any, **params: Any
) -> Any:
    params = dict(params, mode=mode, fill_value=fill_value)
    # Out-of-bounds reads in FILL_OR_DROP mode give `fill_value` (NaN by default).
    if mode != lax.GatherScatterMode.FILL_OR_DROP or (
        fill_value is not None and fill_value == 0
    ):
        return _zero(prims.gather_p, [operand, indices], params)
    return _fallback(prims.gather_p, [operand, indices], params)


def _scatter_nothing(primitive: Primitive) -> None:
    @register(primitive)
    def _(operand: ValueLike, indices: ValueLike, updates: Zero, **params: Any) -> Any:
        return _as(operand, _out_avals(primitive, [operand, indices, updates], params))


for _p in (prims.scatter_add_p, lax.scatter_sub_p):
    _scatter_nothing(_p)


# Binary arithmetic --------------------------------------------------------------------


def _identity_when_zero(primitive: Primitive) -> None:
    """`x op 0 = 0 op x = x` (add, or, xor)."""

    @register(primitive)
    def _(x: Zero, y: Zero, **params: Any) -> Zero:
        return _zero(primitive, [x, y], params)

    @register(primitive)
    def _(x: Zero, y: ValueLike, **params: Any) -> Any:
        return _as(y, _out_avals(primitive, [x, y], params))

    @register(primitive)
    def _(x: ValueLike, y: Zero, **params: Any) -> Any:
        return _as(x, _out_avals(primitive, [x, y], params))


for _p in (prims.add_p, prims.add_jaxvals_p, prims.or_p, prims.xor_p):
    _identity_when_zero(_p)


@register(prims.sub_p)
def _sub_zero_zero(x: Zero, y: Zero) -> Zero:
    return _zero(prims.sub_p, [x, y], {})


@register(prims.sub_p)
def _sub_zero(x: ValueLike, y: Zero) -> Any:
    return _as(x, _out_avals(prims.sub_p, [x, y], {}))


@register(prims.sub_p)
def _zero_sub(x: Zero, y: ValueLike) -> Any:
    aval = _out_avals(prims.sub_p, [x, y], {})
    if isinstance(y, Value):
        negated: Any = quaxify(lax.neg)
        return _as(negated(y), aval)
    return _as(lax.neg(y), aval)


# A zero annihilates a product whatever the other operand is, so these rules win
# over another family's rule for "my type times any value" (`LoraArray @ Zero`).
_ANNIHILATING_PRECEDENCE = 1


def _annihilating(primitive: Primitive, strict_sensitive: bool) -> None:
    """`0 op x = x op 0 = 0` (mul, dot_general, and, max/min of zeros, ...).

    With `strict_sensitive`, inside `ieee_strict()` the product is computed densely
    when the other operand could be non-finite."""

    @register(primitive, precedence=_ANNIHILATING_PRECEDENCE)
    def _(x: Zero, y: Zero, **params: Any) -> Zero:
        return _zero(primitive, [x, y], params)

    @register(primitive, precedence=_ANNIHILATING_PRECEDENCE)
    def _(x: Zero, y: ValueLike, **params: Any) -> Any:
        if strict_sensitive and is_ieee_strict() and _could_be_nonfinite(y):
            return _fallback(primitive, [x, y], params)
        return _zero(primitive, [x, y], params)

    @register(primitive, precedence=_ANNIHILATING_PRECEDENCE)
    def _(x: ValueLike, y: Zero, **params: Any) -> Any:
        if strict_sensitive and is_ieee_strict() and _could_be_nonfinite(x):
            return _fallback(primitive, [x, y], params)
        return _zero(primitive, [x, y], params)


for _p in (prims.mul_p, prims.dot_general_p):
    _annihilating(_p, strict_sensitive=True)
_annihilating(prims.and_p, strict_sensitive=False)


def _zero_op_zero(primitive: Primitive) -> None:
    @register(primitive)
    def _(x: Zero, y: Zero, **params: Any) -> Zero:
        return _zero(primitive, [x, y], params)


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
    # `0 / y` is zero for every nonzero finite `y`; for a floating `y` that may be
    # zero or non-finite, a symbolic zero annihilates (as for `mul`) unless strict.
    # Integer division by zero is not zero in XLA, so it must be known not to happen.
    known = _concrete(y)
    safe = known is not None and bool(np.all(known != 0) and np.all(np.isfinite(known)))
    inexact = jnp.issubdtype(_aval(y).dtype, jnp.inexact)
    if safe or (inexact and not is_ieee_strict()):
        return _zero(prims.div_p, [x, y], {})
    return _fallback(prims.div_p, [x, y], {})
