"""A graph network on quax-sparse's hybrid dense dimensions: edge features stored
as a `BCOO` of shape `(n, n, f)` with `n_dense=1` (one feature vector per edge),
message passing written as plain JAX (`relu(a @ w)` on the edges, an `einsum`
aggregating the senders), trained a few steps, against the same model on the
dense array: losses, gradients (with respect to the weights and to the stored
edge features, which never densify) and a batch of graphs under `vmap`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
from quax_sparse import BCOO


N_NODES, N_EDGE_FEATURES, WIDTH = 40, 5, 8


def _graph(seed: int, degree: int = 4) -> tuple[np.ndarray, BCOO]:
    """A random directed graph, `degree` edges out of each node, edge features
    `(n, n, f)`: the dense array and its `BCOO` (built from the edge list)."""
    rng = np.random.default_rng(seed)
    senders = rng.integers(0, N_NODES, size=(N_NODES, degree))
    rows = np.repeat(np.arange(N_NODES), degree)
    edges = np.unique(np.stack([rows, senders.ravel()], 1), axis=0)
    feats = rng.normal(size=(len(edges), N_EDGE_FEATURES)).astype(np.float32)
    dense = np.zeros((N_NODES, N_NODES, N_EDGE_FEATURES), np.float32)
    dense[edges[:, 0], edges[:, 1]] = feats
    nse = N_NODES * degree  # the same for every graph: unused slots are padding
    data = np.zeros((nse, N_EDGE_FEATURES), np.float32)
    data[: len(edges)] = feats
    indices = np.full((nse, 2), N_NODES, np.int32)
    indices[: len(edges)] = edges
    return dense, BCOO(jnp.asarray(data), jnp.asarray(indices), dense.shape)


class GraphNetwork(eqx.Module):
    """Two rounds of edge-conditioned message passing, then a readout."""

    edge: jax.Array  # (f, width): edge features to message gates
    node: jax.Array  # (width, width)
    readout: jax.Array  # (width,)

    def __init__(self, key: jax.Array) -> None:
        k1, k2, k3 = jr.split(key, 3)
        self.edge = jr.normal(k1, (N_EDGE_FEATURES, WIDTH)) / N_EDGE_FEATURES**0.5
        self.node = jr.normal(k2, (WIDTH, WIDTH)) / WIDTH**0.5
        self.readout = jr.normal(k3, (WIDTH,)) / WIDTH**0.5

    def __call__(self, edges: jax.Array, h: jax.Array) -> jax.Array:
        gates = jax.nn.relu(edges @ self.edge)  # (n, n, width): on the edges only
        degree = (edges != 0).any(-1).sum(1, keepdims=True)  # dense (n, 1)
        for _ in range(2):
            messages = jnp.einsum("ijw,jw->iw", gates, h)  # senders aggregated
            h = jnp.tanh(h @ self.node + messages / jnp.maximum(degree, 1))
        return h @ self.readout + gates.max(-1).sum(1)  # (n,)


def _loss(model, edges, h, target):
    return jnp.mean((model(edges, h) - target) ** 2)


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(N_NODES, WIDTH)).astype(np.float32)
    target = rng.normal(size=(N_NODES,)).astype(np.float32)
    return h, target


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-5)


def test_training_steps_match_the_dense_network():
    dense, edges = _graph(0)
    h, target = _inputs(1)
    model = GraphNetwork(jr.key(2))
    sparse_grad = jax.jit(jax.value_and_grad(quax.quaxify(_loss)))
    dense_grad = jax.jit(jax.value_and_grad(_loss))
    dense_model = model
    with quax.track_materialisation() as report:
        for _ in range(3):  # plain SGD on both
            loss, grads = sparse_grad(model, edges, h, target)
            want, dense_grads = dense_grad(dense_model, dense, h, target)
            _close(loss, want)
            jax.tree.map(_close, grads, dense_grads)
            model = jax.tree.map(lambda p, g: p - 0.1 * g, model, grads)
            dense_model = jax.tree.map(
                lambda p, g: p - 0.1 * g, dense_model, dense_grads
            )
    assert not report, str(report)
    assert float(loss) < float(_loss(GraphNetwork(jr.key(2)), dense, h, target))


def test_gradient_with_respect_to_the_edge_features():
    _, edges = _graph(3)
    h, target = _inputs(4)
    model = GraphNetwork(jr.key(5))

    def sparse_loss(data):
        return quax.quaxify(_loss)(
            model, BCOO(data, edges.indices, edges.shape), h, target
        )

    def dense_loss(data):  # plain JAX: the dense array built from the edge list
        rows, cols = edges.indices[:, 0], edges.indices[:, 1]
        a = jnp.zeros(edges.shape).at[rows, cols].add(data, mode="drop")
        return _loss(model, a, h, target)

    got = jax.jit(jax.grad(sparse_loss))(edges.data)
    assert got.shape == edges.data.shape  # one gradient per stored feature
    _close(got, jax.grad(dense_loss)(edges.data))


def test_a_batch_of_graphs_under_vmap():
    graphs = [_graph(seed) for seed in (6, 7, 8)]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[g for _, g in graphs])
    h, target = _inputs(9)
    model = GraphNetwork(jr.key(10))
    fn = lambda edges: _loss(model, edges, h, target)
    got = jax.jit(jax.vmap(quax.quaxify(fn)))(stacked)
    want = jax.vmap(fn)(np.stack([d for d, _ in graphs]))
    _close(got, want)
