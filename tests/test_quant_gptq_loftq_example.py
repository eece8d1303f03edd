"""`examples/quant_gptq_loftq.py`: GPTQ (quax-quant), then LoftQ (quax-lora) on
GPTQ's int4 weights, then fine-tuning. What it prints is checked here: GPTQ's
output error below round to nearest's, LoftQ's weight error below the
zero-initialised adapter's, the loss falling, the int4 base untouched; and the
pieces it rests on, against independent computations: its plain-JAX error path
against the quantised model run by quax, and `loraify(loftq_base=...)` on a real
GPTQ model against a NumPy SVD."""

import pathlib
import runpy

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
import quax_quant


EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples"
example = runpy.run_path(str(EXAMPLE / "quant_gptq_loftq.py"))
LINEARS = example["LINEARS"]


def _ratio(figure: str) -> float:
    """The ratio in a figure written `a / b (0.123x)`."""
    return float(figure.rsplit("(", 1)[1].removesuffix("x)"))


@pytest.mark.long_running
def test_the_example_shows_what_it_claims(tmp_path):
    figures = example["main"](steps=40, out_dir=str(tmp_path))
    # GPTQ's output error below round to nearest's on the same grid: for the
    # block, and for every layer quantised alone.
    assert _ratio(figures["output error GPTQ / RTN"]) < 0.8
    assert figures["layers where GPTQ beats RTN"] == f"{len(LINEARS)} of {len(LINEARS)}"
    gptq_error = float(figures["output error GPTQ / RTN"].split(" / ")[0])
    assert float(figures["output error GPTQ+LoftQ"]) < gptq_error
    # LoftQ's ||W - (Q + sBA)|| below QLoRA's zero-initialised ||W - Q||.
    assert _ratio(figures["weight error LoftQ / QLoRA"]) < 0.9
    # The loss falls by a margin; only the adapters trained.
    first, last = (float(x) for x in figures["loss"].split(" in ")[0].split(" -> "))
    assert last < 0.5 * first, figures["loss"]
    assert figures["int4 base unchanged"] == "True"
    trainable = int(figures["trainable"].split(" of ")[0].replace(",", ""))
    assert trainable == sum(
        example["RANK"] * (w.shape[0] + w.shape[1])
        for w in (
            layer(example["Block"](jr.key(0))).weight for layer in LINEARS.values()
        )
    )
    assert (tmp_path / "quant_gptq_loftq.png").stat().st_size > 0


@pytest.fixture(scope="module")
def models():
    pretrained, _, _ = eqx.filter_jit(example["make_task"])(jr.key(0))
    calibration = [example["sample_tokens"](seed, 16) for seed in (1, 2)]
    gptq = quax_quant.gptq(
        pretrained,
        calibration,
        bits=4,
        group_size=32,
        apply=example["run"],
        matmul="weight_only",
        progress=False,
    )
    return pretrained, gptq


def test_the_error_path_is_the_quantised_models(models):
    """The example measures errors in plain JAX on `dequantise()`d weights: the
    same outputs as the int4 model run through quax with weight-only products."""
    pretrained, gptq = models
    tokens = jnp.asarray(example["sample_tokens"](7, 4))
    run = example["run"]
    errors = example["output_errors"](pretrained, {"GPTQ": gptq}, tokens)["GPTQ"]
    reference = run(pretrained, tokens)
    with quax.track_materialisation() as report:
        out = eqx.filter_jit(quax.quaxify(run))(gptq, tokens)
    assert not report, str(report)
    want = float(jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference))
    np.testing.assert_allclose(float(errors["whole block"]), want, rtol=1e-4)


def test_loftq_on_a_gptq_model_against_numpy(models):
    """`loraify(init="loftq", loftq_base=gptq_model)`: each base is GPTQ's int4
    array, leaf for leaf, and `s B A` the rank-r SVD of `W - Q` in NumPy."""
    pretrained, gptq = models
    rank = 8
    qlora = quax_lora.loraify(
        pretrained,
        rank=rank,
        alpha=16.0,
        init="loftq",
        loftq_base=gptq,
        key=jr.key(3),
    )
    for layer in LINEARS.values():
        lora, q = layer(qlora).weight, layer(gptq).weight
        assert isinstance(lora.w, quax_quant.QuantisedArray)
        for x, y in zip(jax.tree.leaves(lora.w), jax.tree.leaves(q), strict=True):
            np.testing.assert_array_equal(x, y)
        w = np.asarray(layer(pretrained).weight, np.float64)
        residual = w - np.asarray(q.dequantise(), np.float64)
        u, s, vh = np.linalg.svd(residual, full_matrices=False)
        want = u[:, :rank] * s[:rank] @ vh[:rank]
        got = (16.0 / rank) * np.asarray(lora.a, np.float64) @ np.asarray(lora.b)
        np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max())


def test_loftq_base_refuses_an_awq_model():
    """AWQ folds `1 / s` into the layer before: its quantised weights approximate
    `W diag(s)`, not the model's `W`, and `loftq_base` says so."""
    mlp = eqx.nn.MLP(32, 8, 64, depth=2, key=jr.key(0))
    batches = [jr.normal(jr.key(1), (64, 32))]
    awq = quax_quant.awq(
        mlp,
        batches,
        bits=4,
        group_size=32,
        apply=lambda m, x: jax.vmap(m)(x),
        fold=lambda m: [(m.layers[0], m.layers[1])],
        progress=False,
    )
    with pytest.raises(ValueError, match=r"leaf at \.layers\[0\]\.bias differs"):
        quax_lora.loraify(mlp, rank=4, init="loftq", loftq_base=awq, key=jr.key(2))


def test_loftq_base_refuses_a_flax_nnx_model():
    from flax import nnx

    layer = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="Flax NNX module"):
        quax_lora.loraify(layer, rank=2, init="loftq", loftq_base=layer, key=jr.key(0))
