"""`calibrate`: static activation scales recorded from sample batches, against plain
JAX on the dequantised model, and the int8 x int8 / float8 x float8 products using
them, against NumPy references (saturation and NaN rows included)."""

import dataclasses
import io

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import ml_dtypes
import numpy as np
import pytest
import quax
import quax_quant as qq


def _mlp():
    return eqx.nn.MLP(16, 4, 32, depth=2, key=jr.PRNGKey(0))


BATCHES = [jr.normal(jr.PRNGKey(10 + i), (8, 16)) for i in range(3)]


def _vmapped(m, x):
    return jax.vmap(m)(x)


def test_scales_are_the_activations_absmax():
    qmodel = qq.quantise_model(_mlp(), bits=8, matmul="int8")
    calibrated = qq.calibrate(qmodel, BATCHES, apply=_vmapped)
    # Plain JAX on the dequantised weights: the input of each layer.
    x = jnp.concatenate(BATCHES)
    highs = []
    for i, layer in enumerate(qmodel.layers):
        highs.append(float(jnp.max(jnp.abs(x))))
        x = x @ layer.weight.dequantise().T + layer.bias
        if i < len(qmodel.layers) - 1:
            x = jax.nn.relu(x)
    for layer, high in zip(calibrated.layers, highs, strict=True):
        assert layer.weight.act_scale.dtype == jnp.float32
        np.testing.assert_allclose(layer.weight.act_scale, high / 127, rtol=1e-5)
    # The originals are untouched.
    assert all(layer.weight.act_scale is None for layer in qmodel.layers)
    assert qq.describe(calibrated.layers[0].weight)["calibrated"] is True


def _np_static_int8(x, w, act_scale):
    x = np.asarray(x, np.float64)
    xq = np.clip(np.round(x / float(act_scale)), -127, 127)
    q = np.asarray(w.values, np.float64)
    return (xq @ q.T) * float(act_scale) * np.asarray(w.scale, np.float64).reshape(-1)


@pytest.mark.parametrize("scale_by", [1.0, 3.0])
def test_the_int8_path_uses_the_static_scale(scale_by):
    """Inputs within the calibrated range, and three times beyond it (saturating:
    clipped to the range, finite), against NumPy; under `jit` and `vmap`."""
    w = qq.quantise(jr.normal(jr.PRNGKey(1), (12, 16)), axis=0, matmul="int8")
    model = eqx.nn.Linear(16, 12, use_bias=False, key=jr.PRNGKey(2))
    model = eqx.tree_at(lambda m: m.weight, model, w)
    calibrated = qq.calibrate(model, BATCHES, apply=_vmapped)
    act_scale = calibrated.weight.act_scale
    x = scale_by * jr.normal(jr.PRNGKey(3), (8, 16))
    out = jax.jit(quax.quaxify(_vmapped))(calibrated, x)
    expected = _np_static_int8(x, w, act_scale)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert np.isfinite(out).all()
    # Not the per-call product (one absmax scale per row).
    per_call = quax.quaxify(_vmapped)(model, x)
    assert not np.allclose(per_call, out, rtol=1e-6, atol=0)
    # A row holding a NaN is a NaN row.
    nan_row = quax.quaxify(_vmapped)(calibrated, x.at[2, 5].set(jnp.nan))
    assert np.isnan(nan_row[2]).all() and np.isfinite(np.delete(nan_row, 2, 0)).all()


# A library `jit` inside the model: quax keeps its quaxified body for the next call
# on the same types and shapes, and `calibrate` traces it with a callback in.
_jitted_product = jax.jit(lambda w, x: x @ w.T)


def _with_library_jit(m, x):
    return _jitted_product(m.weight, x)


def test_a_run_after_calibrate_saturates_through_a_library_jit():
    """The body `calibrate` traced for a nested `jit` (weight-only, recording) is
    not the body of a later run: that run quantises the activations at the static
    scale, saturating, against NumPy. Before, the run reused calibrate's body and
    gave the exact unsaturated product."""
    w = qq.quantise(jr.normal(jr.PRNGKey(1), (12, 16)), axis=0, matmul="int8")
    model = eqx.nn.Linear(16, 12, use_bias=False, key=jr.PRNGKey(2))
    model = eqx.tree_at(lambda m: m.weight, model, w)
    x = 3.0 * jr.normal(jr.PRNGKey(3), (8, 16))
    calibrated = qq.calibrate(model, [x / 3], apply=_with_library_jit)
    act_scale = calibrated.weight.act_scale
    np.testing.assert_allclose(act_scale, float(jnp.max(jnp.abs(x / 3))) / 127)
    out = jax.jit(quax.quaxify(_with_library_jit))(calibrated, x)
    expected = _np_static_int8(x, w, act_scale)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_calibrating_again_records_every_batch_through_a_library_jit():
    """A second `calibrate` records through its own bodies, not the first one's
    (whose callback fed the first call's table): the scale is the absmax over all
    its batches, against plain JAX. Before, the batch of the shape calibrated
    before went unrecorded (a scale of 2 / 127 instead of 10 / 127)."""
    w = qq.quantise(jr.normal(jr.PRNGKey(1), (12, 16)), axis=0, matmul="int8")
    model = eqx.nn.Linear(16, 12, use_bias=False, key=jr.PRNGKey(2))
    model = eqx.tree_at(lambda m: m.weight, model, w)
    ones = jnp.ones((2, 16))
    first = qq.calibrate(model, [ones], apply=_with_library_jit)
    np.testing.assert_allclose(first.weight.act_scale, 1 / 127)
    batches = [ones * 10, ones[:1] * 2]
    again = qq.calibrate(first, batches, apply=_with_library_jit)
    high = max(float(jnp.max(jnp.abs(b))) for b in batches)
    np.testing.assert_allclose(again.weight.act_scale, high / 127)


def test_float8_calibration():
    w = qq.quantise(
        jr.normal(jr.PRNGKey(1), (12, 16)), format="float8_e4m3fn", matmul="float8"
    )
    model = eqx.nn.Linear(16, 12, use_bias=False, key=jr.PRNGKey(2))
    model = eqx.tree_at(lambda m: m.weight, model, w)
    calibrated = qq.calibrate(model, BATCHES, apply=_vmapped)
    high = float(jnp.max(jnp.abs(jnp.concatenate(BATCHES))))
    np.testing.assert_allclose(calibrated.weight.act_scale, high / 448, rtol=1e-6)
    x = jr.normal(jr.PRNGKey(3), (8, 16))
    out = quax.quaxify(_vmapped)(calibrated, x)
    s = float(calibrated.weight.act_scale)
    xq = np.clip(np.asarray(x) / s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    wq = np.asarray(w.values).astype(np.float64)
    expected = (xq.astype(np.float64) @ wq.T) * s * float(w.scale.reshape(()))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_checkpoint_keeps_the_scales():
    calibrated = qq.calibrate(
        qq.quantise_model(_mlp(), bits=8, matmul="int8"), BATCHES, apply=_vmapped
    )
    buffer = io.BytesIO()
    qq.save_quantised(buffer, calibrated)
    buffer.seek(0)
    like = qq.calibrate(
        qq.quantise_model(_mlp(), bits=8, matmul="int8"), BATCHES[:1], apply=_vmapped
    )
    loaded = qq.load_quantised(buffer, like)
    for a, b in zip(loaded.layers, calibrated.layers, strict=True):
        np.testing.assert_array_equal(a.weight.act_scale, b.weight.act_scale)
    buffer.seek(0)
    with pytest.raises(ValueError, match="calibrated=True"):
        qq.load_quantised(buffer, qq.quantise_model(_mlp(), bits=8, matmul="int8"))


def test_errors():
    qmodel = qq.quantise_model(_mlp(), bits=8, matmul="int8")
    with pytest.raises(ValueError, match="`batches` is empty"):
        qq.calibrate(qmodel, [], apply=_vmapped)
    with pytest.raises(ValueError, match="no QuantisedArray whose product"):
        qq.calibrate(qq.quantise_model(_mlp(), format="nf4", block_size=16), BATCHES)
    # A weight the batches never reach.
    with pytest.raises(
        ValueError, match=r"at \.layers\[1\]\.weight, \.layers\[2\]\.weight met no"
    ):
        qq.calibrate(qmodel, BATCHES, apply=lambda m, x: jax.vmap(m.layers[0])(x))
    w = qmodel.layers[0].weight
    with pytest.raises(ValueError, match=r"act_scale .* must be a float32 scalar"):
        dataclasses.replace(w, act_scale=jnp.ones(2))
    with pytest.raises(ValueError, match=r"act_scale .* must be a float32 scalar"):
        dataclasses.replace(w, act_scale=jnp.ones((), jnp.float16))
