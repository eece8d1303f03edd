"""quax-sparse Jacobians by colouring: `quax_sparse.jacfwd` of the matrix-free
residual of `-Δu + u³ = 1` on an `m x m` grid (5-point stencil, float64) against
dense `jax.jacfwd` where the dense Jacobian fits, over a sweep of grid sizes, with
the fitted exponent of time in `n`; and one Newton step (Jacobian by colouring, then
`jnp.linalg.solve` through SuperLU) at each size. Times are medians of rounds, each
timed call right after an untimed one, on the wall and CPU clocks.

With `--sparsejac-python PYTHON` (or `QUAX_SPARSEJAC_PYTHON` set, as `run.py` passes
nothing else), the same Jacobian by `sparsejac` at 1k, 4k and 16k unknowns, run by
`benchmarks/_sparse_sparsejac.py` under that interpreter (an environment of its own:
that script says how to make it), each time taken against dense `jax.jacfwd` timed
in its process, and the colouring (setup) times of both.

    python benchmarks/sparse_jacobian.py [--quick] [--sparsejac-python PYTHON]
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import quax
import quax_sparse


# Beside this file: `sparse_direct` (the table); in `examples/`: the PDE.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from sparse_direct import in_float64, markdown_table
from sparse_newton import (  # pyright: ignore[reportMissingImports]
    residual_fn,
    stencil,
)


# The dense Jacobian is computed while it takes at most this many bytes.
DENSE_MAX_BYTES = 2**28


def timed(fn: Callable, x: Any, rounds: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `fn(x)`."""
    jax.block_until_ready(fn(x))
    walls, cpus = [], []
    for _ in range(rounds):
        jax.block_until_ready(fn(x))
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(x))
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls), statistics.median(cpus)


# The sizes compared with sparsejac: 1k, 4k and 16k unknowns.
SPARSEJAC_SIDES = (32, 64, 128)


def main(quick: bool = False, sparsejac_python: str | None = None) -> dict:
    return in_float64(_main, quick, sparsejac_python)


def _sparsejac(python: str, rounds: int) -> dict[str, Any]:
    """`benchmarks/_sparse_sparsejac.py` run under `python` (sparsejac's
    environment)."""
    script = Path(__file__).resolve().parent / "_sparse_sparsejac.py"
    out = subprocess.run(
        [
            python,
            str(script),
            "--sides",
            ",".join(map(str, SPARSEJAC_SIDES)),
            "--rounds",
            str(rounds),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _compare(rows: list[dict], theirs: dict[str, Any]) -> None:
    """The table of quax against sparsejac and dense `jax.jacfwd`."""
    ours = {r["n"]: r for r in rows}
    versions = theirs["versions"]
    print(
        f"\nAgainst sparsejac {versions['sparsejac']} (networkx "
        f"{versions['networkx']}, JAX {versions['jax']}), CPU clock:"
    )
    columns = [
        "n",
        "colours (quax / sparsejac)",
        "quax ms",
        "sparsejac ms",
        "quax / sparsejac",
        "dense / quax",
        "dense / sparsejac",
        "colouring ms (quax / sparsejac)",
    ]
    cells = []
    for t in theirs["rows"]:
        r = ours[t["n"]]
        cells.append(
            [
                str(t["n"]),
                f"{r['colours']} / {t['colours']}",
                f"{1e3 * r['sparse'][1]:.3f}",
                f"{1e3 * t['sparsejac'][1]:.3f}",
                f"{r['sparse'][1] / t['sparsejac'][1]:.2f}",
                f"{r['dense'][1] / r['sparse'][1]:.0f}" if "dense" in r else "-",
                f"{t['dense'][1] / t['sparsejac'][1]:.0f}" if "dense" in t else "-",
                f"{1e3 * r['setup_cpu']:.0f} / {1e3 * t['setup_cpu']:.0f}",
            ]
        )
    print(markdown_table(columns, cells))


def _main(quick: bool, sparsejac_python: str | None) -> dict:
    sides = (16, 32, 64, 128, 512) if quick else (16, 32, 64, 128, 256, 512)
    rounds = 3 if quick else 7
    print(
        f"JAX {jax.__version__}, {os.cpu_count()} CPUs, "
        f"load {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    rows = []
    for m in sides:
        n = m * m
        f = residual_fn(m)
        pattern = stencil(m)
        start = time.process_time()
        jac = quax_sparse.jacfwd(f, pattern)  # colours the pattern here
        setup_cpu = time.process_time() - start
        u = jnp.asarray(np.random.default_rng(0).normal(size=n))
        sparse = jax.jit(jac)
        row = {"n": n, "colours": jac.n_colours, "setup_cpu": setup_cpu}
        row["sparse"] = timed(sparse, u, rounds)
        got = sparse(u)
        if n * n * 8 <= DENSE_MAX_BYTES:
            dense = jax.jit(jax.jacfwd(f))
            row["dense"] = timed(dense, u, rounds)
            want = np.asarray(dense(u))
            assert np.allclose(np.asarray(got.todense()), want, rtol=1e-12)

        @jax.jit
        def newton(u: Any, f: Callable = f, jac: Callable = jac) -> Any:
            return u + quax.quaxify(jnp.linalg.solve)(jac(u), -f(u))

        row["newton"] = timed(newton, u, max(1, rounds // 2))
        rows.append(row)
    columns = [
        "n",
        "colours",
        "jacfwd by colouring ms",
        "dense jax.jacfwd ms",
        "dense / colouring (CPU)",
        "Newton step ms",
    ]
    cells = [
        [
            str(r["n"]),
            str(r["colours"]),
            f"{1e3 * r['sparse'][0]:.2f}",
            f"{1e3 * r['dense'][0]:.1f}" if "dense" in r else "-",
            f"{r['dense'][1] / r['sparse'][1]:.0f}" if "dense" in r else "-",
            f"{1e3 * r['newton'][0]:.0f}",
        ]
        for r in rows
    ]
    print("\n" + markdown_table(columns, cells))
    xs = [math.log(r["n"]) for r in rows]
    exps = {}
    for key in ("sparse", "newton"):
        ys = [math.log(r[key][1]) for r in rows]
        exps[key] = float(np.polyfit(xs, ys, 1)[0])
    dense_rows = [r for r in rows if "dense" in r]
    if len(dense_rows) >= 2:
        exps["dense"] = float(
            np.polyfit(
                [math.log(r["n"]) for r in dense_rows],
                [math.log(r["dense"][1]) for r in dense_rows],
                1,
            )[0]
        )
    print(
        "\nFitted exponent of CPU time in n: "
        + ", ".join(f"{k} {v:.2f}" for k, v in exps.items())
    )
    result: dict[str, Any] = {"rows": rows, "exponents": exps}
    sparsejac_python = sparsejac_python or os.environ.get("QUAX_SPARSEJAC_PYTHON")
    if sparsejac_python:
        result["sparsejac"] = _sparsejac(sparsejac_python, rounds)
        _compare(rows, result["sparsejac"])
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds")
    parser.add_argument(
        "--sparsejac-python",
        help="the Python of an environment with sparsejac (see _sparse_sparsejac.py)",
    )
    args = parser.parse_args()
    main(args.quick, args.sparsejac_python)
