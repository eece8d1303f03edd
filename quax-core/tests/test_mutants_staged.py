"""Tests written for mutants of `quax/_dispatch/_staged.py` that a sampled run of
`scripts/mutation.sh dispatch-staged` let through (see `docs/mutation.md`): the
refusals of a value built inside a staged function say what went wrong and what to
do, each failing with its mutant planted."""

import re
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import pytest
import quax

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
