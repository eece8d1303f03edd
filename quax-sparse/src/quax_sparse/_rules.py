"""The rules for `BCOO` (and `CSR`, through its `BCOO` form).

Each rule works on the stored entries only. Operations without a rule fall back to
the core's refusing default ([`quax.GuardedValue`][]), which names the primitive
unless the array allows materialising.
"""

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import quax
from jax import lax
from jax.extend.core import Primitive, primitives as prims
from jaxtyping import Array, ArrayLike

from ._kernels import (
    dot_blocks,
    dot_blocks_dense,
    dot_sparse_dense,
    dot_sparse_sparse,
    flat_entries,
    gather,
    read_blocks,
    scatter_add,
    valid_mask,
)
from ._values import (
    BCOO,
    CSR,
    BlockSparse,
    PendingSolve,
    SparseLU,
    apply_inverse,
    factorise,
    unfactorable,
)


def _fallback(
    primitive: Primitive, values: Sequence[Any], params: dict[str, Any]
) -> Any:
    return quax.fallback_rule(primitive, values)(values, params)


def _refuse_blocks(
    primitive: Primitive,
    values: Sequence[Any],
    params: dict[str, Any],
    why: str | None = None,
    remedy: str | None = None,
) -> Any:
    """A `BCOO` with dense dimensions (blocks) met a rule that handles only scalar
    entries, or a case of a block-aware rule that it cannot keep: refused, naming
    `n_dense` and the way out (`update_layout(n_dense=0)`, or `remedy` where that
    would not help), unless every such operand allows materialising (then the
    fallback computes it densely)."""
    blocked = [v for v in values if isinstance(v, BCOO) and v.n_dense]
    if all(v.allow_materialise for v in blocked):
        return _fallback(primitive, values, params)
    x = next(v for v in blocked if not v.allow_materialise)
    types = ", ".join(type(v).__qualname__ for v in values)
    reason = why or (
        f"quax-sparse's rule for `{primitive.name}` on these types handles scalar "
        "entries only (n_dense=0)"
    )
    raise x.materialisation_error(
        f"Refusing to materialise `BCOO` for primitive `{primitive.name}` on input "
        f"types ({types}): the BCOO of shape {x.shape} stores blocks over its "
        f"n_dense={x.n_dense} trailing dense dimensions (block shape "
        f"{x.dense_shape}), and {reason}. "
        + (
            remedy
            or "Turn the dense dimensions into sparse ones first: "
            "`x.update_layout(n_dense=0)` gives the same array with one stored "
            "entry per element of each block."
        )
        + " "
        + x.way_out(primitive)
    )


def register(primitive: Primitive, *, blocks: bool = False) -> Callable[[Any], Any]:
    """`quax.register(primitive)`, for a rule that handles `BCOO`s with dense
    dimensions (`blocks=True`) or not: then a `BCOO` operand with `n_dense > 0`
    never reaches the rule, which would read its blocks as scalars, and is refused
    by `_refuse_blocks` instead."""

    def decorate(rule: Callable[..., Any]) -> Callable[..., Any]:
        if blocks:
            return quax.register(primitive)(rule)

        @functools.wraps(rule)
        def scalar_entries_only(*values: Any, **params: Any) -> Any:
            if any(isinstance(v, BCOO) and v.n_dense for v in values):
                return _refuse_blocks(primitive, values, params)
            return rule(*values, **params)

        quax.register(primitive)(scalar_entries_only)
        return rule

    return decorate


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


def in_order(x: BCOO, data: Array, indices: Array, shape: Sequence[int]) -> BCOO:
    """A `BCOO` with `x`'s options and the given entries, which keep the order and
    uniqueness of `x`'s (`x`'s flags)."""
    return new_like(
        x,
        data,
        indices,
        shape,
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


def with_data(x: BCOO, data: Array) -> BCOO:
    """`x` with other stored values at the same positions (flags kept)."""
    return new_like(
        x,
        data,
        x.indices,
        x.shape,
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


def unbatch(x: BCOO) -> BCOO:
    """`x` with every batch dimension sparse (`n_batch = 0`): `prod(batch) * nse`
    entries, the batch coordinates as leading index columns (dense dimensions
    stay dense). Order and uniqueness are kept."""
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


def same_blocks(x: BCOO, y: BCOO) -> tuple[BCOO, BCOO]:
    """`x` and `y` (of one shape) with the same number of dense dimensions: the
    one with more splits its blocks (`update_layout`), an exact conversion."""
    n_dense = min(x.n_dense, y.n_dense)
    return x.update_layout(n_dense=n_dense), y.update_layout(n_dense=n_dense)


def transpose_matrix(x: BCOO) -> BCOO:
    """The transpose of an unbatched sparse matrix (index columns swapped; dense
    dimensions, if any, stay last)."""
    shape = (x.shape[1], x.shape[0], *x.dense_shape)
    return new_like(
        x, x.data, x.indices[:, ::-1], shape, unique_indices=x.unique_indices
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


def _dot_dense(
    x: BCOO, d: ArrayLike, dimension_numbers: Any, sparse_is_lhs: bool, params: Any
) -> Any:
    """`dot_general` of a sparse `x` and a dense `d` (`sparse_is_lhs` says which is
    the left operand). Dense, unless `x` has dense dimensions and the product pairs
    (contracts or batches) none of its batch or sparse ones (`a @ w` contracting
    the blocks of `a` with `w`): then it is sparse, on `x`'s pattern, each block
    multiplied with `d`; dimensions that `dot_general` puts before `x`'s (batched
    dense ones, and `d`'s free ones when `d` is the left operand) become batch
    dimensions of the result."""
    (l_contract, r_contract), (l_batch, r_batch) = dimension_numbers
    paired = (*l_contract, *l_batch) if sparse_is_lhs else (*r_contract, *r_batch)
    d = jnp.asarray(d)
    out_dtype = _out_dtype(x, d, params.get("preferred_element_type"))
    x = _read_as(x, out_dtype)
    n_index = x.n_batch + x.n_sparse
    if x.n_dense and all(i >= n_index for i in paired):
        data = dot_blocks_dense(
            x.data,
            x.n_batch,
            n_index,
            d,
            dimension_numbers,
            sparse_is_lhs=sparse_is_lhs,
            out_dtype=out_dtype,
        )
        n_batched = len(l_batch)
        n_lead = n_batched if sparse_is_lhs else n_batched + d.ndim - len(paired)
        lead = data.shape[:n_lead]
        block = data.shape[n_lead + x.n_batch + 1 :]
        indices = jnp.broadcast_to(x.indices, lead + x.indices.shape)
        return in_order(x, data, indices, lead + x.shape[:n_index] + block)
    return dot_sparse_dense(
        x.data,
        x.indices,
        x.shape,
        d,
        dimension_numbers,
        sparse_is_lhs=sparse_is_lhs,
        out_dtype=out_dtype,
        indices_sorted=x.indices_sorted,
    )


@register(lax.dot_general_p, blocks=True)
def _(lhs: BCOO, rhs: ArrayLike, *, dimension_numbers: Any, **params: Any) -> Any:
    return _dot_dense(lhs, rhs, dimension_numbers, True, params)


@register(lax.dot_general_p, blocks=True)
def _(lhs: ArrayLike, rhs: BCOO, *, dimension_numbers: Any, **params: Any) -> Any:
    return _dot_dense(rhs, lhs, dimension_numbers, False, params)


@register(lax.dot_general_p, blocks=True)
def _(lhs: BCOO, rhs: BCOO, *, dimension_numbers: Any, **params: Any) -> Any:
    """The product of two sparse matrices, sparse. The right one may have dense
    dimensions (blocks, kept free: `a @ b` with `b` of shape `(k, m, *block)`
    gives `(n, m, *block)`)."""
    (l_contract, r_contract), (l_batch, r_batch) = dimension_numbers
    r_matrix = rhs.ndim - rhs.n_dense
    if lhs.n_dense or (rhs.n_dense and (r_matrix != 2 or r_contract[0] >= 2)):
        return _refuse_blocks(
            lax.dot_general_p,
            (lhs, rhs),
            dict(params, dimension_numbers=dimension_numbers),
            "a product of two sparse operands keeps blocks only as the right "
            "operand's free dense dimensions, `(n, k) @ (k, m, *block)`, where the "
            "dense dimensions stay last",
            "Densify the other operand first (`y.todense()`: the product of a "
            "sparse array with blocks and a dense one keeps the blocks), or bind "
            "the product as `(n, k) @ (k, m, *block)`.",
        )
    if lhs.ndim != 2 or r_matrix != 2 or len(l_contract) != 1 or l_batch or r_batch:
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
    return BCOO._from_entries(data, indices, (n, m, *b.dense_shape), allow)


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
    return with_data(x, primitive.bind(x.data, **params))


@quax.register_elementwise(quax.ZERO_PRESERVING)
def _(primitive: Primitive, x: BCOO, **params: Any) -> BCOO:
    return _on_data(primitive, x, params, linear=primitive in _LINEAR)


@register(prims.integer_pow_p, blocks=True)
def _(x: BCOO, *, y: int, **params: Any) -> Any:
    if y <= 0:  # x ** 0 = 1 and 0 ** -1 = inf: not sparse
        return _fallback(prims.integer_pow_p, (x,), dict(params, y=y))
    return _on_data(prims.integer_pow_p, x, dict(params, y=y), linear=y == 1)


@register(prims.convert_element_type_p, blocks=True)
def _(x: BCOO, *, new_dtype: Any, **params: Any) -> BCOO:
    # Conversion to a floating type is exact enough to apply to duplicates one by one;
    # to an integer or bool it rounds, so it needs unique entries, and so does a
    # conversion from bool (`_read_as`). The output's sharding (for the dense shape)
    # does not apply to `data`.
    x = _read_as(x, new_dtype)
    params = dict(params, new_dtype=new_dtype, sharding=None)
    linear = bool(jnp.issubdtype(new_dtype, jnp.inexact))
    return _on_data(prims.convert_element_type_p, x, params, linear=linear)


@register(prims.copy_p, blocks=True)
def _(x: BCOO, **params: Any) -> BCOO:
    return x


# Binary arithmetic ------------------------------------------------------------------


def _at_entries(x: BCOO, dense: Any) -> Array:
    """`dense` (broadcastable to `x.shape`, never stretching `x`) read at the
    stored entries of `x`, in the shape of `x.data`: each entry reads its element
    (its block, along the dense dimensions). Axes of size 1 of `dense` where `x`
    is longer are broadcast, not read along."""
    dense = jnp.asarray(dense)
    if dense.ndim == 0:
        return jnp.broadcast_to(dense, x.data.shape)
    dense = dense.reshape((1,) * (x.ndim - dense.ndim) + dense.shape)
    n_index = x.n_batch + x.n_sparse
    dense = jnp.broadcast_to(dense, dense.shape[:n_index] + x.dense_shape)
    read = tuple(d for d in range(n_index) if dense.shape[d] == x.shape[d])
    kept = dense.reshape([dense.shape[d] for d in read] + list(x.dense_shape))
    if not read:
        return jnp.broadcast_to(kept, x.data.shape)
    coords, _ = flat_entries(x.data, x.indices)
    return gather(kept, coords[:, read], tuple(range(len(read)))).reshape(x.data.shape)


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
    factor = _at_entries(x, y)
    args = (factor, x.data) if y_first else (x.data, factor)
    return with_data(x, primitive.bind(*args, **params))


@register(prims.mul_p, blocks=True)
def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
    return _scale(prims.mul_p, x, y, False, params)


@register(prims.mul_p, blocks=True)
def _(x: ArrayLike, y: BCOO, **params: Any) -> Any:
    return _scale(prims.mul_p, y, x, True, params)


@register(prims.div_p, blocks=True)
def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
    return _scale(prims.div_p, x, y, False, params)


# `and` with a dense array keeps zeros (`jnp.multiply` of bools binds it). It is not
# linear in the stored values (bitwise on integers), so duplicates merge first.
@register(prims.and_p, blocks=True)
def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
    return _scale(prims.and_p, unique(x), y, False, params)


@register(prims.and_p, blocks=True)
def _(x: ArrayLike, y: BCOO, **params: Any) -> Any:
    return _scale(prims.and_p, unique(y), x, True, params)


def _concat(x: BCOO, y: BCOO) -> BCOO:
    """The entries of both (the sparse sum), with the same batching and dense
    dimensions (blocks split where one has more: `update_layout`)."""
    x, y = same_blocks(x, y)
    if x.n_batch != y.n_batch:
        x, y = unbatch(x), unbatch(y)
    data = jnp.concatenate([x.data, y.data.astype(x.data.dtype)], axis=x.n_batch)
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
    return scatter_add(y, coords, tuple(range(x.n_batch + x.n_sparse)), values)


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
    @register(primitive, blocks=True)
    def _(x: BCOO, y: BCOO, **params: Any) -> Any:
        return _sum(primitive, x, y, params)

    @register(primitive, blocks=True)
    def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
        return _sum(primitive, x, y, params)

    @register(primitive, blocks=True)
    def _(x: ArrayLike, y: BCOO, **params: Any) -> Any:
        return _sum(primitive, x, y, params)


for _p in (prims.add_p, prims.add_jaxvals_p, prims.sub_p):
    _register_sum(_p)


# Sparse x sparse elementwise: the intersection ---------------------------------------


def _flat_keys(x: BCOO) -> Array:
    """The row-major position of each entry of an unbatched `x` in its sparse
    dimensions (int32; the caller checks that the positions fit),
    `prod(sparse shape)` at padding."""
    sparse_shape = x.shape[: x.n_sparse]
    ok = valid_mask(x.indices, sparse_shape)
    key = jnp.zeros(x.indices.shape[:-1], jnp.int32)
    for c, size in enumerate(sparse_shape):
        key = key * size + x.indices[:, c].astype(jnp.int32)
    return jnp.where(ok, key, math.prod(sparse_shape))


def _intersect(primitive: Primitive, x: BCOO, y: BCOO, params: dict[str, Any]) -> Any:
    """`x * y` (or `x & y`) of two sparse arrays of the same shape: the entries at
    the positions both store, `primitive` applied to the pair. The result has the
    `nse` of the operand with fewer entries (`min(nse(x), nse(y))` times the batch
    size), unique indices; the others are padding. Positions stored by one operand
    only are zeros of the other, and stay zero (stored entries annihilate, as in
    `jax.experimental.sparse`)."""
    if x.shape != y.shape:
        return _broadcast_fallback(primitive, (x, y), params)
    if not _keys_fit(x):
        return _fallback(primitive, (x, y), params)
    return _intersect_entries(x, y, lambda a, b: primitive.bind(a, b, **params))


def _keys_fit(x: BCOO) -> bool:
    """Whether the row-major positions of `x`'s batch and sparse dimensions fit in
    int32 (`_flat_keys`)."""
    return math.prod(x.shape[: x.n_batch + x.n_sparse]) < 2**31 - 1


def _intersect_entries(
    x: BCOO, y: BCOO, combine: Callable[[Array, Array], Array]
) -> BCOO:
    """The entries at the positions both `x` and `y` (of one shape, positions that
    fit `_keys_fit`) store, `combine` applied to each pair of stored values
    (blocks), as `_intersect` describes."""
    x, y = same_blocks(x, y)
    positions = math.prod(x.shape[: x.n_batch + x.n_sparse])
    a, b = unique(unbatch(x)), unique(unbatch(y))
    swap = b.nse < a.nse
    if swap:  # drive by the operand with fewer entries
        a, b = b, a
    a_key, b_key = _flat_keys(a), _flat_keys(b)
    order = jnp.argsort(b_key)
    b_sorted = b_key[order]
    position = jnp.clip(jnp.searchsorted(b_sorted, a_key), 0, max(b.nse - 1, 0))
    if b.nse == 0:
        match = jnp.zeros(a_key.shape, bool)
        partner = jnp.zeros(a.data.shape, b.data.dtype)
    else:
        match = (b_sorted[position] == a_key) & (a_key < positions)
        partner = b.data[order[position]]
    pair = (partner, a.data) if swap else (a.data, partner)
    data = combine(*pair)
    lead = match.reshape(match.shape + (1,) * x.n_dense)
    data = jnp.where(lead, data, jnp.zeros((), data.dtype))
    fill = jnp.asarray(x.shape[: a.n_sparse], a.indices.dtype)
    indices = jnp.where(match[:, None], a.indices, fill)
    return BCOO._from_entries(
        data,
        indices,
        x.shape,
        x.allow_materialise and y.allow_materialise,
        indices_sorted=a.indices_sorted,  # in `a`'s order, padding aside
        unique_indices=True,
    )


@register(prims.mul_p, blocks=True)
def _(x: BCOO, y: BCOO, **params: Any) -> Any:
    return _intersect(prims.mul_p, x, y, params)


@register(prims.and_p, blocks=True)
def _(x: BCOO, y: BCOO, **params: Any) -> Any:
    return _intersect(prims.and_p, x, y, params)


# Selection: `jnp.where(mask, x, 0)` ---------------------------------------------------


def _zeros(x: Any) -> bool:
    """Whether the dense operand `x` is known now to be all zeros (a literal or a
    broadcast of one: `jnp.where(mask, x, 0)`'s zero)."""
    known = quax.known_constant(x, max_size=max(np.size(x), 1))
    return known is not None and not np.any(known)


def _where_sparse(mask: BCOO, x: BCOO) -> BCOO | None:
    """`where(mask, x, 0)` of a sparse bool `mask` and a sparse `x` of the same
    shape: the entries both store where the mask holds (the intersection), in the
    mask's order and layout: with batch dimensions in both, each member is
    intersected alone. `relu`'s derivative binds it, `where(x > 0, g, 0)` with `g`
    the tangent of `x`, and a tangent's indices are its primal's: the result
    must hold the entries of `x > 0` (those of `relu(x)`) in their order, which
    the intersection driven by the mask (not the smaller operand: both have the
    same `nse` here) gives. `None` where positions overflow int32."""
    if x.shape != mask.shape or not _keys_fit(x):
        return None
    zero = jnp.zeros((), x.dtype)
    if mask.indices is x.indices and mask.unique_indices:
        # One pattern without duplicates: entry by entry, in `x`'s layout.
        return with_data(x, jnp.where(mask.data, x.data, zero))

    def combine(m: Array, v: Array) -> Array:
        return jnp.where(m, v, zero)

    nb = mask.n_batch
    if not nb or x.n_batch != nb:
        return _intersect_entries(mask, x, combine)
    flags: list[bool] = []

    def member(m_data: Array, m_indices: Array, data: Array, indices: Array) -> Any:
        m = new_like(
            mask,
            m_data,
            m_indices,
            mask.shape[nb:],
            indices_sorted=mask.indices_sorted,
            unique_indices=mask.unique_indices,
        )
        v = new_like(
            x,
            data,
            indices,
            x.shape[nb:],
            indices_sorted=x.indices_sorted,
            unique_indices=x.unique_indices,
        )
        out = _intersect_entries(m, v, combine)
        flags[:] = [out.indices_sorted]
        return out.data, out.indices

    for _ in range(nb):
        member = jax.vmap(member)
    data, indices = member(mask.data, mask.indices, x.data, x.indices)
    return BCOO._from_entries(
        data,
        indices,
        x.shape,
        mask.allow_materialise and x.allow_materialise,
        indices_sorted=flags[0],
        unique_indices=True,
    )


def _select(which: Any, cases: Sequence[Any]) -> Any:
    """`select_n` with a sparse operand against zeros: `where(mask, x, 0)` keeps
    `x`'s entries where the mask holds (a dense mask read at the entries); a sparse
    boolean mask picks a dense `x` at its own entries, and a sparse `x` at the
    entries both store (what `jax.nn.relu`'s derivative binds: `where(x > 0, g,
    0)`). Anything else (no zero case known now, two sparse cases, a mask that
    keeps the zeros' side) falls back."""
    if len(cases) != 2:
        return None
    if isinstance(which, BCOO):
        zeros, x = cases
        if which.dtype != jnp.bool_ or not _zeros(zeros) or _broadcasts(which, x):
            return None
        if isinstance(x, BCOO):  # both sparse: where both store, the mask holds
            return _where_sparse(which, x)
        mask = unique(which)
        data = jnp.where(mask.data, _at_entries(mask, x), 0).astype(jnp.result_type(x))
        return new_like(
            mask,
            data,
            mask.indices,
            mask.shape,
            indices_sorted=mask.indices_sorted,
            unique_indices=True,
        )
    sparse = [i for i, c in enumerate(cases) if isinstance(c, BCOO)]
    if len(sparse) != 1 or not _zeros(cases[1 - sparse[0]]):
        return None
    x = cases[sparse[0]]
    if _broadcasts(x, which):
        return None
    keep = _at_entries(x, jnp.asarray(which, bool))
    keep = keep if sparse[0] == 1 else ~keep
    # `where`, not a product: a NaN entry that the mask drops is dropped.
    return with_data(x, jnp.where(keep, x.data, jnp.zeros((), x.dtype)))


def _register_select(types: tuple[type, type, type]) -> None:
    @register(prims.select_n_p, blocks=True)
    def _(which: types[0], a: types[1], b: types[2]) -> Any:  # pyright: ignore
        out = _select(which, (a, b))
        return (
            out if out is not None else _fallback(prims.select_n_p, (which, a, b), {})
        )


for _types in [
    (ArrayLike, ArrayLike, BCOO),
    (ArrayLike, BCOO, ArrayLike),
    (BCOO, ArrayLike, ArrayLike),
    (BCOO, ArrayLike, BCOO),
]:
    _register_select(_types)


# Gathering rows: `a[idx]` -------------------------------------------------------------


def _is_row_gather(x: BCOO, indices: Any, params: dict[str, Any]) -> bool:
    """`a[idx]` on a sparse matrix (blocks allowed: `a[idx]` on `(m, n, *dense)`
    takes whole rows)."""
    dnums = params["dimension_numbers"]
    return (
        x.n_batch == 0
        and x.n_sparse == 2
        and np.ndim(indices) == 2
        and np.shape(indices)[1] == 1
        and tuple(dnums.offset_dims) == tuple(range(1, x.ndim))
        and tuple(dnums.collapsed_slice_dims) == (0,)
        and tuple(dnums.start_index_map) == (0,)
        and not tuple(getattr(dnums, "operand_batching_dims", ()))
        and tuple(params["slice_sizes"]) == (1, *x.shape[1:])
    )


@register(prims.gather_p, blocks=True)
def _(x: BCOO, indices: ArrayLike, **params: Any) -> Any:
    """`a[idx]` for an integer array `idx` (rows of a sparse matrix: neighbour
    sampling): the product `S @ a` with the selection matrix `S` (one entry per
    requested row), so the result is sparse with one entry per entry of the rows
    gathered: exactly that many when the indices are known at trace time, else the
    bound `len(idx) * min(nse, n_cols)` (`len(idx) * nse` unless `a` has unique
    indices). Out-of-range rows are clamped, or are zero rows with
    `mode="fill"`. Other gathers fall back."""
    mode = params.get("mode")
    fill = params.get("fill_value")
    if not _is_row_gather(x, indices, params) or fill not in (None, 0):
        if x.n_dense:
            return _refuse_blocks(prims.gather_p, (x, indices), params)
        return _fallback(prims.gather_p, (x, indices), params)
    m, n = x.shape[:2]
    rows = jnp.asarray(indices)[:, 0]
    k = rows.shape[0]
    if mode != lax.GatherScatterMode.FILL_OR_DROP:
        rows = jnp.clip(rows, 0, max(m - 1, 0))
    index_dtype = jnp.promote_types(rows.dtype, x.indices.dtype)
    select = jnp.stack(
        [jnp.arange(k, dtype=index_dtype), rows.astype(index_dtype)], axis=-1
    )
    a = unbatch(x)
    data, out_indices = dot_sparse_sparse(
        jnp.ones((k,), x.dtype),
        select,
        a.data,
        a.indices,
        (k, m, n),
        x.dtype,
        a_unique=True,
        b_unique=a.unique_indices,
    )
    return BCOO._from_entries(
        data,
        out_indices,
        (k, n, *x.dense_shape),
        x.allow_materialise,
        unique_indices=a.unique_indices,
    )


# Structure ----------------------------------------------------------------------------


def _blocks_to_batch(x: BCOO, lead: Sequence[int]) -> BCOO:
    """`x` with its dense dimensions `lead` moved to the front as new batch
    dimensions (the others keep their order): the same pattern for each element
    of the new batch, so `indices` is broadcast along them (`prod` of their sizes
    times as many index entries); the dimensions of `x` follow in order."""
    n_index = x.n_batch + x.n_sparse
    axes = [x.n_batch + 1 + d - n_index for d in lead]
    data = jnp.moveaxis(x.data, axes, list(range(len(lead))))
    lead_shape = tuple(x.shape[d] for d in lead)
    indices = jnp.broadcast_to(x.indices, lead_shape + x.indices.shape)
    shape = lead_shape + tuple(s for i, s in enumerate(x.shape) if i not in lead)
    return in_order(x, data, indices, shape)


@register(prims.transpose_p, blocks=True)
def _transpose(x: BCOO, *, permutation: Sequence[int], **params: Any) -> BCOO:
    """A permutation of the batch and sparse dimensions among themselves and of
    the dense ones among themselves, or one that also brings dense dimensions to
    the front (`vmap` moving its batch axis there: they become batch dimensions,
    `_blocks_to_batch`)."""
    perm = tuple(permutation)
    nb = x.n_batch
    n_index = nb + x.n_sparse  # the dense dimensions come after
    n_lead = next((k for k, p in enumerate(perm) if p < n_index), len(perm))
    rest = perm[n_lead:]
    index_next = tuple(sorted(rest[:n_index])) == tuple(range(n_index))
    if n_lead and index_next and all(p >= n_index for p in rest[n_index:]):
        kept = [d for d in range(n_index, x.ndim) if d not in perm[:n_lead]]
        y = _blocks_to_batch(x, perm[:n_lead])
        place = {d: n_lead + d for d in range(n_index)}
        place.update({d: n_lead + n_index + k for k, d in enumerate(kept)})
        permutation = (*range(n_lead), *(place[p] for p in rest))
        return _transpose(y, permutation=permutation, **params)
    if tuple(sorted(perm[n_index:])) != tuple(range(n_index, x.ndim)):
        return _refuse_blocks(
            prims.transpose_p,
            (x,),
            dict(params, permutation=perm),
            f"the permutation {perm} moves a dense dimension among the sparse ones "
            "(a transpose keeps the dense dimensions last, permuting them among "
            "themselves, or brings some to the front as batch dimensions)",
        )
    if tuple(sorted(perm[:nb])) != tuple(range(nb)):
        x, nb = unbatch(x), 0
    dense_axes = [nb + 1 + p - n_index for p in perm[n_index:]]
    data = lax.transpose(x.data, (*perm[:nb], nb, *dense_axes))
    indices = lax.transpose(x.indices, (*perm[:nb], nb, nb + 1))
    indices = indices[..., [p - nb for p in perm[nb:n_index]]]
    shape = tuple(x.shape[p] for p in perm)
    return new_like(x, data, indices, shape, unique_indices=x.unique_indices)


@register(prims.reduce_sum_p, blocks=True)
def _(x: BCOO, *, axes: Sequence[int], **params: Any) -> Any:
    """Dense when the result holds no more elements than `x` stores (a row sum of a
    matrix with more nonzeros than rows), else sparse (duplicates not merged).
    Dense dimensions (blocks) are summed within each block first."""
    axes = tuple(axes)
    n_index = x.n_batch + x.n_sparse
    in_blocks = tuple(a for a in axes if a >= n_index)
    if in_blocks:
        summed = tuple(x.n_batch + 1 + a - n_index for a in in_blocks)
        x = new_like(
            x,
            x.data.sum(axis=summed),
            x.indices,
            tuple(s for i, s in enumerate(x.shape) if i not in in_blocks),
            indices_sorted=x.indices_sorted,
            unique_indices=x.unique_indices,
        )
        axes = tuple(a for a in axes if a < n_index)
        if not axes:
            return x
    keep = tuple(i for i in range(x.ndim) if i not in axes)
    out_shape = tuple(x.shape[i] for i in keep)
    coords, values = flat_entries(x.data, x.indices)
    block_ones = (1,) * x.n_dense
    if math.prod(out_shape) <= values.size or not out_shape:
        # A summed-out axis holding padding (out of bounds) must stay padding.
        ok = valid_mask(coords[:, axes], [x.shape[a] for a in axes])
        values = jnp.where(ok.reshape(ok.shape + block_ones), values, 0)
        out = jnp.zeros(out_shape, x.dtype)
        read = tuple(i for i in keep if i < n_index)
        return scatter_add(out, coords[:, read], tuple(range(len(read))), values)
    nb = x.n_batch
    if any(a < nb for a in axes):
        x, nb = unbatch(x), 0
    data = x.data
    indices = x.indices[..., [i - nb for i in keep[nb:] if i < n_index]]
    # A summed-out axis holding padding (out of bounds) must stay padding.
    dropped = x.indices[..., [a - nb for a in axes]]
    ok = valid_mask(dropped, [x.shape[a] for a in axes])
    data = jnp.where(ok.reshape(ok.shape + block_ones), data, 0)
    return new_like(x, data, indices, out_shape)


def _reduce_blocks(
    primitive: Primitive, x: BCOO, axes: Sequence[int], params: dict[str, Any]
) -> Any:
    """`reduce_max`, `reduce_min`, `reduce_prod`, `reduce_or` or `reduce_and` (what
    `jnp.any`/`jnp.all` bind) over dense dimensions only (each stored block reduced
    on its own, duplicates merged first): sparse, on `x`'s pattern. A position that
    is not stored holds a zero block, which reduces to zero (or `False`), so the
    pattern is exact. Over a batch or sparse dimension these read the
    zeros that are not stored: refused (naming `n_dense` when `x` has blocks), or
    dense with `allow_materialise`."""
    axes = tuple(axes)
    params = dict(params, axes=axes)
    n_index = x.n_batch + x.n_sparse
    on_blocks = all(a >= n_index for a in axes)
    # A block of size 0 reduces to the identity (`-inf`, `1`), not to zero.
    if not (x.n_dense and on_blocks and all(x.shape[a] for a in axes)):
        if x.n_dense:
            return _refuse_blocks(
                primitive,
                (x,),
                params,
                f"`{primitive.name}` keeps blocks only over dense dimensions of a "
                "nonzero size (each stored block reduced on its own); over a batch "
                "or sparse dimension it would read the zeros that are not stored",
            )
        return _fallback(primitive, (x,), params)
    x = unique(x)
    data = primitive.bind(x.data, **dict(params, axes=_block_axes(x, axes)))
    shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    return new_like(
        x,
        data,
        x.indices,
        shape,
        indices_sorted=x.indices_sorted,
        unique_indices=True,
    )


def _register_reduce_blocks(primitive: Primitive) -> None:
    @register(primitive, blocks=True)
    def _(x: BCOO, *, axes: Sequence[int], **params: Any) -> Any:
        return _reduce_blocks(primitive, x, axes, params)


for _p in (
    prims.reduce_max_p,
    prims.reduce_min_p,
    prims.reduce_prod_p,
    prims.reduce_or_p,
    prims.reduce_and_p,
):
    _register_reduce_blocks(_p)


# Against a zero: `max(x, 0)`, `min(x, 0)` (`jax.nn.relu`), and `x > 0`, `x < 0`,
# `x != 0` (`False` where `x` is zero: a bool mask), each the primitive it is with
# the zero first (`0 > x` is `x < 0`).
_AGAINST_ZERO = {
    prims.max_p: prims.max_p,
    prims.min_p: prims.min_p,
    prims.gt_p: prims.lt_p,
    prims.lt_p: prims.gt_p,
    prims.ne_p: prims.ne_p,
}


def _against_zero(
    primitive: Primitive, x: BCOO, zero: ArrayLike, params: dict[str, Any]
) -> Any:
    """`primitive` (of `_AGAINST_ZERO`) of `x` and a zero that is a constant of the
    program, on the stored values (duplicates merged first): sparse, on `x`'s
    pattern (a bool mask for a comparison). Against anything else it falls back
    (refused unless `x` allows materialising)."""
    if _broadcasts(x, zero) or not _zeros(zero):
        if x.n_dense:
            return _refuse_blocks(primitive, (x, zero), params)
        return _fallback(primitive, (x, zero), params)
    x = unique(x)
    return with_data(x, primitive.bind(x.data, jnp.zeros((), x.dtype), **params))


def _register_against_zero(primitive: Primitive) -> None:
    @register(primitive, blocks=True)
    def _(x: BCOO, y: ArrayLike, **params: Any) -> Any:
        return _against_zero(primitive, x, y, params)

    @register(primitive, blocks=True)
    def _(x: ArrayLike, y: BCOO, **params: Any) -> Any:
        return _against_zero(_AGAINST_ZERO[primitive], y, x, params)


for _p in _AGAINST_ZERO:
    _register_against_zero(_p)


@register(prims.broadcast_in_dim_p, blocks=True)
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
        return in_order(x, data, indices, shape)
    params = dict(params, shape=shape, broadcast_dimensions=dims)
    new = [d for d in range(len(shape)) if d not in dims]
    if same_sizes and all(shape[d] == 1 for d in new) and list(dims) == sorted(dims):
        # New axes of size 1 (`x[:, None]`): a zero index column each, or, after
        # the first dense dimension, an axis of size 1 in every block.
        y = unbatch(x)
        n_index = x.n_batch + x.n_sparse
        first_dense = dims[n_index] if x.n_dense else len(shape)
        data, indices = y.data, y.indices
        for d in new:  # increasing: the axes before `d` are already in place
            if d < first_dense:
                zeros = jnp.zeros((*indices.shape[:-1], 1), indices.dtype)
                indices = jnp.concatenate(
                    [indices[:, :d], zeros, indices[:, d:]], axis=-1
                )
            else:
                data = jnp.expand_dims(data, 1 + d - first_dense)
        return in_order(x, data, indices, shape)
    if x.n_dense:  # stretching an axis: refused as for scalar entries, or dense
        return _refuse_blocks(prims.broadcast_in_dim_p, (x,), params)
    return _fallback(prims.broadcast_in_dim_p, (x,), params)


def _block_axes(x: BCOO, dims: Sequence[int]) -> tuple[int, ...]:
    """The axes of `x.data` of the dense dimensions among `dims`."""
    n_index = x.n_batch + x.n_sparse
    return tuple(x.n_batch + 1 + d - n_index for d in dims if d >= n_index)


def _per_entry(mask: Array, data: Array) -> Array:
    """A mask of one boolean per stored entry (shape `(*batch, nse)`), broadcast
    over the blocks of `data`."""
    return mask.reshape(mask.shape + (1,) * (data.ndim - mask.ndim))


def _scalar_dense(x: BCOO) -> Any:
    """`x`, or its dense array where it has no dimensions left (`a[i, j]`): one
    element, the sum of its entries, which no sparse form stores more cheaply, and
    which JAX's own small-matrix formulas (`slogdet` and `det` of a 1 x 1 or 2 x 2
    matrix) pass on to functions (`log`) without a sparse rule."""
    return x.todense() if x.shape == () else x


@register(prims.squeeze_p, blocks=True)
def _(x: BCOO, *, dimensions: Sequence[int], **params: Any) -> Any:
    dims = tuple(sorted(d % x.ndim for d in dimensions))
    nb, n_index = x.n_batch, x.n_batch + x.n_sparse
    batch_dims = tuple(d for d in dims if d < nb)
    sparse_cols = [d - nb for d in dims if nb <= d < n_index]
    data = lax.squeeze(x.data, batch_dims + _block_axes(x, dims))
    indices = lax.squeeze(x.indices, batch_dims)
    if sparse_cols:
        # An entry whose dropped index is out of bounds is padding: zero its value.
        ok = valid_mask(indices[..., sparse_cols], [1] * len(sparse_cols))
        data = jnp.where(_per_entry(ok, data), data, 0)
        keep = [c for c in range(x.n_sparse) if c not in sparse_cols]
        indices = indices[..., keep]
    shape = tuple(s for i, s in enumerate(x.shape) if i not in dims)
    return _scalar_dense(in_order(x, data, indices, shape))


@register(prims.reshape_p, blocks=True)
def _(x: BCOO, *, new_sizes: Sequence[int], dimensions: Any, **params: Any) -> Any:
    """Reshapes the batch and sparse dimensions (each entry's row-major position
    split anew); the dense dimensions (blocks) must stay as they are, last."""
    new_sizes = tuple(new_sizes)
    nb, n_index, n_dense = x.n_batch, x.n_batch + x.n_sparse, x.n_dense
    params = dict(params, new_sizes=new_sizes, dimensions=dimensions)
    lead = new_sizes[: len(new_sizes) - n_dense]
    if n_dense and (
        new_sizes[len(lead) :] != x.dense_shape
        or math.prod(lead) != math.prod(x.shape[:n_index])
    ):
        return _refuse_blocks(
            prims.reshape_p,
            (x,),
            params,
            f"the reshape to {new_sizes} changes the dense dimensions (a reshape "
            f"keeps the blocks when it ends with their shape {x.dense_shape} and "
            "reshapes only the dimensions before them)",
        )
    batch = x.shape[:nb]
    if dimensions is not None or math.prod(x.shape[nb:n_index]) >= 2**31:
        return _fallback(prims.reshape_p, (x,), params)
    if lead[:nb] != batch:
        x, nb, batch = unbatch(x), 0, ()
    old, new = x.shape[nb:n_index], lead[nb:]
    data = x.data
    # Row-major position of each entry (int32 suffices: checked above), split anew.
    if math.prod(new) == 0:
        return new_like(
            x,
            data,
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
    if columns:
        indices = jnp.stack(columns[::-1], axis=-1).astype(x.indices.dtype)
        indices = jnp.where(ok[..., None], indices, jnp.asarray(new, x.indices.dtype))
    else:  # no sparse dimensions left: padding can only be a zero value
        indices = jnp.zeros((*x.indices.shape[:-1], 0), x.indices.dtype)
        data = jnp.where(_per_entry(ok, data), data, 0)
    return _scalar_dense(
        new_like(
            x,
            data,
            indices,
            new_sizes,
            indices_sorted=x.indices_sorted,
            unique_indices=x.unique_indices,
        )
    )


@register(prims.rev_p, blocks=True)
def _(x: BCOO, *, dimensions: Sequence[int], **params: Any) -> BCOO:
    nb, n_index = x.n_batch, x.n_batch + x.n_sparse
    data, indices = x.data, x.indices
    batch_dims = tuple(d for d in dimensions if d < nb)
    if batch_dims:
        indices = lax.rev(indices, batch_dims)
    if batch_dims or _block_axes(x, dimensions):
        data = lax.rev(data, batch_dims + _block_axes(x, dimensions))
    for d in dimensions:
        if nb <= d < n_index:
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
    nb, n_index = x.n_batch, x.n_batch + x.n_sparse
    data, indices = x.data, x.indices
    if nb:
        batch_starts = [jnp.asarray(s) for s in starts[:nb]]
        if any(st != 1 for st in strides[:nb]):
            x = unbatch(x)
            return _window(x, starts, sizes, strides)
        data = lax.dynamic_slice(
            data,
            [*batch_starts, *(0,) * (data.ndim - nb)],
            (*tuple(sizes[:nb]), *data.shape[nb:]),
        )
        indices = lax.dynamic_slice(
            indices, [*batch_starts, 0, 0], (*tuple(sizes[:nb]), x.nse, x.n_sparse)
        )
    # The dense dimensions: every block sliced alike.
    for d in range(n_index, x.ndim):
        axis, size, stride = nb + 1 + d - n_index, sizes[d], strides[d]
        extent = (size - 1) * stride + 1 if size else 0
        data = lax.dynamic_slice_in_dim(data, starts[d], extent, axis=axis)
        if stride != 1:
            data = lax.slice_in_dim(data, 0, extent, stride, axis=axis)
    if x.n_sparse == 0:
        return new_like(x, data, indices, tuple(sizes))
    start = jnp.stack([jnp.asarray(s, indices.dtype) for s in starts[nb:n_index]])
    stride = jnp.asarray(np.asarray(strides[nb:n_index]), indices.dtype)
    size = jnp.asarray(np.asarray(sizes[nb:n_index]), indices.dtype)
    shifted = indices - start
    inside = jnp.all(
        (shifted >= 0) & (shifted % stride == 0) & (shifted // stride < size), axis=-1
    )
    indices = jnp.where(inside[..., None], shifted // stride, size)
    data = jnp.where(_per_entry(inside, data), data, 0)
    return new_like(
        x,
        data,
        indices,
        tuple(sizes),
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


@register(prims.slice_p, blocks=True)
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


@register(prims.dynamic_slice_p, blocks=True)
def _(
    x: BCOO, *start_indices: ArrayLike, slice_sizes: Sequence[int], **params: Any
) -> BCOO:
    # As `lax.dynamic_slice`, starts are clamped so that the window fits.
    starts = [
        jnp.clip(jnp.asarray(s), 0, dim - size)
        for s, dim, size in zip(start_indices, x.shape, slice_sizes, strict=True)
    ]
    return _window(x, starts, tuple(slice_sizes), (1,) * x.ndim)


@register(prims.concatenate_p, blocks=True)
def _(*operands: BCOO, dimension: int, **params: Any) -> Any:
    # Entries of every operand, the concatenated axis's index shifted by the sizes
    # of the operands before it (batch axes become sparse ones first; operands
    # with more dense dimensions than another split their blocks, exactly).
    # Padding goes to the concatenated axis's size (the padding index of the result).
    n_dense = min(x.n_dense for x in operands)
    if dimension >= operands[0].ndim - n_dense:
        params = dict(params, dimension=dimension)
        return _refuse_blocks(
            prims.concatenate_p,
            operands,
            params,
            f"the concatenation is along dimension {dimension}, a dense dimension "
            "of the blocks (the operands' patterns differ, so their blocks cannot "
            "be joined entry by entry; concatenation keeps the blocks along batch "
            "and sparse dimensions)",
        )
    parts = [unbatch(x.update_layout(n_dense=n_dense)) for x in operands]
    total = sum(x.shape[dimension] for x in parts)
    offset = 0
    data, indices = [], []
    index_dtype = jnp.result_type(*(x.indices.dtype for x in parts))
    for x in parts:
        shifted = x.indices.astype(index_dtype)
        ok = valid_mask(shifted, x.shape[: x.n_sparse])
        column = jnp.where(ok, shifted[:, dimension] + offset, total)
        data.append(jnp.where(_per_entry(ok, x.data), x.data, 0))
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

    @register(primitive)
    def _(x: CSR, y: BCOO, **params: Any) -> Any:
        return quax.quaxify(primitive.bind)(*convert((x, y)), **params)

    @register(primitive)
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


# Direct solves ------------------------------------------------------------------------
#
# `lu` and `cholesky` of a sparse matrix factor it on the host (SuperLU, `_superlu`)
# and return a `SparseLU`; the pair of triangular solves that `lu_solve` and
# `cho_solve` bind with it is one solve with the matrix (`apply_inverse`),
# differentiable with respect to the right-hand side and the stored values.


def _refuse_factor(primitive: Primitive, x: BCOO, why: str) -> Any:
    if x.allow_materialise:
        return _fallback(primitive, (x,), {})
    raise x.materialisation_error(
        f"Refusing to materialise `BCOO` for primitive `{primitive.name}` on input "
        f"types (BCOO): quax-sparse factors a sparse matrix with SuperLU, but {why}. "
        + x.way_out(primitive)
    )


def _with_validity(factor: SparseLU, valid: Any, orientation: str) -> SparseLU:
    return SparseLU(
        factor.data,
        factor.indices,
        factor.handle,
        factor.pivots,
        factor.valid & valid,
        factor.n,
        factor.spd,
        orientation,
        factor.route,
    )


def _known_equal(x: Any, build: Callable[[Any], Any]) -> Any:
    """Whether `x` equals the constant `build(np)` when `x` can be read at trace
    time (a Python `bool`), else a traced check against `build(jnp)` (the
    comparison fuses with whatever computes `x` and the constant: time, no
    memory)."""
    known = quax.known_constant(x, max_size=np.size(x))
    if known is not None:
        return bool(np.all(known == build(np)))
    return jnp.all(jnp.asarray(x) == build(jnp))


@register(lax.linalg.lu_p)
def _(x: BCOO) -> Any:
    """`jnp.linalg.solve`, `slogdet`, `det`, `jax.scipy.linalg.lu_factor`: a
    `SparseLU`, with identity pivots and permutation (SuperLU's permutations live
    inside the factor)."""
    why = unfactorable(x)
    if why is not None:
        return _refuse_factor(lax.linalg.lu_p, x, why)
    iota = jnp.broadcast_to(jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape[:-1])
    return [factorise(x, spd=False, orientation="lu"), iota, iota]


@register(lax.linalg.cholesky_p)
def _(x: BCOO, **params: Any) -> Any:
    """`lax.linalg.cholesky`, `jax.scipy.linalg.cho_factor`: a `SparseLU` factored
    as symmetric positive definite (the matrix is taken as it is: `cholesky`
    symmetrises its input first unless told not to)."""
    why = unfactorable(x)
    if why is not None:
        return _refuse_factor(lax.linalg.cholesky_p, x, why)
    return factorise(x, spd=True, orientation="lower")


@register(prims.select_n_p)
def _(which: ArrayLike, zeros: ArrayLike, factor: SparseLU) -> Any:
    """The lower triangle of a Cholesky factor (`lax.linalg.cholesky` ends with
    `jnp.tril` of its output): the factor itself where the mask is the lower
    triangle and the other operand zeros. Read at trace time where they can be,
    else checked under `jit` (a fused `O(n²)` comparison, no memory): a failed
    check makes the factor's solves NaN. A factor that is not a Cholesky factor
    is refused."""
    n, shape = factor.n, factor.aval().shape
    if factor.orientation != "lower" or np.shape(which) != shape:
        raise factor.refusal(prims.select_n_p, (which, zeros, factor))
    lower = _known_equal(
        which, lambda xp: xp.broadcast_to(xp.tri(n, dtype=bool), shape)
    )
    zero = _known_equal(zeros, lambda xp: xp.zeros((), bool))
    if lower is False or zero is False:
        raise factor.materialisation_error(
            "Refusing to materialise `SparseLU` for primitive `select_n` on input "
            f"types ({type(which).__name__}, {type(zeros).__name__}, SparseLU): a "
            "sparse Cholesky factor keeps only its lower triangle against zeros "
            "(what `lax.linalg.cholesky` selects), and this selection is another: "
            "SuperLU's permuted triangles cannot be masked. "
            + factor.way_out(prims.select_n_p)
        )
    return _with_validity(factor, lower & zero, "lower")


@register(prims.mul_p)
def _(mask: ArrayLike, factor: SparseLU) -> Any:
    """The identity mask times a factor (`jnp.diagonal`'s branch for Pallas
    kernels, which `cond` traces beside the gather it runs): the diagonal, as a
    `BCOO`. Checked as `select_n` checks its mask."""
    n, shape = factor.n, factor.aval().shape
    if np.shape(mask) != shape:
        raise factor.refusal(prims.mul_p, (mask, factor))
    ok = _known_equal(mask, lambda xp: xp.broadcast_to(xp.eye(n, dtype=bool), shape))
    if ok is False:
        raise factor.refusal(prims.mul_p, (mask, factor))
    diagonal = jnp.where(ok, factor.diagonal(), jnp.nan)
    indices = jnp.stack([jnp.arange(n), jnp.arange(n)], axis=-1).astype(jnp.int32)
    indices = jnp.broadcast_to(indices, (*factor.batch_shape, n, 2))
    return BCOO._from_entries(
        diagonal, indices, shape, indices_sorted=True, unique_indices=True
    )


@register(prims.transpose_p)
def _(factor: SparseLU, *, permutation: Sequence[int]) -> Any:
    """The conjugate transpose of a real Cholesky factor (`cho_factor` with
    `lower=False` returns `conj(L.mT)`): the same factor, upper."""
    flipped = {"lower": "upper", "upper": "lower"}.get(factor.orientation)
    nb = len(factor.batch_shape)
    if flipped is None or tuple(permutation) != (*range(nb), nb + 1, nb):
        raise factor.refusal(prims.transpose_p, (factor,))
    if jnp.issubdtype(factor.data.dtype, jnp.complexfloating):
        # Lᵀ alone (without `conj`) is no Cholesky factor of a complex matrix.
        raise factor.refusal(prims.transpose_p, (factor,))
    return _with_validity(factor, True, flipped)


_TriangularSolve = tuple[bool, bool, bool, bool]


def _lu_pair(first: _TriangularSolve, second: _TriangularSolve) -> int | None:
    """Which system (0: `A`, 1: `Aᵀ`, 2: `Aᴴ`) two triangular solves with JAX's
    packed LU factor solve, in the order `lu_solve` binds them, or `None`. Each is
    `(lower, transpose_a, conjugate_a, unit_diagonal)`."""
    if first == (True, False, False, True) and second == (False, False, False, False):
        return 0
    for conj in (False, True):
        if first == (False, True, conj, False) and second == (True, True, conj, True):
            return 2 if conj else 1
    return None


def _cholesky_pair(
    orientation: str, first: _TriangularSolve, second: _TriangularSolve, real: bool
) -> bool:
    """Whether two triangular solves with a Cholesky factor (`L`, or `U = Lᴴ` when
    `orientation == "upper"`) solve with `A = L Lᴴ`: `L⁻ᴴ L⁻¹` (or `U⁻¹ U⁻ᴴ`)."""
    lower = orientation == "lower"
    (l1, t1, c1, u1), (l2, t2, c2, u2) = first, second
    if u1 or u2 or l1 != lower or l2 != lower:
        return False
    # `L y = b` then `Lᴴ x = y`; `Uᴴ y = b` then `U x = y`.
    if (t1, t2) != ((False, True) if lower else (True, False)):
        return False
    return real or (c1, c2) == (t1, t2)


def _solve_flags(factor: SparseLU, params: dict[str, Any]) -> _TriangularSolve:
    """`(lower, transpose_a, conjugate_a, unit_diagonal)` of a `triangular_solve`
    with a factor, refusing `left_side=False`."""
    if not params["left_side"]:
        raise factor.materialisation_error(
            "Refusing to materialise `SparseLU` for primitive `triangular_solve` "
            "with `left_side=False`: quax-sparse solves `op(A) x = b` with the "
            "factor's matrix on the left. Transpose the system (`solve(A.T, b.T).T`)"
            " or use `factor.solve(b)`."
        )
    names = ("lower", "transpose_a", "conjugate_a", "unit_diagonal")
    lower, transpose_a, conjugate_a, unit_diagonal = (bool(params[k]) for k in names)
    return lower, transpose_a, conjugate_a, unit_diagonal


@register(lax.linalg.triangular_solve_p)
def _(factor: SparseLU, b: ArrayLike, **params: Any) -> PendingSolve:
    """The first of the two triangular solves of `lu_solve` / `cho_solve`: held
    until the second (see `PendingSolve`)."""
    return PendingSolve(jnp.asarray(b), factor, _solve_flags(factor, params))


@register(lax.linalg.triangular_solve_p)
def _(factor: SparseLU, pending: PendingSolve, **params: Any) -> Array:
    """The second triangular solve: with the first, one solve with the matrix."""
    second = _solve_flags(factor, params)
    same = pending.factor.handle is factor.handle and pending.factor.n == factor.n
    trans = None
    if same and factor.orientation == "lu":
        trans = _lu_pair(pending.first, second)
    elif same:
        real = not jnp.issubdtype(factor.data.dtype, jnp.complexfloating)
        if _cholesky_pair(factor.orientation, pending.first, second, real):
            trans = 0
    if trans is None:
        raise factor.materialisation_error(
            "Refusing to materialise `SparseLU` for primitive `triangular_solve` on "
            "input types (SparseLU, PendingSolve): two triangular solves with a "
            "sparse factor are one solve with its matrix only in the order "
            "`jax.scipy.linalg.lu_solve` and `cho_solve` bind them, with the same "
            f"factor; got {pending.first} then {second} (lower, transpose_a, "
            f"conjugate_a, unit_diagonal) on a `{factor.orientation}` factor. "
            + factor.way_out(lax.linalg.triangular_solve_p)
        )
    return apply_inverse(factor, pending.rhs, trans)


@register(prims.gather_p)
def _(factor: SparseLU, indices: ArrayLike, **params: Any) -> Any:
    """`jnp.diagonal` of a factor (what `slogdet` and `det` read): the pivots, whose
    product is the determinant."""
    dnums = params["dimension_numbers"]
    n, batch = factor.n, factor.batch_shape
    nb = len(batch)
    if (
        tuple(dnums.offset_dims) == tuple(range(nb))
        and tuple(dnums.collapsed_slice_dims) == (nb, nb + 1)
        and tuple(dnums.start_index_map) == (nb, nb + 1)
        and not tuple(getattr(dnums, "operand_batching_dims", ()))
        and tuple(params["slice_sizes"]) == (*batch, 1, 1)
        and np.shape(indices) == (n, 2)
    ):
        # The positions `(i, i)`: read at trace time where they can be, else
        # checked at run time (`O(n)`); NaN where they are not the diagonal.
        ok = _known_equal(
            indices, lambda xp: xp.stack([xp.arange(n), xp.arange(n)], axis=-1)
        )
        if ok is not False:
            return jnp.where(ok, factor.diagonal(), jnp.nan)
    raise factor.refusal(prims.gather_p, (factor, indices))


# The right-hand side between the two triangular solves (`cho_solve` reshapes it:
# `b[:, None]`, then squeezes it back). The solve acts on the rows' axis alone (axis
# 0; after the batch axes for a batch of matrices), so an operation that keeps the
# batch axes and the rows' axis in place and only rearranges the others commutes
# with it: it applies to the right-hand side held.


def _on_pending(
    primitive: Primitive, pending: PendingSolve, keeps_rows: bool, params: Any
) -> PendingSolve:
    if not keeps_rows:
        raise pending.refusal(primitive, (pending,))
    rhs = primitive.bind(pending.rhs, **params)
    return PendingSolve(rhs, pending.factor, pending.first)


def _kept(pending: PendingSolve) -> int:
    """How many leading axes of the right-hand side must stay: the batch axes and
    the rows' axis."""
    return len(pending.factor.batch_shape) + 1


@register(prims.squeeze_p)
def _(pending: PendingSolve, *, dimensions: Sequence[int]) -> PendingSolve:
    dims = tuple(d % pending.rhs.ndim for d in dimensions)
    keeps = all(d >= _kept(pending) for d in dims)
    return _on_pending(prims.squeeze_p, pending, keeps, dict(dimensions=dims))


@register(prims.broadcast_in_dim_p)
def _(
    pending: PendingSolve,
    *,
    shape: Sequence[int],
    broadcast_dimensions: Sequence[int],
    **params: Any,
) -> PendingSolve:
    dims, k = tuple(broadcast_dimensions), _kept(pending)
    keeps = dims[:k] == tuple(range(k)) and tuple(shape[:k]) == pending.rhs.shape[:k]
    params = dict(params, shape=tuple(shape), broadcast_dimensions=dims)
    return _on_pending(prims.broadcast_in_dim_p, pending, keeps, params)


@register(prims.reshape_p)
def _(
    pending: PendingSolve, *, new_sizes: Sequence[int], dimensions: Any, **params: Any
) -> PendingSolve:
    # Row-major: equal leading sizes keep those axes.
    new_sizes, k = tuple(new_sizes), _kept(pending)
    keeps = dimensions is None and new_sizes[:k] == pending.rhs.shape[:k]
    params = dict(params, new_sizes=new_sizes, dimensions=dimensions)
    return _on_pending(prims.reshape_p, pending, keeps, params)


# BlockSparse --------------------------------------------------------------------------
#
# A matrix of dense blocks (or a batch of them): products with a dense operand that
# contract one of its two matrix dimensions, its transpose, the linear functions of
# its values, and scaling by a dense operand read at the blocks. Everything else
# refuses (the core's policy), naming the primitive.


def _with_blocks(x: BlockSparse, data: Array) -> BlockSparse:
    """`x` with other blocks at the same positions."""
    return BlockSparse._from_blocks(data, x.indices, x.shape, x.allow_materialise)


def _refuse_block_case(
    primitive: Primitive,
    values: Sequence[Any],
    params: dict[str, Any],
    why: str,
) -> Any:
    """A case of a `BlockSparse` rule that it does not keep: refused, saying why
    and the way out, unless every `BlockSparse` operand allows materialising (then
    the fallback computes it densely)."""
    blocked = [v for v in values if isinstance(v, BlockSparse)]
    if all(v.allow_materialise for v in blocked):
        return _fallback(primitive, values, params)
    x = next(v for v in blocked if not v.allow_materialise)
    types = ", ".join(type(v).__qualname__ for v in values)
    raise x.materialisation_error(
        f"Refusing to materialise `BlockSparse` for primitive `{primitive.name}` on "
        f"input types ({types}): {why}. " + x.way_out(primitive)
    )


def _dot_block_dense(
    s: BlockSparse,
    d: ArrayLike,
    dimension_numbers: Any,
    sparse_is_lhs: bool,
    params: Any,
) -> Any:
    """`dot_general` of a `BlockSparse` `s` and a dense `d` (`sparse_is_lhs` says
    which is the left operand), dense: one of the two matrix dimensions of `s`
    contracted with one dimension of `d`, and any batch dimensions of `s`
    batched with dimensions of `d` or left free. Each matrix is `dot_blocks`'s
    product (its transpose's, when its rows are contracted), mapped over the
    batch dimensions."""
    (l_contract, r_contract), (l_batch, r_batch) = dimension_numbers
    s_contract, s_batch = (
        (l_contract, l_batch) if sparse_is_lhs else (r_contract, r_batch)
    )
    d_contract, d_batch = (
        (r_contract, r_batch) if sparse_is_lhs else (l_contract, l_batch)
    )
    nb = s.n_batch
    if len(s_contract) != 1 or s_contract[0] < nb or any(i >= nb for i in s_batch):
        return _refuse_block_case(
            lax.dot_general_p,
            (s, d) if sparse_is_lhs else (d, s),
            dict(params, dimension_numbers=dimension_numbers),
            f"the product with dimension numbers {dimension_numbers} contracts "
            f"{len(s_contract)} dimensions of the BlockSparse of shape {s.shape} "
            "or pairs one of its matrix dimensions as a batch one; its rule "
            "contracts exactly one of its two matrix dimensions (`a @ v`, `v @ a`)",
        )
    d = jnp.asarray(d)
    out_dtype = _out_dtype(s, d, params.get("preferred_element_type"))
    precision = params.get("precision")
    contract_rows = s_contract[0] == nb
    unpaired = [i for i in range(nb) if i not in s_batch]
    # The batched dimensions of both first, in their pairs' order; then the
    # unpaired ones of `s`, then its blocks.
    order = (*s_batch, *unpaired)
    data = jnp.transpose(s.data, (*order, nb, nb + 1, nb + 2))
    indices = jnp.transpose(s.indices, (*order, nb, nb + 1))
    d_order = (*d_batch, *(i for i in range(d.ndim) if i not in d_batch))
    d = jnp.transpose(d, d_order)
    contracted = d_order.index(d_contract[0]) - len(d_batch)
    rows, cols = s.grid
    grid = (cols, rows) if contract_rows else (rows, cols)

    def product(data: Array, indices: Array, x: Array) -> Array:
        if contract_rows:  # `Aᵀ x`: the transposed blocks at the swapped positions
            data, indices = jnp.swapaxes(data, 1, 2), indices[:, ::-1]
        free = x.shape[:contracted] + x.shape[contracted + 1 :]
        x = jnp.moveaxis(x, contracted, 0).reshape(x.shape[contracted], -1)
        y = dot_blocks(
            data,
            indices,
            grid,
            x,
            out_dtype=out_dtype,
            precision=precision,
        )
        y = y.reshape((y.shape[0], *free))
        return y if sparse_is_lhs else jnp.moveaxis(y, 0, -1)

    for _ in unpaired:
        product = jax.vmap(product, in_axes=(0, 0, None))
    for _ in s_batch:
        product = jax.vmap(product)
    out = product(data, indices, d)
    if not sparse_is_lhs and unpaired:
        # `dot_general` puts the dense operand's free dimensions before those of
        # `s` (its unpaired batch dimensions, then its free matrix dimension).
        k, u = len(s_batch), len(unpaired)
        d_free = tuple(range(k + u, out.ndim - 1))
        out = jnp.transpose(out, (*range(k), *d_free, *range(k, k + u), out.ndim - 1))
    return out


@quax.register(lax.dot_general_p)
def _(
    lhs: BlockSparse, rhs: ArrayLike, *, dimension_numbers: Any, **params: Any
) -> Any:
    return _dot_block_dense(lhs, rhs, dimension_numbers, True, params)


@quax.register(lax.dot_general_p)
def _(
    lhs: ArrayLike, rhs: BlockSparse, *, dimension_numbers: Any, **params: Any
) -> Any:
    return _dot_block_dense(rhs, lhs, dimension_numbers, False, params)


@quax.register(prims.transpose_p)
def _(x: BlockSparse, *, permutation: Sequence[int], **params: Any) -> Any:
    """A permutation of the batch dimensions among themselves, the two matrix
    dimensions kept last (in either order: `a.T` transposes every block and swaps
    the block positions)."""
    perm, nb = tuple(permutation), x.n_batch
    if tuple(sorted(perm[:nb])) != tuple(range(nb)):
        return _refuse_block_case(
            prims.transpose_p,
            (x,),
            dict(params, permutation=perm),
            f"the permutation {perm} moves a matrix dimension among the batch ones "
            "(a transpose of a BlockSparse keeps its two matrix dimensions last)",
        )
    data = jnp.transpose(x.data, (*perm[:nb], nb, nb + 1, nb + 2))
    indices = jnp.transpose(x.indices, (*perm[:nb], nb, nb + 1))
    if perm[nb:] == (nb + 1, nb):
        data, indices = jnp.swapaxes(data, -1, -2), indices[..., ::-1]
    shape = tuple(x.shape[p] for p in perm)
    return BlockSparse._from_blocks(data, indices, shape, x.allow_materialise)


@quax.register_elementwise([prims.neg_p, prims.conj_p, prims.real_p, prims.imag_p])
def _(primitive: Primitive, x: BlockSparse, **params: Any) -> BlockSparse:
    # Linear: blocks stored twice at one position may stay apart.
    return _with_blocks(x, primitive.bind(x.data, **params))


@quax.register(prims.convert_element_type_p)
def _(x: BlockSparse, *, new_dtype: Any, **params: Any) -> Any:
    # To a floating or complex type: exact enough to apply to each block alone. To
    # an integer or bool it rounds, which blocks stored twice at one position would
    # need merged first: refused.
    params = dict(params, new_dtype=new_dtype)
    if not jnp.issubdtype(new_dtype, jnp.inexact):
        return _refuse_block_case(
            prims.convert_element_type_p,
            (x,),
            params,
            f"a conversion to {np.dtype(new_dtype)} rounds each element, and "
            "blocks stored at one position would round apart",
        )
    params["sharding"] = None  # the dense output's sharding does not apply to `data`
    return _with_blocks(x, prims.convert_element_type_p.bind(x.data, **params))


@quax.register(prims.copy_p)
def _(x: BlockSparse, **params: Any) -> BlockSparse:
    return x


def _scale_blocks(
    primitive: Primitive, x: BlockSparse, y: ArrayLike, y_first: bool, params: Any
) -> Any:
    """`x * y` or `x / y` (`y * x` if `y_first`) with a dense `y` that does not
    stretch `x` (a scalar, an array of `x`'s shape, or axes of size 1 that
    broadcast): `y` read at the stored blocks. The elements outside them are exact
    zeros (`0 * inf` is 0 there, as for `BCOO`)."""
    y = jnp.asarray(y)
    y = y.reshape((1,) * (x.ndim - y.ndim) + y.shape)
    if tuple(np.broadcast_shapes(x.shape, y.shape)) != x.shape:
        return _refuse_block_case(
            primitive,
            (y, x) if y_first else (x, y),
            params,
            f"it would broadcast the BlockSparse of shape {x.shape} to "
            f"{tuple(np.broadcast_shapes(x.shape, y.shape))}",
        )
    grid, block_shape = x.grid, x.block_shape

    def read(y: Array, indices: Array) -> Array:
        return read_blocks(y, indices, grid, block_shape)

    # Over the batch dimensions (the outermost map over the first): `y` mapped
    # where it has the batch size, its axes of size 1 dropped and held.
    mapped = [y.shape[d] != 1 for d in range(x.n_batch)]
    for along in reversed(mapped):
        read = jax.vmap(read, in_axes=(0 if along else None, 0))
    held = [d for d, along in enumerate(mapped) if not along]
    factor = read(jnp.squeeze(y, held), x.indices)
    args = (factor, x.data) if y_first else (x.data, factor)
    return _with_blocks(x, primitive.bind(*args, **params))


@quax.register(prims.mul_p)
def _(x: BlockSparse, y: ArrayLike, **params: Any) -> Any:
    return _scale_blocks(prims.mul_p, x, y, False, params)


@quax.register(prims.mul_p)
def _(y: ArrayLike, x: BlockSparse, **params: Any) -> Any:
    return _scale_blocks(prims.mul_p, x, y, True, params)


@quax.register(prims.div_p)
def _(x: BlockSparse, y: ArrayLike, **params: Any) -> Any:
    return _scale_blocks(prims.div_p, x, y, False, params)
