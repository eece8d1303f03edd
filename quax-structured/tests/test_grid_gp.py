"""The Gaussian process on a grid (issue 29, item 4): the marginal likelihood
`y ⋅ solve(K + σ² I, y) + slogdet(K + σ² I)` with `K = A ⊗ B ⊗ C`, and its
gradient with respect to the factors and the noise, through the factors'
eigendecompositions; the heteroscedastic `A ⊗ B + D₁ ⊗ D₂` through their
generalised eigendecompositions (`KroneckerPlusDiagonal`). Against `jax.grad`
through the dense matrices; the compiled gradient holds no `(n, n)` array, nor
one of the size of two factors' product."""

import functools as ft
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


# Every test of this module runs with `x64` on (in conftest.py); float32 cases
# build float32 arrays.
pytestmark = pytest.mark.usefixtures("x64")


def _rbf(size, lengthscale, dtype):
    """A squared-exponential kernel matrix on `size` points of `[0, 1]`."""
    x = jnp.linspace(0, 1, size, dtype=dtype)
    return jnp.exp(-((x[:, None] - x[None, :]) ** 2) / (2 * lengthscale**2))


def _rand(seed, *shape, dtype=jnp.float64):
    x = jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)
    return x.astype(dtype)


def _kron(*factors):
    return ft.reduce(jnp.kron, factors)


def _sym(a):
    return (a + a.T) / 2


def _gp_loss(c, y):
    """The negative log marginal likelihood, up to constants, as plain `jnp`
    writes it."""
    return y @ jnp.linalg.solve(c, y) + jnp.linalg.slogdet(c)[1]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_grid_gp_loss_and_gradient(dtype, close):
    """Three factors (a 3 x 4 x 5 grid), the noise a traced `ScaledIdentity`:
    the loss and its gradient with respect to the three factors and the noise."""
    sizes = (3, 4, 5)
    fs = [_rbf(s, 0.6, dtype) + 0.05 * jnp.eye(s, dtype=dtype) for s in sizes]
    k = qs.Kronecker(*fs, symmetric=True)
    n = k.shape[-1]
    y = _rand(0, n, dtype=dtype)
    noise = qs.ScaledIdentity(jnp.asarray(0.2, dtype), n)
    loss = quax.quaxify(lambda k, s: _gp_loss(k + s, y))
    value, (got_k, got_s) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(k, noise)

    def dense_loss(fs, s):
        return _gp_loss(_kron(*(_sym(f) for f in fs)) + s * jnp.eye(n, dtype=dtype), y)

    want_value, (want_fs, want_s) = jax.jit(
        jax.value_and_grad(dense_loss, argnums=(0, 1))
    )(fs, noise.scale)
    # float32: the dense reference's own error in the solve's gradient grows with
    # the condition number (about 1e3 here).
    scale = 100.0 if dtype == jnp.float32 else 10.0
    close(value, want_value, dtype, scale)
    for g, w in zip(got_k.matrices, want_fs, strict=True):
        close(g, w, dtype, scale)
    close(got_s.scale, want_s, dtype, scale)


def test_grid_gp_literal_noise(close):
    """`K + 0.1 * jnp.eye(n)` (a literal noise, as GP code writes it) with three
    factors: the loss and the factors' gradient."""
    sizes = (2, 3, 4)
    fs = [_rbf(s, 0.5, jnp.float64) for s in sizes]
    n = int(np.prod(sizes))
    y = _rand(1, n)
    loss = quax.quaxify(lambda k: _gp_loss(k + 0.1 * jnp.eye(n), y))
    got = jax.jit(jax.grad(loss))(qs.Kronecker(*fs, symmetric=True))
    want = jax.jit(
        jax.grad(
            lambda fs: _gp_loss(_kron(*(_sym(f) for f in fs)) + 0.1 * jnp.eye(n), y)
        )
    )(fs)
    for g, w in zip(got.matrices, want, strict=True):
        close(g, w, jnp.float64, 10.0)


def _forbidden(sizes):
    """`[n,n]` and `[nᵢnⱼ,nᵢnⱼ]` as HLO writes shapes."""
    n = int(np.prod(sizes))
    pairs = {sizes[i] * sizes[j] for i in range(len(sizes)) for j in range(i)}
    return [f"[{m},{m}]" for m in (n, *sorted(pairs))]


def test_grid_gp_gradient_holds_no_dense_matrix():
    """The compiled gradient of the grid GP loss (a 6 x 7 x 8 grid, n = 336, with
    respect to the three factors and the noise) holds no `(n, n)` array and no
    `(nᵢ nⱼ, nᵢ nⱼ)` one."""
    sizes = (6, 7, 8)
    fs = [_rbf(s, 0.4, jnp.float64) for s in sizes]
    k = qs.Kronecker(*fs, symmetric=True)
    n = k.shape[-1]
    noise = qs.ScaledIdentity(jnp.array(0.3), n)
    y = _rand(2, n)
    grad = jax.grad(quax.quaxify(lambda k, s: _gp_loss(k + s, y)), argnums=(0, 1))
    text = jax.jit(grad).lower(k, noise).compile().as_text()
    assert text is not None
    for shape in _forbidden(sizes):
        assert shape not in text, shape
    # The program does hold the grid (as the check would see it).
    assert re.search(r"\[6,7,8(,1)?\]", text)


def _heteroscedastic(sizes, dtype, seed=3):
    fs = [_rbf(s, 0.5, dtype) for s in sizes]
    ds = [
        (0.2 + jnp.abs(_rand(seed + i, s))).astype(dtype) for i, s in enumerate(sizes)
    ]
    return fs, ds


def _kpd_fn(k, ds, y):
    c = k + qs.Kronecker(*(qs.Diagonal(d) for d in ds))
    return c, jnp.linalg.solve(c, y), jnp.linalg.slogdet(c), jnp.linalg.det(c)


@pytest.mark.parametrize("sizes", [(3, 4), (2, 3, 2)])
def test_kronecker_plus_kronecker_of_diagonals(sizes):
    """`Kronecker(A, B, symmetric=True) + Kronecker(Diagonal(d1), Diagonal(d2))`
    (also three factors) is a `KroneckerPlusDiagonal`: `solve`, `slogdet` and
    `det` as dense JAX's; `-M` and `2 M` keep it."""
    fs, ds = _heteroscedastic(sizes, jnp.float64)
    k = qs.Kronecker(*fs, symmetric=True)
    n = k.shape[-1]
    y = _rand(9, n)
    c, x, (sign, logdet), det = jax.jit(quax.quaxify(_kpd_fn))(k, ds, y)
    assert isinstance(c, qs.KroneckerPlusDiagonal)
    dense = _kron(*fs) + jnp.diag(_kron(*(jnp.diag(d) for d in ds)).diagonal())
    np.testing.assert_allclose(c.enable_materialise().dense(), dense, rtol=1e-13)
    np.testing.assert_allclose(x, jnp.linalg.solve(dense, y), rtol=1e-9)
    want_sign, want_logdet = jnp.linalg.slogdet(dense)
    assert sign == want_sign
    np.testing.assert_allclose(logdet, want_logdet, rtol=1e-11)
    np.testing.assert_allclose(det, jnp.linalg.det(dense), rtol=1e-9)
    neg = quax.quaxify(lambda c: (-2.0 * c, jnp.linalg.slogdet(-2.0 * c)))(c)
    assert isinstance(neg[0], qs.KroneckerPlusDiagonal)
    want = jnp.linalg.slogdet(-2.0 * dense)
    np.testing.assert_allclose(neg[1], want, rtol=1e-11)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_heteroscedastic_gp_gradient(dtype, close):
    """The GP loss of `A ⊗ B ⊗ C + D₁ ⊗ D₂ ⊗ D₃` and its gradient with respect to
    the factors and the diagonals, against dense JAX."""
    sizes = (2, 3, 4)
    fs, ds = _heteroscedastic(sizes, dtype, seed=11)
    n = int(np.prod(sizes))
    y = _rand(12, n, dtype=dtype)

    def loss(k, ds):
        return _gp_loss(k + qs.Kronecker(*(qs.Diagonal(d) for d in ds)), y)

    value, (got_k, got_ds) = jax.jit(
        jax.value_and_grad(quax.quaxify(loss), argnums=(0, 1))
    )(qs.Kronecker(*fs, symmetric=True), ds)

    def dense_loss(fs, ds):
        noise = jnp.diag(ft.reduce(jnp.kron, ds))
        return _gp_loss(_kron(*(_sym(f) for f in fs)) + noise, y)

    want_value, (want_fs, want_ds) = jax.jit(
        jax.value_and_grad(dense_loss, argnums=(0, 1))
    )(fs, ds)
    scale = 100.0 if dtype == jnp.float32 else 10.0
    close(value, want_value, dtype, scale)
    for g, w in zip([*got_k.matrices, *got_ds], [*want_fs, *want_ds], strict=True):
        close(g, w, dtype, scale)


def test_heteroscedastic_gradient_holds_no_dense_matrix():
    """The compiled gradient of the heteroscedastic GP loss on a 6 x 7 x 8 grid
    holds no `(n, n)` array and no `(nᵢ nⱼ, nᵢ nⱼ)` one."""
    sizes = (6, 7, 8)
    fs, ds = _heteroscedastic(sizes, jnp.float64, seed=20)
    k = qs.Kronecker(*fs, symmetric=True)
    y = _rand(23, k.shape[-1])

    def loss(k, ds):
        return _gp_loss(k + qs.Kronecker(*(qs.Diagonal(d) for d in ds)), y)

    grad = jax.grad(quax.quaxify(loss), argnums=(0, 1))
    text = jax.jit(grad).lower(k, ds).compile().as_text()
    assert text is not None
    for shape in _forbidden(sizes):
        assert shape not in text, shape


def test_what_has_no_closed_form_refuses():
    """A `Kronecker` plus a Kronecker of diagonals of other sizes: a lazy `Sum`,
    whose `solve` refuses naming the closed forms and the iterative way out
    (without the `symmetric` tag and of the factors' sizes it is a
    `KroneckerPlusDiagonal`, see `test_kronecker_untagged_noise.py`); a
    non-positive diagonal gives NaN, never a wrong number."""
    fs, ds = _heteroscedastic((2, 3), jnp.float64)
    diagonal = qs.Kronecker(*(qs.Diagonal(d) for d in ds))
    y = _rand(30, 6)
    plain = quax.quaxify(lambda k, d: k + d)(qs.Kronecker(*fs), diagonal)
    assert isinstance(plain, qs.KroneckerPlusDiagonal) and not plain.symmetric
    other = qs.Kronecker(
        _rbf(3, 0.5, jnp.float64), _rbf(2, 0.5, jnp.float64), symmetric=True
    )
    out = quax.quaxify(lambda k, d: k + d)(other, diagonal)
    assert isinstance(out, qs.Sum)
    with pytest.raises(
        qs.StructuredMaterialisationError, match=r"factors' sizes.*gmres"
    ):
        quax.quaxify(jnp.linalg.solve)(out, y)
    negative = qs.Kronecker(qs.Diagonal(-ds[0]), qs.Diagonal(ds[1]))
    c = quax.quaxify(lambda k, d: k + d)(qs.Kronecker(*fs, symmetric=True), negative)
    x = quax.quaxify(jnp.linalg.solve)(c, y)
    assert np.all(np.isnan(x))
