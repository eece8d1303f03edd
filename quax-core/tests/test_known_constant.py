"""`quax.known_constant`: what a rule can know about a plain operand at trace time."""

import jax
import jax.numpy as jnp
import numpy as np
import quax
from jax import lax


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


def test_products_with_zeros_are_known_scale_invariant():
    # Each element is zero, infinite or NaN whatever the traced factor: a product
    # or quotient with such an array, sums and rearrangements of such arrays.
    seen = {}

    def f(dt, x):
        zeros = jnp.zeros(3)
        seen["product"] = quax.known_scale_invariant(0.0 * (dt * zeros))
        seen["dot"] = quax.known_scale_invariant(jnp.zeros((2, 3)) @ x)
        seen["quotient"] = quax.known_scale_invariant(jnp.full(3, jnp.inf) / dt)
        seen["over zero"] = quax.known_scale_invariant(x / 0.0)
        seen["sum"] = quax.known_scale_invariant(dt * zeros + jnp.full(3, jnp.nan))
        seen["select"] = quax.known_scale_invariant(
            lax.select(x > 0, dt * zeros, jnp.full(3, jnp.inf))
        )
        seen["reshaped"] = quax.known_scale_invariant((dt * zeros)[::-1].reshape(3, 1))
        # Not so: a traced factor alone, a sum with one, a nonzero constant.
        seen["traced"] = quax.known_scale_invariant(dt * x)
        seen["plus traced"] = quax.known_scale_invariant(dt * zeros + x)
        seen["ones"] = quax.known_scale_invariant(dt * zeros + 1.0)
        # Integer division by zero, and infinities converted to integers, are not
        # infinite or NaN.
        seen["int quotient"] = quax.known_scale_invariant(
            jnp.arange(3) // jnp.zeros(3, jnp.int32)
        )
        seen["to int"] = quax.known_scale_invariant((x / 0.0).astype(jnp.int32))
        return x

    jax.jit(f)(2.0, jnp.arange(3.0))
    proven = ["product", "dot", "quotient", "over zero", "sum", "select", "reshaped"]
    assert all(seen[k] for k in proven), seen
    assert not any(seen[k] for k in seen if k not in proven), seen


def test_concrete_arrays_are_known_scale_invariant_by_their_values():
    assert quax.known_scale_invariant(jnp.array([0.0, jnp.inf, -jnp.inf, jnp.nan]))
    assert not quax.known_scale_invariant(jnp.array([0.0, 1.0]))
    assert not quax.known_scale_invariant(jnp.zeros(2000))  # over the default max_size
    assert quax.known_scale_invariant(jnp.zeros(2000), max_size=4096)
