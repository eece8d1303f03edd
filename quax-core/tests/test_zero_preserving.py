"""`quax.ZERO_PRESERVING`: every primitive in it maps zero to zero, elementwise."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jax.core import ShapedArray
from jax.extend.core import Primitive


# Each primitive through its `lax` function, on the dtype it takes: float32 where it
# accepts one, complex64 for the complex parts, int32 for bit counting.
CALLS = {
    "neg": (lax.neg, jnp.float32),
    "abs": (lax.abs, jnp.float32),
    "sign": (lax.sign, jnp.float32),
    "floor": (lax.floor, jnp.float32),
    "ceil": (lax.ceil, jnp.float32),
    "round": (lax.round, jnp.float32),
    "sin": (lax.sin, jnp.float32),
    "tan": (lax.tan, jnp.float32),
    "sinh": (lax.sinh, jnp.float32),
    "tanh": (lax.tanh, jnp.float32),
    "asin": (lax.asin, jnp.float32),
    "atan": (lax.atan, jnp.float32),
    "asinh": (lax.asinh, jnp.float32),
    "atanh": (lax.atanh, jnp.float32),
    "expm1": (lax.expm1, jnp.float32),
    "log1p": (lax.log1p, jnp.float32),
    "sqrt": (lax.sqrt, jnp.float32),
    "cbrt": (lax.cbrt, jnp.float32),
    "erf": (lax.erf, jnp.float32),
    "erf_inv": (lax.erf_inv, jnp.float32),
    "square": (lax.square, jnp.float32),
    "conj": (lax.conj, jnp.complex64),
    "real": (lax.real, jnp.complex64),
    "imag": (lax.imag, jnp.complex64),
    "population_count": (lax.population_count, jnp.int32),
    "reduce_precision": (
        lambda x: lax.reduce_precision(x, exponent_bits=5, mantissa_bits=2),
        jnp.float32,
    ),
}


def test_is_a_frozenset_of_the_listed_primitives() -> None:
    assert isinstance(quax.ZERO_PRESERVING, frozenset)
    assert sorted(p.name for p in quax.ZERO_PRESERVING) == sorted(CALLS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_maps_zero_to_zero(name: str) -> None:
    fn, dtype = CALLS[name]
    x = jnp.zeros((2, 3), dtype)
    out = fn(x)
    assert out.shape == x.shape
    np.testing.assert_array_equal(out, np.zeros((2, 3), out.dtype))


class Stored(quax.ArrayValue):
    """A vector that stores its nonzero elements only."""

    data: jax.Array
    indices: jax.Array
    length: int = eqx.field(static=True)

    def aval(self) -> ShapedArray:
        return ShapedArray((self.length,), self.data.dtype)

    def materialise(self) -> jax.Array:
        return jnp.zeros(self.length, self.data.dtype).at[self.indices].set(self.data)


@quax.register_elementwise(quax.ZERO_PRESERVING)
def _(primitive: Primitive, x: Stored, **params: Any) -> Stored:
    return Stored(primitive.bind(x.data, **params), x.indices, x.length)


def test_usable_with_register_elementwise() -> None:
    # The docstring's use: one rule over the whole set, on the stored elements alone.
    x = Stored(jnp.array([0.5, -0.25]), jnp.array([1, 3]), 5)
    out = quax.quaxify(lambda x: jnp.sqrt(lax.square(jnp.sin(x))))(x)
    assert isinstance(out, Stored)
    expect = [0.0, np.sin(0.5), 0.0, np.sin(0.25), 0.0]
    np.testing.assert_allclose(out.materialise(), expect, rtol=1e-6)
