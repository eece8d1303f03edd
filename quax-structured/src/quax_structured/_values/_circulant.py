"""`Circulant`: products, solves, determinants and eigenvalues through the FFT,
O(n log n); `SolverLU`, the form `lax.linalg.lu` takes for matrices that solve
without triangular factors."""

import abc
import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array

from .._kernels import circulant_eigh, circular_convolve
from ._base import StructuredMaterialisationError, StructuredMatrix, sequence_as_array
from ._determinant import DeterminantLU


__all__ = ["Circulant", "CirculantLU", "SolverLU", "circular_convolve"]


class SolverLU(StructuredMatrix):
    """What `lax.linalg.lu` returns (without pivoting) for a structure that solves
    without triangular factors (`Circulant` through the FFT, `Toeplitz` through the
    Levinson recursion): not packed LU factors, but a factor whose unit lower
    triangle acts as the identity and whose upper triangle acts as the matrix
    itself, so that the two triangular solves of `jnp.linalg.solve` are one
    structured solve. Its diagonal holds the pivots of an LU factorisation (their
    product is the determinant), which `slogdet` and `det` read. No other entry is
    defined (off-diagonal entries read as NaN), and it never materialises.

    **Fields:**

    - `matrix`: the factored matrix (a `Circulant` or a `Toeplitz`).
    """

    conjugates_leafwise = False

    matrix: StructuredMatrix

    def aval(self) -> jax.core.ShapedArray:
        return self.matrix.aval()

    def _check_factored(self, cls: type) -> None:
        """Refuse a `matrix` that is not a `cls`, the structure this factor's
        solve and pivots read (a `CirculantLU` reads a `Toeplitz`'s `column` as a
        circulant's, silently): for `__check_init__`, which `quax.quaxify` re-runs
        on a factor rebuilt without its constructor (`eqx.tree_at`)."""
        if not isinstance(self.matrix, cls):
            raise ValueError(
                f"`{type(self).__name__}` factors a `{cls.__name__}`: its `matrix` "
                f"must be one, which its solve and pivots read; got a "
                f"`{type(self.matrix).__name__}`."
            )

    @abc.abstractmethod
    def pivots(self) -> Array:
        """The diagonal of the factored matrix: numbers whose product is its
        determinant."""

    @abc.abstractmethod
    def solve(self, b: Array, transpose: bool) -> Array:
        """`A⁻¹ b` (`A⁻ᵀ b` when `transpose`) for the factored `A` and `b` of shape
        `(*batch, n, k)`."""

    def enable_materialise(self, allow: bool = True) -> "SolverLU":
        """A copy whose matrix has `allow_materialise=allow` (the factor itself
        never materialises)."""
        matrix = self.matrix.enable_materialise(allow)
        return dataclasses.replace(self, matrix=matrix, allow_materialise=allow)

    def dense(self) -> Array:
        name = type(self).__name__
        raise StructuredMaterialisationError(
            f"Refusing to materialise `{name}`: {self.way_out(None)}"
        )

    def way_out(self, primitive: Any) -> str:
        del primitive
        return (
            f"`{type(self).__name__}` is not a matrix of packed LU factors (its lower "
            "triangle acts as the identity, its upper one as the whole matrix); only "
            "`jnp.linalg.solve`, `slogdet` and `det` (and their derivatives) read "
            "it. Factor the dense matrix (`.enable_materialise()` on the original) "
            "to get LU factors."
        )

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        diagonal = self.pivots()[jnp.clip(i, 0, n - 1)]
        return jnp.where(i == j, diagonal, jnp.asarray(jnp.nan, self.dtype))

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        if lower and unit_diagonal:
            return b
        if lower or unit_diagonal:
            return None
        return self.solve(b, transpose_a)


class CirculantLU(SolverLU):
    """`lax.linalg.lu` of a `Circulant` (see `SolverLU`): solves through the FFT,
    O(n log n); its pivots are the eigenvalues (for a real matrix, their moduli,
    the first one signed with the determinant), so that `slogdet` reads
    `log |det| = Σ log |λ_k|`.

    **Fields:**

    - `matrix`: the `Circulant`.
    """

    matrix: "Circulant"

    def __check_init__(self):
        self._check_factored(Circulant)

    def pivots(self) -> Array:
        eigenvalues = jnp.fft.fft(self.matrix.column)
        if jnp.issubdtype(self.dtype, jnp.complexfloating):
            return eigenvalues.astype(self.dtype)
        # The eigenvalues of a real matrix are real at frequencies 0 and n / 2 (n
        # even), in conjugate pairs elsewhere: det has the sign of the real ones.
        n = self.shape[-1]
        real = [0] if n % 2 else [0, n // 2]
        sign = jnp.prod(jnp.sign(eigenvalues[..., real].real), axis=-1)
        moduli = jnp.abs(eigenvalues)
        return moduli.at[..., 0].multiply(sign).astype(self.dtype)

    def solve(self, b: Array, transpose: bool) -> Array:
        c = self.matrix.transpose() if transpose else self.matrix
        return circular_convolve(c.column, b, inverse=True)


class Circulant(StructuredMatrix):
    """A circulant matrix, stored as its first column: `C[..., i, j] =
    column[..., (i - j) mod n]`.

    Products cost O(n log n) through the FFT, and `jnp.linalg.eigvals` returns the
    FFT of the first column (the eigenvalues in the DFT's order, O(n log n)).

    **Fields:**

    - `column`: shape `(*batch, n)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    batch_leading = True

    column: Array = eqx.field(converter=sequence_as_array)

    def __check_init__(self):
        if jnp.ndim(self.column) < 1:
            raise ValueError(
                "`Circulant` needs `column` of shape (*batch, n), at least "
                f"1-dimensional; got a {jnp.ndim(self.column)}-dimensional `column`."
            )

    def aval(self) -> jax.core.ShapedArray:
        *batch, n = self.column.shape
        return jax.core.ShapedArray((*batch, n, n), self.column.dtype)

    def dense(self) -> Array:
        n = self.column.shape[-1]
        index = (jnp.arange(n)[:, None] - jnp.arange(n)[None, :]) % n
        return self.column[..., index]

    def _with(self, column: Array) -> "Circulant":
        return Circulant(column, allow_materialise=self.allow_materialise)

    def transpose(self) -> "Circulant":
        # Cᵀ[i, j] = c[(j - i) mod n]: the first column c[(-i) mod n].
        return self._with(jnp.roll(jnp.flip(self.column, -1), 1, axis=-1))

    def map_leaves(self, fn) -> "Circulant":
        return self._with(fn(self.column))

    def matmat(self, x: Array) -> Array:
        return circular_convolve(self.column, x)

    def entries(self, i: Array, j: Array) -> Array:
        n = self.column.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        return self.column[(i - j) % n]

    def add(self, other: StructuredMatrix) -> "Circulant | None":
        if isinstance(other, Circulant):
            return self._with(self.column + other.column)
        return None

    def product(self, other: StructuredMatrix) -> "Circulant | None":
        if isinstance(other, Circulant):
            # Circulants commute; the product's first column is C₁ c₂.
            return self._with(
                circular_convolve(self.column, other.column[..., None])[..., 0]
            )
        return None

    def eigh(self) -> tuple[Array, Array]:
        """The eigendecomposition of the Hermitian part (what `jnp.linalg.eigh`
        passes: it symmetrises its input): the eigenvalues `Re fft(column)`,
        sorted, O(n log n), and a real eigenbasis of cosines and sines (the
        eigenvalues of frequencies `k` and `n - k` are equal) for a real matrix,
        the DFT vectors for a complex one, O(n²) (the output's size)."""
        hermitian = (self.column + jnp.conj(self.transpose().column)) / 2
        return circulant_eigh(hermitian)

    def lu(self) -> DeterminantLU:
        return DeterminantLU(
            CirculantLU(self, allow_materialise=self.allow_materialise), self
        )

    def determinant(self) -> Array:
        """The product of the eigenvalues `fft(column)`, O(n log n)."""
        det = jnp.prod(jnp.fft.fft(self.column), axis=-1)
        if jnp.issubdtype(self.dtype, jnp.complexfloating):
            return det.astype(self.dtype)
        return det.real.astype(self.dtype)

    def way_out(self, primitive: Any = None) -> str:
        """For `qr`, why it is refused and what runs instead; else the base's."""
        if primitive is None or primitive.name != "qr":
            return super().way_out(primitive)
        return (
            "A circulant's QR factors have no structure: `R` is a dense upper "
            "triangle (and the fast Toeplitz QR algorithms, O(n²) and unstable, "
            "still return two dense (n, n) factors). What a QR is used for runs "
            "through the FFT in O(n log n) instead: `jnp.linalg.solve(C, b)`, and "
            "for a least-squares solution `jnp.linalg.pinv(C) @ b` (the "
            "pseudo-inverse is a `Circulant`); its unitary eigenbasis, the DFT, is "
            "what `jnp.linalg.svd` and `eigh` return. For the QR factors "
            "themselves: " + super().way_out(primitive)
        )

    def eigenvalues(self) -> Array:
        """The eigenvalues, `fft(column)`, in the DFT's order (`C v_k = λ_k v_k` for
        `v_k[j] = exp(2πi jk / n)`)."""
        dtype = jnp.result_type(self.dtype, jnp.complex64)
        return jnp.fft.fft(self.column).astype(dtype)
