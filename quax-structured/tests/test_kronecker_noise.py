"""A diagonal added as a dense array that the program does not show to be one
(issue 29, item 4): `K + noise * jnp.eye(n)` with a noise batched by `jax.vmap`
(a batch of Gaussian processes with different noises) and `M - jnp.diag(d)` under
`jax.jit`. They refuse, saying which structure to write; what they say to write
runs, against dense JAX, under `vmap`, `jit` and `grad`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs


pytestmark = pytest.mark.usefixtures("x64")

N = 12


def _rand(seed, *shape, dtype=jnp.float64):
    x = jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)
    return x.astype(dtype)


def _spd(seed, size, dtype):
    a = _rand(seed, size, size, dtype=dtype)
    return a @ a.T / size + jnp.eye(size, dtype=dtype)


def _gp(dtype):
    a, b = _spd(0, 3, dtype), _spd(1, 4, dtype)
    y = _rand(2, N, dtype=dtype)
    noises = jnp.asarray([0.1, 0.5, 2.0], dtype)
    return a, b, y, noises


def test_vmapped_dense_noise_refuses_naming_scaled_identity():
    a, b, y, noises = _gp(jnp.float64)
    k = qs.Kronecker(a, b, symmetric=True)

    def loss(k, noise):
        return jnp.linalg.solve(k + noise * jnp.eye(N), y)

    with pytest.raises(qs.StructuredMaterialisationError) as info:
        jax.vmap(quax.quaxify(loss), in_axes=(None, 0))(k, noises)
    message = str(info.value)
    assert "primitive `add`" in message and "jax.vmap" in message
    assert "M + quax_structured.ScaledIdentity(noise, n)" in message
    assert "allow_materialise=True" in message


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_vmapped_scaled_identity_noise_matches_dense(dtype, close):
    """What the refusal says to write: a batch of `KroneckerPlusIdentity`s,
    the negative log likelihood and its gradient with respect to each noise
    against dense JAX, under `jit(vmap(...))`."""
    a, b, y, noises = _gp(dtype)
    k = qs.Kronecker(a, b, symmetric=True)

    def nll(k, noise):
        m = k + qs.ScaledIdentity(noise, N)
        return y @ jnp.linalg.solve(m, y) / 2 + jnp.linalg.slogdet(m)[1] / 2

    def dense(noise):
        m = jnp.kron(a, b) + noise * jnp.eye(N, dtype=dtype)
        return y @ jnp.linalg.solve(m, y) / 2 + jnp.linalg.slogdet(m)[1] / 2

    structured = jax.value_and_grad(quax.quaxify(nll), argnums=1)
    got = jax.jit(jax.vmap(structured, in_axes=(None, 0)))(k, noises)
    want = jax.vmap(jax.value_and_grad(dense))(noises)
    close(got[0], want[0], dtype)
    close(got[1], want[1], dtype)


def test_dense_diagonal_under_jit_refuses_naming_diagonal():
    d = np.linspace(1.0, 2.0, N)
    m = qs.TridiagonalMatrix(jnp.ones(N - 1), 3 * jnp.ones(N), jnp.ones(N - 1))

    def shifted(m):
        return m - jnp.diag(d)

    runs = [
        lambda: jax.jit(quax.quaxify(shifted))(m),  # `d` closed over
        lambda: jax.jit(quax.quaxify(lambda m, d: m - jnp.diag(d)))(m, d),
    ]
    for run in runs:
        with pytest.raises(qs.StructuredMaterialisationError) as info:
            run()
        message = str(info.value)
        assert "primitive `sub`" in message and "jnp.diag(d)" in message
        assert "M - quax_structured.Diagonal(d)" in message


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_structured_diagonal_under_jit_matches_dense(dtype, close):
    """What the refusal says to write, `M - Diagonal(d)` with `d` closed over or
    an argument of `jit`: the structure kept (a `TridiagonalMatrix`, a
    `Diagonal`), its solve against dense."""
    d = np.linspace(1.0, 2.0, N).astype(dtype)
    lower, upper = _rand(3, N - 1, dtype=dtype), _rand(4, N - 1, dtype=dtype)
    main = 4 + _rand(5, N, dtype=dtype)
    rhs = _rand(6, N, dtype=dtype)
    cases = [
        (qs.TridiagonalMatrix(lower, main, upper), qs.TridiagonalMatrix),
        (qs.Diagonal(main), qs.Diagonal),
    ]
    for m, kind in cases:
        dense = m.enable_materialise().materialise()
        closed = jax.jit(quax.quaxify(lambda m: m - qs.Diagonal(d)))(m)
        passed = jax.jit(quax.quaxify(lambda m, d: m - qs.Diagonal(d)))(m, d)
        for out in (closed, passed):
            assert isinstance(out, kind)
            close(out.enable_materialise().materialise(), dense - jnp.diag(d), dtype)
        solve = jax.jit(
            quax.quaxify(lambda m, d: jnp.linalg.solve(m - qs.Diagonal(d), rhs))
        )
        close(solve(m, d), jnp.linalg.solve(dense - jnp.diag(d), rhs), dtype)


def test_allowed_to_materialise_still_densifies(close):
    """With `allow_materialise=True` the dense sum is JAX's (no refusal)."""
    d = np.linspace(1.0, 2.0, N)
    m = qs.Diagonal(3 * jnp.ones(N), allow_materialise=True)
    out = jax.jit(quax.quaxify(lambda m: m - jnp.diag(d)))(m)
    close(out, np.diag(3 - d), jnp.float64)
