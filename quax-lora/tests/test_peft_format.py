"""Adapters in peft's layout, checked with `safetensors` alone (peft itself runs in
`scripts/peft_roundtrip.sh`): the key names and shapes peft's `save_pretrained`
writes, the config, and the round trip."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from safetensors.numpy import load_file, save_file


class _Net(eqx.Module):
    embed: eqx.nn.Embedding
    layers: list
    head: eqx.nn.Linear

    def __init__(self, key):
        k = jr.split(key, 4)
        self.embed = eqx.nn.Embedding(20, 8, key=k[0])
        self.layers = [eqx.nn.Linear(8, 12, key=k[1]), eqx.nn.Linear(12, 8, key=k[2])]
        self.head = eqx.nn.Linear(8, 2, key=k[3])

    def __call__(self, token):
        x = self.embed(token)
        for layer in self.layers:
            x = jax.nn.relu(layer(x))
        return self.head(x)


NET = _Net(jr.key(0))
LAYERS = (eqx.nn.Linear, eqx.nn.Embedding)


def _tuned(perturb, **kwargs):
    model = quax_lora.loraify(
        NET, rank=4, alpha=8.0, filter=LAYERS, key=jr.key(1), **kwargs
    )
    return perturb(model, jr.key(2))


def test_keys_shapes_and_config(perturb, tmp_path):
    model = _tuned(perturb)
    quax_lora.save_adapter(tmp_path, model, format="peft")
    tensors = load_file(str(tmp_path / "adapter_model.safetensors"))
    p = "base_model.model."
    assert {k: v.shape for k, v in tensors.items()} == {
        f"{p}embed.lora_embedding_A": (4, 20),
        f"{p}embed.lora_embedding_B": (8, 4),
        f"{p}layers.0.lora_A.weight": (4, 8),
        f"{p}layers.0.lora_B.weight": (12, 4),
        f"{p}layers.1.lora_A.weight": (4, 12),
        f"{p}layers.1.lora_B.weight": (8, 4),
        f"{p}head.lora_A.weight": (2, 8),  # the head's rank is capped at 2
        f"{p}head.lora_B.weight": (2, 2),
    }
    # As torch stores them: lora_A is the input's side (b), lora_B the output's.
    lin = model.layers[0].weight
    np.testing.assert_array_equal(tensors[f"{p}layers.0.lora_A.weight"], lin.b)
    np.testing.assert_array_equal(tensors[f"{p}layers.0.lora_B.weight"], lin.a)
    emb = model.embed.weight
    np.testing.assert_array_equal(tensors[f"{p}embed.lora_embedding_A"], emb.a.T)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["rank_pattern"] == {"head": 2}
    assert config["alpha_pattern"] == {"head": 4.0}  # the same scaling 2
    assert sorted(config["target_modules"]) == ["embed", "head", "layers.0", "layers.1"]
    assert config["use_rslora"] is False and config["use_dora"] is False
    assert config["fan_in_fan_out"] is False and config["peft_type"] == "LORA"


@pytest.mark.parametrize("variant", ["lora", "rslora"])
def test_round_trip(perturb, tmp_path, variant):
    model = _tuned(perturb, variant=variant)
    quax_lora.save_adapter(tmp_path, model, format="peft")
    fresh = quax_lora.loraify(
        NET, rank=4, alpha=8.0, filter=LAYERS, variant=variant, key=jr.key(9)
    )
    loaded = quax_lora.load_adapter(tmp_path, fresh)
    for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(model), strict=True):
        np.testing.assert_array_equal(x, y)
    token = jnp.int32(7)
    np.testing.assert_allclose(
        quax.quaxify(loaded)(token), quax.quaxify(model)(token), rtol=1e-6
    )
    # Loaded into a model loraified otherwise: refused, naming the layer.
    other = quax_lora.loraify(NET, rank=4, alpha=4.0, filter=LAYERS, key=jr.key(9))
    with pytest.raises(ValueError, match=r"layers\.0"):
        quax_lora.load_adapter(tmp_path, other)


def test_dora_round_trip_and_magnitude(perturb, tmp_path):
    model = quax_lora.loraify(NET, rank=4, alpha=8.0, variant="dora", key=jr.key(1))
    model = perturb(model, jr.key(2))
    quax_lora.save_adapter(tmp_path, model, format="peft")
    tensors = load_file(str(tmp_path / "adapter_model.safetensors"))
    mag = tensors["base_model.model.layers.0.lora_magnitude_vector"]
    np.testing.assert_array_equal(mag, model.layers[0].weight.magnitude)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["use_dora"] is True
    fresh = quax_lora.loraify(NET, rank=4, alpha=8.0, variant="dora", key=jr.key(5))
    loaded = quax_lora.load_adapter(tmp_path, fresh)
    np.testing.assert_array_equal(loaded.layers[0].weight.b, model.layers[0].weight.b)
    plain = quax_lora.loraify(NET, rank=4, alpha=8.0, key=jr.key(5))
    with pytest.raises(ValueError, match="variant"):
        quax_lora.load_adapter(tmp_path, plain)


def test_a_file_written_by_peft_with_a_name_map(tmp_path):
    """A file as peft writes it for a torch model whose modules are named
    otherwise (`model.fc1`), written here with safetensors from literals."""
    lin = eqx.nn.Linear(3, 2, key=jr.key(0))
    lora_a = np.array([[1.0, 2.0, 3.0]], np.float32)  # (r=1, in=3)
    lora_b = np.array([[0.5], [-1.0]], np.float32)  # (out=2, r=1)
    save_file(
        {
            "base_model.model.model.fc1.lora_A.weight": lora_a,
            "base_model.model.model.fc1.lora_B.weight": lora_b,
        },
        str(tmp_path / "adapter_model.safetensors"),
    )
    (tmp_path / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 1,
                "lora_alpha": 2,
                "target_modules": ["fc1"],
                "use_rslora": False,
                "use_dora": False,
                "fan_in_fan_out": False,
            }
        )
    )
    model = quax_lora.loraify(lin, rank=1, alpha=2.0, key=jr.key(1))
    with pytest.raises(ValueError, match="name_map"):
        quax_lora.load_adapter(tmp_path, model)
    # The layer is the model itself: its weight's path `.weight` is the module "".
    loaded = quax_lora.load_adapter(tmp_path, model, name_map={"": "model.fc1"})
    x = jnp.array([1.0, -1.0, 2.0])
    assert lin.bias is not None
    # torch: W x + (alpha / r) B (A x) = W x + 2 * [0.5, -1] * (1 - 2 + 6)
    want = lin.weight @ x + lin.bias + 2.0 * np.array([0.5, -1.0]) * 5.0
    np.testing.assert_allclose(quax.quaxify(loaded)(x), want, rtol=1e-6)


def test_conv_layout_and_refusals(perturb, tmp_path):
    conv = eqx.nn.Conv2d(3, 5, 3, key=jr.key(0))
    model = perturb(
        quax_lora.loraify(conv, rank=2, alpha=2.0, filter=eqx.nn.Conv, key=jr.key(1)),
        jr.key(2),
    )
    quax_lora.save_adapter(tmp_path / "conv", model, format="peft", name_map={"": "c"})
    tensors = load_file(str(tmp_path / "conv" / "adapter_model.safetensors"))
    # peft's conv LoRA: lora_A a kernel (rank, in, kh, kw), lora_B a 1x1 kernel.
    assert tensors["base_model.model.c.lora_A.weight"].shape == (2, 3, 3, 3)
    assert tensors["base_model.model.c.lora_B.weight"].shape == (5, 2, 1, 1)
    fresh = quax_lora.loraify(
        conv, rank=2, alpha=2.0, filter=eqx.nn.Conv, key=jr.key(5)
    )
    loaded = quax_lora.load_adapter(tmp_path / "conv", fresh, name_map={"": "c"})
    np.testing.assert_array_equal(loaded.weight.a, model.weight.a)
    np.testing.assert_array_equal(loaded.weight.b, model.weight.b)
    # A stack of matrices has no peft layer: refused, naming it.
    stacked = quax_lora.LoraArray(jnp.ones((2, 4, 4)), rank=1, key=jr.key(0))
    with pytest.raises(ValueError, match="batch_ndim"):
        quax_lora.save_adapter(tmp_path / "s", {"w": stacked}, format="peft")


def test_mixed_dropouts_warn_and_write_the_largest(perturb, tmp_path):
    model = _tuned(perturb, dropout=0.1)
    model = eqx.tree_at(
        lambda m: m.layers[1].weight, model, model.layers[1].weight.replace(dropout=0.3)
    )
    with pytest.warns(quax_lora.MixedDropoutWarning, match=r"0\.3 for `layers\.1`"):
        quax_lora.save_adapter(tmp_path, model, format="peft")
    assert issubclass(quax_lora.MixedDropoutWarning, quax_lora.LoraWarning)
    assert issubclass(quax_lora.MixedDropoutWarning, UserWarning)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["lora_dropout"] == 0.3
    # One dropout for every layer: written as it is, without a warning.
    same = tmp_path / "same"
    quax_lora.save_adapter(same, _tuned(perturb, dropout=0.2), format="peft")
    assert json.loads((same / "adapter_config.json").read_text())["lora_dropout"] == 0.2
