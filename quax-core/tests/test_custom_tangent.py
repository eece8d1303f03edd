"""`Value.tangent`: a type that is not linear in its leaves enters `custom_jvp` and
`custom_vjp` whole, with the tangent its `tangent` method builds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax

from .helpers import Dense, Scaled


w = jnp.array([1.0, -2.0, 0.5, 3.0])
a0 = jnp.array([0.3, -1.0, 2.0, 0.7])
s0 = jnp.array(1.5)


class ScaledWithTangent(Scaled):
    """`array * scale`, refusing to materialise; its tangent is
    `d(array) * scale + array * d(scale)`, dense."""

    def materialise(self):
        raise RuntimeError("Refusing to materialise ScaledWithTangent")

    def tangent(self, dot: Scaled):
        return dot.array * self.scale + self.array * dot.scale


class ScaledWithValueTangent(ScaledWithTangent):
    """The same tangent, as a (linear) `Dense` value."""

    def tangent(self, dot: Scaled):
        return Dense(dot.array * self.scale + self.array * dot.scale)


class WrongTangent(ScaledWithTangent):
    def tangent(self, dot: Scaled):
        return dot.array[:2]


# The custom rules double (JVP) or clip (VJP) the derivative, so a test that passes
# saw them apply.
@jax.custom_jvp
def project(v):
    return v @ w


project.defjvp(lambda p, t: (project(p[0]), 2.0 * (t[0] @ w)))


@jax.custom_vjp
def project_clipped(v):
    return v @ w


project_clipped.defvjp(
    lambda v: (v @ w, None), lambda _, g: (jnp.clip(g, -0.5, 0.5) * w,)
)


def _grads(fn, typ):
    def loss(a, s):
        return 3.0 * quax.quaxify(fn)(typ(a, s))

    def dense_loss(a, s):
        return 3.0 * fn(a * s)

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(a0, s0)
    want = jax.grad(dense_loss, argnums=(0, 1))(a0, s0)
    for g, v in zip(got, want, strict=True):
        np.testing.assert_allclose(g, v, rtol=1e-6)


@pytest.mark.parametrize("typ", [ScaledWithTangent, ScaledWithValueTangent])
def test_custom_jvp_sees_the_value_and_its_tangent(typ):
    # The primal runs on the value (it refuses to materialise): dot_general's rule.
    np.testing.assert_allclose(
        quax.quaxify(project)(typ(a0, s0)), project(a0 * s0), rtol=1e-6
    )
    _grads(project, typ)
    _, tangent = jax.jvp(
        lambda s: quax.quaxify(project)(typ(a0, s)), (s0,), (jnp.array(1.0),)
    )
    np.testing.assert_allclose(tangent, 2.0 * (a0 @ w), rtol=1e-6)


@pytest.mark.parametrize("typ", [ScaledWithTangent, ScaledWithValueTangent])
def test_custom_vjp_cotangent_maps_back_through_the_tangent(typ):
    _grads(project_clipped, typ)


def test_a_tangent_of_the_wrong_shape_is_refused():
    with pytest.raises(TypeError, match=r"WrongTangent.tangent.*value's shape"):
        jax.grad(lambda s: quax.quaxify(project)(WrongTangent(a0, s)))(s0)
