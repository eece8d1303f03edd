"""Tests written for mutants of `quax/_dispatch/_staged.py` that a sampled run of
`scripts/mutation.sh dispatch-staged` let through (see `docs/mutation.md`): the
refusals of a value built inside a staged function, or inside a transform from its
tracers, say what went wrong and what to do, each failing with its mutant planted."""

import re
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import pytest
import quax

from .helpers import Dense, Refusing
from .test_nesting import T, Tagged, _build_inside


def test_a_staged_value_without_quax_says_what_to_do() -> None:
    """A jaxpr holding a staged value, run without the quax trace, names what
    happened and both ways out (mutant `_without_quax` 3 changed its first
    sentence's case)."""

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
