"""`jnp.linalg.svd`, `svdvals`, `qr`, `eigh`, `lstsq` and `pinv` through the
structures (issue 29, item 6) beyond the generated table's small examples:
batches, larger sizes, rank-deficient and complex matrices, `vmap`, and the
derivatives of `svdvals` and `eigvalsh` against dense JAX's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import scipy.linalg
from quax_structured import (
    BlockDiagonal,
    Circulant,
    Diagonal,
    Kronecker,
    KroneckerPlusIdentity,
    LowRank,
    ScaledIdentity,
    StructuredMaterialisationError,
    TridiagonalMatrix,
)


pytestmark = pytest.mark.usefixtures("x64")

rng = np.random.default_rng(0)


def _normal(*shape, complex_=False):
    x = rng.standard_normal(shape)
    if complex_:
        x = x + 1j * rng.standard_normal(shape)
    return jnp.asarray(x)


def _svd_matches(u, s, vh, a):
    """`U diag(s) Vᴴ = a`, `U`, `V` unitary, `s` = NumPy's (descending)."""
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), atol=1e-10)
    np.testing.assert_allclose((u * s[..., None, :]) @ vh, a, atol=1e-10)
    eye = np.broadcast_to(np.eye(a.shape[-1]), a.shape)
    np.testing.assert_allclose(np.conj(np.swapaxes(u, -1, -2)) @ u, eye, atol=1e-10)
    np.testing.assert_allclose(vh @ np.conj(np.swapaxes(vh, -1, -2)), eye, atol=1e-10)


@pytest.mark.parametrize("n", [7, 8])
@pytest.mark.parametrize("complex_", [False, True])
def test_circulant_svd_batched(n, complex_):
    """A batch of circulants, odd and even `n` (a real one has a self-paired
    frequency `n / 2` when `n` is even), real and complex."""
    column = _normal(3, n, complex_=complex_)
    u, s, vh = jax.jit(quax.quaxify(jnp.linalg.svd))(Circulant(column))
    a = np.stack([scipy.linalg.circulant(c) for c in np.asarray(column)])
    assert u.dtype == column.dtype and s.dtype == jnp.float64
    _svd_matches(np.asarray(u), np.asarray(s), np.asarray(vh), a)


def test_circulant_svd_with_zero_eigenvalues():
    """A singular real circulant (the all-ones one: eigenvalues n, 0, ..., 0)."""
    u, s, vh = quax.quaxify(jnp.linalg.svd)(Circulant(jnp.ones(6)))
    _svd_matches(np.asarray(u), np.asarray(s), np.asarray(vh), np.ones((6, 6)))


def test_diagonal_svd_batched_complex_with_zero():
    d = _normal(2, 5, complex_=True).at[0, 2].set(0)
    u, s, vh = jax.jit(quax.quaxify(jnp.linalg.svd))(Diagonal(d))
    a = np.stack([np.diag(x) for x in np.asarray(d)])
    _svd_matches(np.asarray(u), np.asarray(s), np.asarray(vh), a)


def test_blockdiagonal_svd_batched():
    blocks = _normal(2, 3, 4, 4)
    u, s, vh = jax.jit(quax.quaxify(jnp.linalg.svd))(BlockDiagonal(blocks))
    a = np.stack([np.asarray(scipy.linalg.block_diag(*b)) for b in np.asarray(blocks)])
    _svd_matches(np.asarray(u), np.asarray(s), np.asarray(vh), a)


@pytest.mark.parametrize("complex_", [False, True])
def test_kronecker_svd_qr(complex_):
    a, b = _normal(3, 3, complex_=complex_), _normal(4, 4, complex_=complex_)
    dense = np.kron(a, b)
    u, s, vh = jax.jit(quax.quaxify(jnp.linalg.svd))(Kronecker(a, b))
    _svd_matches(np.asarray(u), np.asarray(s), np.asarray(vh), dense)
    q, r = jax.jit(quax.quaxify(jnp.linalg.qr))(Kronecker(a, b))
    assert isinstance(q, Kronecker) and isinstance(r, Kronecker)
    q, r = q.enable_materialise().materialise(), r.enable_materialise().materialise()
    np.testing.assert_allclose(q @ r, dense, atol=1e-10)
    np.testing.assert_allclose(np.conj(q.T) @ q, np.eye(12), atol=1e-10)
    assert np.all(np.tril(np.asarray(r), -1) == 0)


@pytest.mark.parametrize("rank", [1, 3, 9, 12])
@pytest.mark.parametrize("symmetric", [False, True])
def test_lowrank_svd_qr_eigh(rank, symmetric):
    """Any rank, up to and beyond `n` (then the factors are wide), `U Vᵀ` and
    `U Uᵀ`."""
    n = 9
    u = _normal(n, rank)
    v = None if symmetric else _normal(n, rank)
    m = LowRank(u, v)
    dense = np.asarray(u @ (u if v is None else v).T)
    fns = (jnp.linalg.svd, jnp.linalg.qr, jnp.linalg.eigh, jnp.linalg.svdvals)
    (uu, s, vh), (q, r), (w, vecs), vals = (jax.jit(quax.quaxify(f))(m) for f in fns)
    _svd_matches(np.asarray(uu), np.asarray(s), np.asarray(vh), dense)
    np.testing.assert_allclose(vals, s, atol=1e-10)
    np.testing.assert_allclose(q @ r, dense, atol=1e-10)
    np.testing.assert_allclose(q.T @ q, np.eye(n), atol=1e-10)
    assert np.all(np.tril(np.asarray(r), -1) == 0)
    h = (dense + dense.T) / 2
    np.testing.assert_allclose(w, np.linalg.eigvalsh(h), atol=1e-10)
    np.testing.assert_allclose((vecs * w) @ vecs.T, h, atol=1e-10)


def test_lowrank_qr_with_rank_deficient_leading_columns():
    """`[[0, 1], [0, 1]]`-like: the first column is zero, so the first `r`
    columns do not span the range (a QR through them alone would fail)."""
    u = jnp.ones((4, 1))
    v = jnp.asarray([[0.0], [1.0], [0.0], [2.0]])
    q, r = quax.quaxify(jnp.linalg.qr)(LowRank(u, v))
    np.testing.assert_allclose(q @ r, u @ v.T, atol=1e-12)
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-12)
    assert np.all(np.tril(np.asarray(r), -1) == 0)


def test_lowrank_complex_eigh_is_hermitian_part():
    u, v = _normal(6, 2, complex_=True), _normal(6, 2, complex_=True)
    w, vecs = quax.quaxify(jnp.linalg.eigh)(LowRank(u, v))
    dense = np.asarray(u @ v.T)
    h = (dense + dense.conj().T) / 2
    np.testing.assert_allclose(w, np.linalg.eigvalsh(h), atol=1e-10)
    np.testing.assert_allclose((vecs * w) @ vecs.conj().T, h, atol=1e-10)


def test_circulant_eigh_complex_batched():
    column = _normal(2, 6, complex_=True)
    w, vecs = jax.jit(quax.quaxify(jnp.linalg.eigh))(Circulant(column))
    for k, c in enumerate(np.asarray(column)):
        dense = scipy.linalg.circulant(c)
        h = (dense + dense.conj().T) / 2
        np.testing.assert_allclose(w[k], np.linalg.eigvalsh(h), atol=1e-10)
        np.testing.assert_allclose((vecs[k] * w[k]) @ vecs[k].conj().T, h, atol=1e-10)


def test_kronecker_plus_identity_eigh_svd_lstsq():
    a, b = _normal(3, 3), _normal(4, 4)
    m = KroneckerPlusIdentity(a, b, jnp.asarray(0.5))
    dense = np.kron((a + a.T) / 2, (b + b.T) / 2) + 0.5 * np.eye(12)
    w = jax.jit(quax.quaxify(jnp.linalg.eigvalsh))(m)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(dense), atol=1e-10)
    u, s, vh = jax.jit(quax.quaxify(jnp.linalg.svd))(m)
    _svd_matches(np.asarray(u), np.asarray(s), np.asarray(vh), dense)
    rhs = jnp.arange(12.0)
    x = jax.jit(quax.quaxify(lambda m: jnp.linalg.lstsq(m, rhs)[0]))(m)
    np.testing.assert_allclose(x, np.linalg.lstsq(dense, rhs, rcond=None)[0], atol=1e-9)


def test_kronecker_plus_identity_svd_zero_eigenvalue():
    """A zero eigenvalue (`sign 0 = 0` would zero its left vector)."""
    a, b = jnp.diag(jnp.asarray([1.0, 2.0])), jnp.ones((2, 2))
    m = KroneckerPlusIdentity(a, b, jnp.asarray(0.0))
    u, s, vh = quax.quaxify(jnp.linalg.svd)(m)
    _svd_matches(np.asarray(u), np.asarray(s), np.asarray(vh), np.kron(a, b))


def test_lstsq_pinv_rank_deficient_diagonal():
    """The minimum-norm solution and the pseudo-inverse (unique) of a singular
    diagonal matrix: zeros where `d` is zero."""
    d = jnp.asarray([2.0, 0.0, -3.0, 0.0, 0.5])
    b = jnp.arange(1.0, 6.0)
    x, _, rank, _ = quax.quaxify(lambda m: jnp.linalg.lstsq(m, b))(Diagonal(d))
    np.testing.assert_allclose(x, [0.5, 0, -1, 0, 10], atol=1e-12)
    assert rank == 3
    p = quax.quaxify(jnp.linalg.pinv)(Diagonal(d))
    assert isinstance(p, Diagonal)  # the pseudo-inverse as a structure
    np.testing.assert_allclose(p.diag, [0.5, 0, -1 / 3, 0, 2], atol=1e-12)


def test_svd_under_vmap():
    """`jax.vmap` over a batch of diagonals, both orders."""
    d = _normal(3, 5)
    want = np.sort(np.abs(np.asarray(d)), axis=-1)[:, ::-1]
    got = jax.vmap(quax.quaxify(jnp.linalg.svdvals))(Diagonal(d))
    np.testing.assert_allclose(got, want, atol=1e-12)
    inner = quax.quaxify(jax.vmap(jnp.linalg.svdvals))(Diagonal(d))
    np.testing.assert_allclose(inner, want, atol=1e-12)


def _grad_pair(build, dense, fn, leaves):
    """`jax.grad` of `fn` through the structure and through the dense matrix
    (built with plain JAX from the same leaves), w.r.t. the leaves."""
    structured = jax.grad(lambda x: quax.quaxify(fn)(build(x)))(leaves)
    plain = jax.grad(lambda x: fn(dense(x)))(leaves)
    return structured, plain


def _circulant_dense(c):
    n = c.shape[-1]
    return c[(jnp.arange(n)[:, None] - jnp.arange(n)[None, :]) % n]


def _block_dense(blocks):
    return jax.scipy.linalg.block_diag(*blocks)


_GRAD_CASES = {
    "Diagonal": (Diagonal, jnp.diag, lambda: _normal(6) + 3 * jnp.arange(6)),
    "Circulant": (Circulant, _circulant_dense, lambda: _normal(7)),
    "Kronecker": (
        lambda x: Kronecker(*x),
        lambda x: jnp.kron(*x),
        lambda: (_normal(2, 2), _normal(3, 3)),
    ),
    "LowRank": (
        lambda x: LowRank(*x),
        lambda x: x[0] @ x[1].T,
        lambda: (_normal(6, 2), _normal(6, 2)),
    ),
    "BlockDiagonal": (BlockDiagonal, _block_dense, lambda: _normal(3, 2, 2)),
}


@pytest.mark.parametrize("case", _GRAD_CASES)
def test_svdvals_gradient_matches_dense(case):
    """A function symmetric in the singular values (defined at repeated ones, as
    a real circulant's pairs), its gradient w.r.t. the leaves."""
    build, dense, draw = _GRAD_CASES[case]
    fn = lambda m: jnp.sum(jnp.sin(jnp.linalg.svdvals(m)))
    got, want = _grad_pair(build, dense, fn, draw())
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-9)


_EIGH_CASES = {
    "Diagonal": _GRAD_CASES["Diagonal"],
    "Circulant": _GRAD_CASES["Circulant"],
    "Kronecker, symmetric": (
        lambda x: Kronecker(*x, symmetric=True),
        lambda x: jnp.kron((x[0] + x[0].T) / 2, (x[1] + x[1].T) / 2),
        # The tag needs symmetric factors (a factor that is not is refused).
        lambda: tuple((x + x.T) / 2 for x in (_normal(2, 2), _normal(3, 3))),
    ),
    "LowRank": _GRAD_CASES["LowRank"],
    "BlockDiagonal": _GRAD_CASES["BlockDiagonal"],
    "KroneckerPlusIdentity": (
        lambda x: KroneckerPlusIdentity(*x),
        lambda x: (
            jnp.kron((x[0] + x[0].T) / 2, (x[1] + x[1].T) / 2) + x[2] * jnp.eye(6)
        ),
        lambda: (_normal(2, 2), _normal(3, 3), jnp.asarray(0.7)),
    ),
}


@pytest.mark.parametrize("case", _EIGH_CASES)
def test_eigh_eigenvalue_gradient_matches_dense(case):
    build, dense, draw = _EIGH_CASES[case]
    fn = lambda m: jnp.sum(jnp.sin(jnp.linalg.eigh(m)[0]))
    got, want = _grad_pair(build, dense, fn, draw())
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-9)


def test_refusals_name_the_primitive_and_way_out():
    t = TridiagonalMatrix(jnp.ones(3), 2 * jnp.ones(4), jnp.ones(3))
    for fn, name in ((jnp.linalg.svd, "svd"), (jnp.linalg.qr, "qr")):
        with pytest.raises(
            StructuredMaterialisationError, match=f"primitive `{name}`"
        ) as info:
            quax.quaxify(fn)(t)
        assert "allow_materialise=True" in str(info.value)
    with pytest.raises(StructuredMaterialisationError, match="primitive `qr`"):
        quax.quaxify(jnp.linalg.qr)(Circulant(jnp.arange(4.0)))


def test_refused_with_allow_materialise_is_dense():
    t = TridiagonalMatrix(jnp.ones(3), 2 * jnp.ones(4), jnp.ones(3))
    s = quax.quaxify(jnp.linalg.svdvals)(t.enable_materialise())
    dense = np.diag(np.full(4, 2.0)) + np.diag(np.ones(3), 1) + np.diag(np.ones(3), -1)
    np.testing.assert_allclose(s, np.linalg.svd(dense, compute_uv=False), atol=1e-12)


def test_scaled_identity_qr_keeps_structure():
    q, r = jax.jit(quax.quaxify(jnp.linalg.qr))(ScaledIdentity(jnp.asarray(-2.0), 3))
    assert isinstance(q, ScaledIdentity) and isinstance(r, ScaledIdentity)
    np.testing.assert_allclose(q.scale, 1.0)
    np.testing.assert_allclose(r.scale, -2.0)


def test_singular_values_and_structured_qr_hold_no_dense_matrix():
    """`svdvals` and `eigvalsh` (the vectors dropped under `jit`) and `qr` of a
    `Kronecker` (structured factors) compile with no `(n, n)` array, n = 300."""
    n, k = 300, jnp.arange(300.0)
    cases = [
        (jnp.linalg.svdvals, Diagonal(jnp.cos(k))),
        (jnp.linalg.svdvals, Circulant(jnp.cos(k))),
        (jnp.linalg.svdvals, Kronecker(_normal(15, 15), _normal(20, 20))),
        (jnp.linalg.svdvals, LowRank(_normal(n, 4), _normal(n, 4))),
        (jnp.linalg.eigvalsh, Circulant(jnp.cos(k))),
        (
            jnp.linalg.eigvalsh,
            Kronecker(
                *((x + x.T) / 2 for x in (_normal(15, 15), _normal(20, 20))), True
            ),
        ),
        (jnp.linalg.qr, Kronecker(_normal(15, 15), _normal(20, 20))),
    ]
    for fn, m in cases:
        quax.testing.assert_hlo_lacks(fn, m, shapes=[(n, n)])


@pytest.mark.parametrize("complex_", [False, True])
def test_lowrank_eigh_derivatives_match_dense_for_every_draw(complex_):
    # `jnp.linalg.eigh` first forms the Hermitian part `(A + Aᴴ) / 2`, for a
    # `LowRank` one whose factors repeat `U` and `V`: differentiating through the
    # QR of `[U, conj(V)]` gave NaN for about half of random 6 x 2 factors (seen:
    # 18 of 40 in float64, before `lowrank_eigh` had its own derivative). Eight
    # draws of their own (independent of the tests' order), the eigenvalues'
    # gradient at 6 x 2 (four zero eigenvalues) and a matrix function's JVP at
    # 4 x 2 (eigenvectors too, no repeated eigenvalue), against dense.
    draws = np.random.default_rng(17)

    def normal(*shape):
        x = draws.standard_normal(shape)
        return jnp.asarray(x + 1j * draws.standard_normal(shape) if complex_ else x)

    values = lambda m: jnp.sum(jnp.sin(jnp.linalg.eigh(m)[0]))

    def function(m):
        w, q = jnp.linalg.eigh(m)
        return (q * jnp.sin(w)) @ jnp.conj(q).T

    for _ in range(8):
        x = (normal(6, 2), normal(6, 2))
        got, want = _grad_pair(
            lambda x: LowRank(*x), lambda x: x[0] @ x[1].T, values, x
        )
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, atol=1e-9)
        x, t = (normal(4, 2), normal(4, 2)), (normal(4, 2), normal(4, 2))
        got = jax.jvp(lambda u, v: quax.quaxify(function)(LowRank(u, v)), x, t)[1]
        want = jax.jvp(lambda u, v: function(u @ v.T), x, t)[1]
        np.testing.assert_allclose(got, want, atol=1e-9)
