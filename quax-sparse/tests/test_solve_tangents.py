"""Derivatives of sparse direct solves in float32, against closed forms that are exact
in float32, so that they hold to the bit on every backend (`test_direct.py` checks the
solves in float64 against NumPy, where a TPU has no float64).

On a TPU v5e (JAX 0.10.2, 2026-12-07) the JVP of `jnp.linalg.solve` of a `BCOO` gave
the primal `[1, 1]` for `diag(2, 4) x = 0`: JAX reused the lowering of the solve's
host callback for the tangent's solve, on the same host-transfer channels, and the
runtime handed the primal solve the factorisation's pivots as its right-hand side.
quax-core now has JAX lower such callbacks afresh at every place
(`quax._foundation._tpu_callbacks`); these tests are in `scripts/accel-suite.txt`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_sparse
from quax_sparse import BCOO, _cusolver
from sparse_helpers import needs_spsolve


@pytest.fixture(params=["superlu", pytest.param("cusolver", marks=needs_spsolve)])
def route(request):
    """The test on both solver routes (`quax_sparse.solver_route`). JAX lowers
    `spsolve`, the `"cusolver"` route, for the CPU (through SciPy) and CUDA only:
    elsewhere (a TPU) the route does not exist, and
    `test_the_cusolver_route_is_refused_where_jax_has_no_spsolve` checks that it
    is refused, naming the way out."""
    with quax_sparse.solver_route(request.param):
        yield request.param


# `diag(2, 4)` in float32, stored with one padding entry (whose tangent reaches
# nothing): `x = b / a`, and along the stored values `t` and the right-hand side `db`,
# `dx = (db - t x) / a`, all exact in float32.
_DIAGONAL = np.array([2.0, 4.0], np.float32)
_INDICES = jnp.asarray([[0, 0], [1, 1], [2, 2]], jnp.int32)
_DATA = jnp.asarray([2.0, 4.0, 0.0], jnp.float32)
_T = jnp.asarray([0.5, -0.25, 3.0], jnp.float32)
_DB = jnp.asarray([-1.25, 0.5], jnp.float32)


def _solve(data, b):
    return quax.quaxify(jnp.linalg.solve)(BCOO(data, _INDICES, (2, 2)), b)


@pytest.mark.usefixtures("route")
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("b", [(0.0, 0.0), (2.0, -4.0)])
def test_jvp_of_a_diagonal_solve_against_its_closed_form(jit, b):
    # The zero right-hand side is the case quax-sparse's conformance test shrank to
    # on the TPU (the quaxified tangent [-1.53, 0.42], the dense [-1.34, -0.35]).
    b = jnp.asarray(b, jnp.float32)
    run = jax.jit(_solve) if jit else _solve
    x, dx = jax.jvp(run, (_DATA, b), (_T, _DB))
    x_want = np.asarray(b) / _DIAGONAL
    dx_want = (np.asarray(_DB) - np.asarray(_T)[:2] * x_want) / _DIAGONAL
    assert x.dtype == dx.dtype == jnp.float32
    np.testing.assert_array_equal(x, x_want)
    np.testing.assert_array_equal(dx, dx_want)


@pytest.mark.usefixtures("route")
@pytest.mark.parametrize("jit", [False, True])
def test_gradient_of_a_diagonal_solve_against_its_closed_form(jit):
    # `L = c · x` with `x = b / a`: `dL/db = c / a`, `dL/da_i = -c_i x_i / a_i`, and
    # zero at the padding entry. The reverse pass solves the transposed system, a
    # second host callback beside the forward one.
    b = jnp.asarray([2.0, -4.0], jnp.float32)
    c = np.array([1.5, -0.5], np.float32)

    def loss(data, b):
        return jnp.dot(jnp.asarray(c), _solve(data, b))

    grad = jax.grad(loss, argnums=(0, 1))
    g_data, g_b = (jax.jit(grad) if jit else grad)(_DATA, b)
    x = np.asarray(b) / _DIAGONAL
    np.testing.assert_array_equal(g_b, c / _DIAGONAL)
    np.testing.assert_array_equal(g_data, np.append(-c * x / _DIAGONAL, 0))


@pytest.mark.parametrize("jit", [False, True])
def test_solve_and_slogdet_in_one_program(jit):
    # Two factorisations' callbacks and two solves' in one differentiated program:
    # `d log|det A| / da_i = 1 / a_i` beside the solve's `dx`.
    def both(data, b):
        a = BCOO(data, _INDICES, (2, 2))
        f = quax.quaxify(lambda a, b: (jnp.linalg.solve(a, b), jnp.linalg.slogdet(a)))
        x, (_, logdet) = f(a, b)
        return x, logdet

    b = jnp.asarray([2.0, -4.0], jnp.float32)
    run = jax.jit(both) if jit else both
    (x, logdet), (dx, dlogdet) = jax.jvp(run, (_DATA, b), (_T, _DB))
    x_want = np.asarray(b) / _DIAGONAL
    np.testing.assert_array_equal(x, x_want)
    np.testing.assert_array_equal(
        dx, (np.asarray(_DB) - np.asarray(_T)[:2] * x_want) / _DIAGONAL
    )
    np.testing.assert_allclose(logdet, np.log(8.0), rtol=1e-6)
    np.testing.assert_allclose(dlogdet, 0.5 / 2 - 0.25 / 4, rtol=1e-6)


# A batch of two diagonal matrices, `diag(2, 4)` and `diag(8, 0.5)`, each with one
# padding entry: the host callback loops over the batch (`test_batched_solves.py`
# checks batches in float64, where a TPU has none).
_BATCH_DIAGONALS = np.array([[2.0, 4.0], [8.0, 0.5]], np.float32)
_BATCH_DATA = jnp.asarray([[2.0, 4.0, 0.0], [8.0, 0.5, 0.0]], jnp.float32)
_BATCH_INDICES = jnp.asarray([[[0, 0], [1, 1], [2, 2]]] * 2, jnp.int32)
_BATCH_T = jnp.asarray([[0.5, -0.25, 3.0], [-2.0, 0.125, 1.0]], jnp.float32)
_BATCH_B = jnp.asarray([[2.0, -4.0], [1.0, 0.25]], jnp.float32)
_BATCH_DB = jnp.asarray([[-1.25, 0.5], [4.0, -0.5]], jnp.float32)


def _solve_batch(data, b):
    a = BCOO(data, _BATCH_INDICES, (2, 2, 2))
    return quax.quaxify(lambda a, b: jnp.linalg.solve(a, b[..., None])[..., 0])(a, b)


@pytest.mark.usefixtures("route")
@pytest.mark.parametrize("jit", [False, True])
def test_jvp_of_a_batch_of_diagonal_solves_against_its_closed_form(jit):
    # Each member as the single solve above: `x = b / a`, `dx = (db - t x) / a`.
    run = jax.jit(_solve_batch) if jit else _solve_batch
    x, dx = jax.jvp(run, (_BATCH_DATA, _BATCH_B), (_BATCH_T, _BATCH_DB))
    x_want = np.asarray(_BATCH_B) / _BATCH_DIAGONALS
    dx_want = (np.asarray(_BATCH_DB) - np.asarray(_BATCH_T)[:, :2] * x_want) / (
        _BATCH_DIAGONALS
    )
    assert x.dtype == dx.dtype == jnp.float32
    np.testing.assert_array_equal(x, x_want)
    np.testing.assert_array_equal(dx, dx_want)


@pytest.mark.usefixtures("route")
def test_vmap_of_a_solve_over_a_batch_against_its_closed_form():
    # `vmap` over the members of one solve, forward and reversed: the same numbers.
    def one(data, b):
        return quax.quaxify(jnp.linalg.solve)(BCOO(data, _INDICES, (2, 2)), b)

    got = jax.jit(jax.vmap(one))(_BATCH_DATA, _BATCH_B)
    np.testing.assert_array_equal(got, np.asarray(_BATCH_B) / _BATCH_DIAGONALS)
    c = np.array([[1.5, -0.5], [0.25, 2.0]], np.float32)
    g_b = jax.jit(jax.grad(lambda b: jnp.sum(jax.vmap(one)(_BATCH_DATA, b) * c)))(
        _BATCH_B
    )
    np.testing.assert_array_equal(g_b, c / _BATCH_DIAGONALS)


def test_the_cusolver_route_is_refused_where_jax_has_no_spsolve(monkeypatch):
    # On a TPU (or a ROCm GPU), forcing the route names the way out at trace time;
    # checked here with the backend stood in for (and quax's caches off: within one
    # process the backend never changes, so the programs the other tests cached
    # under the route would be served).
    monkeypatch.setattr(_cusolver, "_spsolve_backend", lambda: None)
    b = jnp.asarray([2.0, -4.0], jnp.float32)
    with (
        quax.caching(False),
        quax_sparse.solver_route("cusolver"),
        pytest.raises(ValueError, match="CUDA GPUs only") as info,
    ):
        _solve(_DATA, b)
    assert 'solver_route("superlu")' in str(info.value)
    with quax.caching(False), quax_sparse.solver_route("auto"):
        np.testing.assert_array_equal(_solve(_DATA, b), np.asarray(b) / _DIAGONAL)
