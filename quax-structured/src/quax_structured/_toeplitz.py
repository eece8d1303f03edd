"""`Toeplitz`: products through a circulant embedding and the FFT, O(n log n);
solves and determinants with partial pivoting (GKO, `_gko.py`), O(n²), or through
the Levinson recursion where the matrix is tagged positive definite."""

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from ._base import StructuredMatrix
from ._circulant import SolverLU, circular_convolve
from ._determinant import DeterminantLU
from ._gko import batched, gko_pivots, gko_solve


__all__ = ["Toeplitz", "ToeplitzLU", "levinson"]


def levinson(column: Array, row: Array, b: Array) -> tuple[Array, Array]:
    """Solve `T x = b` for the Toeplitz `T` (first column `column`, first row
    `row`, both of shape `(n,)`) and `b` of shape `(n, k)`, by the Levinson
    recursion: O(n² (k + 1)) time, O(n k) memory.

    Like LU without pivoting, it needs every leading principal submatrix of `T`
    to be nonsingular (true for positive definite or diagonally dominant `T`),
    and it is not backward stable for indefinite matrices.

    **Returns:**

    `(x, pivots)`: the solution, and the pivots of `T`'s LU factorisation without
    pivoting (`pivots[m] = det T[:m+1, :m+1] / det T[:m, :m]`).
    """
    n = column.shape[-1]
    index = jnp.arange(n)
    t0 = column[0]
    # Forward and backward vectors (T_m f = e_1, T_m g = e_m) and the solution of
    # the leading m x m system, left-aligned in length-n arrays.
    f = jnp.zeros(n, column.dtype).at[0].set(1 / t0)
    x = jnp.zeros(b.shape, jnp.result_type(column, b)).at[0].set(b[0] / t0)

    def step(carry, m):
        f, g, x = carry
        lower = column[jnp.clip(m - index, 0, n - 1)]  # T[m, i] for i < m
        upper = row[jnp.clip(index + 1, 0, n - 1)]  # T[0, i + 1]
        ef, eg = lower @ f, upper @ g
        shifted = jnp.roll(g, 1)
        denominator = 1 - ef * eg
        f, g = (f - ef * shifted) / denominator, (shifted - eg * f) / denominator
        x = x + jnp.outer(g, b[m] - lower @ x)
        return (f, g, x), g[m]

    (_, _, x), last = lax.scan(step, (f, f, x), jnp.arange(1, n))
    return x, jnp.concatenate([t0[None], 1 / last])


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

    def lu(self) -> DeterminantLU:
        """A `ToeplitzLU` (a solver in place of factors) and its pivots: where a
        pivoted factorisation meets a zero pivot, the matrix is singular and
        `det` is 0 (not NaN, as for an LU without pivoting)."""
        values = ToeplitzLU(self).pivots()
        return DeterminantLU(ToeplitzLU(self, values=values), self, pivots=values)

    def add(self, other: StructuredMatrix) -> "Toeplitz | None":
        if isinstance(other, Toeplitz):
            return self._with(self.column + other.column, self.row + other.row)
        return None
