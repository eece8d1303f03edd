"""quax-quant benchmark for the formats beyond integers and the static activation
scales: NF4 (with and without double quantisation) against int4 with groups, in
bytes per weight and error; float8 (`float8_e4m3fn`, `float8_e5m2`) weight-only and
float8 x float8 products against float32, as XLA compiles them on this machine; and
`calibrate`'s static activation scale against the per-call absmax of the int8 x int8
path. Times are medians over interleaved rounds, ratios medians of the per-round
ratios (`run_times` and `ratio` of `benchmarks/quant.py`). Prints Markdown tables
with the date, the machine and the versions.

    python benchmarks/quant_formats.py [--quick]
"""

import argparse
import datetime
import os
import platform

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_quant
from quant import _compiled, ratio, run_times


N = 2048


def _relative_error(q, w):
    return float(jnp.linalg.norm(q.dequantise() - w) / jnp.linalg.norm(w))


def nf4_table(n):
    """Bytes per weight (values and scales) and relative error of the dequantised
    weight, for a weight of normally distributed entries (as trained weights
    roughly are, the distribution NF4's levels are quantiles of) and for one with
    heavier tails (Student's t with 3 degrees of freedom)."""
    weights = {
        "normal": jr.normal(jr.PRNGKey(0), (n, n)),
        "t(3)": jr.t(jr.PRNGKey(1), 3.0, (n, n)),
    }
    layouts = [
        ("int4, groups of 64, symmetric", {"bits": 4, "group_size": 64}),
        (
            "int4, groups of 64, asymmetric",
            {"bits": 4, "group_size": 64, "symmetric": False},
        ),
        (
            "int4, groups of 64, double-quantised scales",
            {"bits": 4, "group_size": 64, "double_quant": True},
        ),
        ("NF4, blocks of 64", {"format": "nf4", "block_size": 64}),
        (
            "NF4, blocks of 64, double quantisation (QLoRA)",
            {"format": "nf4", "block_size": 64, "double_quant": True},
        ),
        ("int8, per channel", {"bits": 8, "axis": 0}),
    ]
    rows = []
    for name, kwargs in layouts:
        errors = {}
        for kind, w in weights.items():
            q = quax_quant.quantise(w, **kwargs)
            errors[kind] = _relative_error(q, w)
        rows.append((name, q.nbytes / (n * n), errors["normal"], errors["t(3)"]))
    print(f"\nNF4 against int4, {n} x {n} weight\n")
    print(
        "| layout | bytes per weight | bits per weight | relative error, normal |"
        " relative error, t(3) |"
    )
    print("|---|---|---|---|---|")
    for name, b, e1, e2 in rows:
        print(f"| {name} | {b:.4f} | {8 * b:.3f} | {e1:.4f} | {e2:.4f} |")
    return {
        name: {"bytes_per_weight": b, "error_normal": e1, "error_t3": e2}
        for name, b, e1, e2 in rows
    }


def product_table(rounds, n, batches, formats):
    """Compiled `x @ w.T` against float32 dense, for each format and path."""
    w = jr.normal(jr.PRNGKey(0), (n, n)) / np.sqrt(n)
    results = {}
    for batch in batches:
        x = jr.normal(jr.PRNGKey(1), (batch, n))
        dense = _compiled(lambda w, x: x @ w.T, w, x)
        calls = [dense]
        names = []
        for name, kwargs in formats:
            q = quax_quant.quantise(w, **kwargs)
            calls.append(_compiled(quax.quaxify(lambda w, x: x @ w.T), q, x))
            names.append(name)
        times = run_times(calls, rounds)
        results[batch] = (
            np.median(times[0]) * 1e3,
            {nm: ratio(t, times[0]) for nm, t in zip(names, times[1:], strict=True)},
        )
    print(f"\nCompiled x @ w.T, {n} x {n}, time against float32\n")
    print("| path | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    print(
        "| float32 dense (ms) | "
        + " | ".join(f"{results[b][0]:.3g}" for b in batches)
        + " |"
    )
    for name, _ in formats:
        print(
            f"| {name} | "
            + " | ".join(f"{results[b][1][name]:.2f}x" for b in batches)
            + " |"
        )
    return {
        f"batch_{b}": {"float32_ms": ms, **{f"{k}_vs_float32": v for k, v in r.items()}}
        for b, (ms, r) in results.items()
    }


def float8_behaviour():
    """What a float8 cast does beyond the largest number, and what `quantise` stores."""
    big = jnp.array([500.0, 1e6, jnp.inf, jnp.nan], jnp.float32)
    print("\nfloat8 casts beyond the range (JAX's `astype`):")
    for fmt in quax_quant.FORMATS[2:]:
        print(f"- {fmt}: {np.asarray(big.astype(fmt).astype(jnp.float32)).tolist()}")


def _compiled_model(fn, model, x):
    """`_compiled` for `fn(model, x)` with a model holding non-array leaves (its
    activation function): the arrays are the arguments, the rest static."""
    params, static = eqx.partition(model, eqx.is_array)
    return _compiled(lambda p, x: fn(eqx.combine(p, static), x), params, x)


def calibration_table(rounds, n, batches):
    """An MLP with int8 weights on the int8 x int8 path: per-call absmax of each
    row against the static scales of `calibrate`, in time and in error against the
    float32 MLP."""
    mlp = eqx.nn.MLP(n, 10, n, depth=2, key=jr.PRNGKey(0))
    qmodel = quax_quant.quantise_model(mlp, bits=8, matmul="int8")
    calib = [jr.normal(jr.PRNGKey(10 + i), (64, n)) for i in range(4)]
    static = quax_quant.calibrate(qmodel, calib, apply=lambda m, x: jax.vmap(m)(x))
    forward = quax.quaxify(lambda m, x: jax.vmap(m)(x))
    print(
        f"\nint8 x int8 MLP ({n}-{n}-{n}-10), static against per-call activation "
        "scales\n"
    )
    print(
        "| batch | float32 (ms) | per-call absmax | calibrated | calibrated / "
        "per-call | error per-call | error calibrated |"
    )
    print("|---|---|---|---|---|---|---|")
    figures = {}
    for batch in batches:
        x = jr.normal(jr.PRNGKey(1), (batch, n))
        calls = [
            _compiled_model(lambda m, x: jax.vmap(m)(x), mlp, x),
            _compiled_model(forward, qmodel, x),
            _compiled_model(forward, static, x),
        ]
        times = run_times(calls, rounds)
        ref = jax.vmap(mlp)(x)

        def err(model, x=x, ref=ref):
            return float(
                jnp.linalg.norm(forward(model, x) - ref) / jnp.linalg.norm(ref)
            )

        row = {
            "float32_ms": np.median(times[0]) * 1e3,
            "per_call_vs_float32": ratio(times[1], times[0]),
            "calibrated_vs_float32": ratio(times[2], times[0]),
            "calibrated_vs_per_call": ratio(times[2], times[1]),
            "error_per_call": err(qmodel),
            "error_calibrated": err(static),
        }
        figures[f"batch_{batch}"] = row
        print(
            f"| {batch} | {row['float32_ms']:.3g} | "
            f"{row['per_call_vs_float32']:.2f}x | "
            f"{row['calibrated_vs_float32']:.2f}x | "
            f"{row['calibrated_vs_per_call']:.2f}x | {row['error_per_call']:.4f} | "
            f"{row['error_calibrated']:.4f} |"
        )
    return figures


INT8_AND_FLOAT8 = [
    ("int8 per channel, weight-only", {"axis": 0, "matmul": "weight_only"}),
    ("int8 per channel, int8 x int8", {"axis": 0, "matmul": "int8"}),
    ("e4m3fn per channel, weight-only", {"format": "float8_e4m3fn", "axis": 0}),
    (
        "e4m3fn per channel, float8 x float8",
        {"format": "float8_e4m3fn", "axis": 0, "matmul": "float8"},
    ),
    (
        "e4m3fn per tensor, float8 x float8",
        {"format": "float8_e4m3fn", "matmul": "float8"},
    ),
    ("e5m2 per channel, weight-only", {"format": "float8_e5m2", "axis": 0}),
    (
        "e5m2 per channel, float8 x float8",
        {"format": "float8_e5m2", "axis": 0, "matmul": "float8"},
    ),
]

INT4_AND_NF4 = [
    ("int4 groups of 64 (weight-only)", {"bits": 4, "group_size": 64}),
    ("NF4 blocks of 64 (weight-only)", {"format": "nf4"}),
    ("NF4 blocks of 64, double quantisation", {"format": "nf4", "double_quant": True}),
]


def main(quick: bool = False, rounds: int | None = None, only: str | None = None):
    """Print the tables and return their figures (for `benchmarks/run.py`)."""
    rounds = rounds or (5 if quick else 21)
    n = 512 if quick else N
    print(
        f"{datetime.date.today()}, {platform.machine()} {os.cpu_count()} cores, "
        f"{jax.devices()[0].platform}, JAX {jax.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    figures = {}
    if only in (None, "nf4"):
        figures["nf4_memory_error"] = nf4_table(n)
        figures["nf4_matmul"] = product_table(rounds, n, (1, 16, 256), INT4_AND_NF4)
    if only in (None, "float8"):
        float8_behaviour()
        figures["float8_matmul"] = product_table(
            rounds, n, (1, 16, 256), INT8_AND_FLOAT8
        )
    if only in (None, "calibrate"):
        figures["calibrate"] = calibration_table(rounds, n // 2, (16, 256))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["nf4", "float8", "calibrate"], default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    main(quick=args.quick, rounds=args.rounds, only=args.only)
