"""Unmodified JAX programs on sparse matrices: Krylov solvers on a 5-point Laplacian,
and a graph layer in Equinox trained by gradient descent."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy.sparse.linalg as jspla
import numpy as np
import optax
import pytest
import quax
import scipy.sparse
import scipy.sparse.linalg
from quax_sparse import BCOO


def laplacian_2d(m: int) -> tuple[BCOO, scipy.sparse.csr_array]:
    """The 5-point Laplacian of an `m x m` grid (Dirichlet boundary; 4 on the
    diagonal, -1 per neighbour), as a `BCOO` and, built independently, with scipy."""
    grid = np.arange(m * m).reshape(m, m)
    rows, cols, vals = [grid.ravel()], [grid.ravel()], [np.full(m * m, 4.0)]
    for a, b in [(grid[1:], grid[:-1]), (grid[:, 1:], grid[:, :-1])]:
        rows += [a.ravel(), b.ravel()]
        cols += [b.ravel(), a.ravel()]
        vals += [np.full(a.size, -1.0)] * 2
    r, c, v = (np.concatenate(t) for t in (rows, cols, vals))
    x = BCOO(
        jnp.asarray(v, jnp.float32),
        jnp.stack([r, c], -1).astype(np.int32),
        (m * m,) * 2,
    )
    # scipy leaves `offsets` unannotated: pyright takes its default's type, `int`.
    one_d = scipy.sparse.diags_array(
        [-1.0, 2.0, -1.0],
        offsets=[-1, 0, 1],  # pyright: ignore[reportArgumentType]
        shape=(m, m),
    )
    eye = scipy.sparse.eye_array(m)
    reference = (scipy.sparse.kron(one_d, eye) + scipy.sparse.kron(eye, one_d)).tocsr()
    return x, reference


@pytest.mark.parametrize("solver", [jspla.cg, jspla.bicgstab, jspla.gmres])
def test_krylov_solve_on_laplacian_under_jit(solver):
    m = 64  # 4096 unknowns; the benchmark and example run the 512 x 512 grid
    a, reference = laplacian_2d(m)
    b = jnp.asarray(np.random.default_rng(0).normal(size=m * m), jnp.float32)

    @jax.jit
    @quax.quaxify
    def solve(a, b):
        x, _ = solver(lambda v: a @ v, b, tol=1e-6, maxiter=2000)
        return x

    with quax.track_materialisation() as report:
        x = solve(a, b)
    assert not report, str(report)
    residual = np.linalg.norm(reference @ np.asarray(x, np.float64) - np.asarray(b))
    assert residual <= 1e-4 * np.linalg.norm(b)
    want = np.asarray(
        scipy.sparse.linalg.spsolve(reference.tocsc(), np.asarray(b, np.float64))
    )
    np.testing.assert_allclose(x, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


class GraphLayer(eqx.Module):
    linear: eqx.nn.Linear

    def __init__(self, n_in: int, n_out: int, *, key):
        self.linear = eqx.nn.Linear(n_in, n_out, use_bias=False, key=key)

    def __call__(self, adjacency, features):
        return jnp.tanh(adjacency @ (features @ self.linear.weight.T))


def test_graph_layer_trains():
    n, n_in, n_out = 60, 8, 4
    key_a, key_x, key_y, key_m = jr.split(jr.key(0), 4)
    mask = jr.bernoulli(key_a, 0.08, (n, n)) | jnp.eye(n, dtype=bool)
    dense_adj = mask / mask.sum(1, keepdims=True)
    adjacency = BCOO.fromdense(dense_adj, nse=int(mask.sum()))
    features = jr.normal(key_x, (n, n_in))
    targets = jr.normal(key_y, (n, n_out))
    model = GraphLayer(n_in, n_out, key=key_m)
    optim = optax.sgd(0.5)

    def loss(model, adjacency, features, targets):
        return jnp.mean((model(adjacency, features) - targets) ** 2)

    @eqx.filter_jit
    def step(model, opt_state, adjacency):
        value, grads = eqx.filter_value_and_grad(quax.quaxify(loss))(
            model, adjacency, features, targets
        )
        updates, opt_state = optim.update(grads, opt_state)
        return eqx.apply_updates(model, updates), opt_state, value

    # The first gradient is the dense one.
    sparse_grad = eqx.filter_jit(eqx.filter_grad(quax.quaxify(loss)))(
        model, adjacency, features, targets
    )
    dense_grad = eqx.filter_grad(loss)(model, dense_adj, features, targets)
    np.testing.assert_allclose(
        sparse_grad.linear.weight, dense_grad.linear.weight, rtol=1e-4, atol=1e-6
    )
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    losses = []
    for _ in range(5):
        model, opt_state, value = step(model, opt_state, adjacency)
        losses.append(float(value))
    assert losses[-1] < losses[0]
    assert all(b <= a for a, b in itertools.pairwise(losses))
