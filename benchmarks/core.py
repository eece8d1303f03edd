"""Core overheads, as ratios measured in one run (see the README's benchmark table).

- eager: a quaxified two-primitive call on a user `ArrayValue`, over the same call on
  plain arrays;
- tracing: `make_jaxpr` of a quaxified 200-primitive chain, over the same on plain
  arrays; once with `Dense.aval` building a `ShapedArray` (as the published quax docs
  write it), once with `TypedDense.aval` returning `jax.typeof` of the leaf (as
  `quax.Value.aval`'s docstring recommends); and of the same chain written with
  `jax.numpy` (`jnp.sin(x * x)`, each call an inlined `jit`), as user code is;
- import: `import quax` over `import jax, equinox, plum` (fresh interpreters).

Run: `uv run python benchmarks/core.py`. To compare with the published quax 0.4.6 in
its own environment, point `QUAX_PUBLISHED_PYTHON` at that environment's interpreter
(e.g. a venv with `pip install quax==0.4.6`); the same `measure()` runs there.
"""

import ast
import os
import statistics
import subprocess
import sys
import timeit

import jax
import jax.numpy as jnp
import quax


def _rewrapped(cls, primitive, values, params):
    arrays = [v.array if isinstance(v, Dense) else v for v in values]
    out = primitive.bind(*arrays, **params)
    if primitive.multiple_results:
        return [cls(o) for o in out]
    return cls(out)


class Dense(quax.ArrayValue):
    array: jax.Array

    def aval(self):
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self):
        return self.array

    @staticmethod
    def default(primitive, values, params):
        return _rewrapped(Dense, primitive, values, params)


class TypedDense(Dense):
    """`Dense` with the `aval` that `quax.Value.aval`'s docstring recommends: the
    leaf's own type rather than a new `ShapedArray`."""

    def aval(self):
        return jax.typeof(self.array)

    @staticmethod
    def default(primitive, values, params):
        return _rewrapped(TypedDense, primitive, values, params)


def two(x, y):
    return jax.lax.mul(jax.lax.add(x, y), y)


def chain(x):
    for _ in range(100):
        x = jax.lax.sin(jax.lax.mul(x, x))
    return x


def jnp_chain(x):
    for _ in range(100):
        x = jnp.sin(x * x)
    return x


def best(fn, number: int, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def measure() -> dict[str, float]:
    x = jnp.ones((8,))
    y = jnp.full((8,), 2.0)
    dx, dy = Dense(x), Dense(y)
    q = quax.quaxify(two)
    q(dx, dy)
    two(x, y)
    eager_plain = best(lambda: two(x, y), 300)
    eager_quax = best(lambda: q(dx, dy), 300)
    # A fresh function each time, so that JAX's tracing cache never answers.
    trace_plain = best(lambda: jax.make_jaxpr(lambda a: chain(a))(x), 5)
    trace_quax = best(lambda: jax.make_jaxpr(lambda a: quax.quaxify(chain)(a))(dx), 5)
    tx = TypedDense(x)
    trace_typed = best(lambda: jax.make_jaxpr(lambda a: quax.quaxify(chain)(a))(tx), 5)
    jnp_plain = best(lambda: jax.make_jaxpr(lambda a: jnp_chain(a))(x), 5)
    jnp_quax = best(lambda: jax.make_jaxpr(lambda a: quax.quaxify(jnp_chain)(a))(dx), 5)
    return {
        "eager_plain_us": eager_plain * 1e6,
        "eager_quax_us": eager_quax * 1e6,
        "eager_ratio": eager_quax / eager_plain,
        "trace_plain_ms": trace_plain * 1e3,
        "trace_quax_ms": trace_quax * 1e3,
        "trace_ratio": trace_quax / trace_plain,
        "trace_typed_ms": trace_typed * 1e3,
        "trace_typed_ratio": trace_typed / trace_plain,
        "jnp_plain_ms": jnp_plain * 1e3,
        "jnp_quax_ms": jnp_quax * 1e3,
        "jnp_ratio": jnp_quax / jnp_plain,
    }


def import_time(python: str, code: str, runs: int = 7) -> float:
    """Median wall time of a fresh interpreter running `code`."""
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [
                python,
                "-c",
                "import time; t = time.perf_counter(); "
                f"{code}; print(time.perf_counter() - t)",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        times.append(float(out.stdout.strip()))
    return statistics.median(times)


def main() -> None:
    m = measure()
    base = import_time(sys.executable, "import jax, equinox, plum")
    ours = import_time(sys.executable, "import jax, equinox, plum, quax")
    published: dict[str, float] = {}
    python = os.environ.get("QUAX_PUBLISHED_PYTHON")
    if python:
        code = (
            "import runpy; "
            f"print(runpy.run_path({__file__!r}, run_name='bench')['measure']())"
        )
        out = subprocess.run([python, "-c", code], capture_output=True, text=True)
        published = ast.literal_eval(out.stdout.strip()) if out.returncode == 0 else {}

    def other(key: str) -> str:
        return f"{published[key]:.2f}x" if key in published else "-"

    rows = [
        (
            "eager two-primitive call",
            f"{m['eager_quax_us']:.1f} us",
            f"{m['eager_plain_us']:.1f} us",
            m["eager_ratio"],
            other("eager_ratio"),
        ),
        (
            "make_jaxpr, 200-primitive chain",
            f"{m['trace_quax_ms']:.2f} ms",
            f"{m['trace_plain_ms']:.2f} ms",
            m["trace_ratio"],
            other("trace_ratio"),
        ),
        (
            "make_jaxpr, 200-primitive chain, `aval` via `jax.typeof`",
            f"{m['trace_typed_ms']:.2f} ms",
            f"{m['trace_plain_ms']:.2f} ms",
            m["trace_typed_ratio"],
            other("trace_typed_ratio"),
        ),
        (
            "make_jaxpr, 200-call `jax.numpy` chain",
            f"{m['jnp_quax_ms']:.2f} ms",
            f"{m['jnp_plain_ms']:.2f} ms",
            m["jnp_ratio"],
            other("jnp_ratio"),
        ),
        (
            "import quax",
            f"{ours:.3f} s",
            f"{base:.3f} s (jax, equinox, plum)",
            ours / base,
            "-",
        ),
    ]
    print(
        "| measure | quax (ours) | plain JAX | ours / plain | published quax / plain |"
    )
    print("|---|---|---|---|---|")
    for name, a, b, ratio, theirs in rows:
        print(f"| {name} | {a} | {b} | {ratio:.2f}x | {theirs} |")


if __name__ == "__main__":
    main()
