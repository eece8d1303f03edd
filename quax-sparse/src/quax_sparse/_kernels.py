"""The sparse kernels: gathers and scatter-adds over the stored entries, never a
dense array of the sparse operand's shape."""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import quax
from jaxtyping import Array

from ._values._bcoo import BCOO, flat_entries, gather, scatter_add


__all__ = [
    "dot_sparse_dense",
    "dot_sparse_sparse",
    "new_like",
    "sum_duplicates",
    "transpose_matrix",
    "unbatch",
    "unique",
    "valid_mask",
]


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
    coords, values = flat_entries(x)
    return new_like(
        x,
        values,
        coords,
        x.shape,
        indices_sorted=x.indices_sorted,
        unique_indices=x.unique_indices,
    )


def valid_mask(indices: Array, sparse_shape: Sequence[int]) -> Array:
    """Which entries are inside the bounds (not padding)."""
    bound = jnp.asarray(np.asarray(sparse_shape, dtype=np.int64), indices.dtype)
    return jnp.all((indices >= 0) & (indices < bound), axis=-1)


# sum_duplicates -----------------------------------------------------------------------


def _sum_duplicates_one(
    data: Array,
    indices: Array,
    sparse_shape: tuple[int, ...],
    nse: int,
    is_sorted: bool,
) -> tuple[Array, Array]:
    n_sparse = indices.shape[-1]
    fill = jnp.asarray(np.asarray(sparse_shape, dtype=np.int64), indices.dtype)
    if data.shape[0] == 0:
        return (
            jnp.zeros((nse,), data.dtype),
            jnp.broadcast_to(fill, (nse, n_sparse)).astype(indices.dtype),
        )
    if not is_sorted and n_sparse > 0:
        order = jnp.lexsort(tuple(indices[:, d] for d in reversed(range(n_sparse))))
        indices, data = indices[order], data[order]
    valid = valid_mask(indices, sparse_shape)
    differs = jnp.any(indices[1:] != indices[:-1], axis=-1)
    new = jnp.concatenate([jnp.ones((1,), bool), differs]) & valid
    group = jnp.where(valid, jnp.cumsum(new) - 1, nse)
    # Bools add by logical or, as JAX adds them (XLA has no bool scatter-add).
    segment = jax.ops.segment_max if data.dtype == jnp.bool_ else jax.ops.segment_sum
    out_data = segment(data, group, num_segments=nse, indices_are_sorted=True)
    out_indices = (
        jnp.broadcast_to(fill, (nse, n_sparse))
        .astype(indices.dtype)
        .at[group]
        .set(indices, mode="drop")
    )
    return out_data, out_indices


def sum_duplicates(x: BCOO, nse: int) -> BCOO:
    """See [`quax_sparse.BCOO.sum_duplicates`][]."""
    sparse_shape = x.shape[x.n_batch :]

    def one(data: Array, indices: Array) -> tuple[Array, Array]:
        return _sum_duplicates_one(data, indices, sparse_shape, nse, x.indices_sorted)

    f = one
    for _ in range(x.n_batch):
        f = jax.vmap(f)
    data, indices = f(x.data, x.indices)
    return new_like(x, data, indices, x.shape, indices_sorted=True, unique_indices=True)


def unique(x: BCOO) -> BCOO:
    """`x` with no position stored twice (what a nonlinear elementwise function
    needs): `x` itself when known, else `sum_duplicates` with the same `nse`."""
    return x if x.unique_indices else sum_duplicates(x, x.nse)


# dot_general --------------------------------------------------------------------------


def dot_sparse_dense(
    s: BCOO,
    d: Array,
    dimension_numbers: Any,
    *,
    sparse_is_lhs: bool,
    out_dtype: Any,
) -> Array:
    """`dot_general` of a sparse and a dense operand, for any dimension numbers.

    Each stored entry reads the slice of `d` at its contracted and batch coordinates
    (a gather, shape `(N, *d_free)`), scales it by its value, and adds it into the
    output at its free and batch coordinates (a scatter-add). The cost is
    `O(N * prod(d_free))`; the only dense array is the output."""
    (l_contract, r_contract), (l_batch, r_batch) = dimension_numbers
    if sparse_is_lhs:
        s_contract, d_contract, s_batch, d_batch = (
            l_contract,
            r_contract,
            l_batch,
            r_batch,
        )
    else:
        s_contract, d_contract, s_batch, d_batch = (
            r_contract,
            l_contract,
            r_batch,
            l_batch,
        )
    s_contract, d_contract = tuple(s_contract), tuple(d_contract)
    s_batch, d_batch = tuple(s_batch), tuple(d_batch)
    coords, values = flat_entries(s)
    s_free = tuple(i for i in range(s.ndim) if i not in s_contract + s_batch)
    d_free = tuple(i for i in range(d.ndim) if i not in d_contract + d_batch)
    d_read = d_batch + d_contract
    if d_read:
        slices = gather(d, coords[:, s_batch + s_contract], d_read)
    else:
        slices = jnp.broadcast_to(d, (values.shape[0], *d.shape))
    contrib = values.astype(out_dtype).reshape(
        (-1,) + (1,) * len(d_free)
    ) * slices.astype(out_dtype)
    batch_shape = tuple(s.shape[i] for i in s_batch)
    s_free_shape = tuple(s.shape[i] for i in s_free)
    d_free_shape = tuple(d.shape[i] for i in d_free)
    nb, nsf, ndf = len(s_batch), len(s_free), len(d_free)
    if sparse_is_lhs:
        out_shape = batch_shape + s_free_shape + d_free_shape
        out_dims = tuple(range(nb + nsf))
    else:
        out_shape = batch_shape + d_free_shape + s_free_shape
        out_dims = tuple(range(nb)) + tuple(range(nb + ndf, nb + ndf + nsf))
    write = s_batch + s_free
    in_order = s.indices_sorted and write == tuple(range(len(write)))
    out = jnp.zeros(out_shape, out_dtype)
    return scatter_add(out, coords[:, write], out_dims, contrib, sorted_=in_order)


def _pair_count(a: BCOO, b: BCOO) -> int:
    """A static bound on the number of products of `a @ b` (matrices): the exact
    count when the indices are known now, else the worst case."""
    # Through `quax.known_constant`: where quax compiles eager code, the indices are
    # tracers that equation by equation would be known, and the code runs so.
    ai = quax.known_constant(a.indices, np.size(a.indices))
    bi = quax.known_constant(b.indices, np.size(b.indices))
    if ai is None or bi is None:  # only the worst case is known
        bound = a.nse * b.nse
        if b.unique_indices:
            bound = min(bound, a.nse * b.shape[1])
        if a.unique_indices:
            bound = min(bound, b.nse * a.shape[0])
        return bound
    a_ok = np.all((ai >= 0) & (ai < np.asarray(a.shape)), axis=1)
    b_ok = np.all((bi >= 0) & (bi < np.asarray(b.shape)), axis=1)
    per_row = np.bincount(bi[b_ok, 0], minlength=b.shape[0])
    return int(per_row[ai[a_ok, 1]].sum())


def dot_sparse_sparse(a: BCOO, b: BCOO, out_dtype: Any) -> BCOO:
    """The matrix product `a @ b` of two sparse matrices (no batch dimensions), as a
    sparse matrix holding one entry per product `a[i, k] * b[k, j]` (duplicates not
    summed; call `sum_duplicates` to merge them).

    Its `nse` is the number of such products when the indices are concrete at trace
    time, else the static bound `nse(a) * nse(b)`, lowered to `nse(a) * m` when `b`
    has unique indices and to `nse(b) * n` when `a` has: the unused entries are
    padding. Each entry of `a` is paired with the run of `b`'s entries in its column's
    row (`b` sorted by row once)."""
    n, k = a.shape
    m = b.shape[1]
    count = _pair_count(a, b)
    index_dtype = jnp.promote_types(a.indices.dtype, b.indices.dtype)
    fill = jnp.asarray([n, m], index_dtype)
    if count == 0 or a.nse == 0 or b.nse == 0:
        return BCOO._from_entries(
            jnp.zeros((0,), out_dtype),
            jnp.zeros((0, 2), index_dtype),
            (n, m),
            a.allow_materialise and b.allow_materialise,
        )
    a_ok = valid_mask(a.indices, a.shape)
    b_ok = valid_mask(b.indices, b.shape)
    b_row = jnp.where(b_ok, b.indices[:, 0], k)
    order = jnp.argsort(b_row, stable=True)
    b_row_sorted = b_row[order]
    rows = jnp.arange(k, dtype=b_row.dtype)
    start = jnp.searchsorted(b_row_sorted, rows, side="left")
    per_row = jnp.searchsorted(b_row_sorted, rows, side="right") - start
    a_col = jnp.where(a_ok, a.indices[:, 1], 0)
    per_entry = jnp.where(a_ok, per_row[a_col], 0)
    ends = jnp.cumsum(per_entry)
    p = jnp.arange(count, dtype=ends.dtype)
    entry = jnp.minimum(jnp.searchsorted(ends, p, side="right"), a.nse - 1)
    offset = p - (ends[entry] - per_entry[entry])
    partner = order[jnp.clip(start[a_col[entry]] + offset, 0, b.nse - 1)]
    used = p < ends[-1]
    out_indices = jnp.where(
        used[:, None],
        jnp.stack([a.indices[entry, 0], b.indices[partner, 1]], axis=-1).astype(
            index_dtype
        ),
        fill,
    )
    out_data = jnp.where(
        used, a.data[entry].astype(out_dtype) * b.data[partner].astype(out_dtype), 0
    )
    return BCOO._from_entries(
        out_data,
        out_indices,
        (n, m),
        a.allow_materialise and b.allow_materialise,
    )


def transpose_matrix(x: BCOO) -> BCOO:
    """The transpose of an unbatched sparse matrix (index columns swapped)."""
    return new_like(
        x, x.data, x.indices[:, ::-1], x.shape[::-1], unique_indices=x.unique_indices
    )
