"""Gaussian elimination with partial pivoting for Toeplitz matrices in O(n²): the
algorithm of Gohberg, Kailath and Olshevsky (Math. Comp. 64, 1995), "GKO".

A Toeplitz `T` has displacement rank 2: `Z₁ T - T Z₋₁ = G Hᵀ` for the cyclic
shifts `Z_φ` (ones below the diagonal, `φ` in the top right corner) and two
`(n, 2)` generators read off `T`'s first row and column. The DFT diagonalises
both shifts, so `C = F T D₀⁻¹ F⁻¹` (`F` the DFT matrix, `D₀ = diag(δᵏ)`,
`δ = exp(iπ/n)`) is Cauchy-like: `C[i, j] = ĝᵢ · ĥⱼ / (λᵢ - μⱼ)` with `λ` the n-th
roots of unity and `μ = δ λ` those of -1. Eliminating `C` with partial pivoting
only updates its generators (O(n) a step), so `P C = L U` costs O(n²) time; the
factors are stored, O(n²) memory. `T x = b` is then `x = D₀⁻¹ F⁻¹ C⁻¹ F b`, and
`det T = det C · det D₀`.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from ._dense import dense_triangular_solve


__all__ = ["batched", "gko"]


def _complex_dtype(dtype) -> jnp.dtype:
    return jnp.result_type(dtype, jnp.complex64)


def _factor(column: Array, row: Array) -> tuple[Array, Array, Array, Array]:
    """`P C = L U` for the Cauchy-like `C` of the Toeplitz matrix with first
    column `column` and first row `row` (shape `(n,)`), with partial pivoting.

    **Returns:**

    `(packed, order, pivots, parity)`: `L - I` below the diagonal and `U` on and
    above it (shape `(n, n)`, complex), the rows' order (`(P C)[k] =
    C[order[k]]`), `U`'s diagonal, and the number of row swaps modulo 2 (the
    sign of `P`).
    """
    n = column.shape[-1]
    dtype = _complex_dtype(column.dtype)
    k = jnp.arange(n)
    # The displacement Z₁ T - T Z₋₁ = e₀ aᵀ + c eₙ₋₁ᵀ (row 0 and column n - 1).
    a = jnp.concatenate([column[::-1][:-1] - row[1:], 2 * column[:1]])
    c = jnp.concatenate([jnp.zeros_like(column[:1]), row[::-1][:-1] + column[1:]])
    e0 = (k == 0).astype(dtype)
    g = jnp.stack([e0, c.astype(dtype)], axis=-1)
    h = jnp.stack([a.astype(dtype), e0[::-1]], axis=-1)
    delta = jnp.exp(1j * jnp.pi * k / n).astype(dtype)  # D₀'s diagonal
    g = jnp.fft.fft(g, axis=0)
    h = jnp.fft.ifft(h / delta[:, None], axis=0)
    lam = jnp.exp(-2j * jnp.pi * k / n).astype(dtype)
    mu = jnp.exp(1j * jnp.pi / n).astype(dtype) * lam
    # The elimination runs on real and imaginary parts as separate real arrays:
    # XLA's CPU backend runs a step of complex arithmetic about 4x slower.
    parts = lambda z: (jnp.real(z), jnp.imag(z))
    (lr, li), (mr, mi) = parts(lam), parts(mu)

    def step(carry, j):
        (gr, gi), (hr, hi), active, order, position, parity = carry
        # Column j of the Schur complement, on the rows not yet eliminated.
        col = _div(*_dot(gr, gi, hr[j], hi[j]), lr - mr[j], li - mi[j])
        col = _where(active, col)
        size = jnp.where(active, col[0] ** 2 + col[1] ** 2, -1)
        # The first row of largest magnitude (two plain reductions: XLA's CPU
        # argmax, a variadic reduction, costs several times more in this loop).
        p = jnp.min(jnp.where(size == jnp.max(size), k, n))
        pivot = (col[0][p], col[1][p])
        safe = (jnp.where(size[p] == 0, 1, pivot[0]), pivot[1])
        ell = _where(k != p, _div(*col, *safe))
        later = k > j
        urow = _div(*_dot(hr, hi, gr[p], gi[p]), lr[p] - mr, li[p] - mi)
        urow = _where(later, urow)
        urow = (urow[0].at[j].set(pivot[0]), urow[1].at[j].set(pivot[1]))
        gr, gi = _sub_outer(gr, gi, *ell, gr[p], gi[p])
        scale = _where(later, _div(*urow, *safe))
        hr, hi = _sub_outer(hr, hi, *scale, hr[j], hi[j])
        # The swap LAPACK would make: the row at position j and row p (`order`
        # holds the rows by position, `position` the positions by row).
        where, other = position[p], order[j]
        parity = parity + (where != j)
        order = order.at[where].set(other).at[j].set(p)
        position = position.at[other].set(where).at[p].set(j)
        carry = ((gr, gi), (hr, hi), active & (k != p), order, position, parity)
        return carry, (ell, urow, p)

    carry = (parts(g), parts(h), jnp.ones(n, bool), k, k, jnp.zeros((), jnp.int32))
    (*_, parity), (ells, urows, order) = lax.scan(step, carry, k)
    ells, urows = lax.complex(*ells), lax.complex(*urows)
    lower = ells[:, order].T  # L[i, j] = multiplier of row order[i] at step j
    packed = jnp.where(k[:, None] > k[None, :], lower, urows)
    return packed, order, jnp.diagonal(urows), parity % 2


def _where(mask: Array, z: tuple[Array, Array]) -> tuple[Array, Array]:
    """`z` where `mask`, else 0, by parts."""
    return jnp.where(mask, z[0], 0), jnp.where(mask, z[1], 0)


def _dot(ar: Array, ai: Array, br: Array, bi: Array) -> tuple[Array, Array]:
    """`a @ b` for complex `a` of shape `(n, 2)` and `b` of shape `(2,)`, by parts."""
    re = ar[:, 0] * br[0] - ai[:, 0] * bi[0] + ar[:, 1] * br[1] - ai[:, 1] * bi[1]
    im = ar[:, 0] * bi[0] + ai[:, 0] * br[0] + ar[:, 1] * bi[1] + ai[:, 1] * br[1]
    return re, im


def _div(ar: Array, ai: Array, br: Array, bi: Array) -> tuple[Array, Array]:
    """`a / b`, complex, by parts."""
    size = br * br + bi * bi
    return (ar * br + ai * bi) / size, (ai * br - ar * bi) / size


def _sub_outer(
    ar: Array, ai: Array, xr: Array, xi: Array, yr: Array, yi: Array
) -> tuple[Array, Array]:
    """`a - x yᵀ` for complex `a` of shape `(n, 2)`, `x` `(n,)`, `y` `(2,)`."""
    re = ar - (xr[:, None] * yr - xi[:, None] * yi)
    return re, ai - (xr[:, None] * yi + xi[:, None] * yr)


def _delta(n: int, dtype) -> Array:
    return jnp.exp(1j * jnp.pi * jnp.arange(n) / n).astype(dtype)


def gko(column: Array, row: Array, b: Array) -> tuple[Array, Array]:
    """Solve `T x = b` for the Toeplitz `T` (first column `column`, first row
    `row`, shape `(n,)`) and `b` of shape `(n, k)` by GKO, O(n² (k + 1)) time and
    O(n²) memory (the factors of the Cauchy-like matrix), and read the
    determinant off the same factors.

    **Returns:**

    `(x, pivots)`: the solution (NaN/inf where `T` is singular, as a dense
    solve), and numbers whose product is `det T`, in `T`'s dtype (shape `(n,)`):
    the moduli of `U`'s diagonal, the first one signed with the determinant (for
    a complex `T`, `U`'s diagonal with the first one multiplied by `det P det
    D₀`). A zero pivot (a singular `T`) leaves the others finite: `det` is
    exactly 0.
    """
    n = column.shape[-1]
    out_dtype = jnp.result_type(column, b)
    dtype = _complex_dtype(out_dtype)
    packed, order, pivots, parity = _factor(column, row)
    # T = F⁻¹ C F D₀, C = Pᵀ L U: x = D₀⁻¹ F⁻¹ U⁻¹ L⁻¹ P F b.
    y = jnp.fft.fft(b.astype(dtype), axis=0)[order]
    y = dense_triangular_solve(
        packed, y, lower=True, transpose_a=False, unit_diagonal=True
    )
    y = dense_triangular_solve(
        packed, y, lower=False, transpose_a=False, unit_diagonal=False
    )
    x = jnp.fft.ifft(y, axis=0) / _delta(n, dtype)[:, None]
    if not jnp.issubdtype(out_dtype, jnp.complexfloating):
        x = x.real
    # det D₀ = δ^(n (n - 1) / 2) = exp(iπ (n - 1) / 2); det P = (-1)^parity.
    phase = jnp.exp(1j * jnp.pi * (n - 1) / 2) * (1 - 2 * parity)
    phase = phase.astype(pivots.dtype)
    if jnp.issubdtype(column.dtype, jnp.complexfloating):
        return x.astype(out_dtype), pivots.at[0].multiply(phase).astype(column.dtype)
    moduli = jnp.abs(pivots)
    units = jnp.where(moduli == 0, 1, pivots / jnp.where(moduli == 0, 1, moduli))
    sign = jnp.sign(jnp.real(jnp.prod(units) * phase))
    return x.astype(out_dtype), moduli.at[0].multiply(sign).astype(column.dtype)


def batched(fn, column: Array, row: Array, *args: Array):
    """`fn(column, row, *args)` over the leading batch axes of `column`, `row`."""
    for _ in range(column.ndim - 1):
        fn = jax.vmap(fn)
    return fn(column, row, *args)
