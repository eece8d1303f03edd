"""QLoRA in QLoRA's own format, and float8 inference with calibrated activations.

1. The frozen base weights of a small Equinox MLP become NF4 with double
   quantisation (bitsandbytes' 4-bit NormalFloat, blocks of 64, the block scales
   themselves int8): about 4.13 bits per weight. quax-lora's adapters train on top;
   the model's code is unchanged.
2. The same pretrained MLP with float8 (e4m3) weights and the float8 x float8
   product, whose activation scales `quax_quant.calibrate` fixes from sample
   batches instead of computing them on every call.

    python examples/quant_nf4.py
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax
import quax
import quax_lora
import quax_quant


def pretrained_and_targets(key, samples=256, width=128):
    """A 'pretrained' GELU MLP, inputs, and targets from the same MLP whose first
    layer moved by a rank-2 update: what a low-rank adapter can learn."""
    keys = jr.split(key, 4)
    mlp = eqx.nn.MLP(width, 8, 256, depth=2, activation=jax.nn.gelu, key=keys[0])
    inputs = jr.normal(keys[1], (samples, width))
    u = jr.normal(keys[2], (256, 2)) / 4
    v = jr.normal(keys[3], (2, width)) / 4
    moved = eqx.tree_at(lambda m: m.layers[0].weight, mlp, mlp.layers[0].weight + u @ v)
    return mlp, inputs, jax.vmap(moved)(inputs)


def forward(model, x):
    return quax.quaxify(lambda m, x: jax.vmap(m)(x))(model, x)


def main() -> dict[str, str]:
    pretrained, x, y = pretrained_and_targets(jr.PRNGKey(0))

    # 1. NF4 base weights with double quantisation, then LoRA adapters.
    base = quax_quant.quantise_model(pretrained, format="nf4", double_quant=True)
    memory = quax_quant.memory_report(base)
    weights = sum(layer.weight.size for layer in pretrained.layers)
    bits = 8 * memory.quantised_bytes / weights
    print(f"NF4 base weights: {memory} ({bits:.3f} bits per weight)")
    model = quax_lora.loraify(base, rank=8, alpha=16.0, key=jr.PRNGKey(1))
    params, frozen = eqx.partition(model, quax_lora.trainable_filter(model))
    optimiser = optax.adam(3e-3)

    def loss(params, frozen):
        return jnp.mean((forward(eqx.combine(params, frozen), x) - y) ** 2)

    @eqx.filter_jit
    def train(params, frozen, steps=150):
        """All the steps as one compiled `lax.scan`."""

        def one_step(carry, _):
            params, state = carry
            value, grads = jax.value_and_grad(loss)(params, frozen)
            updates, state = optimiser.update(grads, state)
            return (optax.apply_updates(params, updates), state), value

        carry = (params, optimiser.init(params))
        (params, _), losses = jax.lax.scan(one_step, carry, None, length=steps)
        return params, losses

    params, losses = train(params, frozen)
    print(f"QLoRA loss by step 0/50/100/149: {losses[::50].tolist()} {losses[-1]:.5f}")

    # 2. float8 weights, float8 x float8 products, calibrated activation scales.
    f8 = quax_quant.quantise_model(
        pretrained, format="float8_e4m3fn", axis=0, matmul="float8"
    )
    calibrated = quax_quant.calibrate(
        f8, [x[:64], x[64:128]], apply=lambda m, x: jax.vmap(m)(x)
    )
    reference = jax.vmap(pretrained)(x[128:])

    def error(model):
        out = eqx.filter_jit(forward)(model, x[128:])
        return float(jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference))

    per_call, static = error(f8), error(calibrated)
    print(
        f"float8 x float8 relative error: per-call scales {per_call:.4f}, "
        f"calibrated {static:.4f}"
    )
    return {
        "NF4 base weights": f"{bits:.3f} bits per weight ({memory.ratio:.3f}x float32)",
        "QLoRA loss": f"{losses[0]:.4f} -> {losses[-1]:.4f}",
        "float8 error (per-call / calibrated)": f"{per_call:.4f} / {static:.4f}",
    }


if __name__ == "__main__":
    print(main())
