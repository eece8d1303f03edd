"""The Kronecker sum `A ⊗ I + I ⊗ B` (issue 29, item 6): with its identity
factors stored as `ScaledIdentity`s, the structure itself knows it is a Kronecker
sum, so that `jnp.linalg.eigh`/`eigvalsh` (whose body is a `jit`: the factors are
its arguments there), `svd`/`svdvals` (real symmetric terms) and
`jax.scipy.linalg.expm` go through the factors, also with traced leaves; against
plain JAX / NumPy on the dense matrix, for two and three terms, in float32 and
float64, gradients included."""

import functools as ft

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_structured as qs
import scipy.linalg


pytestmark = pytest.mark.usefixtures("x64")

SIZES = {2: (3, 4), 3: (2, 3, 2)}
DTYPES = [jnp.float32, jnp.float64]


def _rand(seed, *shape, dtype=jnp.float64):
    x = jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)
    return x.astype(dtype)


def _sym(a):
    return (a + a.T) / 2


def _terms(sides, scales, symmetric=False):
    """The terms `c₁ I ⊗ ... ⊗ Aₖ ⊗ ... ⊗ I` (the identities `ScaledIdentity`s of
    scales `scales`)."""
    sizes = [s.shape[0] for s in sides]
    terms = []
    for k, side in enumerate(sides):
        factors = [
            side if j == k else qs.ScaledIdentity(scales[k], size)
            for j, size in enumerate(sizes)
        ]
        terms.append(qs.Kronecker(*factors, symmetric=symmetric))
    return terms


def _kronecker_sum(sides, scales, symmetric=False):
    terms = _terms(sides, scales, symmetric)
    return quax.quaxify(lambda *ts: ft.reduce(lambda p, q: p + q, ts))(*terms)


def _dense_sum(sides, scales):
    """`Σₖ cₖ^(N - 1) I ⊗ ... ⊗ Aₖ ⊗ ... ⊗ I`, dense, in plain JAX."""
    sizes = [s.shape[0] for s in sides]
    total = 0
    for k, side in enumerate(sides):
        factors = [
            side if j == k else scales[k] * jnp.eye(size, dtype=side.dtype)
            for j, size in enumerate(sizes)
        ]
        total = total + ft.reduce(jnp.kron, factors)
    return total


def _case(nterms, dtype, seed=0):
    sides = [_rand(seed + k, n, n, dtype=dtype) for k, n in enumerate(SIZES[nterms])]
    scales = [jnp.asarray(1.0 + 0.5 * k, dtype) for k in range(nterms)]
    return sides, scales


@pytest.mark.parametrize("nterms", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_eigh_under_jit_matches_dense(nterms, dtype, close):
    """`jax.jit(jnp.linalg.eigh)` of the sum, the factors and the identities'
    scales all arguments of the `jit`: the eigenvalues of the symmetric part (as
    `eigh` symmetrises its input) and an orthonormal eigenbasis."""
    sides, scales = _case(nterms, dtype)

    @jax.jit
    def run(sides, scales):
        return quax.quaxify(jnp.linalg.eigh)(_kronecker_sum(sides, scales))

    w, v = run(sides, scales)
    dense = _dense_sum(sides, scales)
    h = _sym(dense)
    close(w, jnp.linalg.eigvalsh(h), dtype)
    assert np.all(np.diff(np.asarray(w, np.float64)) >= 0), "ascending"
    close((v * w) @ v.T, h, dtype)
    close(v.T @ v, jnp.eye(v.shape[0], dtype=dtype), dtype)
    values = jax.jit(quax.quaxify(jnp.linalg.eigvalsh))(_kronecker_sum(sides, scales))
    close(values, jnp.linalg.eigvalsh(h), dtype)


def test_eigh_no_dense_decomposition():
    """The program holds the factors' `eigh`s, none of the whole matrix's size."""
    sides, scales = _case(2, jnp.float64)
    k = _kronecker_sum(sides, scales)
    text = jax.jit(quax.quaxify(jnp.linalg.eigvalsh)).lower(k).as_text()
    assert text is not None
    assert "tensor<12x12xf64>" not in text
    assert "tensor<3x3xf64>" in text and "tensor<4x4xf64>" in text


@pytest.mark.parametrize("nterms", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_svd_of_symmetric_terms_matches_dense(nterms, dtype, close):
    """Terms tagged `symmetric=True`: `svd` (`U diag(s) Vᵀ` reconstructs the
    matrix, orthonormal factors) and `svdvals` against dense."""
    sides, scales = _case(nterms, dtype)
    # The tag needs symmetric factors (a factor that is not is refused).
    sides = [_sym(s) for s in sides]
    k = _kronecker_sum(sides, scales, symmetric=True)
    dense = _dense_sum(sides, scales)
    u, s, vh = jax.jit(quax.quaxify(jnp.linalg.svd))(k)
    close(s, jnp.linalg.svd(dense, compute_uv=False), dtype)
    assert np.all(np.diff(np.asarray(s, np.float64)) <= 0), "descending"
    close((u * s) @ vh, dense, dtype)
    close(u.T @ u, jnp.eye(u.shape[0], dtype=dtype), dtype)
    close(vh @ vh.T, jnp.eye(u.shape[0], dtype=dtype), dtype)
    got = jax.jit(quax.quaxify(jnp.linalg.svdvals))(k)
    close(got, jnp.linalg.svd(dense, compute_uv=False), dtype)


def test_svd_without_the_tag_refuses_with_the_way_out(close):
    sides, scales = _case(2, jnp.float64)
    k = _kronecker_sum(sides, scales)
    with pytest.raises(qs.StructuredMaterialisationError) as info:
        quax.quaxify(jnp.linalg.svdvals)(k)
    message = str(info.value)
    assert "Kronecker sum" in message and "symmetric=True" in message
    assert "jnp.linalg.eigh" in message and "allow_materialise=True" in message
    # Allowed to materialise: JAX's dense SVD.
    terms = [t.enable_materialise() for t in _terms(sides, scales)]
    allowed = quax.quaxify(lambda p, q: p + q)(*terms)
    got = quax.quaxify(jnp.linalg.svdvals)(allowed)
    want = jnp.linalg.svd(_dense_sum(sides, scales), compute_uv=False)
    close(got, want, jnp.float64)


def test_eigvalsh_gradient_matches_dense(close):
    """`jax.grad` of a function of the eigenvalues with respect to the factors
    and an identity's scale, against `jax.grad` of dense `eigvalsh`."""
    sides, scales = _case(3, jnp.float64)
    weights = _rand(9, 12)

    def structured(sides, scales):
        k = _kronecker_sum(sides, scales)
        return jnp.sum(weights * quax.quaxify(jnp.linalg.eigvalsh)(k))

    def dense(sides, scales):
        return jnp.sum(weights * jnp.linalg.eigvalsh(_dense_sum(sides, scales)))

    got = jax.jit(jax.grad(structured, argnums=(0, 1)))(sides, scales)
    want = jax.grad(dense, argnums=(0, 1))(sides, scales)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        close(g, w, jnp.float64)


def test_eigh_vectors_gradient_matches_dense(close):
    """Through the eigenvectors too (a function invariant to their signs)."""
    sides, scales = _case(2, jnp.float64, seed=4)
    probe = _rand(7, 12)

    def loss(w, v):
        return jnp.sum(w * (v.T @ probe) ** 2)

    def structured(sides):
        return loss(*quax.quaxify(jnp.linalg.eigh)(_kronecker_sum(sides, scales)))

    def dense(sides):
        return loss(*jnp.linalg.eigh(_dense_sum(sides, scales)))

    got = jax.grad(structured)(sides)
    want = jax.grad(dense)(sides)
    for g, w in zip(got, want, strict=True):
        close(g, w, jnp.float64, scale=100.0)


def test_expm_with_traced_identity_factors(close):
    """`expm` under `jit` with the identities' scales as arguments: `⊗
    expm(cₖ^(N-1) Aₖ)`, a `Kronecker`, against SciPy."""
    sides, scales = _case(3, jnp.float64)

    @jax.jit
    def run(sides, scales):
        return quax.quaxify(jsl.expm)(_kronecker_sum(sides, scales))

    out = run(sides, scales)
    assert isinstance(out, qs.Kronecker)
    want = scipy.linalg.expm(np.asarray(_dense_sum(sides, scales)))
    close(out.enable_materialise().dense(), want, jnp.float64)


def test_identity_factor_is_kept(close):
    """A `ScaledIdentity` factor is stored as it is (its scale a leaf, its size
    static), nested `Kronecker`s keep it, and the products, transpose, scaling
    and entries are those of the dense matrix."""
    a, b = _rand(0, 3, 3), _rand(1, 2, 2)
    eye = qs.ScaledIdentity(jnp.asarray(2.0), 4)
    k = qs.Kronecker(a, eye)
    assert k.matrices[1] is eye and k.diagonal == (False, True)
    assert k.identity_scales()[0] is None and k.identity_scales()[1] is eye.scale
    nested = qs.Kronecker(b, k)
    assert isinstance(nested.matrices[2], qs.ScaledIdentity) and nested.sizes == (
        2,
        3,
        4,
    )
    dense = jnp.kron(b, jnp.kron(a, 2.0 * jnp.eye(4)))
    close(nested.enable_materialise().dense(), dense, jnp.float64)
    x = _rand(2, 24, 2)
    ops = quax.quaxify(lambda m, x: (m @ x, m.T @ x, (3.0 * m) @ x, m[5, 9], m @ m))
    mx, mtx, scaled, entry, square = ops(nested, x)
    close(mx, dense @ x, jnp.float64)
    close(mtx, dense.T @ x, jnp.float64)
    close(scaled, 3.0 * dense @ x, jnp.float64)
    close(entry, dense[5, 9], jnp.float64)
    close(square.enable_materialise().dense(), dense @ dense, jnp.float64)
    leaves = jax.tree.leaves(k)
    assert len(leaves) == 2 and leaves[1] is eye.scale
    with pytest.raises(ValueError, match="batch axes"):
        qs.Kronecker(a, qs.ScaledIdentity(jnp.ones(2), 4))


def test_jnp_eye_identity_passed_into_jit_still_refuses():
    """An identity factor that is a plain array, passed into the `jit` that
    `eigh` is, is not known to be one: refused (never a wrong answer)."""
    a, b = _rand(0, 2, 2), _rand(1, 3, 3)
    k = quax.quaxify(lambda p, q: p + q)(
        qs.Kronecker(a, jnp.eye(3)), qs.Kronecker(jnp.eye(2), b)
    )
    with pytest.raises(qs.StructuredMaterialisationError):
        jax.jit(quax.quaxify(jnp.linalg.eigvalsh))(k)
