"""quax-lora benchmark: a LoRA MLP through `jit(quaxify(...))` against the same model
written by hand, against the materialised `(W + AB) x`, and its trace time against the
dense model. Times are medians over interleaved rounds, ratios medians of the
per-round ratios (see `run_times`); the script also checks that the quax and
hand-written programs have the same optimized HLO. Prints Markdown tables.

    python benchmarks/lora.py
"""

import random
import re
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import quax
import quax_lora


WIDTH, RANK, DEPTH = 2048, 8, 2
BATCHES = (1, 16, 256)
# Rounds of timing per batch (the small batches are the noisiest), and of tracing.
ROUNDS = {1: 301, 16: 301, 256: 101}
TRACE_ROUNDS = 101


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


def run_times(fns, model, xs, rounds):
    """The times of each compiled function in each of `rounds` rounds.

    All functions get the same arguments (the same buffers) and the same calling
    convention. Each round runs them in a fresh random order, and each timed call
    directly follows an untimed call of the same function, so that every timed call
    starts from the same cache state: its own weights warm. (With a fixed order, the
    call after the materialised program found the 32 MiB of weights evicted from
    the 32 MiB L3 cache by its 16 MiB temporaries, and the call after that found
    them warm: that alone made quax 1.3-1.5x slower than the hand-written program at
    batch 1, or 0.8x with the two swapped, for the same compiled program.)
    """
    compiled = []
    for fn in fns:
        closed, params = _closed(fn, model)
        c = jax.jit(closed).lower(params, xs).compile()
        jax.block_until_ready(c(params, xs))
        compiled.append((c, params))
    times = [[] for _ in fns]
    order = list(range(len(fns)))
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for i in order:
            c, params = compiled[i]
            jax.block_until_ready(c(params, xs))
            start = time.perf_counter()
            jax.block_until_ready(c(params, xs))
            times[i].append(time.perf_counter() - start)
    return times


def ratio(t1, t2):
    """The median over rounds of the ratio of two functions' times in the same
    round: paired, so that load that drifts between rounds cancels."""
    return statistics.median(a / b for a, b in zip(t1, t2, strict=True))


def optimized_hlo(fn, model, xs):
    """The optimized HLO of `jit(fn)`, without the metadata (source locations,
    op names) that differ between two programs computing the same thing."""
    closed, params = _closed(fn, model)
    text = jax.jit(closed).lower(params, xs).compile().as_text()
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    # Keep the computations; drop the module header and the stack-frame tables.
    return "\n".join(
        line for line in text.splitlines() if line.startswith(("%", "ENTRY", " ", "}"))
    )


def trace_times(fns, model_for, xs):
    """The times of `make_jaxpr` for each function, interleaved."""
    times = [[] for _ in fns]
    for _ in range(TRACE_ROUNDS):
        for i, fn in enumerate(fns):
            # A new function each time: no tracing cache hit.
            closed, params = _closed(fn, model_for[i])
            start = time.perf_counter()
            jax.make_jaxpr(closed)(params, xs)
            times[i].append(time.perf_counter() - start)
    return times


def main():
    mlp, lora = make_model()
    print(
        f"LoRA MLP: {DEPTH} layers of {WIDTH}x{WIDTH}, rank {RANK}, "
        f"{jax.devices()[0].platform}; medians of interleaved rounds"
    )
    print()
    print(
        "| batch | quax (ms) | hand-written (ms) | quax / hand "
        "| materialised (ms) | quax / materialised | same optimized HLO |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch in BATCHES:
        xs = jr.normal(jr.PRNGKey(2), (batch, WIDTH))
        same = optimized_hlo(quax_forward, lora, xs) == optimized_hlo(
            hand_forward, lora, xs
        )
        times = run_times(
            (quax_forward, hand_forward, materialised_forward), lora, xs, ROUNDS[batch]
        )
        t_quax, t_hand, t_mat = (1e3 * statistics.median(t) for t in times)
        print(
            f"| {batch} | {t_quax:.3f} | {t_hand:.3f} "
            f"| {ratio(times[0], times[1]):.3f}x "
            f"| {t_mat:.3f} | {ratio(times[0], times[2]):.3f}x "
            f"| {'yes' if same else 'no'} |"
        )
    xs = jr.normal(jr.PRNGKey(2), (16, WIDTH))
    traces = trace_times((quax_forward, dense_forward), (lora, mlp), xs)
    t_lora, t_dense = (1e3 * statistics.median(t) for t in traces)
    print()
    print("| trace time | quax LoRA (ms) | dense (ms) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| make_jaxpr, batch 16 | {t_lora:.2f} | {t_dense:.2f} "
        f"| {ratio(*traces):.2f}x |"
    )


if __name__ == "__main__":
    main()
