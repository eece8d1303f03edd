"""grad, vmap, scan over layers, checkpoint, and models: MLP, attention."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from jax import lax
from lora_helpers import normal


def _loss(model, x):
    return jnp.sum(jnp.tanh(model(x)) ** 2)


@pytest.mark.parametrize("alpha", [None, 4.0])
def test_gradients_match_dense_formula(alpha, perturb):
    linear = eqx.nn.Linear(7, 5, key=jr.PRNGKey(0))
    lora = perturb(
        quax_lora.loraify(linear, rank=2, alpha=alpha, key=jr.PRNGKey(1)), jr.PRNGKey(2)
    )
    x = normal(jr.PRNGKey(3), (7,))
    grads = eqx.filter_grad(quax.quaxify(_loss))(lora, x)
    weight = lora.weight
    s = weight.scaling

    def dense_loss(w, a, b):
        return _loss(eqx.tree_at(lambda lr: lr.weight, linear, w + s * a @ b), x)

    gw, ga, gb = jax.grad(dense_loss, argnums=(0, 1, 2))(weight.w, weight.a, weight.b)
    np.testing.assert_allclose(grads.weight.a, ga, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads.weight.b, gb, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(grads.weight.w, jnp.zeros_like(weight.w))
    assert np.abs(np.asarray(gw)).max() > 0  # a frozen weight is not a trivial one

    unfrozen = quax_lora.loraify(
        linear, rank=2, alpha=alpha, stop_gradient=False, key=jr.PRNGKey(1)
    )
    unfrozen = eqx.tree_at(lambda lr: lr.weight.b, unfrozen, weight.b)
    grads = eqx.filter_grad(quax.quaxify(_loss))(unfrozen, x)
    np.testing.assert_allclose(grads.weight.w, gw, rtol=1e-5, atol=1e-6)


def test_frozen_weight_gradient_not_computed(perturb):
    """With `stop_gradient=True` no (n, m) cotangent is computed for `w`."""
    linear = eqx.nn.Linear(7, 5, key=jr.PRNGKey(0))
    lora = perturb(quax_lora.loraify(linear, rank=2, key=jr.PRNGKey(1)), jr.PRNGKey(2))
    x = jnp.ones((7,))
    params, static = eqx.partition(lora, quax_lora.trainable_filter(lora))

    def loss(p):
        return quax.quaxify(_loss)(eqx.combine(p, static), x)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(params)
    shapes = [
        v.aval.shape
        for e in jaxpr.jaxpr.eqns
        if e.primitive.name != "stop_gradient"
        for v in e.outvars
    ]
    assert (5, 7) not in shapes


def test_vmap_both_orders(perturb):
    mlp = eqx.nn.MLP(6, 3, 8, depth=2, key=jr.PRNGKey(0))
    lora = perturb(quax_lora.loraify(mlp, rank=2, key=jr.PRNGKey(1)), jr.PRNGKey(2))
    xs = normal(jr.PRNGKey(3), (4, 6))
    expected = jax.vmap(quax_lora.merge(lora))(xs)
    out1 = jax.vmap(quax.quaxify(lora))(xs)
    out2 = quax.quaxify(jax.vmap(lambda m, x: m(x), in_axes=(None, 0)))(lora, xs)
    np.testing.assert_allclose(out1, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out2, expected, rtol=1e-5, atol=1e-6)


def test_vmap_over_lora_arrays(perturb):
    """A stack of LoraArrays, vmapped leaf by leaf."""
    weights = normal(jr.PRNGKey(0), (3, 5, 4))
    stack = perturb(
        quax_lora.LoraArray(weights, rank=2, key=jr.PRNGKey(1)), jr.PRNGKey(2)
    )
    x = jnp.arange(4.0)
    out = jax.vmap(quax.quaxify(lambda lr: lr @ x))(stack)
    np.testing.assert_allclose(out, quax_lora.merge(stack) @ x, rtol=1e-5, atol=1e-6)


def _scan_layers(stack, x):
    def body(h, layer):
        return jnp.tanh(layer @ h), None

    return lax.scan(body, x, stack)[0]


def test_scan_over_layers(perturb):
    depth, n = 4, 6
    weights = normal(jr.PRNGKey(0), (depth, n, n)) / n
    stack = perturb(
        quax_lora.LoraArray(weights, rank=2, key=jr.PRNGKey(1)), jr.PRNGKey(2)
    )
    x = jnp.ones(n)
    with quax.track_materialisation() as report:
        out = jax.jit(quax.quaxify(_scan_layers))(stack, x)
    assert not report
    np.testing.assert_allclose(
        out, _scan_layers(quax_lora.merge(stack), x), rtol=1e-5, atol=1e-6
    )
    # The stacked `w` goes into the scan as it is, sliced per step like any `xs`,
    # not copied or densified: the scan's operands are the three stacks.
    jaxpr = jax.make_jaxpr(quax.quaxify(_scan_layers))(stack, x)
    [scan] = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    stacked = {v.aval.shape for v in scan.invars}
    assert {(depth, n, n), (depth, n, 2), (depth, 2, n)} <= stacked
    # and its gradient reaches only the factors.
    grads = jax.grad(lambda s: quax.quaxify(_scan_layers)(s, x).sum())(stack)
    np.testing.assert_array_equal(grads.w, 0)
    assert np.abs(np.asarray(grads.b)).max() > 0


def test_checkpoint(perturb):
    mlp = eqx.nn.MLP(6, 3, 8, depth=2, key=jr.PRNGKey(0))
    lora = perturb(quax_lora.loraify(mlp, rank=2, key=jr.PRNGKey(1)), jr.PRNGKey(2))
    x = normal(jr.PRNGKey(3), (6,))
    remat = eqx.filter_checkpoint(_loss)
    grads = eqx.filter_grad(quax.quaxify(remat))(lora, x)
    dense = eqx.filter_grad(quax.quaxify(_loss))(lora, x)
    for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(dense), strict=True):
        np.testing.assert_allclose(g, d, rtol=1e-5, atol=1e-6)


def test_multihead_attention(perturb):
    mha = eqx.nn.MultiheadAttention(2, 8, key=jr.PRNGKey(0))
    lora = perturb(quax_lora.loraify(mha, rank=2, key=jr.PRNGKey(1)), jr.PRNGKey(2))
    assert (
        sum(
            quax_lora.is_lora(x)
            for x in jax.tree.leaves(lora, is_leaf=quax_lora.is_lora)
        )
        == 4
    )
    q = normal(jr.PRNGKey(3), (5, 8))
    with quax.track_materialisation() as report:
        out = quax.quaxify(lora)(q, q, q)
    assert not report
    np.testing.assert_allclose(
        out, quax_lora.merge(lora)(q, q, q), rtol=1e-5, atol=1e-5
    )
