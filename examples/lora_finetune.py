"""LoRA fine-tuning of a small Equinox model with optax, with quax-lora.

A "pretrained" MLP misses a synthetic regression task by a smooth shift. `loraify` puts
rank-4 adapters on every `eqx.nn.Linear`; the model's code is unchanged and runs inside
`quax.quaxify`, where `(w + s a b) x` is computed as `w x + s a (b x)`. Only the
adapters are trained: the base weights stay as they were.

Needs only `pip install quax-core quax-lora equinox optax tqdm`.

    python examples/lora_finetune.py
"""

import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax
import quax
import quax_lora
from tqdm import tqdm


STEPS = 300


def make_task(key, n=512, dim=32):
    """A 'pretrained' MLP, and targets it misses by a smooth shift of its inputs."""
    k1, k2, k3 = jr.split(key, 3)
    pretrained = eqx.nn.MLP(dim, 4, 128, depth=2, activation=jax.nn.gelu, key=k1)
    x = jr.normal(k2, (n, dim))
    shift = jr.normal(k3, (dim, 4)) / jnp.sqrt(dim)
    y = jax.vmap(pretrained)(x) + jnp.tanh(x @ shift)
    return pretrained, x, y


def main(out_dir: str | None = None) -> dict[str, str]:
    """Fine-tune the adapters; plot the loss to `out_dir/lora_finetune_loss.png` if
    given. Returns summary figures."""
    pretrained, x, y = make_task(jr.PRNGKey(0))
    model = quax_lora.loraify(pretrained, rank=4, alpha=8.0, key=jr.PRNGKey(1))
    count = quax_lora.count_parameters(model)
    print(f"trainable parameters: {count.trainable:,} of {count.total:,}")

    params, frozen = eqx.partition(model, quax_lora.trainable_filter(model))
    optimiser = optax.adam(3e-3)
    state = optimiser.init(params)

    def loss(params, x, y):
        model = eqx.combine(params, frozen)
        pred = quax.quaxify(lambda m, x: jax.vmap(m)(x))(model, x)
        return jnp.mean((pred - y) ** 2)

    @eqx.filter_jit
    def step(params, state):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = optimiser.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    losses = []
    with tqdm(range(STEPS), desc="LoRA fine-tuning", unit="step") as bar:
        for _ in bar:
            params, state, value = step(params, state)
            losses.append(float(value))
            bar.set_postfix(loss=f"{losses[-1]:.4f}")

    tuned = eqx.combine(params, frozen)
    # The base weights were never updated: only the adapters moved.
    base_unchanged = all(
        bool(jnp.array_equal(t.weight.w, p.weight))
        for t, p in zip(tuned.layers, pretrained.layers, strict=True)
    )
    predict = quax.quaxify(lambda m, x: jax.vmap(m)(x))
    merged = quax_lora.merge(tuned)
    merged_error = float(jnp.max(jnp.abs(jax.vmap(merged)(x) - predict(tuned, x))))
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; base weights unchanged")
    if out_dir is not None:
        _plot(losses, pathlib.Path(out_dir) / "lora_finetune_loss.png")
    return {
        "loss": f"{losses[0]:.4f} -> {losses[-1]:.4f} in {STEPS} steps",
        "trainable": f"{count.trainable:,} of {count.total:,} parameters",
        "base weights unchanged": str(base_unchanged),
        "max |merged - LoRA|": f"{merged_error:.1e}",
    }


def _plot(losses: list[float], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.semilogy(losses)
    ax.set_xlabel("step")
    ax.set_ylabel("mean squared error")
    ax.set_title("LoRA fine-tuning (adapters only)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    print(main())
