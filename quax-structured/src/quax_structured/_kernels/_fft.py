"""The circulant product and solve through the FFT."""

import jax.numpy as jnp
from jaxtyping import Array


__all__ = ["circular_convolve"]


def circular_convolve(column: Array, x: Array, inverse: bool = False) -> Array:
    """`C @ x` (or `C⁻¹ x` when `inverse`) for the circulant `C` with first column
    `column` (shape `(*batch, n)`) and `x` of shape `(*batch, n, k)`, through the
    FFT."""
    n = column.shape[-1]
    dtype = jnp.result_type(column, x)
    combine = jnp.divide if inverse else jnp.multiply
    if jnp.issubdtype(dtype, jnp.complexfloating):
        spectrum = combine(jnp.fft.fft(x, axis=-2), jnp.fft.fft(column)[..., :, None])
        out = jnp.fft.ifft(spectrum, axis=-2)
    else:
        spectrum = combine(jnp.fft.rfft(x, axis=-2), jnp.fft.rfft(column)[..., :, None])
        out = jnp.fft.irfft(spectrum, n=n, axis=-2)
    return out.astype(dtype)
