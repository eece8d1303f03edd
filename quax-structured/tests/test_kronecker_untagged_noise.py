"""A `Kronecker` plus noise written as users write it, without the `symmetric`
tag (issue 45, item 26): `jnp.linalg.solve(K + 0.1 * jnp.eye(n), y)`, `slogdet`
and `det` of `Kronecker(K1, K2) + noise`, through the factors'
eigendecompositions chosen when the program runs (`eigh` for symmetric factors,
`eig` for others; see `KroneckerSpectralLU`). Against NumPy (values) and
`jax.grad` through the dense matrix (derivatives): a traced noise, two and three
factors, symmetric and non-symmetric factors, a Kronecker of diagonals as the
noise and as the matrix."""

import functools as ft

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_structured as qs


# Every test of this module runs in float64 (`x64`, in conftest.py).
pytestmark = pytest.mark.usefixtures("x64")


def _rand(seed, *shape):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)


def _spd(seed, size):
    a = _rand(seed, size, size)
    return a @ a.T / size + 0.5 * jnp.eye(size)


def _general(seed, size):
    """A non-symmetric, well-conditioned factor with distinct eigenvalues."""
    return _rand(seed, size, size) / np.sqrt(size) + 2 * jnp.eye(size)


def _factors(kind, sizes):
    make = _spd if kind == "symmetric" else _general
    return [make(10 + k, size) for k, size in enumerate(sizes)]


def _dense(factors):
    return np.asarray(ft.reduce(np.kron, [np.asarray(f) for f in factors]))


KINDS = ["symmetric", "general"]
SIZES = [(4, 5), (2, 3, 4)]
# The kinds times the sizes: CI runs two factors symmetric (`eigh`) and three
# general (`eig`), which reach both routes and both numbers of factors; the other
# two cases repeat them (symmetric three factors cost 8-9 s of compiles a test):
# sweeps (`bash scripts/test.sh sweeps`).
GRID = [
    pytest.param(
        sizes,
        kind,
        id=f"{sizes}-{kind}",
        marks=[pytest.mark.sweep] if (len(sizes) == 3) == (kind == "symmetric") else [],
    )
    for sizes in SIZES
    for kind in KINDS
]


def _solve_and_logdet(k, y):
    n = y.shape[0]
    m = k + 0.1 * jnp.eye(n)
    return jnp.linalg.solve(m, y), jnp.linalg.slogdet(m), jnp.linalg.det(m)


@pytest.mark.parametrize(("sizes", "kind"), GRID)
def test_solve_slogdet_det_match_numpy(kind, sizes):
    """The issue's program: `K + 0.1 * jnp.eye(n)` on an untagged `Kronecker`,
    eagerly and under `jit`."""
    factors = _factors(kind, sizes)
    k = qs.Kronecker(*factors)
    n = k.shape[-1]
    y = _rand(1, n, 2)
    dense = _dense(factors) + 0.1 * np.eye(n)
    assert kind == "symmetric" or not np.allclose(dense, dense.T)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    for fn in (
        quax.quaxify(_solve_and_logdet),
        jax.jit(quax.quaxify(_solve_and_logdet)),
    ):
        x, (sign, logdet), det = fn(k, y)
        np.testing.assert_allclose(x, np.linalg.solve(dense, y), rtol=1e-10)
        np.testing.assert_allclose(sign, want_sign)
        np.testing.assert_allclose(logdet, want_logdet, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(det, np.linalg.det(dense), rtol=1e-10)


def test_sum_is_a_kronecker_plus_identity_reading_the_factors_as_given():
    factors = _factors("general", (4, 5))
    k = qs.Kronecker(*factors)
    m = quax.quaxify(lambda k: k + 0.1 * jnp.eye(20))(k)
    assert isinstance(m, qs.KroneckerPlusIdentity) and not m.symmetric
    dense = _dense(factors) + 0.1 * np.eye(20)
    np.testing.assert_allclose(m.enable_materialise().dense(), dense, rtol=1e-14)
    lu = quax.quaxify(lambda m: jax.lax.linalg.lu(m)[0])(m)
    assert isinstance(lu.factors, qs.KroneckerSpectralLU)


def _nll(k, noise, y):
    """A Gaussian process's negative log likelihood, written as GP code writes
    it."""
    m = k + noise * jnp.eye(y.shape[0])
    return 0.5 * y @ jnp.linalg.solve(m, y) + 0.5 * jnp.linalg.slogdet(m)[1]


def _dense_nll(factors, noise, y):
    m = ft.reduce(jnp.kron, factors) + noise * jnp.eye(y.shape[0])
    return 0.5 * y @ jnp.linalg.solve(m, y) + 0.5 * jnp.linalg.slogdet(m)[1]


@pytest.mark.parametrize(("sizes", "kind"), GRID)
def test_gradient_with_a_traced_noise(kind, sizes):
    """`jax.grad` with respect to the noise (a tracer), every factor and `y`,
    against `jax.grad` through the dense matrix."""
    factors = _factors(kind, sizes)
    k = qs.Kronecker(*factors)
    n = k.shape[-1]
    y = _rand(2, n)
    noise = jnp.asarray(0.3)
    grad = jax.jit(jax.grad(quax.quaxify(_nll), argnums=(0, 1, 2)))
    got_k, got_noise, got_y = grad(k, noise, y)
    want = jax.grad(_dense_nll, argnums=(0, 1, 2))(factors, noise, y)
    want_factors, want_noise, want_y = want
    np.testing.assert_allclose(got_noise, want_noise, rtol=1e-9)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-9, atol=1e-12)
    assert isinstance(got_k, qs.Kronecker)
    for g, w in zip(got_k.matrices, want_factors, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-11)


def test_det_gradient_matches_dense():
    factors = _factors("general", (3, 4))
    k = qs.Kronecker(*factors)

    def det(k, noise):
        return jnp.linalg.det(k + noise * jnp.eye(12))

    got_k, got_noise = jax.grad(quax.quaxify(det), argnums=(0, 1))(k, 0.4)
    want = jax.grad(
        lambda fs, s: jnp.linalg.det(ft.reduce(jnp.kron, fs) + s * jnp.eye(12)),
        argnums=(0, 1),
    )(factors, 0.4)
    np.testing.assert_allclose(got_noise, want[1], rtol=1e-9)
    for g, w in zip(got_k.matrices, want[0], strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-10)


def test_vmap_over_the_noise_and_right_hand_sides():
    """A batch of noises given as `ScaledIdentity`s (what the refusal of a
    batched dense noise says to write) and of right-hand sides."""
    factors = _factors("general", (3, 4))
    k = qs.Kronecker(*factors)
    noises = jnp.asarray([0.1, 0.5, 2.0])
    ys = _rand(3, 3, 12)

    def solve(k, noise, y):
        return jnp.linalg.solve(k + qs.ScaledIdentity(noise, 12), y)

    got = jax.jit(jax.vmap(quax.quaxify(solve), in_axes=(None, 0, 0)))(k, noises, ys)
    dense = _dense(factors)
    for i in range(3):
        want = np.linalg.solve(dense + float(noises[i]) * np.eye(12), ys[i])
        np.testing.assert_allclose(got[i], want, rtol=1e-10)


@pytest.mark.parametrize("trans", [0, 1])
def test_lu_solve_transposed(trans):
    factors = _factors("general", (4, 5))
    k = qs.Kronecker(*factors)
    y = _rand(4, 20, 2)

    def solve(k, y):
        return jsl.lu_solve(jsl.lu_factor(k + 0.2 * jnp.eye(20)), y, trans=trans)

    dense = _dense(factors) + 0.2 * np.eye(20)
    want = np.linalg.solve(dense.T if trans else dense, y)
    np.testing.assert_allclose(jax.jit(quax.quaxify(solve))(k, y), want, rtol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_heteroscedastic_noise_a_kronecker_of_diagonals(kind):
    """`K + Kronecker(Diagonal(d1), Diagonal(d2))` for an untagged `K`: a
    `KroneckerPlusDiagonal` reading the factors as given; solve, slogdet and the
    gradient with respect to the diagonals against dense."""
    factors = _factors(kind, (3, 4))
    k = qs.Kronecker(*factors)
    d1 = 0.5 + jnp.abs(_rand(5, 3))
    d2 = 0.5 + jnp.abs(_rand(6, 4))
    y = _rand(7, 12)

    def loss(k, d1, d2):
        m = k + qs.Kronecker(qs.Diagonal(d1), qs.Diagonal(d2))
        return jnp.sum(jnp.linalg.solve(m, y) ** 2) + jnp.linalg.slogdet(m)[1]

    def dense_loss(fs, d1, d2):
        m = ft.reduce(jnp.kron, fs) + jnp.diag(jnp.kron(d1, d2))
        return jnp.sum(jnp.linalg.solve(m, y) ** 2) + jnp.linalg.slogdet(m)[1]

    m = quax.quaxify(
        lambda k, d1, d2: k + qs.Kronecker(qs.Diagonal(d1), qs.Diagonal(d2))
    )(k, d1, d2)
    assert isinstance(m, qs.KroneckerPlusDiagonal) and not m.symmetric
    np.testing.assert_allclose(
        jax.jit(quax.quaxify(loss))(k, d1, d2), dense_loss(factors, d1, d2), rtol=1e-11
    )
    got_k, got_d1, got_d2 = jax.grad(quax.quaxify(loss), argnums=(0, 1, 2))(k, d1, d2)
    want = jax.grad(dense_loss, argnums=(0, 1, 2))(factors, d1, d2)
    np.testing.assert_allclose(got_d1, want[1], rtol=1e-8)
    np.testing.assert_allclose(got_d2, want[2], rtol=1e-8)
    for g, w in zip(got_k.matrices, want[0], strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-10)


def test_kronecker_of_diagonals_plus_noise_is_diagonal():
    d1, d2 = jnp.arange(1.0, 4.0), jnp.arange(1.0, 5.0) - 2.5
    k = qs.Kronecker(qs.Diagonal(d1), qs.Diagonal(d2))
    y = _rand(8, 12)
    m = quax.quaxify(lambda k: k + 0.1 * jnp.eye(12))(k)
    assert isinstance(m, qs.Diagonal)
    x, (sign, logdet), det = jax.jit(quax.quaxify(_solve_and_logdet))(k, y)
    dense = np.diag(np.kron(d1, d2)) + 0.1 * np.eye(12)
    np.testing.assert_allclose(x, np.linalg.solve(dense, y), rtol=1e-12)
    np.testing.assert_allclose((sign, logdet), np.linalg.slogdet(dense), rtol=1e-12)
    np.testing.assert_allclose(det, np.linalg.det(dense), rtol=1e-12)


def test_non_normal_factor_is_nan_or_accurate():
    """A factor far from normal (a nearly defective one: its eigenvectors almost
    parallel) makes the general route inaccurate; its check gives NaN there,
    never a wrong finite number."""
    a = jnp.asarray([[1.0, 1e6], [0.0, 1.0 + 1e-9]])
    b = _general(20, 3)
    k = qs.Kronecker(a, b)
    y = _rand(9, 6)
    x, (sign, logdet), det = jax.jit(quax.quaxify(_solve_and_logdet))(k, y)
    # This factor is far enough from normal to fail the solve's check (dense LAPACK
    # solves the matrix: its answer is not what the route gives). Whether the
    # determinant's check passes depends on the machine's arithmetic (its last
    # bits): on one CPU (2026-12-07) `slogdet` and `det` passed it and matched
    # LAPACK's to 1e-15, on another they were NaN. Each is NaN or accurate.
    dense = _dense([a, b]) + 0.1 * np.eye(6)
    want_x = np.linalg.solve(dense, y)
    assert np.all(np.isfinite(want_x))
    assert np.all(np.isnan(x))
    want_sign, want_logdet = np.linalg.slogdet(dense)
    if not np.isnan(logdet):
        assert sign == want_sign
        np.testing.assert_allclose(logdet, want_logdet, rtol=1e-10)
    if not np.isnan(det):
        np.testing.assert_allclose(det, np.linalg.det(dense), rtol=1e-8)


def test_nearly_symmetric_factors_take_the_symmetric_route():
    """Factors symmetric up to rounding (`a @ a.T` computed in float64) are
    solved as accurately as exactly symmetric ones."""
    factors = [
        (lambda a: a @ a.T + 3 * jnp.eye(6))(_rand(30 + k, 6, 6)) for k in range(2)
    ]
    k = qs.Kronecker(*factors)
    y = _rand(10, 36)
    x, _, _ = jax.jit(quax.quaxify(_solve_and_logdet))(k, y)
    dense = _dense(factors) + 0.1 * np.eye(36)
    np.testing.assert_allclose(x, np.linalg.solve(dense, y), rtol=1e-10)


def test_gradient_holds_no_dense_matrix():
    """The compiled gradient (with respect to the factors and the noise, general
    factors) holds no `(n, n)` array, n = 336."""
    sizes = (6, 7, 8)
    factors = _factors("general", sizes)
    k = qs.Kronecker(*factors)
    y = _rand(11, 336)
    grad = jax.grad(quax.quaxify(_nll), argnums=(0, 1))
    text = jax.jit(grad).lower(k, jnp.asarray(0.3), y).compile().as_text()
    assert text is not None and "[336,336]" not in text
    assert "[42,42]" not in text and "[48,48]" not in text and "[56,56]" not in text


def test_eigh_of_the_untagged_sum_refuses():
    """`eigh` reads the matrix as symmetric: without the tag it refuses (as for
    the `Kronecker` itself), naming the way out."""
    k = qs.Kronecker(*_factors("symmetric", (3, 4)))
    with pytest.raises(RuntimeError, match="Refusing to materialise"):
        quax.quaxify(lambda k: jnp.linalg.eigvalsh(k + 0.1 * jnp.eye(12)))(k)


def test_complex_factors_stay_a_sum():
    """The eigendecomposition routes are real: complex factors plus noise stay a
    lazy `Sum`, whose solve refuses naming an iterative solver."""
    a = _general(40, 3) + 0.5j * _rand(41, 3, 3)
    k = qs.Kronecker(a, _general(42, 4))
    with pytest.raises(RuntimeError, match="gmres"):
        quax.quaxify(lambda k: jnp.linalg.solve(k + 0.1 * jnp.eye(12), jnp.ones(12)))(k)


def test_lowers_for_tpu_without_eig():
    """XLA has no `eig` on TPU: the program lowered for TPU (here, on the CPU)
    holds none (that branch gives NaN there), but its `eigh`; lowered for the
    CPU it holds LAPACK's `geev`."""
    factors = _factors("general", (3, 4))
    k = qs.Kronecker(*factors)
    y = _rand(12, 12)
    fn = jax.jit(quax.quaxify(lambda k, y: _solve_and_logdet(k, y)[0]))
    tpu = jax.export.export(fn, platforms=["tpu"])(k, y).mlir_module()
    cpu = jax.export.export(fn, platforms=["cpu"])(k, y).mlir_module()
    assert "geev" not in tpu and "@Eigh" in tpu
    assert "geev" in cpu
