"""Model-level helpers (`quax_quant._model`): `quantise_model`, `memory_report`,
quantisation-aware training and control flow over a quantised model."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq


def _mlp():
    return eqx.nn.MLP(32, 4, 64, depth=2, key=jr.PRNGKey(0))


def test_quantise_model_and_memory():
    mlp = _mlp()
    x = jr.normal(jr.PRNGKey(1), (8, 32))
    expected = jax.vmap(mlp)(x)
    cases: list[tuple[dict[str, Any], float]] = [
        ({"bits": 8}, 0.25),
        ({"bits": 4, "group_size": 16}, 0.125),
    ]
    for kwargs, ratio in cases:
        q = qq.quantise_model(mlp, **kwargs)
        report = qq.memory_report(q)
        assert report.quantised_arrays == 3
        weights = 32 * 64 + 64 * 64 + 64 * 4
        assert report.float_bytes == 4 * weights
        scales = report.quantised_bytes - int(report.float_bytes * ratio)
        assert 0 < scales < 0.07 * report.float_bytes
        assert "saved" in str(report)
        out = eqx.filter_jit(quax.quaxify(lambda m, x: jax.vmap(m)(x)))(q, x)
        err = float(jnp.max(jnp.abs(out - expected)))
        assert err < (0.05 if kwargs["bits"] == 8 else 0.3) * float(
            jnp.max(jnp.abs(expected))
        )


def test_quantise_model_where_and_errors():
    mlp = _mlp()
    q = qq.quantise_model(mlp, where=lambda m: m.layers[0])
    assert qq.is_quantised(q.layers[0].weight)
    assert not qq.is_quantised(q.layers[1].weight)
    with pytest.raises(ValueError, match="matched no layer"):
        qq.quantise_model(mlp, filter=eqx.nn.Conv2d)
    conv = eqx.nn.Conv1d(3, 8, 3, key=jr.PRNGKey(0))
    qconv = qq.quantise_model(conv, bits=4, group_size=2)
    assert qconv.weight.scale.shape == (8, 1, 1)


def test_control_flow_over_quantised_layers():
    mlp = _mlp()
    q = qq.quantise_model(mlp, matmul="weight_only")
    dense = jax.tree.map(
        lambda x: x.dequantise() if qq.is_quantised(x) else x,
        q,
        is_leaf=qq.is_quantised,
    )
    x = jr.normal(jr.PRNGKey(1), (32,))

    def run(model, x):
        def step(h, _):
            return h + 0.1 * jnp.tanh(model.layers[1](h)), None

        h = jax.nn.relu(model.layers[0](x))
        h, _ = jax.lax.scan(step, h, None, length=3)
        h = jax.lax.cond(h[0] > 0, lambda h: model.layers[1](h), lambda h: -h, h)
        h = jax.lax.while_loop(lambda h: jnp.sum(h**2) > 1.0, lambda h: h * 0.5, h)
        return model.layers[2](h)

    out = eqx.filter_jit(quax.quaxify(run))(q, x)
    np.testing.assert_allclose(out, run(dense, x), rtol=1e-5, atol=1e-5)


def test_quantisation_aware_training_reduces_loss():
    import optax

    mlp = _mlp()
    x = jr.normal(jr.PRNGKey(1), (64, 32))
    y = jnp.sin(x[:, :4])

    def loss(model):
        qmodel = qq.quantise_model(model, bits=4, group_size=16, straight_through=True)
        pred = quax.quaxify(lambda m, x: jax.vmap(m)(x))(qmodel, x)
        return jnp.mean((pred - y) ** 2)

    opt = optax.adam(1e-2)
    params, static = eqx.partition(mlp, eqx.is_inexact_array)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        value, grads = jax.value_and_grad(lambda p: loss(eqx.combine(p, static)))(
            params
        )
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    first = None
    for _ in range(30):
        params, state, value = step(params, state)
        first = value if first is None else first
    assert first is not None and value < 0.5 * first


def test_importable_through_quax_examples():
    import quax.examples

    for name in ("quantised", "quantized", "quant"):
        assert getattr(quax.examples, name) is qq
    (family,) = [f for f in quax.plugins.summarise() if f.name == "quant"]
    assert family.distribution == "quax-quant" and family.state == "loaded"
    assert any("QuantisedArray" in t for t in family.value_types)
    assert "dot_general" in family.primitives
