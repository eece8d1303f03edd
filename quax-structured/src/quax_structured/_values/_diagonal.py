"""`Diagonal` and `ScaledIdentity`: everything in O(n)."""

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array

from .._kernels import failed_factorisation, keep_or_scale, nan_where, on_diagonal
from ._base import StructuredMatrix, is_size, sequence_as_array
from ._determinant import DeterminantLU


__all__ = ["Diagonal", "ScaledIdentity"]


class Diagonal(StructuredMatrix):
    """A diagonal matrix, stored as its diagonal. Symmetric.

    **Fields:**

    - `diag`: shape `(*batch, n)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    batch_leading = True

    diag: Array = eqx.field(converter=sequence_as_array)

    def __check_init__(self):
        if jnp.ndim(self.diag) < 1:
            raise ValueError(
                "`Diagonal` needs `diag` of shape (*batch, n), at least 1-dimensional; "
                f"got a {jnp.ndim(self.diag)}-dimensional `diag`. For `c * I` write "
                "`ScaledIdentity(c, n)`, or pass `jnp.full(n, c)`."
            )

    def aval(self) -> jax.core.ShapedArray:
        *batch, n = self.diag.shape
        return jax.core.ShapedArray((*batch, n, n), self.diag.dtype)

    def dense(self) -> Array:
        return on_diagonal(self.diag)

    def _with(self, diag: Array) -> "Diagonal":
        return Diagonal(diag, allow_materialise=self.allow_materialise)

    def transpose(self) -> "Diagonal":
        return self

    def map_leaves(self, fn) -> "Diagonal":
        return Diagonal(fn(self.diag), allow_materialise=self.allow_materialise)

    def matmat(self, x: Array) -> Array:
        return self.diag[..., :, None] * x

    def entries(self, i: Array, j: Array) -> Array:
        n = self.diag.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        return jnp.where(i == j, self.diag[i], jnp.zeros((), self.dtype))

    def diagonal(self) -> Array:
        return self.diag

    def masked(self, y: Array, *, select: bool = False) -> "Diagonal":
        scales = jnp.diagonal(y, 0, -2, -1)
        return self._with(keep_or_scale(self.diag, scales, select=select))

    def product(self, other: StructuredMatrix) -> StructuredMatrix | None:
        """`self @ other`: `other`'s rows scaled, keeping its structure."""
        return other.row_scaled(self.diag)

    def row_scaled(self, d: Array) -> "Diagonal":
        return Diagonal(d * self.diag, allow_materialise=self.allow_materialise)

    def col_scaled(self, d: Array) -> "Diagonal":
        return Diagonal(self.diag * d, allow_materialise=self.allow_materialise)

    def add(self, other: StructuredMatrix) -> StructuredMatrix | None:
        if isinstance(other, Diagonal):
            return Diagonal(
                self.diag + other.diag, allow_materialise=self.allow_materialise
            )
        if hasattr(other, "add_diagonal"):
            return other.add_diagonal(self.diag)
        return None

    def add_diagonal(self, d: Array) -> "Diagonal":
        return Diagonal(self.diag + d, allow_materialise=self.allow_materialise)

    def lu(self) -> DeterminantLU:
        # L = I and U = D: the packed factors are the matrix itself.
        return DeterminantLU(self, self)

    def determinant(self) -> Array:
        return jnp.prod(self.diag, axis=-1)

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array:
        del lower, transpose_a
        return b if unit_diagonal else b / self.diag[..., :, None]

    def cholesky(self) -> "Diagonal":
        """`sqrt(diag)`; all NaN where some entry is not positive, as dense JAX's
        factor of a matrix that is not positive definite."""
        root = jnp.sqrt(self.diag)
        return self._with(nan_where(failed_factorisation(root), root))

    def eigh(self) -> tuple[Array, Array]:
        """The sorted diagonal (its real part: `jnp.linalg.eigh` passes the
        Hermitian part, whose eigenvalues are real), and the permutation matrix
        that sorts it, O(n²) (the eigenvector matrix's size; O(n log n) for
        `jnp.linalg.eigvalsh`)."""
        values = jnp.real(self.diag)
        order = jnp.argsort(values, axis=-1)
        n = self.diag.shape[-1]
        vectors = jnp.arange(n)[:, None] == order[..., None, :]
        return jnp.take_along_axis(values, order, -1), vectors.astype(self.dtype)


class ScaledIdentity(StructuredMatrix):
    """`scale * I`, an `(n, n)` multiple of the identity. Symmetric.

    **Fields:**

    - `scale`: shape `(*batch,)` (a scalar for one matrix).
    - `n`: the matrix size (static).
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    batch_leading = True

    scale: Array = eqx.field(converter=sequence_as_array)
    n: int = eqx.field(static=True)

    def __check_init__(self):
        if not is_size(self.n):
            raise ValueError(
                f"`ScaledIdentity` needs the matrix size `n` as a non-negative "
                f"integer; got `n={self.n!r}`."
            )

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(
            (*jnp.shape(self.scale), self.n, self.n), jnp.result_type(self.scale)
        )

    def dense(self) -> Array:
        return self._as_diagonal().dense()

    def transpose(self) -> "ScaledIdentity":
        return self

    def map_leaves(self, fn) -> "ScaledIdentity":
        return ScaledIdentity(
            fn(self.scale), self.n, allow_materialise=self.allow_materialise
        )

    def matmat(self, x: Array) -> Array:
        return jnp.asarray(self.scale)[..., None, None] * x

    def entries(self, i: Array, j: Array) -> Array:
        return jnp.where(i == j, self.scale, jnp.zeros((), self.dtype))

    def masked(self, y: Array, *, select: bool = False) -> Diagonal:
        return self._as_diagonal().masked(y, select=select)

    def _as_diagonal(self) -> Diagonal:
        d = jnp.broadcast_to(
            jnp.asarray(self.scale)[..., None], (*jnp.shape(self.scale), self.n)
        )
        return Diagonal(d, allow_materialise=self.allow_materialise)

    def row_scaled(self, d: Array) -> Diagonal:
        return self._as_diagonal().row_scaled(d)

    def col_scaled(self, d: Array) -> Diagonal:
        return self._as_diagonal().col_scaled(d)

    def product(self, other: StructuredMatrix) -> StructuredMatrix | None:
        if jnp.ndim(self.scale) != 0:
            return None
        return other.scaled(self.scale)

    def add(self, other: StructuredMatrix) -> StructuredMatrix | None:
        if isinstance(other, ScaledIdentity):
            return ScaledIdentity(
                self.scale + other.scale,
                self.n,
                allow_materialise=self.allow_materialise,
            )
        if hasattr(other, "add_diagonal"):
            return other.add_diagonal(self._as_diagonal().diag)
        return None

    def add_diagonal(self, d: Array) -> Diagonal:
        return self._as_diagonal().add_diagonal(d)

    def lu(self) -> DeterminantLU:
        return DeterminantLU(self, self)

    def determinant(self) -> Array:
        return jnp.asarray(self.scale) ** self.n

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array:
        del lower, transpose_a
        return b if unit_diagonal else b / jnp.asarray(self.scale)[..., None, None]

    def cholesky(self) -> "ScaledIdentity":
        root = jnp.sqrt(self.scale)
        failed = failed_factorisation(root[..., None])
        return ScaledIdentity(
            nan_where(failed, root), self.n, allow_materialise=self.allow_materialise
        )

    def eigh(self) -> tuple[Array, Array]:
        return self._as_diagonal().eigh()
