"""AWQ (`quax_quant.awq`, `awq_scales`, `awq_quantise`) against a NumPy reference
written here from the paper's definition (Lin et al., 2023, section 3.2, with
llm-awq's grid): `s = mean|x| ** alpha` per input feature, normalised, the
`alpha` in `0, 1/20, ..., 19/20` whose rounded weights `Q(W diag(s)) diag(1/s)`
give the least squared output error on the calibration activations themselves
(not through a Gram matrix, as the implementation computes it); `1 / s` folded
into the previous operation; round to nearest in groups with zero points."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq


def np_rtn(w, bits, group_size):
    """llm-awq's `pseudo_quantize_tensor(w, zero_point=True)`, dequantised."""
    maxq = 2**bits - 1
    g = w.reshape(w.shape[0], -1, group_size)
    high, low = g.max(axis=2, keepdims=True), g.min(axis=2, keepdims=True)
    scale = np.maximum(high - low, 1e-5) / maxq
    zero = np.clip(-np.round(low / scale), 0, maxq)
    q = np.clip(np.round(g / scale) + zero, 0, maxq)
    return ((q - zero) * scale).reshape(w.shape)


def np_search(ws, x, bits, group_size, grid=20):
    """The scales and exponent of least output error on the activations `x`."""
    mean_abs = np.abs(x).mean(axis=0)
    best = (np.inf, np.ones_like(mean_abs), 0.0)
    for i in range(grid):
        s = np.maximum(mean_abs ** (i / grid), 1e-4)
        s = s / np.sqrt(s.max() * s.min())
        loss = sum(
            np.sum(((np_rtn(w * s, bits, group_size) / s - w) @ x.T) ** 2) for w in ws
        )
        if loss < best[0]:
            best = (loss, s, i / grid)
    return best[1], best[2]


def _activations(n, d, seed, spread=1.5):
    """Features of very unequal magnitudes (a few large ones), as in LLMs: the
    same distribution for every `seed` (which draws the samples)."""
    fixed = np.random.default_rng(1000 + d)
    scale = np.exp(spread * fixed.standard_normal(d))
    mix = np.eye(d) + 0.3 * fixed.standard_normal((d, d)) / np.sqrt(d)
    return (np.random.default_rng(seed).standard_normal((n, d)) @ mix) * scale


def test_search_matches_the_reference(x64):
    x = _activations(512, 64, seed=0)
    rng = np.random.default_rng(1)
    ws = [rng.standard_normal((32, 64)), rng.standard_normal((48, 64))]
    s, alpha = qq.awq_scales(
        [jnp.asarray(w) for w in ws],
        2 * x.T @ x / len(x),
        np.abs(x).mean(axis=0),
        bits=4,
        group_size=16,
    )
    rs, ralpha = np_search(ws, x, 4, 16)
    assert alpha == ralpha and alpha > 0
    np.testing.assert_allclose(s, rs, rtol=1e-12)


def _pair_model(activation, key=0):
    k1, k2 = jr.split(jr.PRNGKey(key))
    return eqx.nn.Sequential(
        [
            eqx.nn.Linear(64, 128, key=k1),
            eqx.nn.Lambda(activation),
            eqx.nn.Linear(128, 64, key=k2),
        ]
    )


def _vmapped(m, x):
    return jax.vmap(m)(x)


def _pairs(m):
    return [(m.layers[0], m.layers[2])]


def test_whole_model_matches_the_reference(x64):
    """The second layer's inputs scaled by the searched `s`, `1 / s` folded into
    the first layer's rows and bias (ReLU between them commutes with it); the
    first layer (no earlier operation) rounded to nearest."""
    model = _pair_model(jax.nn.relu)
    x = _activations(1024, 64, seed=2)
    batches = [jnp.asarray(b) for b in np.split(x, 4)]
    out = qq.awq(
        model, batches, group_size=32, apply=_vmapped, fold=_pairs, progress=False
    )
    w1, b1 = np.asarray(model.layers[0].weight), np.asarray(model.layers[0].bias)
    w2 = np.asarray(model.layers[2].weight)
    h = np.maximum(x @ w1.T + b1, 0)
    s, alpha = np_search([w2], h, 4, 32)
    assert alpha > 0
    np.testing.assert_allclose(
        out.layers[2].weight.dequantise(), np_rtn(w2 * s, 4, 32), rtol=1e-10
    )
    np.testing.assert_allclose(
        out.layers[0].weight.dequantise(), np_rtn(w1 / s[:, None], 4, 32), rtol=1e-10
    )
    np.testing.assert_allclose(out.layers[0].bias, b1 / s, rtol=1e-12)
    # The quantised model computes what the NumPy one does.
    want = np.maximum(x @ np_rtn(w1 / s[:, None], 4, 32).T + b1 / s, 0)
    want = want @ np_rtn(w2 * s, 4, 32).T + np.asarray(model.layers[2].bias)
    y = quax.quaxify(_vmapped)(out, batches[0])
    np.testing.assert_allclose(y, want[:256], rtol=1e-9, atol=1e-9)


def test_refuses_a_fold_that_changes_the_function():
    """GELU does not commute with scaling its inputs: folding `1 / s` through it
    would change the float model, so `awq` raises instead of quantising it."""
    x = jnp.asarray(_activations(512, 64, seed=3), jnp.float32)
    with pytest.raises(ValueError, match="changes the model's float outputs"):
        qq.awq(
            _pair_model(jax.nn.gelu),
            [x],
            group_size=32,
            apply=_vmapped,
            fold=_pairs,
            progress=False,
        )


def test_errors():
    model = _pair_model(jax.nn.relu)
    x = [jnp.ones((4, 64))]
    with pytest.raises(ValueError, match=r"fold target at \.layers\[1\] is a Lambda"):
        qq.awq(
            model,
            x,
            group_size=32,
            apply=_vmapped,
            fold=lambda m: [(m.layers[1], m.layers[2])],
        )
    with pytest.raises(
        ValueError, match=r"has 128 outputs, the layer at \.layers\[0\] 64"
    ):
        qq.awq(
            model,
            x,
            group_size=32,
            apply=_vmapped,
            fold=lambda m: [(m.layers[0], m.layers[0])],
        )
    with pytest.raises(ValueError, match="a layer appears in two pairs"):
        qq.awq(
            model,
            x,
            group_size=32,
            apply=_vmapped,
            fold=lambda m: [(m.layers[0], m.layers[2]), (m.layers[0], m.layers[2])],
        )
    with pytest.raises(ValueError, match="does not divide the 64"):
        qq.awq(model, x, group_size=48, apply=_vmapped)


def test_exports_to_the_awq_layout():
    model = _pair_model(jax.nn.relu)
    x = jnp.asarray(_activations(256, 64, seed=4), jnp.float32)
    out = qq.awq(model, [x], group_size=32, apply=_vmapped, fold=_pairs, progress=False)
    for layer in (out.layers[0], out.layers[2]):
        tensors = qq.to_gptq(layer.weight, format="awq")
        assert set(tensors) == {"qweight", "qzeros", "scales"}
        back = qq.from_gptq(
            tensors["qweight"], tensors["qzeros"], tensors["scales"], format="awq"
        )
        for a, b in (
            (layer.weight.values, back.values),
            (layer.weight.scale, back.scale),
        ):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(layer.weight.zero_point, back.zero_point)


# Error against round to nearest ------------------------------------------------------


def _block_folds(m):
    # llm-awq's pairs for such a block: the norms into what reads them, v into o.
    return [(m.norm1, (m.q, m.k, m.v)), (m.v, m.o), (m.norm2, m.fc1)]


def _mlp_folds(m):
    return [(m.layers[0], m.layers[1]), (m.layers[1], m.layers[2])]


def _cases(block_type):
    rng = np.random.default_rng(5)
    # LayerNorm's elementwise weight carries the outlier features in LLMs.
    block = block_type(128, 256, jr.PRNGKey(6))
    block = eqx.tree_at(
        lambda b: (b.norm1.weight, b.norm2.weight),
        block,
        tuple(
            jnp.asarray(np.exp(1.5 * rng.standard_normal(128)), jnp.float32)
            for _ in range(2)
        ),
    )
    mlp = eqx.nn.MLP(128, 128, 256, depth=2, key=jr.PRNGKey(7))

    def data(seed, shape):
        x = _activations(math.prod(shape[:-1]), shape[-1], seed)
        return jnp.asarray(x.reshape(shape), jnp.float32)

    return {
        "mlp": (
            mlp,
            _mlp_folds,
            [data(10 + i, (256, 128)) for i in range(4)],
            data(20, (256, 128)),
        ),
        "block": (
            block,
            _block_folds,
            [data(30 + i, (8, 32, 128)) for i in range(4)],
            data(40, (8, 32, 128)),
        ),
    }


@pytest.mark.parametrize("name", ["mlp", "block"])
@pytest.mark.parametrize("bits", [4, 3])
def test_beats_round_to_nearest(name, bits, transformer_block):
    """On held-out inputs the model's output error is below round to nearest's on
    the same grid (`awq` with no pairs, `s = 1`); the margins are in quax-quant's
    README."""
    model, folds, calib, held_out = _cases(transformer_block)[name]
    want = _vmapped(model, held_out)
    errors = {}
    for label, fold in (("awq", folds), ("rtn", None)):
        out = qq.awq(
            model,
            calib,
            bits=bits,
            group_size=128,
            apply=_vmapped,
            fold=fold,
            progress=False,
        )
        y = quax.quaxify(_vmapped)(out, held_out)
        errors[label] = float(jnp.linalg.norm(y - want) / jnp.linalg.norm(want))
    print(f"awq {name} {bits} bits: {errors}")
    assert errors["awq"] < errors["rtn"], errors
