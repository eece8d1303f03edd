"""`examples/structured_grid_gp.py`: its likelihood and gradient equal the dense
computation on a small grid, and its fit moves towards the values the data were
drawn with, writing its plot."""

import runpy

import jax
import jax.numpy as jnp
import numpy as np


example = runpy.run_path("examples/structured_grid_gp.py")


def _dense_loss(x, y, params):
    log_lengthscale, log_noise = params
    k = example["axis_kernel"](x, jnp.exp(log_lengthscale))
    C = jnp.kron(jnp.kron(k, k), k) + jnp.exp(log_noise) * jnp.eye(y.shape[0])
    return 0.5 * (y @ jnp.linalg.solve(C, y) + jnp.linalg.slogdet(C)[1]) / y.shape[0]


def test_loss_and_gradient_match_dense():
    with jax.enable_x64(True):
        _loss_and_gradient_match_dense()


def _loss_and_gradient_match_dense():
    x = jnp.linspace(0.0, 1.0, 5)
    y = example["sample"](jax.random.key(1), x, 0.3, 0.1)
    loss = example["make_loss"](x, y)
    params = jnp.log(jnp.array([0.4, 0.2]))
    value, grad = jax.jit(jax.value_and_grad(loss))(params)
    dense_value, dense_grad = jax.value_and_grad(lambda p: _dense_loss(x, y, p))(params)
    np.testing.assert_allclose(value, dense_value, rtol=1e-10)
    np.testing.assert_allclose(grad, dense_grad, rtol=1e-8, atol=1e-12)


def test_fit_recovers_the_lengthscale(tmp_path):
    results = example["main"](m=12, steps=60, out_dir=str(tmp_path))
    first, last = (float(v) for v in results["loss"].split(" -> "))
    assert last < first
    lengthscale = float(results["lengthscale"].split()[0])
    assert abs(lengthscale - example["TRUE_LENGTHSCALE"]) < 0.05
    assert (tmp_path / "structured_grid_gp.png").stat().st_size > 0
