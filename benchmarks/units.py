"""Benchmark: a unitful physics program against the same program on plain arrays.

Prints a Markdown table of ratios (unitful / plain), all measured in this one run
(medians of interleaved rounds): the run time of the compiled program (units should
cost nothing), the time to trace (and lower) it, and whether the two compiled
programs hold the same instructions. Writes `docs/images/units_run.png` (the times
of each round) and returns the raw figures. Run with
`python benchmarks/units.py [--quick]`; it takes about a minute on a CPU (`--quick`:
a smaller state, fewer rounds).

It also times the same program with `unxt` Quantities (which run on the published
quax), in a separate environment, since unxt pins its own quax. Make one with

    uv venv <dir> && uv pip install --python <dir>/bin/python unxt

and point `UNXT_PYTHON` at its interpreter; without it, the unxt rows say so.
"""

import argparse
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import timeit
from pathlib import Path

import jax
import jax.numpy as jnp
import quax
from jax import lax
from quax_units import Quantity, Unitful


def simulate(x, v, k, c, m, dt):
    """A damped spring, integrated with semi-implicit Euler for 2000 steps."""

    def step(state, _):
        x, v = state
        a = -(k * x + c * v) / m
        v = v + a * dt
        x = x + v * dt
        return (x, v), 0.5 * m * jnp.sum(v * v) + 0.5 * k * jnp.sum(x * x)

    (x, v), energy = lax.scan(step, (x, v), length=2000)
    return x, v, energy


def _plain(tree):
    return jax.tree.map(
        lambda q: q.array if isinstance(q, Unitful) else q,
        tree,
        is_leaf=lambda q: isinstance(q, Unitful),
    )


def _best(fn, number, repeat=7):
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


_UNXT_SCRIPT = """
import json, sys, timeit
import jax, jax.numpy as jnp, quax, unxt
from jax import lax

{simulate}
{best}
n = {n}
q = unxt.Quantity
args = (q(jnp.linspace(-1.0, 1.0, n), "cm"), q(jnp.zeros(n), "m / s"),
        q(40.0, "N / m"), q(0.5, "N s / m"), q(2.0, "kg"), q(1.0, "ms"))
plain_args = (jnp.linspace(-1.0, 1.0, n) * 0.01, jnp.zeros(n), 40.0, 0.5, 2.0, 1e-3)
unitful, plain = jax.jit(quax.quaxify(simulate)), jax.jit(simulate)
jax.block_until_ready(unitful(*args)); jax.block_until_ready(plain(*plain_args))
t_unitful, t_plain = [], []
for _ in range(10):
    t_unitful.append(_best(lambda: jax.block_until_ready(unitful(*args)), 20, 3))
    t_plain.append(_best(lambda: jax.block_until_ready(plain(*plain_args)), 20, 3))
trace = _best(
    lambda: jax.jit(quax.quaxify(lambda *a: simulate(*a))).trace(*args).lower(), 3, 5
)
json.dump({{"run": min(t_unitful), "plain": min(t_plain), "trace": trace,
            "version": unxt.__version__}}, sys.stdout)
"""


def _time_unxt(n):
    """Time `simulate` with unxt Quantities in unxt's own environment, or say why
    not: a dict of times, or a string."""
    python = os.environ.get("UNXT_PYTHON")
    if python is None:
        return "UNXT_PYTHON is not set (see this file's docstring)"
    if not os.path.exists(python):
        return f"no unxt environment at {python} (see this file's docstring)"
    script = _UNXT_SCRIPT.format(
        simulate=inspect.getsource(simulate),
        best=inspect.getsource(_best),
        n=n,
    )
    done = subprocess.run(
        [python, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
        check=False,
    )
    if done.returncode != 0:
        return f"the unxt run failed: {done.stderr.strip().splitlines()[-1]}"
    return json.loads(done.stdout)


def _instructions(hlo):
    """The instructions of an optimised HLO module, by opcode (metadata aside)."""
    ops = re.findall(r"^\s*(?:ROOT )?%\S+ = \S+ ([\w-]+)\(", hlo, flags=re.MULTILINE)
    return sorted(ops)


def _plot(t_unitful, t_plain):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2), dpi=90)
    rounds = range(1, len(t_plain) + 1)
    ax.plot(rounds, [t * 1e3 for t in t_plain], "o-", label="plain arrays")
    ax.plot(rounds, [t * 1e3 for t in t_unitful], "s--", label="quantities (quaxify)")
    ax.set_xlabel("interleaved round")
    ax.set_ylabel("compiled run (ms)")
    ax.set_title("damped spring scan, units vs plain")
    ax.legend()
    fig.tight_layout()
    out = Path(__file__).resolve().parent.parent / "docs" / "images" / "units_run.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(quick=False):
    n = 1024 if quick else 4096
    rounds = 5 if quick else 15
    args = (
        Quantity(jnp.linspace(-1.0, 1.0, n), "cm"),
        Quantity(jnp.zeros(n), "m / s"),
        Quantity(40.0, "N / m"),
        Quantity(0.5, "N s / m"),
        Quantity(2.0, "kg"),
        Quantity(1.0, "ms"),
    )
    plain_args = _plain(args)
    unitful = jax.jit(quax.quaxify(simulate))
    plain = jax.jit(simulate)

    def run(f, a):
        return lambda: jax.block_until_ready(f(*a))

    run(unitful, args)()
    run(plain, plain_args)()
    outs = jax.tree.leaves(_plain(unitful(*args)))
    for got, want in zip(outs, jax.tree.leaves(plain(*plain_args)), strict=True):
        assert bool(jnp.all(got == want)), "unitful and plain results differ"

    # Interleave the two so that machine noise affects both alike; report medians
    # of the per-round ratios (and of the times).
    t_unitful, t_plain = [], []
    for _ in range(rounds):
        t_unitful.append(_best(run(unitful, args), 10, 3))
        t_plain.append(_best(run(plain, plain_args), 10, 3))
    run_ratio = statistics.median(
        u / p for u, p in zip(t_unitful, t_plain, strict=True)
    )

    def trace(wrap, a):
        # A fresh function each time, so that JAX's tracing cache cannot answer.
        return lambda: jax.jit(wrap(lambda *a: simulate(*a))).trace(*a).lower()

    trace_unitful, trace_plain = [], []
    for _ in range(3 if quick else 7):
        trace_unitful.append(_best(trace(quax.quaxify, args), 1, 3))
        trace_plain.append(_best(trace(lambda f: f, plain_args), 1, 3))
    trace_ratio = statistics.median(
        u / p for u, p in zip(trace_unitful, trace_plain, strict=True)
    )
    hlo = [
        _instructions(jax.jit(f).lower(*a).compile().as_text())
        for f, a in [(quax.quaxify(simulate), args), (simulate, plain_args)]
    ]

    # m vs km: one compilation for both.
    fresh = jax.jit(quax.quaxify(simulate))
    fresh(*args)
    fresh(Quantity(jnp.ones(n), "km"), *args[1:])
    # JAX's count of the programs this `jit` compiled (no public equivalent).
    compilations = fresh._cache_size()  # pyright: ignore[reportAttributeAccessIssue]

    median_unitful = statistics.median(t_unitful)
    median_plain = statistics.median(t_plain)
    print(
        f"{jax.devices()[0].platform}, JAX {jax.__version__}; medians of {rounds} "
        "interleaved rounds"
    )
    print("| measure | unitful | plain | ratio |")
    print("|---|---|---|---|")
    print(
        f"| compiled run (2000-step scan, n={n}) | {median_unitful * 1e3:.3f} ms "
        f"| {median_plain * 1e3:.3f} ms | {run_ratio:.3f}x |"
    )
    print(
        f"| trace + lower | {statistics.median(trace_unitful) * 1e3:.1f} ms "
        f"| {statistics.median(trace_plain) * 1e3:.1f} ms | {trace_ratio:.2f}x |"
    )
    print(
        f"| compiled HLO instructions | {len(hlo[0])} | {len(hlo[1])} "
        f"| {'same opcodes' if hlo[0] == hlo[1] else 'different opcodes'} |"
    )
    print(f"| compilations for m and km inputs | {compilations} | 1 | |")
    image = _plot(t_unitful, t_plain)
    print(f"plot: docs/images/{image.name}")
    results = {
        "machine": f"{jax.devices()[0].platform}, JAX {jax.__version__}",
        "n": n,
        "run_unitful_s": t_unitful,
        "run_plain_s": t_plain,
        "run_ratio": run_ratio,
        "trace_unitful_s": trace_unitful,
        "trace_plain_s": trace_plain,
        "trace_ratio": trace_ratio,
        "hlo_instructions": [len(hlo[0]), len(hlo[1])],
        "same_hlo_opcodes": hlo[0] == hlo[1],
        "compilations_m_km": compilations,
    }
    unxt = _time_unxt(n)
    if isinstance(unxt, str):
        print(f"\nunxt: not compared: {unxt}.", file=sys.stderr)
        return results
    results["unxt"] = unxt
    print(
        f"| unxt {unxt['version']}: compiled run | {unxt['run'] * 1e3:.3f} ms "
        f"| {unxt['plain'] * 1e3:.3f} ms | {unxt['run'] / unxt['plain']:.3f}x |"
    )
    print(f"| unxt: trace + lower | {unxt['trace'] * 1e3:.1f} ms | | |")
    # Separate processes see different machine load: compare each library's
    # overhead over its own plain run, not raw times across processes.
    print(
        f"| quax-units vs unxt: run overhead | {run_ratio:.3f}x "
        f"| {unxt['run'] / unxt['plain']:.3f}x "
        f"| {run_ratio / (unxt['run'] / unxt['plain']):.3f}x |"
    )
    print(
        f"| quax-units vs unxt: trace + lower "
        f"| {statistics.median(trace_unitful) * 1e3:.1f} ms "
        f"| {unxt['trace'] * 1e3:.1f} ms "
        f"| {statistics.median(trace_unitful) / unxt['trace']:.2f}x |"
    )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(main(parser.parse_args().quick), indent=1))
