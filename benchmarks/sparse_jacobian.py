"""quax-sparse Jacobians by colouring: `quax_sparse.jacfwd` of the matrix-free
residual of `-Δu + u³ = 1` on an `m x m` grid (5-point stencil, float64) against
dense `jax.jacfwd` where the dense Jacobian fits, over a sweep of grid sizes, with
the fitted exponent of time in `n`; and one Newton step (Jacobian by colouring, then
`jnp.linalg.solve` through SuperLU) at each size. Times are medians of rounds, each
timed call right after an untimed one, on the wall and CPU clocks.

    python benchmarks/sparse_jacobian.py [--quick]
"""

import argparse
import math
import os
import statistics
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


def main(quick: bool = False) -> dict:
    return in_float64(_main, quick)


def _main(quick: bool) -> dict:
    sides = (16, 32, 64, 512) if quick else (16, 32, 64, 128, 256, 512)
    rounds = 3 if quick else 7
    print(
        f"JAX {jax.__version__}, {os.cpu_count()} CPUs, "
        f"load {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    rows = []
    for m in sides:
        n = m * m
        f = residual_fn(m)
        jac = quax_sparse.jacfwd(f, stencil(m))
        u = jnp.asarray(np.random.default_rng(0).normal(size=n))
        sparse = jax.jit(jac)
        row = {"n": n, "colours": jac.n_colours}
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
    return {"rows": rows, "exponents": exps}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds")
    main(parser.parse_args().quick)
