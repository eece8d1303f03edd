"""Tests written for mutants of `quax/_dispatch/_staged.py` that a sampled run of
`scripts/mutation.sh dispatch-staged` let through (see `docs/mutation.md`): the
refusals of a value built inside a staged function, or inside a transform from its
tracers, say what went wrong and what to do, each failing with its mutant planted."""

import operator
import re
from typing import Any

import jax
import jax.core
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jaxtyping import Array, ArrayLike

from .helpers import Dense, Refusing
from .test_nesting import Diagonal, T, Tagged, _build_inside


def test_a_staged_value_without_quax_says_what_to_do() -> None:
    """A jaxpr holding a staged value, run without the quax trace, names what
    happened, the value's tree and both ways out (mutant `_without_quax` 3 changed
    its first sentence's case; `_impl` 2 named `None` for the tree)."""

    def f(t: Any) -> Any:
        return jax.make_jaxpr(_build_inside)(jnp.ones(2)), t

    jaxpr, _ = quax.quaxify(f)(T)
    with pytest.raises(RuntimeError) as refusal:
        jax.extend.core.jaxpr_as_fun(jaxpr)(jnp.ones(2))
    message = str(refusal.value)
    assert message.startswith(
        "A quax value built inside a function that JAX staged (`jax.jit`, "
        "`lax.cond`, ...) inside a quaxified function reached JAX without the quax "
        "trace that gives it its type"
    ), message
    assert "(PyTreeDef(CustomNode(Tagged[" in message, message
    assert (
        "Call the staged function inside `quax.quaxify`, or build the value "
        "outside it." in message
    ), message


def test_differentiating_a_staged_value_by_its_leaves_says_what_to_do() -> None:
    """`jax.jvp` with respect to an array that a value built inside a `jax.jit`
    (in a quaxified function) holds as a leaf is refused, naming the cause and the
    ways out (mutant `_jvp` 13 changed the cause's case)."""

    def f(t: Any, c: Any) -> Any:
        inner = jax.jit(lambda c: Tagged(c, "c") * t)
        return jax.jvp(inner, (c,), (jnp.ones_like(c),))

    with pytest.raises(
        NotImplementedError,
        match=re.escape(
            "built inside a function that JAX staged in a quaxified function is "
            "differentiated with respect to its leaves there. Build the value "
            "outside the staged function"
        ),
    ):
        quax.quaxify(f)(T, jnp.array(2.0))


def test_a_value_built_from_a_transforms_tracers_says_what_to_do() -> None:
    """A value built inside `jax.jvp` (within a quaxified function) from its tracers
    cannot join the quax trace outside the transform: where a JAX function asks it
    for an array it is materialised, and a refusal says what happened, then the
    ways out (mutants `lift` 30 and 34 changed the case of the one and the other;
    `test_built_inside.py`'s test of this refusal matches neither sentence)."""

    def f(x: Any) -> Any:
        ones = (jnp.ones(3),)
        return jax.jvp(lambda t: jnp.stack([Refusing(t), x]), ones, ones)[1]

    with pytest.raises(RuntimeError) as refusal:
        quax.quaxify(f)(Dense(jnp.arange(3.0)))
    message = str(refusal.value)
    assert (
        "built inside a transform (`jax.grad`, `jax.jvp`, ...) within a quaxified "
        "function, from that transform's tracers, met a JAX function that takes "
        "arrays there; it cannot join the quax trace outside the transform, so "
        "quax materialised it, and that failed: Refusing values never materialise"
        in message
    ), message
    assert message.endswith(
        " Build the value outside the transform, or apply the transform outside "
        "`quax.quaxify`."
    ), message


def test_a_staged_value_without_quax_names_its_type_when_lowered() -> None:
    """A jaxpr holding a staged value, compiled without the quax trace, is refused
    at lowering, naming the value's tree (mutant `_lowering` 1 named `None`)."""

    def f(t: Any) -> Any:
        return jax.make_jaxpr(_build_inside)(jnp.ones(2)), t

    jaxpr, _ = quax.quaxify(f)(T)
    with pytest.raises(RuntimeError) as refusal:
        jax.jit(jax.extend.core.jaxpr_as_fun(jaxpr)).lower(jnp.ones(2))
    message = str(refusal.value)
    assert "reached JAX without the quax trace that gives it its type (" in message
    assert "(PyTreeDef(CustomNode(Tagged[" in message, message


def test_a_staged_value_differentiated_by_its_leaves_names_both_ways_out() -> None:
    """The refusal of differentiating a staged value by its leaves ends with both
    ways out, word for word (mutant `_jvp` 17 changed the last sentence)."""

    def f(t: Any, c: Any) -> Any:
        inner = jax.jit(lambda c: Tagged(c, "c") * t)
        return jax.jvp(inner, (c,), (jnp.ones_like(c),))

    with pytest.raises(NotImplementedError) as refusal:
        quax.quaxify(f)(T, jnp.array(2.0))
    assert str(refusal.value).endswith(
        "Build the value outside the staged function (or outside the "
        "differentiated one), or put the transform inside `quax.quaxify`."
    ), str(refusal.value)


def test_a_staged_value_that_does_not_batch_names_both_ways_out() -> None:
    """A value built in a staged function from arrays a `vmap` batches, of a type
    that does not batch leaf by leaf, is refused with what went wrong and both ways
    out, word for word (mutants `unstage` 17 and 19 changed their case and text)."""

    def f(t: Any, d: Any) -> Any:
        return jax.jit(jax.vmap(lambda d, s: Diagonal(d) * s, in_axes=(0, None)))(d, t)

    with pytest.raises(ValueError) as refusal:
        quax.quaxify(f)(Tagged(jnp.ones(()), "t"), jnp.ones((3, 2)))
    assert str(refusal.value).endswith(
        "was staged: its type does not batch leaf by leaf. Build the value outside "
        "the `vmap`, or put the `vmap` inside `quax.quaxify`."
    ), str(refusal.value)


class Pair(quax.ArrayValue):
    """`a + b`, two arrays of one shape: batches leaf by leaf."""

    a: Array
    b: Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.a), jnp.result_type(self.a))

    def materialise(self) -> Array:
        return self.a + self.b

    __mul__ = quax.quaxify(operator.mul)


@quax.register(lax.mul_p)
def _(x: Pair, y: ArrayLike) -> Pair:
    return Pair(x.a * y, x.b * y)


def test_a_staged_value_with_a_leaf_the_vmap_does_not_batch() -> None:
    """A value built inside a `vmap` in a `jit` (staged), from a batched array and a
    constant the `vmap` does not batch: the constant is broadcast along the batch,
    and the value is each example's, against NumPy (mutant `_batch` 22 called
    `broadcast_to` without the constant, a `TypeError`)."""
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    c = np.array([10.0, 20.0], np.float32)

    def f(t: Any, x: Any) -> Any:
        return jax.jit(jax.vmap(lambda d: Pair(d, jnp.asarray(c)) * 2.0))(x), t

    out, _ = quax.quaxify(f)(T, jnp.asarray(x))
    assert isinstance(out, Pair)
    np.testing.assert_array_equal(np.asarray(out.a), x * 2.0)
    np.testing.assert_array_equal(np.asarray(out.b), np.broadcast_to(c * 2.0, (3, 2)))
