"""The sparse kernels, on plain arrays: gathers and scatter-adds over the stored
entries, merging duplicates, and the products; never a dense array of the sparse
operand's shape.

A sparse operand comes as a `BCOO` stores it: `data` of shape `(*batch, nse)` and
`indices` of shape `(*batch, nse, n_sparse)`, each index in `[0, n]` along a
dimension of size `n` (`n`, or anything outside `[0, n)`, is padding), with its shape
and what is known of its entries. The value types and the rules wrap the results."""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import quax
from jax import lax
from jaxtyping import Array


__all__ = [
    "blocks_of",
    "dot_blocks",
    "dot_blocks_dense",
    "dot_sparse_dense",
    "dot_sparse_sparse",
    "flat_entries",
    "gather",
    "read_blocks",
    "scatter_add",
    "scatter_blocks",
    "sum_duplicates",
    "valid_mask",
]


def flat_entries(data: Array, indices: Array) -> tuple[Array, Array]:
    """Every stored entry of a sparse array (`data` of shape `(*batch, nse,
    *dense)`, `indices` of shape `(*batch, nse, n_sparse)`) with its position in
    the batch and sparse dimensions (batch coordinates first): `coords` of shape
    `(N, n_batch + n_sparse)` and `values` of shape `(N, *dense)`,
    `N = prod(batch) * nse`."""
    nb = indices.ndim - 2
    dense = data.shape[nb + 1 :]
    if nb == 0:
        return indices, data
    entries = indices.shape[:-1]
    grids = jnp.meshgrid(
        *[jnp.arange(b, dtype=indices.dtype) for b in entries[:-1]], indexing="ij"
    )
    batch_coords = [jnp.broadcast_to(g[..., None], entries) for g in grids]
    coords = jnp.concatenate(
        [jnp.stack(batch_coords, axis=-1), indices.astype(indices.dtype)], axis=-1
    )
    return coords.reshape(-1, nb + indices.shape[-1]), data.reshape(-1, *dense)


def gather(operand: Array, coords: Array, dims: tuple[int, ...]) -> Array:
    """`operand` read at `coords` (shape `(N, len(dims))`, positions along `dims`),
    keeping its other axes whole: shape `(N, *rest)`. Out-of-bounds positions (the
    padding) read zeros."""
    rest = [d for d in range(operand.ndim) if d not in dims]
    slice_sizes = tuple(
        1 if d in dims else operand.shape[d] for d in range(operand.ndim)
    )
    dnums = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(1, 1 + len(rest))),
        collapsed_slice_dims=tuple(sorted(dims)),
        start_index_map=tuple(dims),
    )
    return lax.gather(
        operand,
        coords,
        dnums,
        slice_sizes,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
        fill_value=0,
    )


def scatter_add(
    operand: Array,
    coords: Array,
    dims: tuple[int, ...],
    updates: Array,
    *,
    sorted_: bool = False,
) -> Array:
    """`operand` plus `updates` (shape `(N, *rest)`) added at `coords` (positions
    along `dims`; the other axes of `operand` whole). Out-of-bounds positions (the
    padding) are dropped. `sorted_` promises that `coords` are in row-major order.
    Bools add as JAX adds them, by logical or (a scatter-max: XLA has no bool
    scatter-add)."""
    rest = [d for d in range(operand.ndim) if d not in dims]
    if not dims:
        return operand + updates.sum(axis=0).astype(operand.dtype)
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=tuple(range(1, 1 + len(rest))),
        inserted_window_dims=tuple(sorted(dims)),
        scatter_dims_to_operand_dims=tuple(dims),
    )
    scatter = lax.scatter_max if operand.dtype == jnp.bool_ else lax.scatter_add
    return scatter(
        operand,
        coords,
        updates.astype(operand.dtype),
        dnums,
        indices_are_sorted=sorted_,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
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
            jnp.zeros((nse, *data.shape[1:]), data.dtype),
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


def sum_duplicates(
    data: Array,
    indices: Array,
    sparse_shape: Sequence[int],
    nse: int,
    *,
    is_sorted: bool,
) -> tuple[Array, Array]:
    """The entries of each batch element merged by position, sorted, padding last
    (see [`quax_sparse.BCOO.sum_duplicates`][]).

    **Arguments:**

    - `data`, `indices`: the entries, as a `BCOO` stores them (blocks of dense
        dimensions included: each position's blocks add up).
    - `sparse_shape`: the sizes of the sparse dimensions.
    - `nse`: the number of entries of the result per batch element.
    - `is_sorted`: whether the positions are known to be in row-major order.

    **Returns:**

    `(data, indices)` with `nse` entries per batch element, sorted and unique.
    """
    sparse_shape = tuple(sparse_shape)

    def one(data: Array, indices: Array) -> tuple[Array, Array]:
        return _sum_duplicates_one(data, indices, sparse_shape, nse, is_sorted)

    f = one
    for _ in range(indices.ndim - 2):
        f = jax.vmap(f)
    return f(data, indices)


# dot_general --------------------------------------------------------------------------


def _split_dimension_numbers(
    dimension_numbers: Any, sparse_is_lhs: bool
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """`(s_contract, d_contract, s_batch, d_batch)`: the dimension numbers of the
    sparse operand and of the dense one."""
    (l_contract, r_contract), (l_batch, r_batch) = dimension_numbers
    if sparse_is_lhs:
        parts = (l_contract, r_contract, l_batch, r_batch)
    else:
        parts = (r_contract, l_contract, r_batch, l_batch)
    s_contract, d_contract, s_batch, d_batch = (tuple(p) for p in parts)
    return s_contract, d_contract, s_batch, d_batch


def dot_sparse_dense(
    data: Array,
    indices: Array,
    shape: Sequence[int],
    d: Array,
    dimension_numbers: Any,
    *,
    sparse_is_lhs: bool,
    out_dtype: Any,
    indices_sorted: bool,
) -> Array:
    """`dot_general` of a sparse and a dense operand, for any dimension numbers,
    as a dense array (see `dot_blocks_dense` for a product that pairs only dense
    dimensions of the sparse operand: that one is sparse).

    Each stored entry reads the slice of `d` at its contracted and batch coordinates
    (a gather, shape `(N, *d_rest)`), multiplies it with its value, and adds the
    product into the output at its free and batch coordinates (a scatter-add). The
    cost is `O(N * prod(d_rest))`; the only dense array is the output. A sparse
    operand with dense dimensions (blocks) may contract or batch those too: each
    entry's product is then a `dot_general` of its block and its slice of `d` (an
    outer product where the dense dimensions are all free).

    **Arguments:**

    - `data`, `indices`, `shape`: the sparse operand, as a `BCOO` stores it.
    - `d`: the dense operand.
    - `dimension_numbers`: as for `lax.dot_general`.
    - `sparse_is_lhs`: whether the sparse operand is the left one.
    - `out_dtype`: the dtype of the product.
    - `indices_sorted`: whether the sparse positions are in row-major order.

    **Returns:**

    The dense product.
    """
    s_contract, d_contract, s_batch, d_batch = _split_dimension_numbers(
        dimension_numbers, sparse_is_lhs
    )
    coords, values = flat_entries(data, indices)
    block = values.shape[1:]  # the dense dimensions' sizes: () without blocks
    n_index = len(shape) - len(block)  # batch and sparse dimensions
    s_paired, d_paired = s_batch + s_contract, d_batch + d_contract
    s_read = tuple(s for s in s_paired if s < n_index)
    d_read = tuple(j for s, j in zip(s_paired, d_paired, strict=True) if s < n_index)
    if d_read:
        slices = gather(d, coords[:, s_read], d_read)  # (N, *d_rest)
    else:
        slices = jnp.broadcast_to(d, (values.shape[0], *d.shape))
    d_rest = tuple(j for j in range(d.ndim) if j not in d_read)
    s_free = tuple(i for i in range(n_index) if i not in s_paired)
    block_free = tuple(i for i in range(n_index, len(shape)) if i not in s_paired)
    d_free = tuple(j for j in range(d.ndim) if j not in d_paired)
    s_batch_index = tuple(i for i in s_batch if i < n_index)
    batch_shape = tuple(shape[i] for i in s_batch)
    s_free_shape = tuple(shape[i] for i in s_free)
    block_free_shape = tuple(shape[i] for i in block_free)
    d_free_shape = tuple(d.shape[j] for j in d_free)
    nb, nsf, ndf = len(s_batch), len(s_free), len(d_free)
    values = values.astype(out_dtype)
    slices = slices.astype(out_dtype)
    # Each entry's product, its axes those of the output other than the batch and
    # sparse ones it is written at: the batched dense dimensions (in the order of
    # the batch dimension numbers), then the free ones of each operand in turn.
    if len(s_read) == len(s_paired):  # blocks all free: an outer product
        if sparse_is_lhs:
            contrib = values.reshape((-1, *block) + (1,) * ndf) * slices.reshape(
                (-1,) + (1,) * len(block) + d_free_shape
            )
        else:
            contrib = slices.reshape(
                (-1, *d_free_shape) + (1,) * len(block)
            ) * values.reshape((-1,) + (1,) * ndf + block)
    else:  # a `dot_general` of each block with its slice of `d`
        v_axis = {i: 1 + i - n_index for i in range(n_index, len(shape))}
        s_axis = {j: 1 + d_rest.index(j) for j in d_rest}

        def axes(s_dims: tuple[int, ...], d_dims: tuple[int, ...]) -> Any:
            pairs = zip(s_dims, d_dims, strict=True)
            kept = [(v_axis[i], s_axis[j]) for i, j in pairs if i >= n_index]
            return tuple(v for v, _ in kept), tuple(t for _, t in kept)

        v_c, s_c = axes(s_contract, d_contract)
        v_b, s_b = axes(s_batch, d_batch)
        v_b, s_b = (0, *v_b), (0, *s_b)  # the entries
        if sparse_is_lhs:
            numbers = ((v_c, s_c), (v_b, s_b))
            contrib = lax.dot_general(values, slices, numbers)
        else:
            numbers = ((s_c, v_c), (s_b, v_b))
            contrib = lax.dot_general(slices, values, numbers)
    if sparse_is_lhs:  # the output's free axes: the sparse operand's, then `d`'s
        out_shape = batch_shape + s_free_shape + block_free_shape + d_free_shape
        free_dims = tuple(range(nb, nb + nsf))
    else:
        out_shape = batch_shape + d_free_shape + s_free_shape + block_free_shape
        free_dims = tuple(range(nb + ndf, nb + ndf + nsf))
    out_dims = tuple(s_batch.index(i) for i in s_batch_index) + free_dims
    write = s_batch_index + s_free
    in_order = indices_sorted and write == tuple(range(len(write)))
    out = jnp.zeros(out_shape, out_dtype)
    return scatter_add(out, coords[:, write], out_dims, contrib, sorted_=in_order)


def dot_blocks_dense(
    data: Array,
    n_batch: int,
    n_index: int,
    d: Array,
    dimension_numbers: Any,
    *,
    sparse_is_lhs: bool,
    out_dtype: Any,
) -> Array:
    """The blocks of `dot_general` of a sparse operand with dense dimensions and a
    dense operand that contracts or batches only dense dimensions of the sparse
    one (`a @ w` with `a` of shape `(n, m, f)` and `w` of shape `(f, g)`): the
    product is sparse, on the sparse operand's pattern, each stored block
    multiplied with `d`. Positions not stored hold zero blocks, whose product is
    zero. The cost is one `dot_general` of `data` with `d`: `O(nse * f * g)`.

    **Arguments:**

    - `data`: the sparse operand's stored blocks, shape `(*batch, nse, *block)`.
    - `n_batch`: its number of batch dimensions.
    - `n_index`: its number of batch and sparse dimensions.
    - `d`: the dense operand.
    - `dimension_numbers`: as for `lax.dot_general` on the sparse operand's shape
        (`(*batch, *sparse, *block)`); every contracted or batched dimension of the
        sparse operand is a dense one.
    - `sparse_is_lhs`: whether the sparse operand is the left one.
    - `out_dtype`: the dtype of the product.

    **Returns:**

    The product's stored blocks, shape `(*lead, *batch, nse, *out_block)`: the
    output of `dot_general` is `(*lead, *batch, *sparse, *out_block)`, where `lead`
    holds the batched dense dimensions and, if the sparse operand is the right
    one, the free dimensions of `d` (new batch dimensions of the result: the
    pattern is the same for each), and `out_block` the free dense dimensions, then
    those of `d` if the sparse operand is the left one.
    """
    s_contract, d_contract, s_batch, d_batch = _split_dimension_numbers(
        dimension_numbers, sparse_is_lhs
    )
    axis = {i: n_batch + 1 + i - n_index for i in s_contract + s_batch}
    assert all(i >= n_index for i in axis), "only dense dimensions are paired"
    blocks = (tuple(axis[i] for i in s_contract), tuple(axis[i] for i in s_batch))
    data, d = data.astype(out_dtype), d.astype(out_dtype)
    if sparse_is_lhs:
        numbers = ((blocks[0], d_contract), (blocks[1], d_batch))
        return lax.dot_general(data, d, numbers)
    numbers = ((d_contract, blocks[0]), (d_batch, blocks[1]))
    return lax.dot_general(d, data, numbers)


def _pair_count(
    a_indices: Array,
    b_indices: Array,
    shape: tuple[int, int, int],
    *,
    a_unique: bool,
    b_unique: bool,
) -> int:
    """A static bound on the number of products of `a @ b` (matrices of shapes
    `(n, k)` and `(k, m)`, `shape = (n, k, m)`): the exact count when the indices
    are known now, else the worst case."""
    n, k, m = shape
    a_nse, b_nse = a_indices.shape[0], b_indices.shape[0]
    # Through `quax.known_constant`: where quax compiles eager code, the indices are
    # tracers that equation by equation would be known, and the code runs so.
    ai = quax.known_constant(a_indices, np.size(a_indices))
    bi = quax.known_constant(b_indices, np.size(b_indices))
    if ai is None or bi is None:  # only the worst case is known
        bound = a_nse * b_nse
        if b_unique:
            bound = min(bound, a_nse * m)
        if a_unique:
            bound = min(bound, b_nse * n)
        return bound
    a_ok = np.all((ai >= 0) & (ai < np.asarray((n, k))), axis=1)
    b_ok = np.all((bi >= 0) & (bi < np.asarray((k, m))), axis=1)
    per_row = np.bincount(bi[b_ok, 0], minlength=k)
    return int(per_row[ai[a_ok, 1]].sum())


def dot_sparse_sparse(
    a_data: Array,
    a_indices: Array,
    b_data: Array,
    b_indices: Array,
    shape: tuple[int, int, int],
    out_dtype: Any,
    *,
    a_unique: bool,
    b_unique: bool,
) -> tuple[Array, Array]:
    """The matrix product `a @ b` of two sparse matrices (no batch dimensions), as a
    sparse matrix holding one entry per product `a[i, k] * b[k, j]` (duplicates not
    summed; call `sum_duplicates` to merge them). `b` may store blocks (dense
    dimensions after its two sparse ones: `b_data` of shape `(nse, *dense)`), each
    product then the block scaled by `a`'s value.

    Its `nse` is the number of such products when the indices are concrete at trace
    time, else the static bound `nse(a) * nse(b)`, lowered to `nse(a) * m` when `b`
    has unique indices and to `nse(b) * n` when `a` has: the unused entries are
    padding. Each entry of `a` is paired with the run of `b`'s entries in its column's
    row (`b` sorted by row once).

    **Arguments:**

    - `a_data`, `a_indices`, `b_data`, `b_indices`: the two matrices' entries.
    - `shape`: `(n, k, m)`: `a` is `n x k` and `b` is `k x m`.
    - `out_dtype`: the dtype of the product.
    - `a_unique`, `b_unique`: whether each is known to store no position twice.

    **Returns:**

    `(data, indices)` of the `n x m` product.
    """
    n, k, m = shape
    a_nse, b_nse = a_data.shape[0], b_data.shape[0]
    count = _pair_count(
        a_indices, b_indices, shape, a_unique=a_unique, b_unique=b_unique
    )
    index_dtype = jnp.promote_types(a_indices.dtype, b_indices.dtype)
    fill = jnp.asarray([n, m], index_dtype)
    block = b_data.shape[1:]
    if count == 0 or a_nse == 0 or b_nse == 0:
        return jnp.zeros((0, *block), out_dtype), jnp.zeros((0, 2), index_dtype)
    a_ok = valid_mask(a_indices, (n, k))
    b_ok = valid_mask(b_indices, (k, m))
    b_row = jnp.where(b_ok, b_indices[:, 0], k)
    order = jnp.argsort(b_row, stable=True)
    b_row_sorted = b_row[order]
    rows = jnp.arange(k, dtype=b_row.dtype)
    start = jnp.searchsorted(b_row_sorted, rows, side="left")
    per_row = jnp.searchsorted(b_row_sorted, rows, side="right") - start
    a_col = jnp.where(a_ok, a_indices[:, 1], 0)
    per_entry = jnp.where(a_ok, per_row[a_col], 0)
    ends = jnp.cumsum(per_entry)
    p = jnp.arange(count, dtype=ends.dtype)
    entry = jnp.minimum(jnp.searchsorted(ends, p, side="right"), a_nse - 1)
    offset = p - (ends[entry] - per_entry[entry])
    partner = order[jnp.clip(start[a_col[entry]] + offset, 0, b_nse - 1)]
    used = p < ends[-1]
    out_indices = jnp.where(
        used[:, None],
        jnp.stack([a_indices[entry, 0], b_indices[partner, 1]], axis=-1).astype(
            index_dtype
        ),
        fill,
    )
    lead = (-1,) + (1,) * len(block)
    out_data = jnp.where(
        used.reshape(lead),
        a_data[entry].astype(out_dtype).reshape(lead)
        * b_data[partner].astype(out_dtype),
        0,
    )
    return out_data, out_indices


# Block-sparse matrices --------------------------------------------------------------
#
# A block-sparse matrix comes as `BlockSparse` stores it: `data` of shape
# `(nblocks, br, bc)` (each block dense), `indices` of shape `(nblocks, 2)` (block
# row, block column; a position outside the `grid` of block rows and columns is
# padding).


def blocks_of(x: Array, block_shape: tuple[int, int]) -> Array:
    """A matrix (or batch of them, shape `(*batch, n_rows, n_cols)`) as its grid of
    blocks: shape `(*batch, n_rows // br, n_cols // bc, br, bc)`."""
    br, bc = block_shape
    *batch, n_rows, n_cols = x.shape
    tiles = x.reshape((*batch, n_rows // br, br, n_cols // bc, bc))
    return jnp.moveaxis(tiles, len(batch) + 1, len(batch) + 2)


def scatter_blocks(data: Array, indices: Array, grid: tuple[int, int]) -> Array:
    """The dense matrix of the blocks `data` at the block positions `indices` on a
    grid of `grid` block rows and columns (blocks at one position add up; padding
    is dropped)."""
    (rows, cols), (br, bc) = grid, data.shape[1:]
    tiles = scatter_add(
        jnp.zeros((rows, cols, br, bc), data.dtype), indices, (0, 1), data
    )
    return jnp.swapaxes(tiles, 1, 2).reshape(rows * br, cols * bc)


def dot_blocks(
    data: Array,
    indices: Array,
    grid: tuple[int, int],
    x: Array,
    *,
    out_dtype: Any,
    precision: Any = None,
) -> Array:
    """`A @ x` for the block-sparse matrix `A` of the blocks `data` (shape
    `(nblocks, br, bc)`) at the block positions `indices` on a grid of `grid` block
    rows and columns, and a dense `x` of shape `(grid[1] * bc, k)`.

    Per stored block, the `bc` rows of `x` it meets are gathered (one index read
    per block), the blocks are multiplied with them in one batched `dot_general`
    (dense `br x bc` times `bc x k` products: a TPU's matrix unit multiplies
    them), and the products are summed by block row (`segment_sum`, one scatter
    of a `br x k` slice per block). Padding blocks are skipped whole. Bools
    multiply as JAX's dense product of bools does (an `or` of `and`s).

    **Returns:**

    `A @ x`, shape `(grid[0] * br, k)`, dtype `out_dtype`.
    """
    (n_block_rows, n_block_cols), (_, br, bc) = grid, data.shape
    k = x.shape[1]
    rows, cols = indices[:, 0], indices[:, 1]
    inside = (rows >= 0) & (rows < n_block_rows) & (cols >= 0) & (cols < n_block_cols)
    compute = jnp.int32 if out_dtype == jnp.bool_ else out_dtype
    slices = gather(x.reshape(n_block_cols, bc, k), cols[:, None], (0,))
    products = lax.dot_general(
        data.astype(compute),
        slices.astype(compute),
        (((2,), (1,)), ((0,), (0,))),
        precision=precision,
        preferred_element_type=compute,
    )
    out = jax.ops.segment_sum(
        products, jnp.where(inside, rows, n_block_rows), num_segments=n_block_rows
    )
    out = out.reshape(n_block_rows * br, k)
    return out != 0 if out_dtype == jnp.bool_ else out


def read_blocks(
    y: Array, indices: Array, grid: tuple[int, int], block_shape: tuple[int, int]
) -> Array:
    """A dense `y` of shape `(r, c)` read at the stored blocks of a block-sparse
    matrix of shape `(grid[0] * br, grid[1] * bc)`, where `r` is the matrix's number
    of rows or 1 and `c` its number of columns or 1 (an axis of size 1 broadcasts,
    as in `lax.mul`): shape `(nblocks, br, bc)`; padding blocks read zeros."""
    (n_block_rows, n_block_cols), (br, bc) = grid, block_shape
    nblocks = indices.shape[0]
    rows, cols = indices[:, 0], indices[:, 1]
    r, c = y.shape
    if r == n_block_rows * br and r != 1:
        y = jnp.take(y.reshape(n_block_rows, br, c), rows, 0, mode="fill", fill_value=0)
    else:
        y = jnp.broadcast_to(y[None], (nblocks, r, c))
    if c == n_block_cols * bc and c != 1:
        y = y.reshape(nblocks, y.shape[1], n_block_cols, bc)
        pick = lambda block, col: jnp.take(block, col, 1, mode="fill", fill_value=0)
        y = jax.vmap(pick)(y, cols)
    return jnp.broadcast_to(y, (nblocks, br, bc))
