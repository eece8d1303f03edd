"""The rules for `BCOO` (and `CSR`, through its `BCOO` form).

Each rule works on the stored entries only. Operations without a rule fall back to
the core's refusing default ([`quax.GuardedValue`][]), which names the primitive
unless the array allows materialising.
"""

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import quax
from jax import lax
from jax.extend.core import Primitive, primitives as prims
from jaxtyping import Array, ArrayLike

from ._kernels import (
    dot_sparse_dense,
    dot_sparse_sparse,
    flat_entries,
    gather,
    scatter_add,
    valid_mask,
)
from ._values import BCOO, CSR


def _fallback(
    primitive: Primitive, values: Sequence[Any], params: dict[str, Any]
) -> Any:
    return quax.fallback_rule(primitive, values)(values, params)


# BCOO helpers ------------------------------------------------------------------------


def new_like(
    x: BCOO,
    data: Array,
    indices: Array,
    shape: Sequence[int],
    *,
    indices_sorted: bool = False,
    unique_indices: bool = False,
) -> BCOO:
    """A `BCOO` with `x`'s options and the given entries."""
    return BCOO._from_entries(
        data,
        indices,
        tuple(shape),
        x.allow_materialise,
        indices_sorted=indices_sorted,
        unique_indices=unique_indices,
    )


def unbatch(x: BCOO) -> BCOO:
    """`x` with every dimension sparse (`n_batch = 0`): `prod(batch) * nse` entries,
    the batch coordinates as leading index columns. Order and uniqueness are kept."""
    if x.n_batch == 0:
        return x
    coords, values = flat_entries(x.data, x.indices)
    return new_like(
        x,
        values,
        coords,
        x.shape,
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


def unique(x: BCOO) -> BCOO:
    """`x` with no position stored twice (what a nonlinear elementwise function
    needs): `x` itself when known, else `sum_duplicates` with the same `nse`."""
    return x if x.unique_indices else x.sum_duplicates()


def transpose_matrix(x: BCOO) -> BCOO:
    """The transpose of an unbatched sparse matrix (index columns swapped)."""
    return new_like(
        x, x.data, x.indices[:, ::-1], x.shape[::-1], unique_indices=x.unique_indices
    )


def _out_dtype(x: Any, y: Any, preferred: Any) -> Any:
    return preferred if preferred is not None else jnp.result_type(x.dtype, y.dtype)


def _read_as(x: BCOO, dtype: Any) -> BCOO:
    """`x`, its duplicates merged first where its stored bools are read as another
    dtype: bools add by logical or, so two `True`s at one position are one `True`,
    read as 1, not 2."""
    if x.dtype == jnp.bool_ and dtype != jnp.bool_:
        return unique(x)
    return x


# dot_general --------------------------------------------------------------------------


@quax.register(lax.dot_general_p)
def _(lhs: BCOO, rhs: ArrayLike, *, dimension_numbers: Any, **params: Any) -> Array:
    rhs = jnp.asarray(rhs)
    out_dtype = _out_dtype(lhs, rhs, params.get("preferred_element_type"))
    lhs = _read_as(lhs, out_dtype)
    return dot_sparse_dense(
        lhs.data,
        lhs.indices,
        lhs.shape,
        rhs,
        dimension_numbers,
        sparse_is_lhs=True,
        out_dtype=out_dtype,
        indices_sorted=lhs.indices_sorted,
    )


@quax.register(lax.dot_general_p)
def _(lhs: ArrayLike, rhs: BCOO, *, dimension_numbers: Any, **params: Any) -> Array:
    lhs = jnp.asarray(lhs)
    out_dtype = _out_dtype(lhs, rhs, params.get("preferred_element_type"))
    rhs = _read_as(rhs, out_dtype)
    return dot_sparse_dense(
        rhs.data,
        rhs.indices,
        rhs.shape,
        lhs,
        dimension_numbers,
        sparse_is_lhs=False,
        out_dtype=out_dtype,
        indices_sorted=rhs.indices_sorted,
    )


@quax.register(lax.dot_general_p)
def _(lhs: BCOO, rhs: BCOO, *, dimension_numbers: Any, **params: Any) -> Any:
    (l_contract, r_contract), (l_batch, r_batch) = dimension_numbers
    if lhs.ndim != 2 or rhs.ndim != 2 or len(l_contract) != 1 or l_batch or r_batch:
        params = dict(params, dimension_numbers=dimension_numbers)
        return _fallback(lax.dot_general_p, (lhs, rhs), params)
    out_dtype = _out_dtype(lhs, rhs, params.get("preferred_element_type"))
    a, b = unbatch(_read_as(lhs, out_dtype)), unbatch(_read_as(rhs, out_dtype))
    if l_contract[0] == 0:
        a = transpose_matrix(a)
    if r_contract[0] == 1:
        b = transpose_matrix(b)
    (n, k), m = a.shape, b.shape[1]
    data, indices = dot_sparse_sparse(
        a.data,
        a.indices,
        b.data,
        b.indices,
        (n, k, m),
        out_dtype,
        a_unique=a.unique_indices,
        b_unique=b.unique_indices,
    )
    allow = a.allow_materialise and b.allow_materialise
    return BCOO._from_entries(data, indices, (n, m), allow)


# Elementwise with f(0) = 0 ------------------------------------------------------------

# Linear in the stored values: entries stored twice at one position may stay apart.
# The others see each position's sum (`unique`).
_LINEAR = frozenset({prims.neg_p, prims.conj_p, prims.real_p, prims.imag_p})


def _on_data(
    primitive: Primitive, x: BCOO, params: dict[str, Any], *, linear: bool
) -> BCOO:
    """`primitive` applied to the stored values of `x`, merged first unless `linear`."""
    if not linear:
        x = unique(x)
    data = primitive.bind(x.data, **params)
    return new_like(
        x,
        data,
        x.indices,
        x.shape,
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


@quax.register_elementwise(quax.ZERO_PRESERVING)
def _(primitive: Primitive, x: BCOO, **params: Any) -> BCOO:
    return _on_data(primitive, x, params, linear=primitive in _LINEAR)


@quax.register(prims.integer_pow_p)
def _(x: BCOO, *, y: int, **params: Any) -> Any:
    if y <= 0:  # x ** 0 = 1 and 0 ** -1 = inf: not sparse
        return _fallback(prims.integer_pow_p, (x,), dict(params, y=y))
    return _on_data(prims.integer_pow_p, x, dict(params, y=y), linear=y == 1)


@quax.register(prims.convert_element_type_p)
def _(x: BCOO, *, new_dtype: Any, **params: Any) -> BCOO:
    # Conversion to a floating type is exact enough to apply to duplicates one by one;
    # to an integer or bool it rounds, so it needs unique entries, and so does a
    # conversion from bool (`_read_as`). The output's sharding (for the dense shape)
    # does not apply to `data`.
    x = _read_as(x, new_dtype)
    params = dict(params, new_dtype=new_dtype, sharding=None)
    linear = bool(jnp.issubdtype(new_dtype, jnp.inexact))
    return _on_data(prims.convert_element_type_p, x, params, linear=linear)


@quax.register(prims.copy_p)
def _(x: BCOO, **params: Any) -> BCOO:
    return x


# Binary arithmetic ------------------------------------------------------------------


def _broadcasts(x: BCOO, other: Any) -> bool:
    """Whether `x` would be broadcast by a binary operation with `other` (`lax` lets
    an axis of size 1 meet a longer one): no rule stretches a sparse operand, so
    those cases go to `_broadcast_fallback`."""
    other_shape = other.shape if isinstance(other, BCOO) else np.shape(other)
    return tuple(np.broadcast_shapes(x.shape, other_shape)) != x.shape


def _broadcast_fallback(
    primitive: Primitive, values: Sequence[Any], params: dict[str, Any]
) -> Any:
    """A binary operation that would broadcast a sparse operand (stretch an axis of
    size 1 to a longer one, as `jnp.add` of a `(2, 5)` and a `(3, 2, 5)` array asks
    of `lax.add`). quax-sparse never broadcasts a sparse operand implicitly: every
    stored entry would be copied along each stretched axis. So the operation is
    refused, saying the way out, unless the stretched operand allows materialising
    (then the fallback computes it densely)."""
    shapes = [np.shape(v) if not isinstance(v, BCOO) else v.shape for v in values]
    shape = tuple(np.broadcast_shapes(*shapes))
    for value in values:
        if (
            isinstance(value, BCOO)
            and value.shape != shape
            and not value.allow_materialise
        ):
            types = ", ".join(type(v).__qualname__ for v in values)
            raise value.materialisation_error(
                f"Refusing to materialise `BCOO` for primitive `{primitive.name}` on "
                f"input types ({types}): it would broadcast the BCOO of shape "
                f"{value.shape} to {shape}, and quax-sparse never broadcasts a sparse "
                "operand implicitly (each stored entry would be copied along every "
                "stretched axis). Give the operands the same shape first: "
                f"`jnp.broadcast_to(x, {shape})` keeps a sparse `x` sparse where it "
                "only adds leading axes. " + value.way_out(primitive)
            )
    return _fallback(primitive, values, params)


def _scale(
    primitive: Primitive, x: BCOO, y: ArrayLike, y_first: bool, params: dict[str, Any]
) -> Any:
    """`x * y` or `x / y` (`y * x` if `y_first`) for a dense `y`: `y` read at the
    stored entries only."""
    if _broadcasts(x, y):
        return _broadcast_fallback(primitive, (y, x) if y_first else (x, y), params)
    y = jnp.asarray(y)
    # Axes of `y` of size 1 where `x` is longer broadcast: not read along.
    read = tuple(d for d in range(y.ndim) if y.shape[d] == x.shape[d])
    y = y.reshape([y.shape[d] for d in read])
    if read:
        coords, _ = flat_entries(x.data, x.indices)
        factor = gather(y, coords[:, read], tuple(range(len(read))))
        factor = factor.reshape(x.data.shape)
    else:
        factor = jnp.broadcast_to(y, x.data.shape)
    args = (factor, x.data) if y_first else (x.data, factor)
    data = primitive.bind(*args, **params)
    return new_like(
        x,
        data,
        x.indices,
        x.shape,
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


@quax.register(prims.mul_p)
def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
    return _scale(prims.mul_p, x, y, False, params)


@quax.register(prims.mul_p)
def _(x: ArrayLike, y: BCOO, **params: Any) -> Any:
    return _scale(prims.mul_p, y, x, True, params)


@quax.register(prims.div_p)
def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
    return _scale(prims.div_p, x, y, False, params)


# `and` with a dense array keeps zeros (`jnp.multiply` of bools binds it). It is not
# linear in the stored values (bitwise on integers), so duplicates merge first.
@quax.register(prims.and_p)
def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
    return _scale(prims.and_p, unique(x), y, False, params)


@quax.register(prims.and_p)
def _(x: ArrayLike, y: BCOO, **params: Any) -> Any:
    return _scale(prims.and_p, unique(y), x, True, params)


def _concat(x: BCOO, y: BCOO) -> BCOO:
    """The entries of both (the sparse sum), with the same batching."""
    if x.n_batch != y.n_batch:
        x, y = unbatch(x), unbatch(y)
    data = jnp.concatenate([x.data, y.data.astype(x.data.dtype)], axis=-1)
    index_dtype = jnp.promote_types(x.indices.dtype, y.indices.dtype)
    indices = jnp.concatenate(
        [x.indices.astype(index_dtype), y.indices.astype(index_dtype)], axis=-2
    )
    return BCOO._from_entries(
        data, indices, x.shape, x.allow_materialise and y.allow_materialise
    )


def _add_into_dense(x: BCOO, y: ArrayLike, sign: int) -> Array:
    """`y + sign * x` as a dense array (the sum has `y`'s density)."""
    y = jnp.broadcast_to(jnp.asarray(y), x.shape)
    coords, values = flat_entries(x.data, x.indices)
    values = values if sign > 0 else -values
    return scatter_add(y, coords, tuple(range(x.ndim)), values)


def _sum(primitive: Primitive, x: Any, y: Any, params: dict[str, Any]) -> Any:
    """`x + y` or `x - y` (`sub`), one operand sparse at least: sparse if both are
    (entries concatenated), else dense (a scatter-add into the dense one)."""
    if any(isinstance(v, BCOO) and _broadcasts(v, w) for v, w in [(x, y), (y, x)]):
        return _broadcast_fallback(primitive, (x, y), params)
    sign = -1 if primitive is prims.sub_p else 1
    if isinstance(x, BCOO) and isinstance(y, BCOO):
        if sign < 0:
            y = new_like(
                y, -y.data, y.indices, y.shape, unique_indices=y.unique_indices
            )
        return _concat(x, y)
    if isinstance(x, BCOO):
        return _add_into_dense(x, -jnp.asarray(y) if sign < 0 else y, 1)
    return _add_into_dense(y, x, sign)


def _register_sum(primitive: Primitive) -> None:
    @quax.register(primitive)
    def _(x: BCOO, y: BCOO, **params: Any) -> Any:
        return _sum(primitive, x, y, params)

    @quax.register(primitive)
    def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
        return _sum(primitive, x, y, params)

    @quax.register(primitive)
    def _(x: ArrayLike, y: BCOO, **params: Any) -> Any:
        return _sum(primitive, x, y, params)


for _p in (prims.add_p, prims.add_jaxvals_p, prims.sub_p):
    _register_sum(_p)


# Structure ----------------------------------------------------------------------------


@quax.register(prims.transpose_p)
def _(x: BCOO, *, permutation: Sequence[int], **params: Any) -> BCOO:
    perm = tuple(permutation)
    nb = x.n_batch
    if tuple(sorted(perm[:nb])) != tuple(range(nb)):
        x, nb = unbatch(x), 0
    data = lax.transpose(x.data, (*perm[:nb], nb))
    indices = lax.transpose(x.indices, (*perm[:nb], nb, nb + 1))
    indices = indices[..., [p - nb for p in perm[nb:]]]
    shape = tuple(x.shape[p] for p in perm)
    return new_like(x, data, indices, shape, unique_indices=x.unique_indices)


@quax.register(prims.reduce_sum_p)
def _(x: BCOO, *, axes: Sequence[int], **params: Any) -> Any:
    """Dense when the result holds no more elements than `x` stores (a row sum of a
    matrix with more nonzeros than rows), else sparse (duplicates not merged)."""
    axes = tuple(axes)
    keep = tuple(i for i in range(x.ndim) if i not in axes)
    out_shape = tuple(x.shape[i] for i in keep)
    coords, values = flat_entries(x.data, x.indices)
    if math.prod(out_shape) <= values.shape[0]:
        # A summed-out axis holding padding (out of bounds) must stay padding.
        ok = valid_mask(coords[:, axes], [x.shape[a] for a in axes])
        values = jnp.where(ok, values, 0)
        out = jnp.zeros(out_shape, x.dtype)
        return scatter_add(out, coords[:, keep], tuple(range(len(keep))), values)
    nb = x.n_batch
    if any(a < nb for a in axes):
        x, nb = unbatch(x), 0
    data = x.data
    indices = x.indices[..., [i - nb for i in keep[nb:]]]
    # A summed-out axis holding padding (out of bounds) must stay padding.
    dropped = x.indices[..., [a - nb for a in axes]]
    ok = valid_mask(dropped, [x.shape[a] for a in axes])
    data = jnp.where(ok, data, 0)
    return new_like(x, data, indices, out_shape)


@quax.register(prims.broadcast_in_dim_p)
def _(
    x: BCOO,
    *,
    shape: Sequence[int],
    broadcast_dimensions: Sequence[int],
    **params: Any,
) -> Any:
    shape, dims = tuple(shape), tuple(broadcast_dimensions)
    n_new = len(shape) - x.ndim
    same_sizes = all(shape[d] == x.shape[i] for i, d in enumerate(dims))
    if same_sizes and dims == tuple(range(n_new, len(shape))):
        # New leading batch dimensions (as in the published quax).
        lead = shape[:n_new]
        data = jnp.broadcast_to(x.data, lead + x.data.shape)
        indices = jnp.broadcast_to(x.indices, lead + x.indices.shape)
        return new_like(
            x,
            data,
            indices,
            shape,
            indices_sorted=x.indices_sorted,
            unique_indices=x.unique_indices,
        )
    new = [d for d in range(len(shape)) if d not in dims]
    if same_sizes and all(shape[d] == 1 for d in new) and list(dims) == sorted(dims):
        # New axes of size 1 (`x[:, None]`): a zero index column each.
        y = unbatch(x)
        indices = y.indices
        for d in new:  # increasing: columns before `d` are already in place
            zeros = jnp.zeros((*indices.shape[:-1], 1), indices.dtype)
            indices = jnp.concatenate([indices[:, :d], zeros, indices[:, d:]], axis=-1)
        return new_like(
            x,
            y.data,
            indices,
            shape,
            indices_sorted=x.indices_sorted,
            unique_indices=x.unique_indices,
        )
    params = dict(params, shape=shape, broadcast_dimensions=dims)
    return _fallback(prims.broadcast_in_dim_p, (x,), params)


@quax.register(prims.squeeze_p)
def _(x: BCOO, *, dimensions: Sequence[int], **params: Any) -> BCOO:
    dims = tuple(sorted(d % x.ndim for d in dimensions))
    nb = x.n_batch
    batch_dims = tuple(d for d in dims if d < nb)
    sparse_cols = [d - nb for d in dims if d >= nb]
    data = lax.squeeze(x.data, batch_dims)
    indices = lax.squeeze(x.indices, batch_dims)
    if sparse_cols:
        # An entry whose dropped index is out of bounds is padding: zero its value.
        ok = valid_mask(indices[..., sparse_cols], [1] * len(sparse_cols))
        data = jnp.where(ok, data, 0)
        keep = [c for c in range(x.n_sparse) if c not in sparse_cols]
        indices = indices[..., keep]
    shape = tuple(s for i, s in enumerate(x.shape) if i not in dims)
    return new_like(
        x,
        data,
        indices,
        shape,
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


@quax.register(prims.reshape_p)
def _(x: BCOO, *, new_sizes: Sequence[int], dimensions: Any, **params: Any) -> Any:
    new_sizes = tuple(new_sizes)
    nb = x.n_batch
    batch = x.shape[:nb]
    if dimensions is not None or math.prod(x.shape[nb:]) >= 2**31:
        params = dict(params, new_sizes=new_sizes, dimensions=dimensions)
        return _fallback(prims.reshape_p, (x,), params)
    if new_sizes[:nb] != batch:
        x, nb, batch = unbatch(x), 0, ()
    old, new = x.shape[nb:], new_sizes[nb:]
    # Row-major position of each entry (int32 suffices: checked above), split anew.
    if math.prod(new) == 0:
        return new_like(
            x,
            x.data,
            jnp.zeros((*x.indices.shape[:-1], len(new)), x.indices.dtype),
            new_sizes,
        )
    ok = valid_mask(x.indices, old)
    flat = jnp.zeros(x.indices.shape[:-1], x.indices.dtype)
    for c, size in enumerate(old):
        flat = flat * size + x.indices[..., c]
    columns = []
    for size in reversed(new):
        columns.append(flat % size)
        flat = flat // size
    indices = jnp.stack(columns[::-1], axis=-1).astype(x.indices.dtype)
    indices = jnp.where(ok[..., None], indices, jnp.asarray(new, x.indices.dtype))
    return new_like(
        x,
        x.data,
        indices,
        new_sizes,
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


@quax.register(prims.rev_p)
def _(x: BCOO, *, dimensions: Sequence[int], **params: Any) -> BCOO:
    nb = x.n_batch
    data, indices = x.data, x.indices
    batch_dims = tuple(d for d in dimensions if d < nb)
    if batch_dims:
        data, indices = lax.rev(data, batch_dims), lax.rev(indices, batch_dims)
    for d in dimensions:
        if d >= nb:
            # Padding (an index outside [0, n)) stays where it is.
            c, n = d - nb, x.shape[d]
            column = indices[..., c]
            flipped = jnp.where((column >= 0) & (column < n), n - 1 - column, column)
            indices = indices.at[..., c].set(flipped)
    return new_like(x, data, indices, x.shape, unique_indices=x.unique_indices)


def _window(
    x: BCOO, starts: Sequence[Any], sizes: Sequence[int], strides: Sequence[int]
) -> BCOO:
    """The window of `x` starting at `starts` (static or traced), `sizes` long, every
    `strides`-th element: entries outside it become padding."""
    nb = x.n_batch
    data, indices = x.data, x.indices
    if nb:
        batch_starts = [jnp.asarray(s) for s in starts[:nb]]
        if any(st != 1 for st in strides[:nb]):
            x = unbatch(x)
            return _window(x, starts, sizes, strides)
        data = lax.dynamic_slice(data, [*batch_starts, 0], (*tuple(sizes[:nb]), x.nse))
        indices = lax.dynamic_slice(
            indices, [*batch_starts, 0, 0], (*tuple(sizes[:nb]), x.nse, x.n_sparse)
        )
    if x.n_sparse == 0:
        return new_like(x, data, indices, tuple(sizes))
    start = jnp.stack([jnp.asarray(s, indices.dtype) for s in starts[nb:]])
    stride = jnp.asarray(np.asarray(strides[nb:]), indices.dtype)
    size = jnp.asarray(np.asarray(sizes[nb:]), indices.dtype)
    shifted = indices - start
    inside = jnp.all(
        (shifted >= 0) & (shifted % stride == 0) & (shifted // stride < size), axis=-1
    )
    indices = jnp.where(inside[..., None], shifted // stride, size)
    data = jnp.where(inside, data, 0)
    return new_like(
        x,
        data,
        indices,
        tuple(sizes),
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


@quax.register(prims.slice_p)
def _(
    x: BCOO,
    *,
    start_indices: Sequence[int],
    limit_indices: Sequence[int],
    strides: Sequence[int] | None,
    **params: Any,
) -> BCOO:
    strides = tuple(strides) if strides is not None else (1,) * x.ndim
    sizes = tuple(
        max(0, -(-(hi - lo) // st))
        for lo, hi, st in zip(start_indices, limit_indices, strides, strict=True)
    )
    return _window(x, tuple(start_indices), sizes, strides)


@quax.register(prims.dynamic_slice_p)
def _(
    x: BCOO, *start_indices: ArrayLike, slice_sizes: Sequence[int], **params: Any
) -> BCOO:
    # As `lax.dynamic_slice`, starts are clamped so that the window fits.
    starts = [
        jnp.clip(jnp.asarray(s), 0, dim - size)
        for s, dim, size in zip(start_indices, x.shape, slice_sizes, strict=True)
    ]
    return _window(x, starts, tuple(slice_sizes), (1,) * x.ndim)


@quax.register(prims.concatenate_p)
def _(*operands: BCOO, dimension: int, **params: Any) -> BCOO:
    # Entries of every operand, the concatenated axis's index shifted by the sizes
    # of the operands before it (batch axes become sparse ones first).
    # Padding goes to the concatenated axis's size (the padding index of the result).
    parts = [unbatch(x) for x in operands]
    total = sum(x.shape[dimension] for x in parts)
    offset = 0
    data, indices = [], []
    index_dtype = jnp.result_type(*(x.indices.dtype for x in parts))
    for x in parts:
        shifted = x.indices.astype(index_dtype)
        ok = valid_mask(shifted, x.shape)
        column = jnp.where(ok, shifted[:, dimension] + offset, total)
        data.append(jnp.where(ok, x.data, 0))
        indices.append(shifted.at[:, dimension].set(column))
        offset += x.shape[dimension]
    shape = list(parts[0].shape)
    shape[dimension] = total
    out = jnp.concatenate(data).astype(jnp.result_type(*(x.dtype for x in parts)))
    return BCOO._from_entries(
        out,
        jnp.concatenate(indices),
        tuple(shape),
        all(x.allow_materialise for x in operands),
        unique_indices=all(x.unique_indices for x in operands),
    )


# CSR: mixed with BCOO -----------------------------------------------------------------


def _mixed(primitive: Primitive) -> None:
    def convert(values: Sequence[Any]) -> list[Any]:
        return [v.to_bcoo() if isinstance(v, CSR) else v for v in values]

    @quax.register(primitive)
    def _(x: CSR, y: BCOO, **params: Any) -> Any:
        return quax.quaxify(primitive.bind)(*convert((x, y)), **params)

    @quax.register(primitive)
    def _(x: BCOO, y: CSR, **params: Any) -> Any:
        return quax.quaxify(primitive.bind)(*convert((x, y)), **params)


for _p in (
    prims.dot_general_p,
    prims.add_p,
    prims.add_jaxvals_p,
    prims.sub_p,
    prims.mul_p,
):
    _mixed(_p)
