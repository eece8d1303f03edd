"""quax-named: a compiled named transformer block against the same positional program.

Measures, in one run (interleaved rounds, medians):
- the compiled run time (CPU time of the process) of the block on NamedArrays
  (through `quax.quaxify`) over the plain positional program (goal: at most
  1.01x), for several sequence lengths, with the fitted exponent of time against
  length for both, and whether the two compiled programs are the same;
- the trace time (`jax.make_jaxpr`) of the named program over the positional one.

`python benchmarks/named.py [--quick]`; writes docs/images/named_block.png.
"""

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
from quax_named import NamedArray


def _example() -> Any:
    """`examples/named_attention.py`, whose `block` (positional attention + MLP code)
    and `AXES` (the weights' axis names) are measured here at larger sizes."""
    path = Path(__file__).resolve().parents[1] / "examples" / "named_attention.py"
    spec = importlib.util.spec_from_file_location("quax_example_named_attention", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The example's block scales the scores by its own head size; the times do not
# depend on that constant.
_attention = _example()
block, AXES = _attention.block, _attention.AXES
EMBED, HEAD, HIDDEN, BATCH = 64, 64, 256, 4


def make(seq: int) -> tuple[dict[str, Any], Any, dict[str, Any], Any, Any]:
    sizes = {"embed": EMBED, "head": HEAD, "hidden": HIDDEN}
    keys = jr.split(jr.PRNGKey(0), len(AXES) + 1)
    plain = {
        n: jr.normal(k, tuple(sizes[a] for a in ax)) / np.sqrt(EMBED)
        for (n, ax), k in zip(AXES.items(), keys, strict=False)
    }
    x = jr.normal(keys[-1], (BATCH, seq, EMBED))
    named = {n: NamedArray(plain[n], AXES[n]) for n in AXES}
    nx = NamedArray(x, ("batch", "seq", "embed"))
    nk = NamedArray(x, ("batch", "kseq", "embed"))
    return plain, x, named, nx, nk


def _time(fn: Any, *args: Any, calls: int = 10) -> float:
    """Seconds of CPU time of this process (all its threads) per call: on a machine
    shared with other jobs, less noisy than wall-clock time."""
    start = time.process_time()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.process_time() - start) / calls


def _ops(fn: Any, *args: Any) -> list[str]:
    """The compiled program's instructions (result type and opcode), sorted."""
    text = fn.lower(*args).compile().as_text()
    ops = []
    for line in text.splitlines():
        if " = " in line and "(" in line:
            rest = line.split(" = ", 1)[1]
            ops.append(rest.split("(", 1)[0])  # result type and opcode
    return sorted(ops)


def _measure(seq: int, rounds: int, quaxified: Any) -> dict[str, Any]:
    """Run times of the block at one sequence length (medians over `rounds`)."""
    named_fn = jax.jit(lambda p, x, k: quaxified(p, x, k).array)
    plain_fn = jax.jit(block)
    plain, x, named, nx, nk = make(seq)
    out_named = named_fn(named, nx, nk)
    out_plain = plain_fn(plain, x, x)
    error = float(jnp.max(jnp.abs(out_named - out_plain)))
    same = _ops(named_fn, named, nx, nk) == _ops(plain_fn, plain, x, x)
    # The named program also with plain arrays at the jit boundary (the
    # NamedArrays built inside): the same executable without flattening
    # NamedArray pytrees at each call.
    leaves, treedef = jax.tree.flatten((named, nx, nk))
    inside = jax.jit(lambda *a: quaxified(*jax.tree.unflatten(treedef, a)).array)
    calls = {
        "named": lambda: _time(named_fn, named, nx, nk),
        "inside": lambda: _time(inside, *leaves),
        "plain": lambda: _time(plain_fn, plain, x, x),
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    for call in calls.values():  # warm up
        call()
    for i in range(rounds):  # rotate which goes first
        order = list(calls)[i % 3 :] + list(calls)[: i % 3]
        for k in order:
            times[k].append(calls[k]())

    def ratio(k: str) -> float:
        pairs = zip(times[k], times["plain"], strict=True)
        return statistics.median(a / b for a, b in pairs)

    return {
        "seq": seq,
        "named_s": statistics.median(times["named"]),
        "inside_s": statistics.median(times["inside"]),
        "plain_s": statistics.median(times["plain"]),
        "ratio": ratio("named"),
        "ratio_inside": ratio("inside"),
        "max_abs_diff": error,
        "same_compiled_ops": same,
    }


def main(quick: bool = False) -> dict[str, Any]:
    seqs = [32, 64, 128] if quick else [32, 64, 128, 256, 512]
    rounds = 7 if quick else 31
    quaxified: Any = quax.quaxify(block)
    rows = [_measure(seq, rounds, quaxified) for seq in seqs]
    lengths = np.log([r["seq"] for r in rows])
    slope_named = float(np.polyfit(lengths, np.log([r["named_s"] for r in rows]), 1)[0])
    slope_plain = float(np.polyfit(lengths, np.log([r["plain_s"] for r in rows]), 1)[0])

    # Trace time: make_jaxpr of the named program against the positional one, each
    # through a fresh function (no cached trace), after one warm-up.
    plain, x, named, nx, nk = make(64)

    def trace_named() -> Any:
        return jax.make_jaxpr(lambda *a: quaxified(*a))(named, nx, nk)

    def trace_plain() -> Any:
        return jax.make_jaxpr(lambda *a: block(*a))(plain, x, x)

    trace_named()
    trace_plain()
    times_named, times_plain = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        trace_named()
        times_named.append(time.perf_counter() - start)
        start = time.perf_counter()
        trace_plain()
        times_plain.append(time.perf_counter() - start)
    tn_, tp_ = statistics.median(times_named), statistics.median(times_plain)

    print(
        "| seq | positional (ms) | named (ms) | named / positional | named, arrays "
        "at the jit boundary / positional | max abs diff | same compiled ops |"
    )
    print("|---:|---:|---:|---:|---:|---:|:---:|")
    for r in rows:
        print(
            f"| {r['seq']} | {r['plain_s'] * 1e3:.3f} | {r['named_s'] * 1e3:.3f} | "
            f"{r['ratio']:.3f}x | {r['ratio_inside']:.3f}x | "
            f"{r['max_abs_diff']:.1e} | {r['same_compiled_ops']} |"
        )
    print(
        f"\nfitted exponent (time ~ seq^k): named {slope_named:.2f}, "
        f"positional {slope_plain:.2f}"
    )
    print("\n| trace (make_jaxpr) | named (ms) | positional (ms) | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| block, seq 64 | {tn_ * 1e3:.1f} | {tp_ * 1e3:.1f} | {tn_ / tp_:.1f}x |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2), dpi=90)
    ax.loglog(
        [r["seq"] for r in rows],
        [r["plain_s"] * 1e3 for r in rows],
        "o-",
        label="positional",
    )
    ax.loglog(
        [r["seq"] for r in rows],
        [r["named_s"] * 1e3 for r in rows],
        "s--",
        label="named (quaxify)",
    )
    ax.set_xticks(seqs, [str(n) for n in seqs])
    ax.minorticks_off()
    ax.set_xlabel("sequence length")
    ax.set_ylabel("compiled block, CPU time (ms)")
    ax.set_title("transformer block, CPU")
    ax.legend()
    fig.tight_layout()
    out = Path(__file__).resolve().parent.parent / "docs" / "images" / "named_block.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return {
        "rows": rows,
        "exponent_named": slope_named,
        "exponent_positional": slope_plain,
        "trace_named_s": tn_,
        "trace_positional_s": tp_,
        "trace_ratio": tn_ / tp_,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(main(parser.parse_args().quick), indent=1))
