"""quax-sparse with symbolic zeros and with LoRA: each family keeps its structure
where the two meet, against the dense computation."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_lora
from quax.zero import Zero
from quax_sparse import BCOO


def _sparse(seed: int, shape: tuple[int, int], density: float = 0.3):
    rng = np.random.default_rng(seed)
    dense = np.where(rng.random(shape) < density, rng.normal(size=shape), 0.0)
    dense = dense.astype(np.float32)
    coords = np.argwhere(dense != 0)
    x = BCOO(jnp.asarray(dense[tuple(coords.T)]), jnp.asarray(coords, jnp.int32), shape)
    return dense, x


def test_sparse_with_symbolic_zeros():
    _, a = _sparse(0, (5, 4))
    z = Zero((4,), jnp.float32)

    def f(a, z, z2):
        return {"matvec": a @ z, "scaled": a * z2, "sum": a + 0 * a}

    with quax.track_materialisation() as report:
        out = jax.jit(quax.quaxify(f))(a, z, Zero((5, 4), jnp.float32))
    assert not report, str(report)
    assert isinstance(out["matvec"], Zero) and out["matvec"].shape == (5,)
    assert isinstance(out["scaled"], Zero)
    assert isinstance(out["sum"], BCOO)


def test_zero_plus_sparse_keeps_the_sparse_array():
    dense, a = _sparse(1, (3, 3))
    out = quax.quaxify(lambda z, a: z + a)(Zero((3, 3), jnp.float32), a)
    assert isinstance(out, BCOO)
    np.testing.assert_allclose(out.todense(), dense)


def test_graph_layer_with_a_lora_weight():
    dense_adj, adjacency = _sparse(2, (12, 12))
    features = jr.normal(jr.key(0), (12, 6))
    weight = jr.normal(jr.key(1), (6, 3))
    lora = quax_lora.LoraArray(weight, rank=2, key=jr.key(2))
    b = 0.1 * jr.normal(jr.key(3), lora.b.shape)  # a trained adapter: nonzero b
    lora = _with_b(lora, b)
    merged = weight + lora.a @ b

    def layer(adj, x, w):
        return jnp.tanh(adj @ (x @ w))

    with quax.track_materialisation() as report:
        out = jax.jit(quax.quaxify(layer))(adjacency, features, lora)
    assert not report, str(report)
    want = layer(dense_adj, features, merged)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # ...and the LoRA weight applied to a sparse matrix: `adj @ w` with w a LoRA.
    dense_x, x = _sparse(4, (12, 6))
    out = jax.jit(quax.quaxify(lambda x, w: x @ w))(x, lora)
    np.testing.assert_allclose(out, dense_x @ merged, rtol=1e-5, atol=1e-5)
    # Gradients reach the adapter through the sparse product.
    grad = jax.grad(
        lambda b: jnp.sum(quax.quaxify(layer)(adjacency, features, _with_b(lora, b)))
    )(b)
    want_grad = jax.grad(
        lambda b: jnp.sum(layer(dense_adj, features, weight + lora.a @ b))
    )(b)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5)


def _with_b(lora, b):

    return eqx.tree_at(lambda t: t.b, lora, b)
