"""quax-lora benchmark: a LoRA MLP through `jit(quaxify(...))` against the same model
written by hand, against the materialised `(W + AB) x`, and its trace time against the
dense model. Ratios are measured in one run; prints a Markdown table.

    python benchmarks/lora.py
"""

import re
import time
from collections import Counter

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import quax
import quax_lora


WIDTH, RANK, DEPTH = 2048, 8, 2
BATCHES = (1, 16, 256)
REPEATS = 30


def make_model():
    mlp = eqx.nn.MLP(
        WIDTH, WIDTH, WIDTH, depth=DEPTH - 1, activation=jax.nn.gelu, key=jr.PRNGKey(0)
    )
    lora = quax_lora.loraify(mlp, rank=RANK, alpha=16.0, key=jr.PRNGKey(1))
    # A trained adapter: nonzero `b`.
    return mlp, jax.tree.map(
        lambda x: (
            eqx.tree_at(lambda lr: lr.b, x, 0.01 * jnp.ones_like(x.b))
            if quax_lora.is_lora(x)
            else x
        ),
        lora,
        is_leaf=quax_lora.is_lora,
    )


def quax_forward(model, xs):
    return quax.quaxify(lambda m, x: jax.vmap(m)(x))(model, xs)


def _layers(model):
    return [(lr.weight, lr.bias) for lr in model.layers]


def _mlp(layer):
    """The MLP's forward pass for one example, with `layer(w, h)` the product."""

    def forward(model, x):
        h = x
        for i, (w, bias) in enumerate(_layers(model)):
            h = layer(w, h) + bias
            if i < DEPTH - 1:
                h = jax.nn.gelu(h)
        return h

    return lambda model, xs: jax.vmap(forward, in_axes=(None, 0))(model, xs)


# `W x + s A (B x)`, written out.
hand_forward = _mlp(lambda w, h: w.w @ h + (w.scaling * w.a) @ (w.b @ h))
# `(W + s A B) x`: the adapter merged on every call.
materialised_forward = _mlp(lambda w, h: (w.w + w.scaling * (w.a @ w.b)) @ h)


def dense_forward(model, xs):
    return jax.vmap(model)(xs)


def _closed(fn, model):
    params, static = eqx.partition(model, eqx.is_array)
    return (lambda p, x: fn(eqx.combine(p, static), x)), params


def run_times(fns, model, xs):
    """The best of `REPEATS` runs of each compiled function, interleaved so that
    load on the machine affects them alike."""
    compiled = []
    for fn in fns:
        closed, params = _closed(fn, model)
        c = jax.jit(closed).lower(params, xs).compile()
        jax.block_until_ready(c(params, xs))
        compiled.append((c, params))
    best = [float("inf")] * len(fns)
    for _ in range(REPEATS):
        for i, (c, params) in enumerate(compiled):
            start = time.perf_counter()
            jax.block_until_ready(c(params, xs))
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def same_program(fn1, fn2, model, xs):
    """Whether two functions compile to the same XLA operations (a noise-free
    complement to the timings)."""
    counts = []
    for fn in (fn1, fn2):
        closed, params = _closed(fn, model)
        text = jax.jit(closed).lower(params, xs).compile().as_text()
        counts.append(sorted(Counter(re.findall(r"= \S+ (\w+)\(", text)).items()))
    return counts[0] == counts[1]


def trace_time(fn, model, xs):
    best = float("inf")
    for _ in range(REPEATS):
        closed, params = _closed(fn, model)  # a new function: no tracing cache hit
        start = time.perf_counter()
        jax.make_jaxpr(closed)(params, xs)
        best = min(best, time.perf_counter() - start)
    return best


def main():
    mlp, lora = make_model()
    print(
        f"LoRA MLP: {DEPTH} layers of {WIDTH}x{WIDTH}, rank {RANK}, "
        f"{jax.devices()[0].platform}"
    )
    print()
    print(
        "| batch | quax (ms) | hand-written (ms) | quax / hand "
        "| materialised (ms) | quax / materialised |"
    )
    print("|---|---|---|---|---|---|")
    for batch in BATCHES:
        xs = jr.normal(jr.PRNGKey(2), (batch, WIDTH))
        t_quax, t_hand, t_mat = run_times(
            (quax_forward, hand_forward, materialised_forward), lora, xs
        )
        print(
            f"| {batch} | {1e3 * t_quax:.3f} | {1e3 * t_hand:.3f} "
            f"| {t_quax / t_hand:.3f}x "
            f"| {1e3 * t_mat:.3f} | {t_quax / t_mat:.3f}x |"
        )
    xs = jr.normal(jr.PRNGKey(2), (16, WIDTH))
    same = same_program(quax_forward, hand_forward, lora, xs)
    print()
    print(
        "quax and hand-written compile to the same XLA operations: "
        f"{'yes' if same else 'no'}"
    )
    t_lora = trace_time(quax_forward, lora, xs)
    t_dense = trace_time(dense_forward, mlp, xs)
    print()
    print("| trace time | quax LoRA (ms) | dense (ms) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| make_jaxpr, batch 16 | {1e3 * t_lora:.2f} | {1e3 * t_dense:.2f} "
        f"| {t_lora / t_dense:.2f}x |"
    )


if __name__ == "__main__":
    main()
