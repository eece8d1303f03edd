"""`quax.testing` conformance: quantities against the same programs on their
SI-coherent numbers (eval, jit, vmap, grad, jvp), and compiled programs free of
unit conversions."""

import hypothesis.strategies as st
import jax.numpy as jnp
import pytest
import quax.testing
import quax.testing.strategies as qst
from hypothesis import given, settings
from jax import lax
from quax_units import Quantity


x = Quantity(jnp.array([1.0, 2.0, 3.0]), "km")
y = Quantity(jnp.array([250.0, 3000.0, 1.0]), "m")
t = Quantity(jnp.array([2.0, 4.0, 8.0]), "h")
k = Quantity(jnp.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]]), "N / m")


def _scan_sum(x, t):
    def step(carry, pair):
        xi, ti = pair
        return carry + xi / ti, carry

    return lax.scan(step, x[0] / t[0], (x, t))


PROGRAMS = {
    "kinematics": (lambda x, t: jnp.sum(x / t) * t + x, (x, t)),
    "same units, other scale": (lambda x, y: jnp.maximum(x, y) - y, (x, y)),
    "matrix times vector": (lambda k, x: k @ x, (k, x)),
    "mean and variance": (lambda x: (jnp.mean(x), jnp.var(x)), (x,)),
    "dimensionless function": (lambda x, y: jnp.exp(-y / x), (x, y)),
    "scan carry": (_scan_sum, (x, t)),
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_matches_the_program_on_si_numbers(name):
    fn, args = PROGRAMS[name]
    quax.testing.assert_matches_dense(fn, *args)


# The operations of `quax.testing.strategies.programs` that a quantity with
# dimensions takes: `sin`, `tanh` and `add_const` (a plain constant) need a
# dimensionless one.
_DIMENSIONAL_OPS = tuple(
    op for op in qst.ALL_OPS if op not in ("sin", "tanh", "add_const")
)


@settings(max_examples=10, deadline=None)
@given(qst.data())
def test_random_programs_match_the_program_on_si_numbers(data):
    unit = data.draw(st.sampled_from(["km", "m / s", "degC", "%"]), label="unit")
    ops = qst.ALL_OPS if unit == "%" else _DIMENSIONAL_OPS
    program = data.draw(qst.programs(ops=ops), label="program")
    x = data.draw(qst.arrays(program.in_shape, program.dtype), label="x")
    # A nonzero number that would fall below the dtype's normal range once held in
    # SI-coherent units (6.2e-38 % is 6.2e-40) is refused at construction (it would
    # be held as 0): such numbers are read as 0 here, below 100 times the dtype's
    # smallest normal number (the 0.01 of a percent).
    x = jnp.where(jnp.abs(x) < 100 * jnp.finfo(x.dtype).tiny, 0, x).astype(x.dtype)
    # A `while_loop` has no reverse-mode derivative, in plain JAX either.
    quax.testing.assert_matches_dense(
        program, Quantity(x, unit), grad=program.reverse_mode
    )


def test_compiled_program_converts_nothing():
    # Quantities are held in SI-coherent units: adding kilometres to metres, or
    # comparing them, compiles to the bare operation.
    quax.testing.assert_hlo_lacks(lambda x, y: x + y, x, y, ops=["multiply", "divide"])
    quax.testing.assert_hlo_lacks(lambda x, y: x < y, x, y, ops=["multiply", "divide"])
