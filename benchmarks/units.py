"""Benchmark: a unitful physics program against the same program on plain arrays.

Prints a Markdown table of ratios (unitful / plain), all measured in this one run:
the run time of the compiled program (units should cost nothing), and the time to
trace (and lower) it. Run with `python benchmarks/units.py`; it takes well under a
minute on a CPU.
"""

import timeit

import jax
import jax.numpy as jnp
import quax
from jax import lax
from quax_units import Quantity, Unitful


def simulate(x, v, k, c, m, dt):
    """A damped spring, integrated with semi-implicit Euler for 2000 steps."""

    def step(state, _):
        x, v = state
        a = -(k * x + c * v) / m
        v = v + a * dt
        x = x + v * dt
        return (x, v), 0.5 * m * jnp.sum(v * v) + 0.5 * k * jnp.sum(x * x)

    (x, v), energy = lax.scan(step, (x, v), length=2000)
    return x, v, energy


def _plain(tree):
    return jax.tree.map(
        lambda q: q.array if isinstance(q, Unitful) else q,
        tree,
        is_leaf=lambda q: isinstance(q, Unitful),
    )


def _best(fn, number, repeat=7):
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def main():
    n = 4096
    args = (
        Quantity(jnp.linspace(-1.0, 1.0, n), "cm"),
        Quantity(jnp.zeros(n), "m / s"),
        Quantity(40.0, "N / m"),
        Quantity(0.5, "N s / m"),
        Quantity(2.0, "kg"),
        Quantity(1.0, "ms"),
    )
    plain_args = _plain(args)
    unitful = jax.jit(quax.quaxify(simulate))
    plain = jax.jit(simulate)

    def run(f, a):
        return lambda: jax.block_until_ready(f(*a))

    run(unitful, args)()
    run(plain, plain_args)()
    outs = jax.tree.leaves(_plain(unitful(*args)))
    for got, want in zip(outs, jax.tree.leaves(plain(*plain_args)), strict=True):
        assert bool(jnp.all(got == want)), "unitful and plain results differ"

    # Interleave the two so that machine noise affects both alike.
    t_unitful, t_plain = [], []
    for _ in range(10):
        t_unitful.append(_best(run(unitful, args), 20, 3))
        t_plain.append(_best(run(plain, plain_args), 20, 3))
    run_ratio = min(t_unitful) / min(t_plain)

    def trace(wrap, a):
        # A fresh function each time, so that JAX's tracing cache cannot answer.
        return lambda: jax.jit(wrap(lambda *a: simulate(*a))).trace(*a).lower()

    trace_unitful = _best(trace(quax.quaxify, args), 3, 5)
    trace_plain = _best(trace(lambda f: f, plain_args), 3, 5)
    hlo = [
        jax.jit(f).lower(*a).compile().as_text().count("\n")
        for f, a in [(quax.quaxify(simulate), args), (simulate, plain_args)]
    ]

    # m vs km: one compilation for both.
    fresh = jax.jit(quax.quaxify(simulate))
    fresh(*args)
    fresh(Quantity(jnp.ones(n), "km"), *args[1:])
    compilations = fresh._cache_size()

    print("| measure | unitful | plain | ratio |")
    print("|---|---|---|---|")
    print(
        f"| compiled run (2000-step scan, n={n}) | {min(t_unitful) * 1e3:.3f} ms "
        f"| {min(t_plain) * 1e3:.3f} ms | {run_ratio:.3f}x |"
    )
    print(
        f"| trace + lower | {trace_unitful * 1e3:.1f} ms | {trace_plain * 1e3:.1f} ms "
        f"| {trace_unitful / trace_plain:.2f}x |"
    )
    print(f"| compiled HLO lines | {hlo[0]} | {hlo[1]} | |")
    print(f"| compilations for m and km inputs | {compilations} | 1 | |")
    print()
    print(
        "unxt: not compared (its install into a throwaway environment failed here; "
        "see quax-units/README.md)."
    )


if __name__ == "__main__":
    main()
