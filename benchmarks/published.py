"""Side by side with the published quax 0.4.6, on the workloads that both can run:

- LoRA: an MLP with rank-8 adapters, its `jit(quaxify(...))` forward pass against
  the same model written by hand in plain JAX (`W x + a (b x) + bias` per layer), and
  its trace time (`make_jaxpr`, a fresh function each time) against the same Equinox
  code on the dense model;
- sparse matrix-vector products: a 1% dense `BCOO` times a vector, against the dense
  product (the published `BCOO` has no rule for `dot_general` and refuses; it is timed
  again after `.enable_materialise()`, so densified on every call);
- the tridiagonal matrix-vector product, over sizes, against the hand-written product.

The workloads use only the published quax's API (`quax.quaxify`,
`quax.examples.lora`, `quax.examples.sparse.BCOO`,
`quax.examples.structured_matrices.TridiagonalMatrix`), which quax-core provides under
the same names, so the same `measure()` runs in both environments: in this process for
ours, and in the published quax's own environment (both are imported as `quax`) for
theirs. Within each process the quax programs and the plain ones run in interleaved
rounds (a random order each round, each timed call right after an untimed call of the
same program) and the ratios are medians of per-round ratios. Across the two processes
only the plain programs, identical in both, relate the times: `ours / published` is
`(ours / plain) / (published / plain)`.

    python benchmarks/published.py [--quick]          # both sides, one table
    python benchmarks/published.py --measure [--quick]  # this environment, as JSON

The published side needs `QUAX_PUBLISHED_PYTHON`: the interpreter of an environment
with `quax==0.4.6` (`benchmarks/run.py` builds one from
`benchmarks/published-requirements.txt` and sets it).
"""

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
from quax.examples import lora, sparse, structured_matrices


# Sizes by `quick`.
WIDTH = {True: 512, False: 1024}
SPARSE_N = {True: 2048, False: 4096}
TRIDIAGONAL_N = {True: (1_000, 100_000), False: (1_000, 10_000, 1_000_000)}
ROUNDS = {True: 25, False: 151}
LORA_RANK, LORA_BATCH, DENSITY = 8, 16, 0.01
IMAGES = pathlib.Path(__file__).resolve().parents[1] / "docs" / "images"


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, Any]:
    """Median milliseconds of each function and the median per-round ratio of each
    to `fns["plain"]`."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            jax.block_until_ready(fns[name]())
            start = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - start)
    out: dict[str, Any] = {
        f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()
    }
    for name in fns:
        if name != "plain":
            pairs = zip(times[name], times["plain"], strict=True)
            out[f"{name}/plain"] = statistics.median(a / b for a, b in pairs)
    return out


def _hand_written(layers: list[tuple[Any, ...]], xs: Any) -> Any:
    """The LoRA MLP in plain JAX, written per example as `eqx.nn.Linear` is:
    `W x + a (b x) + bias` per layer, `relu` between."""

    def forward(x: Any) -> Any:
        for i, (w, a, b, bias) in enumerate(layers):
            x = w @ x + a @ (b @ x) + bias
            if i < len(layers) - 1:
                x = jax.nn.relu(x)
        return x

    return jax.vmap(forward)(xs)


def _lora_workload(width: int, rounds: int) -> dict[str, dict[str, Any]]:
    mlp = eqx.nn.MLP(width, width, width, depth=1, key=jr.PRNGKey(0))
    adapted = lora.loraify(mlp, rank=LORA_RANK, key=jr.PRNGKey(1))
    # A trained adapter: a nonzero `b`.
    adapted = jax.tree.map(
        lambda x: (
            eqx.tree_at(lambda w: w.b, x, jnp.full_like(x.b, 0.01))
            if isinstance(x, lora.LoraArray)
            else x
        ),
        adapted,
        is_leaf=lambda x: isinstance(x, lora.LoraArray),
    )
    # The adapted weights as plain arrays (`.w`, `.a`, `.b` in both quaxes; no
    # scaling in either without `alpha`).
    layers = [(x.weight.w, x.weight.a, x.weight.b, x.bias) for x in adapted.layers]
    xs = jr.normal(jr.PRNGKey(2), (LORA_BATCH, width))
    # The model's arrays as the arguments, the rest closed over: no per-call
    # flattening of the whole model as `eqx.filter_jit` would do.
    params, static = eqx.partition(adapted, eqx.is_array)
    dense_params, dense_static = eqx.partition(mlp, eqx.is_array)

    def quax_program():
        return quax.quaxify(lambda p, x: jax.vmap(eqx.combine(p, static))(x))

    def dense_program():
        return lambda p, x: jax.vmap(eqx.combine(p, dense_static))(x)

    quax_fn, plain_fn = jax.jit(quax_program()), jax.jit(_hand_written)
    error = jnp.max(jnp.abs(quax_fn(params, xs) - plain_fn(layers, xs)))
    if not error <= 1e-3 * jnp.max(jnp.abs(plain_fn(layers, xs))):
        raise AssertionError(f"the quax and hand-written LoRA MLPs differ by {error}")
    forward = interleaved(
        {"quax": lambda: quax_fn(params, xs), "plain": lambda: plain_fn(layers, xs)},
        rounds,
    )
    # Tracing: the same Equinox code on the dense model is the plain program. A
    # fresh function each time, so that JAX's tracing cache never answers.
    tracing = interleaved(
        {
            "quax": lambda: jax.make_jaxpr(quax_program())(params, xs),
            "plain": lambda: jax.make_jaxpr(dense_program())(dense_params, xs),
        },
        max(5, rounds // 5),
    )
    return {
        f"LoRA MLP {width}x{width}x2, rank {LORA_RANK}, batch {LORA_BATCH}": forward,
        f"LoRA MLP {width}x{width}x2: make_jaxpr": tracing,
    }


def _sparse_workload(n: int, rounds: int) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(0)
    flat = np.unique(rng.integers(0, n * n, int(DENSITY * n * n), dtype=np.int64))
    indices = jnp.asarray(np.stack(np.divmod(flat, n), -1).astype(np.int32))
    data = jnp.asarray(rng.normal(size=flat.size).astype(np.float32))
    dense = jnp.zeros((n, n), jnp.float32).at[indices[:, 0], indices[:, 1]].set(data)
    v = jnp.asarray(rng.normal(size=n).astype(np.float32))
    matrix = sparse.BCOO(data, indices, (n, n))
    quax_fn = jax.jit(quax.quaxify(lambda a, x: a @ x))
    figures: dict[str, Any] = {}
    try:
        jax.block_until_ready(quax_fn(matrix, v))
    except RuntimeError as e:
        if "Refusing to materialise" not in str(e):
            raise
        figures["refused"] = str(e).splitlines()[0]
        matrix = matrix.enable_materialise()
    plain_fn = jax.jit(lambda a, x: a @ x)
    figures |= interleaved(
        {"quax": lambda: quax_fn(matrix, v), "plain": lambda: plain_fn(dense, v)},
        rounds,
    )
    return {f"sparse matvec {n}x{n}, 1% stored": figures}


def _tridiagonal_matvec(lower, main, upper, v):
    return (main * v).at[:-1].add(upper * v[1:]).at[1:].add(lower * v[:-1])


def _tridiagonal_workload(n: int, rounds: int) -> dict[str, dict[str, Any]]:
    main, v = jr.normal(jr.PRNGKey(n), (2, n))
    lower, upper = jr.normal(jr.PRNGKey(-n), (2, n - 1))
    matrix = structured_matrices.TridiagonalMatrix(lower, main, upper)
    quax_fn = jax.jit(quax.quaxify(lambda a, x: a @ x))
    plain_fn = jax.jit(_tridiagonal_matvec)
    times = interleaved(
        {
            "quax": lambda: quax_fn(matrix, v),
            "plain": lambda: plain_fn(lower, main, upper, v),
        },
        rounds,
    )
    return {f"tridiagonal matvec n={n:,}": times}


def measure(quick: bool = False) -> dict[str, Any]:
    """This environment's figures: per workload, the median times (ms) of the quax
    program and the plain one, and their ratio; `refused` holds the first line of a
    refusal to run without materialising."""
    rounds = ROUNDS[quick]
    return {
        "quax": quax.__version__,
        "jax": jax.__version__,
        "load": os.getloadavg()[0],
        "workloads": _lora_workload(WIDTH[quick], rounds)
        | _sparse_workload(SPARSE_N[quick], rounds)
        | {
            name: times
            for n in TRIDIAGONAL_N[quick]
            for name, times in _tridiagonal_workload(n, rounds).items()
        },
    }


def measure_published(python: str, quick: bool) -> dict[str, Any]:
    """`measure()` run by the interpreter `python` (the published quax's)."""
    command = [python, __file__, "--measure"] + (["--quick"] if quick else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the published side failed (exit {done.returncode}):\n"
            + done.stderr[-3000:]
        )
    return json.loads(done.stdout.splitlines()[-1])


def side_by_side(ours: dict[str, Any], theirs: dict[str, Any] | None) -> dict:
    """One row per workload: both sides' times, the plain time, and the ratios."""
    rows = {}
    for name, mine in ours["workloads"].items():
        row = {
            "ours_ms": mine["quax_ms"],
            "plain_ms": mine["plain_ms"],
            "ours/plain": mine["quax/plain"],
        }
        other = (theirs or {}).get("workloads", {}).get(name)
        if other is not None:
            row["published_ms"] = other["quax_ms"]
            row["published plain_ms"] = other["plain_ms"]
            row["published/plain"] = other["quax/plain"]
            row["ours/published"] = mine["quax/plain"] / other["quax/plain"]
            if "refused" in other:
                row["published refused"] = other["refused"]
        rows[name] = row
    return rows


def _print_table(rows: dict, ours: dict, theirs: dict | None) -> None:
    print(
        f"\nquax-core {ours['quax']} against the published quax "
        f"{theirs['quax'] if theirs else '(not measured)'}; JAX {ours['jax']}, "
        f"{jax.devices()[0].platform}; load {ours['load']:.1f}"
        + (f" / {theirs['load']:.1f}" if theirs else "")
        + "\n"
    )
    print(
        "| workload | ours (ms) | published (ms) | plain (ms) | ours / plain "
        "| published / plain | ours / published |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        pub = f"{r['published_ms']:.3f}" if "published_ms" in r else "-"
        if "published refused" in r:
            pub += " (refuses; timed materialising)"
        print(
            f"| {name} | {r['ours_ms']:.3f} | {pub} | {r['plain_ms']:.3f} "
            f"| {r['ours/plain']:.2f}x | "
            + (
                f"{r['published/plain']:.2f}x | {r['ours/published']:.2f}x |"
                if "published/plain" in r
                else "- | - |"
            )
        )
    refusals = {
        r["published refused"] for r in rows.values() if "published refused" in r
    }
    for message in sorted(refusals):
        print(f"\nThe published quax refuses: {message}")


def _plot(rows: dict[str, dict[str, Any]]) -> pathlib.Path:
    """Bars of `ours / plain` and `published / plain` per workload (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    labels = [
        f"{n}\n(published: refuses; timed densifying)"
        if "published refused" in rows[n]
        else n
        for n in names
    ]
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.55 * len(names)), dpi=80)
    for offset, key, label in [
        (-0.2, "ours/plain", "quax-core"),
        (0.2, "published/plain", "published quax 0.4.6"),
    ]:
        at = [(i + offset, rows[n][key]) for i, n in enumerate(names) if key in rows[n]]
        if at:
            ax.barh(*zip(*at, strict=True), height=0.4, label=label)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(names)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time / plain JAX's time (lower is better)")
    ax.legend(fontsize=8, loc="lower right")
    IMAGES.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMAGES / "published_side_by_side.png", bbox_inches="tight")
    plt.close(fig)
    return IMAGES / "published_side_by_side.png"


def main(quick: bool = False) -> dict[str, Any]:
    python = os.environ.get("QUAX_PUBLISHED_PYTHON")
    if os.environ.get("QUAX_DEBUG_CHECKS"):
        print("note: QUAX_DEBUG_CHECKS is set: quax checks every rule's output")
    print("measuring quax-core in this process", flush=True)
    ours = measure(quick)
    theirs = None
    if python:
        print(f"measuring the published quax ({python})", flush=True)
        theirs = measure_published(python, quick)
    else:
        print("the published quax is not measured: QUAX_PUBLISHED_PYTHON is not set")
    rows = side_by_side(ours, theirs)
    _print_table(rows, ours, theirs)
    print(f"\nplot: {_plot(rows).relative_to(IMAGES.parents[1])}")
    return {
        "ours": {k: v for k, v in ours.items() if k != "workloads"},
        "published": (
            {k: v for k, v in theirs.items() if k != "workloads"} if theirs else None
        ),
        "workloads": rows,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Side by side with the published quax 0.4.6."
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--measure", action="store_true", help="this environment only, as JSON"
    )
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.quick)))
    else:
        main(args.quick)
