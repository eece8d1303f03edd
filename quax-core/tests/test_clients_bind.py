"""A primitive bound on a value that the quaxified function closes over, as the
published quax's tests do (`lax.add_p.bind(x, y)` with `y` a LoRA array built
outside): JAX refuses such an argument as "not a valid JAX type" before any trace
sees it. Quax lets the value join the quax trace that is current, so that its rules
apply, or its type refuses to materialise with its own error; outside a quax trace
it is materialised (or refuses), as a primitive binds arrays."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax

from .helpers import Dense, RefusedMaterialisation, Refusing


class Guarded(quax.GuardedValue):
    array: jax.Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def dense(self) -> jax.Array:
        return self.array


X = jnp.arange(4.0).reshape(2, 2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_closed_over_value_refuses_with_its_own_error(jit: bool) -> None:
    y = Guarded(X)
    f = quax.quaxify(lambda x: lax.add_p.bind(x, y))
    with pytest.raises(quax.MaterialisationError, match="Refusing to materialise"):
        (jax.jit(f) if jit else f)(Guarded(X))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_closed_over_value_dispatches_to_its_rule(jit: bool) -> None:
    # `Dense`'s default keeps the wrapper: the rule saw the value, not its array.
    y = Dense(jnp.ones((2, 2)))
    f = quax.quaxify(lambda x: lax.mul_p.bind(lax.add_p.bind(x, y), y))
    out = (jax.jit(f) if jit else f)(Dense(X))
    assert type(out) is Dense
    np.testing.assert_array_equal(out.array, X + 1.0)
    # Only closed-over values, and no tracer among the inputs.
    out = quax.quaxify(lambda x: lax.add_p.bind(y, y))(Dense(X))
    assert type(out) is Dense
    np.testing.assert_array_equal(out.array, jnp.full((2, 2), 2.0))


def test_value_bound_outside_quax_is_materialised_or_refuses() -> None:
    out = lax.add_p.bind(jnp.ones((2, 2)), Dense(X))
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(out, X + 1.0)
    with pytest.raises(RefusedMaterialisation):
        lax.add_p.bind(jnp.ones((2, 2)), Refusing(X))
    with pytest.raises(quax.MaterialisationError, match="Refusing to materialise"):
        jax.jit(lambda a: lax.add_p.bind(a, Guarded(X)))(jnp.ones((2, 2)))
