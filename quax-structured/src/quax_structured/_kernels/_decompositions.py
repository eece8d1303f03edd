"""Singular value, QR and eigendecompositions, and matrix exponentials, of
structured matrices given by their leaves (plain arrays): diagonal, circulant
(through the FFT), Kronecker products (through the factors) and low rank
(through thin QR factorisations of the factors). Singular values come in
descending order and eigenvalues in ascending order, as `jnp.linalg.svd` and
`jnp.linalg.eigh` return them."""

import functools as ft
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._kronecker import kron_diagonal


__all__ = [
    "circulant_eigh",
    "circulant_expm",
    "circulant_svd",
    "diagonal_svd",
    "kron_expm_symmetric",
    "kron_svd",
    "lowrank_eigh",
    "lowrank_qr",
    "lowrank_svd",
    "sorted_columns",
]


def sorted_columns(values: Array, *matrices: Array, descending: bool) -> tuple:
    """`values` (shape `(*batch, n)`) sorted, and the columns of each of
    `matrices` (shape `(*batch, m, n)`) in the same order."""
    order = jnp.argsort(-values if descending else values, axis=-1, stable=True)
    out = [jnp.take_along_axis(values, order, -1)]
    out += [jnp.take_along_axis(m, order[..., None, :], -1) for m in matrices]
    return tuple(out)


def _descending(s: Array) -> list[Array]:
    """`svd_p`'s output without vectors: the singular values `s`, descending."""
    return [jnp.sort(s, axis=-1, descending=True)]


def _svd_outputs(s: Array, u: Array, v: Array) -> list[Array]:
    """`svd_p`'s outputs from unsorted singular values `s` and the matching
    columns of `U` and `V`: sorted descending, `Vᴴ` returned."""
    s, u, v = sorted_columns(s, u, v, descending=True)
    return [s, u, jnp.conj(jnp.swapaxes(v, -1, -2))]


def diagonal_svd(d: Array, compute_uv: bool) -> list[Array]:
    """`svd_p` of `diag(d)` (`d` of shape `(*batch, n)`): the moduli of `d`, the
    identity's columns as right singular vectors and the same columns times the
    phases of `d` (1 at a zero) as left ones; O(n log n), O(n²) for the vectors."""
    s = jnp.abs(d)
    if not compute_uv:
        return _descending(s)
    n = d.shape[-1]
    phase = jnp.where(s > 0, d / jnp.where(s > 0, s, 1).astype(d.dtype), 1)
    v = jnp.broadcast_to(jnp.eye(n, dtype=d.dtype), (*d.shape[:-1], n, n))
    return _svd_outputs(s, v * phase[..., None, :], v)


def _circulant_basis(n: int, dtype) -> Array:
    """A real orthonormal eigenbasis shared by every real circulant matrix of size
    `n`: column `m` is `cos(2π j m / n)` for `2m <= n` and `sin(2π j (n - m) /
    n)` for `2m > n` (normalised). Columns `m` and `n - m` span the invariant
    plane of the DFT frequencies `m` and `n - m`."""
    j, m = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    angle = 2 * jnp.pi * j * jnp.minimum(m, n - m) / n
    real = (m == 0) | (2 * m == n)
    return jnp.where(
        real,
        jnp.cos(angle) / jnp.sqrt(n),
        jnp.where(2 * m < n, jnp.cos(angle), jnp.sin(angle)) * jnp.sqrt(2 / n),
    ).astype(dtype)


def _fourier_vectors(n: int, dtype) -> Array:
    """The unitary DFT eigenvectors `exp(2πi j k / n) / sqrt(n)` as columns `k`:
    `C v_k = fft(column)[k] v_k` for every circulant `C`."""
    j, k = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    return (jnp.exp(2j * jnp.pi * (j * k % n) / n) / jnp.sqrt(n)).astype(dtype)


def circulant_eigh(column: Array) -> tuple[Array, Array]:
    """The eigenvalues (ascending) and orthonormal eigenvectors of the Hermitian
    circulant with first column `column` (shape `(*batch, n)`, `column[-k] =
    conj(column[k])`): `Re fft(column)`, O(n log n), and the cosine/sine basis
    (real `column`) or the DFT vectors (complex), O(n²) (the output)."""
    n = column.shape[-1]
    values = jnp.fft.fft(column).real.astype(jnp.finfo(column.dtype).dtype)
    if jnp.issubdtype(column.dtype, jnp.complexfloating):
        basis = _fourier_vectors(n, column.dtype)
    else:
        basis = _circulant_basis(n, column.dtype)
    basis = jnp.broadcast_to(basis, (*column.shape[:-1], n, n))
    return sorted_columns(values, basis, descending=False)


def circulant_svd(column: Array, compute_uv: bool) -> list[Array]:
    """`svd_p` of the circulant with first column `column` (shape `(*batch, n)`):
    the singular values are the moduli of its eigenvalues `λ = fft(column)`,
    O(n log n). A complex matrix has the DFT vectors `v_k` as right singular
    vectors and `v_k λ_k / |λ_k|` as left ones. A real one has real vectors: on
    the plane of the cosine and sine of frequency `k` (see `_circulant_basis`) it
    acts as `|λ_k|` times a rotation by `arg λ_k`, so the left vectors are the
    right ones rotated. O(n²) for the vectors (the output)."""
    n = column.shape[-1]
    lam = jnp.fft.fft(column)
    s = jnp.abs(lam).astype(jnp.finfo(column.dtype).dtype)
    if not compute_uv:
        return _descending(s)
    safe = jnp.where(s > 0, s, 1)
    if jnp.issubdtype(column.dtype, jnp.complexfloating):
        v = jnp.broadcast_to(_fourier_vectors(n, column.dtype), (*lam.shape, n))
        phase = jnp.where(s > 0, lam / safe, 1).astype(column.dtype)
        return _svd_outputs(s, v * phase[..., None, :], v)
    m = jnp.arange(n)
    partner = (n - m) % n
    # Column m's frequency is k = min(m, n - m); λ_{n-k} = conj(λ_k).
    lam_k = jnp.where(2 * m <= n, lam, jnp.conj(lam))
    alpha = jnp.where(s > 0, lam_k.real / safe, 1)
    side = jnp.where(2 * m < n, -1, jnp.where(2 * m > n, 1, 0))
    beta = jnp.where(s > 0, lam_k.imag / safe, 0) * side
    v = jnp.broadcast_to(_circulant_basis(n, column.dtype), (*lam.shape, n))
    u = v * alpha[..., None, :].astype(v.dtype) + v[..., partner] * beta[
        ..., None, :
    ].astype(v.dtype)
    return _svd_outputs(s, u, v)


def circulant_expm(column: Array) -> Array:
    """The first column of `expm(C)` for the circulant `C` with first column
    `column`: the circulant whose eigenvalues are `exp(fft(column))`, O(n log n)."""
    out = jnp.fft.ifft(jnp.exp(jnp.fft.fft(column)))
    if jnp.issubdtype(column.dtype, jnp.complexfloating):
        return out.astype(column.dtype)
    return out.real.astype(column.dtype)


def kron_svd(factors: Sequence[Array], compute_uv: bool) -> list[Array]:
    """`svd_p` of `A₁ ⊗ ... ⊗ A_N`: `(⊗ Uᵢ)(⊗ Σᵢ)(⊗ Vᵢ)ᴴ`, the factors' SVDs,
    O(Σ nᵢ³), the singular values sorted, O(n log n) (`n = Π nᵢ`), plus O(n²) for
    the vectors (the output)."""
    if not compute_uv:
        return _descending(kron_diagonal([jnp.linalg.svdvals(f) for f in factors]))
    svds = [jnp.linalg.svd(f) for f in factors]
    u = ft.reduce(jnp.kron, [u for u, _, _ in svds])
    v = jnp.conj(ft.reduce(jnp.kron, [vh for _, _, vh in svds])).T
    return _svd_outputs(kron_diagonal([s for _, s, _ in svds]), u, v)


def kron_expm_symmetric(factors: Sequence[Array]) -> Array:
    """`expm(A₁ ⊗ ... ⊗ A_N)` for symmetric factors: `Q exp(Λ) Qᵀ` (`Q = ⊗ Qᵢ`,
    `Λ = ⊗ Λᵢ`) through the factors' eigendecompositions, contracted one factor
    at a time: the `k`-th step replaces the grid axis of `exp(Λ)` by the pair
    `(iₖ, jₖ)`, at most O(n² max nᵢ) in all for `n = Π nᵢ` (dense: O(n³)); the
    result is the dense `(n, n)` output."""
    pairs = [jnp.linalg.eigh(f) for f in factors]
    sizes = [f.shape[0] for f in factors]
    count = len(factors)
    out = jnp.exp(kron_diagonal([w for w, _ in pairs])).astype(pairs[0][1].dtype)
    out = out.reshape(sizes)
    for k, (_, q) in enumerate(pairs):
        # Axes so far: (i₀, j₀, ..., i₍ₖ₋₁₎, j₍ₖ₋₁₎, kₖ, ..., k₍N₋₁₎); contract kₖ.
        axis = 2 * k
        moved = jnp.moveaxis(out, axis, -1)
        moved = jnp.einsum("...l,il,jl->...ij", moved, q, q)
        out = jnp.moveaxis(moved, (-2, -1), (axis, axis + 1))
    order = [2 * k for k in range(count)] + [2 * k + 1 for k in range(count)]
    n = int(np.prod(sizes))
    return out.transpose(order).reshape(n, n)


def _complete_qr(x: Array) -> tuple[Array, Array, int]:
    """The complete QR factorisation of the tall or wide `x` (shape `(n, r)`):
    `Q` (n x n), the first `m = min(n, r)` rows of `R` (m x r), and `m`."""
    q, r = jnp.linalg.qr(x, mode="complete")
    m = min(x.shape[0], x.shape[1])
    return q, r[:m], m


def lowrank_svd(u: Array, v: Array, compute_uv: bool) -> list[Array]:
    """`svd_p` of `U Vᵀ` (`U`, `V` of shape `(n, r)`): `U = Qu Ru` and `conj(V) =
    Qv Rv` (QR), the SVD of the small `Ru Rvᴴ = X Σ Yᴴ`, and `U Vᵀ = (Qu X) Σ
    (Qv Y)ᴴ`; the other `n - r` singular values are zero, with the complements of
    `Qu` and `Qv` as vectors. O(n r²), O(n² r) with the vectors."""
    n = u.shape[0]
    if not compute_uv:
        ru, rv = jnp.linalg.qr(u, mode="r"), jnp.linalg.qr(jnp.conj(v), mode="r")
        m = min(n, u.shape[1])
        small = jnp.linalg.svdvals(ru[:m] @ jnp.conj(rv[:m]).T)
        return [jnp.concatenate([small, jnp.zeros(n - m, small.dtype)])]
    qu, ru, m = _complete_qr(u)
    qv, rv, _ = _complete_qr(jnp.conj(v))
    x, small, yh = jnp.linalg.svd(ru @ jnp.conj(rv).T)
    left = jnp.concatenate([qu[:, :m] @ x, qu[:, m:]], axis=1)
    right = jnp.concatenate([qv[:, :m] @ jnp.conj(yh).T, qv[:, m:]], axis=1)
    s = jnp.concatenate([small, jnp.zeros(n - m, small.dtype)])
    # Already descending: Σ is, and the zeros come last.
    return [s, left, jnp.conj(right).T]


def lowrank_qr(u: Array, v: Array) -> tuple[Array, Array]:
    """`Q`, `R` with `Q R = U Vᵀ` (`U`, `V` of shape `(n, r)`), `Q` unitary and `R`
    upper triangular: the complete QR of `U`, `U = Qu Ru`, and the QR of the wide
    `Ru Vᵀ = Qm Rm` (`m = min(n, r)` rows, upper trapezoidal); `Q = Qu diag(Qm,
    I)` and `R = [Rm; 0]`. Any rank, O(n² r) (the `(n, n)` outputs)."""
    n = u.shape[0]
    qu, ru, m = _complete_qr(u)
    qm, rm = jnp.linalg.qr(ru @ v.T)
    q = jnp.concatenate([qu[:, :m] @ qm, qu[:, m:]], axis=1)
    r = jnp.concatenate([rm, jnp.zeros((n - m, n), rm.dtype)], axis=0)
    return q, r


@jax.custom_jvp
def lowrank_eigh(u: Array, v: Array) -> tuple[Array, Array]:
    """The eigenvalues (ascending) and orthonormal eigenvectors of the Hermitian
    part of `U Vᵀ`, `(U Vᵀ + conj(V) Uᴴ) / 2 = W M Wᴴ` for `W = [U, conj(V)]` and
    `M = [[0, I], [I, 0]] / 2`: with `W = Q R` (complete QR), the small `R M Rᴴ =
    Z Λ Zᴴ` gives `Λ` with eigenvectors `Q Z`, and the complement of `Q`'s first
    columns has eigenvalue 0. O(n² r) (the `(n, n)` output).

    Derivatives (`_lowrank_eigh_jvp`) are those of `jnp.linalg.eigh` of the
    Hermitian part, formed through the factors: differentiating through the QR
    gave NaN wherever `W` has dependent columns, as it always has for the
    Hermitian part JAX's `eigh` forms first (`(A + Aᴴ) / 2` of a `LowRank` is a
    `LowRank` whose factors repeat `U` and `V`), for about half of random
    6 x 2 factors."""
    n, r = u.shape
    w = jnp.concatenate([u, jnp.conj(v)], axis=1)
    q, rw, m = _complete_qr(w)
    zero = jnp.zeros((r, r), w.dtype)
    eye = jnp.eye(r, dtype=w.dtype) / 2
    middle = jnp.block([[zero, eye], [eye, zero]])
    small = rw @ middle @ jnp.conj(rw).T
    lam, z = jnp.linalg.eigh(small, symmetrize_input=True)
    values = jnp.concatenate([lam, jnp.zeros(n - m, lam.dtype)])
    vectors = jnp.concatenate([q[:, :m] @ z, q[:, m:]], axis=1)
    return sorted_columns(values, vectors, descending=False)


@lowrank_eigh.defjvp
def _lowrank_eigh_jvp(
    primals: tuple[Array, Array], tangents: tuple[Array, Array]
) -> tuple[tuple[Array, Array], tuple[Array, Array]]:
    """JAX's `eigh` derivative (`dλ = diag(Qᴴ dH Q)`, `dQ = Q (F ∘ Qᴴ dH Q)` with
    `Fᵢⱼ = 1 / (λⱼ - λᵢ)` off the diagonal) for `H` the Hermitian part of `U Vᵀ`,
    with `Qᴴ dH Q` formed through the factors in O(n² r): `Qᴴ dA Q = (Qᴴ dU)(Vᵀ Q)
    + (Qᴴ U)(dVᵀ Q)`, `dA = dU Vᵀ + U dVᵀ`, and its Hermitian part. No `(n, n)`
    tangent of `H` is formed."""
    u, v = primals
    du, dv = tangents
    values, vectors = lowrank_eigh(u, v)
    qh = jnp.conj(vectors).T
    da = (qh @ du) @ (v.T @ vectors) + (qh @ u) @ (dv.T @ vectors)
    projected = (da + jnp.conj(da).T) / 2
    eye = jnp.eye(values.shape[-1], dtype=values.dtype)
    gaps = jnp.reciprocal(eye + values[None, :] - values[:, None]) - eye
    d_values = jnp.real(jnp.diagonal(projected)).astype(values.dtype)
    d_vectors = vectors @ (gaps.astype(projected.dtype) * projected)
    return (values, vectors), (d_values, d_vectors)
