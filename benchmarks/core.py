"""Core overheads, as ratios to plain JAX measured in one run (the README's core table).

- eager: a quaxified two-primitive `lax` call, the `jax.numpy` function `a * b + a`
  and the single operator `quax.quaxify(jnp.multiply)`, on a user `ArrayValue`, over
  the same calls on plain arrays;
- tracing: `make_jaxpr` of a quaxified 200-primitive `lax` chain and of the same chain
  in `jax.numpy` (`jnp.sin(x * x)`, each call an inlined `jit`), over the same on
  plain arrays, for three ways a value type gives its aval: `aval` building a
  `ShapedArray` (as the published quax's docs write it), `aval` returning
  `jax.typeof` of the leaf (as `quax.Value.aval`'s docstring advises), and the leaf
  declared with `aval_leaf` (no user code runs);
- no value: a quaxified function called on plain arrays only (`a * b + a`)
  over the plain function, eagerly and as a compiled `jax.jit` call, and
  `make_jaxpr` of the quaxified 200-call `jax.numpy` chain on a plain array over
  the plain chain's (a call with no value runs as plain JAX: see `quax.quaxify`);
- time to a compiled program, per phase (trace, lower, compile): a loraified Equinox
  MLP against the same LoRA MLP written by hand on plain arrays, and the units
  spring of `benchmarks/units.py` against the same program on plain arrays;
- import: `import quax` over `import jax, equinox, plum` (fresh interpreters);
- first calls (`--calls`): `quax.quaxify(f)` of a `jax.numpy` function `f` (`add`,
  `multiply`, `sqrt`, `sin`, `hypot`, `linalg.norm`, as `quaxed.numpy` wraps them)
  on `Dense` values, called eagerly in a fresh interpreter: the time of each of the
  first `CALLS` calls, the steady-state time per call (the median of the last
  hundred of `TOTAL` calls) and the total time of the `TOTAL` calls, in wall-clock
  time, ours beside the published quax's.

Rounds are interleaved (each round times every program once, plain and quaxified
side by side); times are medians over rounds, ratios medians of the per-round
ratios. The machine is shared, so everything is timed in CPU time, which other jobs
do not inflate: tracing and lowering (pure Python) in the running thread's, eager
calls, compiles (which may use XLA's threads) and imports in the whole process's;
on a machine that does not account CPU time per process (the TPU machine's sandbox),
in wall-clock time (`_clocks.py`).

    python benchmarks/core.py [--quick] [--calls | --against SRC [--runs N] [--count]]

Prints Markdown tables, writes `docs/images/core_ratios.png` and returns the figures.
To compare a change with the code before it, `--against <dir>` (the `src` folder of
another checkout's quax-core) runs `measure()` in fresh interpreters, alternating
between that code and this checkout's, `--runs` times each, and prints each row's
time and ratio to plain JAX on both sides, and their quotient (after / before).
With `--count` it compares the function calls each row makes instead of its time
(deterministic, where a shared machine's times of the same code differ by more than
the 5% asked of a change; the compile phase, in C++, it does not see).
To compare with the published quax 0.4.6, point `QUAX_PUBLISHED_PYTHON` at the
interpreter of an environment holding it (`uv venv <dir> && uv pip install --python
<dir>/bin/python quax==0.4.6 jax==0.10.2 equinox`); the same `measure()` runs there
(without the declared avals and the units rows, which the published quax lacks).
"""

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import quax
from jax import lax


# `_clocks.py` beside this file, also where the published quax's environment runs it
# (`runpy.run_path`, which puts no folder on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _clocks


IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
# Whether this quax has declared avals (the published one does not).
DECLARED = hasattr(quax.Value, "aval_leaf")


def _rewrapped(cls, primitive, values, params):
    arrays = [v.array if isinstance(v, Dense) else v for v in values]
    out = primitive.bind(*arrays, **params)
    if primitive.multiple_results:
        return [cls(o) for o in out]
    return cls(out)


class Dense(quax.ArrayValue):
    """A user's array wrapper whose `aval` builds a `ShapedArray`, as the published
    quax's docs write it."""

    array: jax.Array

    def aval(self):
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self):
        return self.array

    @staticmethod
    def default(primitive, values, params):
        return _rewrapped(Dense, primitive, values, params)


class TypedDense(Dense):
    """`Dense` with the `aval` that `quax.Value.aval`'s docstring advises."""

    def aval(self):
        return jax.typeof(self.array)

    @staticmethod
    def default(primitive, values, params):
        return _rewrapped(TypedDense, primitive, values, params)


class DeclaredDense(TypedDense):
    """`TypedDense` declaring its leaf: quax reads the aval without calling `aval`
    (which agrees with the leaf's, weak type included, as the debug checks demand)."""

    aval_leaf: ClassVar[str] = "array"

    @staticmethod
    def default(primitive, values, params):
        return _rewrapped(DeclaredDense, primitive, values, params)


TYPES = {"shaped": Dense, "typeof": TypedDense}
if DECLARED:
    TYPES["declared"] = DeclaredDense


def two(x, y):
    return lax.mul(lax.add(x, y), y)


def mul_add(a, b):
    return a * b + a


def chain(x):
    for _ in range(100):
        x = lax.sin(lax.mul(x, x))
    return x


def jnp_chain(x):
    for _ in range(100):
        x = jnp.sin(x * x)
    return x


# Timing -------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any], number: int, clock: Callable[[], float]) -> float:
    start = clock()
    for _ in range(number):
        fn()
    return (clock() - start) / number


def interleaved(
    programs: dict[str, tuple[Callable[[], Any], int, Callable[[], float]]],
    rounds: int,
) -> dict[str, list[float]]:
    """Each program (a call, calls per sample, clock) timed once per round, the
    rounds interleaved; a warm-up call first."""
    for fn, _, _ in programs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(rounds):
        for name, (fn, number, clock) in programs.items():
            times[name].append(_timed(fn, number, clock))
    return times


def _summary(times: dict[str, list[float]], plain: str, name: str) -> dict[str, float]:
    return {
        "plain_s": statistics.median(times[plain]),
        "quax_s": statistics.median(times[name]),
        "ratio": statistics.median(
            q / p for q, p in zip(times[name], times[plain], strict=True)
        ),
    }


# This thread's and this process's CPU time, or the wall clock where the machine
# does not account them (`_clocks.py`).
CPU = _clocks.host_clock(per_thread=True)
PROCESS = _clocks.host_clock()


class _CallCount:
    """A clock that reads function calls, not seconds: installed as the thread's
    profile hook (`sys.setprofile`), it counts each call of a Python function and
    of a C function made from Python. Deterministic where time is not: on a shared
    machine two runs of the same code time apart by more than 5%, but make the
    same calls (bar the hash-seeded order of a set or a dict; XLA's compiling, in
    C++, makes none)."""

    def __init__(self) -> None:
        self.calls = 0

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1

    def __call__(self) -> float:
        return float(self.calls)


def _called(programs: dict[str, Any]) -> dict[str, Any]:
    """`programs`, each called until its steady state: ours compiles an eager
    program once a key's later calls have taken as long as a compile (see
    `first_calls` for that cold path), so here each compiles on its second call
    (`COMPILE_AFTER` 0), which is ready when timed."""
    eager = getattr(getattr(quax, "_caching", None), "_eager", None)
    kept = getattr(eager, "COMPILE_AFTER", None)
    if eager is not None:
        eager.COMPILE_AFTER = 0.0
    try:
        for _ in range(2):
            for fn, _, _ in programs.values():
                fn()
    finally:
        if eager is not None:
            eager.COMPILE_AFTER = kept
    return programs


def eager(rounds: int) -> dict[str, dict[str, float]]:
    x = jnp.linspace(0.5, 1.5, 8)
    y = jnp.full((8,), 2.0)
    programs = {
        "two plain": (lambda: two(x, y), 100, PROCESS),
        "mul_add plain": (lambda: mul_add(x, y), 50, PROCESS),
        "multiply plain": (lambda: jnp.multiply(x, y), 100, PROCESS),
    }
    q_two, q_mul_add = quax.quaxify(two), quax.quaxify(mul_add)
    q_multiply = quax.quaxify(jnp.multiply)
    for kind, cls in TYPES.items():
        a, b = cls(x), cls(y)
        programs[f"two {kind}"] = (lambda a=a, b=b: q_two(a, b), 100, PROCESS)
        programs[f"mul_add {kind}"] = (lambda a=a, b=b: q_mul_add(a, b), 50, PROCESS)
        programs[f"multiply {kind}"] = (lambda a=a, b=b: q_multiply(a, b), 100, PROCESS)
    times = interleaved(_called(programs), rounds)
    out = {
        f"{fn} {kind}": _summary(times, f"{fn} plain", f"{fn} {kind}")
        for fn in ("two", "mul_add", "multiply")
        for kind in TYPES
    }
    if hasattr(quax, "set_eager_compilation"):  # ours: each setting
        kept = [k for k in programs if k.endswith((" plain", " shaped"))]
        default = quax.set_eager_compilation(True)
        try:
            for setting, name in ((True, "compiled"), (False, "off")):
                quax.set_eager_compilation(setting)
                times = interleaved(_called({k: programs[k] for k in kept}), rounds)
                for fn in ("two", "mul_add", "multiply"):
                    row = _summary(times, f"{fn} plain", f"{fn} shaped")
                    out[f"{fn} {name}"] = row
        finally:
            quax.set_eager_compilation(default)
    return out


def tracing(rounds: int) -> dict[str, dict[str, float]]:
    x = jnp.ones((8,))
    # A fresh function each time, so that JAX's tracing cache never answers.
    programs = {
        "lax plain": (lambda: jax.make_jaxpr(lambda a: chain(a))(x), 2, CPU),
        "jnp plain": (lambda: jax.make_jaxpr(lambda a: jnp_chain(a))(x), 2, CPU),
    }
    for kind, cls in TYPES.items():
        v = cls(x)
        programs[f"lax {kind}"] = (
            lambda v=v: jax.make_jaxpr(lambda a: quax.quaxify(chain)(a))(v),
            2,
            CPU,
        )
        programs[f"jnp {kind}"] = (
            lambda v=v: jax.make_jaxpr(lambda a: quax.quaxify(jnp_chain)(a))(v),
            2,
            CPU,
        )
    times = interleaved(programs, rounds)
    return {
        f"{chain_} {kind}": _summary(times, f"{chain_} plain", f"{chain_} {kind}")
        for chain_ in ("lax", "jnp")
        for kind in TYPES
    }


def without_values(rounds: int) -> dict[str, dict[str, float]]:
    x = jnp.linspace(0.5, 1.5, 8)
    y = jnp.full((8,), 2.0)
    q_mul_add = quax.quaxify(mul_add)
    jit_plain, jit_quaxified = jax.jit(mul_add), jax.jit(q_mul_add)
    programs = {
        "eager plain": (lambda: mul_add(x, y), 50, PROCESS),
        "eager quaxified": (lambda: q_mul_add(x, y), 50, PROCESS),
        "jit plain": (lambda: jit_plain(x, y), 100, PROCESS),
        "jit quaxified": (lambda: jit_quaxified(x, y), 100, PROCESS),
        # A fresh function each time, so that JAX's tracing cache never answers.
        "trace plain": (lambda: jax.make_jaxpr(lambda a: jnp_chain(a))(x), 2, CPU),
        "trace quaxified": (
            lambda: jax.make_jaxpr(lambda a: quax.quaxify(jnp_chain)(a))(x),
            2,
            CPU,
        ),
    }
    times = interleaved(programs, rounds)
    return {
        f"no value {name}": _summary(times, f"{name} plain", f"{name} quaxified")
        for name in ("eager", "jit", "trace")
    }


# Time to a compiled program ----------------------------------------------------------

WIDTH, RANK, BATCH = 256, 8, 16


def lora_programs() -> tuple[Callable[..., Any], tuple, Callable[..., Any], tuple]:
    """A loraified MLP through `quaxify` and the same LoRA MLP written by hand, as
    (function, arguments) pairs whose arguments are all arrays."""
    from quax.examples import lora

    mlp = eqx.nn.MLP(WIDTH, WIDTH, WIDTH, depth=2, key=jr.PRNGKey(0))
    model = lora.loraify(mlp, rank=RANK, key=jr.PRNGKey(1))
    params, static = eqx.partition(model, eqx.is_array)
    xs = jnp.ones((BATCH, WIDTH))

    def quaxified(params, xs):
        m = eqx.combine(params, static)
        # `vmap` of a function, as in `by_hand`: JAX's debug info for `vmap` of an
        # equinox module prints the whole module (its `repr`), on every trace.
        return quax.quaxify(lambda m, xs: jax.vmap(lambda x: m(x))(xs))(m, xs)

    keys = jr.split(jr.PRNGKey(2), 9)
    layers = [
        (
            jr.normal(keys[3 * i], (WIDTH, WIDTH)),
            jr.normal(keys[3 * i + 1], (WIDTH, RANK)),
            jr.normal(keys[3 * i + 2], (RANK, WIDTH)),
            jnp.zeros(WIDTH),
        )
        for i in range(3)
    ]

    def by_hand(layers, xs):
        def forward(x):
            for i, (w, a, b, bias) in enumerate(layers):
                x = lax.stop_gradient(w) @ x + a @ (b @ x) + bias
                if i < len(layers) - 1:
                    x = jax.nn.relu(x)
            return x

        return jax.vmap(forward)(xs)

    return quaxified, (params, xs), by_hand, (layers, xs)


def units_programs() -> tuple[Callable[..., Any], tuple, Callable[..., Any], tuple]:
    """The spring of `benchmarks/units.py` on quantities through `quaxify`, and on
    plain arrays."""
    from quax_units import Quantity

    units = runpy.run_path(str(Path(__file__).with_name("units.py")))
    n = 256
    given = [
        (jnp.linspace(-1.0, 1.0, n), "cm"),
        (jnp.zeros(n), "m / s"),
        (40.0, "N / m"),
        (0.5, "N s / m"),
        (2.0, "kg"),
        (1.0, "ms"),
    ]
    args = tuple(Quantity(value, unit) for value, unit in given)
    simulate = units["simulate"]
    return quax.quaxify(simulate), args, simulate, units["_plain"](args)


def phases(fn: Callable[..., Any], args: tuple) -> dict[str, float]:
    """Trace, lower and compile a fresh `jax.jit` of `fn` (no cache answers)."""
    jitted = jax.jit(lambda *a: fn(*a))
    t0 = CPU()
    traced = jitted.trace(*args)
    t1 = CPU()
    lowered = traced.lower()
    t2, p2 = CPU(), PROCESS()
    lowered.compile()
    return {"trace": t1 - t0, "lower": t2 - t1, "compile": PROCESS() - p2}


def compiled(rounds: int) -> dict[str, dict[str, float]]:
    pairs = {"lora": lora_programs}
    try:
        import quax_units  # noqa: F401
    except ImportError:
        pass
    else:
        pairs["units"] = units_programs
    out = {}
    for name, make in pairs.items():
        q_fn, q_args, p_fn, p_args = make()
        phases(q_fn, q_args)
        phases(p_fn, p_args)
        quaxed, plain = [], []
        for _ in range(rounds):
            quaxed.append(phases(q_fn, q_args))
            plain.append(phases(p_fn, p_args))
        for phase in ("trace", "lower", "compile", "total"):

            def get(d, phase=phase):
                return sum(d.values()) if phase == "total" else d[phase]

            out[f"{name} {phase}"] = {
                "plain_s": statistics.median(map(get, plain)),
                "quax_s": statistics.median(map(get, quaxed)),
                "ratio": statistics.median(
                    get(q) / get(p) for q, p in zip(quaxed, plain, strict=True)
                ),
            }
    return out


def measure(quick: bool = False, count: bool = False) -> dict[str, dict[str, float]]:
    """Every measure but the import time, as `{name: {plain_s, quax_s, ratio}}`.
    With `count`, each "time" is the number of function calls made (see
    `_CallCount`), one round each: `quax_s` and `plain_s` are then calls per call
    (per phase for the compiled programs; the compile phase, in C++, counts only
    the calls around it)."""
    global CPU, PROCESS
    if not count:
        return {
            **eager(5 if quick else 15),
            **tracing(5 if quick else 15),
            **without_values(5 if quick else 15),
            **compiled(3 if quick else 7),
        }
    counter = _CallCount()
    kept = CPU, PROCESS
    CPU = PROCESS = counter
    sys.setprofile(counter.hook)
    try:
        return {**eager(1), **tracing(1), **without_values(1), **compiled(1)}
    finally:
        sys.setprofile(None)
        CPU, PROCESS = kept


# First calls --------------------------------------------------------------------------

# The `jax.numpy` functions of the first-calls table, each on one or two values.
FIRST_CALLS: dict[str, tuple[Callable[..., Any], int]] = {
    "add": (jnp.add, 2),
    "multiply": (jnp.multiply, 2),
    "sqrt": (jnp.sqrt, 1),
    "sin": (jnp.sin, 1),
    "hypot": (jnp.hypot, 2),
    "norm": (jnp.linalg.norm, 1),
}
CALLS, TOTAL = 5, 3000


def first_calls(name: str) -> list[float]:
    """The wall-clock time of each of the first `CALLS` eager calls of
    `quax.quaxify` of the function `name` of `FIRST_CALLS` on fresh `Dense` values,
    the median time per call of the last hundred of `TOTAL` calls, and the total
    time of the `TOTAL` calls. Meant for a fresh
    interpreter, where the costs that a process pays once are paid first, by a
    warm-up: loading the installed families, and three calls of another function
    (`jnp.negative`) on the same type."""
    fn, arity = FIRST_CALLS[name]
    x = jnp.linspace(0.5, 1.5, 8)
    values = [Dense(x + i) for i in range(arity)]
    warm_up = quax.quaxify(jnp.negative)
    for _ in range(3):
        jax.block_until_ready(warm_up(values[0]))
    quaxified = quax.quaxify(fn)
    times = []
    for _ in range(TOTAL):
        start = time.perf_counter()
        jax.block_until_ready(quaxified(*values))
        times.append(time.perf_counter() - start)
    return [*times[:CALLS], statistics.median(times[-100:]), sum(times)]


def _first_calls_in(python: str, name: str) -> list[float]:
    code = (
        "import json, runpy, sys; "
        f"f = runpy.run_path({__file__!r}, run_name='bench')['first_calls']; "
        f"json.dump(f({name!r}), sys.stdout)"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        raise RuntimeError(f"the first-calls run of {name} failed: {lines[-1]}")
    return json.loads(done.stdout)


def cold(runs: int = 3) -> dict[str, dict[str, list[float]]]:
    """`first_calls` of every function of `FIRST_CALLS`, each the median over `runs`
    fresh interpreters, alternating ours and the published quax's (when
    `QUAX_PUBLISHED_PYTHON` is set), as `{name: {"ours": [...], "published":
    [...]}}`; prints them as a Markdown table in milliseconds."""
    theirs = os.environ.get("QUAX_PUBLISHED_PYTHON")
    pythons = {"ours": sys.executable, **({"published": theirs} if theirs else {})}
    out: dict[str, dict[str, list[float]]] = {}
    for name in FIRST_CALLS:
        samples: dict[str, list[list[float]]] = {side: [] for side in pythons}
        for _ in range(runs):
            for side, python in pythons.items():
                samples[side].append(_first_calls_in(python, name))
        out[name] = {
            side: [statistics.median(column) for column in zip(*rows, strict=True)]
            for side, rows in samples.items()
        }
    header = [f"call {i + 1}" for i in range(CALLS)]
    header += ["steady", f"all {TOTAL}"]
    print(f"| function | quax | {' | '.join(header)} (ms per call) |")
    print(f"|---|---|{'---|' * len(header)}")
    for name, sides in out.items():
        for side, row in sides.items():
            cells = " | ".join(f"{t * 1e3:.2f}" for t in row)
            print(f"| {name} | {side} | {cells} |")
    if not theirs:
        print("\npublished quax: QUAX_PUBLISHED_PYTHON is not set")
    return out


def import_time(python: str, code: str, runs: int) -> float:
    """Median time of a fresh interpreter running `code`, on `PROCESS`'s clock."""
    clock = "process_time" if PROCESS is time.process_time else "perf_counter"
    times = []
    for _ in range(runs):
        done = subprocess.run(
            [
                python,
                "-c",
                f"import time; t = time.{clock}(); {code}; print(time.{clock}() - t)",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        times.append(float(done.stdout.strip()))
    return statistics.median(times)


def published(quick: bool) -> dict[str, Any] | str:
    """`measure()` run by the published quax, or why it was not."""
    python = os.environ.get("QUAX_PUBLISHED_PYTHON")
    if not python:
        return "QUAX_PUBLISHED_PYTHON is not set (see this file's docstring)"
    code = (
        "import json, runpy, sys; "
        f"m = runpy.run_path({__file__!r}, run_name='bench')['measure']({quick}); "
        "json.dump(m, sys.stdout)"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        return f"the published run failed: {lines[-1]}"
    return json.loads(done.stdout)


def _measured(quick: bool, source: str | None, count: bool = False) -> dict[str, Any]:
    """`measure()` in a fresh interpreter, importing `quax` from `source` (the
    `src` folder of a quax-core checkout) or, for `None`, from this environment."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (source, env.get("PYTHONPATH")) if p
        )
    code = (
        "import json, runpy, sys; "
        f"m = runpy.run_path({__file__!r}, run_name='bench')['measure']({quick}, "
        f"{count}); "
        "json.dump(m, sys.stdout)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"`measure()` failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def compare(
    source: str, quick: bool, runs: int, count: bool = False
) -> dict[str, dict[str, float]]:
    """This checkout's `measure()` against that of the quax-core in `source` (before
    a change), in alternating fresh interpreters, `runs` each: per row, each side's
    median time and ratio to plain JAX, and the quotient of the ratios (after /
    before; within 1.05 is within 5%). With `count`, function calls instead of
    time (`measure`'s `count`): the same quotients, of calls."""
    before: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []
    for _ in range(runs):
        before.append(_measured(quick, source, count))
        after.append(_measured(quick, None, count))
    out = {}
    for key, _ in ROWS:
        if key not in before[0] or key not in after[0]:
            continue
        b = statistics.median(m[key]["ratio"] for m in before)
        a = statistics.median(m[key]["ratio"] for m in after)
        out[key] = {
            "before_s": statistics.median(m[key]["quax_s"] for m in before),
            "after_s": statistics.median(m[key]["quax_s"] for m in after),
            "before_ratio": b,
            "after_ratio": a,
            "after_over_before": a / b,
        }
    unit = "calls" if count else "time"
    print(
        f"| measure | before / plain | after / plain | after / before ({runs} runs, "
        f"{unit}) |"
    )
    print("|---|---|---|---|")
    for key, label in ROWS:
        if key in out:
            row = out[key]
            print(
                f"| {label} | {row['before_ratio']:.3f}x | {row['after_ratio']:.3f}x |"
                f" {row['after_over_before']:.3f} |"
            )
    return out


ROWS = [
    ("two shaped", "eager two-primitive `lax` call, `aval` builds a `ShapedArray`"),
    ("two declared", "eager two-primitive `lax` call, declared aval"),
    ("mul_add shaped", "eager `a * b + a` (`jax.numpy`), `ShapedArray` aval"),
    ("mul_add declared", "eager `a * b + a` (`jax.numpy`), declared aval"),
    ("multiply shaped", "eager `quaxify(jnp.multiply)`, `ShapedArray` aval"),
    ("multiply declared", "eager `quaxify(jnp.multiply)`, declared aval"),
    ("two compiled", "eager two-primitive call, `quax.set_eager_compilation(True)`"),
    ("mul_add compiled", "eager `a * b + a`, `quax.set_eager_compilation(True)`"),
    ("multiply compiled", "eager `quaxify(jnp.multiply)`, eager compilation on"),
    ("two off", "eager two-primitive call, `quax.set_eager_compilation(False)`"),
    ("mul_add off", "eager `a * b + a`, `quax.set_eager_compilation(False)`"),
    ("multiply off", "eager `quaxify(jnp.multiply)`, eager compilation off"),
    ("lax shaped", "`make_jaxpr`, 200-primitive `lax` chain, `ShapedArray` aval"),
    ("lax typeof", "`make_jaxpr`, `lax` chain, `aval` returns `jax.typeof(leaf)`"),
    ("lax declared", "`make_jaxpr`, `lax` chain, declared aval (`aval_leaf`)"),
    ("jnp shaped", "`make_jaxpr`, 200-call `jax.numpy` chain, `ShapedArray` aval"),
    ("jnp typeof", "`make_jaxpr`, `jax.numpy` chain, `jax.typeof` aval"),
    ("jnp declared", "`make_jaxpr`, `jax.numpy` chain, declared aval"),
    ("no value eager", "no value: eager `a * b + a` on plain arrays, quaxified"),
    ("no value jit", "no value: compiled `jax.jit` call of it, quaxified"),
    ("no value trace", "no value: `make_jaxpr`, `jax.numpy` chain, quaxified"),
    *[
        (f"{name} {phase}", f"{label}: {phase}")
        for name, label in (
            ("lora", "LoRA MLP to a compiled program"),
            ("units", "units spring to a compiled program"),
        )
        for phase in ("trace", "lower", "compile", "total")
    ],
]


def _amount(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def plot(ours: dict[str, float], theirs: dict[str, float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [key for key, _ in ROWS if key in ours]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(names) + 1.2))
    ys = range(len(names))
    ax.barh([y + 0.2 for y in ys], [ours[n] for n in names], 0.4, label="quax-core")
    ax.barh(
        [y - 0.2 for y in ys],
        [theirs.get(n, 0.0) for n in names],
        0.4,
        label="published quax 0.4.6",
    )
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("time / plain JAX (median of interleaved rounds)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(quick: bool = False) -> dict[str, Any]:
    m = measure(quick)
    runs = 3 if quick else 7
    base = import_time(sys.executable, "import jax, equinox, plum", runs)
    ours_import = import_time(sys.executable, "import jax, equinox, plum, quax", runs)
    m["import"] = {"plain_s": base, "quax_s": ours_import, "ratio": ours_import / base}
    theirs = published(quick)
    other = theirs if isinstance(theirs, dict) else {}
    print("| measure | quax (ours) | plain JAX | ours / plain | published / plain |")
    print("|---|---|---|---|---|")
    for key, label in [*ROWS, ("import", "`import quax` (CPU time)")]:
        if key not in m:
            continue
        row = m[key]
        them = f"{other[key]['ratio']:.2f}x" if key in other else "-"
        print(
            f"| {label} | {_amount(row['quax_s'])} | {_amount(row['plain_s'])} | "
            f"{row['ratio']:.2f}x | {them} |"
        )
    if isinstance(theirs, str):
        print(f"\npublished quax: {theirs}")
    image = plot(
        {k: v["ratio"] for k, v in m.items()},
        {k: v["ratio"] for k, v in other.items()},
        IMAGES / "core_ratios.png",
    )
    print(f"plot: docs/images/{image.name}")
    return {
        "ours": m,
        "published": theirs,
        "load": os.getloadavg()[0],
        "quick": quick,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument(
        "--against",
        metavar="SRC",
        help="compare with the quax-core source folder SRC (the code before a change)",
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="interpreters per side with --against"
    )
    parser.add_argument(
        "--count",
        action="store_true",
        help="with --against: compare function calls made, not time",
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="only the first-calls table (first calls and steady state per call)",
    )
    args = parser.parse_args()
    if args.against:
        compare(args.against, args.quick, args.runs, args.count)
    elif args.calls:
        cold(1 if args.quick else 3)
    else:
        main(args.quick)
