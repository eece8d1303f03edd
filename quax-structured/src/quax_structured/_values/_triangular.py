"""`LowerTriangular` and `UpperTriangular`: solves in O(n²) instead of an O(n³)
LU, determinants in O(n)."""

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array

from .._kernels import dense_triangular_solve, keep_or_scale, on_diagonal
from ._base import StructuredMatrix
from ._determinant import DeterminantLU


__all__ = ["LowerTriangular", "UpperTriangular"]


class _Triangular(StructuredMatrix):
    batch_leading = True

    array: eqx.AbstractVar[Array]
    lower: eqx.AbstractClassVar[bool]

    def __check_init__(self):
        shape = jnp.shape(self.array)
        if len(shape) < 2 or shape[-1] != shape[-2]:
            raise ValueError(
                f"`{type(self).__name__}` needs a square `array` of shape "
                f"(*batch, n, n); got `array` of shape {shape}. Pass the square "
                "matrix whose triangle you mean (pad a rectangular one with zeros)."
            )

    def aval(self) -> jax.core.ShapedArray:
        # Built from the last axis, not read off `array`: a slice of `array` that
        # lost an axis (a row, as `lax.scan`/`lax.map` take one from each leaf of
        # an unbatched matrix) then describes an `(n, n)` matrix of another shape
        # than the slice's, which the scan rule sees and materialises (or refuses,
        # naming the scan) instead of rebuilding a triangular matrix from a row.
        shape = jnp.shape(self.array)
        return jax.core.ShapedArray(
            (*shape[:-2], shape[-1], shape[-1]), jnp.result_type(self.array)
        )

    def dense(self) -> Array:
        return jnp.tril(self.array) if self.lower else jnp.triu(self.array)

    def _with(self, array: Array) -> "_Triangular":
        return type(self)(array, allow_materialise=self.allow_materialise)

    def map_leaves(self, fn) -> "_Triangular":
        return type(self)(fn(self.array), allow_materialise=self.allow_materialise)

    def transpose(self) -> "_Triangular":
        other = UpperTriangular if self.lower else LowerTriangular
        return other(
            jnp.swapaxes(self.array, -1, -2), allow_materialise=self.allow_materialise
        )

    def matmat(self, x: Array) -> Array:
        return self.dense() @ x

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        inside = i >= j if self.lower else i <= j
        return jnp.where(inside, self.array[i, j], jnp.zeros((), self.dtype))

    def masked(self, y: Array, *, select: bool = False) -> "_Triangular":
        return self._with(keep_or_scale(self.array, y, select=select))

    def add(self, other: StructuredMatrix) -> "_Triangular | None":
        if type(other) is type(self):
            return type(self)(
                self.array + other.array, allow_materialise=self.allow_materialise
            )
        return None

    def add_diagonal(self, d: Array) -> "_Triangular":
        return self._with(self.array + on_diagonal(d.astype(self.dtype)))

    def determinant(self) -> Array:
        return jnp.prod(jnp.diagonal(self.array, axis1=-2, axis2=-1), axis=-1)

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array:
        if lower == self.lower:
            return dense_triangular_solve(
                self.array,
                b,
                lower=lower,
                transpose_a=transpose_a,
                unit_diagonal=unit_diagonal,
            )
        # The other triangle of a triangular matrix is its diagonal.
        if unit_diagonal:
            return b
        return b / jnp.diagonal(self.array, axis1=-2, axis2=-1)[..., :, None]


class LowerTriangular(_Triangular):
    """A lower triangular matrix: the lower triangle of `array` (the rest of `array`
    is ignored). `jnp.linalg.solve`, `solve_triangular`, `det` and `slogdet` cost
    O(n²), O(n²), O(n) and O(n) after a free factorisation.

    **Fields:**

    - `array`: shape `(*batch, n, n)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    array: Array
    lower = True

    def lu(self) -> DeterminantLU:
        """The packed factors (`packed_factors`), whose diagonal reads as the
        matrix's own: `slogdet` and `det` read it in O(n) without forming the
        factors (3.3x a hand-written slogdet at n = 1,024 when they did)."""
        diag = jnp.diagonal(self.array, axis1=-2, axis2=-1)
        return DeterminantLU(self.packed_factors(), self, pivots=diag)

    def packed_factors(self) -> "LowerTriangular":
        """`L D⁻¹` (unit lower triangular) and `D` (upper) packed in one array,
        O(n²): no pivoting needed."""
        diag = jnp.diagonal(self.array, axis1=-2, axis2=-1)
        n = self.shape[-1]
        eye = jnp.eye(n, dtype=self.dtype)
        packed = (
            jnp.tril(self.array / diag[..., None, :], -1) + diag[..., :, None] * eye
        )
        return LowerTriangular(packed, allow_materialise=self.allow_materialise)


class UpperTriangular(_Triangular):
    """An upper triangular matrix: the upper triangle of `array`. As
    [`quax_structured.LowerTriangular`][].

    **Fields:**

    - `array`: shape `(*batch, n, n)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    array: Array
    lower = False

    def lu(self) -> DeterminantLU:
        # L = I, U = the matrix itself.
        return DeterminantLU(self, self)
