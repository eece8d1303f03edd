"""Hybrid dense dimensions (`n_dense > 0`) under `jit`, `vmap` and `grad`: the
gradient with respect to the stored blocks has their shape and the compiled
gradient of a neighbour aggregation at `n = 2,000` holds no `n x n` array;
transposes that bring dense dimensions to the front (what `vmap` inside `quaxify`
binds); and random shapes, batch and dense dimensions with hypothesis, all
against plain JAX on the dense array."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from hypothesis import given, settings, strategies as st
from quax_sparse import BCOO, SparseMaterialisationError
from sparse_helpers import assert_close, check


def _graph(seed, n=6, f=3, degree=2, dtype=np.float32):
    """Edge features of a random graph on `n` nodes: a `(n, n, f)` `BCOO` with
    `degree` edges per node (some stored twice: they add up) and padding, and its
    dense twin built independently with NumPy."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), degree)
    cols = rng.integers(0, n, size=rows.size)
    feats = rng.normal(size=(rows.size, f)).astype(dtype)
    dense = np.zeros((n, n, f), dtype)
    np.add.at(dense, (rows, cols), feats)
    indices = np.concatenate([np.stack([rows, cols], 1), [[n, n]]]).astype(np.int32)
    data = np.concatenate([feats, np.zeros((1, f), dtype)])
    return dense, BCOO(jnp.asarray(data), jnp.asarray(indices), (n, n, f))


def _dense_from(x, data):
    """Plain JAX: the dense array of `x`'s pattern holding `data` (the reference
    for gradients with respect to the stored blocks)."""
    rows, cols = x.indices[:, 0], x.indices[:, 1]
    return jnp.zeros(x.shape, data.dtype).at[rows, cols].add(data, mode="drop")


def _message_passing(a, h, w):
    """One graph-network step: edge features `a` `(n, n, f)` transformed by `w`
    `(f, g)`, gated by `relu`, weighting the sender's node features `h` `(n, g)`,
    summed over the senders."""
    messages = jax.nn.relu(a @ w)  # sparse (n, n, g): on the edges only
    return jnp.einsum("ijg,jg->ig", messages, h) + messages.sum(1)


_LOSSES = {
    "aggregate": lambda a, h, w: (a.sum(1) ** 2).sum(),
    "message_passing": lambda a, h, w: (_message_passing(a, h, w) ** 2).sum(),
    "max_features": lambda a, h, w: (a.max(2) @ h).sum(),
    "weighted": lambda a, h, w: jnp.sin(jnp.einsum("ijf,jf->if", a, h[:, :3])).sum(),
}


@pytest.mark.parametrize("name", list(_LOSSES))
def test_grad_with_respect_to_the_blocks_and_the_weights(name):
    loss = _LOSSES[name]
    _, x = _graph(1)
    rng = np.random.default_rng(2)
    h = rng.normal(size=(6, 4)).astype(np.float32)
    w = rng.normal(size=(3, 4)).astype(np.float32)

    def sparse_loss(data, h, w):
        return quax.quaxify(loss)(BCOO(data, x.indices, x.shape), h, w)

    def dense_loss(data, h, w):
        return loss(_dense_from(x, data), h, w)

    got = jax.jit(jax.grad(sparse_loss, argnums=(0, 1, 2)))(x.data, h, w)
    want = jax.grad(dense_loss, argnums=(0, 1, 2))(x.data, h, w)
    assert got[0].shape == x.data.shape  # one gradient block per stored block
    for g, r in zip(got, want, strict=True):
        assert_close(g, r)


@pytest.mark.parametrize("duplicates", [False, True])
def test_grad_of_relu_on_batched_blocks(duplicates):
    # `relu`'s derivative, `where(x > 0, g, 0)` of two sparse arrays, keeps the
    # batch layout of the tangent `g` (each member intersected alone).
    rng = np.random.default_rng(12)
    dense = rng.normal(size=(2, 6, 5, 3)).astype(np.float32)
    dense *= rng.random((2, 6, 5, 1)) < 0.4
    x = BCOO.fromdense(dense, nse=20, n_batch=1, n_dense=1)
    if duplicates:  # every block stored twice, halves adding up
        data = jnp.concatenate([x.data / 2, x.data / 2], axis=1)
        x = BCOO(data, jnp.concatenate([x.indices, x.indices], axis=1), x.shape)
    v = rng.normal(size=(3,)).astype(np.float32)
    loss = lambda a: (jax.nn.relu(a).sum(1) @ v).sum()

    def reference(data):
        return loss(BCOO(data, x.indices, x.shape).todense())

    got = jax.jit(jax.grad(lambda d: quax.quaxify(loss)(BCOO(d, x.indices, x.shape))))(
        x.data
    )
    assert got.shape == x.data.shape
    assert_close(got, jax.grad(reference)(x.data))


@pytest.mark.parametrize("name", ["aggregate", "message_passing"])
def test_compiled_gradient_holds_no_dense_array(name):
    loss = _LOSSES[name]
    n = 2000  # the dense (n, n, f) array would hold 16 million elements
    _, x = _graph(3, n=n, f=4, degree=4)
    h = jnp.ones((n, 4))
    w = jnp.ones((4, 4))

    def sparse_loss(data, indices, h, w):  # the indices an argument, not a constant
        return quax.quaxify(loss)(BCOO(data, indices, x.shape), h, w)

    grad = jax.jit(jax.grad(sparse_loss, argnums=(0, 2, 3)))
    hlo = grad.lower(x.data, x.indices, h, w).compile().as_text()
    assert hlo is not None
    assert not re.search(rf"\b{n},{n}\b", hlo)
    got = grad(x.data, x.indices, h, w)
    assert got[0].shape == x.data.shape
    # The same gradient through the dense array does hold it (the check can fail);
    # its values are compared at a small `n` above.
    dense = jax.grad(lambda d, h, w: loss(_dense_from(x, d), h, w), argnums=(0, 1, 2))
    lowered = jax.jit(dense).lower(x.data, h, w).as_text()  # StableHLO: NxNxF
    assert re.search(rf"\b{n}x{n}x", lowered)


# vmap -----------------------------------------------------------------------------


@pytest.mark.parametrize("inside", [False, True], ids=["vmap_quaxify", "quaxify_vmap"])
def test_vmap_over_weights(inside):
    dense, x = _graph(4)
    ws = np.random.default_rng(5).normal(size=(4, 3, 2)).astype(np.float32)
    for fn in (lambda a, w: a @ w, lambda a, w: jax.nn.relu(a @ w).sum(1)):
        batched = jax.vmap(fn, in_axes=(None, 0))
        quaxed = (
            quax.quaxify(batched)
            if inside
            else jax.vmap(quax.quaxify(fn), in_axes=(None, 0))
        )
        got = jax.jit(quaxed)(x, ws)
        assert_close(got, batched(dense, ws))


def test_vmap_over_stacked_graphs():
    d1, x = _graph(6)
    d2, y = _graph(7)
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), x, y)
    h = np.random.default_rng(8).normal(size=(6, 2)).astype(np.float32)
    w = np.random.default_rng(9).normal(size=(3, 2)).astype(np.float32)
    fn = lambda a: _message_passing(a, h, w)
    got = jax.jit(jax.vmap(quax.quaxify(fn)))(stacked)
    assert_close(got, jax.vmap(fn)(np.stack([d1, d2])))


# Transposes that bring dense dimensions to the front ------------------------------


@pytest.mark.parametrize(
    ("perm", "n_batch"),
    [((2, 0, 1), 1), ((2, 1, 0), 1), ((3, 2, 1, 0), 2), ((2, 0, 1, 3), 1)],
    ids=str,
)
def test_dense_dimensions_to_the_front(perm, n_batch):
    shape = (6, 6, 3) if len(perm) == 3 else (6, 6, 3, 2)
    rng = np.random.default_rng(10)
    dense = rng.normal(size=shape).astype(np.float32)
    dense *= (rng.random((6, 6)) < 0.3).reshape((6, 6) + (1,) * (len(shape) - 2))
    x = BCOO.fromdense(dense, nse=20, n_dense=len(shape) - 2)
    fn = lambda a: a.transpose(perm)
    out = check(fn, x, dense_args=(dense,))
    assert isinstance(out, BCOO) and out.n_batch == n_batch


def test_dense_dimension_between_sparse_ones_refuses():
    dense, x = _graph(11)
    with pytest.raises(SparseMaterialisationError, match=r"n_dense=1.*update_layout"):
        quax.quaxify(lambda a: a.transpose(0, 2, 1))(x)
    assert_close(
        quax.quaxify(lambda a: a.transpose(0, 2, 1))(x.update_layout(n_dense=0)),
        dense.transpose(0, 2, 1),
    )


# Random shapes -----------------------------------------------------------------------

# Each takes the array, a weight matrix on its last dense dimension, a dense array
# of the blocks' shape, a vector along its first sparse dimension and `n_batch`.
_OPS = {
    "features": lambda a, w, v, u, nb: a @ w,
    "sum_first": lambda a, w, v, u, nb: a.sum(0),
    "sum_blocks": lambda a, w, v, u, nb: a.sum(-1),
    "max_blocks": lambda a, w, v, u, nb: a.max(-1),
    "relu_scaled": lambda a, w, v, u, nb: jax.nn.relu(a) * v,
    "contract_sparse": lambda a, w, v, u, nb: jnp.tensordot(u, a, ([0], [nb])),
    "transpose_front": lambda a, w, v, u, nb: jnp.moveaxis(a, -1, 0),
}


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_random_layouts(data):
    n_batch = data.draw(st.integers(0, 1), label="n_batch")
    n_sparse = data.draw(st.integers(1, 2), label="n_sparse")
    n_dense = data.draw(st.integers(1, 2), label="n_dense")
    sizes = st.integers(1, 4)
    shape = tuple(data.draw(sizes) for _ in range(n_batch + n_sparse + n_dense))
    name = data.draw(st.sampled_from(sorted(_OPS)), label="op")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    lead = shape[: n_batch + n_sparse]
    stored = rng.random(lead) < 0.5
    dense = rng.normal(size=shape) * stored.reshape(lead + (1,) * n_dense)
    dense = dense.astype(np.float32)
    per_batch = stored.reshape((int(np.prod(lead[:n_batch], dtype=int)), -1))
    nse = int(per_batch.sum(axis=1).max()) + 1
    x = BCOO.fromdense(dense, nse=nse, n_batch=n_batch, n_dense=n_dense)
    w = rng.normal(size=(shape[-1], 2)).astype(np.float32)
    v = rng.normal(size=shape[-n_dense:]).astype(np.float32)  # along the blocks
    u = rng.normal(size=shape[n_batch]).astype(np.float32)
    fn = lambda a, w, v, u: _OPS[name](a, w, v, u, n_batch)
    check(fn, x, w, v, u, dense_args=(dense, w, v, u))
