"""quax-structured benchmark: unmodified `jnp` code on structured matrices through
`jit(quaxify(...))`, against dense `jnp`, hand-written JAX and lineax.

- Tridiagonal matrix-vector product (`T @ b`) and solve (`jnp.linalg.solve(T, b)`)
  for n = 256 ... 262,144: against dense `jnp` where the dense matrix fits, against
  hand-written JAX (three shifted products; `lax.linalg.tridiagonal_solve`) and
  against lineax (`TridiagonalLinearOperator` with `lineax.Tridiagonal()`), with the
  scaling exponent of quax's time fitted to the sweep. The product is timed twice:
  one call per product (what a user's jitted step pays, dispatch included) and
  `LOOP` products inside one compiled loop (the product's own cost: at small n a
  call is all dispatch, the same for every method).
- Banded (bandwidths 2, 2) matrix-vector product and solve, and circulant
  matrix-vector product (FFT), for n = 256 ... 262,144 against dense `jnp` where it
  fits, with fitted scaling exponents.
- Kronecker (`A ⊗ B`, SPD factors) and low-rank-plus-diagonal (`D + U Uᵀ`, rank 8)
  solves with `jnp.linalg.solve`: against dense `jnp.linalg.solve` and against lineax
  (a `FunctionLinearOperator` tagged positive definite, solved by `lineax.CG`,
  which is how lineax reaches these structures).
- `Toeplitz` solves and `slogdet` (the Levinson recursion, checked; GKO where the
  check fails) against the Levinson recursion alone, GKO alone and dense `jnp`
  (`--toeplitz` runs only these), and the backward errors the Levinson recursion,
  GKO and dense reach (`--toeplitz-accuracy`: the evidence for the check's
  tolerance).
- The pivoted routes (low-rank-plus-diagonal solves, banded `slogdet`) against
  the unpivoted ones they replaced and dense `jnp`.
- `jnp.linalg.pinv` as a structure (`--pinv`): diagonal, circulant, block-diagonal,
  low-rank and Kronecker, against dense `pinv`.
- The parallel tridiagonal solve (cyclic reduction, the GPU and TPU path) against
  `lax.linalg.tridiagonal_solve` at n = 4,096 ... 1,048,576, many solves in one
  compiled program, on the default backend, with the device kind, date and
  versions written as JSON under `benchmarks/results/` (`--tpu`, made for the
  TPU: `python benchmarks/structured.py --tpu`); and the backward errors of
  cyclic reduction, the sweep without pivoting and `gtsv` on dominant, Laplacian
  and non-dominant systems (`--tridiagonal-accuracy`, the CPU).

Times are medians over interleaved rounds (each round runs every method once);
ratios are medians of the per-round ratios. Prints Markdown tables, writes
`docs/images/structured_scaling.png`, and returns the figures.

    python benchmarks/structured.py [--quick] [--tpu | --tridiagonal-accuracy | ...]
"""

import argparse
import functools as ft
import importlib.metadata
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_structured as qs
from jax import lax
from quax_structured import (
    Banded,
    Circulant,
    Kronecker,
    LowRankPlusDiagonal,
    Toeplitz,
    TridiagonalMatrix,
)
from quax_structured._kernels import (
    gko as _gko,
    in_graph_fallbacks as _in_graph_fallbacks,
    levinson as _levinson,
)


# JAX's CPU LAPACK calls (the Kronecker factors' LU and triangular solves, dense
# `jnp.linalg.solve`) run in scipy's OpenBLAS, whose worker threads spin-wait: on a
# loaded machine one 32 x 32 factor solve then took 100 to 180 ms instead of 0.1 ms
# (the same compiled program, no recompilation). One thread each, unless the
# caller chose; it takes effect if OpenBLAS is not loaded yet (it loads lazily).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


IMAGE = Path(__file__).resolve().parent.parent / "docs" / "images"
SIZES = (256, 1024, 4096, 16384, 65536, 262144)
DENSE_MATVEC_MAX = 8192
DENSE_SOLVE_MAX = 2048
DENSE_LOOP_MAX = 4096
LOOP = 20


def _timed(
    fns: dict[str, Callable[[], Any]], rounds: int, budget: float = 2e-3
) -> dict[str, list[float]]:
    """Each function compiled (a first call), then timed once per round, rounds
    interleaved; each timing is the mean of enough calls to last about `budget`
    seconds (at most 200; with a `budget` above 2 ms, at least 20: a timing of
    a few calls of a fast function on a loaded machine is mostly scheduling)."""
    reps = {}
    for name, fn in fns.items():
        jax.block_until_ready(fn())
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        least = 20 if budget > 2e-3 else 1
        reps[name] = max(
            least, min(200, int(budget / max(time.perf_counter() - t0, 1e-7)))
        )
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(reps[name]):
                out = fn()
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - t0) / reps[name])
    return times


def _compilations(fns: dict[str, Callable[[], Any]]) -> int:
    """How many XLA compilations one more call of each (compiled) function
    triggers, counted by a `jax.monitoring` listener."""
    count = [0]

    def listener(event: str, duration_secs: float, **kwargs: str | int) -> None:
        del duration_secs, kwargs
        count[0] += event == "/jax/core/compile/backend_compile_duration"

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for fn in fns.values():
            jax.block_until_ready(fn())
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return count[0]


def _ratio(times: dict[str, list[float]], slow: str, fast: str) -> float:
    return statistics.median(
        a / b for a, b in zip(times[slow], times[fast], strict=True)
    )


def _quartiles(
    times: dict[str, list[float]], slow: str, fast: str
) -> tuple[float, float]:
    """The first and third quartiles of the per-round ratios whose median
    `_ratio` gives: how far one round's ratio strays."""
    ratios = [a / b for a, b in zip(times[slow], times[fast], strict=True)]
    low, high = np.percentile(ratios, [25, 75])
    return float(low), float(high)


def _tridiagonal(n: int) -> tuple[TridiagonalMatrix, jax.Array]:
    k = jr.split(jr.key(n), 4)
    lower = jr.normal(k[0], (n - 1,))
    upper = jr.normal(k[1], (n - 1,))
    main = 4 + jr.normal(k[2], (n,))
    return TridiagonalMatrix(lower, main, upper), jr.normal(k[3], (n,))


def _handwritten_matvec(lower, main, upper, b):
    out = main * b
    out = out + jnp.pad(upper * b[1:], (0, 1))
    return out + jnp.pad(lower * b[:-1], (1, 0))


def _handwritten_solve(lower, main, upper, b):
    dl = jnp.pad(lower, (1, 0))
    du = jnp.pad(upper, (0, 1))
    return lax.linalg.tridiagonal_solve(dl, main, du, b[:, None])[:, 0]


def _in_loop(product: Callable[[Any, jax.Array], jax.Array]) -> Callable[..., Any]:
    """`LOOP` products `m @ v` in one compiled loop, each feeding the next
    (`v <- b + 1e-3 m v`, which stays bounded for these matrices)."""

    @jax.jit
    def run(m, b):
        return lax.fori_loop(0, LOOP, lambda _, v: b + 1e-3 * product(m, v), b)

    return run


def tridiagonal_sweep(sizes: tuple[int, ...], rounds: int) -> dict[str, Any]:
    import lineax as lx

    matvec = jax.jit(quax.quaxify(lambda t, b: t @ b))
    solve = jax.jit(quax.quaxify(jnp.linalg.solve))
    dense_matvec = jax.jit(lambda a, b: a @ b)
    dense_solve = jax.jit(jnp.linalg.solve)
    hand_matvec = jax.jit(_handwritten_matvec)
    matvec_loop = _in_loop(quax.quaxify(lambda t, b: t @ b))
    dense_loop = _in_loop(lambda a, b: a @ b)
    hand_solve = jax.jit(_handwritten_solve)

    @jax.jit
    def lineax_solve(lower, main, upper, b):
        op = lx.TridiagonalLinearOperator(main, lower, upper)
        return lx.linear_solve(op, b, lx.Tridiagonal()).value

    rows = []
    for n in sizes:
        t, b = _tridiagonal(n)
        parts = (t.lower_diag, t.main_diag, t.upper_diag, b)
        fns = {
            "quax matvec": ft.partial(matvec, t, b),
            "quax matvec (loop)": ft.partial(matvec_loop, t, b),
            "hand matvec": ft.partial(hand_matvec, *parts),
            "quax solve": ft.partial(solve, t, b),
            "hand solve": ft.partial(hand_solve, *parts),
            "lineax solve": ft.partial(lineax_solve, *parts),
        }
        a = None
        if n <= DENSE_MATVEC_MAX:
            a = t.enable_materialise().materialise()
            fns["dense matvec"] = ft.partial(dense_matvec, a, b)
        if n <= DENSE_LOOP_MAX:
            fns["dense matvec (loop)"] = ft.partial(dense_loop, a, b)
        if n <= DENSE_SOLVE_MAX:
            fns["dense solve"] = ft.partial(dense_solve, a, b)
        times = _timed(fns, rounds)
        row: dict[str, Any] = {"n": n}
        row.update({k: statistics.median(v) for k, v in times.items()})
        for key in ("quax matvec (loop)", "dense matvec (loop)"):
            if key in row:
                row[key] /= LOOP  # per product
        if "dense matvec (loop)" in times:
            row["matvec speedup vs dense (loop)"] = _ratio(
                times, "dense matvec (loop)", "quax matvec (loop)"
            )
        if "dense matvec" in times:
            row["matvec speedup vs dense"] = _ratio(
                times, "dense matvec", "quax matvec"
            )
        if "dense solve" in times:
            row["solve speedup vs dense"] = _ratio(times, "dense solve", "quax solve")
        row["matvec quax/hand"] = _ratio(times, "quax matvec", "hand matvec")
        row["solve quax/hand"] = _ratio(times, "quax solve", "hand solve")
        row["solve quax/lineax"] = _ratio(times, "quax solve", "lineax solve")
        rows.append(row)
    ns = np.log([r["n"] for r in rows])
    fit = {
        key: float(np.polyfit(ns, np.log([r[f"quax {key}"] for r in rows]), 1)[0])
        for key in ("matvec", "matvec (loop)", "solve")
    }
    big = [r for r in rows if r["n"] >= 16384]
    if len(big) >= 2:
        nb = np.log([r["n"] for r in big])
        for key in ("matvec", "matvec (loop)", "solve"):
            times_big = np.log([r[f"quax {key}"] for r in big])
            fit[f"{key} (n >= 16384)"] = float(np.polyfit(nb, times_big, 1)[0])
    return {"rows": rows, "exponents": fit}


def banded_circulant_sweep(sizes: tuple[int, ...], rounds: int) -> dict[str, Any]:
    """Banded (p = q = 2) product and solve, circulant product, against dense."""
    matvec = jax.jit(quax.quaxify(lambda m, b: m @ b))
    solve = jax.jit(quax.quaxify(jnp.linalg.solve))
    dense_matvec = jax.jit(lambda a, b: a @ b)
    rows = []
    for n in sizes:
        k = jr.split(jr.key(n), 3)
        bands = jr.normal(k[0], (5, n)).at[2].add(6.0)
        banded, circulant = Banded(bands, 2, 2), Circulant(jr.normal(k[1], (n,)))
        b = jr.normal(k[2], (n,))
        fns = {
            "banded matvec": ft.partial(matvec, banded, b),
            "banded solve": ft.partial(solve, banded, b),
            "circulant matvec": ft.partial(matvec, circulant, b),
        }
        if n <= DENSE_MATVEC_MAX:
            for name, m in (("banded", banded), ("circulant", circulant)):
                a = m.enable_materialise().materialise()
                fns[f"dense {name} matvec"] = ft.partial(dense_matvec, a, b)
        times = _timed(fns, rounds)
        row: dict[str, Any] = {"n": n}
        row.update({key: statistics.median(v) for key, v in times.items()})
        for name in ("banded", "circulant"):
            if f"dense {name} matvec" in times:
                row[f"{name} matvec speedup vs dense"] = _ratio(
                    times, f"dense {name} matvec", f"{name} matvec"
                )
        rows.append(row)
    ns = np.log([r["n"] for r in rows])
    fit = {
        key: float(np.polyfit(ns, np.log([r[key] for r in rows]), 1)[0])
        for key in ("banded matvec", "banded solve", "circulant matvec")
    }
    return {"rows": rows, "exponents": fit}


def _spd(key: jax.Array, n: int) -> jax.Array:
    a = jr.normal(key, (n, n))
    return a @ a.T / n + jnp.eye(n)


def _cg_solve(matvec: Callable[[jax.Array], jax.Array], b: jax.Array) -> jax.Array:
    import lineax as lx

    op = lx.FunctionLinearOperator(
        matvec, jax.ShapeDtypeStruct(b.shape, b.dtype), lx.positive_semidefinite_tag
    )
    return lx.linear_solve(op, b, lx.CG(rtol=1e-6, atol=1e-6, max_steps=10_000)).value


def kronecker_and_low_rank(sizes: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    solve = jax.jit(quax.quaxify(jnp.linalg.solve))
    dense_solve = jax.jit(jnp.linalg.solve)

    @jax.jit
    def lineax_kron(a, c, b):
        return _cg_solve(lambda v: (a @ v.reshape(a.shape[0], -1) @ c.T).ravel(), b)

    @jax.jit
    def lineax_lrpd(d, u, b):
        return _cg_solve(lambda v: d * v + u @ (u.T @ v), b)

    rows = []
    for n in sizes:
        side = round(n**0.5)
        k = jr.split(jr.key(n), 5)
        kron = Kronecker(_spd(k[0], side), _spd(k[1], side), symmetric=True)
        lrpd = LowRankPlusDiagonal(
            1 + jr.uniform(k[2], (n,)), jr.normal(k[3], (n, 8)) / 4
        )
        b = jr.normal(k[4], (n,))
        fns = {
            "quax kronecker": ft.partial(solve, kron, b),
            "lineax kronecker": ft.partial(lineax_kron, kron.left, kron.right, b),
            "quax lrpd": ft.partial(solve, lrpd, b),
            "lineax lrpd": ft.partial(lineax_lrpd, lrpd.diag, lrpd.u, b),
        }
        dk = dl = None
        if n <= DENSE_SOLVE_MAX:
            dk = kron.enable_materialise().materialise()
            dl = lrpd.enable_materialise().materialise()
            fns["dense kronecker"] = ft.partial(dense_solve, dk, b)
            fns["dense lrpd"] = ft.partial(dense_solve, dl, b)
        times = _timed(fns, rounds)
        row: dict[str, Any] = {"n": side * side}
        # The same compiled programs on repeated calls (no retrace, no recompile).
        row["compilations on repeat calls"] = _compilations(fns)
        row.update({k: statistics.median(v) for k, v in times.items()})
        for kind in ("kronecker", "lrpd"):
            row[f"{kind} lineax/quax"] = _ratio(times, f"lineax {kind}", f"quax {kind}")
            if f"dense {kind}" in times:
                row[f"{kind} dense/quax"] = _ratio(
                    times, f"dense {kind}", f"quax {kind}"
                )
        rows.append(row)
    return rows


def toeplitz_solves(sizes: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    """`jnp.linalg.solve` and `slogdet` of a non-symmetric `Toeplitz` through
    `jit(quaxify)` (the Levinson recursion, checked by its backward error; GKO in
    a `lax.cond` branch where the check fails) against the hand-written Levinson
    recursion alone (unchecked; `slogdet`: its pivots, no right-hand side) and
    dense `jnp`: on a matrix the recursion solves accurately (diagonal `sqrt(n)`,
    the rest standard normal), and on one with a tiny leading minor (diagonal
    1e-6: the check fails, GKO runs too) against GKO alone. Ratios are medians of
    per-round ratios."""
    solve = jax.jit(quax.quaxify(jnp.linalg.solve))
    slogdet = jax.jit(quax.quaxify(lambda m: jnp.linalg.slogdet(m)[1]))
    dense_solve = jax.jit(jnp.linalg.solve)
    dense_slogdet = jax.jit(lambda a: jnp.linalg.slogdet(a)[1])
    logdet = lambda pivots: jnp.sum(jnp.log(jnp.abs(pivots)))
    empty = lambda c: jnp.zeros((c.shape[-1], 0), c.dtype)
    hand = {
        "levinson": jax.jit(lambda c, r, b: _levinson(c, r, b[:, None])[0]),
        "levinson slogdet": jax.jit(lambda c, r: logdet(_levinson(c, r, empty(c))[1])),
        "gko": jax.jit(lambda c, r, b: _gko(c, r, b[:, None])[0]),
        "gko slogdet": jax.jit(lambda c, r: logdet(_gko(c, r, empty(c))[1])),
    }
    rows = []
    for n in sizes:
        k = jr.split(jr.key(n), 2)
        column, row = jr.normal(k[0], (2, n))
        b = jr.normal(k[1], (n,))
        fns = {}
        for case, diagonal, fallback in (
            ("accurate", n**0.5, "levinson"),
            ("tiny minor", 1e-6, "gko"),
        ):
            t = Toeplitz(column.at[0].set(diagonal), row.at[0].set(diagonal))
            leaves = (t.column, t.row)
            fns[f"{case} quax"] = ft.partial(solve, t, b)
            fns[f"{case} quax slogdet"] = ft.partial(slogdet, t)
            fns[f"{case} {fallback}"] = ft.partial(hand[fallback], *leaves, b)
            fns[f"{case} {fallback} slogdet"] = ft.partial(
                hand[f"{fallback} slogdet"], *leaves
            )
            if n <= DENSE_SOLVE_MAX:
                dense = t.enable_materialise().materialise()
                fns[f"{case} dense"] = ft.partial(dense_solve, dense, b)
                fns[f"{case} dense slogdet"] = ft.partial(dense_slogdet, dense)
        times = _timed(fns, rounds)
        out: dict[str, Any] = {"n": n, "load": os.getloadavg()[0]}
        out.update({k: statistics.median(v) for k, v in times.items()})
        for case, fallback in (("accurate", "levinson"), ("tiny minor", "gko")):
            for kind in ("", " slogdet"):
                ours = f"{case} quax{kind}"
                for other in (fallback, "dense"):
                    if f"{case} {other}{kind}" in times:
                        out[f"{ours} / {other}"] = _ratio(
                            times, ours, f"{case} {other}{kind}"
                        )
        rows.append(out)
    print("\n## Toeplitz (milliseconds per call; ratios: medians of per-round)\n")
    print(
        "| n | load | solve | / Levinson | / dense | slogdet | / Levinson | / dense "
        "| tiny minor: solve | / GKO | / dense | slogdet | / GKO | / dense |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ms = lambda x: f"{x * 1e3:,.3g}"
    for r in rows:
        cells = [f"{r['n']:,}", f"{r['load']:.1f}"]
        for case, fallback in (("accurate", "levinson"), ("tiny minor", "gko")):
            for kind in ("", " slogdet"):
                ours = f"{case} quax{kind}"
                cells += [
                    ms(r[ours]),
                    _x(r[f"{ours} / {fallback}"]),
                    _x(r.get(f"{ours} / dense")),
                ]
        print("| " + " | ".join(cells) + " |")
    return rows


def toeplitz_accuracy(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """The evidence for `Toeplitz`'s tolerance (`_toeplitz._tolerance`): the
    backward error `‖b - T x‖₂ / (N ‖x‖₂ + ‖b‖₂)` (as the check computes it, `N`
    its bound of `‖T‖₂`; in eps) that the Levinson recursion, GKO and dense
    `jnp.linalg.solve` (partial pivoting, LAPACK) reach on four non-symmetric or
    untagged matrices, in float32 and float64: the audit's (diagonal 2, column
    `0.5^k`, row `(-0.4)^k`: diagonally dominant, cond 1.5), `toeplitz_solves`'
    (diagonal `sqrt(n)`, the rest standard normal), a decaying one (diagonal 1,
    the rest standard normal over `1 + k`: not diagonally dominant) and a
    symmetric positive definite one (`0.7^k`, untagged)."""
    from quax_structured._values._toeplitz import _backward_errors, _tolerance

    check = jax.jit(_backward_errors)
    routes = {
        "levinson": jax.jit(lambda c, r, b: _levinson(c, r, b)[0]),
        "gko": jax.jit(lambda c, r, b: _gko(c, r, b)[0]),
        "dense": jax.jit(lambda c, r, b: jnp.linalg.solve(Toeplitz(c, r).dense(), b)),
    }
    rows = []
    for n in sizes:
        k = jr.split(jr.key(n), 3)
        column, row = jr.normal(k[0], (2, n))
        b = jr.normal(k[1], (n, 1))
        index = jnp.arange(n)
        matrices = {
            "audit": ((0.5**index).at[0].set(2), ((-0.4) ** index).at[0].set(2)),
            "benchmark": (column.at[0].set(n**0.5), row.at[0].set(n**0.5)),
            "decaying": (
                (column / (1 + index)).at[0].set(1),
                (row / (1 + index)).at[0].set(1),
            ),
            "positive definite": (0.7**index, 0.7**index),
        }
        for name, (c, r) in matrices.items():
            for dtype in (jnp.float32, jnp.float64):
                with jax.enable_x64(dtype == jnp.float64):
                    leaves = [jnp.asarray(x, dtype) for x in (c, r, b)]
                    eps = float(jnp.finfo(dtype).eps)
                    out: dict[str, Any] = {
                        "n": n,
                        "dtype": jnp.dtype(dtype).name,
                        "matrix": name,
                        "tolerance": _tolerance(n, dtype) / eps,
                    }
                    for route, solve in routes.items():
                        x = solve(*leaves)
                        out[route] = float(check(*leaves[:2], x, leaves[2])[0]) / eps
                    rows.append(out)
    print(
        "\n## Toeplitz backward errors (eps; the check's `‖b - T x‖ / (N ‖x‖ + ‖b‖)`)\n"
    )
    print("| n | dtype | matrix | Levinson | GKO | dense | tolerance |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:,} | {r['dtype']} | {r['matrix']} | {r['levinson']:.3g} | "
            f"{r['gko']:.3g} | {r['dense']:.3g} | {r['tolerance']:g} |"
        )
    return rows


def _dominant_diagonals(n: int, dtype: Any, seed: int = 0) -> tuple[np.ndarray, ...]:
    """`lax.linalg.tridiagonal_solve`'s diagonals (`dl[0]`, `du[n - 1]` zero) of a
    random strictly diagonally dominant matrix, and a right-hand side, in NumPy."""
    rng = np.random.default_rng(seed)
    dl, du, d = rng.standard_normal((3, n))
    dl[0], du[-1] = 0, 0
    d = np.sign(d) * (np.abs(dl) + np.abs(du) + 0.5 + np.abs(d))
    b = rng.standard_normal((n, 1))
    return tuple(v.astype(dtype) for v in (dl, d, du, b))


def _tridiagonal_backward_error(dl, d, du, x, b) -> float:
    """`‖b - A x‖∞ / (‖A‖∞ ‖x‖∞ + ‖b‖∞)`, in float64 (NumPy) from the leaves."""
    dl, d, du, x, b = (np.asarray(v, np.float64) for v in (dl, d, du, x, b))
    ax = d[:, None] * x
    ax[1:] += dl[1:, None] * x[:-1]
    ax[:-1] += du[:-1, None] * x[1:]
    norm = np.max(np.abs(dl) + np.abs(d) + np.abs(du))
    return float(
        np.max(np.abs(b - ax)) / (norm * np.max(np.abs(x)) + np.max(np.abs(b)))
    )


def _thomas(dl, d, du, b):
    """The sequential sweep without pivoting that `lax.linalg.tridiagonal_solve`
    runs on TPU (the same recurrence as JAX's), written here for the CPU."""

    def forward(carry, row):
        cp, dp = carry
        a, m, c, y = row
        pivot = m - a * cp
        return (c / pivot, (y - a * dp) / pivot), (cp, dp)

    (_, last), (cp, dp) = lax.scan(
        forward, (du[0] / d[0], b[0] / d[0]), (dl[1:], d[1:], du[1:], b[1:])
    )

    def backward(after, row):
        cp, dp = row
        return dp - cp * after, after

    first, rest = lax.scan(backward, last, (cp, dp), reverse=True)
    return jnp.concatenate([first[None], rest])


def tridiagonal_accuracy(sizes: tuple[int, ...], systems: int = 20) -> list[dict]:
    """The evidence for the parallel tridiagonal solve's check
    (`_kernels/_tridiagonal.py`): the normwise backward error (in eps, computed
    in float64) of cyclic reduction unchecked, of the sequential sweep without
    pivoting (JAX's on TPU) and of `lax.linalg.tridiagonal_solve` (LAPACK's
    pivoted `gtsv` on the CPU), median and largest over `systems` random
    systems: strictly diagonally dominant, the `[-1, 2, -1]` Laplacian (weakly
    dominant, positive definite) and standard normal diagonals (no dominance);
    with the check's tolerance. Run on the CPU (float64 there)."""
    from quax_structured._kernels._tridiagonal import TOLERANCE, _cyclic_reduction

    routes = {
        "cyclic reduction": jax.jit(
            lambda dl, d, du, b: _cyclic_reduction(dl, d, du, b.T).T
        ),
        "sweep without pivoting": jax.jit(_thomas),
        "lax": jax.jit(lax.linalg.tridiagonal_solve),
    }
    rows = []
    for n in sizes:
        for dtype in (np.float32, np.float64):
            eps = float(np.finfo(dtype).eps)
            for kind in ("dominant", "laplacian", "no dominance"):
                errors: dict[str, list[float]] = {route: [] for route in routes}
                for seed in range(1 if kind == "laplacian" else systems):
                    rng = np.random.default_rng(seed)
                    if kind == "laplacian":
                        dl, du = -np.ones(n), -np.ones(n)
                        d, b = 2 * np.ones(n), rng.standard_normal((n, 1))
                        dl[0], du[-1] = 0, 0
                        parts = tuple(v.astype(dtype) for v in (dl, d, du, b))
                    elif kind == "dominant":
                        parts = _dominant_diagonals(n, dtype, seed)
                    else:
                        dl, d, du = rng.standard_normal((3, n))
                        dl[0], du[-1] = 0, 0
                        b = rng.standard_normal((n, 1))
                        parts = tuple(v.astype(dtype) for v in (dl, d, du, b))
                    dl, d, du, b = parts
                    with jax.enable_x64(dtype == np.float64):
                        for route, solve in routes.items():
                            x = solve(*(jnp.asarray(v) for v in parts))
                            error = _tridiagonal_backward_error(dl, d, du, x, b)
                            errors[route].append(error / eps)
                row: dict[str, Any] = {
                    "n": n,
                    "dtype": np.dtype(dtype).name,
                    "systems": kind,
                    "tolerance": TOLERANCE * (math.ceil(math.log2(n)) + 1),
                }
                for route, values in errors.items():
                    row[route] = (float(np.median(values)), float(np.max(values)))
                rows.append(row)
    print("\n## Tridiagonal backward errors (eps; median, largest)\n")
    print(
        "| n | dtype | systems | cyclic reduction | sweep without pivoting | "
        "lax (gtsv) | check's tolerance |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = " | ".join(f"{r[route][0]:.3g}, {r[route][1]:.3g}" for route in routes)
        print(
            f"| {r['n']:,} | {r['dtype']} | {r['systems']} | {cells} | "
            f"{r['tolerance']} |"
        )
    return rows


def _repeated(solve: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """`repeats` solves inside one compiled program (a traced trip count: one
    compilation for any count), each right-hand side depending on the previous
    answer (`b + 1e-3 x`), so that none can be skipped or hoisted."""

    @jax.jit
    def run(parts, b, repeats):
        return lax.fori_loop(0, repeats, lambda _, x: solve(parts, b + 1e-3 * x), b)

    return run


def _version(distribution: str) -> str:
    """The installed version of `distribution`, or `"unknown"` (a JAX installed
    without its metadata, as on the lent TPU machine)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def tridiagonal_parallel(
    sizes: tuple[int, ...], rounds: int, budget: float = 0.5, path: Path | None = None
) -> dict[str, Any]:
    """The parallel tridiagonal solve (cyclic reduction, what `jnp.linalg.solve`
    of a `TridiagonalMatrix` runs on GPU and TPU; forced here with
    `tridiagonal_solver("parallel")`, so that the CPU measures it too) against
    `lax.linalg.tridiagonal_solve` (LAPACK's `gtsv` on the CPU, a sequential
    sweep on TPU), float32, one right-hand side, random strictly diagonally
    dominant systems. Each time is per solve, from many solves inside one
    compiled program (`_repeated`, enough to last about `budget` seconds, so
    that the per-call floor of an accelerator does not hide the solve), the
    median over `rounds` interleaved rounds; also one solve per call. With the
    largest difference between the answers and both backward errors. Written
    as JSON to `path` (when given) after each size, so that a run cut short
    keeps the sizes it finished."""
    device = jax.devices()[0]
    report: dict[str, Any] = {
        "benchmark": "structured --tpu: parallel tridiagonal solve",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device kind": device.device_kind,
        "platform": device.platform,
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "quax-structured": _version("quax-structured"),
        "dtype": "float32",
        "rounds": rounds,
        "rows": [],
    }
    ours = _repeated(quax.quaxify(lambda t, v: jnp.linalg.solve(t, v)))

    def by_lax(parts: tuple[jax.Array, jax.Array, jax.Array], v: jax.Array):
        dl, d, du = parts
        return lax.linalg.tridiagonal_solve(dl, d, du, v[:, None])[:, 0]

    theirs = _repeated(by_lax)
    single_ours = jax.jit(quax.quaxify(jnp.linalg.solve))
    single_theirs = jax.jit(by_lax)
    for n in sizes:
        dl, d, du, b = _dominant_diagonals(n, np.float32)
        parts = (jnp.asarray(dl), jnp.asarray(d), jnp.asarray(du))
        t = TridiagonalMatrix(parts[0][1:], parts[1], parts[2][:-1])
        v = jnp.asarray(b[:, 0])
        calls = {
            "parallel": ft.partial(ours, t, v),
            "lax": ft.partial(theirs, parts, v),
            "parallel, one call": ft.partial(single_ours, t, v),
            "lax, one call": ft.partial(single_theirs, parts, v),
        }
        with qs.tridiagonal_solver("parallel"):
            compile_start = time.perf_counter()
            for name, call in calls.items():
                jax.block_until_ready(call(1) if "one call" not in name else call())
            compile_seconds = time.perf_counter() - compile_start
            repeats = {}
            for name in ("parallel", "lax"):
                t0 = time.perf_counter()
                jax.block_until_ready(calls[name](2))
                each = (time.perf_counter() - t0) / 2
                repeats[name] = int(min(500, max(2, budget / max(each, 1e-7))))
            times: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(rounds):
                for name, call in calls.items():
                    count = repeats.get(name, 1)
                    t0 = time.perf_counter()
                    out = call(count) if name in repeats else call()
                    jax.block_until_ready(out)
                    times[name].append((time.perf_counter() - t0) / count)
            x_ours = np.asarray(single_ours(t, v))
        x_theirs = np.asarray(single_theirs(parts, v))
        row: dict[str, Any] = {
            "n": n,
            "repeats": repeats,
            "first calls (s)": compile_seconds,
        }
        row.update({name: statistics.median(ts) for name, ts in times.items()})
        row["lax/parallel"] = _ratio(times, "lax", "parallel")
        row["lax/parallel, one call"] = _ratio(
            times, "lax, one call", "parallel, one call"
        )
        row["max difference"] = float(
            np.max(np.abs(x_ours - x_theirs)) / np.max(np.abs(x_theirs))
        )
        eps = float(np.finfo(np.float32).eps)
        row["backward error parallel (eps)"] = (
            _tridiagonal_backward_error(dl, d, du, x_ours[:, None], b) / eps
        )
        row["backward error lax (eps)"] = (
            _tridiagonal_backward_error(dl, d, du, x_theirs[:, None], b) / eps
        )
        report["rows"].append(row)
        print(f"n = {n:,}: lax/parallel {row['lax/parallel']:.1f}x", flush=True)
        if path is not None:
            path.write_text(json.dumps(report, indent=1) + "\n")
    return report


def print_tridiagonal_parallel(quick: bool = False) -> dict[str, Any]:
    """`tridiagonal_parallel` at n = 4,096, 16,384, 65,536 and 1,048,576
    (`--quick`: the first two), printed, and written as JSON to
    `benchmarks/results/structured_tridiagonal_<platform>_<date>.json`."""
    sizes = (4096, 16384) if quick else (4096, 16384, 65536, 1048576)
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H%M%S")
    path = results / f"structured_tridiagonal_{jax.default_backend()}_{stamp}.json"
    out = tridiagonal_parallel(sizes, rounds=3, path=path)
    print(
        f"\n## Parallel tridiagonal solve against lax.linalg.tridiagonal_solve "
        f"({out['device kind']}, JAX {out['jax']}, {out['date']}; time per solve, "
        "many solves in one compiled program)\n"
    )
    print(
        "| n | parallel | lax | lax/parallel | one call: parallel | lax | "
        "lax/parallel | difference | backward error parallel, lax (eps) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in out["rows"]:
        print(
            f"| {r['n']:,} | {_us(r['parallel'])} | {_us(r['lax'])} | "
            f"{_x(r['lax/parallel'])} | {_us(r['parallel, one call'])} | "
            f"{_us(r['lax, one call'])} | {_x(r['lax/parallel, one call'])} | "
            f"{_e(r['max difference'])} | "
            f"{r['backward error parallel (eps)']:.2g}, "
            f"{r['backward error lax (eps)']:.2g} |"
        )
    print(f"\nRaw figures: {path}")
    return out


def pivoted_solves(sizes: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    """The pivoted routes against the unpivoted ones they replaced and dense `jnp`:
    `jnp.linalg.solve` of `D + U Vᵀ` (rank 8: the better of the semiseparable LU
    and Woodbury, against the LU alone), and `slogdet` of a `Banded` (p = q = 2:
    the pivoted elimination's pivots, against the LU without pivoting). The
    `Toeplitz` routes: `toeplitz_solves`."""
    solve = jax.jit(quax.quaxify(jnp.linalg.solve))
    slogdet = jax.jit(quax.quaxify(lambda m: jnp.linalg.slogdet(m)[1]))
    dense_solve = jax.jit(jnp.linalg.solve)
    dense_slogdet = jax.jit(lambda a: jnp.linalg.slogdet(a)[1])
    unpivoted = jax.jit(
        lambda bands: jnp.sum(
            jnp.log(jnp.abs(Banded(bands, 2, 2)._packed_lu().bands[2]))
        )
    )
    rows = []
    for n in sizes:
        k = jr.split(jr.key(n), 6)
        lrpd = LowRankPlusDiagonal(
            1 + jr.uniform(k[1], (n,)),
            jr.normal(k[2], (n, 8)) / 4,
            jr.normal(k[3], (n, 8)) / 4,
        )
        bands = jr.normal(k[4], (5, n)).at[2].add(2.0)
        b = jr.normal(k[5], (n,))
        fns = {
            "lrpd pivoted": ft.partial(solve, lrpd, b),
            "lrpd lu": ft.partial(solve, lrpd.semiseparable(), b),
            "banded slogdet pivoted": ft.partial(slogdet, Banded(bands, 2, 2)),
            "banded slogdet lu": ft.partial(unpivoted, bands),
        }
        if n <= DENSE_SOLVE_MAX:
            dense = lrpd.enable_materialise().materialise()
            fns["lrpd dense"] = ft.partial(dense_solve, dense, b)
            dense = Banded(bands, 2, 2, allow_materialise=True).materialise()
            fns["banded slogdet dense"] = ft.partial(dense_slogdet, dense)
        times = _timed(fns, rounds)
        out: dict[str, Any] = {"n": n}
        out.update({k: statistics.median(v) for k, v in times.items()})
        for new, old in (
            ("lrpd pivoted", "lrpd lu"),
            ("banded slogdet pivoted", "banded slogdet lu"),
        ):
            out[f"{new} / unpivoted"] = _ratio(times, new, old)
            dense = new.rsplit(" ", 1)[0] + " dense"
            if dense in times:
                out[f"{dense} / {new}"] = _ratio(times, dense, new)
        rows.append(out)
    print("\n## Pivoted routes (microseconds per call; ratios in one run)\n")
    print(
        "| n | D + UVᵀ solve | / LU alone | dense / quax | banded slogdet | "
        "/ unpivoted | dense / quax |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:,} | {_us(r['lrpd pivoted'])} | "
            f"{_x(r['lrpd pivoted / unpivoted'])} | "
            f"{_x(r.get('lrpd dense / lrpd pivoted'))} | "
            f"{_us(r['banded slogdet pivoted'])} | "
            f"{_x(r['banded slogdet pivoted / unpivoted'])} | "
            f"{_x(r.get('banded slogdet dense / banded slogdet pivoted'))} |"
        )
    return rows


def determinant_gradients(sizes: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    """`jax.grad` of `slogdet` and of `det` with respect to a tridiagonal matrix's
    three diagonals, quax (the continuant's derivative, O(n)) against the same
    `jnp` call on the dense matrix where it fits (`DENSE_SOLVE_MAX`; a
    determinant near 1e-5 at n = 1,024, which float32 holds), with the largest
    relative difference of the gradients."""
    rows = []
    for n in sizes:
        k = jr.split(jr.key(n), 3)
        diags = (
            jr.normal(k[0], (n - 1,)) / 10,
            1 + jr.normal(k[1], (n,)) / 100,
            jr.normal(k[2], (n - 1,)) / 10,
        )
        row: dict[str, Any] = {"n": n}
        fns: dict[str, Callable[[], Any]] = {}
        grads = {}
        dense = n <= DENSE_SOLVE_MAX
        for name, fn in (
            ("slogdet", lambda a: jnp.linalg.slogdet(a)[1]),
            ("det", jnp.linalg.det),
        ):
            quax_grad = jax.jit(
                jax.grad(lambda d, fn=fn: quax.quaxify(fn)(TridiagonalMatrix(*d)))
            )
            fns[f"quax {name}"] = ft.partial(quax_grad, diags)
            if not dense:
                continue
            dense_grad = jax.jit(
                jax.grad(lambda d, fn=fn: fn(TridiagonalMatrix(*d, True).dense()))
            )
            fns[f"dense {name}"] = ft.partial(dense_grad, diags)
            got, want = quax_grad(diags), dense_grad(diags)
            grads[name] = max(
                float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
                for g, w in zip(got, want, strict=True)
            )
        times = _timed(fns, rounds)
        for name in ("slogdet", "det"):
            row[f"quax grad {name}"] = statistics.median(times[f"quax {name}"])
            if dense:
                row[f"dense grad {name}"] = statistics.median(times[f"dense {name}"])
                row[f"grad {name} dense/quax"] = _ratio(
                    times, f"dense {name}", f"quax {name}"
                )
                row[f"grad {name} max relative difference"] = grads[name]
        rows.append(row)
    return rows


def _e(x: float | None) -> str:
    return "" if x is None else f"{x:.1e}"


def _us(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x * 1e6:,.2f}" if x < 1e-5 else f"{x * 1e6:,.1f}"


def _x(x: float | None) -> str:
    return "" if x is None else f"{x:,.1f}x"


def _plot(tri: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=80)
    rows = tri["rows"]
    for key, style in [
        ("quax matvec", "o-"),
        ("quax matvec (loop)", "o-."),
        ("quax solve", "s-"),
        ("hand solve", "s:"),
        ("lineax solve", "^:"),
        ("dense matvec", "o--"),
        ("dense matvec (loop)", "o:"),
        ("dense solve", "s--"),
    ]:
        pts = [(r["n"], r[key]) for r in rows if key in r]
        if pts:
            ax.loglog(*zip(*pts, strict=True), style, label=key, markersize=4)
    ax.set_xlabel("n")
    ax.set_ylabel("seconds per call (loop: per product)")
    ax.set_title("Tridiagonal, jit(quaxify(...)), CPU")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def woodbury_solves(sizes: tuple[int, ...], rounds: int) -> list[dict[str, Any]]:
    """`jnp.linalg.solve` on a rank-8 `LowRankPlusDiagonal` (Woodbury first, its
    capacitance by Cholesky, the LU only in a `lax.cond` branch where Woodbury's
    backward error is too large) against a hand-written Woodbury solve (its
    capacitance by `jnp.linalg.solve`, as a user would write it), both under
    `jit` (issue 29, item 7: the goal is at most 1.5x)."""
    return [_woodbury_row(n, rounds) for n in sizes]


def _woodbury_row(n: int, rounds: int) -> dict[str, Any]:
    key = jax.random.split(jax.random.key(n), 3)
    diag = 1 + jax.random.uniform(key[0], (n,))
    u = jax.random.normal(key[1], (n, 8)) / jnp.sqrt(n)
    b = jax.random.normal(key[2], (n,))
    m = qs.LowRankPlusDiagonal(diag, u)

    hand = jax.jit(_woodbury_by_hand)

    # Where the time goes: the same matrix's Woodbury alone, then with its
    # backward-error check (on a vector, as `pivoted_solve` runs them for one
    # right-hand side), then the whole `pivoted_solve` (check and `lax.cond`),
    # each jitted on its own.
    column = b[:, None]
    parts = {
        "woodbury": jax.jit(lambda m, b: m._woodbury(b[:, 0])),
        "checked": jax.jit(
            lambda m, b: m._woodbury_accurate(b[:, 0], *m._woodbury_steps(b[:, 0]))
        ),
        "pivoted": jax.jit(lambda m, b: m.pivoted_solve(b, transpose=False)),
    }
    quax_solve = jax.jit(quax.quaxify(jnp.linalg.solve))
    slogdet, lemma = jax.jit(quax.quaxify(jnp.linalg.slogdet)), jax.jit(_lemma_by_hand)
    # The same programs with the fallback branch inside them (as before it ran
    # through the host on the CPU backend): compiled under the setting, called
    # outside it (a compiled program no longer reads it).
    with _in_graph_fallbacks():
        in_graph_solve = quax_solve.lower(m, b).compile()
        in_graph_slogdet = slogdet.lower(m).compile()
    fns = {"quax": lambda: quax_solve(m, b), "hand": lambda: hand(diag, u, b)}
    fns.update(slogdet=lambda: slogdet(m), lemma=lambda: lemma(diag, u))
    fns.update(
        in_graph=lambda: in_graph_solve(m, b),
        in_graph_slogdet=lambda: in_graph_slogdet(m),
    )
    fns.update({k: ft.partial(f, m, column) for k, f in parts.items()})
    times = _timed(fns, rounds, budget=5e-3)
    error = float(jnp.max(jnp.abs(fns["quax"]() - fns["hand"]())))
    return {
        "n": n,
        "quax solve": statistics.median(times["quax"]),
        "hand-written Woodbury": statistics.median(times["hand"]),
        "quax/hand": _ratio(times, "quax", "hand"),
        "quax/hand quartiles": _quartiles(times, "quax", "hand"),
        "in-graph fallback/hand": _ratio(times, "in_graph", "hand"),
        "Woodbury alone/hand": _ratio(times, "woodbury", "hand"),
        "Woodbury + check/hand": _ratio(times, "checked", "hand"),
        "pivoted_solve/hand": _ratio(times, "pivoted", "hand"),
        "slogdet/hand lemma": _ratio(times, "slogdet", "lemma"),
        "in-graph slogdet/hand lemma": _ratio(times, "in_graph_slogdet", "lemma"),
        "max abs difference": error,
    }


def woodbury_under_vmap(n: int, rounds: int, batch: int = 8) -> dict[str, Any]:
    """The `LowRankPlusDiagonal` solve under `jax.vmap`, against the hand-written
    Woodbury solve vmapped the same way: over `batch` right-hand sides and over
    `batch` matrices. Either way the backward-error check is per system, so the
    predicate is batched, the `lax.cond` becomes a select and the semiseparable
    LU (a sequential scan) runs beside Woodbury on every call."""
    key = jax.random.split(jax.random.key(n), 3)
    diag = 1 + jax.random.uniform(key[0], (batch, n))
    u = jax.random.normal(key[1], (batch, n, 8)) / jnp.sqrt(n)
    b = jax.random.normal(key[2], (batch, n))
    solve = quax.quaxify(jnp.linalg.solve)

    def ours(diag, u, b):
        return solve(qs.LowRankPlusDiagonal(diag, u), b)

    over_b = (None, None, 0)
    fns = {
        "quax, vmap over b": jax.jit(jax.vmap(ours, over_b)),
        "hand, vmap over b": jax.jit(jax.vmap(_woodbury_by_hand, over_b)),
        "quax, vmap over matrices": jax.jit(jax.vmap(ours)),
        "hand, vmap over matrices": jax.jit(jax.vmap(_woodbury_by_hand)),
    }
    calls = {
        name: ft.partial(f, diag[0], u[0], b)
        if "over b" in name
        else ft.partial(f, diag, u, b)
        for name, f in fns.items()
    }
    times = _timed(calls, rounds, budget=5e-3)
    return {
        "n": n,
        "batch": batch,
        "vmap over b: quax/hand": _ratio(
            times, "quax, vmap over b", "hand, vmap over b"
        ),
        "vmap over matrices: quax/hand": _ratio(
            times, "quax, vmap over matrices", "hand, vmap over matrices"
        ),
    }


def _lemma_by_hand(d, u):
    """`slogdet` of `diag(d) + U Uᵀ` by the matrix determinant lemma, by hand."""
    k = jnp.eye(u.shape[1]) + u.T @ (u / d[:, None])
    sk, lk = jnp.linalg.slogdet(k)
    sd, ld = _from_pivots(d)
    return sd * sk, ld + lk


def _woodbury_by_hand(diag, u, b):
    """A hand-written Woodbury solve of `(diag(d) + U Uᵀ) x = b`."""
    scaled = u / diag[:, None]
    k = jnp.eye(u.shape[1], dtype=u.dtype) + u.T @ scaled
    w = b / diag
    return w - scaled @ jnp.linalg.solve(k, u.T @ w)


def _thomas_slogdet(lower, main, upper):
    """`slogdet` of a tridiagonal matrix by hand: the Thomas pivots (no pivoting)."""

    def step(d, x):
        a, m, c = x
        d = m - a * c / d
        return d, d

    _, rest = lax.scan(step, main[0], (lower, main[1:], upper))
    pivots = jnp.concatenate([main[:1], rest])
    return jnp.prod(jnp.sign(pivots)), jnp.sum(jnp.log(jnp.abs(pivots)))


def _blocks_slogdet(blocks):
    """`slogdet` of a block-diagonal matrix: its blocks' (batched)."""
    sign, logdet = jnp.linalg.slogdet(blocks)
    return jnp.prod(sign), jnp.sum(logdet)


def _from_pivots(pivots):
    """`(sign, log |det|)` from numbers whose product is the determinant."""
    size = jnp.abs(pivots)
    return jnp.real(jnp.prod(pivots / size)), jnp.sum(jnp.log(size))


def _audit_cases(
    n: int,
) -> list[tuple[str, Any, tuple[Any, ...], Callable[..., Any], Callable[..., Any]]]:
    """For each structure: its name, the structured matrix, the leaves the
    hand-written functions take, the hand-written solve `(*leaves, b)` and the
    hand-written slogdet `(*leaves)`: the best plain JAX for it."""
    k = jr.split(jr.key(n), 8)
    side, block = round(n**0.5), 8
    tri, _ = _tridiagonal(n)
    d = 1 + jr.uniform(k[0], (n,))
    lower = jnp.tril(jr.normal(k[1], (n, n)) / n) + jnp.diag(d)
    u = jr.normal(k[2], (n, 8)) / jnp.sqrt(n)
    fa, fb = _spd(k[3], side), _spd(k[4], side)
    blocks = jr.normal(k[5], (n // block, block, block)) + 4 * jnp.eye(block)
    column = jr.normal(k[6], (n,)) / n
    circulant = column.at[0].set(2.0)
    toeplitz = (0.5 ** jnp.arange(n)).at[0].set(2.0)
    toeplitz_row = (-0.4) ** jnp.arange(n)

    def kron_solve(a, c, b):
        x = b.reshape(a.shape[0], c.shape[0])
        return jnp.linalg.solve(a, jnp.linalg.solve(c, x.T).T).reshape(-1)

    def kron_slogdet(a, c):
        (sa, la), (sc, lc) = jnp.linalg.slogdet(a), jnp.linalg.slogdet(c)
        return sa ** c.shape[0] * sc ** a.shape[0], c.shape[0] * la + a.shape[0] * lc

    def eig_parts(a, c, s):
        (wa, qa), (wc, qc) = jnp.linalg.eigh(a), jnp.linalg.eigh(c)
        return qa, qc, jnp.outer(wa, wc) + s

    def kpi_solve(a, c, s, b):
        qa, qc, w = eig_parts(a, c, s)
        x = b.reshape(a.shape[0], c.shape[0])
        return (qa @ ((qa.T @ x @ qc) / w) @ qc.T).reshape(-1)

    def circulant_solve(c, b):
        return jnp.fft.ifft(jnp.fft.fft(b) / jnp.fft.fft(c)).real

    def levinson_solve(c, r, b):
        return _levinson(c, r, b[:, None])[0][:, 0]

    def levinson_slogdet(c, r):
        # The pivots alone (no right-hand side).
        return _from_pivots(_levinson(c, r, jnp.zeros((c.shape[0], 0)))[1])

    noise = 0.1
    return [
        (
            "TridiagonalMatrix",
            tri,
            (tri.lower_diag, tri.main_diag, tri.upper_diag),
            _handwritten_solve,
            _thomas_slogdet,
        ),
        ("Diagonal", qs.Diagonal(d), (d,), lambda d, b: b / d, _from_pivots),
        (
            "LowerTriangular",
            qs.LowerTriangular(lower),
            (lower,),
            lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True),
            lambda a: _from_pivots(jnp.diagonal(a)),
        ),
        (
            "LowRankPlusDiagonal (rank 8)",
            LowRankPlusDiagonal(d, u),
            (d, u),
            _woodbury_by_hand,
            _lemma_by_hand,
        ),
        (
            f"Kronecker ({side} x {side} factors)",
            Kronecker(fa, fb, symmetric=True),
            (fa, fb),
            kron_solve,
            kron_slogdet,
        ),
        (
            "KroneckerPlusIdentity",
            qs.KroneckerPlusIdentity(fa, fb, jnp.asarray(noise)),
            (fa, fb, jnp.asarray(noise)),
            kpi_solve,
            lambda a, c, s: _from_pivots(eig_parts(a, c, s)[2]),
        ),
        (
            f"BlockDiagonal (blocks of {block})",
            qs.BlockDiagonal(blocks),
            (blocks,),
            lambda x, b: jnp.linalg.solve(x, b.reshape(-1, block, 1)).reshape(-1),
            _blocks_slogdet,
        ),
        (
            "Circulant",
            Circulant(circulant),
            (circulant,),
            circulant_solve,
            lambda c: _from_pivots(jnp.fft.fft(c)),
        ),
        (
            "Toeplitz, positive_definite (Levinson)",
            Toeplitz(toeplitz, toeplitz, positive_definite=True),
            (toeplitz, toeplitz),
            levinson_solve,
            levinson_slogdet,
        ),
        (
            "Toeplitz, non-symmetric (Levinson, checked)",
            Toeplitz(toeplitz, toeplitz_row),
            (toeplitz, toeplitz_row),
            levinson_solve,
            levinson_slogdet,
        ),
    ]


def solve_audit(n: int, rounds: int) -> list[dict[str, Any]]:
    """Every structure's `jnp.linalg.solve` and `slogdet` through `jit(quaxify)`
    against the best hand-written JAX for it (issue 29, item 7), at size `n`:
    ratios are medians of per-round ratios, every structure's four functions
    interleaved in one run."""
    solve = jax.jit(quax.quaxify(jnp.linalg.solve))
    slogdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))
    b = jr.normal(jr.key(0), (n,))
    rows = []
    for name, matrix, leaves, hand_solve, hand_slogdet in _audit_cases(n):
        hs, hl = jax.jit(hand_solve), jax.jit(hand_slogdet)
        fns = {
            "solve": ft.partial(solve, matrix, b),
            "hand solve": ft.partial(hs, *leaves, b),
            "slogdet": ft.partial(slogdet, matrix),
            "hand slogdet": ft.partial(hl, *leaves),
        }
        times = _timed(fns, rounds, budget=5e-3)
        x, want = fns["solve"](), fns["hand solve"]()
        (s1, l1), (s2, l2) = fns["slogdet"](), fns["hand slogdet"]()
        rows.append(
            {
                "structure": name,
                "solve": statistics.median(times["solve"]),
                "hand solve": statistics.median(times["hand solve"]),
                "solve ours/hand": _ratio(times, "solve", "hand solve"),
                "slogdet": statistics.median(times["slogdet"]),
                "hand slogdet": statistics.median(times["hand slogdet"]),
                "slogdet ours/hand": _ratio(times, "slogdet", "hand slogdet"),
                "solve max relative difference": float(
                    jnp.max(jnp.abs(x - want)) / jnp.max(jnp.abs(want))
                ),
                # The signs agree to rounding (the hand-written ones of the
                # FFT and the eigenvalues are products of unit numbers).
                "slogdet sign difference": float(jnp.abs(s1 - s2)),
                "slogdet difference": float(jnp.abs(l1 - l2) / jnp.abs(l2)),
            }
        )
    return rows


def grid_gp(sides: tuple[int, ...], rounds: int, dense_max: int = 4096):
    """The log marginal likelihood of a Gaussian process on a 2-D grid (`side²`
    points, a product kernel `A ⊗ B` plus noise `σ² I`, written in plain `jnp`)
    and its gradient with respect to both factors and the noise, under `jit`,
    through `KroneckerPlusIdentity` (the factors' eigendecompositions), against
    the same code on the dense matrix where it fits (n <= `dense_max`)."""
    rows = [_grid_gp_row(side, rounds, dense_max) for side in sides]
    ns = np.log([r["n"] for r in rows])
    exponent = float(np.polyfit(ns, np.log([r["quax grad"] for r in rows]), 1)[0])
    return {"rows": rows, "exponent": exponent}


def _grid_gp_row(side: int, rounds: int, dense_max: int) -> dict[str, Any]:
    x = jnp.linspace(0, 1, side)
    kernel = jnp.exp(-((x[:, None] - x[None, :]) ** 2) / 0.1)
    n = side * side
    y = jnp.cos(jnp.arange(n) * 0.37)

    def loss(k, s):
        c = k + s
        return y @ jnp.linalg.solve(c, y) + jnp.linalg.slogdet(c)[1]

    k = qs.Kronecker(kernel, kernel, symmetric=True)
    noise = qs.ScaledIdentity(jnp.array(0.1), n)
    grad = jax.jit(jax.grad(quax.quaxify(loss), argnums=(0, 1)))
    fns = {"quax": lambda: grad(k, noise)}
    if n <= dense_max:

        def dense_loss(a, b, s):
            c = jnp.kron(a, b) + s * jnp.eye(n)
            return y @ jnp.linalg.solve(c, y) + jnp.linalg.slogdet(c)[1]

        dense = jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2)))
        fns["dense"] = lambda: dense(kernel, kernel, jnp.array(0.1))
    times = _timed(fns, rounds)
    row = {"n": n, "quax grad": statistics.median(times["quax"])}
    if "dense" in fns:
        row["dense grad"] = statistics.median(times["dense"])
        row["dense/quax"] = _ratio(times, "dense", "quax")
        got, want = fns["quax"](), fns["dense"]()
        row["max relative difference (noise)"] = float(
            jnp.abs(got[1].scale - want[2]) / jnp.abs(want[2])
        )
    return row


def grid_gp_3d(
    sides: tuple[int, ...], rounds: int, dense_max: int = 4096, big_side: int = 100
) -> dict[str, Any]:
    """The grid Gaussian process of `grid_gp` on a 3-D grid (`side³` points, `K =
    A ⊗ A ⊗ A` plus `σ² I`, a three-factor `KroneckerPlusIdentity`): the loss and
    its gradient with respect to the three factors and the noise, under `jit`,
    against the same code on the dense matrix where it fits (n <= `dense_max`);
    then the `big_side³` grid (10⁶ points for the issue's 100 x 100 x 100): its
    first call (tracing, compiling, running) and the median of three more."""
    rows = [_grid_gp_3d_row(side, rounds, dense_max) for side in sides]
    ns = np.log([r["n"] for r in rows])
    exponent = float(np.polyfit(ns, np.log([r["quax grad"] for r in rows]), 1)[0])
    fn, args = _grid_gp_3d_case(big_side)
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        runs.append(time.perf_counter() - t0)
    big = {
        "n": big_side**3,
        "first call": first,
        "median call": statistics.median(runs),
    }
    return {"rows": rows, "exponent": exponent, "big": big}


def _grid_gp_3d_case(side: int) -> tuple[Callable[..., Any], tuple]:
    """The jitted value and gradient of the 3-D grid GP's loss, and its inputs."""
    x = jnp.linspace(0, 1, side)
    kernel = jnp.exp(-((x[:, None] - x[None, :]) ** 2) / 0.1)
    n = side**3
    y = jnp.cos(jnp.arange(n) * 0.37)

    def loss(k, s):
        c = k + s
        return y @ jnp.linalg.solve(c, y) + jnp.linalg.slogdet(c)[1]

    k = qs.Kronecker(kernel, kernel, kernel, symmetric=True)
    noise = qs.ScaledIdentity(jnp.array(0.1), n)
    fn = jax.jit(jax.value_and_grad(quax.quaxify(loss), argnums=(0, 1)))
    return fn, (k, noise)


def _grid_gp_3d_row(side: int, rounds: int, dense_max: int) -> dict[str, Any]:
    fn, args = _grid_gp_3d_case(side)
    kernel = args[0].matrices[0]
    n = side**3
    y = jnp.cos(jnp.arange(n) * 0.37)
    fns = {"quax": lambda: fn(*args)}
    if n <= dense_max:

        def dense_loss(a, b, c, s):
            m = jnp.kron(jnp.kron(a, b), c) + s * jnp.eye(n)
            return y @ jnp.linalg.solve(m, y) + jnp.linalg.slogdet(m)[1]

        dense = jax.jit(jax.value_and_grad(dense_loss, argnums=(0, 1, 2, 3)))
        fns["dense"] = lambda: dense(kernel, kernel, kernel, jnp.array(0.1))
    times = _timed(fns, rounds)
    row = {"n": n, "quax grad": statistics.median(times["quax"])}
    if "dense" in fns:
        row["dense grad"] = statistics.median(times["dense"])
        row["dense/quax"] = _ratio(times, "dense", "quax")
        (_, got), (_, want) = fns["quax"](), fns["dense"]()
        row["max relative difference (noise)"] = float(
            jnp.abs(got[1].scale - want[3]) / jnp.abs(want[3])
        )
        row["max relative difference (factors)"] = max(
            float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
            for g, w in zip(got[0].matrices, want[:3], strict=True)
        )
    return row


def print_closed_forms(quick: bool = False) -> dict[str, Any]:
    """The sections of issue 29's items 4 and 7: the `LowRankPlusDiagonal` solve
    against hand-written Woodbury, and the grid Gaussian process."""
    rounds = 5 if quick else 15
    wood = woodbury_solves((256, 1024, 4096), rounds)
    print("\n## D + U Uᵀ solve, rank 8 (microseconds per call)\n")
    print(
        "| n | quax solve | hand-written Woodbury | quax/hand | Woodbury alone/hand "
        "| + backward-error check/hand | + lax.cond (pivoted_solve)/hand "
        "| max abs difference |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in wood:
        print(
            f"| {r['n']:,} | {_us(r['quax solve'])} | "
            f"{_us(r['hand-written Woodbury'])} | {r['quax/hand']:.2f} | "
            f"{r['Woodbury alone/hand']:.2f} | {r['Woodbury + check/hand']:.2f} | "
            f"{r['pivoted_solve/hand']:.2f} | {_e(r['max abs difference'])} |"
        )
    gp = grid_gp((16, 32, 64) if quick else (16, 32, 64, 128, 256), rounds)
    print("\n## Grid GP: grad of the marginal likelihood (microseconds per call)\n")
    print("| n | quax | dense | dense/quax | max relative difference (noise) |")
    print("|---|---|---|---|---|")
    for r in gp["rows"]:
        print(
            f"| {r['n']:,} | {_us(r['quax grad'])} | {_us(r.get('dense grad'))} | "
            f"{_x(r.get('dense/quax'))} | "
            f"{_e(r.get('max relative difference (noise)'))} |"
        )
    print("\nFitted exponent (time ~ n^k):", round(gp["exponent"], 2))
    gp3 = grid_gp_3d((4, 8, 12, 16) if quick else (4, 8, 12, 16, 24, 32), rounds)
    print("\n## 3-D grid GP: value and grad of the marginal likelihood (µs per call)\n")
    print(
        "| n | quax | dense | dense/quax | max relative difference (noise) "
        "| max relative difference (factors) |"
    )
    print("|---|---|---|---|---|---|")
    for r in gp3["rows"]:
        print(
            f"| {r['n']:,} | {_us(r['quax grad'])} | {_us(r.get('dense grad'))} | "
            f"{_x(r.get('dense/quax'))} | "
            f"{_e(r.get('max relative difference (noise)'))} | "
            f"{_e(r.get('max relative difference (factors)'))} |"
        )
    print("\nFitted exponent (time ~ n^k):", round(gp3["exponent"], 2))
    big = gp3["big"]
    print(
        f"n = {big['n']:,}: first call (trace, compile, run) "
        f"{big['first call']:.2f} s, then {big['median call']:.2f} s per call "
        "(median of 3)"
    )
    return {"woodbury": wood, "grid_gp": gp, "grid_gp_3d": gp3}


def print_solve_audit(quick: bool = False) -> dict[str, Any]:
    """Issue 29, item 7: the `LowRankPlusDiagonal` solve against hand-written
    Woodbury at n = 256, 1,024, 4,096 (and under `vmap`), then every structure's
    `solve`/`slogdet` against the best hand-written JAX for it, at n = 1,024."""
    rounds = 7 if quick else 25
    print(
        f"\nJAX {jax.__version__}, {jax.devices()[0].device_kind}, "
        f"load average {os.getloadavg()[0]:.1f}, OPENBLAS_NUM_THREADS="
        f"{os.environ['OPENBLAS_NUM_THREADS']}"
    )
    wood = woodbury_solves((256, 1024, 4096), rounds)
    print("\n## D + U Uᵀ solve, rank 8: quax / hand-written Woodbury\n")
    print(
        "| n | quax solve (µs) | hand-written (µs) | quax/hand (quartiles) "
        "| goal (1.5x) met | "
        "fallback in the program/hand | Woodbury alone/hand | Woodbury + check/hand "
        "| slogdet/hand lemma | slogdet, fallback in the program/hand lemma |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in wood:
        print(
            f"| {r['n']:,} | {_us(r['quax solve'])} | "
            f"{_us(r['hand-written Woodbury'])} | {r['quax/hand']:.2f} "
            f"({r['quax/hand quartiles'][0]:.2f}-{r['quax/hand quartiles'][1]:.2f}) | "
            f"{'yes' if r['quax/hand'] <= 1.5 else 'no'} | "
            f"{r['in-graph fallback/hand']:.2f} | "
            f"{r['Woodbury alone/hand']:.2f} | {r['Woodbury + check/hand']:.2f} | "
            f"{r['slogdet/hand lemma']:.2f} | "
            f"{r['in-graph slogdet/hand lemma']:.2f} |"
        )
    vmapped = woodbury_under_vmap(1024, rounds)
    print(
        f"\nUnder vmap (batch {vmapped['batch']}, n = {vmapped['n']:,}): over b "
        f"{vmapped['vmap over b: quax/hand']:.2f}x, over matrices "
        f"{vmapped['vmap over matrices: quax/hand']:.2f}x the vmapped hand-written"
    )
    audit = solve_audit(1024, rounds)
    print("\n## solve and slogdet against hand-written JAX, n = 1,024\n")
    print(
        "| structure | solve (µs) | hand (µs) | ours/hand | slogdet (µs) | hand (µs) "
        "| ours/hand | max rel. difference (solve, logdet) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in audit:
        print(
            f"| {r['structure']} | {_us(r['solve'])} | {_us(r['hand solve'])} | "
            f"{r['solve ours/hand']:.2f} | {_us(r['slogdet'])} | "
            f"{_us(r['hand slogdet'])} | {r['slogdet ours/hand']:.2f} | "
            f"{_e(r['solve max relative difference'])}, "
            f"{_e(r['slogdet difference'])} |"
        )
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return {"woodbury": wood, "vmap": vmapped, "audit": audit}


def pinv_speedups(n: int, rounds: int) -> list[dict[str, Any]]:
    """`jnp.linalg.pinv` of structured matrices, the pseudo-inverse returned as a
    structure (issue 29, item 6), against JAX's dense `pinv` of the same matrix
    (an SVD and the product of its `(n, n)` vectors), size `n`, float32: the
    times, the speedup, and the largest difference relative to the largest entry
    of the dense result."""
    k = jr.split(jr.key(29), 5)
    side = round(n**0.5)
    eye = jnp.eye(side)
    cases = {
        "Diagonal": qs.Diagonal(jr.normal(k[0], (n,))),
        "Circulant": Circulant(jr.normal(k[1], (n,))),
        "BlockDiagonal (b = 16)": qs.BlockDiagonal(jr.normal(k[2], (n // 16, 16, 16))),
        "LowRank (r = 8)": qs.LowRank(jr.normal(k[0], (n, 8)), jr.normal(k[1], (n, 8))),
        # Well-conditioned factors (singular values about 2 to 4): where the
        # product of the factors' condition numbers passes `1 / rtol` (JAX's
        # default `rtol`, 10 n eps, is about 1 / 8,000 at n = 1,024) the
        # structured `pinv` is NaN (see the README's Limits).
        f"Kronecker {side} ⊗ {side}": Kronecker(
            jr.normal(k[3], (side, side)) / side**0.5 + 3 * eye,
            jr.normal(k[4], (side, side)) / side**0.5 + 3 * eye,
        ),
    }
    ours = jax.jit(quax.quaxify(jnp.linalg.pinv))
    dense = jax.jit(jnp.linalg.pinv)
    rows = []
    for name, m in cases.items():
        a = m.enable_materialise().materialise()
        # The first few dozen calls are slower (quax's caches fill): time the
        # steady state.
        for _ in range(30):
            jax.block_until_ready(ours(m))
        times = _timed(
            {"quax": lambda m=m: ours(m), "dense": lambda a=a: dense(a)}, rounds
        )
        got = ours(m).enable_materialise().materialise()
        want = dense(a)
        rows.append(
            {
                "structure": name,
                "n": m.shape[-1],
                "quax pinv": statistics.median(times["quax"]),
                "dense pinv": statistics.median(times["dense"]),
                "speedup": _ratio(times, "dense", "quax"),
                "difference": float(
                    jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))
                ),
            }
        )
    return rows


def print_pinv(quick: bool = False) -> list[dict[str, Any]]:
    """Print `pinv_speedups` at n = 1,024 (256 with `quick`) as a Markdown table."""
    rows = pinv_speedups(256 if quick else 1024, 3 if quick else 5)
    print("\n## `jnp.linalg.pinv` as a structure (microseconds per call)\n")
    print("| structure | n | quax | dense | speedup | max difference / max entry |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['structure']} | {r['n']:,} | {_us(r['quax pinv'])} | "
            f"{_us(r['dense pinv'])} | {_x(r['speedup'])} | {_e(r['difference'])} |"
        )
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return rows


def main(quick: bool = False) -> dict[str, Any]:
    rounds = 5 if quick else 15
    sizes = SIZES[:4] if quick else SIZES
    tri = tridiagonal_sweep(sizes, rounds)
    print("\n## Tridiagonal (microseconds per call; speedups in one run)\n")
    print(
        "| n | quax matvec | dense matvec | speedup | quax matvec (loop) | "
        "dense matvec (loop) | speedup (loop) | quax solve | dense solve | "
        "speedup | solve quax/hand | solve quax/lineax |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in tri["rows"]:
        print(
            f"| {r['n']:,} | {_us(r['quax matvec'])} | {_us(r.get('dense matvec'))} | "
            f"{_x(r.get('matvec speedup vs dense'))} | "
            f"{_us(r['quax matvec (loop)'])} | {_us(r.get('dense matvec (loop)'))} | "
            f"{_x(r.get('matvec speedup vs dense (loop)'))} | {_us(r['quax solve'])} | "
            f"{_us(r.get('dense solve'))} | {_x(r.get('solve speedup vs dense'))} | "
            f"{r['solve quax/hand']:.2f} | {r['solve quax/lineax']:.2f} |"
        )
    print(
        "\nFitted exponents (time ~ n^k):",
        {k: round(v, 2) for k, v in tri["exponents"].items()},
    )
    bc = banded_circulant_sweep(sizes, rounds)
    print("\n## Banded (p = q = 2) and circulant (microseconds per call)\n")
    print(
        "| n | banded matvec | speedup vs dense | banded solve | circulant matvec | "
        "speedup vs dense |"
    )
    print("|---|---|---|---|---|---|")
    for r in bc["rows"]:
        print(
            f"| {r['n']:,} | {_us(r['banded matvec'])} | "
            f"{_x(r.get('banded matvec speedup vs dense'))} | "
            f"{_us(r['banded solve'])} | {_us(r['circulant matvec'])} | "
            f"{_x(r.get('circulant matvec speedup vs dense'))} |"
        )
    print(
        "\nFitted exponents (time ~ n^k):",
        {k: round(v, 2) for k, v in bc["exponents"].items()},
    )
    ks = kronecker_and_low_rank(
        (256, 1024) if quick else (256, 1024, 4096, 16384), rounds
    )
    print("\n## Kronecker and low rank plus diagonal solves (microseconds per call)\n")
    print(
        "| n | quax kron | dense/quax | lineax CG/quax | quax D+UUᵀ | dense/quax | "
        "lineax CG/quax |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in ks:
        print(
            f"| {r['n']:,} | {_us(r['quax kronecker'])} | "
            f"{_x(r.get('kronecker dense/quax'))} | "
            f"{_x(r['kronecker lineax/quax'])} | {_us(r['quax lrpd'])} | "
            f"{_x(r.get('lrpd dense/quax'))} | {_x(r['lrpd lineax/quax'])} |"
        )
    print(
        "\nCompilations on repeated calls:",
        sum(r["compilations on repeat calls"] for r in ks),
        "| OPENBLAS_NUM_THREADS:",
        os.environ["OPENBLAS_NUM_THREADS"],
    )
    toeplitz = toeplitz_solves((256,) if quick else (256, 1024, 4096), rounds)
    piv = pivoted_solves((256,) if quick else (256, 1024, 4096), rounds)
    dets = determinant_gradients(
        (256, 16384) if quick else (256, 1024, 16384, 262144), rounds
    )
    print("\n## jax.grad of slogdet and det, tridiagonal (microseconds per call)\n")
    print(
        "| n | quax grad slogdet | dense | dense/quax | quax grad det | dense | "
        "dense/quax | max relative difference (slogdet, det) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in dets:
        print(
            f"| {r['n']:,} | {_us(r['quax grad slogdet'])} | "
            f"{_us(r.get('dense grad slogdet'))} | "
            f"{_x(r.get('grad slogdet dense/quax'))} | "
            f"{_us(r['quax grad det'])} | {_us(r.get('dense grad det'))} | "
            f"{_x(r.get('grad det dense/quax'))} | "
            f"{_e(r.get('grad slogdet max relative difference'))}, "
            f"{_e(r.get('grad det max relative difference'))} |"
        )
    _plot(tri, IMAGE / "structured_scaling.png")
    return {
        "tridiagonal": tri,
        "banded_circulant": bc,
        "kronecker_low_rank": ks,
        "toeplitz_solves": toeplitz,
        "pivoted_solves": piv,
        "determinant_gradients": dets,
        "jax": jax.__version__,
        "device": jax.devices()[0].device_kind,
        "openblas_threads": os.environ["OPENBLAS_NUM_THREADS"],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--closed-forms",
        action="store_true",
        help="only the LowRankPlusDiagonal solve and the grid Gaussian process",
    )
    parser.add_argument(
        "--solve-audit",
        action="store_true",
        help="only issue 29 item 7: the Woodbury solve and every structure's "
        "solve/slogdet against hand-written JAX",
    )
    parser.add_argument(
        "--toeplitz",
        action="store_true",
        help="only the Toeplitz solves and slogdet (checked Levinson, GKO) against "
        "the Levinson recursion, GKO and dense",
    )
    parser.add_argument(
        "--toeplitz-accuracy",
        action="store_true",
        help="only the backward errors of the Levinson recursion, GKO and dense on "
        "Toeplitz matrices (n = 64 ... 4,096, float32 and float64)",
    )
    parser.add_argument(
        "--pinv",
        action="store_true",
        help="only issue 29 item 6: jnp.linalg.pinv as a structure against dense",
    )
    parser.add_argument(
        "--tpu",
        action="store_true",
        help="only the parallel tridiagonal solve against "
        "lax.linalg.tridiagonal_solve at n = 4,096 ... 1,048,576, many solves in "
        "one compiled program, on the default backend (made for the TPU; about a "
        "minute there); JSON under benchmarks/results/",
    )
    parser.add_argument(
        "--tridiagonal-accuracy",
        action="store_true",
        help="only the backward errors of cyclic reduction, the sweep without "
        "pivoting and lax.linalg.tridiagonal_solve (float32, float64; the CPU)",
    )
    args = parser.parse_args()
    if args.tpu:
        print_tridiagonal_parallel(args.quick)
    elif args.tridiagonal_accuracy:
        tridiagonal_accuracy((1000,) if args.quick else (1000, 65536))
    elif args.pinv:
        print_pinv(args.quick)
    elif args.toeplitz_accuracy:
        toeplitz_accuracy((64, 256) if args.quick else (64, 256, 1024, 4096))
    elif args.toeplitz:
        toeplitz_solves(
            (256,) if args.quick else (256, 1024, 4096), 5 if args.quick else 9
        )
    elif args.solve_audit:
        print_solve_audit(args.quick)
    elif args.closed_forms:
        print_closed_forms(args.quick)
    else:
        main(args.quick)
