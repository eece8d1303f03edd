"""loraify (and its errors when it matches nothing), merge, the trainable filter,
parameter counts."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from lora_helpers import normal
from quax_lora import LoraArray


def _loras(model):
    return [
        x
        for x in jax.tree.leaves(model, is_leaf=quax_lora.is_lora)
        if quax_lora.is_lora(x)
    ]


class _Net(eqx.Module):
    conv: eqx.nn.Conv2d
    mlp: eqx.nn.MLP
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jr.split(key, 3)
        self.conv = eqx.nn.Conv2d(2, 3, 3, padding=1, key=k1)
        self.mlp = eqx.nn.MLP(3 * 4 * 4, 8, 16, depth=2, key=k2)
        self.head = eqx.nn.Linear(8, 2, key=k3)

    def __call__(self, x):
        h = jax.nn.relu(self.conv(x)).reshape(-1)
        return self.head(self.mlp(h))


def test_loraify_default_is_every_linear():
    net = _Net(jr.PRNGKey(0))
    lora = quax_lora.loraify(net, rank=2, key=jr.PRNGKey(1))
    assert len(_loras(lora)) == 4  # three in the MLP, the head; not the conv
    assert not quax_lora.is_lora(lora.conv.weight)
    a = [lr.a for lr in _loras(lora)]
    assert not np.allclose(a[1][:2, :2], a[2][:2, :2])  # each layer its own key


def test_loraify_filter_and_where(perturb):
    net = _Net(jr.PRNGKey(0))
    convs = quax_lora.loraify(
        net, rank=2, filter=(eqx.nn.Conv, eqx.nn.Linear), key=jr.PRNGKey(1)
    )
    assert len(_loras(convs)) == 5 and convs.conv.weight.batch_ndim == 0
    head = quax_lora.loraify(net, rank=2, where=lambda m: m.head, key=jr.PRNGKey(1))
    assert len(_loras(head)) == 1 and quax_lora.is_lora(head.head.weight)
    some = quax_lora.loraify(
        net,
        rank=2,
        where=lambda m: (m.conv, m.mlp.layers[0]),
        filter=lambda lr: hasattr(lr, "weight"),
        key=jr.PRNGKey(1),
    )
    assert len(_loras(some)) == 2
    assert quax_lora.is_lora(some.conv.weight) and quax_lora.is_lora(
        some.mlp.layers[0].weight
    )
    some = perturb(some, jr.PRNGKey(2))
    x = normal(jr.PRNGKey(3), (2, 4, 4))
    np.testing.assert_allclose(
        quax.quaxify(some)(x), quax_lora.merge(some)(x), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_merge_dtype_exact(dtype, perturb):
    linear = eqx.nn.Linear(6, 4, key=jr.PRNGKey(0), dtype=dtype)
    lora = perturb(
        quax_lora.loraify(linear, rank=2, alpha=4.0, key=jr.PRNGKey(1)), jr.PRNGKey(2)
    )
    merged = quax_lora.merge(lora)
    assert merged.weight.dtype == dtype and merged.weight.shape == (4, 6)
    w = lora.weight
    expected = np.asarray(w.w, np.float64) + 2.0 * np.asarray(
        w.a, np.float64
    ) @ np.asarray(w.b, np.float64)
    np.testing.assert_allclose(
        np.asarray(merged.weight, np.float64),
        expected,
        rtol=1e-2 if dtype != jnp.float32 else 1e-6,
    )
    # An unchanged adapter merges back to the original weights exactly.
    np.testing.assert_array_equal(
        quax_lora.merge(quax_lora.loraify(linear, rank=2, key=jr.PRNGKey(1))).weight,
        linear.weight,
    )


def test_trainable_filter_and_count():
    mlp = eqx.nn.MLP(10, 4, 20, depth=2, key=jr.PRNGKey(0))
    lora = quax_lora.loraify(mlp, rank=2, key=jr.PRNGKey(1))
    params = eqx.filter(lora, quax_lora.trainable_filter(lora))
    leaves = jax.tree.leaves(params)
    assert sorted(x.shape for x in leaves) == sorted(
        [(20, 2), (2, 10), (20, 2), (2, 20), (4, 2), (2, 20)]
    )
    count = quax_lora.count_parameters(lora)
    base = sum(x.size for x in jax.tree.leaves(eqx.filter(mlp, eqx.is_array)))
    assert (
        count.trainable
        == sum(x.size for x in leaves)
        == 2 * (10 + 20) + 2 * (20 + 20) + 2 * (20 + 4)
    )
    assert count.total == base + count.trainable
    assert str(count).startswith(
        f"trainable params: {count.trainable:,} || all params: {count.total:,}"
    )
    unfrozen = quax_lora.loraify(mlp, rank=2, stop_gradient=False, key=jr.PRNGKey(1))
    assert (
        quax_lora.count_parameters(unfrozen).trainable
        == count.trainable + 20 * 10 + 20 * 20 + 4 * 20
    )
    # `save_adapter` keeps to `a` and `b` even then.
    assert (
        len(jax.tree.leaves(eqx.filter(unfrozen, quax_lora.adapter_filter(unfrozen))))
        == 6
    )


# loraify that matches nothing ---------------------------------------------------------


KEY = jr.key(0)


@pytest.fixture
def mlp() -> eqx.nn.MLP:
    return eqx.nn.MLP(4, 2, 8, depth=2, key=KEY)


def test_loraify_filter_matching_no_layer(mlp: eqx.nn.MLP) -> None:
    with pytest.raises(ValueError, match=r"filter=GRUCell: it matched no layer"):
        quax_lora.loraify(mlp, rank=2, filter=eqx.nn.GRUCell, key=KEY)


def test_loraify_layer_without_weight() -> None:
    cell = eqx.nn.GRUCell(4, 3, key=KEY)
    with pytest.raises(
        ValueError, match=r"matched 1 layer\(s\) \(GRUCell\), but none has a `weight`"
    ):
        quax_lora.loraify(cell, rank=2, filter=eqx.nn.GRUCell, key=KEY)


def test_loraify_where_pointing_at_arrays(mlp: eqx.nn.MLP) -> None:
    where = lambda m: m.layers[0].weight
    with pytest.raises(ValueError, match=r"where=.*test_model.py:\d+.*no layer"):
        quax_lora.loraify(mlp, rank=2, where=where, key=KEY)


def test_loraify_predicate_filter_named(mlp: eqx.nn.MLP) -> None:
    def never(layer: Any) -> bool:
        return False

    with pytest.raises(ValueError, match=r"filter=.*never"):
        quax_lora.loraify(mlp, rank=2, filter=never, key=KEY)


def test_loraify_again_is_not_an_error(mlp: eqx.nn.MLP) -> None:
    once = quax_lora.loraify(mlp, rank=2, key=KEY)
    twice = quax_lora.loraify(once, rank=2, key=jr.key(1))
    assert all(isinstance(layer.weight, LoraArray) for layer in twice.layers)
    np.testing.assert_array_equal(twice.layers[0].weight.a, once.layers[0].weight.a)
