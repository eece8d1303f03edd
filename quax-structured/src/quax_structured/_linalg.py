"""The rest of `jnp.linalg` where a structure makes it cheap (issue 29, item 6):
the singular value decomposition (`jnp.linalg.svd`, `svdvals`, and through them
`lstsq` and `pinv`), the QR factorisation, the eigendecomposition of low-rank
matrices and Kronecker products plus a multiple of the identity, and the matrix
exponential (`jax.scipy.linalg.expm`), each by structure. Every function returns
`None` where the structure has no such algorithm; the rules (`_rules.py`) then
refuse, naming the way out."""

from typing import Any

import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import quax
from jaxtyping import Array

from ._kernels import (
    circulant_expm,
    circulant_svd,
    diagonal_svd,
    kron_expm_symmetric,
    kron_svd,
    lowrank_eigh,
    lowrank_qr,
    lowrank_svd,
    sorted_columns,
)
from ._values._base import StructuredMatrix
from ._values._blockdiagonal import BlockDiagonal
from ._values._circulant import Circulant
from ._values._composite import Sum
from ._values._diagonal import Diagonal, ScaledIdentity
from ._values._kronecker import Kronecker, KroneckerPlusIdentity
from ._values._lowrank import LowRank, LowRankPlusDiagonal


__all__ = ["EXPM_TYPES", "eigh_of", "expm_of", "qr_of", "svd_of"]


# The structures `expm` has an algorithm for (`Kronecker`: see `expm`), as the
# refusal names them.
EXPM_TYPES = (
    "Diagonal",
    "ScaledIdentity",
    "Circulant",
    "BlockDiagonal",
    "LowRank",
    "Kronecker",
    "KroneckerPlusIdentity",
    "a Kronecker sum",
)


def svd_of(x: StructuredMatrix, compute_uv: bool) -> list[Array] | None:
    """`svd_p`'s outputs for `x` (`[s]`, or `[s, U, Vᴴ]`): square matrices, so
    `full_matrices` does not change them."""
    if isinstance(x, ScaledIdentity):
        x = x._as_diagonal()
    if isinstance(x, Diagonal):
        return diagonal_svd(x.diag, compute_uv)
    if isinstance(x, Circulant):
        return circulant_svd(x.column, compute_uv)
    if isinstance(x, Kronecker):
        return kron_svd(x.factors(), compute_uv)
    if isinstance(x, LowRank):
        return lowrank_svd(x.u, x._v(), compute_uv)
    if isinstance(x, BlockDiagonal):
        # Each block's SVD; the vectors block-diagonal (the dense output).
        if not compute_uv:
            s = jnp.linalg.svdvals(x.blocks)
            return [jnp.sort(s.reshape(*s.shape[:-2], -1), axis=-1, descending=True)]
        u, s, vh = jnp.linalg.svd(x.blocks)
        left = x._with(u).dense()
        right = x._with(jnp.conj(jnp.swapaxes(vh, -1, -2))).dense()
        s, left, right = sorted_columns(
            s.reshape(*s.shape[:-2], -1), left, right, descending=True
        )
        return [s, left, jnp.conj(jnp.swapaxes(right, -1, -2))]
    if isinstance(x, KroneckerPlusIdentity):
        # Symmetric: `|λ|` with the eigenvectors, the left ones negated where `λ < 0`.
        values, vectors = eigh_of(x)
        if not compute_uv:
            return [jnp.sort(jnp.abs(values), descending=True)]
        signs = jnp.where(values < 0, -1, 1).astype(vectors.dtype)
        s, left, right = sorted_columns(
            jnp.abs(values), vectors * signs, vectors, descending=True
        )
        return [s, left, right.T]
    return None


def qr_of(x: StructuredMatrix) -> tuple[Any, Any] | None:
    """`Q`, `R` (`Q` unitary, `R` upper triangular, `Q R = x`), structured where
    the factors have the structure: `I` and the matrix itself for a diagonal
    matrix, the factors' QR factorisations for a Kronecker product (`(Qa ⊗ Qb)
    (Ra ⊗ Rb)`; a Kronecker product of upper triangular matrices is upper
    triangular), each block's for a block-diagonal matrix; dense `(n, n)` factors
    for a low-rank matrix (see `lowrank_qr`)."""
    if isinstance(x, ScaledIdentity | Diagonal):
        one = jnp.ones(x.shape[:-2], x.dtype)
        kw = dict(allow_materialise=x.allow_materialise)
        return ScaledIdentity(one, x.shape[-1], **kw), x
    if isinstance(x, Kronecker):
        qs, rs = zip(*(jnp.linalg.qr(f) for f in x.factors()), strict=True)
        kw = dict(allow_materialise=x.allow_materialise)
        return Kronecker(*qs, **kw), Kronecker(*rs, triangle="upper", **kw)
    if isinstance(x, BlockDiagonal):
        q, r = jnp.linalg.qr(x.blocks)
        return x._with(q), x._with(r)
    if isinstance(x, LowRank):
        return lowrank_qr(x.u, x._v())
    return None


def eigh_of(x: LowRank | KroneckerPlusIdentity) -> tuple[Array, Array]:
    """The eigenvalues (ascending) and orthonormal eigenvectors of the
    (symmetrised) `x`: the low-rank one through a thin QR factorisation (see
    `lowrank_eigh`), `A₁ ⊗ ... ⊗ A_N + c I` through the factors'
    eigendecompositions, `(⊗ Qᵢ)(⊗ Λᵢ + c)(⊗ Qᵢ)ᵀ` (O(Σ nᵢ³), plus O(n²) for the
    vectors, the output)."""
    if isinstance(x, LowRank):
        return lowrank_eigh(x.u, x._v())
    return x.eigh()


def _identity_scale(factor: Array) -> Array | None:
    """`c` where the program shows `factor` to be `c I` (a constant, finite, with
    no entry off the diagonal and one value on it), else `None`."""
    known = quax.known_constant(factor, 2**20)
    if known is None:
        return None
    known = np.asarray(known)
    diagonal = np.diagonal(known)
    off = ~np.eye(known.shape[0], dtype=bool)
    if np.any(known[off] != 0) or not np.all(np.isfinite(diagonal)):
        return None
    if not np.all(diagonal == diagonal[0]):
        return None
    return diagonal[0]


def _kronecker_sum_sides(x: StructuredMatrix) -> list[Array] | None:
    """`[A₁, ..., A_N]` where `x` is the Kronecker sum `A₁ ⊗ I ⊗ ... ⊗ I + ... +
    I ⊗ ... ⊗ I ⊗ A_N` (for two factors, `A ⊗ I + I ⊗ B`): a `Kronecker` or a
    `Sum` of `Kronecker`s with factors of the same sizes, each with all factors
    but at most one shown by the program to be constant multiples of the
    identity (`Kronecker(a, c * jnp.eye(nb))`). Else `None`."""
    parts = x.terms if isinstance(x, Sum) else (x,)
    terms = [t for t in parts if isinstance(t, Kronecker)]
    if len(terms) != len(parts):
        return None
    shapes = {t.sizes for t in terms}
    if len(shapes) != 1:
        return None
    ((*sizes,),) = shapes
    dtype = x.dtype
    sides = [jnp.zeros((size, size), dtype) for size in sizes]
    for term in terms:
        factors = term.factors()
        scales = [_identity_scale(f) for f in factors]
        others = [k for k, c in enumerate(scales) if c is None]
        if len(others) > 1:
            return None
        k = others[0] if others else 0
        c = np.prod(
            [np.asarray(c) for c in scales[:k] + scales[k + 1 :] if c is not None]
        )
        sides[k] = sides[k] + (factors[k] * c).astype(dtype)
    return sides


def expm_of(x: StructuredMatrix) -> Any | None:
    """`jax.scipy.linalg.expm(x)`, exactly (no Padé approximant), where the
    structure gives it: `exp` of the diagonal; the circulant with eigenvalues
    `exp(fft(column))`; each block's `expm`; `I + U φ(Vᵀ U) Vᵀ` for a low-rank
    `U Vᵀ` (`φ(z) = (eᶻ - 1) / z`, a `LowRankPlusDiagonal`); `expm(A) ⊗ expm(B)`
    for a Kronecker sum `A ⊗ I + I ⊗ B` (`⊗ expm(Aᵢ)` for N factors; also a
    single `Kronecker` with identity factors); for a symmetric `Kronecker`
    product, or one plus `c I`, the factors' eigendecompositions (a dense result,
    contracted one factor at a time, see `kron_expm_symmetric`)."""
    kw = dict(allow_materialise=x.allow_materialise)
    if isinstance(x, ScaledIdentity):
        return ScaledIdentity(jnp.exp(x.scale), x.n, **kw)
    if isinstance(x, Diagonal):
        return Diagonal(jnp.exp(x.diag), **kw)
    if isinstance(x, Circulant):
        return Circulant(circulant_expm(x.column), **kw)
    if isinstance(x, BlockDiagonal):
        return x._with(jsl.expm(x.blocks))
    if isinstance(x, LowRank):
        u, v = x.u, x._v()
        r = u.shape[1]
        # φ(M) is the top-right block of expm([[M, I], [0, 0]]).
        big = jnp.zeros((2 * r, 2 * r), x.dtype)
        big = big.at[:r, :r].set(v.T @ u).at[:r, r:].set(jnp.eye(r, dtype=x.dtype))
        phi = jsl.expm(big)[:r, r:]
        ones = jnp.ones(u.shape[0], x.dtype)
        return LowRankPlusDiagonal(ones, u @ phi, v, **kw)
    sides = _kronecker_sum_sides(x) if isinstance(x, Kronecker | Sum) else None
    if sides is not None:
        return Kronecker(*(jsl.expm(s) for s in sides), **kw)
    if isinstance(x, Kronecker) and x.symmetric:
        return kron_expm_symmetric(x.factors())
    if isinstance(x, KroneckerPlusIdentity):
        return kron_expm_symmetric(x.factors()) * jnp.exp(x.scale)
    return None
