"""Quantities against the same program on their SI numbers, through the conformance
kit `quax.testing`: values, jit, vmap, grad and jvp, the units kept (the output is a
`Quantity`), nothing materialised."""

import jax.numpy as jnp
import pytest
import quax
import quax.testing as qt
from jax import lax
from quax_units import Quantity, unit


m = Quantity(jnp.array([2.0, 0.5, 3.0]), "kg")
v = Quantity(jnp.array([3.0, -4.0, 1.5]), "km / s")
t = Quantity(jnp.array([[1.0, 2.0], [0.5, 4.0], [3.0, 0.25]]), "s")


def test_kinetic_energy():
    report = qt.assert_matches_dense(
        lambda m, v: 0.5 * m * v**2, m, v, out_types=Quantity
    )
    assert set(report.checks.values()) == {"passed"}
    out = quax.quaxify(lambda m, v: 0.5 * m * v**2)(m, v)
    assert out.units == unit("J").dimensions


def test_reductions_matmul_and_norms():
    def fn(v, t):
        distance = v @ t  # (3,) km/s times (3, 2) s
        return jnp.sqrt(jnp.sum(distance**2)), jnp.max(jnp.abs(v)), jnp.mean(t, axis=0)

    qt.assert_matches_dense(fn, v, t, out_types=Quantity)


def test_control_flow_keeps_units():
    def fn(v, t):
        y = lax.cond(jnp.sum(t) > t[1, 1], lambda a: -a, lambda a: 2 * a, t)
        return lax.fori_loop(0, 3, lambda i, c: c * 0.5, y) * v[0]

    qt.assert_matches_dense(fn, v, t, out_types=Quantity)


def test_dimensionless_output():
    # metres over kilometres is dimensionless: exp applies, the result stays a
    # (dimensionless) Quantity.
    a = Quantity(jnp.array([1.0, 2.0]), "m")
    b = Quantity(jnp.array([0.5, 4.0]), "km")
    report = qt.assert_matches_dense(
        lambda a, b: jnp.exp(a / b), a, b, out_types=Quantity
    )
    assert report.checks["grad"] == "passed"
    assert quax.quaxify(lambda a, b: jnp.exp(a / b))(a, b).units.is_dimensionless


def test_kit_catches_a_unit_refusal():
    # Adding metres to seconds fails inside the quaxified call: the kit says which
    # check and passes the UnitError on.
    with pytest.raises(AssertionError, match=r"\[eval\] .*UnitError"):
        qt.assert_matches_dense(jnp.add, Quantity(1.0, "m"), Quantity(1.0, "s"))
