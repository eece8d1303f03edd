"""How often quax re-traces the body of each higher-order primitive.

JAX traces the user's body once into the primitive's jaxpr; quax's rule then
evaluates that jaxpr on the values (a Python counter on the evaluator counts these),
once per branch or function, plus once per round of type joins. Eager calls (no
enclosing `jit`) run the rule again on every call; nested `jit`s hit JAX's cache.
Prints a Markdown table.

Run: `python benchmarks/retraces.py`.
"""

import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import quax
import quax._higher_order as _ho
from jax import lax
from quax_units import Quantity


sys.path.insert(0, str(Path(__file__).parents[1] / "quax-core" / "tests"))
from helpers import Dense, Liftable


x = jnp.arange(4.0)
evals: Counter[int] = Counter()
_eval = _ho.eval_jaxpr_folding


def _counting_eval(jaxpr, consts, *args, **kwargs):
    evals[id(jaxpr)] += 1
    return _eval(jaxpr, consts, *args, **kwargs)


_ho.eval_jaxpr_folding = _counting_eval

PROGRAMS = {
    "jit": (lambda b: jax.jit(lambda c: jnp.sin(c))(b), Dense),
    "jit (inline)": (lambda b: jax.jit(lambda c: jnp.sin(c), inline=True)(b), Dense),
    "cond": (lambda b: lax.cond(True, lambda c: c * 2, lambda c: c + 1, b), Dense),
    "cond (join: lift)": (
        lambda b: lax.cond(True, lambda c: c * 2, lambda c: jnp.zeros(4), b),
        Liftable,
    ),
    "while_loop": (
        lambda b: lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1]), (0, b)
        )[1],
        Dense,
    ),
    "fori_loop": (lambda b: lax.fori_loop(0, 3, lambda i, c: c * 2, b), Dense),
    "fori_loop (join: lift)": (
        lambda b: lax.fori_loop(0, 3, lambda i, c: c + b, jnp.zeros(4)),
        Liftable,
    ),
    "fori_loop (join: dense)": (
        lambda b: lax.fori_loop(0, 3, lambda i, c: c + b, jnp.zeros(4)),
        Dense,
    ),
    "fori_loop (plain zeros buffer of quantities: discovered)": (
        lambda b: lax.fori_loop(
            0, 3, lambda i, buf: buf.at[i].set(b * i), jnp.zeros((3, 4))
        ),
        lambda a: Quantity(a, "m"),
    ),
    "scan": (
        lambda b: lax.scan(lambda c, y: (c * y, c), b, jnp.ones((3, 4)))[0],
        Dense,
    ),
    "checkpoint": (lambda b: jax.checkpoint(jnp.sin)(b), Dense),
    "custom_linear_solve": (
        lambda b: lax.custom_linear_solve(
            lambda v: v * 2, b, lambda mv, c: c / 2, symmetric=True
        ),
        Dense,
    ),
    "linalg.inv (join)": (
        lambda b: jnp.linalg.inv(b.reshape(2, 2) + 3 * jnp.eye(2)),
        Dense,
    ),
    "grad(fori_loop), value carry": (
        jax.grad(
            lambda v: jnp.sum(lax.fori_loop(0, 3, lambda i, c: c * 0.5 + v, v) * v)
        ),
        Liftable,
    ),
}


def main() -> None:
    print("| program | body evaluations under quax: first call | second call |")
    print("|---|---|---|")
    for name, (fn, wrap) in PROGRAMS.items():
        counts = []
        f = quax.quaxify(fn)
        for _ in range(2):
            evals.clear()
            f(wrap(x))
            counts.append(sum(evals.values()))
        print(f"| {name} | {counts[0]} | {counts[1]} |")


if __name__ == "__main__":
    main()
