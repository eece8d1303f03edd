"""Conversion to and from pint and astropy."""

import astropy.units as apu
import jax.numpy as jnp
import numpy as np
import pint
import pytest
from quax_units import (
    Dimension,
    Quantity,
    UnitError,
    Unitful,
    from_astropy,
    from_pint,
    to_astropy,
    to_pint,
    unit,
)


@pytest.mark.parametrize("u", ["km / s", "N", "kg m2 / s2", "deg", "eV", "m"])
def test_pint_round_trip(u):
    q = Quantity(jnp.array([1.5, 2.0]), u)
    p = to_pint(q)
    assert isinstance(p, pint.Quantity)
    np.testing.assert_allclose(p.to_base_units().magnitude, q.array, rtol=1e-6)
    back = from_pint(p)
    assert back.units == q.units and back.unit == q.unit
    np.testing.assert_allclose(back.array, q.array, rtol=1e-6)


@pytest.mark.parametrize("u", ["km / s", "N", "kg m2 / s2", "deg", "eV", "m"])
def test_astropy_round_trip(u):
    q = Quantity(jnp.array([1.5, 2.0]), u)
    a = to_astropy(q)
    assert isinstance(a, apu.Quantity)
    np.testing.assert_allclose(a.si.value, q.array, rtol=1e-6)
    back = from_astropy(a)
    assert back.units == q.units and back.unit == q.unit
    np.testing.assert_allclose(back.array, q.array, rtol=1e-6)


def test_from_foreign_units():
    q = from_pint(pint.get_application_registry().Quantity(3.0, "kilometer / hour"))
    assert q.unit == unit("km / h")
    assert float(q.value) == pytest.approx(3.0)
    a = from_astropy(3.0 * apu.lyr)
    assert a.units == unit("m").dimensions


def test_fallback_to_si_and_errors():
    q = Quantity(2.0, "inch")
    assert to_astropy(q).unit == apu.m
    with pytest.raises(UnitError, match="non-SI dimension"):
        to_astropy(Unitful(jnp.ones(2), Dimension("apple")))
    with pytest.raises(UnitError, match="astropy's base unit"):
        from_astropy(3.0 * apu.bit)


@pytest.mark.parametrize("u", ["degC", "degF"])
def test_temperature_scales_round_trip(u):
    # Offset units go to pint's and astropy's temperature scales, not to kelvin
    # differences: 20 degC is 293.15 K both ways.
    q = Quantity(jnp.array([20.0, 100.0]), u)
    a = to_astropy(q)
    kelvin = a.to(apu.K, equivalencies=apu.temperature()).value
    np.testing.assert_allclose(kelvin, q.array, rtol=1e-6)
    p = to_pint(q)
    np.testing.assert_allclose(p.to("kelvin").magnitude, q.array, rtol=1e-6)
    for back in (from_astropy(a), from_pint(p)):
        assert back.unit == q.unit
        np.testing.assert_allclose(back.array, q.array, rtol=1e-6)
