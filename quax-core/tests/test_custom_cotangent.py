"""`Value.cotangent`: the cotangent a `custom_vjp` rule receives for a value, and the
structure in which quax reads the rule's cotangent of an input back onto its leaves."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jaxtyping import Array

from .helpers import Dense


class PerUnit(Dense):
    """An array in some unit to the power `power` (a static field, as units are):
    its cotangent is per that unit, in the power `-power`."""

    power: int = eqx.field(static=True)
    # Primitives on it materialise it (`Dense` would keep a wrapper without power).
    default = staticmethod(quax.Value.default)

    def cotangent(self, bar: "PerUnit") -> "PerUnit":
        return PerUnit(bar.array, -self.power)


a0 = jnp.array([0.5, -1.0, 2.0])
weights = jnp.array([1.0, 2.0, -3.0])


def _make_identity(seen: list, give_back):
    """The identity with a custom VJP whose `bwd` records the cotangent it gets
    and returns `give_back(cotangent)`."""

    @jax.custom_vjp
    def identity(x):
        return x

    def fwd(x):
        return x, None

    def bwd(_, ct):
        seen.append(ct.power)
        return (give_back(ct),)

    identity.defvjp(fwd, bwd)
    return identity


def _gradient(identity) -> Array:
    def loss(a):
        out = quax.quaxify(identity)(PerUnit(a, 2))
        return jnp.sum(out.array * weights)

    return jax.grad(loss)(a0)


def test_the_rule_gets_the_cotangent_per_unit_and_gives_it_back():
    seen: list = []
    grad = _gradient(_make_identity(seen, lambda ct: ct))
    # The rule saw the cotangent of a value in unit^2: per unit^2.
    assert seen == [-2]
    # Its cotangent of the input, in that structure, gives the leaf's cotangent.
    np.testing.assert_array_equal(grad, weights)


def test_a_cotangent_in_another_structure_is_transposed_as_a_dense_one():
    # A rule returning the cotangent in the primal's own structure (or a plain
    # array) is read as a dense cotangent: materialised and transposed.
    seen: list = []
    grad = _gradient(_make_identity(seen, lambda ct: jnp.asarray(PerUnit(ct.array, 2))))
    np.testing.assert_array_equal(grad, weights)
    seen.clear()
    grad = _gradient(_make_identity(seen, lambda ct: ct.array))
    np.testing.assert_array_equal(grad, weights)


@pytest.mark.parametrize("symbolic_zeros", [False, True])
def test_a_zero_cotangent_stays_a_zero(symbolic_zeros):
    # The value output's cotangent is zero: the rule gets zeros per unit, also
    # where it asked for symbolic zeros. A symbolic zero would leave the rule to
    # fill it in from the primal (`zeros_like(x)`, as equinox's loops start their
    # cotangent carries), in the primal's units where the other cotangents it
    # meets are per those units.
    seen: list = []

    @jax.custom_vjp
    def pair(x):
        return x, 2.0 * x

    def fwd(x):
        if symbolic_zeros:
            x = x.value
        return pair(x), None

    def bwd(_, cts):
        ct_value, ct_plain = cts
        seen.append(getattr(ct_value, "power", None))
        np.testing.assert_array_equal(ct_value.array, jnp.zeros(3))
        return (jnp.asarray(PerUnit(2.0 * ct_plain, -2)),)

    pair.defvjp(fwd, bwd, symbolic_zeros=symbolic_zeros)
    grad = jax.grad(lambda a: quax.quaxify(pair)(PerUnit(a, 2))[1].sum())(a0)
    np.testing.assert_array_equal(grad, 2.0 * jnp.ones(3))
    # (JAX may trace `bwd` more than once.)
    assert seen and set(seen) == {-2}
