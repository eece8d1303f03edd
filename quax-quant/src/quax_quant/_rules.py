"""The rules for `QuantisedArray`: products that never form the float weight, and
the structural operations that keep the quantisation.

Primitives without a rule fall back to `QuantisedArray.default`, which refuses
(naming the primitive) unless the array allows materialising.
"""

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import quax
from jax import lax
from jaxtyping import Array, ArrayLike

from ._kernels import pack_nibbles, to_out
from ._layer_inputs import RecordingWeight, recorded_dot, recorded_transpose
from ._matmul import expand_axes, quantised_dot
from ._value import QuantisedArray, QuantisedScale


def _refuse(
    primitive: Any, values: Sequence[Any], params: dict[str, Any], why: str
) -> Any:
    """Fall back (dequantise, if allowed) or raise, explaining `why` the rule for
    `primitive` does not apply to these inputs. The refusal is worded as the core's
    policy words one (`quax.GuardedValue.refusal`), with `why` in place of "no rule
    for this case"."""
    for value in values:
        if isinstance(value, QuantisedArray) and not value.allow_materialise:
            types = ", ".join(
                type(v).__qualname__ if isinstance(v, quax.Value) else "array"
                for v in values
            )
            raise value.materialisation_error(
                f"Refusing to materialise `QuantisedArray` for primitive "
                f"`{primitive.name}` on input types ({types}): {why}, and "
                f"{value.refusal_reason()}. {value.way_out(primitive)}"
            )
    return quax.GuardedValue.default(primitive, values, params)


def _not_act_order(primitive: Any) -> Any:
    """Decorate the rule for `primitive`: an input with an `input_order` (an
    act-order GPTQ array) is refused (dequantised where allowed, with its columns
    in place) instead, since the rule would move or cut the permuted last axis."""

    def wrap(rule: Any) -> Any:
        @functools.wraps(rule)
        def checked(*args: Any, **params: Any) -> Any:
            if any(
                isinstance(a, QuantisedArray) and a.input_order is not None
                for a in args
            ):
                return _refuse(
                    primitive,
                    args,
                    params,
                    "the array holds its last axis permuted (an act-order GPTQ "
                    "layer, `input_order`), which only a product contracting that "
                    "axis with a float operand keeps",
                )
            return rule(*args, **params)

        return checked

    return wrap


# dot_general --------------------------------------------------------------------------


@quax.register(lax.dot_general_p)
def _(
    lhs: QuantisedArray, rhs: ArrayLike, *, dimension_numbers: Any, **params: Any
) -> Any:
    return _float_dot(lhs.plain(), rhs, True, dimension_numbers, params)


@quax.register(lax.dot_general_p)
def _(
    lhs: ArrayLike, rhs: QuantisedArray, *, dimension_numbers: Any, **params: Any
) -> Any:
    return _float_dot(rhs.plain(), lhs, False, dimension_numbers, params)


def _float_dot(
    w: QuantisedArray, x: Any, w_is_lhs: bool, dn: Any, params: dict[str, Any]
) -> Any:
    values = (w, x) if w_is_lhs else (x, w)
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        return _refuse(
            lax.dot_general_p,
            values,
            {"dimension_numbers": dn, **params},
            "the other operand is not floating-point",
        )
    if w.input_order is not None:
        # An act-order array: its stored column j is column input_order[j].
        (lc, rc), (lb, rb) = dn
        w_contract, x_contract = (lc, rc) if w_is_lhs else (rc, lc)
        w_batch, x_batch = (lb, rb) if w_is_lhs else (rb, lb)
        last = w.ndim - 1
        if last in w_batch:
            return _refuse(
                lax.dot_general_p,
                values,
                {"dimension_numbers": dn, **params},
                "the array holds its last axis permuted (an act-order GPTQ layer, "
                "`input_order`), and this product batches over that axis",
            )
        order = w.input_order
        master = None if w.master is None else jnp.take(w.master, order, axis=-1)
        stored = dataclasses.replace(w, input_order=None, master=master)
        if last in w_contract:
            # Contracting it, gather x's features in that order and multiply the
            # stored blocks: sum_i x_i w_i = sum_j x_{order[j]} stored_j.
            x_axis = x_contract[list(w_contract).index(last)]
            x = jnp.take(jnp.asarray(x), order, axis=x_axis)
            return _stored_dot(x, stored, w_is_lhs, dn, params)
        # A free axis (the transposed product `g . w` of a gradient with respect
        # to the activations): the stored blocks give it in stored order, and
        # each output column goes back in place, out[..., order[j]] = stored[..., j].
        out = _stored_dot(x, stored, w_is_lhs, dn, params)
        free = [a for a in range(w.ndim) if a not in w_contract and a not in w_batch]
        x_free = jnp.ndim(x) - len(x_contract) - len(x_batch)
        axis = len(w_batch) + free.index(last) + (0 if w_is_lhs else x_free)
        return jnp.take(out, jnp.argsort(order), axis=axis)
    return _stored_dot(x, w, w_is_lhs, dn, params)


def _stored_dot(
    x: Any, w: QuantisedArray, w_is_lhs: bool, dn: Any, params: dict[str, Any]
) -> Any:
    return quantised_dot(
        x,
        w,
        dn=dn,
        w_is_lhs=w_is_lhs,
        precision=params.get("precision"),
        preferred_element_type=params.get("preferred_element_type"),
    )


@quax.register(lax.dot_general_p)
@_not_act_order(lax.dot_general_p)
def _(
    lhs: QuantisedArray, rhs: QuantisedArray, *, dimension_numbers: Any, **params: Any
) -> Any:
    """Both quantised: `int8 x int8 -> int32`, then both scales. Needs symmetric
    operands whose scales are constant along the contracted axes (per tensor, or per
    channel of a free or batch axis), both of format `"int"`."""
    lhs, rhs = lhs.plain(), rhs.plain()
    (lc, rc), _ = dimension_numbers
    ok = all(
        x.format == "int"
        and x.zero_point is None
        and x.master is None
        and all(x.scale.shape[a] == 1 for a in c)
        for x, c in ((lhs, lc), (rhs, rc))
    )
    if not ok:
        return _refuse(
            lax.dot_general_p,
            (lhs, rhs),
            {"dimension_numbers": dimension_numbers, **params},
            "the int8 x int8 product needs symmetric integer operands (format "
            "'int', no zero point, no straight-through master) with scales constant "
            "along the contracted axes",
        )
    out = lax.dot_general(
        lhs.integers(),
        rhs.integers(),
        dimension_numbers,
        preferred_element_type=jnp.int32,
    )
    out_dtype = params.get("preferred_element_type") or jnp.result_type(
        lhs.float_dtype, rhs.float_dtype
    )
    acc = jnp.promote_types(out_dtype, jnp.float32)
    out = out.astype(acc)
    for x, c, is_lhs in ((lhs, lc, True), (rhs, rc, False)):
        keep = [a for a in range(x.ndim) if a not in c]
        scale = expand_axes(x, x.scale.astype(acc), keep)
        out = out * to_out(scale, is_lhs, dimension_numbers, lhs.ndim, rhs.ndim)
    return out.astype(out_dtype)


# conv_general_dilated -----------------------------------------------------------------


@quax.register(lax.conv_general_dilated_p)
@_not_act_order(lax.conv_general_dilated_p)
def _(lhs: ArrayLike, rhs: QuantisedArray, **params: Any) -> Any:
    """A quantised kernel with per-output-channel (or per-tensor) scales: the
    convolution of the levels (integers, NF4 levels or float8 numbers), then the
    scale per output feature."""
    rhs = rhs.plain()
    rhs_spec = params["dimension_numbers"].rhs_spec
    out_feature = params["dimension_numbers"].out_spec[1]
    o = rhs_spec[0]
    scaled_inputs = any(rhs.scale.shape[a] > 1 for a in range(rhs.ndim) if a != o)
    if (
        scaled_inputs
        or params["batch_group_count"] != 1
        or (rhs.zero_point is not None and params["feature_group_count"] != 1)
        or rhs.master is not None
        or not jnp.issubdtype(jnp.result_type(lhs), jnp.floating)
    ):
        return _refuse(
            lax.conv_general_dilated_p,
            (lhs, rhs),
            params,
            "the quantised convolution needs a float input, a kernel with one scale "
            "per output feature (or per tensor), no straight-through master, no "
            "batch groups, and no zero point with feature groups",
        )
    out_dtype = params.get("preferred_element_type") or jnp.result_type(
        lhs, rhs.float_dtype
    )
    acc = jnp.promote_types(out_dtype, jnp.float32)
    conv = {**params, "preferred_element_type": acc}
    x = jnp.asarray(lhs).astype(acc)
    out = lax.conv_general_dilated_p.bind(x, rhs.levels(acc), **conv)

    def per_feature(block: Array) -> Array:
        block = (
            rhs.expanded(block.astype(acc)) if block.shape[o] > 1 else block.astype(acc)
        )
        block = (
            block.reshape(block.shape[o]) if block.shape[o] > 1 else block.reshape(())
        )
        shape = [1] * out.ndim
        if block.ndim:
            shape[out_feature] = block.shape[0]
        return block.reshape(shape)

    out = out * per_feature(rhs.scale)
    if rhs.zero_point is not None:
        ones_shape = [1 if a == o else d for a, d in enumerate(rhs.shape)]
        sums = lax.conv_general_dilated_p.bind(x, jnp.ones(ones_shape, acc), **conv)
        out = out - sums * per_feature(rhs.zero_point * rhs.scale)
    return out.astype(out_dtype)


# Structural operations ----------------------------------------------------------------


def _with(
    w: QuantisedArray, q: Array, scale: Array, zero: Any, master: Any
) -> QuantisedArray:
    """`w` with new codes (unpacked, see `QuantisedArray.codes`) and blocks."""
    values = pack_nibbles(q) if w.bits == 4 else q
    odd = w.bits == 4 and q.ndim > 0 and q.shape[-1] % 2 == 1
    return QuantisedArray(
        values,
        scale,
        zero,
        master,
        bits=w.bits,
        float_dtype=w.float_dtype,
        odd=odd,
        allow_materialise=w.allow_materialise,
        matmul=w.matmul,
        format=w.format,
        act_scale=w.act_scale,
        input_order=w.input_order,
    )


def _map(w: QuantisedArray, on_values: Any, on_blocks: Any) -> QuantisedArray:
    zero = None if w.zero_point is None else on_blocks(w.zero_point)
    master = None if w.master is None else on_values(w.master)
    return _with(w, on_values(w.codes()), on_blocks(w.scale), zero, master)


@quax.register(lax.transpose_p)
@_not_act_order(lax.transpose_p)
def _(operand: QuantisedArray, *, permutation: Sequence[int]) -> QuantisedArray:
    perm = tuple(permutation)

    def blocks(b: Any) -> Any:
        # A double-quantised scale keeps its int8 codes, transposed in name only.
        if isinstance(b, QuantisedScale):
            return b.transpose(perm)
        return lax.transpose(b, perm)

    if operand.bits == 4:
        # Permute the bytes; the packed axis moves with them.
        ndim = operand.ndim
        packed = perm.index(ndim + operand.packed_axis) - ndim
        zero = operand.zero_point
        master = operand.master
        return dataclasses.replace(
            operand,
            values=lax.transpose(operand.values, perm),
            scale=blocks(operand.scale),
            zero_point=None if zero is None else lax.transpose(zero, perm),
            master=None if master is None else lax.transpose(master, perm),
            packed_axis=packed,
        )
    return _map(operand, lambda a: lax.transpose(a, perm), blocks)


def _flat_blocks(sizes: Sequence[int], counts: Sequence[int]) -> int | None:
    """How many blocks the flattened axes `sizes` (with `counts` blocks each) have,
    if flattening keeps equal contiguous blocks: per-index axes, then one axis with
    any blocks, then unscaled axes. `None` otherwise."""
    j = 0
    while j < len(sizes) and counts[j] == sizes[j]:
        j += 1
    if any(c != 1 for c in counts[j + 1 :]):
        return None
    return math.prod(counts[: j + 1])


def _unflatten_blocks(sizes: Sequence[int], blocks: int) -> list[int] | None:
    """Per-axis block counts for axes `sizes` whose flattening has `blocks` equal
    contiguous blocks, or `None` when no such layout exists."""
    counts = []
    for d in sizes:
        if blocks % d == 0:
            counts.append(d)
            blocks //= d
        elif d % blocks == 0:
            counts.append(blocks)
            blocks = 1
        else:
            return None
    return counts if blocks == 1 else None


def _reshape_blocks(
    shape: Sequence[int], blocks: Sequence[int], new: Sequence[int]
) -> tuple[int, ...] | None:
    """The block shape for reshaping `shape` (blocks `blocks`) to `new`, or `None`
    when the scales would not stay blocks of the new shape."""
    if math.prod(shape) == 0:
        # An empty array: one block along every axis (the reshape rule keeps one).
        return (1,) * len(new)
    old_axes = [a for a, d in enumerate(shape) if d != 1]
    new_axes = [a for a, d in enumerate(new) if d != 1]
    out = [1] * len(new)
    i = j = 0
    while i < len(old_axes) or j < len(new_axes):
        oi, nj = [old_axes[i]], [new_axes[j]]
        po, pn = shape[oi[0]], new[nj[0]]
        i, j = i + 1, j + 1
        while po != pn:
            if po < pn:
                oi.append(old_axes[i])
                po *= shape[old_axes[i]]
                i += 1
            else:
                nj.append(new_axes[j])
                pn *= new[new_axes[j]]
                j += 1
        if len(oi) == len(nj) == 1:
            # An axis kept as it is keeps its blocks (NF4's shorter last one too).
            out[nj[0]] = blocks[oi[0]]
            continue
        if any(shape[a] % blocks[a] for a in oi):
            # NF4's shorter last block: merging or splitting the axis mixes blocks.
            return None
        flat = _flat_blocks([shape[a] for a in oi], [blocks[a] for a in oi])
        counts = None if flat is None else _unflatten_blocks([new[a] for a in nj], flat)
        if counts is None:
            return None
        for a, c in zip(nj, counts, strict=True):
            out[a] = c
    return tuple(out)


# Why a 4-bit array is not reshaped or squeezed to a scalar: `quantise` makes none.
_NO_PACKED_AXIS = (
    "a 4-bit array packs its integers two to a byte along its last axis, and a "
    "scalar has none"
)


@quax.register(lax.reshape_p)
@_not_act_order(lax.reshape_p)
def _(
    operand: QuantisedArray, *, new_sizes: Sequence[int], dimensions: Any, **params: Any
) -> Any:
    operand = operand.plain()
    new = tuple(new_sizes)
    if operand.bits == 4 and not new:
        return _refuse(
            lax.reshape_p,
            (operand,),
            {"new_sizes": new_sizes, "dimensions": dimensions, **params},
            _NO_PACKED_AXIS,
        )
    blocks = (
        _reshape_blocks(operand.shape, operand.scale.shape, new)
        if dimensions is None
        else None
    )
    if blocks is None:
        return _refuse(
            lax.reshape_p,
            (operand,),
            {"new_sizes": new_sizes, "dimensions": dimensions, **params},
            f"reshaping {operand.shape} to {new} merges or splits an axis with "
            f"scales (scale shape {operand.scale.shape})",
        )
    if math.prod(operand.shape) == 0:
        # An empty array: its scales scale nothing; keep one block of them.
        return _map(
            operand,
            lambda a: a.reshape(new),
            lambda b: b.reshape(-1)[:1].reshape(blocks),
        )
    return _map(operand, lambda a: a.reshape(new), lambda b: b.reshape(blocks))


@quax.register(lax.broadcast_in_dim_p)
@_not_act_order(lax.broadcast_in_dim_p)
def _(
    operand: QuantisedArray,
    *,
    shape: Sequence[int],
    broadcast_dimensions: Sequence[int],
    sharding: Any,
) -> Any:
    """Only new axes of size 1 (`x[None]`, `expand_dims`): a reshape."""
    operand = operand.plain()
    dims = tuple(broadcast_dimensions)
    if (
        sharding is not None
        or any(shape[d] != n for d, n in zip(dims, operand.shape, strict=True))
        or math.prod(shape) != math.prod(operand.shape)
    ):
        return _refuse(
            lax.broadcast_in_dim_p,
            (operand,),
            {
                "shape": shape,
                "broadcast_dimensions": broadcast_dimensions,
                "sharding": sharding,
            },
            "broadcasting repeats the array (only new axes of size 1 keep the "
            "quantisation)",
        )
    new = tuple(shape)

    def blocks(b: Array) -> Array:
        block_shape = [1] * len(new)
        for d, n in zip(dims, b.shape, strict=True):
            block_shape[d] = n
        return b.reshape(block_shape)

    return _map(operand, lambda a: a.reshape(new), blocks)


@quax.register(lax.squeeze_p)
@_not_act_order(lax.squeeze_p)
def _(operand: QuantisedArray, *, dimensions: Sequence[int]) -> QuantisedArray:
    operand = operand.plain()
    dims = tuple(dimensions)
    if operand.bits == 4 and len(dims) == operand.ndim:
        return _refuse(lax.squeeze_p, (operand,), {"dimensions": dims}, _NO_PACKED_AXIS)
    return _map(operand, lambda a: lax.squeeze(a, dims), lambda b: lax.squeeze(b, dims))


def _slice_blocks(
    w: QuantisedArray,
    starts: Sequence[int],
    limits: Sequence[int],
    strides: Sequence[int],
) -> tuple[list[int], list[int]] | None:
    """Block-level `(starts, limits)` for a static slice, or `None` when it cuts
    through groups."""
    b_start, b_limit = [], []
    for a, (lo, hi, st) in enumerate(zip(starts, limits, strides, strict=True)):
        n = w.scale.shape[a]
        g = w.group_sizes[a]
        if n == 1 or hi <= lo:
            # One block, or an empty slice (one block of nothing).
            b_start.append(0)
            b_limit.append(1)
        elif g == 1 and st == 1:
            b_start.append(lo)
            b_limit.append(hi)
        elif st == 1 and lo % g == 0 and (hi % g == 0 or hi == w.shape[a]):
            # Whole blocks, or up to NF4's shorter last block: kept where the
            # part is one block, or its blocks (`ceil(length / blocks)`) have
            # the same length as before.
            first, end = lo // g, -(-hi // g)
            if end - first > 1 and -(-(hi - lo) // (end - first)) != g:
                return None
            b_start.append(first)
            b_limit.append(end)
        else:
            return None
    return b_start, b_limit


@quax.register(lax.slice_p)
@_not_act_order(lax.slice_p)
def _(
    operand: QuantisedArray,
    *,
    start_indices: Sequence[int],
    limit_indices: Sequence[int],
    strides: Sequence[int] | None,
) -> Any:
    strides_ = tuple(strides) if strides is not None else (1,) * operand.ndim
    blocks = _slice_blocks(operand, start_indices, limit_indices, strides_)
    if blocks is None:
        return _refuse(
            lax.slice_p,
            (operand,),
            {
                "start_indices": start_indices,
                "limit_indices": limit_indices,
                "strides": strides,
            },
            "the slice cuts through groups that share a scale (or strides along a "
            "scaled axis)",
        )
    b_start, b_limit = blocks

    def sliced_blocks(b: Any) -> Any:
        # A double-quantised scale stays int8 where the slice keeps whole blocks
        # of it; otherwise its float scale is sliced.
        if isinstance(b, QuantisedScale):
            kept = b.slice(b_start, b_limit)
            if kept is not None:
                return kept
            b = b.dequantise()
        return lax.slice(b, tuple(b_start), tuple(b_limit))

    return _map(
        operand,
        lambda a: lax.slice(a, tuple(start_indices), tuple(limit_indices), strides),
        sliced_blocks,
    )


@quax.register(lax.dynamic_slice_p)
@_not_act_order(lax.dynamic_slice_p)
def _(operand: QuantisedArray, *indices: ArrayLike, slice_sizes: Sequence[int]) -> Any:
    """Dynamic slices along unscaled axes (or per-index scaled axes)."""
    operand = operand.plain()
    sizes = tuple(slice_sizes)
    groups = operand.group_sizes
    blocked = [
        a
        for a, n in enumerate(operand.scale.shape)
        if n > 1 and groups[a] > 1 and sizes[a] != operand.shape[a]
    ]
    if blocked:
        return _refuse(
            lax.dynamic_slice_p,
            (operand, *indices),
            {"slice_sizes": slice_sizes},
            f"a dynamic slice along axes {blocked}, whose groups share scales",
        )
    zeros = jnp.zeros((), jnp.result_type(*indices)) if indices else 0
    b_idx = [
        i if operand.scale.shape[a] > 1 and groups[a] == 1 else zeros
        for a, i in enumerate(indices)
    ]
    b_sizes = [
        sizes[a] if operand.scale.shape[a] > 1 else 1 for a in range(operand.ndim)
    ]
    b_sizes = [
        operand.scale.shape[a] if groups[a] > 1 and operand.scale.shape[a] > 1 else s
        for a, s in enumerate(b_sizes)
    ]
    return _map(
        operand,
        lambda a: lax.dynamic_slice(a, tuple(indices), sizes),
        lambda b: lax.dynamic_slice(b, tuple(b_idx), tuple(b_sizes)),
    )


@quax.register(lax.neg_p)
def _(x: QuantisedArray) -> QuantisedArray:
    x = x.plain()
    master = None if x.master is None else -x.master
    return dataclasses.replace(x, scale=-x.scale, master=master)


def _scalar_mul(
    w: QuantisedArray, c: Any, values: tuple[Any, Any], params: dict[str, Any]
) -> Any:
    if np.ndim(c) != 0 or not jnp.issubdtype(jnp.result_type(c), jnp.floating):
        return _refuse(
            lax.mul_p,
            values,
            params,
            "only multiplication by a float scalar keeps the quantisation",
        )
    scale = w.scale * jnp.asarray(c).astype(w.scale.dtype)
    master = None if w.master is None else w.master * c
    return dataclasses.replace(w, scale=scale, master=master)


@quax.register(lax.mul_p)
def _(x: QuantisedArray, y: ArrayLike, **params: Any) -> Any:
    return _scalar_mul(x.plain(), y, (x, y), params)


@quax.register(lax.mul_p)
def _(x: ArrayLike, y: QuantisedArray, **params: Any) -> Any:
    return _scalar_mul(y.plain(), x, (x, y), params)


@quax.register(lax.convert_element_type_p)
def _(
    operand: QuantisedArray, *, new_dtype: Any, weak_type: bool, sharding: Any
) -> Any:
    operand = operand.plain()
    params = {"new_dtype": new_dtype, "weak_type": weak_type, "sharding": sharding}
    if not jnp.issubdtype(new_dtype, jnp.floating) or weak_type or sharding is not None:
        return _refuse(
            lax.convert_element_type_p,
            (operand,),
            params,
            f"converting to {np.dtype(new_dtype)} rounds the dequantised values",
        )
    cast = lambda b: None if b is None else b.astype(new_dtype)
    return QuantisedArray(
        operand.values,
        cast(operand.scale),
        cast(operand.zero_point),
        cast(operand.master),
        bits=operand.bits,
        float_dtype=np.dtype(new_dtype),
        odd=operand.odd,
        packed_axis=operand.packed_axis,
        allow_materialise=operand.allow_materialise,
        matmul=operand.matmul,
        format=operand.format,
        act_scale=operand.act_scale,
        input_order=operand.input_order,
    )


@quax.register(lax.copy_p)
def _(operand: QuantisedArray) -> QuantisedArray:
    return operand


# Calibration (GPTQ, AWQ): a weight recording its inputs ------------------------------


@quax.register(lax.dot_general_p)
def _(
    lhs: RecordingWeight, rhs: ArrayLike, *, dimension_numbers: Any, **params: Any
) -> Any:
    return recorded_dot(lhs, rhs, True, dimension_numbers, params)


@quax.register(lax.dot_general_p)
def _(
    lhs: ArrayLike, rhs: RecordingWeight, *, dimension_numbers: Any, **params: Any
) -> Any:
    return recorded_dot(rhs, lhs, False, dimension_numbers, params)


@quax.register(lax.transpose_p)
def _(operand: RecordingWeight, *, permutation: Sequence[int]) -> RecordingWeight:
    return recorded_transpose(operand, permutation)
