"""Value types shared by the core's tests.

- `Dense`: wraps an array; its `default` unwraps, binds and rewraps, so every
  primitive keeps the wrapper. Its materialise is allowed.
- `Refusing`: wraps an array like `Dense`, but refuses to materialise: a test that
  passes with it proves the body ran on the structured value.
- `Liftable`: a `Refusing` with a `lift` classmethod (plain arrays join it).
- `Scaled`: `array * scale`, with real rules for a few primitives (`mul` by an array,
  `neg`, `dot_general`) and materialisation allowed for the rest.
- `Wrapper`: a user's wrapper as clients write them: every output of every primitive
  (booleans and integers too) is wrapped, it refuses to materialise, and it says
  nothing about `linear_in_leaves`.

And `compiles_eager_programs`, a mark for tests whose subject is a compiled eager
program: they skip on a backend that compiles none (`BARRIERS` false).

And `in_traced_body(how, f)`: `f` called inside one of the bodies JAX traces itself
(`TRACED_BODIES`), where JAX's staging inlines a `jax.jit(inline=True)` function.
"""

from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest
import quax
import quax._caching._eager as quax_eager
from jax import lax
from jaxtyping import Array, ArrayLike


# Whether this backend compiles eager programs at all: one that cannot compile the
# optimisation barriers keeping each equation's rounding (the TPU runtime) runs every
# eager call equation by equation (`test_backend_without_barriers_runs_by_equation`
# in test_eager.py), so a test that observes a compiled eager program has no subject
# there.
BARRIERS = quax_eager._barriers_hold(jax.default_backend())
compiles_eager_programs = pytest.mark.skipif(
    not BARRIERS,
    reason="this backend cannot compile the optimisation barriers that keep an eager "
    "program's rounding (the TPU runtime: UNIMPLEMENTED), so it compiles no eager "
    "program: every call runs equation by equation",
)


class Dense(quax.ArrayValue):
    """An array in a wrapper that every primitive keeps."""

    array: Array
    linear_in_leaves: ClassVar[bool] = True

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> Array:
        return self.array

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        wrapper = next(type(v) for v in values if isinstance(v, Dense))
        arrays = [v.array if isinstance(v, Dense) else v for v in values]
        out = primitive.bind(*arrays, **params)
        # Comparisons and integer results come back plain, as a family's would.
        wrap = lambda o: wrapper(o) if jnp.issubdtype(o.dtype, jnp.inexact) else o
        if primitive.multiple_results:
            return [wrap(o) for o in out]
        return wrap(out)


class RefusedMaterialisation(RuntimeError):
    pass


class Refusing(Dense):
    """A `Dense` that refuses to materialise."""

    def materialise(self) -> Array:
        raise RefusedMaterialisation("Refusing values never materialise")


class Liftable(Refusing):
    """A `Refusing` whose type says how to lift a plain array into it (`lift`), so
    that loop carries and branch outputs that are plain on one side join without
    materialising."""

    @classmethod
    def lift(cls, array: ArrayLike, like: "Liftable") -> "Liftable":
        del like
        return cls(jnp.asarray(array))


class Scaled(quax.ArrayValue):
    """`array * scale`, with `scale` a scalar: not linear in its leaves together."""

    array: Array
    scale: Array
    linear_in_leaves: ClassVar[bool] = False

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> Array:
        return self.array * self.scale


@quax.register(lax.mul_p)
def _(x: Scaled, y: ArrayLike, **params: Any) -> Scaled:
    del params
    if jnp.ndim(y) == 0:
        return Scaled(x.array, x.scale * y)
    return Scaled(x.array * y, x.scale)


@quax.register(lax.mul_p)
def _(x: ArrayLike, y: Scaled, **params: Any) -> Scaled:
    del params
    if jnp.ndim(x) == 0:
        return Scaled(y.array, y.scale * x)
    return Scaled(y.array * x, y.scale)


@quax.register(lax.neg_p)
def _(x: Scaled, **params: Any) -> Scaled:
    del params
    return Scaled(x.array, -x.scale)


@quax.register(lax.dot_general_p)
def _(x: Scaled, y: ArrayLike, **params: Any) -> Array:
    return lax.dot_general_p.bind(x.array, y, **params) * x.scale


class Wrapper(quax.ArrayValue):
    """A user's dense wrapper (as quaxed's `MyArray`): every primitive keeps it, it
    refuses to materialise, and it says nothing about `linear_in_leaves`."""

    array: jax.Array

    def aval(self):
        return jax.typeof(self.array)

    def materialise(self):
        raise RuntimeError("Refusing to materialise `Wrapper`")

    @staticmethod
    def default(primitive, values, params):
        wrapper = next(type(v) for v in values if isinstance(v, Wrapper))
        arrays = [v.array if isinstance(v, Wrapper) else v for v in values]
        out = primitive.bind(*arrays, **params)
        if primitive.multiple_results:
            return [wrapper(o) for o in out]
        return wrapper(out)


def leaves_equal(a: Any, b: Any) -> bool:
    """Whether two pytrees have the same structure and (close) leaves."""
    la, ta = jtu.tree_flatten(a)
    lb, tb = jtu.tree_flatten(b)
    return ta == tb and all(
        jnp.shape(x) == jnp.shape(y) and bool(jnp.allclose(x, y, atol=1e-5))
        for x, y in zip(la, lb, strict=True)
    )


def dense(x: Any) -> Any:
    """Unwrap test values (not materialise: `Refusing` is unwrapped too)."""
    return jtu.tree_map(
        lambda v: v.array if isinstance(v, Dense) else v,
        x,
        is_leaf=lambda v: isinstance(v, Dense),
    )


# Bodies JAX traces into jaxprs of its own before quax meets them.
TRACED_BODIES = [
    "jit body",
    "filter_jit body",
    "scan body",
    "cond branch",
    "while_loop body",
    "fori_loop body",
    "checkpoint",
    "custom_jvp",
    "vmap inside",
]


def in_traced_body(how: str, f: Any) -> Any:
    """A function of one array that calls `f` on it inside the body `how` (one of
    `TRACED_BODIES`) and returns what `f` gave there. Loop carries keep their types
    (`f`'s output is carried beside its operand), so `f` may change its operand's
    type (a unit); a `vmap` inside maps over three copies of the operand."""
    if how == "jit body":
        return jax.jit(lambda a: f(a))
    if how == "filter_jit body":
        return eqx.filter_jit(lambda a: f(a))
    if how == "scan body":
        return lambda a: lax.scan(lambda c, _: (c, f(c)), a, length=2)[1][1]
    if how == "cond branch":
        return lambda a: lax.cond(jnp.bool_(True), f, lambda b: f(b) * 2, a)
    if how == "while_loop body":

        def step(c: Any) -> Any:
            return c[0] + 1, c[1], f(c[1])

        def looped(a: Any) -> Any:
            return lax.while_loop(lambda c: c[0] < 1, step, (0, a, f(a) * 0))[2]

        return looped
    if how == "fori_loop body":
        return lambda a: lax.fori_loop(
            0, 1, lambda i, c: (c[0], f(c[0])), (a, f(a) * 0)
        )[1]
    if how == "checkpoint":
        return jax.checkpoint(lambda a: f(a))
    if how == "custom_jvp":
        g = jax.custom_jvp(lambda a: f(a))
        g.defjvp(lambda primals, tangents: (g(*primals), f(tangents[0])))
        return g
    assert how == "vmap inside", how

    def batched(a: Any) -> Any:
        return jax.vmap(lambda b: jax.jit(lambda c: f(c))(b))(jnp.stack([a, a, a]))[1]

    return batched


__all__ = [
    "TRACED_BODIES",
    "Dense",
    "Liftable",
    "RefusedMaterialisation",
    "Refusing",
    "Scaled",
    "Wrapper",
    "dense",
    "in_traced_body",
    "leaves_equal",
]


CHECKPOINT_LOWER = jnp.array([1.5, -0.5, 0.25])
CHECKPOINT_UPPER = jnp.array([0.75, 2.0, -1.0])


def checkpoint_building_values(x: jax.Array) -> Any:
    """`jax.checkpoint` of a plain `x` whose body builds values (its params hold an
    open jaxpr): `where(x > lower, x, upper)` with `Refusing` bounds, so a
    `Refusing` value whose array is NumPy's `where` of `CHECKPOINT_LOWER` and
    `CHECKPOINT_UPPER`."""
    return jax.checkpoint(
        lambda x: jnp.where(
            x > Refusing(CHECKPOINT_LOWER), x, Refusing(CHECKPOINT_UPPER)
        )
    )(x)
