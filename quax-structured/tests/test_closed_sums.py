"""Structures closed under `+` (issue 29, item 4): sums with a closed form stay
structured, never a lazy `Sum` whose `solve` refuses. Low-rank terms stack their
factors; a constant diagonal added as a dense array (`D + 0.1 * jnp.eye(n)`, as
Gaussian-process code writes its noise) keeps the structure; a symmetric
`Kronecker` plus `σ² I` is a `KroneckerPlusIdentity`, solved through the factors'
eigendecompositions. Each against plain JAX on the dense matrices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


# Every test of this module runs in float64 (`x64`, in conftest.py).
pytestmark = pytest.mark.usefixtures("x64")


N = 6


def _rand(seed, *shape):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)


def _dense(m):
    return m.enable_materialise().dense()


# The module's matrices, built in float64.
with jax.enable_x64(True):
    L1 = qs.LowRankPlusDiagonal(3 + jnp.abs(_rand(0, N)), _rand(1, N, 2))
    L2 = qs.LowRankPlusDiagonal(
        2 + jnp.abs(_rand(2, N)), _rand(3, N, 1), _rand(4, N, 1)
    )
    R = qs.LowRank(_rand(5, N, 2), _rand(6, N, 2))
    S = qs.LowRank(_rand(7, N, 1))
    D = qs.Diagonal(2 + jnp.abs(_rand(8, N)))

    SUMS = {
        "L1 + L2": (lambda a, b: a + b, L1, L2, qs.LowRankPlusDiagonal),
        "L - 3 L": (lambda a, b: a - 3 * a, L1, L2, qs.LowRankPlusDiagonal),
        "2 L1 - 0.5 L2": (lambda a, b: 2 * a - 0.5 * b, L1, L2, qs.LowRankPlusDiagonal),
        "L + LowRank": (lambda a, b: a + b, L1, R, qs.LowRankPlusDiagonal),
        "LowRank + L": (lambda a, b: a + b, R, L2, qs.LowRankPlusDiagonal),
        "LowRank + LowRank": (lambda a, b: a + b, R, S, qs.LowRank),
        "Diagonal + LowRank": (lambda a, b: a + b, D, R, qs.LowRankPlusDiagonal),
        "L + Diagonal": (lambda a, b: a + b, L2, D, qs.LowRankPlusDiagonal),
    }


@pytest.mark.parametrize("name", sorted(SUMS))
def test_low_rank_sums_stack_factors(name):
    """The sum is a low-rank structure (no `Sum`), equal to the dense sum, and
    `solve`/`slogdet` run on it (where it is regular) as dense JAX's."""
    fn, a, b, kind = SUMS[name]
    out = jax.jit(quax.quaxify(fn))(a, b)
    assert type(out) is kind
    want = fn(_dense(a), _dense(b))
    np.testing.assert_allclose(_dense(out), want, rtol=1e-12, atol=1e-12)
    if kind is qs.LowRankPlusDiagonal:
        v = _rand(9, N)

        def solve(a, b):
            m = fn(a, b)
            return jnp.linalg.solve(m, v), jnp.linalg.slogdet(m)

        x, (sign, logdet) = jax.jit(quax.quaxify(solve))(a, b)
        want_sign, want_logdet = jnp.linalg.slogdet(want)
        np.testing.assert_allclose(x, jnp.linalg.solve(want, v), rtol=1e-8)
        np.testing.assert_allclose(sign, want_sign)
        np.testing.assert_allclose(logdet, want_logdet, rtol=1e-10)


def test_symmetric_terms_stay_symmetric():
    """`U₁ U₁ᵀ + U₂ U₂ᵀ` keeps `v=None` (symmetric); a non-symmetric term makes
    the stacked `v` explicit."""
    both = quax.quaxify(lambda a, b: a + b)(S, qs.LowRank(_rand(10, N, 3)))
    assert both.v is None and both.symmetric and both.u.shape == (N, 4)
    mixed = quax.quaxify(lambda a, b: a + b)(S, R)
    assert mixed.v is not None and mixed.u.shape == (N, 3)


with jax.enable_x64(True):
    STRUCTURES = {
        "Diagonal": qs.Diagonal(jnp.arange(1.0, N + 1)),
        "TridiagonalMatrix": qs.TridiagonalMatrix(
            _rand(11, N - 1), 4 + _rand(12, N), _rand(13, N - 1)
        ),
        "Banded": qs.Banded(_rand(14, 3, N).at[1].add(4.0), 1, 1),
        "BlockDiagonal": qs.BlockDiagonal(_rand(15, 3, 2, 2) + 3 * jnp.eye(2)),
        "LowRankPlusDiagonal": L1,
        "LowerTriangular": qs.LowerTriangular(_rand(16, N, N) + 4 * jnp.eye(N)),
    }


@pytest.mark.parametrize("name", sorted(STRUCTURES))
@pytest.mark.parametrize("jit", [False, True])
def test_plus_constant_diagonal_keeps_the_structure(name, jit):
    """`M + 0.1 * jnp.eye(n)`, `M - 0.3 * jnp.eye(n)` and `0.5 * jnp.eye(n) - M`
    (a literal scale: a constant of the program under `jit` too), and eagerly
    `M - jnp.diag(d)` for any constant `d`: the same structure, the dense values."""
    m = STRUCTURES[name]
    d = np.arange(1.0, N + 1) / 10

    def fn(m):
        return m + 0.1 * jnp.eye(N), m - 0.3 * jnp.eye(N), 0.5 * jnp.eye(N) - m

    def eager_only(m):
        return (m - jnp.diag(d),)

    run = quax.quaxify(fn)
    outs = (jax.jit(run) if jit else run)(m)
    wants = fn(_dense(m))
    if not jit:
        outs += quax.quaxify(eager_only)(m)
        wants += eager_only(_dense(m))
    for got, want in zip(outs, wants, strict=True):
        assert type(got) is type(m)
        np.testing.assert_allclose(_dense(got), want, rtol=1e-12, atol=1e-12)


def test_plus_non_diagonal_dense_refuses():
    """A dense operand that is not a diagonal constant (an off-diagonal entry, or
    a traced array) refuses, naming `add`."""
    m = STRUCTURES["Diagonal"]
    with pytest.raises(qs.StructuredMaterialisationError, match="primitive `add`"):
        quax.quaxify(lambda m: m + jnp.ones((N, N)))(m)
    with pytest.raises(qs.StructuredMaterialisationError, match="primitive `add`"):
        jax.jit(quax.quaxify(lambda m, e: m + e))(m, jnp.eye(N))


def _kronecker():
    a, b = _rand(20, 3, 3), _rand(21, 4, 4)
    return qs.Kronecker(a @ a.T + jnp.eye(3), b @ b.T + jnp.eye(4), symmetric=True)


def _gp_loss(c, v):
    """The negative log marginal likelihood of a Gaussian process, up to a
    constant, as plain `jnp` writes it."""
    return v @ jnp.linalg.solve(c, v) + jnp.linalg.slogdet(c)[1]


def test_kronecker_plus_noise_as_gp_code_writes_it():
    """`K + noise * jnp.eye(n)` (a literal noise) is a `KroneckerPlusIdentity`:
    `solve`, `slogdet` and `det` as dense JAX's, eager and under `jit`."""
    k = _kronecker()
    n = k.shape[-1]
    v = _rand(22, n)

    def fn(k):
        c = k + 0.1 * jnp.eye(n)
        return c, jnp.linalg.solve(c, v), jnp.linalg.slogdet(c), jnp.linalg.det(c)

    dense = _dense(k) + 0.1 * jnp.eye(n)
    for run in (quax.quaxify(fn), jax.jit(quax.quaxify(fn))):
        c, x, (sign, logdet), det = run(k)
        assert isinstance(c, qs.KroneckerPlusIdentity)
        np.testing.assert_allclose(_dense(c), dense, rtol=1e-12)
        np.testing.assert_allclose(x, jnp.linalg.solve(dense, v), rtol=1e-9)
        want_sign, want_logdet = jnp.linalg.slogdet(dense)
        np.testing.assert_allclose((sign, logdet), (want_sign, want_logdet), rtol=1e-10)
        np.testing.assert_allclose(det, jnp.linalg.det(dense), rtol=1e-9)


def test_kronecker_plus_scaled_identity_gradient():
    """The GP loss with a traced noise (`K + ScaledIdentity(noise, n)`): its
    gradient with respect to both factors and the noise, against `jax.grad`
    through the dense matrix."""
    k = _kronecker()
    n = k.shape[-1]
    v = _rand(23, n)
    noise = qs.ScaledIdentity(jnp.array(0.3), n)
    loss = quax.quaxify(lambda k, s: _gp_loss(k + s, v))
    got_k, got_s = jax.jit(jax.grad(loss, argnums=(0, 1)))(k, noise)

    def dense_loss(left, right, scale):
        sym = lambda a: (a + a.T) / 2
        return _gp_loss(jnp.kron(sym(left), sym(right)) + scale * jnp.eye(n), v)

    want = jax.grad(dense_loss, argnums=(0, 1, 2))(k.left, k.right, noise.scale)
    np.testing.assert_allclose(got_k.left, want[0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_k.right, want[1], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_s.scale, want[2], rtol=1e-9)


def test_kronecker_plus_identity_conformance():
    """The kit's checks (eval, jit, vmap, grad, jvp) on a product and a solve."""
    k = _kronecker()
    n = k.shape[-1]
    c = quax.quaxify(lambda k: k + 0.2 * jnp.eye(n))(k)
    v = _rand(24, n)
    quax.testing.assert_matches_dense(lambda c: jnp.linalg.solve(c, v) + c @ v, c)


def test_kronecker_plus_identity_holds_no_dense_matrix():
    """The optimised program of the GP loss (solve and slogdet) holds no
    floating-point `(n, n)` array (its gradient: the next test)."""
    a, b = _rand(28, 8, 8), _rand(29, 16, 16)
    k = qs.Kronecker(a @ a.T + jnp.eye(8), b @ b.T + jnp.eye(16), symmetric=True)
    n = k.shape[-1]
    noise = qs.ScaledIdentity(jnp.array(0.3), n)
    v = _rand(25, n)
    loss = lambda k, s: _gp_loss(k + s, v)
    quax.testing.assert_hlo_lacks(loss, k, noise, shapes=[(n, n)], dtypes=["f64"])


def test_gp_gradient_with_traced_noise_holds_no_dense_matrix():
    """`jax.grad` of the GP loss with respect to both factors and a traced noise
    (`K + ScaledIdentity(noise, n)`, the noise a `jit` argument and a `grad`
    variable): the optimised program holds no `(n, n)` array of any dtype (the
    solve's gradient goes through `custom_linear_solve`'s transposed solve and
    the factors' products, `slogdet`'s through the eigenvalues)."""
    a, b = _rand(30, 8, 8), _rand(31, 16, 16)
    k = qs.Kronecker(a @ a.T + jnp.eye(8), b @ b.T + jnp.eye(16), symmetric=True)
    n = k.shape[-1]
    noise = qs.ScaledIdentity(jnp.array(0.3), n)
    v = _rand(32, n)
    grad = jax.grad(quax.quaxify(lambda k, s: _gp_loss(k + s, v)), argnums=(0, 1))
    text = jax.jit(grad).lower(k, noise).compile().as_text()
    assert text is not None
    assert f"[{n},{n}]" not in text
    got_k, got_s = jax.jit(grad)(k, noise)
    dense = jnp.kron(k.left, k.right) + 0.3 * jnp.eye(n)
    # d/ds (vᵀ C⁻¹ v + log det C) = -‖C⁻¹ v‖² + tr C⁻¹, by NumPy.
    x = np.linalg.solve(np.asarray(dense), np.asarray(v))
    want = -x @ x + np.trace(np.linalg.inv(np.asarray(dense)))
    np.testing.assert_allclose(got_s.scale, want, rtol=1e-9)
    # The factors' gradients, through the dense matrix in plain JAX.
    sym = lambda m: (m + m.T) / 2
    dense_loss = lambda a, b: _gp_loss(jnp.kron(sym(a), sym(b)) + 0.3 * jnp.eye(n), v)
    want_a, want_b = jax.grad(dense_loss, argnums=(0, 1))(k.left, k.right)
    np.testing.assert_allclose(got_k.left, want_a, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(got_k.right, want_b, rtol=1e-8, atol=1e-10)


def test_non_symmetric_kronecker_plus_identity_reads_factors_as_given():
    """Without the `symmetric` tag: a `KroneckerPlusIdentity` whose factors are
    not symmetrised (its products are those of the matrix given; its solves
    choose their eigendecomposition when the program runs, see
    `test_kronecker_untagged_noise.py`)."""
    a, b = _rand(26, 2, 2), _rand(27, 3, 3)
    out = quax.quaxify(lambda k: k + 0.5 * jnp.eye(6))(qs.Kronecker(a, b))
    assert isinstance(out, qs.KroneckerPlusIdentity) and not out.symmetric
    v = _rand(28, 6)
    dense = np.kron(np.asarray(a), np.asarray(b)) + 0.5 * np.eye(6)
    product = quax.quaxify(lambda m, v: (m @ v, v @ m))(out, v)
    np.testing.assert_allclose(product[0], dense @ v, rtol=1e-12)
    np.testing.assert_allclose(product[1], v @ dense, rtol=1e-12)
