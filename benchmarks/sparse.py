"""quax-sparse benchmark: sparse matrix products through `jit(quaxify(...))` against
dense `jnp`, against the same product written by hand in JAX (`segment_sum`), and
against `jax.experimental.sparse` (`BCOO @` and `sparsify`), over a
density sweep; the fitted exponent of time in the number of stored entries; the
crossover density against dense; and a conjugate-gradient solve on the 5-point
Laplacian of a 512 x 512 grid (time per iteration and XLA's peak memory).

`--tpu-sweep` runs the accelerator sweep instead (any backend; written for a TPU,
whose ~0.5 ms per compiled call hides a sparse product): dense, `BCOO`, `CSR` and
`BlockSparse` (blocks of 8, 32 and 128) at densities 10%, 1%, 0.1% and 0.01%, `n`
4096 and 16384 (`--quick`: 1024; `--sizes` to choose), each matvec timed as one
compiled call and inside a compiled loop of products, and a CG iteration inside a
loop of iterations; every figure with the device kind, date and JAX version; a
Markdown table, the crossover densities against dense, and the JSON under
`benchmarks/results/` (or `--json PATH`).

Times are medians over interleaved rounds (each round runs every method once, in a
random order, each timed call right after an untimed one), ratios medians of the
per-round ratios. Each call is timed twice: wall-clock time, and the CPU time of this
process (all its threads), which a busy machine disturbs far less (a process that
waits for a core accrues none); on an accelerator, whose programs run while this
process waits, or on a machine that does not account CPU time, the "CPU" columns
read the wall clock too (`_clocks.program_clock`). The load average is printed
beside the figures.
Prints Markdown tables, writes `docs/images/sparse_density_sweep.png`, and returns
the figures.

    python benchmarks/sparse.py [--quick]
    python benchmarks/sparse.py --tpu-sweep [--quick] [--sizes N ...] [--json PATH]
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

import _clocks
import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as jspla
import numpy as np
import quax
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO, CSR, BlockSparse


DENSITIES = (0.001, 0.01, 0.1)
COLUMNS = 64
IMAGE = Path(__file__).resolve().parent.parent / "docs" / "images"
# The clock of the "CPU" columns: this process's CPU time on the CPU backend where
# the machine accounts it, else the wall clock (`_clocks.py`).
CPU = _clocks.program_clock()
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
            wall, cpu = time.perf_counter(), CPU()
            jax.block_until_ready(fns[name]())
            times["cpu"][name].append(CPU() - cpu)
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
    return interpolated_crossover([(p["density"], p["dense/quax"]) for p in pts])


def interpolated_crossover(pts: list[tuple[float, float]]) -> str:
    """The density at which `dense / sparse` (a time ratio) crosses 1, by log-log
    interpolation between `(density, ratio)` points sorted by density: `"> d"`
    where sparse is faster at every density up to `d`, `"< d"` where it is slower
    at every density down to `d`, `"-"` without points."""
    if not pts:
        return "-"
    logs = [(math.log(d), math.log(r)) for d, r in pts]
    for (d0, r0), (d1, r1) in itertools.pairwise(logs):
        if r0 >= 0 >= r1:
            d = d0 + (d1 - d0) * r0 / (r0 - r1) if r0 != r1 else d0
            return f"{100 * math.exp(d):.2g}%"
    if logs[-1][1] > 0:
        return f"> {100 * pts[-1][0]:.3g}%"
    return f"< {100 * pts[0][0]:.3g}%"


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
        f"{cg['quax/jax BCOO (cpu)']:.2f} ({_clocks.name(CPU)}); load {load()}"
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


# The accelerator sweep (`--tpu-sweep`) ------------------------------------------------
#
# On an accelerator a compiled call costs a fixed ~0.5 ms (a TPU v5e, whatever it
# computes), which hides a sparse product's own time. So each product is also timed
# inside one compiled program: a `fori_loop` of `steps` products (a traced trip
# count, so one compilation serves every count), each feeding the next
# (`v <- v0 + s * (A @ v)`, `s` small enough that the iterates stay bounded), and
# the time per product is the slope between one step and many. CG likewise: a
# `fori_loop` of CG iterations (JAX's `cg` update: one product with `A + shift I`,
# two inner products, three vector updates), a fixed count, since `cg` itself stops
# where the residual reaches zero, which a well-conditioned system does early.

SWEEP_DENSITIES = (0.1, 0.01, 0.001, 0.0001)
BLOCK_SIZES = (8, 32, 128)  # a TPU v5e's matrix unit multiplies 128 x 128 tiles
RESULTS = Path(__file__).resolve().parent / "results"


def symmetric_pattern(
    n: int, density: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random symmetric `n x n` pattern of about `density * n^2` off-diagonal
    entries, values normal: `(values, rows, cols)`, row-major sorted, float32."""
    rng = np.random.default_rng(seed)
    draws = max(1, int(density * n * n / 2))
    flat = rng.integers(0, n * n, draws, dtype=np.int64)
    r, c = np.divmod(flat, n)
    upper = np.unique(np.minimum(r, c) * n + np.maximum(r, c))
    r, c = np.divmod(upper[upper % (n + 1) != 0], n)  # the diagonal left out
    values = rng.standard_normal(r.size).astype(np.float32)
    rows, cols = np.concatenate([r, c]), np.concatenate([c, r])
    values = np.concatenate([values, values])
    order = np.argsort(rows * n + cols, kind="stable")
    return values[order], rows[order].astype(np.int32), cols[order].astype(np.int32)


def symmetric_blocks(
    n: int, density: float, bs: int, seed: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """A random symmetric matrix of dense `bs x bs` blocks at about `density` of
    its elements: `(data, indices)` for `BlockSparse`, blocks row-major sorted, or
    `None` where that density is below one block."""
    grid = n // bs
    target = density * grid * grid
    if target < 0.5:
        return None
    rng = np.random.default_rng(seed)
    flat = np.unique(rng.integers(0, grid * grid, max(1, int(target / 2)), np.int64))
    r, c = np.divmod(flat, grid)
    r, c = np.minimum(r, c), np.maximum(r, c)
    keep = np.unique(r * grid + c)
    r, c = np.divmod(keep, grid)
    blocks = rng.standard_normal((r.size, bs, bs)).astype(np.float32)
    diagonal = r == c
    blocks[diagonal] = (blocks[diagonal] + blocks[diagonal].transpose(0, 2, 1)) / 2
    off = ~diagonal
    data = np.concatenate([blocks, blocks[off].transpose(0, 2, 1)])
    rows, cols = np.concatenate([r, c[off]]), np.concatenate([c, r[off]])
    order = np.argsort(rows * grid + cols, kind="stable")
    indices = np.stack([rows, cols], axis=-1)[order].astype(np.int32)
    return data[order], indices


def _time(fn: Callable[[], Any], rounds: int) -> float:
    """The median wall-clock seconds of `rounds` calls, after one untimed call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _per_step(
    run: Callable[[int], Any], rounds: int, target: float, single: float
) -> float:
    """Seconds per step of a compiled loop `run(steps)` (a traced step count): the
    slope between one step and enough steps that the steps beyond the first take
    at least `target` seconds and at least the one-step call, up to `10 * target`
    (its fixed costs, the per-call floor and work hoisted out of the loop, then
    cancel). `single`: the seconds of one call of one step, which bounds the
    first count tried."""
    one = _time(lambda: run(1), rounds)
    steps = max(2, min(16, math.ceil(target / max(single, 1e-6))))
    wanted = max(target, min(one, 10 * target))
    while True:
        total = _time(lambda steps=steps: run(steps), rounds)
        if total - one >= wanted or steps >= 2**16:
            break
        # Grow by 2 to 4 times: noise can make `total - one` tiny or negative,
        # and a count extrapolated from it would run for minutes.
        per_step = (total - one) / (steps - 1)
        needed = 1.2 * wanted / per_step + 1 if per_step > 0 else 4 * steps
        steps = min(2**16, int(steps * min(4, max(2, needed / steps))))
    return max(total - one, 0.0) / (steps - 1)


def _loops(a: Any, v0: Any, scale: Any, shift: Any, products: Any, cg: Any) -> Any:
    """`products` products in a loop, and `cg` CG iterations on `A + shift I` (with
    `b = v0`), in one program (a loop of 0 steps costs nothing)."""
    power = jax.lax.fori_loop(0, products, lambda _, v: v0 + scale * (a @ v), v0)

    def iteration(_: Any, state: Any) -> Any:
        x, r, p, rs = state
        ap = a @ p + shift * p
        pap = jnp.vdot(p, ap)
        alpha = rs / jnp.where(pap == 0, 1, pap)  # 0 once converged, never NaN
        x, r = x + alpha * p, r - alpha * ap
        new = jnp.vdot(r, r)
        p = r + new / jnp.where(rs == 0, 1, rs) * p
        return x, r, p, new

    start = (jnp.zeros_like(v0), v0, v0, jnp.vdot(v0, v0))
    return power, jax.lax.fori_loop(0, cg, iteration, start)[0]


def _measure(
    a: Any, v: Any, scale: float, shift: float, quick: bool, quaxified: bool
) -> tuple[dict[str, Any], np.ndarray]:
    """One method on one matrix: a single compiled matvec (and its compile time),
    the matvec inside a compiled loop, a CG iteration inside CG's loop; and the
    matvec's result."""
    wrap = quax.quaxify if quaxified else (lambda f: f)
    matvec, loops = jax.jit(wrap(_matmul)), jax.jit(wrap(_loops))
    figures: dict[str, Any] = {}
    start = time.perf_counter()
    y = jax.block_until_ready(matvec(a, v))
    figures["compile_s"] = time.perf_counter() - start
    single = _time(lambda: matvec(a, v), 3 if quick else 5)
    rounds = 1 if single > 0.2 else 3
    target = 0.005 if quick else 0.03
    scale_, shift_, zero = jnp.float32(scale), jnp.float32(shift), jnp.int32(0)
    figures["single_call_ms"] = 1e3 * single
    figures["in_loop_us_per_product"] = 1e6 * _per_step(
        lambda k: loops(a, v, scale_, shift_, jnp.int32(k), zero),
        rounds,
        target,
        single,
    )
    figures["cg_us_per_iteration"] = 1e6 * _per_step(
        lambda k: loops(a, v, scale_, shift_, zero, jnp.int32(k)),
        rounds,
        target,
        single,
    )
    return figures, np.asarray(y, np.float64)


def _row_norm(values: np.ndarray, rows: np.ndarray, n: int) -> float:
    """The largest row sum of `|A|` (an upper bound of the spectral radius)."""
    return float(np.bincount(rows, weights=np.abs(values), minlength=n).max())


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _sweep_point(n: int, density: float, quick: bool) -> list[dict[str, Any]]:
    """Dense, `BCOO` and `CSR` on a random symmetric pattern, and `BlockSparse` on
    a random symmetric block pattern of each block size, at one size and density."""
    import scipy.sparse

    v_host = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    v = jnp.asarray(v_host)
    out = []
    values, rows, cols = symmetric_pattern(n, density, seed=n)
    norm = _row_norm(values, rows, n) or 1.0
    want = scipy.sparse.csr_array(
        (values.astype(np.float64), (rows, cols)), shape=(n, n)
    ) @ v_host.astype(np.float64)
    indices = np.stack([rows, cols], -1)
    bcoo = BCOO(values, indices, (n, n), indices_sorted=True)
    indptr = np.searchsorted(rows, np.arange(n + 1)).astype(np.int32)
    methods = {
        "dense": (jax.jit(BCOO.todense)(bcoo), False),
        "BCOO": (bcoo, True),
        "CSR": (CSR(values, cols, indptr, (n, n)), True),
    }
    for name, (a, quaxified) in methods.items():
        figures, y = _measure(a, v, 0.5 / norm, norm + 1.0, quick, quaxified)
        stored = n * n if name == "dense" else int(values.size)
        out.append(
            {
                "method": name,
                "pattern": "random",
                "stored": stored,
                "actual_density": values.size / (n * n),
                "relative_error": _relative_error(y, want),
                **figures,
            }
        )
        del a
    del methods, bcoo
    for bs in BLOCK_SIZES:
        made = symmetric_blocks(n, density, bs, seed=n + bs) if n % bs == 0 else None
        if made is None:
            out.append(
                {
                    "method": f"BlockSparse {bs}",
                    "pattern": f"{bs} x {bs} blocks",
                    "skipped": f"{100 * density:g}% of a {n} x {n} matrix is less "
                    f"than half of one {bs} x {bs} block",
                }
            )
            continue
        data, block_indices = made
        grid_rows = np.repeat(block_indices[:, 0] * bs, bs) + np.tile(
            np.arange(bs), data.shape[0]
        )
        norm = _row_norm(np.abs(data).sum(-1).ravel(), grid_rows, n) or 1.0
        slices = v_host.astype(np.float64).reshape(n // bs, bs)[block_indices[:, 1]]
        want = np.zeros((n // bs, bs))
        np.add.at(want, block_indices[:, 0], np.einsum("kij,kj->ki", data, slices))
        a = BlockSparse(data, block_indices, (n, n))
        figures, y = _measure(a, v, 0.5 / norm, norm + 1.0, quick, True)
        out.append(
            {
                "method": f"BlockSparse {bs}",
                "pattern": f"{bs} x {bs} blocks",
                "stored": int(data.size),
                "actual_density": data.size / (n * n),
                "relative_error": _relative_error(y, want.ravel()),
                **figures,
            }
        )
        del a
    for point in out:
        point.update(n=n, density=density)
    return out


def _sweep_row(p: dict[str, Any], dense: dict[str, Any] | None) -> str:
    if "skipped" in p:
        return (
            f"| {p['n']} | {100 * p['density']:g}% | {p['method']} | - | - | - | - "
            f"| - | - | - | {p['skipped']} |"
        )
    ratio = "-"
    if dense is not None and p["in_loop_us_per_product"] > 0:
        ratio = f"{dense['in_loop_us_per_product'] / p['in_loop_us_per_product']:.2f}"
    cg_ratio = "-"
    if dense is not None and p["cg_us_per_iteration"] > 0:
        cg_ratio = f"{dense['cg_us_per_iteration'] / p['cg_us_per_iteration']:.2f}"
    return (
        f"| {p['n']} | {100 * p['density']:g}% | {p['method']} | "
        f"{100 * p['actual_density']:.3g}% | {p['single_call_ms']:.3f} | "
        f"{p['in_loop_us_per_product']:.1f} | {ratio} | "
        f"{p['cg_us_per_iteration']:.1f} | {cg_ratio} | "
        f"{p['relative_error']:.1e} | |"
    )


SWEEP_HEADER = (
    "| n | density | method | stored density | single call ms | in loop us per "
    "product | dense / method (in loop) | CG us per iteration | dense / method (CG) "
    "| relative error | note |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def sweep_crossover(points: list[dict[str, Any]], key: str) -> dict[str, str]:
    """Per method and size, the density where it takes the time dense takes
    (`key`: the in-loop product or the CG iteration), by log-log interpolation
    between the measured densities."""
    out = {}
    for n in sorted({p["n"] for p in points}):
        dense = {
            p["density"]: p[key]
            for p in points
            if p["n"] == n and p["method"] == "dense" and "skipped" not in p
        }
        for method in dict.fromkeys(p["method"] for p in points if p["n"] == n):
            if method == "dense":
                continue
            pts = sorted(
                (p["actual_density"], dense[p["density"]] / p[key])
                for p in points
                if p["n"] == n
                and p["method"] == method
                and "skipped" not in p
                and p[key] > 0
                and dense[p["density"]] > 0
            )
            out[f"{method} n={n}"] = interpolated_crossover(pts)
    return out


def device_sweep(
    quick: bool = False,
    sizes: tuple[int, ...] | None = None,
    json_path: Path | None = None,
) -> dict[str, Any]:
    """The accelerator sweep: dense, `BCOO`, `CSR` and `BlockSparse` (blocks of 8,
    32 and 128) matvecs and CG iterations over densities 10% to 0.01%, each figure
    with the device kind, date and versions; prints a Markdown table, writes the
    JSON (to `json_path`, by default under `benchmarks/results/`), and returns
    the figures. `sizes`: by default 4096 and 16384 (1024 with `quick`)."""
    import datetime
    import importlib.metadata
    import json
    import platform

    sizes = sizes or ((1024,) if quick else (4096, 16384))
    device = jax.devices()[0]
    stamp = datetime.datetime.now(datetime.UTC)
    environment = {
        "device_kind": device.device_kind,
        "platform": device.platform,
        "date": stamp.isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "quax-sparse": importlib.metadata.version("quax-sparse"),
        "python": platform.python_version(),
        "load_average_at_start": load(),
        "default_matmul_precision": str(
            jax.config.values.get("jax_default_matmul_precision")
        ),
    }
    print(
        f"{environment['device_kind']} ({environment['platform']}), JAX "
        f"{environment['jax']}, {environment['date']}, float32, default matmul "
        f"precision {environment['default_matmul_precision']}"
    )
    print(SWEEP_HEADER, flush=True)
    start = time.perf_counter()
    points = []
    for n in sizes:
        for density in SWEEP_DENSITIES:
            new = _sweep_point(n, density, quick)
            dense = next(p for p in new if p["method"] == "dense")
            for p in new:
                p.update(
                    device_kind=environment["device_kind"],
                    date=environment["date"],
                    jax=environment["jax"],
                )
                print(_sweep_row(p, dense), flush=True)
            points.extend(new)
    crossovers = {
        "in_loop_product": sweep_crossover(points, "in_loop_us_per_product"),
        "cg_iteration": sweep_crossover(points, "cg_us_per_iteration"),
    }
    print("\nCrossover density against dense (in loop):")
    for key, value in crossovers["in_loop_product"].items():
        print(f"- {key}: product {value}, CG {crossovers['cg_iteration'][key]}")
    seconds = time.perf_counter() - start
    print(f"\nSweep: {seconds:.0f} s")
    results = {
        "environment": environment,
        "mode": "quick" if quick else "full",
        "sizes": list(sizes),
        "sweep": points,
        "crossover_density": crossovers,
        "seconds": seconds,
        "load_average_at_end": load(),
    }
    if json_path is None:
        RESULTS.mkdir(exist_ok=True)
        stem = f"sparse_sweep_{device.platform}_{stamp.strftime('%Y-%m-%dT%H%M%S')}"
        json_path = RESULTS / f"{stem}.json"
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"figures: {json_path}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--tpu-sweep",
        action="store_true",
        help="the accelerator sweep instead (any backend: dense, BCOO, CSR and "
        "BlockSparse, matvec and CG, products timed inside one compiled loop)",
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="the sweep's sizes")
    parser.add_argument("--json", type=Path, help="where the sweep writes its JSON")
    args = parser.parse_args()
    if args.tpu_sweep:
        sizes = tuple(args.sizes) if args.sizes else None
        device_sweep(quick=args.quick, sizes=sizes, json_path=args.json)
    else:
        main(quick=args.quick)
