"""quax-lora benchmark: a LoRA MLP through `jit(quaxify(...))` against the same model
written by hand, against the materialised `(W + AB) x`, and its trace time against the
dense model. Times are medians over interleaved rounds, ratios medians of the
per-round ratios (see `run_times`); the script also checks that the quax and
hand-written programs have the same optimized HLO. Prints Markdown tables, writes
`docs/images/lora_forward.png` and returns the figures.

    python benchmarks/lora.py [--quick]
"""

import argparse
import pathlib
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
# Rounds of timing per batch (the small batches are the noisiest), and of tracing;
# `quick` divides them by 10.
ROUNDS = {1: 301, 16: 301, 256: 101}
TRACE_ROUNDS = 101
IMAGES = pathlib.Path(__file__).resolve().parents[1] / "docs" / "images"


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
    calls = []
    for fn in fns:
        closed, params = _closed(fn, model)
        c = jax.jit(closed).lower(params, xs).compile()
        calls.append(lambda c=c, params=params: c(params, xs))
    return interleaved_times(calls, rounds)


def interleaved_times(calls, rounds):
    """The times of each of `calls` (functions of no argument, compiled) in each of
    `rounds` rounds: each round in a fresh random order, each timed call right
    after an untimed call of the same function (see `run_times`)."""
    for call in calls:
        jax.block_until_ready(call())
    times = [[] for _ in calls]
    order = list(range(len(calls)))
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for i in order:
            jax.block_until_ready(calls[i]())
            start = time.perf_counter()
            jax.block_until_ready(calls[i]())
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
    assert text is not None
    if text is None:
        raise RuntimeError("this backend gives no optimized HLO text")
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    # Keep the computations; drop the module header and the stack-frame tables.
    return "\n".join(
        line for line in text.splitlines() if line.startswith(("%", "ENTRY", " ", "}"))
    )


def trace_times(fns, model_for, xs, rounds):
    """The times of `make_jaxpr` for each function, interleaved."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            # A new function each time: no tracing cache hit.
            closed, params = _closed(fn, model_for[i])
            start = time.perf_counter()
            jax.make_jaxpr(closed)(params, xs)
            times[i].append(time.perf_counter() - start)
    return times


def _plot(rows) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=80)
    batches = [r["batch"] for r in rows]
    for key, style, label in [
        ("quax_ms", "o-", "quax LoRA: W x + A (B x)"),
        ("hand_ms", "s:", "hand-written W x + A (B x)"),
        ("materialised_ms", "^--", "materialised (W + A B) x"),
    ]:
        ax.loglog(batches, [r[key] for r in rows], style, label=label, markersize=4)
    ax.set_xlabel("batch")
    ax.set_ylabel("ms per forward pass")
    ax.set_title(f"LoRA MLP, {DEPTH} layers of {WIDTH}x{WIDTH}, rank {RANK}, jit, CPU")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    path = IMAGES / "lora_forward.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def main(quick: bool = False) -> dict:
    """Print the tables, draw the plot, and return the figures: per batch the
    median times (ms) and the ratios, and the trace times."""
    scale = 10 if quick else 1
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
    rows = []
    for batch in BATCHES:
        xs = jr.normal(jr.PRNGKey(2), (batch, WIDTH))
        same = optimized_hlo(quax_forward, lora, xs) == optimized_hlo(
            hand_forward, lora, xs
        )
        times = run_times(
            (quax_forward, hand_forward, materialised_forward),
            lora,
            xs,
            ROUNDS[batch] // scale,
        )
        t_quax, t_hand, t_mat = (1e3 * statistics.median(t) for t in times)
        row = {
            "batch": batch,
            "quax_ms": t_quax,
            "hand_ms": t_hand,
            "materialised_ms": t_mat,
            "quax/hand": ratio(times[0], times[1]),
            "quax/materialised": ratio(times[0], times[2]),
            "same optimized HLO": same,
        }
        rows.append(row)
        print(
            f"| {batch} | {t_quax:.3f} | {t_hand:.3f} "
            f"| {row['quax/hand']:.3f}x "
            f"| {t_mat:.3f} | {row['quax/materialised']:.3f}x "
            f"| {'yes' if same else 'no'} |"
        )
    xs = jr.normal(jr.PRNGKey(2), (16, WIDTH))
    traces = trace_times(
        (quax_forward, dense_forward), (lora, mlp), xs, TRACE_ROUNDS // scale
    )
    t_lora, t_dense = (1e3 * statistics.median(t) for t in traces)
    trace = {
        "quax_ms": t_lora,
        "dense_ms": t_dense,
        "quax/dense": ratio(*traces),
    }
    print()
    print("| trace time | quax LoRA (ms) | dense (ms) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| make_jaxpr, batch 16 | {t_lora:.2f} | {t_dense:.2f} "
        f"| {trace['quax/dense']:.2f}x |"
    )
    print(f"\nplot: {_plot(rows).relative_to(IMAGES.parents[1])}")
    return {
        "width": WIDTH,
        "rank": RANK,
        "depth": DEPTH,
        "forward": rows,
        "trace (batch 16)": trace,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="quax-lora benchmark")
    parser.add_argument("--quick", action="store_true", help="a tenth of the rounds")
    main(parser.parse_args().quick)
