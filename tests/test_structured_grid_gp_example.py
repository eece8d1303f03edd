"""`examples/structured_grid_gp.py`: its likelihood and gradient equal the dense
computation on a small grid, and its fit moves towards the values the data were
drawn with, writing its plot."""

import runpy

import jax
import jax.numpy as jnp
import numpy as np
import quax.testing


example = runpy.run_path("examples/structured_grid_gp.py")


def _dense_loss(x, y, params):
    log_lengthscale, log_noise = params
    k = example["axis_kernel"](x, jnp.exp(log_lengthscale))
    C = jnp.kron(jnp.kron(k, k), k) + jnp.exp(log_noise) * jnp.eye(y.shape[0])
    return 0.5 * (y @ jnp.linalg.solve(C, y) + jnp.linalg.slogdet(C)[1]) / y.shape[0]


def test_loss_and_gradient_match_dense():
    # In float64 where the backend has it natively. A TPU's XLA has no float64 LU for
    # the dense reference ("Only F32 and C64 types are implemented in
    # LuDecomposition", seen on a TPU v5e): there the example runs in float32, against
    # the dense computation in float32 at float32's tolerance, matrix products at full
    # float32 precision (a TPU's default rounds their operands to bfloat16). On a CPU
    # the float32 run agrees to 7e-6 (relative) in the gradient, well inside that
    # tolerance.
    if jax.default_backend() == "tpu":
        with jax.default_matmul_precision("highest"):
            tolerance = quax.testing.tolerance(jnp.float32)
            _loss_and_gradient_match_dense(tolerance, tolerance)
    else:
        with jax.enable_x64(True):
            _loss_and_gradient_match_dense(
                {"rtol": 1e-10}, {"rtol": 1e-8, "atol": 1e-12}
            )


def _loss_and_gradient_match_dense(value_tolerance, gradient_tolerance):
    x = jnp.linspace(0.0, 1.0, 5)
    y = example["sample"](jax.random.key(1), x, 0.3, 0.1)
    loss = example["make_loss"](x, y)
    params = jnp.log(jnp.array([0.4, 0.2]))
    value, grad = jax.jit(jax.value_and_grad(loss))(params)
    dense_value, dense_grad = jax.value_and_grad(lambda p: _dense_loss(x, y, p))(params)
    np.testing.assert_allclose(value, dense_value, **value_tolerance)
    np.testing.assert_allclose(grad, dense_grad, **gradient_tolerance)


def test_fit_recovers_the_lengthscale(tmp_path):
    results = example["main"](m=12, steps=60, out_dir=str(tmp_path))
    first, last = (float(v) for v in results["loss"].split(" -> "))
    assert last < first
    lengthscale = float(results["lengthscale"].split()[0])
    assert abs(lengthscale - example["TRUE_LENGTHSCALE"]) < 0.05
    assert (tmp_path / "structured_grid_gp.png").stat().st_size > 0
