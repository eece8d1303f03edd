"""The value type `BlockSparse`: a sparse matrix of dense blocks (block-coordinate
format), whose products are batched dense products of the blocks."""

import math
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jaxtyping import Array, ArrayLike

from .._kernels import blocks_of, scatter_blocks
from ._bcoo import (
    BCOO,
    SparseValue,
    check_integers,
    checked_shape,
    refusal_reason,
    signed_indices,
    unchecked,
)


__all__ = ["BlockSparse"]


def checked_block_shape(owner: str, block_shape: Any) -> tuple[int, int]:
    """`block_shape` (an integer for square blocks, or a pair) as a pair of positive
    Python integers, or a `ValueError` naming `owner`'s argument."""
    sizes = (block_shape, block_shape) if np.ndim(block_shape) == 0 else block_shape
    try:
        out = checked_shape(owner, sizes)
    except ValueError:
        out = ()
    if len(out) != 2 or min(out) < 1:
        raise ValueError(
            f"`{owner}` needs `block_shape` to be a positive integer (square blocks) "
            f"or a pair of them; got {block_shape!r}."
        )
    return out[0], out[1]


class BlockSparse(SparseValue):
    """A sparse matrix stored as dense blocks, or a batch of such matrices.

    The matrix of shape `(n_rows, n_cols)` is cut into a grid of blocks of shape
    `block_shape = (br, bc)` (`br` divides `n_rows`, `bc` divides `n_cols`); block
    `k` of `data` (shape `(br, bc)`) sits at block row `indices[k, 0]` and block
    column `indices[k, 1]`, so its element `(i, j)` is the matrix's element
    `(indices[k, 0] * br + i, indices[k, 1] * bc + j)`. Blocks at one position add
    up; every element outside the stored blocks is zero. A block index equal to
    the number of block rows (or columns) marks padding, ignored.

    Inside [`quax.quaxify`][] its products with a dense operand (`a @ v`, `v @ a`,
    `a @ V`, any `dot_general` contracting one of its two matrix dimensions) read
    each stored block whole: a gather of the dense operand's slices the blocks
    meet, one batched dense product of the blocks with them (small dense matrix
    products, which a TPU's matrix unit multiplies), and a sum by block row. That
    is what `BCOO` does per element, done per block: one index read and one
    scatter-add per block instead of per element. It pays where the nonzeros come
    in blocks (a block-structured or banded matrix, a pruned layer); the zeros
    inside a stored block are multiplied like any other element (IEEE: a NaN
    there meets them), and the zeros outside are exact. A `BlockSparse` follows
    the core's materialisation policy ([`quax.GuardedValue`][]): an operation
    without a rule refuses, naming the primitive.

    **Fields:**

    - `data`: the blocks, shape `(*batch, nblocks, br, bc)`.
    - `indices`: their block positions, integers of shape `(*batch, nblocks, 2)`
        (block row, block column).
    - `_shape`: the shape given to `__init__`. The `shape` property takes the batch
        sizes from `data` (so that `jax.vmap` over the leaves, or stacking them,
        works, as for `BCOO`).
    - `allow_materialise`: whether an operation without a rule may densify.
    """

    def __init__(
        self,
        data: ArrayLike,
        indices: ArrayLike,
        shape: tuple[int, ...],
        allow_materialise: bool = False,
    ):
        """**Arguments:**

        - `data`: the blocks, shape `(*batch, nblocks, br, bc)`.
        - `indices`: the block row and block column of each block, integers of
            shape `(*batch, nblocks, 2)`, each in `[0, n_rows / br]` (resp.
            `n_cols / bc`), where the upper bound marks padding. Concrete indices
            outside that range (negative ones included) are refused; traced ones
            (under `jit`) there are padding.
        - `shape`: `(*batch, n_rows, n_cols)`, non-negative integers, each of the
            last two a multiple of the block's.
        - `allow_materialise`: whether an operation without a rule may form the
            dense matrix (`False`, the default, raises an error naming it).
        """
        self.data = jnp.asarray(data)
        indices = jnp.asarray(indices)
        self._shape = checked_shape("BlockSparse", shape)
        check_integers("BlockSparse", "indices", indices)
        self.indices = signed_indices(indices)
        self.allow_materialise = allow_materialise
        self._check_layout(self._shape[:-2])
        self._check_indices()

    def __check_init__(self) -> None:
        """The shapes and dtypes of `data` and `indices` against `shape`, with the
        batch sizes taken from `data` (a `jax.vmap` view or a stack passes): run
        after `__init__`, and by `quax.quaxify` on a matrix rebuilt without it
        (`eqx.tree_at`, `jax.tree.map`). Reads shapes, dtypes and static fields
        only."""
        self._check_layout(self.data.shape[:-3])

    def _check_layout(self, batch: tuple[int, ...]) -> None:
        data, indices, shape = self.data, self.indices, self._shape
        if len(shape) < 2:
            raise ValueError(
                "`BlockSparse` holds matrices (shape (*batch, n_rows, n_cols)); got "
                f"shape {shape}."
            )
        if data.ndim != len(batch) + 3:
            raise ValueError(
                f"`BlockSparse` of shape {shape} needs `data` of shape "
                f"{(*batch, 'nblocks', 'br', 'bc')}; got {data.shape}."
            )
        if indices.shape != (*data.shape[:-2], 2):
            raise ValueError(
                f"`BlockSparse` needs `indices` of shape (*batch, nblocks, 2), one "
                f"block row and block column per block of `data` (shape "
                f"{data.shape}), so {(*data.shape[:-2], 2)}; got {indices.shape}."
            )
        check_integers("BlockSparse", "indices", indices)
        br, bc = data.shape[-2:]
        n_rows, n_cols = shape[-2:]
        if br < 1 or bc < 1 or n_rows % br or n_cols % bc:
            raise ValueError(
                f"`BlockSparse` of shape {shape} needs blocks of a positive shape "
                f"that divides the matrix's ({n_rows}, {n_cols}); `data` of shape "
                f"{data.shape} has blocks of shape {(br, bc)}."
            )

    def _check_indices(self) -> None:
        """Concrete block indices in `[0, grid]` (the grid's size marks padding).
        Traced ones (under `jit`) cannot be checked."""
        if isinstance(self.indices, jax.core.Tracer):
            return
        value = np.asarray(self.indices)
        grid = np.asarray(self.grid)
        bad = (value < 0) | (value > grid)
        if bad.any():
            position = tuple(int(p) for p in np.argwhere(bad)[0])
            bound = int(grid[position[-1]])
            what = "block row" if position[-1] == 0 else "block column"
            raise ValueError(
                f"`BlockSparse` got `indices[{', '.join(map(str, position))}]` = "
                f"{int(value[position])}: a {what} must lie in [0, {bound}] for a "
                f"matrix of shape {self._shape[-2:]} in blocks of shape "
                f"{self.block_shape} ({bound} marks padding)."
            )

    @classmethod
    def _from_blocks(
        cls,
        data: Array,
        indices: Array,
        shape: tuple[int, ...],
        allow_materialise: bool = False,
    ) -> "BlockSparse":
        """A `BlockSparse` of blocks that the family computed itself (a rule's
        output, `fromdense`): consistent and in range by construction, so the
        checks of user input are skipped (see `BCOO._from_entries`)."""
        fields = {
            "data": data,
            "indices": indices,
            "_shape": tuple(shape),
            "allow_materialise": allow_materialise,
        }
        return unchecked(cls, fields)

    # Structure ---------------------------------------------------------------------

    @property
    def block_shape(self) -> tuple[int, int]:
        """The shape of each block, `(br, bc)`."""
        br, bc = self.data.shape[-2:]
        return br, bc

    @property
    def grid(self) -> tuple[int, int]:
        """The number of block rows and block columns."""
        (n_rows, n_cols), (br, bc) = self._shape[-2:], self.block_shape
        return n_rows // br, n_cols // bc

    @property
    def nblocks(self) -> int:
        """The number of stored blocks per matrix (padding included)."""
        return self.data.shape[-3]

    @property
    def n_batch(self) -> int:
        """The number of batch dimensions."""
        return self.data.ndim - 3

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(
            self.data.shape[:-3] + self._shape[-2:], self.data.dtype
        )

    # Materialising -----------------------------------------------------------------

    def todense(self) -> Array:
        """The dense matrix (an explicit request: allowed whatever
        `allow_materialise` says). Blocks at one position add up; padding is
        dropped.

        **Returns:**

        A JAX array of shape `self.shape` and dtype `self.dtype`.
        """
        fill = scatter_blocks
        for _ in range(self.n_batch):
            fill = jax.vmap(fill, in_axes=(0, 0, None))
        return fill(self.data, self.indices, self.grid)

    def dense(self) -> Array:
        return self.todense()

    def refusal_reason(self) -> str:
        return (
            refusal_reason(self.aval(), self.data.size)
            + f" (in {math.prod(self.data.shape[:-2])} blocks of shape "
            f"{self.block_shape})"
        )

    def way_out(self, primitive: Primitive | None = None) -> str:
        return super().way_out(primitive) + (
            " Or convert it: `.to_bcoo()` gives the same matrix as a `BCOO` (one "
            "entry per element of each block), which has more rules."
        )

    # Construction and conversion ------------------------------------------------------

    @classmethod
    def fromdense(
        cls,
        x: ArrayLike,
        *,
        block_shape: int | tuple[int, int],
        nblocks: int | None = None,
        n_batch: int = 0,
        index_dtype: Any = jnp.int32,
        allow_materialise: bool = False,
    ) -> "BlockSparse":
        """The blocks of a dense matrix (or batch of them) that hold a nonzero.

        The blocks are stored in row-major order of the block grid; with more room
        than nonzero blocks, the rest is padding (zero blocks at the grid's size).
        As for [`quax_sparse.BCOO.fromdense`][]: for a concrete `x`, an `nblocks`
        below its number of nonzero blocks is refused with a `ValueError` giving
        the count; under `jit` (`x` a tracer), where it cannot be known, the first
        `nblocks` are kept and the others dropped.

        **Arguments:**

        - `x`: the dense array, shape `(*batch, n_rows, n_cols)`.
        - `block_shape`: `(br, bc)`, or one integer for square blocks; it must
            divide the matrix's shape. On a TPU, whose matrix unit multiplies
            `128 x 128` tiles, blocks of 128 fill it; smaller ones (8, 32) keep
            fewer zeros of a finer pattern.
        - `nblocks`: the number of blocks to store per matrix, at least the number
            of nonzero blocks; `None` (for a concrete `x` only): exactly that number.
        - `n_batch`: how many leading axes of `x` are batch axes.
        - `index_dtype`: `int32` or `int64`.
        - `allow_materialise`: passed to `BlockSparse`.

        **Returns:**

        A `BlockSparse` of `x`'s shape.
        """
        x = jnp.asarray(x)
        if not 0 <= n_batch <= x.ndim - 2:
            raise ValueError(
                f"`BlockSparse.fromdense` takes a matrix or a batch of them: "
                f"n_batch={n_batch} must be in [0, {x.ndim - 2}] for `x` of shape "
                f"{x.shape}."
            )
        block_shape = checked_block_shape("BlockSparse.fromdense", block_shape)
        if x.shape[-2] % block_shape[0] or x.shape[-1] % block_shape[1]:
            raise ValueError(
                f"`BlockSparse.fromdense` needs `block_shape` {block_shape} to "
                f"divide the matrix's shape {x.shape[-2:]}."
            )
        # Each matrix as its grid of blocks, `(*batch, rows, cols, br, bc)`: the
        # nonzero blocks are the entries of a `BCOO` whose dense dimensions are
        # the blocks (`n_dense=2`), with its checks of the count.
        tiles = BCOO._fromdense(
            "BlockSparse.fromdense",
            blocks_of(x, block_shape),
            nse=nblocks,
            n_batch=n_batch,
            n_dense=2,
            index_dtype=index_dtype,
            allow_materialise=allow_materialise,
            argument="nblocks",
        )
        return cls._from_blocks(tiles.data, tiles.indices, x.shape, allow_materialise)

    def to_bcoo(self) -> BCOO:
        """The same matrix as a [`quax_sparse.BCOO`][]: one entry per element of each
        stored block (zeros inside a block included), padding blocks as padding.

        **Returns:**

        A `BCOO` with `n_batch` batch dimensions and `nblocks * br * bc` entries per
        matrix.
        """
        (br, bc), (n_rows, n_cols) = self.block_shape, self._shape[-2:]
        rows, cols = self.indices[..., 0], self.indices[..., 1]
        inside = (rows < self.grid[0]) & (cols < self.grid[1])
        i = jnp.arange(br, dtype=rows.dtype)[:, None]
        j = jnp.arange(bc, dtype=cols.dtype)[None, :]
        row = jnp.where(inside[..., None, None], rows[..., None, None] * br + i, n_rows)
        col = jnp.where(inside[..., None, None], cols[..., None, None] * bc + j, n_cols)
        row, col = jnp.broadcast_arrays(row, col)
        batch = self.data.shape[:-3]
        indices = jnp.stack([row, col], axis=-1).reshape((*batch, -1, 2))
        data = self.data.reshape((*batch, -1))
        return BCOO._from_entries(data, indices, self.shape, self.allow_materialise)
