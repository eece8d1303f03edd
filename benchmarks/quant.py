"""quax-quant benchmark: weight memory, compiled matmul time against float32 dense
(and against the same product written by hand in plain JAX) at batch 1, 16 and 256
on a 2048 x 2048 weight, the weight-only product's gradient with respect to the
activations, a size sweep with the fitted exponent, the accuracy of a quantised MLP
against its float version, the `matmul="auto"` threshold, and the same layer
quantised with qwix. Times are medians over interleaved rounds, ratios medians of
the per-round ratios. Prints Markdown tables and writes
`docs/images/quant_matmul.png`.

    python benchmarks/quant.py [--quick]

qwix (Google's JAX quantisation library) needs flax, which is not in this
workspace: install it in its own environment and point `QWIX_PYTHON` at that
interpreter, e.g.

    uv venv build/qwix-env
    uv pip install --python build/qwix-env/bin/python qwix==0.1.8 jax==0.10.2
    QWIX_PYTHON=build/qwix-env/bin/python python benchmarks/quant.py

The qwix side runs in a subprocess (`run_times` and `_QWIX_SOURCE`: a flax
`nnx.Linear` with the same weight quantised by `qwix.quantize_model` with a
`PtqProvider`), timing its own float32 layer in the same interleaved rounds; without
`QWIX_PYTHON` it is skipped.
"""

import argparse
import dataclasses
import datetime
import importlib.metadata
import inspect
import json
import logging
import os
import random
import statistics
import subprocess
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_quant
from jax import lax


N = 2048
BATCHES = (1, 16, 256)
SWEEP = (512, 1024, 2048)
IMAGES = Path(__file__).parents[1] / "docs" / "images"
RESULTS = Path(__file__).parent / "results"


def _dense(w, x):
    return x @ w.T


def _quax(w, x):
    return quax.quaxify(_dense)(w, x)


def _hand_weight_only(q, s, x):
    """The weight-only product written by hand: convert inside the dot, scale after."""
    return (x @ q.astype(jnp.float32).T) * s


def _hand_int8(q, s, x):
    """The int8 x int8 product written by hand, activations quantised per row."""
    sx = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127
    sx = jnp.where(sx > 0, sx, 1.0)
    xq = jnp.clip(jnp.round(x / sx), -127, 127).astype(jnp.int8)
    acc = lax.dot_general(
        xq, q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32
    )
    return acc.astype(jnp.float32) * sx * s


def run_times(calls, rounds):
    """Times of each `(compiled, args)` over `rounds` rounds in a fresh random order,
    each timed call after an untimed call of the same program (same cache state)."""
    times = [[] for _ in calls]
    order = list(range(len(calls)))
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for i in order:
            c, args = calls[i]
            jax.block_until_ready(c(*args))
            start = time.perf_counter()
            jax.block_until_ready(c(*args))
            times[i].append(time.perf_counter() - start)
    return times


def ratio(t1, t2):
    return statistics.median(a / b for a, b in zip(t1, t2, strict=True))


def _compiled(fn, *args):
    c = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(c(*args))
    return c, args


def memory():
    w = jr.normal(jr.PRNGKey(0), (N, N))
    rows = []
    for name, kwargs in [
        ("int8, per channel", {"bits": 8, "axis": 0}),
        ("int8, groups of 128", {"bits": 8, "group_size": 128}),
        ("int4, per channel", {"bits": 4, "axis": 0}),
        ("int4, groups of 64", {"bits": 4, "group_size": 64}),
        (
            "int4, groups of 32, asymmetric",
            {"bits": 4, "group_size": 32, "symmetric": False},
        ),
    ]:
        q = quax_quant.quantise(w, **kwargs)
        rows.append(
            {"layout": name, "bytes": q.nbytes, "ratio": q.nbytes / (4 * N * N)}
        )
    return rows


def matmul_times(rounds, n=N, batches=BATCHES):
    w = jr.normal(jr.PRNGKey(0), (n, n)) / np.sqrt(n)
    out = {}
    for batch in batches:
        x = jr.normal(jr.PRNGKey(1), (batch, n))
        q = {
            p: quax_quant.quantise(w, axis=0, matmul=p)
            for p in ("weight_only", "int8", "auto")
        }
        q4 = quax_quant.quantise(w, bits=4, group_size=128)
        q4c = quax_quant.quantise(w, bits=4, axis=0)
        s = q["int8"].scale.reshape(n)
        names = [
            "float32",
            "weight_only",
            "int8",
            "auto",
            "int4 per channel auto",
            "int4 g128 auto",
            "hand weight_only",
            "hand int8",
        ]
        calls = [
            _compiled(_dense, w, x),
            _compiled(_quax, q["weight_only"], x),
            _compiled(_quax, q["int8"], x),
            _compiled(_quax, q["auto"], x),
            _compiled(_quax, q4c, x),
            _compiled(_quax, q4, x),
            _compiled(_hand_weight_only, q["int8"].values, s, x),
            _compiled(_hand_int8, q["int8"].values, s, x),
        ]
        times = dict(zip(names, run_times(calls, rounds), strict=True))
        out[batch] = {
            "float32_ms": 1e3 * statistics.median(times["float32"]),
            **{f"{k}_vs_float32": ratio(times[k], times["float32"]) for k in names[1:]},
            "weight_only_vs_hand": ratio(
                times["weight_only"], times["hand weight_only"]
            ),
            "int8_vs_hand": ratio(times["int8"], times["hand int8"]),
        }
    return out


# The layers compared with qwix: quax-quant's name, its `quantise` arguments, and
# the key of its time in `matmul_times`.
LAYERS = {
    "int8 weight-only": ({"axis": 0, "matmul": "weight_only"}, "weight_only"),
    "int8 x int8": ({"axis": 0, "matmul": "int8"}, "int8"),
    "int4 groups of 128, weight-only": (
        {"bits": 4, "group_size": 128},
        "int4 g128 auto",
    ),
}


def layer_errors(n=N):
    """Bytes and the relative error of `x @ w.T` on 256 random rows for the layers
    compared with qwix (the same weight and inputs as on the qwix side)."""
    w = jr.normal(jr.PRNGKey(0), (n, n)) / np.sqrt(n)
    x = jr.normal(jr.PRNGKey(1), (256, n))
    ref = x @ w.T
    out = {}
    for name, (kwargs, _) in LAYERS.items():
        q = quax_quant.quantise(w, **kwargs)
        y = jax.jit(_quax)(q, x)
        rel = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
        out[name] = {"bytes": q.nbytes, "relative_error": rel}
    return out


def _grad_x(fn):
    """The gradient of `sum(fn(w, x) ** 2)` with respect to `x`: through the
    weight-only product, the transposed product `g . w`."""

    def grad(*args):
        return jax.grad(lambda x: jnp.sum(fn(*args[:-1], x) ** 2))(args[-1])

    return grad


def backward_times(rounds, n=N, batches=BATCHES[1:]):
    """The gradient with respect to the activations: float32, the weight-only
    product (blocked dequantisation), and the same written by hand in plain JAX
    (the whole weight converted)."""
    w = jr.normal(jr.PRNGKey(0), (n, n)) / np.sqrt(n)
    q = quax_quant.quantise(w, axis=0, matmul="weight_only")
    q4 = quax_quant.quantise(w, bits=4, group_size=128)
    s = q.scale.reshape(n)
    out = {}
    for batch in batches:
        x = jr.normal(jr.PRNGKey(1), (batch, n))
        calls = [
            _compiled(_grad_x(_dense), w, x),
            _compiled(_grad_x(_quax), q, x),
            _compiled(_grad_x(_quax), q4, x),
            _compiled(_grad_x(_hand_weight_only), q.values, s, x),
        ]
        t = run_times(calls, rounds)
        out[batch] = {
            "float32_ms": 1e3 * statistics.median(t[0]),
            "weight_only_vs_float32": ratio(t[1], t[0]),
            "int4 g128_vs_float32": ratio(t[2], t[0]),
            "hand whole conversion_vs_float32": ratio(t[3], t[0]),
        }
    return out


THRESHOLD_ROWS = (1, 2, 3, 4, 8, 16)


def threshold(rounds, n=N):
    """Where the int8 x int8 path overtakes the weight-only one: both against
    float32 at a few row counts (`WEIGHT_ONLY_MAX_ROWS` is chosen from this)."""
    w = jr.normal(jr.PRNGKey(0), (n, n)) / np.sqrt(n)
    paths = ("weight_only", "int8")
    qs = [quax_quant.quantise(w, axis=0, matmul=p) for p in paths]
    out = {}
    for rows in THRESHOLD_ROWS:
        x = jr.normal(jr.PRNGKey(1), (rows, n))
        calls = [_compiled(_dense, w, x)] + [_compiled(_quax, q, x) for q in qs]
        t = run_times(calls, rounds)
        out[rows] = {
            f"{p}_vs_float32": ratio(t[i + 1], t[0]) for i, p in enumerate(paths)
        }
    return out


def sweep(rounds):
    """Time of the auto path at batch 16 against the size: the fitted exponent."""
    times = {}
    for n in SWEEP:
        w = jr.normal(jr.PRNGKey(0), (n, n))
        x = jr.normal(jr.PRNGKey(1), (16, n))
        q = quax_quant.quantise(w, axis=0)
        (t_q, t_d) = run_times(
            [_compiled(_quax, q, x), _compiled(_dense, w, x)], rounds
        )
        times[n] = {
            "quant_ms": 1e3 * statistics.median(t_q),
            "float32_ms": 1e3 * statistics.median(t_d),
        }
    ns = np.log(np.array(SWEEP, float))
    fit = {
        k: float(np.polyfit(ns, np.log([times[n][k] for n in SWEEP]), 1)[0])
        for k in ("quant_ms", "float32_ms")
    }
    return {"times": times, "exponent": fit}


def accuracy():
    """A small MLP quantised: the output error relative to the float model, and how
    often the argmax (a classification) agrees."""
    mlp = eqx.nn.MLP(256, 10, 512, depth=3, activation=jax.nn.gelu, key=jr.PRNGKey(0))
    x = jr.normal(jr.PRNGKey(1), (1024, 256))
    ref = jax.vmap(mlp)(x)
    rows = []
    for name, kwargs in [
        ("int8 per channel, weight-only", {"bits": 8, "matmul": "weight_only"}),
        ("int8 per channel, int8 x int8", {"bits": 8, "matmul": "int8"}),
        (
            "int4 groups of 32, weight-only",
            {"bits": 4, "group_size": 32, "matmul": "weight_only"},
        ),
        (
            "int4 groups of 32, int8 x int8",
            {"bits": 4, "group_size": 32, "matmul": "int8"},
        ),
        ("int4 per channel, weight-only", {"bits": 4, "matmul": "weight_only"}),
    ]:
        q = quax_quant.quantise_model(mlp, **kwargs)
        out = eqx.filter_jit(quax.quaxify(lambda m, x: jax.vmap(m)(x)))(q, x)
        rel = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
        agree = float(jnp.mean(jnp.argmax(out, -1) == jnp.argmax(ref, -1)))
        rows.append({"model": name, "relative_error": rel, "argmax_agreement": agree})
    return rows


_QWIX_SOURCE = r"""# The qwix side of benchmarks/quant.py, in qwix's environment.
import json
import random
import statistics
import sys
import time
from importlib.metadata import version

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import qwix
from flax import nnx


args = json.loads(sys.argv[1])
n, batches, rounds = args["n"], args["batches"], args["rounds"]
w = jr.normal(jr.PRNGKey(0), (n, n)) / np.sqrt(n)  # (out, in), as on the quax side
layer = nnx.Linear(n, n, use_bias=False, rngs=nnx.Rngs(0))
layer.kernel.value = w.T
configs = {
    "int8 weight-only": dict(weight_qtype=jnp.int8),
    "int8 x int8": dict(weight_qtype=jnp.int8, act_qtype=jnp.int8),
    "int4 groups of 128, weight-only": dict(weight_qtype=jnp.int4, tile_size=128),
}
out = {"qwix": version("qwix"), "flax": version("flax"), "jax": jax.__version__}
out["configs"] = {}


def compiled(model, x):
    graph, state = nnx.split(model)
    c = jax.jit(lambda s, x: nnx.merge(graph, s)(x)).lower(state, x).compile()
    jax.block_until_ready(c(state, x))
    return c, (state, x)


x_err = jr.normal(jr.PRNGKey(1), (256, n))
ref = layer(x_err)
models = {}
for name, kw in configs.items():
    rule = qwix.QuantizationRule(module_path=".*", **kw)
    models[name] = qwix.quantize_model(layer, qwix.PtqProvider([rule]), x_err[:1])
    q = models[name](x_err)
    # Integer leaves at their bit width (int4 counted as half a byte).
    nbytes = sum(
        int(np.size(a)) * jnp.iinfo(a.dtype).bits // 8
        if jnp.issubdtype(a.dtype, jnp.integer)
        else int(np.size(a)) * np.dtype(a.dtype).itemsize
        for a in jax.tree.leaves(nnx.state(models[name]))
    )
    out["configs"][name] = {
        "bytes": nbytes,
        "memory_ratio": nbytes / (4 * n * n),
        "relative_error": float(jnp.linalg.norm(q - ref) / jnp.linalg.norm(ref)),
    }
for batch in batches:
    x = jr.normal(jr.PRNGKey(1), (batch, n))
    calls = [compiled(layer, x)] + [compiled(models[k], x) for k in configs]
    times = run_times(calls, rounds)  # benchmarks/quant.py's, prepended
    for k, t in zip(configs, times[1:], strict=True):
        out["configs"][k][f"batch_{batch}_vs_float32"] = statistics.median(
            a / b for a, b in zip(t, times[0], strict=True)
        )
    out[f"float32_ms_batch_{batch}"] = 1e3 * statistics.median(times[0])
print(json.dumps(out))
"""


def qwix(rounds, n=N, batches=BATCHES):
    """The same layer quantised with qwix, in the interpreter `QWIX_PYTHON` names;
    `{"skipped": reason}` without it or when it fails."""
    python = os.environ.get("QWIX_PYTHON")
    if not python:
        return {"skipped": "QWIX_PYTHON is not set (see the top of this file)"}
    args = json.dumps({"n": n, "batches": list(batches), "rounds": rounds})
    run = subprocess.run(
        [python, "-c", inspect.getsource(run_times) + _QWIX_SOURCE, args],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        check=False,
    )
    if run.returncode:
        return {"skipped": f"qwix failed: {run.stderr.strip().splitlines()[-1:]}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def plot(times):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    for key, label in [
        ("weight_only_vs_float32", "weight-only int8"),
        ("int8_vs_float32", "int8 x int8"),
        ("auto_vs_float32", "auto (quax-quant default)"),
        ("int4 per channel auto_vs_float32", "int4 per channel, auto"),
        ("int4 g128 auto_vs_float32", "int4, groups of 128, auto"),
    ]:
        ax.plot(BATCHES, [times[b][key] for b in BATCHES], marker="o", label=label)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xticks(BATCHES, [str(b) for b in BATCHES])
    ax.set_xlabel("batch (rows)")
    ax.set_ylabel("time / float32 dense")
    ax.set_title(f"{N}x{N} matmul, jit, CPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / "quant_matmul.png"
    fig.savefig(path)
    plt.close(fig)
    return str(path.relative_to(IMAGES.parents[1]))


# The accelerator section (`--tpu`) ----------------------------------------------------

# The formats of issue 46's table: its `quantise` arguments, and the field of
# `quax_quant.Kernels` that chooses its weight-only product (`None`: the product
# path is not the weight-only one, or "auto" picks it by rows: timed as chosen).
ACCEL_FORMATS = {
    "int8 per channel, weight-only": (
        {"bits": 8, "axis": 0, "matmul": "weight_only"},
        "int8",
    ),
    "int8 per channel, auto (int8 x int8 from 4 rows)": ({"bits": 8, "axis": 0}, None),
    "int4, groups of 128": ({"bits": 4, "group_size": 128}, "int4"),
    "NF4, blocks of 64, double quant": (
        {"format": "nf4", "block_size": 64, "double_quant": True},
        "nf4",
    ),
    "float8 e4m3, weight-only": ({"format": "float8_e4m3fn", "axis": 0}, "float8"),
    "float8 e4m3 x float8": (
        {"format": "float8_e4m3fn", "axis": 0, "matmul": "float8"},
        None,
    ),
}

# The formulations timed side by side for a `Kernels` field: a label and the
# `quax_quant.kernels(...)` choices. "blocked" is today's CPU path (issue 46's
# figures); it is timed in single calls only (at 4096 rows it takes seconds per
# scan), and "reduce" at most `REDUCE_MAX_ROWS` rows (above, it is "fused").
_PLAIN = [
    ("blocked", {"kernel": "blocked"}),
    ("fused", {"kernel": "fused"}),
    ("reduce", {"kernel": "reduce"}),
    ("pallas", {"kernel": "pallas"}),
]
ACCEL_CANDIDATES = {
    "int8": _PLAIN,
    "float8": _PLAIN,
    "int4": [
        ("blocked", {"kernel": "blocked"}),
        ("fused, shift unpack", {"kernel": "fused", "unpack": "shift"}),
        ("fused, halves", {"kernel": "fused", "unpack": "halves"}),
        ("reduce, shift unpack", {"kernel": "reduce", "unpack": "shift"}),
        ("pallas", {"kernel": "pallas"}),
        # Not a formulation of quax-quant: the same product written by hand for a
        # weight stored as JAX's `int4` (what XLA on a TPU reads packed), to tell
        # whether storing that dtype would pay.
        ("hand-written, jnp.int4 weight", {"kernel": "hand int4"}),
    ],
    "nf4": [
        ("blocked", {"kernel": "blocked"}),
        ("fused, select, shift", {"kernel": "fused", "unpack": "shift"}),
        ("fused, select, halves", {"kernel": "fused", "unpack": "halves"}),
        (
            "fused, gather, halves",
            {"kernel": "fused", "unpack": "halves", "nf4_levels": "gather"},
        ),
        ("reduce, select", {"kernel": "reduce", "nf4_levels": "select"}),
        ("reduce, gather", {"kernel": "reduce", "nf4_levels": "gather"}),
        ("pallas", {"kernel": "pallas"}),
    ],
}


def _choices(field, candidate):
    """`quax_quant.kernels(...)` arguments for a candidate of `field`."""
    if candidate["kernel"] == "hand int4":
        return {}
    out = {k: v for k, v in candidate.items() if k != "kernel"}
    if field is not None:
        out[field] = candidate["kernel"]
    return out


def _is_default(field, candidate):
    """Whether `candidate` is what this backend takes with no `kernels(...)` block."""
    if field is None:
        return True
    if candidate["kernel"] == "hand int4":
        return False
    chosen = quax_quant.kernel_choices()
    if getattr(chosen, field) != candidate["kernel"]:
        return False
    return all(getattr(chosen, k) == v for k, v in candidate.items() if k != "kernel")


def _stack_layers(n, layers):
    """`layers` bfloat16 weights `(n, n)`, entries N(0, 1/n), as one array (built
    in a loop on the device: no float32 copy of the whole stack)."""
    keys = jr.split(jr.PRNGKey(0), layers)
    make = lambda k: (jr.normal(k, (n, n)) / np.sqrt(n)).astype(jnp.bfloat16)
    return jax.jit(lambda ks: lax.map(make, ks))(keys)


def _quantise_stack(stack, kwargs):
    """Each layer of `stack` quantised, as one `QuantisedArray` whose leaves have a
    leading layer axis (quantised one layer at a time on the device)."""
    return jax.jit(lambda ws: lax.map(lambda w: quax_quant.quantise(w, **kwargs), ws))(
        stack
    )


def _layer(stack, i):
    return jax.tree.map(lambda leaf: leaf[i], stack)


def _scan_program(stack, x):
    """`x` through every layer of `stack`: `x <- tanh(x @ w.T)` in one compiled
    `lax.scan`, so that a call's fixed cost is paid once for all the layers."""
    leaves, treedef = jax.tree.flatten(stack)

    def body(x, layer):
        y = quax.quaxify(_dense)(jax.tree.unflatten(treedef, layer), x)
        return jnp.tanh(y).astype(x.dtype), None

    return lax.scan(body, x, leaves)[0]


def _int4_stack(stack):
    """A quantised int4 stack's integers as JAX's `int4` arrays, and its scales."""
    as_int4 = lambda q: q.integers().astype(jnp.int4)
    return jax.jit(lambda s: (lax.map(as_int4, s), s.scale))(stack)


def _hand_int4(q4, scale, x):
    """`x @ w.T` written by hand for a weight stored as JAX's `int4` with one scale
    per group of inputs, folded into the converted weight."""
    s = jnp.repeat(scale, q4.shape[-1] // scale.shape[-1], axis=-1)
    return x @ (q4.astype(x.dtype) * s.astype(x.dtype)).T


def _hand_int4_scan(q4s, scales, x):
    def body(x, layer):
        return jnp.tanh(_hand_int4(*layer, x)).astype(x.dtype), None

    return lax.scan(body, x, (q4s, scales))[0]


def _temp_mib(compiled):
    """The compiled program's temporary memory, in MiB (`None` where the backend
    does not say)."""
    try:
        analysis = compiled.memory_analysis()
        return None if analysis is None else analysis.temp_size_in_bytes / 2**20
    except Exception:  # a backend without the analysis
        return None


def _relative_error(y, ref):
    """`|y - ref| / |ref|` (Frobenius), computed on the device."""
    y = jnp.asarray(y, jnp.float32)
    return float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))


def _reference(q, x):
    """The dequantise-then-multiply product: float32 at the highest precision."""
    w = jnp.asarray(q.dequantise(), jnp.float32)
    return jnp.matmul(x.astype(jnp.float32), w.T, precision=lax.Precision.HIGHEST)


def _modes(candidate, rows):
    """The modes a candidate is timed in at `rows` (see `ACCEL_CANDIDATES`)."""
    kernel = candidate["kernel"]
    if kernel == "reduce" and rows > quax_quant.REDUCE_MAX_ROWS:
        return ()  # the "fused" product there
    if kernel == "blocked":
        return ("single",)
    return ("single", "scan")


class _Collect(logging.Handler):
    """Prints each message and appends it to a list."""

    def __init__(self, into):
        super().__init__()
        self.into = into

    def emit(self, record):
        message = record.getMessage()
        self.into.append(message)
        print(message, flush=True)


def accelerator(quick=False, json_path=None, only=None):
    """Issue 46's products on this machine's accelerator: `x @ w.T` for bfloat16
    `x` of 1, 8 and 4096 rows and an 8192 x 8192 weight in each format of
    `ACCEL_FORMATS`, against the bfloat16 product, (a) one compiled call per
    product ("single") and (b) a `lax.scan` over a stack of 32 layers' weights in
    one compiled program ("scan": `x <- tanh(x @ w.T)` per layer); and for the
    weight-only formats every formulation of `ACCEL_CANDIDATES` side by side
    (`quax_quant.kernels`), each format's candidates and the bfloat16 product
    timed in the same interleaved rounds. For each: the median time, the ratio to
    bfloat16 in the same mode and rows, the relative error against the
    dequantise-then-multiply product (float32, highest precision) in single
    calls, the single call's temporary memory (a float copy of the weight shows
    as 128 MiB and more at 8192), whether a Pallas kernel ran, and the stored
    bytes against bfloat16's.

    `quick`: 256 x 256, 4 layers, 1, 8 and 64 rows (on a CPU, where the Pallas
    kernels run in interpret mode: their times mean nothing there). `only`:
    formats whose name contains one of these strings. Writes JSON to `json_path`
    (by default `benchmarks/results/quant-<device kind>-<date>.json`) after each
    format, so that a run cut short keeps what it measured."""
    start = time.perf_counter()
    n, layers, rows_list = (256, 4, (1, 8, 64)) if quick else (8192, 32, (1, 8, 4096))
    rounds = 3
    device = jax.devices()[0]
    info = {
        "device_kind": device.device_kind,
        "backend": jax.default_backend(),
        "date": datetime.date.today().isoformat(),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "quax_quant": importlib.metadata.version("quax-quant"),
        "n": n,
        "layers": layers,
        "rows": list(rows_list),
        "rounds": rounds,
        "defaults": dataclasses.asdict(quax_quant.kernel_choices()),
    }
    if json_path is None:
        slug = "".join(c if c.isalnum() else "-" for c in device.device_kind.lower())
        json_path = RESULTS / f"quant-{slug}-{info['date']}.json"
    json_path = Path(json_path)
    results = {"info": info, "bf16": {}, "formats": {}, "log": []}
    # quax_quant's messages (a Pallas kernel that does not compile says why),
    # printed and kept in the JSON.
    logger = logging.getLogger("quax_quant")
    logger.addHandler(_Collect(results["log"]))
    logger.setLevel(logging.INFO)

    def save():
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=1, default=str))

    dense_stack = _stack_layers(n, layers)
    w0 = _layer(dense_stack, 0)
    xs = {r: jr.normal(jr.PRNGKey(r), (r, n)).astype(jnp.bfloat16) for r in rows_list}
    # The bfloat16 programs, timed in every format's rounds.
    dense = {
        r: {
            "single": _compiled(_dense, w0, xs[r]),
            "scan": _compiled(_scan_program, dense_stack, xs[r]),
        }
        for r in rows_list
    }
    formats = {
        name: spec
        for name, spec in ACCEL_FORMATS.items()
        if not only or any(o in name for o in only)
    }
    for name, (kwargs, field) in formats.items():
        t0 = time.perf_counter()
        entry = results["formats"][name] = {"quantise": kwargs, "candidates": {}}
        try:
            stack = _quantise_stack(dense_stack, kwargs)
            q0 = _layer(stack, 0)
            entry["bytes_per_weight"] = q0.nbytes / (n * n)
            entry["of_bf16"] = q0.nbytes / (2 * n * n)
        except Exception as e:  # report it, time the other formats
            entry["error"] = f"{type(e).__name__}: {e}"
            save()
            continue
        candidates = (
            [("as chosen", {"kernel": None})]
            if field is None
            else ACCEL_CANDIDATES[field]
        )
        for label, candidate in candidates:
            entry["candidates"][label] = {
                "choices": _choices(field, candidate) if field else {},
                "default": _is_default(field, candidate),
            }
        hand = None
        for r in rows_list:
            ref = _reference(q0, xs[r])
            programs = {"single": [], "scan": []}
            for label, candidate in candidates:
                row = entry["candidates"][label]
                modes = _modes(candidate, r) if field else ("single", "scan")
                if not modes:
                    continue
                cell = row[str(r)] = {}
                try:
                    if candidate["kernel"] == "hand int4":
                        hand = hand or _int4_stack(stack)
                        layer0 = _layer(hand, 0)
                        single = _compiled(_hand_int4, *layer0, xs[r])
                        jaxpr = ""
                        scan = _compiled(_hand_int4_scan, *hand, xs[r])
                    else:
                        with quax_quant.kernels(**row["choices"]):
                            single = _compiled(_quax, q0, xs[r])
                            jaxpr = str(jax.make_jaxpr(_quax)(q0, xs[r]))
                            scan = (
                                _compiled(_scan_program, stack, xs[r])
                                if "scan" in modes
                                else None
                            )
                    cell["pallas_ran"] = "pallas_call" in jaxpr
                    cell["temp_mib"] = _temp_mib(single[0])
                    cell["error"] = _relative_error(single[0](*single[1]), ref)
                    programs["single"].append((cell, single))
                    if scan is not None:
                        programs["scan"].append((cell, scan))
                except Exception as e:  # report it, time the other candidates
                    cell["failed"] = f"{type(e).__name__}: {str(e)[:400]}"
            del ref
            for mode, timed in programs.items():
                if not timed:
                    continue
                t = run_times([dense[r][mode]] + [c for _, c in timed], rounds)
                for (cell, _), times in zip(timed, t[1:], strict=True):
                    cell[f"{mode}_ms"] = 1e3 * statistics.median(times)
                    cell[f"{mode}_vs_bf16"] = ratio(times, t[0])
                results["bf16"].setdefault(str(r), {})[f"{mode}_ms"] = (
                    1e3 * statistics.median(t[0])
                )
        del stack, q0, hand
        entry["seconds"] = time.perf_counter() - t0
        print(f"[{time.perf_counter() - start:.0f} s] {name}", flush=True)
        save()
    results["seconds"] = time.perf_counter() - start
    save()
    _print_accelerator(results)
    print(f"JSON: {json_path}")
    return results


def _print_accelerator(results):
    info = results["info"]
    rows_list = info["rows"]
    print(
        f"\n## x @ w.T against bfloat16, {info['n']} x {info['n']}, "
        f"{info['device_kind']} ({info['backend']}), JAX {info['jax']}, "
        f"{info['date']}\n"
    )
    print(
        "single: one compiled call per product; scan: "
        f"{info['layers']} layers in one compiled lax.scan. Ratios are time over "
        "the bfloat16 product in the same mode and rows (lower is better; - not "
        "timed); error is the largest relative error against the "
        "dequantise-then-multiply product (float32) over the rows; temp is the "
        "single call's temporary memory at the most rows; * marks this backend's "
        "default formulation.\n"
    )
    for r, b in results["bf16"].items():
        cells = ", ".join(
            f"{key.removesuffix('_ms')} {ms:.3f} ms" for key, ms in b.items()
        )
        print(f"bfloat16, {r} rows: {cells}")
    head = " | ".join(f"{r} rows single | {r} rows scan" for r in rows_list)
    print(f"\n| format | formulation | {head} | error | temp MiB | pallas ran |")
    print("|---|---|" + "---|---|" * len(rows_list) + "---|---|---|")
    failures = []
    for name, entry in results["formats"].items():
        if "error" in entry:
            print(f"| {name} | failed: {entry['error'][:80]} |")
            continue
        for label, row in entry["candidates"].items():
            cells = []
            for r in rows_list:
                c = row.get(str(r), {})
                if "failed" in c:
                    failures.append(f"{name}, {label}, {r} rows: {c['failed']}")
                for mode in ("single", "scan"):
                    key = f"{mode}_vs_bf16"
                    cells.append(
                        f"{c[key]:.2f}x"
                        if key in c
                        else "failed"
                        if "failed" in c
                        else "-"
                    )
            measured = [row[str(r)] for r in rows_list if str(r) in row]
            errors = [c["error"] for c in measured if "error" in c]
            temp = measured[-1].get("temp_mib") if measured else None
            ran = any(c.get("pallas_ran") for c in measured)
            mark = " *" if row["default"] else ""
            error = f"{max(errors):.4f}" if errors else "-"
            memory = "-" if temp is None else f"{temp:.0f}"
            print(
                f"| {name} ({entry['of_bf16']:.3f}x bytes) | {label}{mark} | "
                f"{' | '.join(cells)} | {error} | {memory} | "
                f"{'yes' if ran else 'no'} |"
            )
    for failure in failures:
        print(f"failed: {failure}")


def main(quick: bool = False) -> dict:
    rounds = 11 if quick else 41
    results = {
        "machine": f"{jax.devices()[0].platform}, JAX {jax.__version__}",
        "memory": memory(),
        "matmul": matmul_times(rounds),
        "sweep": sweep(5 if quick else 21),
        "backward": backward_times(5 if quick else 21),
        "threshold": threshold(5 if quick else 21),
        "accuracy": accuracy(),
        "layers": layer_errors(),
        "qwix": qwix(5 if quick else 21),
    }
    results["plot"] = plot(results["matmul"])

    print("\n## Weight memory (2048 x 2048, against float32)\n")
    print("| layout | bytes | ratio |\n|---|---|---|")
    for r in results["memory"]:
        print(f"| {r['layout']} | {r['bytes']:,} | {r['ratio']:.4f}x |")
    print("\n## Compiled matmul time against float32 dense (2048 x 2048)\n")
    print("| path | " + " | ".join(f"batch {b}" for b in BATCHES) + " |")
    print("|---|" + "---|" * len(BATCHES))
    m = results["matmul"]
    print(
        "| float32 (ms) | "
        + " | ".join(f"{m[b]['float32_ms']:.3f}" for b in BATCHES)
        + " |"
    )
    for key in [
        "weight_only",
        "int8",
        "auto",
        "int4 per channel auto",
        "int4 g128 auto",
        "hand weight_only",
        "hand int8",
    ]:
        print(
            f"| {key} | "
            + " | ".join(f"{m[b][key + '_vs_float32']:.2f}x" for b in BATCHES)
            + " |"
        )
    print(
        "| quax weight_only / hand | "
        + " | ".join(f"{m[b]['weight_only_vs_hand']:.2f}x" for b in BATCHES)
        + " |"
    )
    print(
        "| quax int8 / hand | "
        + " | ".join(f"{m[b]['int8_vs_hand']:.2f}x" for b in BATCHES)
        + " |"
    )
    b = results["backward"]
    print("\n## Gradient with respect to the activations, against float32\n")
    print("| path | " + " | ".join(f"batch {k}" for k in b) + " |")
    print("|---|" + "---|" * len(b))
    print(
        "| float32 (ms) | "
        + " | ".join(f"{v['float32_ms']:.3f}" for v in b.values())
        + " |"
    )
    for key in ("weight_only", "int4 g128", "hand whole conversion"):
        cells = " | ".join(f"{v[key + '_vs_float32']:.2f}x" for v in b.values())
        print(f"| {key} | {cells} |")
    t = results["threshold"]
    print("\n## The auto threshold: each path against float32 by rows\n")
    print("| path | " + " | ".join(f"{r} rows" for r in t) + " |")
    print("|---|" + "---|" * len(t))
    for key in ("weight_only", "int8"):
        cells = " | ".join(f"{v[key + '_vs_float32']:.2f}x" for v in t.values())
        print(f"| {key} | {cells} |")
    s = results["sweep"]
    print("\n## Size sweep at batch 16 (auto path)\n")
    print("| n | quant (ms) | float32 (ms) |\n|---|---|---|")
    for n in SWEEP:
        t = s["times"][n]
        print(f"| {n} | {t['quant_ms']:.3f} | {t['float32_ms']:.3f} |")
    e = s["exponent"]
    print(
        f"\nfitted exponent: quant {e['quant_ms']:.2f}, float32 {e['float32_ms']:.2f}"
    )
    print("\n## Accuracy of a quantised MLP (256-512-512-512-10) against float32\n")
    print("| model | relative error | argmax agreement |\n|---|---|---|")
    for r in results["accuracy"]:
        agree = 100 * r["argmax_agreement"]
        print(f"| {r['model']} | {r['relative_error']:.4f} | {agree:.1f}% |")
    rows = []
    for name, c in results["layers"].items():
        key = LAYERS[name][1] + "_vs_float32"
        times = [m[b][key] for b in BATCHES]
        rows.append(("quax-quant", name, c["bytes"], c["relative_error"], times))
    qw = results["qwix"]
    if "skipped" in qw:
        print(f"\nqwix: {qw['skipped']}")
    else:
        print(f"\nqwix {qw['qwix']}, flax {qw['flax']}, JAX {qw['jax']}")
        for name, c in qw["configs"].items():
            times = [c[f"batch_{b}_vs_float32"] for b in BATCHES]
            rows.append(("qwix", name, c["bytes"], c["relative_error"], times))
    print("\n## The same 2048 x 2048 layer, each library against its own float32\n")
    print(
        "| library | layer | bytes | of float32 | relative error | "
        + " | ".join(f"batch {b}" for b in BATCHES)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(BATCHES))
    for library, name, nbytes, error, times in sorted(rows, key=lambda r: r[1]):
        cells = " | ".join(f"{t:.2f}x" for t in times)
        print(
            f"| {library} | {name} | {nbytes:,} | {nbytes / (4 * N * N):.4f}x | "
            f"{error:.4f} | {cells} |"
        )
    print(f"plot: {results['plot']}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--tpu",
        action="store_true",
        help="only the accelerator section (issue 46's products and every "
        "formulation side by side); with --quick at small sizes",
    )
    parser.add_argument("--json", help="where --tpu writes its JSON")
    parser.add_argument(
        "--only",
        nargs="+",
        help="with --tpu: the formats whose name contains one of these",
    )
    args = parser.parse_args()
    if args.tpu:
        accelerator(quick=args.quick, json_path=args.json, only=args.only)
    else:
        main(quick=args.quick)
