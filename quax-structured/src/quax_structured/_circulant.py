"""`Circulant`: products and eigenvalues through the FFT, O(n log n)."""

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array

from ._base import StructuredMatrix


__all__ = ["Circulant", "circular_convolve"]


def circular_convolve(column: Array, x: Array) -> Array:
    """`C @ x` for the circulant `C` with first column `column` (shape
    `(*batch, n)`) and `x` of shape `(*batch, n, k)`, through the FFT."""
    n = column.shape[-1]
    dtype = jnp.result_type(column, x)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        out = jnp.fft.ifft(
            jnp.fft.fft(column)[..., :, None] * jnp.fft.fft(x, axis=-2), axis=-2
        )
    else:
        spectrum = jnp.fft.rfft(column)[..., :, None] * jnp.fft.rfft(x, axis=-2)
        out = jnp.fft.irfft(spectrum, n=n, axis=-2)
    return out.astype(dtype)


class Circulant(StructuredMatrix):
    """A circulant matrix, stored as its first column: `C[..., i, j] =
    column[..., (i - j) mod n]`.

    Products cost O(n log n) through the FFT, and `jnp.linalg.eigvals` returns the
    FFT of the first column (the eigenvalues in the DFT's order, O(n log n)).

    **Fields:**

    - `column`: shape `(*batch, n)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    column: Array
    allow_materialise: bool = eqx.field(default=False, static=True)

    def aval(self) -> jax.core.ShapedArray:
        *batch, n = self.column.shape
        return jax.core.ShapedArray((*batch, n, n), self.column.dtype)

    def dense(self) -> Array:
        n = self.column.shape[-1]
        index = (jnp.arange(n)[:, None] - jnp.arange(n)[None, :]) % n
        return self.column[..., index]

    def _with(self, column: Array) -> "Circulant":
        return Circulant(column, self.allow_materialise)

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

    def eigenvalues(self) -> Array:
        """The eigenvalues, `fft(column)`, in the DFT's order (`C v_k = λ_k v_k` for
        `v_k[j] = exp(2πi jk / n)`)."""
        dtype = jnp.result_type(self.dtype, jnp.complex64)
        return jnp.fft.fft(self.column).astype(dtype)
