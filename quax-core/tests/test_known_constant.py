"""`quax.known_constant`: what a rule can know about a plain operand at trace time."""

import jax
import jax.numpy as jnp
import numpy as np
import quax


def test_concrete_arrays_are_their_own_value():
    np.testing.assert_array_equal(quax.known_constant(jnp.arange(3.0)), [0.0, 1.0, 2.0])
    assert quax.known_constant(jnp.zeros(2000)) is None  # over the default max_size
    assert quax.known_constant(jnp.zeros(2000), max_size=4096).shape == (2000,)


def test_constants_of_a_staged_program_are_known():
    seen = {}

    def f(x):
        fill = jnp.zeros_like(x)  # a broadcast literal
        seen["fill"] = quax.known_constant(fill)
        seen["x"] = quax.known_constant(x)
        seen["sum"] = quax.known_constant(jnp.full((2,), 2.0) + 1.0)
        return x + fill

    jax.jit(f)(jnp.ones(3))
    np.testing.assert_array_equal(seen["fill"], np.zeros(3))
    assert seen["x"] is None  # an input of the program is not a constant
    np.testing.assert_array_equal(seen["sum"], [3.0, 3.0])
