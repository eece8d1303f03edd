"""`save_quantised` / `load_quantised`: a file records what reproduces the outputs
(format, bits, block layout, scheme, dtypes, packing, product path), and loading
into a model quantised another way raises, naming the array and the field."""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq


def _mlp(seed=0):
    return eqx.nn.MLP(8, 3, 16, depth=2, key=jr.PRNGKey(seed))


def _outputs(model, x):
    return eqx.filter_jit(quax.quaxify(lambda m, x: jax.vmap(m)(x)))(model, x)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bits": 8},
        {"bits": 4, "group_size": 4, "symmetric": False},
        {"bits": 8, "axis": None, "matmul": "int8"},
    ],
)
def test_round_trip_reproduces_the_outputs(kwargs, tmp_path):
    saved = qq.quantise_model(_mlp(0), **kwargs)
    path = str(tmp_path / "model.qq")
    qq.save_quantised(path, saved)
    # Loaded into a model of other weights, quantised with the same arguments.
    like = qq.quantise_model(_mlp(1), **kwargs)
    loaded = qq.load_quantised(path, like)
    x = jr.normal(jr.PRNGKey(2), (5, 8))
    np.testing.assert_array_equal(_outputs(loaded, x), _outputs(saved, x))
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(a, b)


def test_header_records_the_layout():
    q = qq.quantise(jnp.ones((4, 6)), bits=4, group_size=3, symmetric=False)
    assert qq.describe(q) == {
        "format": "int",
        "bits": 4,
        "shape": [4, 6],
        "group_sizes": [1, 3],
        "axis": None,
        "group_size": 3,
        "group_axis": 1,
        "scheme": "asymmetric",
        "float_dtype": "float32",
        "storage_dtype": "int8",
        "packed_axis": -1,
        "matmul": "auto",
        "straight_through": False,
        "double_quant": None,
        "calibrated": False,
        "act_order": False,
    }
    per_channel = qq.describe(qq.quantise(jnp.ones((4, 6)), axis=0))
    assert per_channel["axis"] == [0] and per_channel["group_size"] is None
    assert qq.describe(qq.quantise(jnp.ones((4, 6))))["axis"] is None


@pytest.mark.parametrize(
    ("saved", "other", "field", "saved_value"),
    [
        ({}, {"bits": 4}, "bits", 8),
        ({"group_size": 4}, {"group_size": 2}, "group_size", 4),
        ({}, {"axis": None}, "axis", [0]),
        ({}, {"axis": 1}, "axis", [0]),
        ({}, {"symmetric": False}, "scheme", "symmetric"),
        ({}, {"matmul": "int8"}, "matmul", "auto"),
    ],
)
def test_loading_into_another_quantisation_raises(saved, other, field, saved_value):
    """bits, group size, axis, scheme, product path: each mismatch raises before a
    byte of the leaves is read (equinox alone would read int8 bytes as packed int4
    pairs, or the next array's scales as zero points)."""
    f = io.BytesIO()
    qq.save_quantised(f, qq.quantise_model(_mlp(), **saved))
    f.seek(0)
    with pytest.raises(
        ValueError,
        match=rf"QuantisedArray at \.layers\[0\]\.weight was saved with {field}=",
    ) as e:
        qq.load_quantised(f, qq.quantise_model(_mlp(), **{**saved, **other}))
    assert f"{field}={saved_value!r}, but `like` has" in str(e.value)


def test_loading_into_another_model_raises():
    f = io.BytesIO()
    qq.save_quantised(f, qq.quantise_model(_mlp()))
    f.seek(0)
    only_first = qq.quantise_model(_mlp(), where=lambda m: m.layers[0])
    with pytest.raises(
        ValueError,
        match=r"checkpoint holds a QuantisedArray at \.layers\[1\]\.weight, `like` has "
        "none there",
    ):
        qq.load_quantised(f, only_first)
    f.seek(0)
    wider = qq.quantise_model(eqx.nn.MLP(8, 3, 32, depth=2, key=jr.PRNGKey(0)))
    with pytest.raises(ValueError, match="was saved with shape="):
        qq.load_quantised(f, wider)
    with pytest.raises(ValueError, match="not a quax_quant checkpoint"):
        qq.load_quantised(io.BytesIO(b"not a checkpoint"), wider)
