"""LoftQ (quax-lora) on a quax-quant NF4 base: `loraify(init="loftq",
loftq_quantiser=...)` keeps quax-quant's `QuantisedArray` as the base, a QLoRA
model whose quantisation error is below the zero-initialised QLoRA's; and
quax-lora's own NF4 quantiser is bitsandbytes' (and quax-quant's)."""

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_lora
import quax_quant
from quax_lora._init_base_changing import NF4_LEVELS, loftq_quantise


OUT, IN, RANK = 64, 256, 16


def _weight():
    # A spectrum that decays, as trained weights' do, plus noise.
    u = np.linalg.qr(np.random.default_rng(0).standard_normal((OUT, OUT)))[0]
    v = np.linalg.qr(np.random.default_rng(1).standard_normal((IN, OUT)))[0]
    low = u * (0.9 ** np.arange(OUT)) @ v.T
    noise = 0.01 * np.random.default_rng(2).standard_normal((OUT, IN))
    return jnp.asarray(low + noise, jnp.float32)


def _nf4(w):
    return quax_quant.quantise(w, format="nf4", block_size=64, matmul="weight_only")


def test_the_nf4_levels_are_quax_quants():
    np.testing.assert_array_equal(NF4_LEVELS, quax_quant.NF4_CODE)


def test_quax_loras_nf4_quantiser_is_quax_quants():
    w = _weight()
    ours = loftq_quantise(w, 4, "nf4")
    theirs = _nf4(w).dequantise()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_loftq_on_a_quax_quant_nf4_base():
    w = _weight()
    layer = eqx.tree_at(
        lambda layer: layer.weight, eqx.nn.Linear(IN, OUT, key=jr.key(0)), w
    )
    ratios = []
    for iters in (1, 4):
        lora = quax_lora.loraify(
            layer,
            rank=RANK,
            alpha=float(RANK),
            init="loftq",
            loftq_iters=iters,
            loftq_quantiser=_nf4,
            key=jr.key(1),
        ).weight
        assert isinstance(lora.w, quax_quant.QuantisedArray)
        assert dict(lora.init_settings)["quantiser"] == "custom"
        base = np.asarray(lora.w.dequantise(), np.float64)
        update = np.asarray(lora.a, np.float64) @ np.asarray(lora.b, np.float64)
        # QLoRA's zero-initialised error against LoftQ's.
        qlora = np.linalg.norm(np.asarray(w) - np.asarray(_nf4(w).dequantise()))
        loftq = np.linalg.norm(np.asarray(w) - base - update)
        print(f"LoftQ, {iters} iteration(s): error ratio {loftq / qlora:.3f}")
        ratios.append(loftq / qlora)
        # The QLoRA model runs on the quantised base, never densified.
        x = jr.normal(jr.key(2), (3, IN))
        got = quax.quaxify(lambda layer, x: jnp.stack([layer(r) for r in x]))(
            eqx.tree_at(lambda m: m.weight, layer, lora), x
        )
        want = np.asarray(x, np.float64) @ (base + update).T + np.asarray(layer.bias)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # Measured 0.725 and 0.634 (2026-12-06, CPU): the low-rank part of the
    # quantisation error corrected, more of it with more alternations.
    assert ratios[0] < 0.8 and ratios[1] < ratios[0], ratios
