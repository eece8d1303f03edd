"""How often quax re-traces the body of each higher-order primitive.

JAX traces the user's body once into the primitive's jaxpr; quax's rule then
evaluates that jaxpr on the values (`quax.plugins.track_evaluations` counts these),
once per branch or function, plus once per round of type joins. Eager calls (no
enclosing `jit`) run the rule again on every call; nested `jit`s hit JAX's cache.
Prints a Markdown table and writes `docs/images/retraces_evaluations.png`.

Run: `python benchmarks/retraces.py [--quick]`.
"""

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import matplotlib
import quax
from jax import lax
from jaxtyping import Array, ArrayLike
from quax_units import Quantity


matplotlib.use("Agg")
import matplotlib.pyplot as plt


IMAGES = Path(__file__).parents[1] / "docs" / "images"


class Wrapped(quax.ArrayValue):
    """An array in a wrapper that every primitive keeps (through `default`)."""

    array: Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        return self.array

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        wrapper = next(type(v) for v in values if isinstance(v, Wrapped))
        arrays = [v.array if isinstance(v, Wrapped) else v for v in values]
        out = primitive.bind(*arrays, **params)

        def wrap(o: Any) -> Any:
            return wrapper(o) if jnp.issubdtype(o.dtype, jnp.inexact) else o

        return [wrap(o) for o in out] if primitive.multiple_results else wrap(out)


class Lifting(Wrapped):
    """A `Wrapped` that refuses to materialise, and lifts plain arrays into itself:
    loop carries and branch outputs that are plain on one side join by lifting."""

    def materialise(self) -> Array:
        raise RuntimeError("Refusing to materialise Lifting")

    @classmethod
    def lift(cls, array: ArrayLike, like: quax.Value) -> "Lifting":
        del like
        return cls(jnp.asarray(array))


x = jnp.arange(4.0)

PROGRAMS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "jit": (lambda b: jax.jit(lambda c: jnp.sin(c))(b), Wrapped),
    "jit (inline)": (lambda b: jax.jit(lambda c: jnp.sin(c), inline=True)(b), Wrapped),
    "cond": (lambda b: lax.cond(True, lambda c: c * 2, lambda c: c + 1, b), Wrapped),
    "cond (join: lift)": (
        lambda b: lax.cond(True, lambda c: c * 2, lambda c: jnp.zeros(4), b),
        Lifting,
    ),
    "while_loop": (
        lambda b: lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1]), (0, b)
        )[1],
        Wrapped,
    ),
    "fori_loop": (lambda b: lax.fori_loop(0, 3, lambda i, c: c * 2, b), Wrapped),
    "fori_loop (join: lift)": (
        lambda b: lax.fori_loop(0, 3, lambda i, c: c + b, jnp.zeros(4)),
        Lifting,
    ),
    "fori_loop (join: dense)": (
        lambda b: lax.fori_loop(0, 3, lambda i, c: c + b, jnp.zeros(4)),
        Wrapped,
    ),
    "fori_loop (plain zeros buffer of quantities: discovered)": (
        lambda b: lax.fori_loop(
            0, 3, lambda i, buf: buf.at[i].set(b * i), jnp.zeros((3, 4))
        ),
        lambda a: Quantity(a, "m"),
    ),
    "scan": (
        lambda b: lax.scan(lambda c, y: (c * y, c), b, jnp.ones((3, 4)))[0],
        Wrapped,
    ),
    "checkpoint": (lambda b: jax.checkpoint(jnp.sin)(b), Wrapped),
    "custom_linear_solve": (
        lambda b: lax.custom_linear_solve(
            lambda v: v * 2, b, lambda mv, c: c / 2, symmetric=True
        ),
        Wrapped,
    ),
    "linalg.inv (join)": (
        lambda b: jnp.linalg.inv(b.reshape(2, 2) + 3 * jnp.eye(2)),
        Wrapped,
    ),
    "grad(fori_loop), value carry": (
        jax.grad(
            lambda v: jnp.sum(lax.fori_loop(0, 3, lambda i, c: c * 0.5 + v, v) * v)
        ),
        Lifting,
    ),
}


def _plot(figures: dict[str, list[int]]) -> Path:
    names = list(figures)
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.2))
    positions = range(len(names))
    ax.barh(
        [p + 0.2 for p in positions],
        [figures[n][0] for n in names],
        0.4,
        label="first call",
    )
    ax.barh(
        [p - 0.2 for p in positions],
        [figures[n][1] for n in names],
        0.4,
        label="second call",
    )
    ax.set_yticks(list(positions), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("jaxprs evaluated on values (re-traces of a body)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / "retraces_evaluations.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(quick: bool = False) -> dict[str, Any]:
    """Count the body evaluations of each program, on a first and a second eager
    call. The counts do not depend on the machine, so `quick` changes nothing.

    **Returns:**

    `{"evaluations": {program: [first call, second call]}}`.
    """
    del quick
    print("| program | body evaluations under quax: first call | second call |")
    print("|---|---|---|")
    figures: dict[str, list[int]] = {}
    for name, (fn, wrap) in PROGRAMS.items():
        f = quax.quaxify(fn)
        counts = []
        for _ in range(2):
            with quax.plugins.track_evaluations() as report:
                f(wrap(x))
            counts.append(report.total)
        figures[name] = counts
        print(f"| {name} | {counts[0]} | {counts[1]} |")
    print(f"\nplot: {_plot(figures).relative_to(IMAGES.parents[1])}")
    return {"evaluations": figures}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
