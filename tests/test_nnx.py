"""Flax NNX models in quax-lora and quax-quant (issue 31 item 8): `loraify`,
`quantise_model`, `merge`/`unmerge`, `save_adapter`/`load_adapter` on an
`nnx.Module`, against the plain NNX model and dense JAX references."""

import json
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest
import quax
import quax_lora
import quax_named
import quax_quant
import safetensors.numpy as safetensors_numpy
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(12, 8, rngs=rngs)
        self.layers = nnx.List(
            [nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 4, rngs=rngs)]
        )

    def __call__(self, tokens):
        x = self.embed(tokens)
        x = jax.nn.relu(self.layers[0](x))
        return self.layers[1](x)


class Block(nnx.Module):
    """A small transformer block: attention and an MLP, each with a residual."""

    def __init__(self, rngs, d=16):
        self.attn = nnx.MultiHeadAttention(
            num_heads=2, in_features=d, decode=False, rngs=rngs
        )
        self.up = nnx.Linear(d, 32, rngs=rngs)
        self.down = nnx.Linear(32, d, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(x)
        return x + self.down(jax.nn.gelu(self.up(x)))


TOKENS = jnp.array([[1, 5, 7, 11], [0, 2, 3, 9]])


def _value(variable):
    return variable.get_value()


def _with_b(model, key):
    """A copy of `model` with every LoRA factor `b` random (a fresh one's is
    zero), through NNX's state of its `nnx.LoRAParam`s."""
    model = nnx.clone(model)
    state = nnx.state(model, nnx.LoRAParam)
    for i, (path, variable) in enumerate(nnx.to_flat_state(state)):
        if path[-1] == "b":
            value = variable.get_value()
            variable.set_value(jr.normal(jr.fold_in(key, i), value.shape, value.dtype))
    nnx.update(model, state)
    return model


def _dense_mlp(model, tokens):
    """The MLP in plain JAX from the LoraArrays' leaves: w + s a @ b, formed here."""

    def weight(variable):
        x = variable.get_value()
        if isinstance(x, quax_lora.LoraArray):
            assert isinstance(x.w, jax.Array)  # not a value (a quantised weight)
            return x.w + x.scaling * (x.a @ x.b)
        return x

    x = weight(model.embed.embedding)[tokens]
    for i, layer in enumerate(model.layers):
        x = x @ weight(layer.kernel) + layer.bias.get_value()
        if i == 0:
            x = jax.nn.relu(x)
    return x


def test_loraify_nnx_forward_equals_plain_at_init():
    model = MLP(nnx.Rngs(0))
    lora = quax_lora.loraify(
        model, rank=2, alpha=4.0, filter=(nnx.Linear, nnx.Embed), key=jr.key(1)
    )
    kernel = _value(lora.layers[0].kernel)
    assert isinstance(kernel, quax_lora.LoraArray)
    # NNX kernels are (in, out): a is (in, rank), b (rank, out), b = 0.
    assert kernel.a.shape == (8, 2) and kernel.b.shape == (2, 16)
    assert isinstance(_value(lora.embed.embedding), quax_lora.LoraArray)
    # The model passed in is unchanged and shares no variable with the new one.
    assert not isinstance(_value(model.layers[0].kernel), quax_lora.LoraArray)
    assert lora.layers[0].bias is not model.layers[0].bias
    expected = model(TOKENS)
    np.testing.assert_array_equal(quax.quaxify(lora)(TOKENS), expected)
    np.testing.assert_array_equal(jax.jit(quax.quaxify(lora))(TOKENS), expected)

    @nnx.jit
    def forward(m, tokens):
        return quax.quaxify(m)(tokens)

    np.testing.assert_array_equal(forward(lora, TOKENS), expected)


def test_loraify_nnx_forward_against_dense_reference():
    model = MLP(nnx.Rngs(0))
    lora = quax_lora.loraify(
        model, rank=3, alpha=6.0, filter=(nnx.Linear, nnx.Embed), key=jr.key(1)
    )
    lora = _with_b(lora, jr.key(2))
    expected = _dense_mlp(lora, TOKENS)
    assert not np.allclose(expected, model(TOKENS), atol=1e-3)
    np.testing.assert_allclose(
        quax.quaxify(lora)(TOKENS), expected, rtol=1e-5, atol=1e-5
    )
    # merge gives a plain NNX model, called without quaxify.
    merged = quax_lora.merge(lora)
    assert not isinstance(_value(merged.layers[0].kernel), quax_lora.LoraArray)
    np.testing.assert_allclose(merged(TOKENS), expected, rtol=1e-5, atol=1e-5)
    # unmerge takes the base weights back out.
    base = quax_lora.unmerge(merged, lora)
    for got, want in zip(
        (base.layers[0].kernel, base.embed.embedding),
        (model.layers[0].kernel, model.embed.embedding),
        strict=True,
    ):
        assert isinstance(_value(got), quax_lora.LoraArray)
        np.testing.assert_allclose(_value(got).w, _value(want), atol=1e-5)


def test_loraify_nnx_where_selects_by_module():
    model = MLP(nnx.Rngs(0))
    lora = quax_lora.loraify(model, rank=2, where=lambda m: m.layers[1], key=jr.key(1))
    assert isinstance(_value(lora.layers[1].kernel), quax_lora.LoraArray)
    assert not isinstance(_value(lora.layers[0].kernel), quax_lora.LoraArray)
    assert not isinstance(_value(lora.embed.embedding), quax_lora.LoraArray)


def _train(model, steps):
    """Train the adapters of an NNX model with NNX's own idioms: an
    `nnx.Optimizer` over the `nnx.LoRAParam`s (the factors `a` and `b`), their
    gradients by `nnx.value_and_grad`, the step under `nnx.jit`. The losses and
    the trained model (a copy)."""
    model = nnx.clone(model)
    optimiser = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.LoRAParam)
    target = jnp.sin(jnp.arange(TOKENS.size * 4.0)).reshape(*TOKENS.shape, 4)

    @nnx.jit
    def step(model, optimiser):
        def loss(model):
            return jnp.mean((quax.quaxify(model)(TOKENS) - target) ** 2)

        diff = nnx.DiffState(0, nnx.LoRAParam)
        value, grads = nnx.value_and_grad(loss, argnums=diff)(model)
        optimiser.update(model, grads)
        return value

    losses = [float(step(model, optimiser)) for _ in range(steps)]
    return losses, model


def test_nnx_training_step_trains_only_the_factors():
    model = MLP(nnx.Rngs(0))
    lora = quax_lora.loraify(model, rank=2, alpha=4.0, key=jr.key(1))
    counts = quax_lora.count_parameters(lora)
    assert counts.trainable == (8 + 16) * 2 + (16 + 4) * 2
    losses, tuned = _train(lora, 30)
    assert losses[-1] < 0.8 * losses[0]
    # Only a and b moved: the base kernels, biases and embedding are the model's.
    for layer, before in zip(tuned.layers, model.layers, strict=True):
        kernel = _value(layer.kernel)
        np.testing.assert_array_equal(kernel.w, _value(before.kernel))
        np.testing.assert_array_equal(_value(layer.bias), _value(before.bias))
        assert np.any(kernel.b != 0)
    np.testing.assert_array_equal(
        _value(tuned.embed.embedding), _value(model.embed.embedding)
    )
    # After training, the quaxified model is the merged (plain NNX) one.
    np.testing.assert_allclose(
        quax.quaxify(tuned)(TOKENS),
        quax_lora.merge(tuned)(TOKENS),
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        quax.quaxify(tuned)(TOKENS), _dense_mlp(tuned, TOKENS), rtol=1e-5, atol=1e-5
    )


def test_nnx_lora_factors_are_lora_params():
    """The factors are `nnx.LoRAParam`s and the base weight an `nnx.Param`, so
    NNX's filters tell them apart; `nnx.split`/`nnx.merge` keep the model."""
    model = MLP(nnx.Rngs(0))
    lora = _with_b(
        quax_lora.loraify(
            model, rank=2, alpha=4.0, filter=(nnx.Linear, nnx.Embed), key=jr.key(1)
        ),
        jr.key(2),
    )
    factors = nnx.to_flat_state(nnx.state(lora, nnx.LoRAParam))
    assert sorted(path for path, _ in factors) == sorted(
        (*layer, name)
        for layer in (
            ("embed", "embedding"),
            ("layers", 0, "kernel"),
            ("layers", 1, "kernel"),
        )
        for name in ("a", "b")
    )
    base = nnx.to_flat_state(
        nnx.state(lora, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    )
    assert ("layers", 0, "kernel", "w") in dict(base)
    graphdef, params, rest = nnx.split(lora, nnx.LoRAParam, ...)
    again = nnx.merge(graphdef, params, rest)
    np.testing.assert_array_equal(
        quax.quaxify(again)(TOKENS), quax.quaxify(lora)(TOKENS)
    )


def test_nnx_grad_wrt_lora_params_against_plain_jax():
    """`nnx.grad` with a `DiffState` selecting `nnx.LoRAParam` gives the
    gradient of the factors alone, equal to plain JAX's on `w + s a b` formed
    by hand."""
    model = MLP(nnx.Rngs(0))
    lora = _with_b(
        quax_lora.loraify(
            model, rank=2, alpha=4.0, filter=(nnx.Linear, nnx.Embed), key=jr.key(1)
        ),
        jr.key(2),
    )

    def loss(m):
        return jnp.sum(jnp.sin(quax.quaxify(m)(TOKENS)))

    grads = nnx.jit(nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam)))(lora)
    flat = dict(nnx.to_flat_state(grads))
    assert {path[-1] for path in flat} == {"a", "b"}

    # The reference: the MLP in plain JAX, differentiated w.r.t. the factors.
    names = ("embed", "layers.0", "layers.1")
    loras = [_value(lora.embed.embedding), *(_value(x.kernel) for x in lora.layers)]

    def reference(factors):
        weights = [
            x.w + x.scaling * (a @ b) for x, (a, b) in zip(loras, factors, strict=True)
        ]
        h = weights[0][TOKENS]
        h = jax.nn.relu(h @ weights[1] + _value(lora.layers[0].bias))
        return jnp.sum(jnp.sin(h @ weights[2] + _value(lora.layers[1].bias)))

    want = jax.grad(reference)([(x.a, x.b) for x in loras])
    for name, path, (da, db) in zip(
        names,
        (("embed", "embedding"), ("layers", 0, "kernel"), ("layers", 1, "kernel")),
        want,
        strict=True,
    ):
        np.testing.assert_allclose(
            flat[(*path, "a")].get_value(), da, rtol=1e-4, atol=1e-5, err_msg=name
        )
        np.testing.assert_allclose(
            flat[(*path, "b")].get_value(), db, rtol=1e-4, atol=1e-5, err_msg=name
        )


def test_nnx_optimizer_holds_state_for_the_factors_only():
    """`nnx.Optimizer(model, optax.adam(...), wrt=nnx.LoRAParam)` keeps Adam's
    moments for `a` and `b` alone: none the size of a base weight."""
    model = MLP(nnx.Rngs(0))
    lora = quax_lora.loraify(model, rank=2, alpha=4.0, key=jr.key(1))
    optimiser = nnx.Optimizer(lora, optax.adam(1e-2), wrt=nnx.LoRAParam)
    sizes = [
        np.size(x)
        for x in jax.tree_util.tree_leaves(nnx.state(optimiser.opt_state))
        if np.ndim(x) > 0
    ]
    trainable = quax_lora.count_parameters(lora).trainable
    assert sum(sizes) == 2 * trainable, sizes


def test_nnx_save_adapter_peft_layout(tmp_path):
    model = MLP(nnx.Rngs(0))
    lora = quax_lora.loraify(
        model, rank=2, alpha=4.0, filter=(nnx.Linear, nnx.Embed), key=jr.key(1)
    )
    lora = _with_b(lora, jr.key(2))
    quax_lora.save_adapter(tmp_path, lora, format="peft")
    tensors = safetensors_numpy.load_file(str(tmp_path / "adapter_model.safetensors"))
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is True
    assert config["target_modules"] == ["embed", "layers.0", "layers.1"]
    prefix = "base_model.model."
    assert {k: v.shape for k, v in tensors.items()} == {
        f"{prefix}embed.lora_embedding_A": (2, 12),
        f"{prefix}embed.lora_embedding_B": (8, 2),
        f"{prefix}layers.0.lora_A.weight": (2, 8),
        f"{prefix}layers.0.lora_B.weight": (16, 2),
        f"{prefix}layers.1.lora_A.weight": (2, 16),
        f"{prefix}layers.1.lora_B.weight": (4, 2),
    }
    # peft's update B @ A is torch's (out, in): the transpose of our a @ b.
    kernel = _value(lora.layers[0].kernel)
    np.testing.assert_allclose(
        tensors[f"{prefix}layers.0.lora_B.weight"]
        @ tensors[f"{prefix}layers.0.lora_A.weight"],
        np.asarray(kernel.a @ kernel.b).T,
        rtol=1e-6,
    )
    # Read back into a freshly loraified model: the same outputs.
    fresh = quax_lora.loraify(
        model, rank=2, alpha=4.0, filter=(nnx.Linear, nnx.Embed), key=jr.key(3)
    )
    loaded = quax_lora.load_adapter(tmp_path, fresh)
    np.testing.assert_allclose(
        quax.quaxify(loaded)(TOKENS), quax.quaxify(lora)(TOKENS), rtol=1e-6
    )


def test_nnx_save_adapter_quax_format(tmp_path):
    model = MLP(nnx.Rngs(0))
    lora = _with_b(quax_lora.loraify(model, rank=2, key=jr.key(1)), jr.key(2))
    quax_lora.save_adapter(tmp_path / "adapter", lora)
    fresh = quax_lora.loraify(model, rank=2, key=jr.key(3))
    loaded = quax_lora.load_adapter(tmp_path / "adapter", fresh)
    np.testing.assert_array_equal(
        quax.quaxify(loaded)(TOKENS), quax.quaxify(lora)(TOKENS)
    )
    wider = quax_lora.loraify(model, rank=3, key=jr.key(3))
    with pytest.raises(ValueError, match="rank"):
        quax_lora.load_adapter(tmp_path / "adapter", wider)


def test_nnx_attention_query_value():
    block = Block(nnx.Rngs(0))
    x = jr.normal(jr.key(5), (2, 5, 16))
    lora = quax_lora.loraify(
        block,
        rank=2,
        filter=nnx.LinearGeneral,
        where=lambda m: (m.attn.query, m.attn.value),
        key=jr.key(1),
    )
    np.testing.assert_allclose(quax.quaxify(lora)(x), block(x), rtol=1e-6)
    lora = _with_b(lora, jr.key(2))
    # The reference: the plain block with kernel + s a @ b, reshaped by hand.
    dense = nnx.clone(block)
    for name in ("query", "value"):
        value = _value(getattr(lora.attn, name).kernel)
        kernel = getattr(dense.attn, name).kernel
        delta = (value.a @ value.b.reshape(value.rank, -1)).reshape(value.shape)
        kernel.set_value(kernel.get_value() + value.scaling * delta)
    np.testing.assert_allclose(quax.quaxify(lora)(x), dense(x), rtol=1e-5, atol=1e-5)


def test_nnx_loraify_refusals():
    block = Block(nnx.Rngs(0))
    grouped = nnx.Conv(
        4, 6, kernel_size=(3, 3), feature_group_count=2, rngs=nnx.Rngs(0)
    )
    with pytest.raises(ValueError, match=r"Conv.*grouped \(feature_group_count=2\)"):
        quax_lora.loraify(grouped, rank=2, filter=nnx.Conv, key=jr.key(1))
    with pytest.raises(ValueError, match=r"variant='dora'.*NNX kernel"):
        quax_lora.loraify(MLP(nnx.Rngs(0)), rank=2, variant="dora", key=jr.key(1))
    with pytest.raises(ValueError, match="not a module of the NNX model"):
        quax_lora.loraify(
            block, rank=2, where=lambda m: m.up.kernel.get_value(), key=jr.key(1)
        )
    with pytest.raises(ValueError, match="adapted nothing"):
        quax_lora.loraify(block, rank=2, filter=nnx.Embed, key=jr.key(1))
    # A dropout key has no NNX variable to live in: refused, not dropped silently.
    lora = quax_lora.loraify(MLP(nnx.Rngs(0)), rank=2, dropout=0.1, key=jr.key(1))
    with pytest.raises(ValueError, match=r"dropout_key.*Equinox"):
        quax_lora.with_dropout_key(lora, jr.key(2))


def _hwio_delta(lora):
    """`s a b` of an NNX convolution's LoraArray, by hand: `a` (*window, in,
    rank), `b` (rank, out)."""
    return lora.scaling * jnp.einsum("hwir,ro->hwio", lora.a, lora.b)


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (nnx.Conv, {}),
        (nnx.Conv, {"strides": 2, "padding": "VALID", "kernel_dilation": 2}),
        (nnx.ConvTranspose, {"strides": 2}),
    ],
)
def test_nnx_conv_lora_against_plain_nnx(cls, kwargs):
    """LoRA on `nnx.Conv`'s kernel (*window, in, out) as peft factors a
    convolution, (window * in) x out, as quax-lora does `eqx.nn.Conv`'s (out, in,
    *window) as out x (in * window): `a` a kernel with `rank` outputs, `b` 1x1."""
    conv = cls(3, 5, kernel_size=(3, 3), rngs=nnx.Rngs(0), **kwargs)
    x = jr.normal(jr.key(5), (2, 9, 9, 3))
    lora = quax_lora.loraify(conv, rank=2, alpha=4.0, filter=cls, key=jr.key(1))
    kernel = _value(lora.kernel)
    assert (kernel.a.shape, kernel.b.shape, kernel.row_ndim) == (
        (3, 3, 3, 2),
        (2, 5),
        3,
    )
    np.testing.assert_allclose(quax.quaxify(lora)(x), conv(x), rtol=1e-6)
    lora = _with_b(lora, jr.key(2))
    kernel = _value(lora.kernel)
    dense = nnx.clone(conv)
    dense.kernel.set_value(_value(conv.kernel) + _hwio_delta(kernel))
    expected = dense(x)
    assert not np.allclose(expected, conv(x), atol=1e-3)
    np.testing.assert_allclose(
        jax.jit(quax.quaxify(lora))(x), expected, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(quax_lora.merge(lora)(x), expected, rtol=1e-5, atol=1e-5)
    # The dense kernel is never formed: no product or sum of its shape.
    jaxpr = jax.make_jaxpr(quax.quaxify(lora))(x)
    shapes = [
        tuple(v.aval.shape)
        for eqn in jaxpr.jaxpr.eqns
        if eqn.primitive.name in ("dot_general", "add")
        for v in eqn.outvars
    ]
    assert (3, 3, 3, 5) not in shapes, shapes


def test_nnx_embed_is_a_gather():
    """LoRA on `nnx.Embed`: `w[i] + s a[i] b`, the rows of `a` gathered; the
    (vocab, d) update is never formed."""
    embed = nnx.Embed(1000, 8, rngs=nnx.Rngs(0))
    lora = _with_b(
        quax_lora.loraify(embed, rank=2, alpha=4.0, filter=nnx.Embed, key=jr.key(1)),
        jr.key(2),
    )
    table = _value(lora.embedding)
    expected = table.w[TOKENS] + table.scaling * (table.a[TOKENS] @ table.b)
    np.testing.assert_allclose(
        jax.jit(quax.quaxify(lora))(TOKENS), expected, rtol=1e-6, atol=1e-6
    )
    jaxpr = jax.make_jaxpr(quax.quaxify(lora))(TOKENS)
    shapes = [tuple(v.aval.shape) for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars]
    assert (1000, 8) not in shapes, shapes


def test_nnx_attention_every_projection():
    """LoRA on the four `nnx.LinearGeneral`s of `nnx.MultiHeadAttention`: the
    query, key and value (in, heads, head_dim) and the output projection
    (heads, head_dim, out), whose rows are two axes."""
    block = Block(nnx.Rngs(0))
    x = jr.normal(jr.key(5), (2, 5, 16))
    lora = quax_lora.loraify(
        block, rank=2, alpha=4.0, filter=nnx.LinearGeneral, key=jr.key(1)
    )
    out = _value(lora.attn.out.kernel)
    assert (out.a.shape, out.b.shape, out.row_ndim) == ((2, 8, 2), (2, 16), 2)
    np.testing.assert_allclose(quax.quaxify(lora)(x), block(x), rtol=1e-6)
    lora = _with_b(lora, jr.key(2))
    dense = nnx.clone(block)
    for name in ("query", "key", "value", "out"):
        value = _value(getattr(lora.attn, name).kernel)
        kernel = getattr(dense.attn, name).kernel
        delta = jnp.tensordot(value.a, value.b, axes=1)
        kernel.set_value(kernel.get_value() + value.scaling * delta)
    np.testing.assert_allclose(
        jax.jit(quax.quaxify(lora))(x), dense(x), rtol=1e-5, atol=1e-5
    )


def test_nnx_conv_and_attention_peft_layout(tmp_path):
    """peft's tensors of an NNX convolution (torch's Conv2d: lora_A (rank, in,
    kh, kw), lora_B (out, rank, 1, 1)) and of attention projections (torch's
    Linear, heads and head_dim flattened), whose products are the update by
    hand; read back, the same outputs."""

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(3, 16, kernel_size=(3, 3), rngs=rngs)
            self.attn = nnx.MultiHeadAttention(
                num_heads=2, in_features=16, decode=False, rngs=rngs
            )

        def __call__(self, x):
            y = self.conv(x).reshape(x.shape[0], -1, 16)
            return self.attn(y)

    net = Net(nnx.Rngs(0))
    x = jr.normal(jr.key(5), (2, 4, 4, 3))
    select = (nnx.Conv, nnx.LinearGeneral)
    lora = _with_b(
        quax_lora.loraify(net, rank=2, alpha=4.0, filter=select, key=jr.key(1)),
        jr.key(2),
    )
    quax_lora.save_adapter(tmp_path, lora, format="peft")
    tensors = safetensors_numpy.load_file(str(tmp_path / "adapter_model.safetensors"))
    prefix = "base_model.model."
    conv_a = tensors[f"{prefix}conv.lora_A.weight"]
    conv_b = tensors[f"{prefix}conv.lora_B.weight"]
    assert conv_a.shape == (2, 3, 3, 3) and conv_b.shape == (16, 2, 1, 1)
    kernel = _value(lora.conv.kernel)
    # torch's (out, in, kh, kw) update B @ A, against ours (kh, kw, in, out).
    torch_delta = np.einsum("or,rihw->oihw", conv_b[:, :, 0, 0], conv_a)
    np.testing.assert_allclose(
        torch_delta,
        np.transpose(
            np.asarray(jnp.einsum("hwir,ro->hwio", kernel.a, kernel.b)), (3, 2, 0, 1)
        ),
        rtol=1e-5,
        atol=1e-6,
    )
    for name, n, m in (("query", 16, 16), ("out", 16, 16)):
        a = tensors[f"{prefix}attn.{name}.lora_A.weight"]
        b = tensors[f"{prefix}attn.{name}.lora_B.weight"]
        assert a.shape == (2, n) and b.shape == (m, 2)
        value = _value(getattr(lora.attn, name).kernel)
        ours = np.asarray(jnp.tensordot(value.a, value.b, axes=1)).reshape(n, m)
        np.testing.assert_allclose((b @ a).T, ours, rtol=1e-5, atol=1e-6)
    fresh = quax_lora.loraify(net, rank=2, alpha=4.0, filter=select, key=jr.key(3))
    loaded = quax_lora.load_adapter(tmp_path, fresh)
    np.testing.assert_allclose(
        quax.quaxify(loaded)(x), quax.quaxify(lora)(x), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize(
    ("kwargs", "tolerance"),
    [
        ({"bits": 8}, 0.02),
        ({"bits": 4, "group_size": 8}, 0.15),
        ({"format": "nf4", "block_size": 8, "double_quant": True}, 0.15),
    ],
)
def test_nnx_quantise_model(kwargs, tolerance):
    block = Block(nnx.Rngs(0))
    x = jr.normal(jr.key(5), (2, 5, 16))
    quantised = quax_quant.quantise_model(block, matmul="weight_only", **kwargs)
    for name, shape in (("up", (16, 32)), ("down", (32, 16))):
        q = _value(getattr(quantised, name).kernel)
        assert isinstance(q, quax_quant.QuantisedArray)
        assert q.shape == shape
    # nnx.LinearGeneral (the attention) is not in the default filter.
    query = _value(quantised.attn.query.kernel)
    assert not isinstance(query, quax_quant.QuantisedArray)
    y = quax.quaxify(quantised)(x)
    # Exact against the block whose kernels are the dequantised ones.
    dense = nnx.clone(block)
    for name in ("up", "down"):
        getattr(dense, name).kernel.set_value(
            _value(getattr(quantised, name).kernel).dequantise()
        )
    np.testing.assert_allclose(y, dense(x), rtol=1e-5, atol=1e-5)
    # And close to the float block.
    error = jnp.max(jnp.abs(y - block(x))) / jnp.max(jnp.abs(block(x)))
    assert error < tolerance


def test_nnx_quantise_model_groups_along_inputs():
    """An NNX kernel (in, out) is grouped along its inputs (axis 0): each scale
    covers `group_size` consecutive inputs of one output, by a NumPy reference."""
    layer = nnx.Linear(16, 3, rngs=nnx.Rngs(0))
    quantised = quax_quant.quantise_model(layer, bits=4, group_size=8)
    q = _value(quantised.kernel)
    kernel = np.asarray(_value(layer.kernel))
    groups = kernel.reshape(2, 8, 3)
    scales = np.abs(groups).max(axis=1, keepdims=True) / 7
    expected = (np.clip(np.round(groups / scales), -7, 7) * scales).reshape(16, 3)
    np.testing.assert_allclose(q.dequantise(), expected, rtol=1e-6, atol=1e-7)


def test_nnx_quantise_model_conv():
    conv = nnx.Conv(3, 4, kernel_size=(3, 3), rngs=nnx.Rngs(0))
    x = jr.normal(jr.key(5), (2, 6, 6, 3))
    quantised = quax_quant.quantise_model(conv, bits=8)
    q = _value(quantised.kernel)
    assert isinstance(q, quax_quant.QuantisedArray)
    dense = nnx.clone(conv)
    dense.kernel.set_value(q.dequantise())
    np.testing.assert_allclose(
        quax.quaxify(quantised)(x), dense(x), rtol=1e-5, atol=1e-5
    )


def test_nnx_quantise_model_refusals():
    block = Block(nnx.Rngs(0))
    with pytest.raises(ValueError, match="not a module of the NNX model"):
        quax_quant.quantise_model(block, where=lambda m: m.up.kernel.get_value())
    with pytest.raises(ValueError, match="matched no layer"):
        quax_quant.quantise_model(block, filter=nnx.Embed)


@pytest.mark.parametrize("fmt", ["int4", "nf4"])
def test_nnx_qlora_trains_and_matches_merged(fmt):
    """QLoRA on an NNX model: a 4-bit base, LoRA on top, trained under jit; the
    quantised base is never densified, and the tuned model equals the dense
    reference dequantised(w) + s a @ b."""
    model = MLP(nnx.Rngs(0))
    kwargs: dict[str, Any] = (
        {"bits": 4, "group_size": 8}
        if fmt == "int4"
        else {"format": "nf4", "block_size": 8, "double_quant": True}
    )
    quantised = quax_quant.quantise_model(model, matmul="weight_only", **kwargs)
    lora = quax_lora.loraify(quantised, rank=2, alpha=4.0, key=jr.key(1))
    kernel = _value(lora.layers[0].kernel)
    assert isinstance(kernel.w, quax_quant.QuantisedArray)
    # Fresh: the quantised model's outputs.
    np.testing.assert_array_equal(
        quax.quaxify(lora)(TOKENS), quax.quaxify(quantised)(TOKENS)
    )
    losses, tuned = _train(lora, 30)
    assert losses[-1] < 0.8 * losses[0]
    for layer, before in zip(tuned.layers, quantised.layers, strict=True):
        assert _value(layer.kernel).w is not None
        np.testing.assert_array_equal(
            _value(layer.kernel).w.dequantise(), _value(before.kernel).dequantise()
        )

    x = _value(tuned.embed.embedding)[TOKENS]
    for i, layer in enumerate(tuned.layers):
        k = _value(layer.kernel)
        x = x @ (k.w.dequantise() + k.scaling * (k.a @ k.b)) + _value(layer.bias)
        if i == 0:
            x = jax.nn.relu(x)
    np.testing.assert_allclose(quax.quaxify(tuned)(TOKENS), x, rtol=1e-5, atol=1e-5)


# A QLoRA fine-tune of a small NNX transformer against the same one in Equinox.

VOCAB, WIDTH, HEADS, HIDDEN = 16, 16, 2, 32


class NNXTransformer(nnx.Module):
    """An embedding, two blocks (attention and an MLP, each with a residual)
    and a head."""

    def __init__(self, rngs):
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.blocks = nnx.List([Block(rngs, WIDTH), Block(rngs, WIDTH)])
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class EqxBlock(eqx.Module):
    attn: eqx.nn.MultiheadAttention
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __call__(self, x):
        x = x + self.attn(x, x, x)
        return x + jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(x)))


class EqxTransformer(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: list
    head: eqx.nn.Linear

    def __call__(self, tokens):
        def sequence(tokens):
            x = jax.vmap(self.embed)(tokens)
            for block in self.blocks:
                x = block(x)
            return jax.vmap(self.head)(x)

        return jax.vmap(sequence)(tokens)


def _eqx_linear(kernel, bias):
    """The `eqx.nn.Linear` of an NNX kernel `(in, out)`: its weight `(out, in)`."""
    layer = eqx.nn.Linear(kernel.shape[0], kernel.shape[1], key=jr.key(0))
    return eqx.tree_at(lambda x: (x.weight, x.bias), layer, (kernel.T, bias))


def _to_equinox(model):
    """The Equinox transformer with the weights of the NNX one."""
    blocks = []
    for block in model.blocks:
        attn = eqx.nn.MultiheadAttention(
            HEADS,
            WIDTH,
            use_query_bias=True,
            use_key_bias=True,
            use_value_bias=True,
            use_output_bias=True,
            key=jr.key(0),
        )
        weights = []
        for name in ("query", "key", "value"):
            layer = getattr(block.attn, name)
            weights += [
                _value(layer.kernel).reshape(WIDTH, -1).T,
                _value(layer.bias).reshape(-1),
            ]
        weights += [
            _value(block.attn.out.kernel).reshape(-1, WIDTH).T,
            _value(block.attn.out.bias),
        ]
        attn = eqx.tree_at(
            lambda a: (
                a.query_proj.weight,
                a.query_proj.bias,
                a.key_proj.weight,
                a.key_proj.bias,
                a.value_proj.weight,
                a.value_proj.bias,
                a.output_proj.weight,
                a.output_proj.bias,
            ),
            attn,
            tuple(weights),
        )
        up = _eqx_linear(_value(block.up.kernel), _value(block.up.bias))
        down = _eqx_linear(_value(block.down.kernel), _value(block.down.bias))
        blocks.append(EqxBlock(attn, up, down))
    return EqxTransformer(
        eqx.nn.Embedding(weight=_value(model.embed.embedding)),
        blocks,
        _eqx_linear(_value(model.head.kernel), _value(model.head.bias)),
    )


def _mlps_and_head(model):
    return [b.up for b in model.blocks] + [b.down for b in model.blocks] + [model.head]


def test_nnx_qlora_transformer_matches_equinox():
    """An int4 base with LoRA on the MLPs and the head, trained 20 steps under
    `nnx.jit` (`nnx.Optimizer` over `nnx.LoRAParam`) and, from the same weights,
    adapters and data, in Equinox (`eqx.partition` with `trainable_filter`,
    under `jax.jit`): the loss curves agree to float32 rounding."""
    kwargs = {"bits": 4, "group_size": 8, "matmul": "weight_only"}

    @eqx.filter_jit
    def build():
        # Traced once rather than run op by op: a few seconds less.
        model = NNXTransformer(nnx.Rngs(0))
        reference = _to_equinox(model)
        quantised = quax_quant.quantise_model(model, **kwargs)
        lora = quax_lora.loraify(quantised, rank=2, alpha=4.0, key=jr.key(1))
        eqx_lora = quax_lora.loraify(
            quax_quant.quantise_model(reference, where=_mlps_and_head, **kwargs),
            rank=2,
            alpha=4.0,
            where=_mlps_and_head,
            key=jr.key(1),
        )
        return model, reference, lora, eqx_lora

    model, reference, lora, eqx_lora = build()
    tokens = jr.randint(jr.key(7), (2, 6), 0, VOCAB)
    targets = jr.randint(jr.key(8), (2, 6), 0, VOCAB)
    np.testing.assert_allclose(
        eqx.filter_jit(lambda m, t: m(t))(reference, tokens),
        nnx.jit(lambda m, t: m(t))(model, tokens),
        rtol=1e-5,
        atol=1e-5,
    )
    # The same adapters: an Equinox weight is the NNX kernel transposed, so its
    # a is the NNX b transposed, and its b the NNX a.
    nnx_loras = [_value(layer.kernel) for layer in _mlps_and_head(lora)]
    eqx_loras = [layer.weight for layer in _mlps_and_head(eqx_lora)]
    for got, want in zip(
        *jax.jit(
            lambda xs, ys: (
                [x.w.dequantise() for x in xs],
                [y.w.dequantise().T for y in ys],
            )
        )(eqx_loras, nnx_loras),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)
    eqx_lora = eqx.tree_at(
        lambda m: (
            [x.weight.a for x in _mlps_and_head(m)]
            + [x.weight.b for x in _mlps_and_head(m)]
        ),
        eqx_lora,
        [x.b.T for x in nnx_loras] + [x.a.T for x in nnx_loras],
    )
    base = [jax.tree_util.tree_leaves(x.w) for x in nnx_loras]

    def cross_entropy(logits):
        return jnp.mean(
            optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        )

    optimiser = nnx.jit(
        lambda m: nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.LoRAParam)
    )(lora)

    @nnx.jit
    def nnx_step(model, optimiser):
        def loss(model):
            return cross_entropy(quax.quaxify(model)(tokens))

        diff = nnx.DiffState(0, nnx.LoRAParam)
        value, grads = nnx.value_and_grad(loss, argnums=diff)(model)
        optimiser.update(model, grads)
        return value

    params, frozen = eqx.partition(eqx_lora, quax_lora.trainable_filter(eqx_lora))
    adam = optax.adam(1e-2)

    @jax.jit
    def eqx_step(params, opt_state):
        def loss(params):
            return cross_entropy(quax.quaxify(eqx.combine(params, frozen))(tokens))

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = adam.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, value

    opt_state = jax.jit(adam.init)(params)
    nnx_losses, eqx_losses = [], []
    for _ in range(20):
        nnx_losses.append(float(nnx_step(lora, optimiser)))
        params, opt_state, value = eqx_step(params, opt_state)
        eqx_losses.append(float(value))
    assert nnx_losses[-1] < 0.8 * nnx_losses[0]
    np.testing.assert_allclose(nnx_losses, eqx_losses, rtol=2e-5)
    # The quantised base is the one quantise_model made: never updated.
    for layer, leaves in zip(_mlps_and_head(lora), base, strict=True):
        for got, want in zip(
            jax.tree_util.tree_leaves(_value(layer.kernel).w), leaves, strict=True
        ):
            np.testing.assert_array_equal(got, want)


# quax_named.nmap on NNX modules.


def _named(shape, names, key=5):
    return quax_named.NamedArray(jr.normal(jr.key(key), shape), names)


def test_nmap_nnx_module_and_method_match_plain_nnx():
    layer = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    x = _named((2, 5, 4), ("batch", "seq", "feature"))
    y = quax_named.nmap(layer, "feature", out_axes=("out",))(x)
    assert [a.key for a in y.axes] == ["batch", "seq", "out"]
    np.testing.assert_allclose(y.array, layer(x.array), rtol=1e-6, atol=1e-6)
    # The axes in another order: matched by name, the output's follow `x`'s.
    z = quax_named.NamedArray(
        jnp.transpose(x.array, (2, 1, 0)), ("feature", "seq", "batch")
    )
    w = quax_named.nmap(layer, "feature", out_axes=("out",))(z)
    assert [a.key for a in w.axes] == ["seq", "batch", "out"]
    np.testing.assert_allclose(
        w.array, jnp.transpose(layer(x.array), (1, 0, 2)), rtol=1e-6, atol=1e-6
    )

    class Encoder(nnx.Module):
        def __init__(self, rngs):
            self.layer = nnx.Linear(4, 3, rngs=rngs)

        def encode(self, x, scale):
            return scale * self.layer(x)

    encoder = Encoder(nnx.Rngs(1))
    got = quax_named.nmap(encoder.encode, "feature", out_axes=("out",))(x, 2.0)
    np.testing.assert_allclose(
        got.array, 2.0 * encoder.layer(x.array), rtol=1e-6, atol=1e-6
    )


def test_nmap_nnx_dropout_draws_per_element():
    """The module's random streams are split per element, as `nnx.Dropout`
    over the whole batch draws a mask per element, and advance once per call."""

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.layer = nnx.Linear(4, 8, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.drop(self.layer(x))

    net = Net(nnx.Rngs(0, dropout=1))
    x = _named((6, 4), ("batch", "feature"))
    dense = net.layer(x.array)
    y = quax_named.nmap(net, "feature", out_axes=("hidden",))(x).array
    kept = y != 0
    # Each kept entry is the layer's output over 1 - rate; the masks differ by row.
    np.testing.assert_allclose(y[kept], (dense / 0.5)[kept], rtol=1e-6)
    assert len({tuple(row) for row in np.asarray(kept)}) > 1
    rngs = net.drop.rngs
    assert rngs is not None
    count = rngs.count.get_value()
    again = quax_named.nmap(net, "feature", out_axes=("hidden",))(x).array
    rngs = net.drop.rngs  # read again, as nmap updates the module
    assert rngs is not None
    assert rngs.count.get_value() == count + 1
    assert np.any((again != 0) != kept)
    # Deterministic: the plain layer.
    net.drop.deterministic = True
    np.testing.assert_allclose(
        quax_named.nmap(net, "feature", out_axes=("hidden",))(x).array,
        dense,
        rtol=1e-6,
        atol=1e-6,
    )


def test_nmap_nnx_refuses_state_updated_per_element():
    """`nnx.BatchNorm` collecting statistics updates shared state per element:
    `nnx.vmap` refuses it."""

    class Norm(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.BatchNorm(4, rngs=rngs)

        def __call__(self, x):
            return self.norm(x[None])[0]

    x = _named((3, 2, 4), ("batch", "seq", "feature"))
    with pytest.raises(ValueError, match="out_axes"):
        quax_named.nmap(Norm(nnx.Rngs(0)), "feature")(x)


def test_core_nnx_selected():
    """`quax.nnx_selected`, the selection both families' NNX paths use: by type
    or predicate, inside `where`, never below a selected module, a shared module
    once."""
    block = Block(nnx.Rngs(0))
    names = lambda picked: sorted(".".join(map(str, p)) for p, _ in picked)
    assert names(quax.nnx_selected(block, filter=nnx.Linear)) == ["down", "up"]
    assert names(quax.nnx_selected(block, filter=nnx.LinearGeneral)) == [
        "attn.key",
        "attn.out",
        "attn.query",
        "attn.value",
    ]
    picked = quax.nnx_selected(
        block, filter=nnx.LinearGeneral, where=lambda m: (m.attn.value, m.up)
    )
    assert names(picked) == ["attn.value"] and picked[0][1] is block.attn.value
    # The attention is selected: nothing below it.
    assert names(
        quax.nnx_selected(
            block, filter=lambda m: hasattr(m, "num_heads") or hasattr(m, "kernel")
        )
    ) == ["attn", "down", "up"]
    shared = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    pair = nnx.List([shared, shared])
    assert names(quax.nnx_selected(pair, filter=nnx.Linear)) == ["0"]
    with pytest.raises(ValueError, match=r"^mine: where= returned Param"):
        quax.nnx_selected(
            block, filter=nnx.Linear, where=lambda m: m.up.kernel, caller="mine"
        )
    with pytest.raises(ValueError, match="map_selected"):
        quax.nnx_selected({"a": 1}, filter=nnx.Linear)
