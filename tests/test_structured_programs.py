"""quax-structured in real programs: Gaussian-process marginal likelihoods written in
plain `jnp`, composition with symbolic zeros (`quax.zero`) and with LoRA."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_lora
import quax_structured as qs
from quax.zero import Zero


def _data_fit(k, y):
    """Plain jnp: the data-fit term of a GP log marginal likelihood."""
    return -0.5 * y @ jnp.linalg.solve(k, y)


def _gp_lml(k, y):
    """Plain jnp: a GP log marginal likelihood (solve plus log-determinant)."""
    n = y.shape[0]
    _, logdet = jnp.linalg.slogdet(k)
    return (
        -0.5 * y @ jnp.linalg.solve(k, y) - 0.5 * logdet - 0.5 * n * jnp.log(2 * jnp.pi)
    )


def _inducing_kernel(key, n=40, r=5):
    """A low-rank-plus-diagonal kernel matrix: noise plus r inducing features."""
    k1, k2, k3 = jr.split(key, 3)
    x = jnp.sort(jr.uniform(k1, (n,)))
    z = jnp.linspace(0, 1, r)
    features = jnp.exp(-((x[:, None] - z[None, :]) ** 2) / 0.1) / jnp.sqrt(r)
    noise = 0.1 + 0.05 * jr.uniform(k2, (n,))
    return qs.LowRankPlusDiagonal(noise, features), jr.normal(k3, (n,))


def test_gp_data_fit_and_gradient_on_low_rank_plus_diagonal():
    k, y = _inducing_kernel(jr.key(0))
    dense = k.enable_materialise().materialise()
    got = jax.jit(quax.quaxify(_data_fit))(k, y)
    np.testing.assert_allclose(got, _data_fit(dense, y), rtol=1e-4)

    def loss(noise, features):
        return quax.quaxify(_data_fit)(qs.LowRankPlusDiagonal(noise, features), y)

    def dense_loss(noise, features):
        return _data_fit(jnp.diag(noise) + features @ features.T, y)

    got = jax.grad(loss, argnums=(0, 1))(k.diag, k.u)
    want = jax.grad(dense_loss, argnums=(0, 1))(k.diag, k.u)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


def test_gp_data_fit_on_kronecker():
    grid = jnp.linspace(0, 1, 6)
    kern = jnp.exp(-((grid[:, None] - grid[None, :]) ** 2) / 0.2) + 0.1 * jnp.eye(6)
    k = qs.Kronecker(kern, 2 * kern, symmetric=True)
    y = jr.normal(jr.key(1), (36,))
    got = jax.jit(quax.quaxify(_data_fit))(k, y)
    np.testing.assert_allclose(got, _data_fit(jnp.kron(kern, 2 * kern), y), rtol=1e-4)


def test_gp_marginal_likelihood_on_low_rank_plus_diagonal():
    """`slogdet` (a custom-JVP function) sees the structured matrix; its gradient
    with respect to the noise and the features, against the dense program."""
    k, y = _inducing_kernel(jr.key(0))
    got = jax.jit(quax.quaxify(_gp_lml))(k, y)
    want = _gp_lml(jnp.diag(k.diag) + k.u @ k.u.T, y)
    np.testing.assert_allclose(got, want, rtol=1e-4)

    def loss(noise, features):
        return quax.quaxify(_gp_lml)(qs.LowRankPlusDiagonal(noise, features), y)

    def dense_loss(noise, features):
        return _gp_lml(jnp.diag(noise) + features @ features.T, y)

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(k.diag, k.u)
    want = jax.grad(dense_loss, argnums=(0, 1))(k.diag, k.u)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * np.abs(w).max())


def test_gp_marginal_likelihood_on_kronecker():
    """A kernel on a 6 x 5 grid: the product of two lengthscale-dependent kernels;
    the log marginal likelihood and its gradient in the lengthscales."""
    g1, g2 = jnp.linspace(0, 1, 6), jnp.linspace(0, 2, 5)
    y = jr.normal(jr.key(1), (30,))

    def kern(grid, ell):
        d = grid[:, None] - grid[None, :]
        return jnp.exp(-(d**2) / ell) + 0.1 * jnp.eye(grid.shape[0])

    def loss(ells):
        k = qs.Kronecker(kern(g1, ells[0]), kern(g2, ells[1]), symmetric=True)
        return quax.quaxify(_gp_lml)(k, y)

    def dense_loss(ells):
        return _gp_lml(jnp.kron(kern(g1, ells[0]), kern(g2, ells[1])), y)

    ells = jnp.array([0.2, 0.5])
    value, grad = jax.jit(jax.value_and_grad(loss))(ells)
    want_value, want_grad = jax.value_and_grad(dense_loss)(ells)
    np.testing.assert_allclose(value, want_value, rtol=1e-4)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-3)


def test_gp_marginal_likelihood_with_tridiagonal_precision():
    """The exponential kernel on sorted inputs has a tridiagonal precision Q:
    `log N(y | 0, Q⁻¹) = -½ yᵀQy + ½ log det Q - n/2 log 2π`, in plain jnp."""
    n = 50
    x = jnp.sort(jr.uniform(jr.key(2), (n,), maxval=10.0))
    y = jr.normal(jr.key(3), (n,))
    a = jnp.exp(-jnp.diff(x) / 1.5)
    r = 1 / (1 - a**2)
    main = jnp.concatenate([r[:1], r[:-1] + r[1:] - 1, r[-1:]])
    q = qs.TridiagonalMatrix(-a * r, main, -a * r)

    def lml(q, y):
        _, logdet = jnp.linalg.slogdet(q)
        return -0.5 * y @ (q @ y) + 0.5 * logdet - 0.5 * n * jnp.log(2 * jnp.pi)

    got = jax.jit(quax.quaxify(lml))(q, y)
    cov = jnp.exp(-jnp.abs(x[:, None] - x[None, :]) / 1.5)
    want = jax.scipy.stats.multivariate_normal.logpdf(y, jnp.zeros(n), cov)
    np.testing.assert_allclose(got, want, rtol=1e-3)


def test_symbolic_zeros():
    t = qs.TridiagonalMatrix(jnp.ones(3), 4 * jnp.ones(4), jnp.ones(3))
    z = Zero((4,), jnp.float32)
    out = quax.quaxify(lambda t, z: t @ z)(t, z)
    np.testing.assert_array_equal(quax.quaxify(lambda o: o + 0)(out), np.zeros(4))
    # Gradients with respect to one diagonal only (the others' are symbolic zeros).
    b = jnp.arange(4.0)

    def f(main):
        return jnp.sum(
            quax.quaxify(jnp.linalg.solve)(
                qs.TridiagonalMatrix(t.lower_diag, main, t.upper_diag), b
            )
        )

    dense = lambda main: jnp.sum(
        jnp.linalg.solve(
            jnp.diag(main) + jnp.diag(t.lower_diag, -1) + jnp.diag(t.upper_diag, 1), b
        )
    )
    np.testing.assert_allclose(
        jax.grad(f)(t.main_diag), jax.grad(dense)(t.main_diag), rtol=1e-5
    )


def test_with_lora():
    """A LoRA layer's output solved against a tridiagonal system, fine-tuned by
    gradient: both families in one quaxified program."""
    n = 8
    w = jr.normal(jr.key(4), (n, n))
    lora = quax_lora.LoraArray(w, rank=2, key=jr.key(5))
    lora = eqx.tree_at(lambda m: m.b, lora, 0.1 * jr.normal(jr.key(7), (2, n)))
    t = qs.TridiagonalMatrix(-jnp.ones(n - 1), 3 * jnp.ones(n), -jnp.ones(n - 1))
    x = jr.normal(jr.key(6), (n,))

    def program(lora, t, x):
        return jnp.sum(jnp.linalg.solve(t, lora @ x) ** 2)

    got = jax.jit(quax.quaxify(program))(lora, t, x)
    dense_w = w + lora.a @ lora.b
    want = program(dense_w, t.enable_materialise().materialise(), x)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # The gradient with respect to the adapter `a`, against the dense program.
    grad_a = jax.grad(
        lambda a: quax.quaxify(program)(eqx.tree_at(lambda m: m.a, lora, a), t, x)
    )(lora.a)
    dense_t = t.enable_materialise().materialise()
    want_a = jax.grad(lambda a: program(w + a @ lora.b, dense_t, x))(lora.a)
    np.testing.assert_allclose(grad_a, want_a, rtol=1e-4, atol=1e-6)
