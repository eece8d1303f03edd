"""GPTQ (`quax_quant.gptq`, `quantise_columns`) against a NumPy reference written
here from the paper's definition (Frantar et al., 2022, equations 2-3): one column
at a time in float64, the error spread through the inverse Hessian of the
remaining columns, which is updated by Gaussian elimination after each column (no
Cholesky factor, no lazy batches); each group's min-max grid fixed when its first
column is reached. Then the whole-model path (each layer's Hessian from its inputs
with the earlier layers quantised), GPTQ's packed layout both ways, and the error
against round to nearest on a small MLP and a small transformer block."""

import math
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq
import quax_quant._layer_inputs as _layer_inputs_module
from quax_quant._checkpoint import gptq_array
from quax_quant._gptq_algorithm import block_columns, linear_layers, weight_setter
from quax_quant._layer_inputs import layer_inputs, progress_bar


def np_grid(x, maxq, symmetric=False):
    """GPTQ's quantiser grid per row of `x` (its `Quantizer.find_params`)."""
    xmin = np.minimum(x.min(axis=1), 0)
    xmax = np.maximum(x.max(axis=1), 0)
    if symmetric:
        xmax = np.maximum(-xmin, xmax)
        xmin = np.where(xmin < 0, -xmax, xmin)
    empty = (xmin == 0) & (xmax == 0)
    xmin, xmax = np.where(empty, -1, xmin), np.where(empty, 1, xmax)
    scale = (xmax - xmin) / maxq
    zero = (
        np.full_like(scale, (maxq + 1) // 2) if symmetric else np.round(-xmin / scale)
    )
    return scale, zero


def np_gptq(w, h, *, bits=4, group_size=None, act_order=False, damp=0.01, sym=False):
    """The reference: integers `(out, in)` in the features' order, scales and zero
    points `(out, groups)` in visiting order, and `g_idx`."""
    w, h = np.array(w, np.float64), np.array(h, np.float64)
    maxq = 2**bits - 1
    out, n = w.shape
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(n)
    w, h = w[:, perm], h[np.ix_(perm, perm)]
    h += damp * np.mean(np.diag(h)) * np.eye(n)
    hinv = np.linalg.inv(h)
    size = group_size or n
    q = np.zeros((out, n))
    scales, zeros = [], []
    for i in range(n):
        if i % size == 0:
            scale, zero = np_grid(w[:, i : i + size], maxq, sym)
            scales.append(scale)
            zeros.append(zero)
        q[:, i] = np.clip(np.round(w[:, i] / scale) + zero, 0, maxq)
        err = (w[:, i] - scale * (q[:, i] - zero)) / hinv[i, i]
        w[:, i:] -= np.outer(err, hinv[i, i:])
        hinv -= np.outer(hinv[:, i], hinv[i, :]) / hinv[i, i]
    g_idx = np.empty(n, np.int64)
    g_idx[perm] = np.arange(n) // size
    q_orig = np.empty_like(q)
    q_orig[:, perm] = q
    return q_orig, np.stack(scales, 1), np.stack(zeros, 1), g_idx


def np_dequantised(q, scales, zeros, g_idx):
    return scales[:, g_idx] * (q - zeros[:, g_idx])


def _problem(out, n, seed, dead=()):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out, n))
    # Correlated inputs with unequal magnitudes, as a layer's activations are.
    x = rng.standard_normal((4 * n, n)) @ rng.standard_normal((n, n)) / np.sqrt(n)
    x *= np.exp(rng.standard_normal(n))
    x[:, list(dead)] = 0
    return w, 2 * x.T @ x / len(x), x


@pytest.mark.parametrize(
    "n, group_size, act_order, bits, sym",
    [
        (256, None, False, 4, False),
        (256, 32, False, 4, False),  # groups inside a batch of 128 columns
        (256, 128, True, 4, False),
        (256, 64, True, 3, False),
        (192, 96, False, 4, False),  # batches of 32, groups spanning them
        (256, 128, False, 4, True),
        (136, 8, True, 2, False),  # a last batch shorter than 128 (padded)
    ],
)
def test_matches_the_reference(n, group_size, act_order, bits, sym):
    w, h, _ = _problem(24, n, seed=n + (group_size or 0) + bits)
    with jax.enable_x64(True):
        q, s, z, features = qq.quantise_columns(
            jnp.asarray(w),
            h,
            bits=bits,
            group_size=group_size,
            act_order=act_order,
            symmetric=sym,
        )
        q, s, z = np.asarray(q).T, np.asarray(s).T, np.asarray(z).T
    rq, rs, rz, g_idx = np_gptq(
        w, h, bits=bits, group_size=group_size, act_order=act_order, sym=sym
    )
    np.testing.assert_array_equal(q, rq)
    np.testing.assert_allclose(s, rs, rtol=1e-12)
    np.testing.assert_array_equal(z, rz)
    if act_order and group_size is not None and n // group_size > 1:
        np.testing.assert_array_equal(features, np.argsort(g_idx, kind="stable"))
    else:
        assert features is None


def test_dead_inputs():
    """Input features that are 0 in every calibration input: their weights are
    set to 0 (dequantised exactly), the rest as the reference."""
    dead = [3, 50, 51, 200]
    w, h, _ = _problem(16, 256, seed=7, dead=dead)
    assert np.all(np.diag(h)[dead] == 0)
    with jax.enable_x64(True):
        q, s, z, _ = qq.quantise_columns(jnp.asarray(w), h, group_size=64)
        q, s, z = np.asarray(q).T, np.asarray(s).T, np.asarray(z).T
    rq, rs, rz, g_idx = np_gptq(w, h, group_size=64)
    np.testing.assert_array_equal(q, rq)
    np.testing.assert_allclose(s, rs, rtol=1e-12)
    np.testing.assert_array_equal(z, rz)
    np.testing.assert_array_equal(np_dequantised(q, s, z, g_idx)[:, dead], 0)


def test_lazy_batches_change_nothing():
    """The batch width only reorders the same updates (the paper's point):
    `block_columns` picks a width every group nests with."""
    assert [block_columns(g) for g in (32, 128, 256, 96, 48)] == [128, 128, 128, 32, 16]
    w, h, _ = _problem(8, 384, seed=3)
    with jax.enable_x64(True):
        a = qq.quantise_columns(jnp.asarray(w), h, group_size=48)
        b = qq.quantise_columns(jnp.asarray(w), h, group_size=384)
    assert a[0].shape == b[0].shape == (384, 8)
    assert a[1].shape == (8, 8) and b[1].shape == (1, 8)


def _mlp(dtype=jnp.float32):
    return eqx.nn.MLP(128, 128, 256, depth=2, key=jr.PRNGKey(0), dtype=dtype)


def _vmapped(m, x):
    return jax.vmap(m)(x)


def _read(tensors, fmt):
    """`from_gptq` of what `to_gptq` wrote."""
    return qq.from_gptq(
        tensors["qweight"],
        tensors["qzeros"],
        tensors["scales"],
        tensors.get("g_idx"),
        format=fmt,
    )


def test_whole_model_is_sequential(x64):
    """Each layer's Hessian comes from its inputs with every earlier layer already
    quantised: layer 1's integers are the reference's on the inputs that the
    NumPy-dequantised layer 0 gives."""
    rng = np.random.default_rng(0)
    model = _mlp(jnp.float64)
    batches = [jnp.asarray(rng.standard_normal((64, 128))) for _ in range(4)]
    out = qq.gptq(model, batches, group_size=64, apply=_vmapped, progress=False)
    arrays = [layer.weight for layer in out.layers]
    x = np.concatenate([np.asarray(b) for b in batches])
    for k, layer in enumerate(model.layers):
        w = np.asarray(layer.weight)
        rq, rs, rz, g_idx = np_gptq(w, 2 * x.T @ x / len(x), group_size=64)
        deq = np_dequantised(rq, rs, rz, g_idx)
        np.testing.assert_allclose(arrays[k].dequantise(), deq, rtol=1e-12)
        x = x @ deq.T + np.asarray(layer.bias)
        if k < len(model.layers) - 1:
            x = np.maximum(x, 0)
    assert all(a.matmul == "auto" and a.bits == 4 for a in arrays)
    # The quantised model runs as any QuantisedArray model does.
    y = quax.quaxify(_vmapped)(out, batches[0])
    np.testing.assert_allclose(y, x[:64], rtol=1e-9, atol=1e-9)


def _reference_layout(array):
    return [array.values, array.scale, array.zero_point, array.input_order]


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_packed_layout_round_trip(act_order):
    """`to_gptq` then `from_gptq` gives the same leaves, bit for bit; and
    `to_gptq` of what `from_gptq` read gives back the same tensors."""
    rng = np.random.default_rng(1)
    batches = [
        jnp.asarray(rng.standard_normal((64, 128)), jnp.float32) for _ in range(3)
    ]
    out = qq.gptq(
        _mlp(),
        batches,
        group_size=32,
        act_order=act_order,
        apply=_vmapped,
        progress=False,
    )
    for layer in out.layers:
        w = layer.weight
        assert (w.input_order is not None) == act_order
        for fmt in ("gptq_v2", "gptq"):
            z = np.asarray(w.zero_point) + 8
            if fmt == "gptq" and z.min() < 1:
                with pytest.raises(ValueError, match="zero point of 0 needs"):
                    qq.to_gptq(w, format=fmt)
                continue
            tensors = qq.to_gptq(w, format=fmt)
            assert tensors["qweight"].dtype == np.int32
            back = _read(tensors, fmt)
            for a, b in zip(_reference_layout(w), _reference_layout(back), strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.dtype == b.dtype
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            again = qq.to_gptq(back, format=fmt)
            for key in tensors:
                np.testing.assert_array_equal(tensors[key], again[key])
        if act_order:
            g_idx = qq.to_gptq(w, format="gptq_v2")["g_idx"]
            assert not np.all(np.diff(g_idx) >= 0)  # groups scattered
            with pytest.raises(ValueError, match="no AWQ layout"):
                qq.to_gptq(w, format="awq")


def test_three_bits_stored_as_int4():
    rng = np.random.default_rng(2)
    batches = [jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)]
    out = qq.gptq(_mlp(), batches, bits=3, apply=_vmapped, progress=False)
    w = out.layers[0].weight
    q = np.asarray(w.integers()) + 8  # unsigned
    assert w.bits == 4 and q.min() >= 0 and q.max() <= 7
    z = np.asarray(w.zero_point) + 8
    assert z.min() >= 0 and z.max() <= 7


def test_errors():
    batches = [jnp.ones((4, 128))]
    with pytest.raises(ValueError, match="bits must be one of"):
        qq.gptq(_mlp(), batches, bits=5)
    with pytest.raises(ValueError, match="group_size=48 does not divide the 128"):
        qq.gptq(_mlp(), batches, group_size=48, apply=_vmapped)
    with pytest.raises(ValueError, match="`batches` is empty"):
        qq.gptq(_mlp(), [], apply=_vmapped)
    with pytest.raises(ValueError, match="matched no layer"):
        qq.gptq(_mlp(), batches, filter=eqx.nn.Conv, apply=_vmapped)
    # A layer no batch reaches: only the first layer runs.
    with pytest.raises(ValueError, match=r"at \.layers\[1\] met no input"):
        qq.gptq(
            _mlp(),
            batches,
            apply=lambda m, x: jax.vmap(m.layers[0])(x),
            progress=False,
        )


# Error against round to nearest ------------------------------------------------------


def _inputs(seed, count, shape, channel_scale):
    """Correlated features of unequal magnitudes, as a network's activations
    are (with independent features GPTQ has no error to spread)."""
    d = shape[-1]
    mix = jr.normal(jr.PRNGKey(60), (d, d)) / math.sqrt(d)
    keys = jr.split(jr.PRNGKey(seed), count)
    return [(jr.normal(k, shape) @ mix) * channel_scale for k in keys]


def relative(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def rounded_to_nearest(model, bits, group_size):
    """Every `eqx.nn.Linear` rounded to nearest on GPTQ's grid: GPTQ with the
    identity Hessian (no error to spread), in the same layout."""

    def rtn(layer):
        w = layer.weight
        q, s, z, _ = qq.quantise_columns(
            w, np.eye(w.shape[1]), bits=bits, group_size=group_size
        )
        return eqx.tree_at(lambda x: x.weight, layer, gptq_array(q, z, s, None))

    return quax.map_selected(rtn, model, filter=eqx.nn.Linear)


def layer_errors(model, quantised, batch, apply):
    """Each `eqx.nn.Linear`'s relative output error `|(Q - W) X^T| / |W X^T|` on
    its inputs `X` in the float model on `batch` (from their Gram matrix)."""
    errors = []
    quantised_layers = [
        x
        for x in jax.tree.leaves(
            quantised, is_leaf=lambda x: isinstance(x, eqx.nn.Linear)
        )
        if isinstance(x, eqx.nn.Linear)
    ]
    for k, (layer, _) in enumerate(
        linear_layers("test", model, None, eqx.nn.Linear, None)
    ):
        setter = weight_setter(k, eqx.nn.Linear, None)
        gram = layer_inputs(
            model, setter, layer.weight, 1, [batch], apply, lambda: None
        ).gram
        w = np.asarray(layer.weight, np.float64)
        array = quantised_layers[k].weight
        assert isinstance(array, qq.QuantisedArray)
        d = np.asarray(array.dequantise(), np.float64) - w
        errors.append(math.sqrt(np.sum((d @ gram) * d) / np.sum((w @ gram) * w)))
    return errors


def _mlp_case(block_type):
    del block_type
    scale = jnp.exp(jr.normal(jr.PRNGKey(50), (128,)))
    model = eqx.nn.MLP(128, 128, 256, depth=2, key=jr.PRNGKey(4))
    return (
        model,
        _vmapped,
        _inputs(1, 8, (256, 128), scale),
        _inputs(2, 1, (256, 128), scale)[0],
    )


def _block_case(block_type):
    scale = jnp.exp(jr.normal(jr.PRNGKey(51), (128,)))
    model = block_type(128, 256, jr.PRNGKey(5))
    apply = _vmapped
    calib = _inputs(3, 8, (8, 32, 128), scale)
    return model, apply, calib, _inputs(4, 1, (8, 32, 128), scale)[0]


# The transformer block at 4 bits (37 s of compiles) is a sweep (`bash scripts/test.sh
# sweeps`): CI checks the block at 3 bits, the MLP at both, and 4 bits on a
# transformer block in groups of 32 through the tour's example
# (tests/test_quant_gptq_loftq_example.py).
@pytest.mark.parametrize(
    ("bits", "case"),
    [
        pytest.param(4, _mlp_case, id="4-_mlp_case"),
        pytest.param(4, _block_case, id="4-_block_case", marks=pytest.mark.sweep),
        pytest.param(3, _mlp_case, id="3-_mlp_case"),
        pytest.param(3, _block_case, id="3-_block_case"),
    ],
)
def test_beats_round_to_nearest(case, bits, transformer_block):
    """Groups of 128 at 4 and 3 bits: every layer's output error on held-out
    inputs, and the model's, below round to nearest's on the same grid (the
    margins are in the README of quax-quant)."""
    model, apply, calib, held_out = case(transformer_block)
    gptq = qq.gptq(model, calib, bits=bits, group_size=128, apply=apply, progress=False)
    rtn = rounded_to_nearest(model, bits, 128)
    ours = layer_errors(model, gptq, held_out, apply)
    theirs = layer_errors(model, rtn, held_out, apply)
    assert all(a < b for a, b in zip(ours, theirs, strict=True)), (ours, theirs)
    want = apply(model, held_out)
    out = relative(quax.quaxify(apply)(gptq, held_out), want)
    out_rtn = relative(quax.quaxify(apply)(rtn, held_out), want)
    print(
        f"{case.__name__} {bits} bits: layers {ours} vs {theirs}; "
        f"output {out} vs {out_rtn}"
    )
    assert out < out_rtn, (out, out_rtn)


class Transposed(eqx.Module):
    """A linear layer written `x @ w.T`, as NNX-style and hand-written code does."""

    weight: jax.Array

    def __call__(self, x):
        return x @ self.weight.T


def test_transposed_weight(x64):
    """A weight used as `x @ w.T` records the same inputs as `w @ x`: the same
    integers as `eqx.nn.Linear` gives."""
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.standard_normal((32, 64)))
    batches = [jnp.asarray(rng.standard_normal((128, 64))) for _ in range(2)]
    linear = eqx.tree_at(
        lambda x: x.weight, eqx.nn.Linear(64, 32, use_bias=False, key=jr.PRNGKey(0)), w
    )
    kwargs = {"group_size": 32, "progress": False}
    a = qq.gptq(Transposed(w), batches, filter=Transposed, **kwargs).weight
    b = qq.gptq(linear, batches, apply=_vmapped, **kwargs).weight
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.scale, b.scale)


def test_progress_bar(monkeypatch, capsys):
    """A tqdm bar once calibration has run `PROGRESS_DELAY` seconds (0 here), none
    with `progress=False` (as every other test here passes), and none, without an
    error, where tqdm is not installed (tqdm is a pinned dev dependency, so the
    test environments have it; its absence is simulated)."""
    monkeypatch.setattr(_layer_inputs_module, "PROGRESS_DELAY", 0.0)
    with progress_bar(3, "gptq", True) as step:
        for _ in range(3):
            step()
    assert "gptq" in capsys.readouterr().err
    with progress_bar(3, "gptq", False) as step:
        step()
    assert capsys.readouterr().err == ""
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import raises ImportError
    with progress_bar(3, "gptq", True) as step:
        step()
    assert capsys.readouterr().err == ""
