"""quax-quant composed with other families through the core, with no import between
them: QLoRA (a quax-lora `LoraArray` whose base weight is a `QuantisedArray`), and
symbolic zeros."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest
import quax
import quax.testing
import quax_lora
import quax_quant as qq
from quax.zero import Zero


IN, WIDTH, OUT = 48, 64, 8


def _qlora(bits=4, quantise_first=False):
    """QLoRA built either way: loraify then quantise the base weights `w`, or
    quantise the weights then loraify (a `LoraArray` over a `QuantisedArray`)."""
    mlp = eqx.nn.MLP(IN, OUT, WIDTH, depth=2, key=jr.PRNGKey(0))
    if quantise_first:
        quantised = qq.quantise_model(mlp, bits=bits, group_size=16)
        model = quax_lora.loraify(quantised, rank=4, key=jr.PRNGKey(1))
    else:
        lora = quax_lora.loraify(mlp, rank=4, key=jr.PRNGKey(1))
        model = qq.quantise_model(
            lora, bits=bits, group_size=16, filter=quax_lora.is_lora, attribute="w"
        )
    return _trained(model)


def _trained(model):
    """`model` with a trained adapter: nonzero `b`."""
    return jax.tree.map(
        lambda x: (
            eqx.tree_at(lambda y: y.b, x, 0.1 * jnp.ones_like(x.b))
            if quax_lora.is_lora(x)
            else x
        ),
        model,
        is_leaf=quax_lora.is_lora,
    )


def _dense_layers(model):
    """(dequantised w + a b, bias) per layer, in plain JAX."""
    return [
        (
            np.asarray(lr.weight.w.dequantise())
            + np.asarray(lr.weight.a @ lr.weight.b),
            lr.bias,
        )
        for lr in model.layers
    ]


def _dense_forward(layers, x):
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if i < len(layers) - 1:
            h = jax.nn.relu(h)
    return h


def test_qlora_forward_and_trainable_parameters():
    model = _qlora()
    assert all(qq.is_quantised(lr.weight.w) for lr in model.layers)
    x = jr.normal(jr.PRNGKey(2), (6, IN))
    out = eqx.filter_jit(quax.quaxify(lambda m, x: jax.vmap(m)(x)))(model, x)
    dense = _dense_forward(_dense_layers(model), x)
    np.testing.assert_allclose(out, dense, rtol=0.05, atol=0.05)
    # One row: the weight-only product, exact against the dequantised weights.
    one = eqx.filter_jit(quax.quaxify(lambda m, x: m(x)))(model, x[0])
    np.testing.assert_allclose(one, dense[0], rtol=1e-4, atol=1e-4)
    count = quax_lora.count_parameters(model)
    adapters = sum(lr.weight.a.size + lr.weight.b.size for lr in model.layers)
    assert count.trainable == adapters
    # The quantised base weights count by their shapes, not by their scales.
    weights = IN * WIDTH + WIDTH * WIDTH + WIDTH * OUT
    assert count.total == weights + (WIDTH + WIDTH + OUT) + adapters


def test_qlora_built_either_way_computes_the_same():
    loraified_first = _qlora()
    quantised_first = _qlora(quantise_first=True)
    for lr, other in zip(loraified_first.layers, quantised_first.layers, strict=True):
        assert qq.is_quantised(other.weight.w)
        np.testing.assert_array_equal(other.weight.a, lr.weight.a)
        np.testing.assert_array_equal(other.weight.w.values, lr.weight.w.values)
    x = jr.normal(jr.PRNGKey(2), (6, IN))
    forward = eqx.filter_jit(quax.quaxify(lambda m, x: jax.vmap(m)(x)))
    with quax.track_materialisation() as report:
        out = forward(quantised_first, x)
    assert not report, str(report)
    np.testing.assert_allclose(
        out, forward(loraified_first, x), **quax.testing.tolerance(jnp.float32)
    )
    np.testing.assert_allclose(
        out, _dense_forward(_dense_layers(quantised_first), x), rtol=0.05, atol=0.05
    )
    assert quax_lora.count_parameters(quantised_first) == quax_lora.count_parameters(
        loraified_first
    )
    # The quantised base refuses to be densified: merge says so.
    with pytest.raises(quax_lora.LoraMaterialisationError, match="cannot be densified"):
        quax_lora.merge(quantised_first)


def _training_step(model, x, y):
    """The jitted value and gradient of a mean squared error with respect to the
    adapters, and the model split into adapters and frozen rest. The frozen base is
    an argument: closed over, XLA would fold its conversion into float constants at
    compile time."""
    params, frozen = eqx.partition(model, quax_lora.trainable_filter(model))

    def loss(params, frozen):
        m = eqx.combine(params, frozen)
        pred = quax.quaxify(lambda m, x: jax.vmap(m)(x))(m, x)
        return jnp.mean((pred - y) ** 2)

    return eqx.filter_jit(jax.value_and_grad(loss)), params, frozen


def test_qlora_trains_only_the_adapter_and_never_dequantises():
    model = _qlora()
    x = jr.normal(jr.PRNGKey(2), (32, IN))
    y = jnp.sin(x[:, :OUT])
    grad_fn, params, frozen = _training_step(model, x, y)
    with quax.track_materialisation() as report:
        _, grads = grad_fn(params, frozen)
    assert not report, str(report)
    # Gradients reach `a` and `b` only; the quantised base has no float leaf to train.
    for lr, g in zip(model.layers, grads.layers, strict=True):
        assert g.weight.a.shape == lr.weight.a.shape
        assert float(jnp.max(jnp.abs(g.weight.b))) > 0
        assert g.weight.w.scale is None and g.weight.w.values is None
    # What the compiled step holds: see the test below.
    # And training lowers the loss.
    opt = optax.adam(1e-2)

    @eqx.filter_jit  # the whole step compiled once (op by op, adam's would not be)
    def train_step(params, state):
        value, grads = grad_fn(params, frozen)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    state = opt.init(params)
    first = None
    for _ in range(15):
        params, state, value = train_step(params, state)
        first = value if first is None else first
    assert first is not None and value < 0.8 * first


def test_symbolic_zeros_meet_quantised_arrays():
    w = qq.quantise(jr.normal(jr.PRNGKey(0), (8, 12)), axis=0)
    zero = Zero((5, 8), jnp.float32)
    out = quax.quaxify(lambda z, w: z @ w)(zero, w)
    assert isinstance(out, Zero) and out.shape == (5, 12)
    out = quax.quaxify(lambda w, z: w @ z)(w, Zero((12,), jnp.float32))
    assert isinstance(out, Zero) and out.shape == (8,)
    # A zero tangent of the activations through a quantised layer stays zero.
    x = jr.normal(jr.PRNGKey(1), (12,))
    primal, tangent = jax.jvp(
        lambda x: quax.quaxify(lambda w, x: w @ x)(w, x), (x,), (jnp.zeros(12),)
    )
    np.testing.assert_allclose(tangent, np.zeros(8))
    np.testing.assert_allclose(
        primal, np.asarray(w.dequantise()) @ np.asarray(x), rtol=1e-5, atol=1e-5
    )


def test_qlora_training_step_never_dequantises_a_whole_weight():
    """The compiled QLoRA training step (value and gradient with respect to `a`,
    `b`) with a weight larger than one block: the forward products run in integers
    (int8 x int8), and the gradient to the activations (`g . w`, the weight-only
    product transposed) dequantises one block of at most `BLOCK_ELEMENTS` elements
    at a time. (Groups along the contraction take the blocked weight-only product
    forward too: quax-quant's `test_hlo.py`.)"""
    n, k = 1024, 512
    assert n * k > qq.BLOCK_ELEMENTS
    mlp = eqx.nn.Sequential(
        [
            eqx.nn.Linear(64, n, key=jr.PRNGKey(0)),
            eqx.nn.Lambda(jnp.tanh),
            eqx.nn.Linear(n, k, key=jr.PRNGKey(3)),
        ]
    )
    x = jr.normal(jr.PRNGKey(2), (8, 64))
    y = jr.normal(jr.PRNGKey(4), (8, k))
    model = quax_lora.loraify(
        qq.quantise_model(mlp, bits=4, axis=0), rank=4, key=jr.PRNGKey(1)
    )
    step, params, frozen = _training_step(model, x, y)
    hlo = step.lower(params, frozen).lowered.compile().as_text()
    assert hlo is not None
    instructions = quax.testing.hlo_instructions(hlo)
    floats = [s for i in instructions for t, s in i.arrays if t == "f32"]
    assert (n, k) not in floats and (k, n) not in floats
    assert max(int(np.prod(s)) for s in floats) <= qq.BLOCK_ELEMENTS
    # An integer product (XLA's TPU compiler gives every `dot` as a `convolution`).
    products = {"dot", "convolution"}
    assert any(i.op in products and i.arrays[0][0] == "s32" for i in instructions)
    # Against the same step on the dequantised weights, in plain JAX.
    value, grads = step(params, frozen)
    layers = (model.layers[0], model.layers[2])
    ws = [(lr.weight.w.dequantise(), lr.bias) for lr in layers]

    def dense_loss(ab):
        (w1, b1), (w2, b2) = ws
        (a1, bb1), (a2, bb2) = ab
        h = jnp.tanh(x @ (w1 + a1 @ bb1).T + b1)
        return jnp.mean((h @ (w2 + a2 @ bb2).T + b2 - y) ** 2)

    ab = [(lr.weight.a, lr.weight.b) for lr in layers]
    ref_value, ref_grads = jax.value_and_grad(dense_loss)(ab)
    np.testing.assert_allclose(value, ref_value, rtol=0.02)
    for g, (ga, gb) in zip((grads.layers[0], grads.layers[2]), ref_grads, strict=True):
        assert float(jnp.max(jnp.abs(gb))) > 0
        np.testing.assert_allclose(g.weight.a, ga, rtol=0.05, atol=1e-5)
        np.testing.assert_allclose(g.weight.b, gb, rtol=0.05, atol=1e-5)


def test_qlora_on_nf4_with_double_quantisation():
    """QLoRA's own format: a `LoraArray` over an NF4 `QuantisedArray` whose scales
    are double-quantised, against plain JAX on the dequantised base plus `a b`; the
    step trains the adapters only, never dequantising."""
    mlp = eqx.nn.MLP(IN, OUT, WIDTH, depth=2, key=jr.PRNGKey(0))
    quantised = qq.quantise_model(mlp, format="nf4", block_size=16, double_quant=True)
    model = _trained(quax_lora.loraify(quantised, rank=4, key=jr.PRNGKey(1)))
    for lr in model.layers:
        assert lr.weight.w.format == "nf4"
        assert isinstance(lr.weight.w.scale, qq.QuantisedScale)
    x = jr.normal(jr.PRNGKey(2), (6, IN))
    forward = eqx.filter_jit(quax.quaxify(lambda m, x: jax.vmap(m)(x)))
    with quax.track_materialisation() as report:
        out = forward(model, x)
    assert not report, str(report)
    # The weight-only product (NF4 never takes an integer path): exact.
    np.testing.assert_allclose(
        out, _dense_forward(_dense_layers(model), x), rtol=1e-4, atol=1e-4
    )
    y = jnp.sin(x[:, :OUT])
    grad_fn, params, frozen = _training_step(model, x, y)
    with quax.track_materialisation() as report:
        first, grads = grad_fn(params, frozen)
    assert not report, str(report)
    for g in grads.layers:
        assert jax.tree.leaves(g.weight.w) == []  # nothing trains in the base
        assert float(jnp.max(jnp.abs(g.weight.b))) > 0
    # The gradient with respect to `b` against plain JAX on the dequantised base.
    layers = [(lr.weight.w.dequantise(), lr.bias) for lr in model.layers]

    def dense_loss(bs):
        h = x
        for i, ((w, bias), lr, b) in enumerate(
            zip(layers, model.layers, bs, strict=True)
        ):
            h = h @ (w + lr.weight.a @ b).T + bias
            if i < len(layers) - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - y) ** 2)

    bs = [lr.weight.b for lr in model.layers]
    value, dense_grads = jax.value_and_grad(dense_loss)(bs)
    np.testing.assert_allclose(first, value, rtol=1e-4)
    for g, dg in zip(grads.layers, dense_grads, strict=True):
        np.testing.assert_allclose(g.weight.b, dg, rtol=1e-3, atol=1e-5)
