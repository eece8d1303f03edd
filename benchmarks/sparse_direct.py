"""quax-sparse direct solves: `jnp.linalg.solve` on the 5-point Laplacian of an
`m x m` grid (`n = m²` unknowns, float64) through `jit(quaxify(...))` (SuperLU on
the host through `jax.pure_callback`), against `scipy.sparse.linalg.spsolve` called
directly (the callback's overhead), against dense `jnp.linalg.solve` where the
matrix fits, and against quax's own conjugate gradient (`jax.scipy.sparse.linalg.cg`
on the `BCOO`, to a relative residual of 1e-6); also one factorisation reused
(`quax_sparse.lu_factor(a).solve(b)` against SuperLU's `solve`), the gradient with
respect to the stored values, and the fitted exponent of time in `n`.

Times are medians over interleaved rounds (each round runs every method once, each
timed call right after an untimed one), on the wall clock and on the CPU clock of
this process (all its threads). Prints a Markdown table, writes
`docs/images/sparse_direct_solve.png`, and returns the figures.

    python benchmarks/sparse_direct.py [--quick]
"""

import argparse
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as jspla
import numpy as np
import quax
import quax_sparse
import scipy
import scipy.sparse
import scipy.sparse.linalg
from quax_sparse import BCOO


IMAGE = Path(__file__).resolve().parent.parent / "docs" / "images"
# Dense solves are run while the matrix takes at most this many bytes (float64).
DENSE_MAX_BYTES = 2**29


def laplacian(m: int) -> Any:
    """The 5-point Laplacian of an `m x m` grid with Dirichlet boundaries, as a
    SciPy CSR matrix (`n = m²`, symmetric positive definite)."""
    i = np.arange(m)
    rows = np.concatenate([i, i[1:], i[:-1]])
    cols = np.concatenate([i, i[:-1], i[1:]])
    values = np.concatenate([np.full(m, 2.0), np.full(2 * m - 2, -1.0)])
    one = scipy.sparse.csr_array((values, (rows, cols)), shape=(m, m))
    eye = scipy.sparse.eye(m)
    return (scipy.sparse.kron(one, eye) + scipy.sparse.kron(eye, one)).tocsr()


def timed(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, dict]:
    """`{name: {"wall": median s, "cpu": median s}}`, rounds interleaved."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    walls: dict[str, list[float]] = {name: [] for name in fns}
    cpus: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            jax.block_until_ready(fn())
            wall, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn())
            cpus[name].append(time.process_time() - cpu)
            walls[name].append(time.perf_counter() - wall)
    return {
        name: {
            "wall": statistics.median(walls[name]),
            "cpu": statistics.median(cpus[name]),
        }
        for name in fns
    }


def point(m: int, rounds: int, cg_rounds: int) -> dict[str, Any]:
    a_sp = laplacian(m)
    n = m * m
    a = BCOO.from_scipy(a_sp)
    b = np.random.default_rng(0).normal(size=n)
    b_j = jnp.asarray(b)
    csc = a_sp.tocsc()
    solve = jax.jit(quax.quaxify(jnp.linalg.solve))

    def cg(a: BCOO, b: Any) -> Any:
        return jspla.cg(lambda v: a @ v, b, tol=1e-6, maxiter=20 * m)[0]

    cg_fn = jax.jit(quax.quaxify(cg))

    def loss(data: Any, b: Any) -> Any:
        return jnp.sum(
            quax.quaxify(jnp.linalg.solve)(BCOO(data, a.indices, a.shape), b)
        )

    grad = jax.jit(jax.grad(loss))
    lu = quax_sparse.lu_factor(a)
    reuse = jax.jit(lambda lu, b: lu.solve(b))
    superlu = scipy.sparse.linalg.splu(csc)
    fns: dict[str, Callable[[], Any]] = {
        "quax solve": lambda: solve(a, b_j),
        "scipy spsolve": lambda: scipy.sparse.linalg.spsolve(csc, b),
        "quax grad (values)": lambda: grad(a.data, b_j),
        "quax solve, factor reused": lambda: reuse(lu, b_j),
        "SuperLU solve, factor reused": lambda: superlu.solve(b),
    }
    dense_ok = n * n * 8 <= DENSE_MAX_BYTES
    if dense_ok:
        dense = jnp.asarray(a_sp.toarray())
        dense_solve = jax.jit(jnp.linalg.solve)
        fns["dense jnp.linalg.solve"] = lambda: dense_solve(dense, b_j)
    times = timed(fns, rounds)
    times.update(timed({"quax CG (1e-6)": lambda: cg_fn(a, b_j)}, cg_rounds))
    x = np.asarray(solve(a, b_j))
    x_cg = np.asarray(cg_fn(a, b_j))
    residual = float(np.linalg.norm(a_sp @ x - b) / np.linalg.norm(b))
    residual_cg = float(np.linalg.norm(a_sp @ x_cg - b) / np.linalg.norm(b))
    return {
        "m": m,
        "n": n,
        "nse": a.nse,
        "times": times,
        "residual": residual,
        "residual_cg": residual_cg,
    }


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fitted_exponent(points: list[dict[str, Any]], name: str) -> float | None:
    xs = [math.log(p["n"]) for p in points if name in p["times"]]
    ys = [math.log(p["times"][name]["cpu"]) for p in points if name in p["times"]]
    if len(xs) < 2:
        return None
    return float(np.polyfit(xs, ys, 1)[0])


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    names = [
        "quax solve",
        "scipy spsolve",
        "quax CG (1e-6)",
        "dense jnp.linalg.solve",
        "quax grad (values)",
    ]
    for name in names:
        pts = [p for p in points if name in p["times"]]
        ax.loglog(
            [p["n"] for p in pts],
            [1e3 * p["times"][name]["wall"] for p in pts],
            marker="o",
            label=name,
        )
    ax.set_xlabel("unknowns n (5-point Laplacian, m x m grid)")
    ax.set_ylabel("ms per call (wall)")
    ax.set_title("quax-sparse direct solve (SuperLU via pure_callback)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def in_float64(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` with float64 on, for one benchmark only (the runner imports every
    benchmark in one process): the global flag, which JAX's callback thread also
    reads (the thread-local `jax.enable_x64` context does not reach it)."""
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        return fn(*args)
    finally:
        jax.config.update("jax_enable_x64", before)


def main(quick: bool = False) -> dict[str, Any]:
    return in_float64(_main, quick)


def _main(quick: bool) -> dict[str, Any]:
    sides = (32, 64, 128, 512) if quick else (32, 64, 128, 256, 512)
    rounds = 3 if quick else 7
    print(
        f"JAX {jax.__version__}, SciPy {scipy.__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    points = [point(m, rounds, cg_rounds=max(1, rounds // 2)) for m in sides]
    names = [
        "quax solve",
        "scipy spsolve",
        "dense jnp.linalg.solve",
        "quax CG (1e-6)",
        "quax grad (values)",
        "quax solve, factor reused",
        "SuperLU solve, factor reused",
    ]
    times = [
        [str(p["n"]), str(p["nse"])]
        + [
            f"{1e3 * p['times'][x]['wall']:.2f}" if x in p["times"] else "-"
            for x in names
        ]
        for p in points
    ]
    print("\n" + markdown_table(["n", "nse"] + [f"{x} ms" for x in names], times))
    columns = [
        "quax / spsolve (wall)",
        "quax / spsolve (CPU)",
        "dense / quax",
        "CG / quax",
        "grad / solve",
        "reused / SuperLU reused",
        "residual (direct)",
        "residual (CG)",
    ]

    def ratio(t: dict, a: str, b: str, clock: str = "wall") -> str:
        if a not in t or b not in t:
            return "-"
        return f"{t[a][clock] / t[b][clock]:.2f}"

    ratios = [
        [
            str(p["n"]),
            ratio(p["times"], "quax solve", "scipy spsolve"),
            ratio(p["times"], "quax solve", "scipy spsolve", "cpu"),
            ratio(p["times"], "dense jnp.linalg.solve", "quax solve"),
            ratio(p["times"], "quax CG (1e-6)", "quax solve"),
            ratio(p["times"], "quax grad (values)", "quax solve"),
            ratio(
                p["times"], "quax solve, factor reused", "SuperLU solve, factor reused"
            ),
            f"{p['residual']:.1e}",
            f"{p['residual_cg']:.1e}",
        ]
        for p in points
    ]
    print("\n" + markdown_table(["n", *columns], ratios))
    exponents = {
        name: fitted_exponent(points, name)
        for name in ("quax solve", "scipy spsolve", "quax CG (1e-6)")
    }
    print(
        "\nFitted exponent of CPU time in n: "
        + ", ".join(f"{k} {v:.2f}" for k, v in exponents.items() if v is not None)
    )
    plot(points, IMAGE / "sparse_direct_solve.png")
    return {"points": points, "exponents": exponents}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds")
    main(parser.parse_args().quick)
