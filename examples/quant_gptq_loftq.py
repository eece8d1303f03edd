"""GPTQ, then LoftQ, then fine-tuning: a QLoRA pipeline on a small transformer, in JAX.

A small Equinox transformer block (a token embedding, `eqx.nn.MultiheadAttention`, an
MLP, layer norms and a head; 34k parameters) stands in for a pretrained model. Three
steps, each by one call, with the model's code unchanged (`quax.quaxify` runs it):

1. quax-quant's `gptq` quantises its seven linear layers to int4, one scale and zero
   point per group of 32 inputs, from a few calibration batches run through the model.
   Round to nearest on the same grid (`quantise(..., symmetric=False)`) is the
   baseline: the block's output error with each layer alone quantised, and with all
   of them, for both.
2. quax-lora's `loraify(..., init="loftq", loftq_base=gptq_model)` starts rank-8
   adapters on GPTQ's int4 weights at the best rank-8 correction of their error,
   the SVD of `W - Q`: `||W - (Q + s B A)||` against QLoRA's zero-initialised
   `||W - Q||`.
3. optax's Adam trains the adapters alone on a shifted task; the int4 base stays as
   GPTQ left it.

Every linear layer is 64 x 64, so that the programs GPTQ and LoftQ compile for
each weight shape compile once. Needs `pip install quax-core quax-quant quax-lora
equinox optax` (and matplotlib for the plot).

    python examples/quant_gptq_loftq.py [--steps N] [--out DIR]
"""

import argparse
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import quax
import quax_lora
import quax_quant


VOCAB, LENGTH, WIDTH, HEADS, HIDDEN, OUTPUTS = 64, 16, 64, 4, 64, 64
BITS, GROUP, RANK = 4, 32, 8
STEPS = 60

# Every linear layer, in the order the block runs them (and `gptq` visits them).
LINEARS = {
    "query": lambda m: m.attention.query_proj,
    "key": lambda m: m.attention.key_proj,
    "value": lambda m: m.attention.value_proj,
    "attention out": lambda m: m.attention.output_proj,
    "MLP in": lambda m: m.mlp_in,
    "MLP out": lambda m: m.mlp_out,
    "head": lambda m: m.head,
}


class Block(eqx.Module):
    """A pre-norm transformer block with a token embedding and a linear head,
    mapping `LENGTH` tokens to `LENGTH` vectors of `OUTPUTS` numbers."""

    embedding: eqx.nn.Embedding
    positions: jax.Array
    norm1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    mlp_in: eqx.nn.Linear
    mlp_out: eqx.nn.Linear
    head: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        keys = jr.split(key, 8)
        # A stand-in for pretrained weights: trained embeddings have a decaying
        # spectrum and trained layer norms uneven gains, which make the linear
        # layers' inputs correlated and of unequal magnitudes (as GPTQ expects
        # them; with independent features it has no error to spread).
        spectrum = 0.9 ** jnp.arange(WIDTH)
        mixing = jr.normal(keys[0], (WIDTH, WIDTH)) / WIDTH**0.5
        table = (jr.normal(keys[1], (VOCAB, WIDTH)) * spectrum) @ mixing
        self.embedding = eqx.nn.Embedding(weight=table)
        self.positions = 0.1 * jr.normal(keys[2], (LENGTH, WIDTH))
        self.norm1, self.norm2 = (
            eqx.tree_at(
                lambda n: n.weight,
                eqx.nn.LayerNorm(WIDTH),
                jnp.exp(0.5 * jr.normal(k, (WIDTH,))),
            )
            for k in keys[3:5]
        )
        self.attention = eqx.nn.MultiheadAttention(HEADS, WIDTH, key=keys[5])
        self.mlp_in = eqx.nn.Linear(WIDTH, HIDDEN, key=keys[6])
        self.mlp_out, self.head = (
            eqx.nn.Linear(HIDDEN, WIDTH, key=keys[7]),
            eqx.nn.Linear(WIDTH, OUTPUTS, key=jr.fold_in(keys[7], 1)),
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = jax.vmap(self.embedding)(tokens) + self.positions
        h = jax.vmap(self.norm1)(x)
        x = x + self.attention(h, h, h)
        h = jax.vmap(self.norm2)(x)
        x = x + jax.vmap(self.mlp_out)(jax.nn.gelu(jax.vmap(self.mlp_in)(h)))
        return jax.vmap(self.head)(x)


def run(model: Block, tokens: jax.Array) -> jax.Array:
    """The block on a batch of token sequences `(batch, LENGTH)`."""
    return jax.vmap(model)(tokens)


def sample_tokens(seed: int, n: int) -> np.ndarray:
    """`n` sequences of tokens drawn with Zipf-like frequencies, as text's are
    (by NumPy: no program to compile for each shape)."""
    frequencies = 1 / (1 + np.arange(VOCAB)) ** 1.2
    rng = np.random.default_rng(seed)
    return rng.choice(VOCAB, size=(n, LENGTH), p=frequencies / frequencies.sum())


def make_task(key: jax.Array, n: int = 128) -> tuple[Block, jax.Array, jax.Array]:
    """The 'pretrained' block, and a task it misses: its own outputs shifted by a
    function of each token."""
    k1, k2 = jr.split(key)
    pretrained = Block(k1)
    tokens = jnp.asarray(sample_tokens(0, n))
    shift = jnp.tanh(jax.nn.one_hot(tokens, VOCAB) @ jr.normal(k2, (VOCAB, OUTPUTS)))
    return pretrained, tokens, run(pretrained, tokens) + 0.5 * shift


def float_weight(weight: quax_quant.QuantisedArray | quax_lora.LoraArray) -> jax.Array:
    """A quantised weight's `Q` (`dequantise()`), or a LoRA layer's `Q + s B A`,
    as a float array: the weight-only products use exactly these numbers."""
    if isinstance(weight, quax_lora.LoraArray):
        base = weight.w  # QLoRA: the quantised base under the adapter
        assert isinstance(base, quax_quant.QuantisedArray)
        return base.dequantise() + weight.scaling * weight.a @ weight.b
    return weight.dequantise()


@eqx.filter_jit
def output_errors(
    pretrained: Block, models: dict[str, Block], tokens: jax.Array
) -> dict[str, dict[str, jax.Array]]:
    """For each of `models`, the block's relative output error `|out - out_float|
    / |out_float|` on `tokens` with each layer alone computing as that model's
    does, and with all of them: in plain JAX on the float weights of
    `float_weight`, all in one compiled program."""
    reference = run(pretrained, tokens)

    def error(model: Block, names: tuple[str, ...]) -> jax.Array:
        changed = pretrained
        for name in names:
            layer = LINEARS[name]
            weight = float_weight(layer(model).weight)
            changed = eqx.tree_at(
                lambda m, layer=layer: layer(m).weight, changed, weight
            )
        out = run(changed, tokens)
        return jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference)

    return {
        label: {name: error(model, (name,)) for name in LINEARS}
        | {"whole block": error(model, tuple(LINEARS))}
        for label, model in models.items()
    }


def weight_error(pretrained: Block, model: Block) -> float:
    """`||W - W'||` over every linear layer (Frobenius), `W'` the float weight
    of `model`'s layer (`float_weight`), in float64."""
    total = 0.0
    for layer in LINEARS.values():
        w = np.asarray(layer(pretrained).weight, np.float64)
        total += np.sum((w - np.asarray(float_weight(layer(model).weight))) ** 2)
    return float(np.sqrt(total))


def main(steps: int = STEPS, out_dir: str | None = None) -> dict[str, str]:
    """Quantise with GPTQ and with round to nearest, LoftQ-initialise adapters on
    GPTQ's weights, fine-tune them for `steps` Adam steps; plot to
    `out_dir/quant_gptq_loftq.png` if given. Returns summary figures."""
    # Built in one compiled program rather than op by op.
    pretrained, tokens, targets = eqx.filter_jit(make_task)(jr.key(0))
    parameters = sum(
        x.size for x in jax.tree.leaves(eqx.filter(pretrained, eqx.is_array))
    )
    print(f"a transformer block of {parameters:,} parameters")

    # 1. GPTQ from 4 calibration batches, and round to nearest on GPTQ's grid
    # (asymmetric, min-max with the range holding 0). Products "weight_only":
    # the weights' error alone, with no rounding of the activations.
    calibration = [sample_tokens(seed, 32) for seed in (1, 2, 3, 4)]
    gptq_model = quax_quant.gptq(
        pretrained,
        calibration,
        bits=BITS,
        group_size=GROUP,
        apply=run,
        matmul="weight_only",
        progress=False,
    )
    rtn_model = quax_quant.quantise_model(
        pretrained, bits=BITS, group_size=GROUP, symmetric=False, matmul="weight_only"
    )

    # 2. LoftQ on GPTQ's int4 weights: each adapter starts at the rank-8 SVD of
    # W - Q, Q as GPTQ left it (QLoRA's own adapters start at zero).
    qlora = quax_lora.loraify(
        pretrained,
        rank=RANK,
        alpha=float(RANK),
        init="loftq",
        loftq_base=gptq_model,
        key=jr.key(3),
    )

    held_out = jnp.asarray(sample_tokens(5, 64))
    models = {"GPTQ": gptq_model, "RTN": rtn_model, "GPTQ+LoftQ": qlora}
    errors = jax.tree.map(float, output_errors(pretrained, models, held_out))
    print("output error on held-out tokens (relative), layers quantised alone:")
    print(f"  {'layer':<14} {'GPTQ':>8} {'RTN':>8} {'GPTQ/RTN':>9} {'GPTQ+LoftQ':>11}")
    for name in [*LINEARS, "whole block"]:
        g, r, lq = (errors[label][name] for label in models)
        print(f"  {name:<14} {g:8.5f} {r:8.5f} {g / r:9.3f} {lq:11.5f}")
    loftq_error = weight_error(pretrained, qlora)
    zero_error = weight_error(pretrained, gptq_model)
    print(
        f"||W - (Q + sBA)|| = {loftq_error:.4f} (LoftQ) against ||W - Q|| = "
        f"{zero_error:.4f} (QLoRA, b = 0): {loftq_error / zero_error:.3f}x"
    )

    # 3. Fine-tune the adapters alone on the shifted task, on the int4 weights.
    params, frozen = eqx.partition(qlora, quax_lora.trainable_filter(qlora))
    optimiser = optax.adam(1e-2)
    state = optimiser.init(params)

    def loss(params, frozen):
        model = eqx.combine(params, frozen)
        return jnp.mean((quax.quaxify(run)(model, tokens) - targets) ** 2)

    @eqx.filter_jit
    def step(params, state, frozen):
        value, grads = jax.value_and_grad(loss)(params, frozen)
        updates, state = optimiser.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    losses = []
    for i in range(steps):
        params, state, value = step(params, state, frozen)
        losses.append(float(value))
        if i % 15 == 0 or i == steps - 1:
            print(f"step {i:4d}  loss {losses[-1]:.5f}")

    tuned = eqx.combine(params, frozen)
    # The base weights are GPTQ's int4 arrays, untouched by training.
    base_unchanged = all(
        isinstance(layer(tuned).weight.w, quax_quant.QuantisedArray)
        and all(
            bool(jnp.array_equal(x, y))
            for x, y in zip(
                jax.tree.leaves(layer(tuned).weight.w),
                jax.tree.leaves(layer(gptq_model).weight),
                strict=True,
            )
        )
        for layer in LINEARS.values()
    )
    count = quax_lora.count_parameters(tuned)
    if out_dir is not None:
        _plot(errors, losses, pathlib.Path(out_dir) / "quant_gptq_loftq.png")
    g, r = errors["GPTQ"]["whole block"], errors["RTN"]["whole block"]
    lq = errors["GPTQ+LoftQ"]["whole block"]
    return {
        "output error GPTQ / RTN": f"{g:.5f} / {r:.5f} ({g / r:.3f}x)",
        "layers where GPTQ beats RTN": (
            f"{sum(errors['GPTQ'][n] < errors['RTN'][n] for n in LINEARS)} of "
            f"{len(LINEARS)}"
        ),
        "output error GPTQ+LoftQ": f"{lq:.5f}",
        "weight error LoftQ / QLoRA": (
            f"{loftq_error:.4f} / {zero_error:.4f} ({loftq_error / zero_error:.3f}x)"
        ),
        "loss": f"{losses[0]:.5f} -> {losses[-1]:.5f} in {steps} steps",
        "trainable": f"{count.trainable:,} of {count.total:,} parameters",
        "int4 base unchanged": str(base_unchanged),
    }


def _plot(
    errors: dict[str, dict[str, float]], losses: list[float], path: pathlib.Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [*LINEARS, "whole block"]
    x = np.arange(len(names))
    for i, (label, shown) in enumerate(
        [("RTN", "round to nearest"), ("GPTQ", "GPTQ"), ("GPTQ+LoftQ", "GPTQ + LoftQ")]
    ):
        heights = [errors[label][n] for n in names]
        left.bar(x + 0.27 * (i - 1), heights, 0.27, label=shown)
    left.set_xticks(x, names, rotation=30, ha="right")
    left.set_ylabel("relative output error")
    left.set_title(f"int{BITS}, groups of {GROUP}: layers quantised alone, and all")
    left.legend()
    right.semilogy(losses)
    right.set_xlabel("step")
    right.set_ylabel("mean squared error")
    right.set_title(f"fine-tuning rank-{RANK} LoftQ adapters on GPTQ's int4")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=STEPS, help="Adam steps")
    parser.add_argument("--out", default=None, help="folder for the plot")
    arguments = parser.parse_args()
    print(main(arguments.steps, arguments.out))
