"""The rest of `jnp.linalg` where a structure makes it cheap (issue 29, item 6):
the singular value decomposition (`jnp.linalg.svd`, `svdvals`, and through it
`lstsq`), the pseudo-inverse (`jnp.linalg.pinv`) as a structure, the QR
factorisation, the eigendecomposition of low-rank
matrices, Kronecker products plus a multiple of the identity and Kronecker sums
(`A ⊗ I + I ⊗ B`), and the matrix
exponential (`jax.scipy.linalg.expm`), each by structure. Every function returns
`None` where the structure has no such algorithm; the rules (`_rules.py`) then
refuse, naming the way out."""

import functools as ft
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import quax
from jax import lax
from jaxtyping import Array, ArrayLike

from ._kernels import (
    circulant_expm,
    circulant_svd,
    diagonal_svd,
    kron_expm_symmetric,
    kron_sum_eigh,
    kron_svd,
    lowrank_eigh,
    lowrank_qr,
    lowrank_svd,
    sorted_columns,
)
from ._values._base import (
    FUNCTION_JVP_RULES,
    StructuredMaterialisationError,
    StructuredMatrix,
    jvp_over_leaves,
)
from ._values._blockdiagonal import BlockDiagonal
from ._values._circulant import Circulant
from ._values._composite import Sum
from ._values._diagonal import Diagonal, ScaledIdentity
from ._values._kronecker import Kronecker, KroneckerPlusIdentity
from ._values._lowrank import LowRank, LowRankPlusDiagonal


__all__ = [
    "EXPM_TYPES",
    "PINV_TYPES",
    "eigh_of",
    "expm_of",
    "pinv_jvp_rule",
    "pinv_of",
    "qr_of",
    "svd_of",
]


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
    decomposition = x.eigh() if isinstance(x, KroneckerPlusIdentity) else None
    if decomposition is not None:
        return _symmetric_svd(*decomposition, compute_uv)
    if isinstance(x, Sum):
        return _kronecker_sum_svd(x, compute_uv)
    return None


def _symmetric_svd(values: Array, vectors: Array, compute_uv: bool) -> list[Array]:
    """`svd_p`'s outputs for a real symmetric matrix from its eigendecomposition:
    `|λ|` with the eigenvectors, the left ones negated where `λ < 0`."""
    if not compute_uv:
        return [jnp.sort(jnp.abs(values), descending=True)]
    signs = jnp.where(values < 0, -1, 1).astype(vectors.dtype)
    s, left, right = sorted_columns(
        jnp.abs(values), vectors * signs, vectors, descending=True
    )
    return [s, left, right.T]


def _kronecker_sum_svd(x: Sum, compute_uv: bool) -> list[Array] | None:
    """The SVD of a real Kronecker sum `A₁ ⊕ ... ⊕ A_N` whose terms are tagged
    `symmetric` (then so is every `Aᵢ`, and the sum): through the factors'
    eigendecompositions (see `kron_sum_eigh`). A Kronecker sum without the tags
    (its singular values are not those of its factors) refuses, naming the ways
    out; anything else is `None`."""
    sides = _kronecker_sum_sides(x)
    if sides is None:
        return None
    if x.symmetric and not jnp.issubdtype(x.dtype, jnp.complexfloating):
        return _symmetric_svd(*kron_sum_eigh(sides), compute_uv)
    if x.allow_materialise:
        return None
    raise StructuredMaterialisationError(
        "Refusing to materialise a Kronecker sum `A ⊗ I + I ⊗ B` (a `Sum` of "
        "`Kronecker`s) for `jnp.linalg.svd`/`svdvals`: its singular values follow "
        "from its factors' only where it is real and symmetric, which quax-structured "
        "knows from the tag `symmetric=True` on every term (`Kronecker(a, "
        "ScaledIdentity(1.0, n), symmetric=True)`; the identity factors are "
        "symmetric already). Tag the terms if the factors are symmetric, use "
        "`jnp.linalg.eigh`/`eigvalsh` for the eigenvalues of its symmetric part, "
        "or allow the dense O(n³) SVD: `allow_materialise=True` on the terms, "
        "or `.enable_materialise()` on the sum."
    )


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


def eigh_of(x: StructuredMatrix) -> tuple[Array, Array] | None:
    """The eigenvalues (ascending) and orthonormal eigenvectors of the
    (symmetrised) `x`: the low-rank one through a thin QR factorisation (see
    `lowrank_eigh`), `A₁ ⊗ ... ⊗ A_N + c I` through the factors'
    eigendecompositions, `(⊗ Qᵢ)(⊗ Λᵢ + c)(⊗ Qᵢ)ᵀ`, and a Kronecker sum `A₁ ⊕ ...
    ⊕ A_N` (a `Sum` of `Kronecker`s, see `_kronecker_sum_sides`) through its
    factors' Hermitian parts', `λ₁ + ... + λ_N` with `⊗ Qᵢ` (see `kron_sum_eigh`);
    O(Σ nᵢ³), plus O(n²) for the vectors, the output. Else `None`."""
    if isinstance(x, LowRank):
        return lowrank_eigh(x.u, x._v())
    if isinstance(x, KroneckerPlusIdentity):
        return x.eigh()
    sides = _kronecker_sum_sides(x) if isinstance(x, Sum) else None
    if sides is None:
        return None
    return kron_sum_eigh([(s + jnp.conj(s.T)) / 2 for s in sides])


def _identity_scale(term: Kronecker, k: int) -> Any:
    """`c` where factor `k` of `term` is `c I`: stored as a `ScaledIdentity` (its
    scale, also where traced), or shown by the program to be one (a constant,
    finite, with no entry off the diagonal and one value on it); else `None`."""
    stored = term.identity_scales()[k]
    if stored is not None:
        return stored
    known = quax.known_constant(term.factors()[k], 2**20)
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
    but at most one multiples of the identity: `ScaledIdentity` factors
    (`Kronecker(a, ScaledIdentity(c, nb))`, known whatever the program), or
    factors the program shows to be (`Kronecker(a, c * jnp.eye(nb))` built in
    it). Else `None`."""
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
        scales = [_identity_scale(term, k) for k in range(len(factors))]
        others = [k for k, c in enumerate(scales) if c is None]
        if len(others) > 1:
            return None
        k = others[0] if others else 0
        c = ft.reduce(lambda p, q: p * q, scales[:k] + scales[k + 1 :], 1)
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
    if isinstance(x, KroneckerPlusIdentity) and x.symmetric:
        return kron_expm_symmetric(x.factors()) * jnp.exp(x.scale)
    return None


# The structures `pinv_of` pseudo-inverts (`Kronecker`: see `_kronecker_pinv`).
PINV_TYPES = (Diagonal, ScaledIdentity, Circulant, BlockDiagonal, Kronecker, LowRank)


def _inverted(values: Array, keep: Array) -> Array:
    """`1 / values` where `keep`, else 0; with no division by the others (whose
    derivative, `0 * inf`, would be NaN in reverse mode)."""
    safe = jnp.where(keep, values, jnp.ones((), values.dtype))
    return jnp.where(keep, 1 / safe, jnp.zeros((), values.dtype))


def _kept(s: Array, rtol: Array) -> Array:
    """Which of the singular values `s` (last axis) `jnp.linalg.pinv` keeps: those
    above `rtol` times the largest (`rtol` one per matrix of the batch)."""
    top = jnp.max(s, axis=-1, keepdims=True)
    return s > rtol[..., None] * top


def _finite_or_nan(inverse: Array, values: Array) -> Array:
    """`inverse`, or NaN throughout (one matrix of the batch, the last axis of
    `values`) where any of `values` is NaN or infinite."""
    finite = jnp.all(jnp.isfinite(values), axis=-1, keepdims=True)
    return jnp.where(finite, inverse, jnp.asarray(jnp.nan, inverse.dtype))


def pinv_of(
    x: StructuredMatrix, rtol: ArrayLike | None, hermitian: bool
) -> StructuredMatrix | None:
    """`jnp.linalg.pinv(x, rtol, hermitian)` as a structure, by JAX's semantics:
    the singular values at most `rtol` times the largest are dropped (by default
    `rtol = 10 n eps`, `eps` of `x`'s dtype), and with `hermitian` the Hermitian
    part `(x + xᴴ) / 2` is pseudo-inverted (its singular values are its
    eigenvalues' moduli). A `Diagonal` (`ScaledIdentity`) to `1 / d` where kept;
    a `Circulant` to the circulant with eigenvalues `1 / λ` where kept (`λ =
    fft(column)`, whose moduli are the singular values), O(n log n); a
    `BlockDiagonal` to each block's pseudo-inverse, with the cutoff of the whole
    matrix; a `Kronecker` to the factors' (see `_kronecker_pinv`); a `LowRank`
    to a `LowRank` of the same rank (see `_lowrank_pinv`). A NaN or infinite
    entry of a `Diagonal`, `ScaledIdentity` or `Circulant` makes every stored
    value NaN, as dense JAX's `pinv` is NaN everywhere (its largest singular value,
    the cutoff's scale, is not finite: compared with it, every value would be
    dropped, giving a zero matrix). `None` for other structures and types that are
    not floating point."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return None
    if rtol is None:
        rtol = 10.0 * x.shape[-1] * jnp.array(jnp.finfo(x.dtype).eps)
    rtol = jnp.asarray(rtol)
    kw = dict(allow_materialise=x.allow_materialise)
    if isinstance(x, ScaledIdentity):
        scale = jnp.asarray(x.scale)
        if hermitian:
            scale = scale.real.astype(x.dtype)
        keep = jnp.abs(scale) > rtol * jnp.abs(scale)
        inverse = _inverted(scale, keep)
        inverse = jnp.where(jnp.isfinite(scale), inverse, jnp.nan).astype(scale.dtype)
        return ScaledIdentity(inverse, x.n, **kw)
    if isinstance(x, Diagonal):
        d = x.diag.real.astype(x.dtype) if hermitian else x.diag
        inverse = _finite_or_nan(_inverted(d, _kept(jnp.abs(d), rtol)), d)
        return Diagonal(inverse, **kw)
    if isinstance(x, Circulant):
        column = x.column
        if hermitian:
            column = (column + jnp.conj(x.transpose().column)) / 2
        eigenvalues = jnp.fft.fft(column)
        if hermitian:
            eigenvalues = eigenvalues.real
        inverse = _inverted(eigenvalues, _kept(jnp.abs(eigenvalues), rtol))
        column = jnp.fft.ifft(_finite_or_nan(inverse, eigenvalues))
        if not jnp.issubdtype(x.dtype, jnp.complexfloating):
            column = column.real
        return Circulant(column.astype(x.dtype), **kw)
    if isinstance(x, BlockDiagonal):
        return x._with(_block_pinv(x.blocks, rtol, hermitian))
    if isinstance(x, LowRank) and not hermitian:
        # (With `hermitian`, JAX's body: through `eigh` of the low-rank matrix.)
        return LowRank(*_lowrank_pinv(x.u, x._v(), rtol), **kw)
    if isinstance(x, Kronecker):
        real = not jnp.issubdtype(x.dtype, jnp.complexfloating)
        if hermitian and not (x.symmetric and real):
            # `(A ⊗ B + Aᴴ ⊗ Bᴴ) / 2` is no Kronecker product.
            return None
        return _kronecker_pinv(x, rtol)
    return None


@jax.custom_jvp
def _dense_pinv(a: Array, cutoff: Array) -> Array:
    """The pseudo-inverse of the square matrices `a` (`(*batch, k, k)`) without
    the singular values at most `cutoff` (one per matrix, an absolute value), by
    JAX's algorithm. JAX's own `pinv` takes `rtol` (relative) as a static
    argument of its custom derivative, which must not be traced: inside a
    traced `pinv` it is."""
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    inverse = _inverted(s, s > cutoff[..., None]).astype(u.dtype)
    right = jnp.conj(jnp.swapaxes(vh, -1, -2)) * inverse[..., None, :]
    left = jnp.conj(jnp.swapaxes(u, -1, -2))
    return jnp.matmul(right, left, precision=lax.Precision.HIGHEST)


@_dense_pinv.defjvp
def _dense_pinv_jvp(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    """The derivative of a pseudo-inverse `P` of `A` (Golub and Pereyra, 1973),
    as JAX's `pinv` differentiates: `-P dA P + P Pᴴ dAᴴ (I - A P) + (I - P A)
    dAᴴ Pᴴ P` (the cutoff is held fixed)."""
    (a, cutoff), (da, _) = primals, tangents
    p = _dense_pinv(a, cutoff)
    h = lambda x: jnp.conj(jnp.swapaxes(x, -1, -2))
    mm = ft.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
    pp = mm(p, h(p))
    out = -mm(mm(p, da), p) + mm(pp, h(da)) - mm(mm(pp, h(da)), mm(a, p))
    pp = mm(h(p), p)
    out = out + mm(h(da), pp) - mm(mm(p, a), mm(h(da), pp))
    return p, out


def _block_pinv(blocks: Array, rtol: Array, hermitian: bool) -> Array:
    """Each block's pseudo-inverse, with the cutoff of the whole block-diagonal
    matrix: `rtol` times the largest singular value of any block."""
    if hermitian:
        blocks = (blocks + jnp.conj(jnp.swapaxes(blocks, -1, -2))) / 2
    s = lax.stop_gradient(jnp.linalg.svdvals(blocks))
    top = jnp.max(s, axis=(-2, -1))
    cutoff = jnp.broadcast_to((rtol * top)[..., None], blocks.shape[:-2])
    return _dense_pinv(blocks, cutoff)


def _lowrank_pinv(u: Array, v: Array, rtol: Array) -> tuple[Array, Array]:
    """The factors `(U', V')` of `pinv(U Vᵀ) = U' V'ᵀ`: with the thin QR
    factorisations `U = Qu Ru` and `conj(V) = Qv Rv`, `U Vᵀ = Qu K Qvᴴ` for the
    small `K = Ru Rvᴴ`, whose singular values are the matrix's nonzero ones, so
    `pinv(U Vᵀ) = Qv pinv(K) Quᴴ` with the cutoff `rtol` times `K`'s largest:
    `U' = Qv pinv(K)`, `V' = conj(Qu)`. Any rank; O(n r² + r³)."""
    qu, ru = jnp.linalg.qr(u)
    qv, rv = jnp.linalg.qr(jnp.conj(v))
    k = ru @ jnp.conj(rv).T
    top = jnp.max(lax.stop_gradient(jnp.linalg.svdvals(k)))
    return qv @ _dense_pinv(k, rtol * top), jnp.conj(qu)


def _kronecker_pinv(x: Kronecker, rtol: Array) -> Kronecker:
    """`pinv(A ⊗ B) = pinv(A) ⊗ pinv(B)`, each factor's with the same `rtol`.

    The singular values of `A ⊗ B` are the products `a_i b_j`, and the cutoff is
    `rtol a_max b_max`. A factor's own cutoff, `rtol a_max`, keeps the `a_i` of
    every kept product (`a_i b_max` is the largest with `a_i`); the products of
    kept factor values are all kept exactly when the smallest of them, `a_min
    b_min` over the kept values, is above the cutoff. Then the Kronecker product
    of the factors' pseudo-inverses is the pseudo-inverse; otherwise (some
    product of kept values falls under the cutoff: the kept set is no product of
    sets, and the pseudo-inverse no Kronecker product) both factors are NaN,
    never a different matrix. Any number of factors; O(Σ nₖ³)."""
    factors = x.factors()
    values = [lax.stop_gradient(jnp.linalg.svdvals(f)) for f in factors]
    tops = [jnp.max(s) for s in values]
    cutoffs = [rtol * top for top in tops]
    kept = [jnp.where(s > c, s, jnp.inf) for s, c in zip(values, cutoffs, strict=True)]
    smallest = ft.reduce(jnp.multiply, [jnp.min(k) for k in kept])
    exact = smallest > rtol * ft.reduce(jnp.multiply, tops)
    pinvs = [_dense_pinv(f, c) for f, c in zip(factors, cutoffs, strict=True)]
    nan = jnp.asarray(jnp.nan, x.dtype)
    pinvs = [jnp.where(exact, p, nan) for p in pinvs]
    kw = dict(allow_materialise=x.allow_materialise)
    return Kronecker(*pinvs, symmetric=x.symmetric, **kw)


def pinv_jvp_rule(
    fun: Callable[..., list[Any]], x: StructuredMatrix
) -> Callable[[list[Any], list[Any]], tuple] | None:
    """The JVP of `jnp.linalg.pinv` (its `custom_jvp` function `_pinv`) for a
    structure that `pinv_of` pseudo-inverts: the derivative of `pinv_of` over the
    leaves (see `quax.Value.custom_jvp_rule`), a tangent of the output's structure
    (JAX's rule would work on the dense `(n, n)` tangent). Where the set of kept
    singular values does not change it is the derivative JAX's rule gives: for
    the kept values of a diagonal (or, in the Fourier basis, a circulant) `-dλ /
    λ²` and 0 for the dropped ones; the blocks' and the factors' through JAX's
    own rule for each (`d pinv(A ⊗ B) = d pinv(A) ⊗ pinv(B) + pinv(A) ⊗ d
    pinv(B)`, which JAX's rule for the whole matrix also gives). `None` for other
    structures."""
    if not isinstance(x, PINV_TYPES):
        return None

    def rule(primals: list[Any], tangents: list[Any]) -> tuple:
        (m,), (dot,) = primals, tangents
        if isinstance(m, LowRank):
            (p,) = fun(m)
            if isinstance(p, LowRank):
                return [p], [_lowrank_pinv_tangent(m, dot, p)]
        return jvp_over_leaves(fun, m, dot)

    return rule


def _lowrank_pinv_tangent(m: LowRank, dot: LowRank, p: LowRank) -> LowRank:
    """The tangent of `P = pinv(M)` for `M = U Vᵀ` in the direction `dM = dU Vᵀ +
    U dVᵀ`, by JAX's formula (see `_dense_pinv_jvp`) on the factors, as the
    leaves' tangents of `P = U' V'ᵀ`: every term of `-P dM P + P Pᴴ dMᴴ (I - M
    P) + (I - P M) dMᴴ Pᴴ P` is `U' Xᵀ` or `Y V'ᵀ`, so `dU' = Y` and `dV' = X`,
    O(n r²). Not the derivative of `_lowrank_pinv`'s QR factorisations, which is
    NaN where `U` or `V` has dependent columns (where dense JAX's is finite)."""
    u, v, du, dv = m.u, m._v(), dot.u, dot._v()
    up, vp = p.u, p._v()
    h = lambda x: jnp.conj(x).T
    mm = ft.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
    w = mm(v.T, up)  # M P = U W V'ᵀ
    c = mm(mm(vp.T, du), w) + mm(mm(vp.T, u), mm(dv.T, up))  # P dM P = U' C V'ᵀ
    # P Pᴴ dMᴴ = U' G Uᴴ' dMᴴ, times (I - M P), as U' Xᵀ.
    g = mm(vp.T, jnp.conj(vp))
    y = mm(g, mm(mm(h(up), jnp.conj(v)), h(du)) + mm(mm(h(up), jnp.conj(dv)), h(u)))
    x_t = -mm(c, vp.T) + y - mm(mm(mm(y, u), w), vp.T)
    # (I - P M) dMᴴ Pᴴ P = (I - U' V'ᵀ U Vᵀ) dMᴴ conj(V') (Uᴴ' U') V'ᵀ.
    z = mm(jnp.conj(v), mm(h(du), jnp.conj(vp))) + mm(
        jnp.conj(dv), mm(h(u), jnp.conj(vp))
    )
    z = z - mm(up, mm(mm(vp.T, u), mm(v.T, z)))
    dup = mm(z, mm(h(up), up))
    return LowRank(dup, x_t.T, allow_materialise=p.allow_materialise)


FUNCTION_JVP_RULES["_pinv"] = pinv_jvp_rule
