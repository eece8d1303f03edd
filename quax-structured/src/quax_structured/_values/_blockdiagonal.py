"""`BlockDiagonal`: every operation block by block."""

from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from .._kernels import (
    dense_triangular_solve,
    failed_factorisation,
    keep_or_scale,
    nan_where,
    on_diagonal,
)
from ._base import StructuredMatrix
from ._determinant import DeterminantLU


__all__ = ["BlockDiagonal"]


def _stacked(blocks: Any) -> Any:
    """A list or tuple of equal square blocks, stacked into `(m, b, b)`; anything
    else as it is (the constructor's checks see it)."""
    if not isinstance(blocks, list | tuple):
        return blocks
    shapes = [jnp.shape(b) for b in blocks]
    if not shapes or len(set(shapes)) != 1:
        raise ValueError(
            "`BlockDiagonal` needs `blocks` of shape (*batch, m, b, b), or a list "
            f"of at least one block of one shape (b, b); got a list of shapes "
            f"{shapes}. Blocks of different sizes have no `BlockDiagonal`: pad "
            "them to one size (with an identity block in the padding), or build "
            "the dense matrix with `jax.scipy.linalg.block_diag(*blocks)`."
        )
    return jnp.stack(blocks)


class BlockDiagonal(StructuredMatrix):
    """A block-diagonal matrix of `m` equal square blocks of size `b` (`n = m b`).

    Products cost O(n b); `jnp.linalg.solve`, `slogdet`, `det` and `cholesky` factor
    each block (with partial pivoting inside the block), O(n b²).

    **Fields:**

    - `blocks`: shape `(*batch, m, b, b)`; `blocks[..., k, :, :]` is the `k`-th
        diagonal block. A list (or tuple) of `m` blocks of shape `(b, b)` is
        stacked.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    batch_leading = True

    blocks: Array = eqx.field(converter=_stacked)

    def __check_init__(self):
        shape = jnp.shape(self.blocks)
        if len(shape) < 3 or shape[-1] != shape[-2]:
            raise ValueError(
                "`BlockDiagonal` needs `blocks` of shape (*batch, m, b, b) (m "
                f"square blocks of size b); got shape {shape}. For one block of "
                "shape (b, b) pass `blocks[None]`."
            )

    def aval(self) -> jax.core.ShapedArray:
        *batch, m, b, _ = self.blocks.shape
        return jax.core.ShapedArray((*batch, m * b, m * b), self.blocks.dtype)

    def _sizes(self) -> tuple[int, int]:
        return self.blocks.shape[-3], self.blocks.shape[-1]

    def dense(self) -> Array:
        # A `where`, not a product with the identity: a NaN in a block stays in it.
        m = self.blocks.shape[-3]
        eye = jnp.eye(m, dtype=bool)[:, None, :, None]
        out = jnp.where(eye, self.blocks[..., :, :, None, :], jnp.zeros((), self.dtype))
        return out.reshape(self.shape)

    def _with(self, blocks: Array) -> "BlockDiagonal":
        return BlockDiagonal(blocks, allow_materialise=self.allow_materialise)

    def _split(self, x: Array) -> Array:
        """`(*batch, n, ...)` -> `(*batch, m, b, ...)` on the axis `-2`."""
        m, b = self._sizes()
        return x.reshape(*x.shape[:-2], m, b, x.shape[-1])

    def transpose(self) -> "BlockDiagonal":
        return self._with(jnp.swapaxes(self.blocks, -1, -2))

    def map_leaves(self, fn) -> "BlockDiagonal":
        return self._with(fn(self.blocks))

    def matmat(self, x: Array) -> Array:
        """`A @ x` for `x` of shape `(*batch, n, k)`, in O(n b k)."""
        out = self.blocks @ self._split(x)
        return out.reshape(*out.shape[:-3], -1, out.shape[-1])

    def entries(self, i: Array, j: Array) -> Array:
        m, b = self._sizes()
        i, j = jnp.clip(i, 0, m * b - 1), jnp.clip(j, 0, m * b - 1)
        value = self.blocks[i // b, i % b, j % b]
        return jnp.where(i // b == j // b, value, jnp.zeros((), self.dtype))

    def masked(self, y: Array, *, select: bool = False) -> "BlockDiagonal":
        m, b = self._sizes()
        y = y.reshape(*y.shape[:-2], m, b, m, b)
        diag_blocks = jnp.moveaxis(jnp.diagonal(y, 0, -4, -2), -1, -3)
        return self._with(keep_or_scale(self.blocks, diag_blocks, select=select))

    def _same_blocking(self, other: StructuredMatrix) -> bool:
        return isinstance(other, BlockDiagonal) and other._sizes() == self._sizes()

    def add(self, other: StructuredMatrix) -> "BlockDiagonal | None":
        if self._same_blocking(other):
            assert isinstance(other, BlockDiagonal)
            return self._with(self.blocks + other.blocks)
        return None

    def add_diagonal(self, d: Array) -> "BlockDiagonal":
        m, b = self._sizes()
        blocks = d.reshape(*d.shape[:-1], m, b)
        return self._with(self.blocks + on_diagonal(blocks.astype(self.dtype)))

    def row_scaled(self, d: Array) -> "BlockDiagonal":
        m, b = self._sizes()
        return self._with(self.blocks * d.reshape(*d.shape[:-1], m, b, 1))

    def col_scaled(self, d: Array) -> "BlockDiagonal":
        m, b = self._sizes()
        return self._with(self.blocks * d.reshape(*d.shape[:-1], m, 1, b))

    def product(self, other: StructuredMatrix) -> "BlockDiagonal | None":
        if self._same_blocking(other):
            assert isinstance(other, BlockDiagonal)
            return self._with(self.blocks @ other.blocks)
        return None

    def lu(self) -> tuple[DeterminantLU, Array, Array]:
        """Each block's packed LU factors, pivots and permutation, with the block's
        offset added: the row swaps stay inside their block."""
        m, b = self._sizes()
        factors, pivots, perm = lax.linalg.lu(self.blocks)
        offset = (jnp.arange(m, dtype=pivots.dtype) * b)[:, None]
        flat = lambda x: x.reshape(*x.shape[:-2], m * b)
        perm = flat(perm + offset)
        lu = DeterminantLU(self._with(factors), self)
        return lu, flat(pivots + offset), perm

    def determinant(self) -> Array:
        """The product of the blocks' determinants (`jnp.linalg.det`'s, whose
        derivative is exact at a block of rank b - 1)."""
        return jnp.prod(jnp.linalg.det(self.blocks), axis=-1)

    def cholesky(self) -> "BlockDiagonal":
        """Each block's lower Cholesky factor (read from its lower triangle). Where
        one block is not positive definite, every block's lower triangle is NaN, as
        dense JAX's factor of the whole matrix is."""
        factors = lax.linalg.cholesky(self.blocks, symmetrize_input=False)
        pivots = jnp.diagonal(factors, 0, -2, -1).reshape(*self.shape[:-2], -1)
        lower = jnp.tril(nan_where(failed_factorisation(pivots), factors))
        return self._with(lower)

    def eigh(self) -> tuple[Array, Array]:
        """Each block's eigendecomposition, O(n b²): the eigenvalues sorted, and the
        block-diagonal eigenvector matrix (dense: the `(n, n)` output `eigh` asks
        for; `eigvalsh` under `jit` drops it)."""
        w, q = jnp.linalg.eigh(self.blocks, symmetrize_input=False)
        values = w.reshape(*w.shape[:-2], -1)
        vectors = self._with(q).dense()
        order = jnp.argsort(values, axis=-1)
        return (
            jnp.take_along_axis(values, order, -1),
            jnp.take_along_axis(vectors, order[..., None, :], -1),
        )

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array:
        """Solve `op(A) x = b` block by block, O(n b k)."""
        blocks = self.blocks
        rhs = self._split(b)
        batch = jnp.broadcast_shapes(blocks.shape[:-2], rhs.shape[:-2])
        blocks = jnp.broadcast_to(blocks, (*batch, *blocks.shape[-2:]))
        rhs = jnp.broadcast_to(rhs, (*batch, *rhs.shape[-2:]))
        out = dense_triangular_solve(
            blocks,
            rhs,
            lower=lower,
            transpose_a=transpose_a,
            unit_diagonal=unit_diagonal,
        )
        return out.reshape(*out.shape[:-3], -1, out.shape[-1])
