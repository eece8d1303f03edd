"""Symbolic zeros of `custom_vjp` and `custom_jvp` on a value of two leaves.

A value is perturbed (its tangent or cotangent is not a symbolic zero) where any of
its float leaves is: differentiating with respect to one leaf of a value makes the
whole value perturbed. Each case differentiates with respect to one leaf, the other
leaf, and both, against `jax.grad` of the same function on the materialised array
(plain JAX, without the custom rule's shortcut).
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax.custom_derivatives import SymbolicZero
from jaxtyping import Array


class Pair(quax.ArrayValue):
    """`a + b`: linear in its two leaves; every primitive materialises it."""

    a: Array
    b: Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.a.shape, self.a.dtype)

    def materialise(self) -> Array:
        return self.a + self.b

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        dense = [v.materialise() if isinstance(v, Pair) else v for v in values]
        return primitive.bind(*dense, **params)


a0 = jnp.array([1.0, -2.0, 0.5])
b0 = jnp.array([0.25, 3.0, -1.0])
y0 = jnp.array([2.0, -1.0, 4.0])


# `x * y`, whose backward pass skips the cotangent of an unperturbed `x` (as a rule
# may, to save a residual): a value counted as unperturbed gets no gradient.
@jax.custom_vjp
def times(x: Any, y: Any) -> Any:
    return x * y


def _times_fwd(x: Any, y: Any) -> Any:
    return times(x.value, y.value), (y.value if x.perturbed else None)


def _times_bwd(y: Any, g: Any) -> Any:
    return (None if y is None else g * y), None


times.defvjp(_times_fwd, _times_bwd, symbolic_zeros=True)


# `2 x`, whose JVP gives a zero tangent for a symbolically zero input tangent.
@jax.custom_jvp
def double(x: Any) -> Any:
    return 2 * x


def _double_jvp(primals: Any, tangents: Any) -> Any:
    (x,), (t,) = primals, tangents
    out = double(x)
    if isinstance(t, SymbolicZero):
        return out, jnp.zeros(jnp.shape(out), jnp.result_type(out))
    return out, 2 * t


double.defjvp(_double_jvp, symbolic_zeros=True)


# The identity, whose backward pass gives nothing for a symbolically zero cotangent.
@jax.custom_vjp
def identity(x: Any) -> Any:
    return x


def _identity_fwd(x: Any) -> Any:
    return x.value, None


def _identity_bwd(_: Any, g: Any) -> Any:
    return (None if isinstance(g, SymbolicZero) else g,)


identity.defvjp(_identity_fwd, _identity_bwd, symbolic_zeros=True)


def _grads(loss: Callable[[Any, Any], Any]) -> dict[str, Any]:
    """The gradient of `loss(a, b)` with respect to `a`, to `b` and to both."""
    return {
        "a": jax.grad(lambda a: loss(a, b0))(a0),
        "b": jax.grad(lambda b: loss(a0, b))(b0),
        "both": jax.grad(loss, argnums=(0, 1))(a0, b0),
    }


def _assert_grads_equal(got: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, exp in expected.items():
        for g, e in zip(jax.tree.leaves(got[key]), jax.tree.leaves(exp), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("jit", [False, True])
def test_custom_vjp_input_perturbed_through_one_leaf(jit: bool) -> None:
    run = quax.quaxify(lambda p, y: times(p, y))
    run = jax.jit(run) if jit else run
    got = _grads(lambda a, b: jnp.sum(run(Pair(a, b), y0)))
    expected = _grads(lambda a, b: jnp.sum((a + b) * y0))
    _assert_grads_equal(got, expected)
    # `d/da` is `y0`: not zero, as a value counted unperturbed would give.
    np.testing.assert_allclose(got["a"], y0)


@pytest.mark.parametrize("jit", [False, True])
def test_custom_jvp_tangent_of_one_leaf(jit: bool) -> None:
    run = quax.quaxify(lambda p: double(p))
    run = jax.jit(run) if jit else run
    got = _grads(lambda a, b: jnp.sum(run(Pair(a, b)) * y0))
    expected = _grads(lambda a, b: jnp.sum(2 * (a + b) * y0))
    _assert_grads_equal(got, expected)
    np.testing.assert_allclose(got["a"], 2 * y0)


@pytest.mark.parametrize("jit", [False, True])
def test_custom_vjp_output_cotangent_on_one_leaf(jit: bool) -> None:
    # The loss reads one leaf of the output value: the other leaf's cotangent is a
    # symbolic zero, the output's is not.
    run = quax.quaxify(lambda p: identity(p))
    run = jax.jit(run) if jit else run
    got = _grads(lambda a, b: jnp.sum(run(Pair(a, b)).a * y0))
    expected = _grads(lambda a, b: jnp.sum(a * y0))
    _assert_grads_equal(got, expected)
    np.testing.assert_allclose(got["a"], y0)
