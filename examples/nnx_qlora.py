"""QLoRA on a Flax NNX transformer: NF4 base weights, LoRA adapters, NNX's idioms.

A small NNX model (an embedding, a block of attention and an MLP, a head) is
quantised to NF4 with double quantisation (QLoRA's format, by quax-quant), gets LoRA
adapters on every projection of its attention and MLPs (by quax-lora), and is trained
as any NNX model is: `nnx.Optimizer(model, optax.adam(...), wrt=nnx.LoRAParam)` keeps
state for the adapters' factors alone, `nnx.value_and_grad` differentiates them
alone, and `nnx.jit` compiles the step. The model's code is unchanged; `quax.quaxify`
runs it. Flax is a dependency of this example only, not of the families.

    python examples/nnx_qlora.py
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import quax
import quax_lora
import quax_quant
from flax import nnx


VOCAB, WIDTH, HEADS, HIDDEN, LENGTH, BLOCKS = 32, 64, 4, 128, 16, 1


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.attn = nnx.MultiHeadAttention(
            num_heads=HEADS, in_features=WIDTH, decode=False, rngs=rngs
        )
        self.up = nnx.Linear(WIDTH, HIDDEN, rngs=rngs)
        self.down = nnx.Linear(HIDDEN, WIDTH, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(x)
        return x + self.down(jax.nn.gelu(self.up(x)))


class Transformer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(BLOCKS)])
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_task(key: jax.Array, n: int = 32) -> tuple[jax.Array, jax.Array]:
    """Sequences whose next token is the current one plus one (mod VOCAB): a
    rule the 'pretrained' (random) model does not know."""
    tokens = jr.randint(key, (n, LENGTH), 0, VOCAB)
    return tokens, (tokens + 1) % VOCAB


def main() -> dict[str, str]:
    tokens, targets = make_task(jr.key(0))

    @nnx.jit
    def build() -> Transformer:
        # Built in one compiled program rather than op by op.
        pretrained = Transformer(nnx.Rngs(0))
        # 1. NF4 base weights (blocks of 64, their scales quantised again to 8
        #    bits), for the MLPs and the head (the default: every nnx.Linear).
        model = quax_quant.quantise_model(
            pretrained, format="nf4", block_size=64, double_quant=True
        )
        # 2. LoRA on the MLPs and the head (nnx.Linear) and on the attention's
        #    four projections (nnx.LinearGeneral, left in float32 here).
        return quax_lora.loraify(
            model,
            rank=8,
            alpha=16.0,
            filter=(nnx.Linear, nnx.LinearGeneral),
            key=jr.key(1),
        )

    model = build()
    count = quax_lora.count_parameters(model)
    print(f"trainable params: {count.trainable:,} of {count.total:,}")
    first = model.blocks[0].up.kernel
    assert quax_quant.is_quantised(first.w.get_value())
    base = [np.asarray(x) for x in jax.tree_util.tree_leaves(first.w.get_value())]

    # 3. NNX's idioms: the optimiser and the gradient see the factors alone.
    optimiser = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.LoRAParam)

    @nnx.jit
    def step(
        model: nnx.Module, optimiser: nnx.Optimizer
    ) -> tuple[jax.Array, jax.Array]:
        def loss(model: nnx.Module) -> tuple[jax.Array, jax.Array]:
            logits = quax.quaxify(model)(tokens)
            value = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            return value.mean(), jnp.mean(jnp.argmax(logits, -1) == targets)

        diff = nnx.DiffState(0, nnx.LoRAParam)
        (value, accuracy), grads = nnx.value_and_grad(loss, argnums=diff, has_aux=True)(
            model
        )
        optimiser.update(model, grads)
        return value, accuracy

    losses = []
    for i in range(50):
        value, accuracy = step(model, optimiser)
        losses.append(float(value))
        if i % 10 == 0 or i == 49:
            print(f"step {i:2d}  loss {losses[-1]:.4f}  accuracy {accuracy:.2f}")

    # The NF4 base weights were never trained: the same bits.
    after = jax.tree_util.tree_leaves(first.w.get_value())
    assert all(np.array_equal(x, y) for x, y in zip(base, after, strict=True))
    memory = quax_quant.memory_report(
        [layer.kernel.w.get_value() for b in model.blocks for layer in (b.up, b.down)]
    )
    return {
        "loss": f"{losses[0]:.4f} -> {losses[-1]:.4f}",
        "next-token accuracy": f"{float(accuracy):.2f} (before the last step)",
        "trainable": f"{count.trainable:,} of {count.total:,} parameters",
        "MLP base weights": (
            f"{memory.quantised_bytes / 1024:.1f} KiB NF4+scales vs "
            f"{memory.float_bytes / 1024:.1f} KiB float32 ({memory.ratio:.3f}x)"
        ),
    }


if __name__ == "__main__":
    print(main())
