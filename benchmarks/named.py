"""quax-named: a compiled named transformer block against the same positional program.

Measures, in one run (interleaved rounds, medians):
- the compiled run time (CPU time of the process on the CPU, wall-clock time on
  an accelerator: `_clocks.py`) of the block on NamedArrays
  (through `quax.quaxify`) over the plain positional program (goal: at most
  1.01x), for several sequence lengths, with the fitted exponent of time against
  length for both, and whether the two compiled programs are the same;
- the trace time (`jax.make_jaxpr`) of the named program over the positional one
  (goal: at most 1.3x), and of the same program on `Bound`, a quax value whose rules
  do nothing but bind the primitive on its array: the floor that quax's own trace
  sets, which no family's rules can go below;
- with `--haliax-python PYTHON` (or `QUAX_HALIAX_PYTHON` set, as `run.py` passes
  nothing else), the same block written with haliax, run by
  `benchmarks/_named_haliax.py` under that interpreter (haliax needs an older JAX,
  so it has an environment of its own: that script says how to make it), its
  trace and run times taken against the positional block timed there.

`python benchmarks/named.py [--quick] [--haliax-python PYTHON]`; writes
docs/images/named_block.png. `--trace-only` measures the trace times alone.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

import _clocks
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
from jaxtyping import ArrayLike
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


class Bound(quax.ArrayValue):
    """A quax value whose rules do nothing but bind the primitive on its array and
    wrap the result: tracing the block on it costs what quax's own trace costs."""

    array: Any

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Any:
        return self.array


def _register_bound(jaxpr: Any) -> None:
    """Rules for `Bound` on every primitive of `jaxpr` (and of its sub-jaxprs)."""
    primitives = set()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            primitives.add(eqn.primitive)
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", None)
                if inner is not None:
                    walk(inner if hasattr(inner, "eqns") else inner.jaxpr)

    walk(jaxpr.jaxpr)
    for primitive in primitives:
        if primitive.name in ("jit", "pjit", "custom_jvp_call", "custom_vjp_call"):
            continue  # quax's own rules (an inlined jit, custom derivatives)

        def rule(*args: Bound | ArrayLike, _p: Any = primitive, **params: Any) -> Any:
            out = _p.bind(
                *(a.array if isinstance(a, Bound) else a for a in args), **params
            )
            return [Bound(o) for o in out] if _p.multiple_results else Bound(out)

        # Above the core's own leafwise rules (`stop_gradient`), which match too.
        quax.register(primitive, precedence=1)(rule)


def _time(fn: Any, *args: Any, calls: int = 10) -> float:
    """Seconds per call on `_clocks.program_clock()`: on the CPU this process's CPU
    time (all its threads: on a machine shared with other jobs, less noisy than
    wall-clock time), on an accelerator the wall clock."""
    clock = _clocks.program_clock()
    start = clock()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (clock() - start) / calls


def _ops(fn: Any, *args: Any) -> list[str]:
    """The compiled program's instructions (result type and opcode), sorted."""
    text = fn.lower(*args).compile().as_text()
    assert text is not None
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


def tracing(rounds: int, quaxified: Any) -> dict[str, float]:
    """Trace time (seq 64): `make_jaxpr` of the named program, of the same program on
    `Bound` values (quax's floor) and of the positional one, each through a fresh
    function (no cached trace of its own), after one warm-up, interleaved (medians
    over `rounds`, ratios medians of the per-round ratios)."""
    plain, x, named, nx, nk = make(64)
    _register_bound(jax.make_jaxpr(block)(plain, x, x))
    bound = {n: Bound(a) for n, a in plain.items()}
    bx = Bound(x)
    traces = {
        "named": lambda: jax.make_jaxpr(lambda *a: quaxified(*a))(named, nx, nk),
        "floor": lambda: jax.make_jaxpr(lambda *a: quaxified(*a))(bound, bx, bx),
        "positional": lambda: jax.make_jaxpr(lambda *a: block(*a))(plain, x, x),
    }
    for trace in traces.values():
        trace()
    times: dict[str, list[float]] = {k: [] for k in traces}
    for i in range(rounds):
        order = list(traces)[i % 3 :] + list(traces)[: i % 3]
        for k in order:
            # CPU time of the process where the machine accounts it: other jobs on
            # a shared machine stretch wall-clock time, not this process's CPU time.
            clock = _clocks.host_clock()
            start = clock()
            for _ in range(3):
                traces[k]()
            times[k].append((clock() - start) / 3)

    def ratio(k: str) -> float:
        pairs = zip(times[k], times["positional"], strict=True)
        return statistics.median(a / b for a, b in pairs)

    return {
        "trace_named_s": statistics.median(times["named"]),
        "trace_floor_s": statistics.median(times["floor"]),
        "trace_positional_s": statistics.median(times["positional"]),
        "trace_ratio": ratio("named"),
        "trace_floor_ratio": ratio("floor"),
    }


def _trace_row(traced: dict[str, float]) -> str:
    return (
        f"{traced['trace_named_s'] * 1e3:.1f} ms | "
        f"{traced['trace_floor_s'] * 1e3:.1f} ms | "
        f"{traced['trace_positional_s'] * 1e3:.1f} ms | "
        f"{traced['trace_ratio']:.2f}x | {traced['trace_floor_ratio']:.2f}x"
    )


_TRACE_HEADER = (
    "| trace (make_jaxpr, seq 64) | named | quax's floor (`Bound`) | "
    "positional | named / positional | floor / positional |\n"
    "|---|---:|---:|---:|---:|---:|"
)


def main(quick: bool = False, haliax_python: str | None = None) -> dict[str, Any]:
    seqs = [32, 64, 128] if quick else [32, 64, 128, 256, 512]
    rounds = 7 if quick else 31
    quaxified: Any = quax.quaxify(block)
    rows = [_measure(seq, rounds, quaxified) for seq in seqs]
    lengths = np.log([r["seq"] for r in rows])
    slope_named = float(np.polyfit(lengths, np.log([r["named_s"] for r in rows]), 1)[0])
    slope_plain = float(np.polyfit(lengths, np.log([r["plain_s"] for r in rows]), 1)[0])

    traced = tracing(rounds, quaxified)
    trace_ratio = traced["trace_ratio"]

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
    print("\n" + _TRACE_HEADER)
    print(f"| attention + MLP block | {_trace_row(traced)} |")
    haliax = None
    haliax_python = haliax_python or os.environ.get("QUAX_HALIAX_PYTHON")
    if haliax_python:
        haliax = _haliax(haliax_python, seqs, rounds)
        by_seq = {r["seq"]: r for r in rows}
        print(
            f"\n| vs haliax {haliax['versions']['haliax']} (JAX "
            f"{haliax['versions']['jax']}) | quax-named / positional | "
            "haliax / positional |"
        )
        print("|---|---:|---:|")
        print(f"| trace (seq 64) | {trace_ratio:.2f}x | {haliax['trace_ratio']:.2f}x |")
        for r in haliax["rows"]:
            print(
                f"| compiled run, seq {r['seq']} | {by_seq[r['seq']]['ratio']:.3f}x | "
                f"{r['ratio']:.3f}x |"
            )

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
        **traced,
        "haliax": haliax,
    }


def _haliax(python: str, seqs: list[int], rounds: int) -> dict[str, Any]:
    """`benchmarks/_named_haliax.py` run under `python` (haliax's environment)."""
    script = Path(__file__).resolve().parent / "_named_haliax.py"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [
            python,
            str(script),
            "--seqs",
            ",".join(map(str, seqs)),
            "--rounds",
            str(rounds),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--trace-only",
        action="store_true",
        help="only the trace times (31 rounds, or 7 with --quick)",
    )
    parser.add_argument(
        "--haliax-python",
        help="the Python of an environment with haliax (see _named_haliax.py)",
    )
    args = parser.parse_args()
    if args.trace_only:
        traced = tracing(7 if args.quick else 31, quax.quaxify(block))
        print(_TRACE_HEADER)
        print(f"| attention + MLP block | {_trace_row(traced)} |")
        print(json.dumps(traced, indent=1))
    else:
        print(json.dumps(main(args.quick, args.haliax_python), indent=1))
