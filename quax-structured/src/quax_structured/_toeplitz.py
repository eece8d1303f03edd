"""`Toeplitz`: products through a circulant embedding and the FFT, O(n log n)."""

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array

from ._base import StructuredMatrix
from ._circulant import circular_convolve


__all__ = ["Toeplitz"]


class Toeplitz(StructuredMatrix):
    """A Toeplitz matrix, stored as its first column and first row: `T[..., i, j]
    = column[..., i - j]` for `i >= j` and `row[..., j - i]` for `j > i` (as in
    `scipy.linalg.toeplitz`, `row[..., 0]` is ignored).

    Products cost O(n log n): `T` is the top-left block of a `2n x 2n` circulant
    matrix, applied through the FFT.

    **Fields:**

    - `column`: shape `(*batch, n)`.
    - `row`: shape `(*batch, n)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    column: Array
    row: Array
    allow_materialise: bool = eqx.field(default=False, static=True)

    def __check_init__(self):
        if self.column.shape != self.row.shape or self.column.dtype != self.row.dtype:
            raise ValueError(
                "`Toeplitz` needs `column` and `row` of the same shape and dtype; got "
                f"{self.column.shape} {self.column.dtype} and {self.row.shape} "
                f"{self.row.dtype}."
            )

    def aval(self) -> jax.core.ShapedArray:
        *batch, n = self.column.shape
        return jax.core.ShapedArray((*batch, n, n), self.column.dtype)

    def dense(self) -> Array:
        n = self.column.shape[-1]
        i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
        return jnp.where(i >= j, self.column[..., i - j], self.row[..., j - i])

    def _with(self, column: Array, row: Array) -> "Toeplitz":
        return Toeplitz(column, row, self.allow_materialise)

    def transpose(self) -> "Toeplitz":
        row = self.column
        column = jnp.concatenate([self.column[..., :1], self.row[..., 1:]], axis=-1)
        return self._with(column, row)

    def map_leaves(self, fn) -> "Toeplitz":
        return self._with(fn(self.column), fn(self.row))

    def matmat(self, x: Array) -> Array:
        """`T @ x` for `x` of shape `(*batch, n, k)`: the first `n` rows of the
        `2n` circulant embedding `[[T, S], [S, T]]` applied to `[x; 0]`."""
        n = self.column.shape[-1]
        zero = jnp.zeros_like(self.column[..., :1])
        embedding = jnp.concatenate(
            [self.column, zero, jnp.flip(self.row[..., 1:], -1)], axis=-1
        )
        padded = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, n), (0, 0)])
        return circular_convolve(embedding, padded)[..., :n, :]

    def entries(self, i: Array, j: Array) -> Array:
        n = self.column.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        return jnp.where(i >= j, self.column[i - j], self.row[jnp.abs(j - i)])

    def add(self, other: StructuredMatrix) -> "Toeplitz | None":
        if isinstance(other, Toeplitz):
            return self._with(self.column + other.column, self.row + other.row)
        return None
