"""`Toeplitz`: products through a circulant embedding and the FFT, O(n log n);
solves and determinants with partial pivoting (GKO, `_gko.py`), O(n²), or through
the Levinson recursion where the matrix is tagged positive definite."""

import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array

from .._kernels import batched, circular_convolve, gko_pivots, gko_solve, levinson
from ._base import StructuredMatrix
from ._circulant import SolverLU
from ._determinant import DeterminantLU


__all__ = ["Toeplitz", "ToeplitzLU", "levinson"]


class ToeplitzLU(SolverLU):
    """`lax.linalg.lu` of a `Toeplitz` matrix (see `SolverLU`): solves with
    partial pivoting through GKO (`_gko.py`), O(n²) time and memory per solve,
    and its pivots are those of that factorisation (their moduli, the first
    signed with the determinant). For a matrix tagged `positive_definite`, the
    Levinson recursion instead (no pivoting, which a positive definite matrix
    does not need; O(n) memory, and faster): its pivots are those of LU without
    pivoting.

    **Fields:**

    - `matrix`: the `Toeplitz` matrix.
    - `values`: the pivots, where `lu` computed them (else `pivots()` does).
    """

    matrix: "Toeplitz"
    values: Array | None = None

    def pivots(self) -> Array:
        if self.values is not None:
            return self.values
        t = self.matrix
        if t.positive_definite:
            empty = jnp.zeros((*t.column.shape, 0), self.dtype)
            return batched(lambda c, r, b: levinson(c, r, b)[1], t.column, t.row, empty)
        return batched(gko_pivots, t.column, t.row)

    def solve(self, b: Array, transpose: bool) -> Array:
        if self.matrix.positive_definite:
            t = self.matrix.transpose() if transpose else self.matrix
            return batched(lambda c, r, b: levinson(c, r, b)[0], t.column, t.row, b)
        solve = lambda c, r, b: gko_solve(c, r, b, transpose=transpose)
        return batched(solve, self.matrix.column, self.matrix.row, b)


class Toeplitz(StructuredMatrix):
    """A Toeplitz matrix, stored as its first column and first row: `T[..., i, j]
    = column[..., i - j]` for `i >= j` and `row[..., j - i]` for `j > i` (as in
    `scipy.linalg.toeplitz`, `row[..., 0]` is ignored).

    Products cost O(n log n): `T` is the top-left block of a `2n x 2n` circulant
    matrix, applied through the FFT. `jnp.linalg.solve`, `slogdet` and `det` cost
    O(n²) time with partial pivoting (GKO: Gaussian elimination with partial
    pivoting on the Cauchy-like matrix the DFT turns `T` into, in complex
    arithmetic), as accurate as the dense pivoted solve at tiny or zero leading
    minors; memory O(n²) (the factors, complex: 8 n² bytes in float32, 16 n² in
    float64). Tagged `positive_definite=True`, they use the Levinson recursion
    instead: O(n) memory and faster, without pivoting (stable for positive
    definite matrices only: the tag is the user's declaration, not checked).

    **Fields:**

    - `column`: shape `(*batch, n)`.
    - `row`: shape `(*batch, n)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    batch_leading = True

    column: Array
    row: Array

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
        return Toeplitz(column, row, allow_materialise=self.allow_materialise)

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

    def lu(self) -> DeterminantLU:
        """A `ToeplitzLU` (a solver in place of factors) and its pivots: where a
        pivoted factorisation meets a zero pivot, the matrix is singular and
        `det` is 0 (not NaN, as for an LU without pivoting)."""
        allow = self.allow_materialise
        values = ToeplitzLU(self, allow_materialise=allow).pivots()
        solver = ToeplitzLU(self, values=values, allow_materialise=allow)
        return DeterminantLU(solver, self, pivots=values)

    def add(self, other: StructuredMatrix) -> "Toeplitz | None":
        if isinstance(other, Toeplitz):
            return self._with(self.column + other.column, self.row + other.row)
        return None
