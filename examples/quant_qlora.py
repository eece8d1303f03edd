"""QLoRA with quax: fine-tune a small Equinox model whose base weights are int4.

Two independent families meet through quax only: quax-quant quantises the frozen
base weights (4 bits, one scale per group of 32 inputs), quax-lora adds the
trainable low-rank adapters. The model's code is unchanged; `quax.quaxify` runs it.

    python examples/quant_qlora.py
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax
import quax
import quax_lora
import quax_quant


def make_task(key, n=256, dim=64):
    """A synthetic regression task: a 'pretrained' MLP, and targets it misses."""
    k1, k2, k3 = jr.split(key, 3)
    pretrained = eqx.nn.MLP(dim, 8, 256, depth=2, activation=jax.nn.gelu, key=k1)
    x = jr.normal(k2, (n, dim))
    shift = 0.5 * jr.normal(k3, (dim, 8)) / jnp.sqrt(dim)
    y = jax.vmap(pretrained)(x) + jnp.tanh(x @ shift)
    return pretrained, x, y


def main() -> dict[str, str]:
    pretrained, x, y = make_task(jr.PRNGKey(0))

    # 1. Int4 base weights, then LoRA adapters on every Linear layer: each weight
    # becomes a LoraArray over a QuantisedArray. (Loraifying first and then
    # quantising the adapters' base weights, with `filter=quax_lora.is_lora,
    # attribute="w"`, builds the same model.)
    model = quax_quant.quantise_model(pretrained, bits=4, group_size=32)
    model = quax_lora.loraify(model, rank=8, alpha=16.0, key=jr.PRNGKey(1))
    count = quax_lora.count_parameters(model)
    memory = quax_quant.memory_report(model)
    # The quantised base weights count by their shapes, as frozen parameters.
    total = count.total
    print(f"trainable params: {count.trainable:,} of {total:,}")
    print(f"base weights: {memory}")

    # 2. Train the adapters only.
    params, frozen = eqx.partition(model, quax_lora.trainable_filter(model))
    optimiser = optax.adam(3e-3)
    state = optimiser.init(params)

    def loss(params, frozen, x, y):
        model = eqx.combine(params, frozen)
        pred = quax.quaxify(lambda m, x: jax.vmap(m)(x))(model, x)
        return jnp.mean((pred - y) ** 2)

    @eqx.filter_jit
    def step(params, state, frozen, x, y):
        value, grads = jax.value_and_grad(loss)(params, frozen, x, y)
        updates, state = optimiser.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    losses = []
    for i in range(200):
        params, state, value = step(params, state, frozen, x, y)
        losses.append(float(value))
        if i % 50 == 0 or i == 199:
            print(f"step {i:3d}  loss {value:.5f}")

    tuned = eqx.combine(params, frozen)
    # The base weights are still int4 and were never trained.
    assert all(quax_quant.is_quantised(layer.weight.w) for layer in tuned.layers)
    return {
        "loss": f"{losses[0]:.4f} -> {losses[-1]:.4f}",
        "trainable": f"{count.trainable:,} of {total:,} parameters",
        "base weight memory": (
            f"{memory.quantised_bytes / 1024:.1f} KiB int4+scales vs "
            f"{memory.float_bytes / 1024:.1f} KiB float32 ({memory.ratio:.3f}x)"
        ),
    }


if __name__ == "__main__":
    print(main())
