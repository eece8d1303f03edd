"""quax-sparse benchmark: sparse matrix products through `jit(quaxify(...))` against
dense `jnp`, against the same product written by hand in JAX (`segment_sum`), and
against `jax.experimental.sparse` (`BCOO @` and `sparsify`), over a
density sweep; the fitted exponent of time in the number of stored entries; the
crossover density against dense; and a conjugate-gradient solve on the 5-point
Laplacian of a 512 x 512 grid (time per iteration and XLA's peak memory).

Times are medians over interleaved rounds (each round runs every method once, in a
random order, each timed call right after an untimed one), ratios medians of the
per-round ratios. Each call is timed twice: wall-clock time, and the CPU time of this
process (all its threads), which a busy machine disturbs far less (a process that
waits for a core accrues none). The load average is printed beside the figures.
Prints Markdown tables, writes `docs/images/sparse_density_sweep.png`, and returns
the figures.

    python benchmarks/sparse.py [--quick]
"""

import argparse
import itertools
import math
import os
import random
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
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO


DENSITIES = (0.001, 0.01, 0.1)
COLUMNS = 64
IMAGE = Path(__file__).resolve().parent.parent / "docs" / "images"
# Arrays larger than this (bytes) are not built: dense 16384^2 matmat on a small
# CPU takes seconds a call, and a gather of 64 columns per entry at 10% of 16384^2
# would need 7 GB.
MAX_BYTES = 2**30


def random_matrix(n: int, density: float, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Row-major sorted unique coordinates of about `density * n^2` entries."""
    rng = np.random.default_rng(seed)
    flat = np.unique(rng.integers(0, n * n, int(density * n * n), dtype=np.int64))
    rows, cols = np.divmod(flat, n)
    values = rng.normal(size=flat.size).astype(np.float32)
    return values, np.stack([rows, cols], -1).astype(np.int32)


Times = dict[str, dict[str, list[float]]]


def run_times(fns: dict[str, Callable[[], Any]], rounds: int) -> Times:
    """Each function compiled, then timed once per round, rounds interleaved, in a
    random order each round (a call right after the dense product would otherwise
    always meet a cold cache), each timed call right after an untimed one. Returns
    `{"wall": {name: seconds}, "cpu": {name: seconds}}`."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: Times = {
        "wall": {name: [] for name in fns},
        "cpu": {name: [] for name in fns},
    }
    order = list(fns)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            jax.block_until_ready(fns[name]())
            wall, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fns[name]())
            times["cpu"][name].append(time.process_time() - cpu)
            times["wall"][name].append(time.perf_counter() - wall)
    return times


def _ratio(times: dict[str, list[float]], a: str, b: str) -> float | None:
    if a not in times or b not in times:
        return None
    pairs = [(x, y) for x, y in zip(times[a], times[b], strict=True) if y > 0]
    return statistics.median(x / y for x, y in pairs) if pairs else None


def load() -> str:
    """The load average (1, 5, 15 minutes), as `uptime` shows it."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _matmul(a: Any, v: Any) -> Any:
    return a @ v


@jax.jit
def by_hand(values: Any, rows: Any, cols: Any, v: Any) -> Any:
    """The product of a square sparse matrix as one would write it in plain JAX: a
    gather of `v`'s rows, scaled, summed by row with `segment_sum`."""
    contrib = values.reshape((-1,) + (1,) * (v.ndim - 1)) * v[cols]
    return jax.ops.segment_sum(
        contrib, rows, num_segments=v.shape[0], indices_are_sorted=True
    )


def sweep(sizes: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    points = []
    quax_mm = jax.jit(quax.quaxify(_matmul))
    jax_mm = jax.jit(_matmul)
    sparsify_mm = jax.jit(jsparse.sparsify(_matmul))
    for n in sizes:
        dense_ok = n * n * 4 <= MAX_BYTES
        for density in DENSITIES:
            values, indices = random_matrix(n, density)
            nse = values.size
            q = BCOO(values, indices, (n, n), indices_sorted=True, unique_indices=True)
            j = jsparse.BCOO(
                (jnp.asarray(values), jnp.asarray(indices)),
                shape=(n, n),
                indices_sorted=True,
                unique_indices=True,
            )
            rows, cols_ = jnp.asarray(indices[:, 0]), jnp.asarray(indices[:, 1])
            dense = jax.jit(BCOO.todense)(q) if dense_ok else None
            for cols in (None, COLUMNS):
                if cols is not None and nse * cols * 4 > 2 * MAX_BYTES:
                    continue  # the per-entry gather alone would not fit
                v = jnp.ones((n,) if cols is None else (n, cols), jnp.float32)
                fns = {
                    "quax": lambda q=q, v=v: quax_mm(q, v),
                    "jax BCOO @": lambda j=j, v=v: jax_mm(j, v),
                    "sparsify": lambda j=j, v=v: sparsify_mm(j, v),
                    "by hand": lambda q=q, r=rows, c=cols_, v=v: by_hand(
                        q.data, r, c, v
                    ),
                }
                if dense is not None and (cols is None or n <= 4096):
                    fns["dense"] = lambda d=dense, v=v: jax_mm(d, v)
                # Small products take microseconds: many rounds to beat the noise.
                work = nse * (cols or 1)
                times = run_times(
                    fns, rounds * (15 if work < 2e5 else 5 if work < 2e6 else 1)
                )
                wall, cpu = times["wall"], times["cpu"]
                points.append(
                    {
                        "n": n,
                        "density": density,
                        "nse": nse,
                        "op": "matvec" if cols is None else f"matmat{cols}",
                        "ms": {k: 1e3 * statistics.median(t) for k, t in wall.items()},
                        "cpu_ms": {
                            k: 1e3 * statistics.median(t) for k, t in cpu.items()
                        },
                        "quax/jax BCOO": _ratio(wall, "quax", "jax BCOO @"),
                        "quax/jax BCOO (cpu)": _ratio(cpu, "quax", "jax BCOO @"),
                        "quax/sparsify": _ratio(wall, "quax", "sparsify"),
                        "quax/by hand": _ratio(wall, "quax", "by hand"),
                        "quax/by hand (cpu)": _ratio(cpu, "quax", "by hand"),
                        "dense/quax": _ratio(wall, "dense", "quax"),
                        "load": load(),
                    }
                )
                print(_row(points[-1]), flush=True)
            del dense
    return points


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _row(p: dict[str, Any]) -> str:
    ms, cpu = p["ms"], p["cpu_ms"]
    return (
        f"| {p['op']} | {p['n']} | {100 * p['density']:g}% | {p['nse']} | "
        f"{_fmt(ms.get('quax'), 3)} | {_fmt(ms.get('jax BCOO @'), 3)} | "
        f"{_fmt(ms.get('sparsify'), 3)} | {_fmt(ms.get('dense'), 3)} | "
        f"{_fmt(cpu.get('quax'), 3)} | {_fmt(cpu.get('jax BCOO @'), 3)} | "
        f"{_fmt(p['quax/jax BCOO'])} | {_fmt(p['quax/jax BCOO (cpu)'])} | "
        f"{_fmt(p['quax/sparsify'])} | {_fmt(p['quax/by hand'])} | "
        f"{_fmt(p['quax/by hand (cpu)'])} | {_fmt(p['dense/quax'])} |"
    )


HEADER = (
    "| op | n | density | nse | quax ms | BCOO @ ms | sparsify ms | dense ms | "
    "quax CPU ms | BCOO @ CPU ms | quax / BCOO @ | quax / BCOO @ (CPU) | "
    "quax / sparsify | quax / by hand | quax / by hand (CPU) | dense / quax |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def goal(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per baseline (`BCOO @`, the product by hand) and clock: the median ratio of
    quax to it, its range, and the points above 1.0 (the goal is none)."""
    out: dict[str, Any] = {}
    for base in ("jax BCOO", "by hand"):
        for suffix in ("", " (cpu)"):
            key = f"quax/{base}{suffix}"
            ratios = [(p[key], p) for p in points if p[key] is not None]
            out[f"{key}"] = {
                "median": statistics.median(r for r, _ in ratios),
                "range": [min(r for r, _ in ratios), max(r for r, _ in ratios)],
                "above_1": [
                    f"{p['op']} n={p['n']} {100 * p['density']:g}%: {r:.2f}"
                    for r, p in ratios
                    if r > 1.0
                ],
            }
    return out


def fitted_exponent(points: list[dict[str, Any]], op: str) -> float:
    """The slope of log(time) against log(nse) for quax, over the points of `op`
    with at least 10^4 entries (below that, fixed costs dominate)."""
    xs = [math.log(p["nse"]) for p in points if p["op"] == op and p["nse"] >= 1e4]
    ys = [
        math.log(p["ms"]["quax"]) for p in points if p["op"] == op and p["nse"] >= 1e4
    ]
    if len(xs) < 2:
        return float("nan")
    return float(np.polyfit(xs, ys, 1)[0])


def crossover(points: list[dict[str, Any]], op: str, n: int) -> str:
    """The density where quax and dense take the same time (log-log interpolation
    between the measured densities)."""
    pts = [p for p in points if p["op"] == op and p["n"] == n and p["dense/quax"]]
    if len(pts) < 2:
        return "-"
    logs = [(math.log(p["density"]), math.log(p["dense/quax"])) for p in pts]
    for (d0, r0), (d1, r1) in itertools.pairwise(logs):
        if r0 >= 0 >= r1:
            d = d0 + (d1 - d0) * r0 / (r0 - r1) if r0 != r1 else d0
            return f"{100 * math.exp(d):.2g}%"
    if logs[-1][1] > 0:
        return f"> {100 * pts[-1]['density']:g}%"
    return f"< {100 * pts[0]['density']:g}%"


def laplacian(m: int) -> tuple[np.ndarray, np.ndarray]:
    """The 5-point Laplacian of an `m x m` grid (4 on the diagonal, -1 per
    neighbour), row-major sorted."""
    grid = np.arange(m * m).reshape(m, m)
    rows, cols = [grid.ravel()], [grid.ravel()]
    for a, b in [(grid[1:], grid[:-1]), (grid[:, 1:], grid[:, :-1])]:
        rows += [a.ravel(), b.ravel()]
        cols += [b.ravel(), a.ravel()]
    r, c = np.concatenate(rows), np.concatenate(cols)
    values = np.where(r == c, 4.0, -1.0).astype(np.float32)
    order = np.lexsort((c, r))
    return values[order], np.stack([r, c], -1)[order].astype(np.int32)


def cg_benchmark(m: int, iterations: int, rounds: int) -> dict[str, Any]:
    values, indices = laplacian(m)
    n = m * m
    q = BCOO(values, indices, (n, n), indices_sorted=True, unique_indices=True)
    j = jsparse.BCOO(
        (jnp.asarray(values), jnp.asarray(indices)),
        shape=(n, n),
        indices_sorted=True,
        unique_indices=True,
    )
    b = jnp.asarray(np.random.default_rng(0).normal(size=n), jnp.float32)

    def solve(a: Any, b: Any) -> Any:
        # tol=0: exactly `iterations` iterations.
        return jspla.cg(lambda v: a @ v, b, tol=0.0, maxiter=iterations)[0]

    quax_solve = jax.jit(quax.quaxify(solve))
    jax_solve = jax.jit(solve)
    times = run_times(
        {"quax": lambda: quax_solve(q, b), "jax BCOO @": lambda: jax_solve(j, b)},
        rounds,
    )

    def peak(fn: Any, a: Any) -> float:
        stats = fn.lower(a, b).compile().memory_analysis()
        total = (
            stats.temp_size_in_bytes
            + stats.argument_size_in_bytes
            + stats.output_size_in_bytes
        )
        return total / 2**20

    # Convergence to 1e-5 (relative residual), for the record.
    converge = jax.jit(
        quax.quaxify(lambda a, b: jspla.cg(lambda v: a @ v, b, tol=1e-5)[0])
    )
    x = converge(q, b)
    residual = float(
        jnp.linalg.norm(quax.quaxify(_matmul)(q, x) - b) / jnp.linalg.norm(b)
    )
    wall, cpu = times["wall"], times["cpu"]
    return {
        "unknowns": n,
        "nse": int(values.size),
        "ms_per_iteration": {
            k: 1e3 * statistics.median(t) / iterations for k, t in wall.items()
        },
        "cpu_ms_per_iteration": {
            k: 1e3 * statistics.median(t) / iterations for k, t in cpu.items()
        },
        "quax/jax BCOO": _ratio(wall, "quax", "jax BCOO @"),
        "quax/jax BCOO (cpu)": _ratio(cpu, "quax", "jax BCOO @"),
        "peak_MiB": {"quax": peak(quax_solve, q), "jax BCOO @": peak(jax_solve, j)},
        "relative_residual_at_tol_1e-5": residual,
    }


def plot(points: list[dict[str, Any]], sizes: tuple[int, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = ["matvec", f"matmat{COLUMNS}"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=80)
    styles = {"quax": "-o", "jax BCOO @": "--s", "sparsify": ":^", "dense": "-.x"}
    colours = dict(zip(sizes, ["C0", "C1", "C2", "C3"], strict=False))
    for ax, op in zip(axes, ops, strict=True):
        for n in sizes:
            pts = [p for p in points if p["op"] == op and p["n"] == n]
            for method, style in styles.items():
                xy = [(p["density"], p["ms"][method]) for p in pts if method in p["ms"]]
                if xy:
                    xs, ys = zip(*xy, strict=True)
                    label = f"{method}, n={n}"
                    ax.plot(xs, ys, style, color=colours[n], label=label, ms=4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density")
        ax.set_ylabel("ms per call")
        ax.set_title(op)
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(quick: bool = False) -> dict[str, Any]:
    sizes = (256, 1024) if quick else (1024, 4096, 16384)
    rounds = 3 if quick else 7
    print(f"JAX {jax.__version__}, {jax.devices()[0].device_kind}, load {load()}")
    print(HEADER)
    points = sweep(sizes, rounds)
    ratios = goal(points)
    for key, r in ratios.items():
        print(
            f"{key}: median {r['median']:.2f}, range {r['range'][0]:.2f}-"
            f"{r['range'][1]:.2f}, above 1.0: {r['above_1']}"
        )
    exponents = {op: fitted_exponent(points, op) for op in ("matvec", "matmat64")}
    crossovers = {
        f"{op} n={n}": crossover(points, op, n)
        for op in ("matvec", "matmat64")
        for n in sizes
    }
    print("\nFitted exponent of quax time in nse:", exponents)
    print("Crossover density against dense:", crossovers)
    m = 128 if quick else 512
    cg = cg_benchmark(m, iterations=20 if quick else 50, rounds=3 if quick else 15)
    print(f"\nCG on the {m} x {m} grid Laplacian ({cg['unknowns']} unknowns):")
    print("| | quax | jax BCOO @ |\n|---|---|---|")
    print(
        f"| ms per iteration | {cg['ms_per_iteration']['quax']:.3f} | "
        f"{cg['ms_per_iteration']['jax BCOO @']:.3f} |"
    )
    print(
        f"| CPU ms per iteration | {cg['cpu_ms_per_iteration']['quax']:.3f} | "
        f"{cg['cpu_ms_per_iteration']['jax BCOO @']:.3f} |"
    )
    print(
        f"| peak memory (MiB, XLA) | {cg['peak_MiB']['quax']:.1f} | "
        f"{cg['peak_MiB']['jax BCOO @']:.1f} |"
    )
    print(
        f"quax / jax BCOO per iteration: {cg['quax/jax BCOO']:.2f} (wall), "
        f"{cg['quax/jax BCOO (cpu)']:.2f} (CPU); load {load()}"
    )
    print(f"relative residual at tol=1e-5: {cg['relative_residual_at_tol_1e-5']:.2e}")
    image = IMAGE / "sparse_density_sweep.png"
    plot(points, sizes, image)
    print(f"plot: docs/images/{image.name}")
    return {
        "sweep": points,
        "fitted_exponent": exponents,
        "crossover_density": crossovers,
        "cg": cg,
        "ratios": ratios,
        "load_at_end": load(),
        "skipped": (
            "dense at n=16384 for matmat (17 GFLOP a call) and every method where "
            "the matrix or the per-entry gather exceeds 1-2 GiB"
        ),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    main(quick=parser.parse_args().quick)
