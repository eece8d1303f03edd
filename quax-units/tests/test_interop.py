"""Conversion to and from pint and astropy."""

import astropy.units as apu
import jax
import jax.numpy as jnp
import numpy as np
import pint
import pytest
from astropy.coordinates import Angle, Distance
from astropy.time import Time, TimeDelta
from astropy.utils.masked import Masked
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


# Inputs that were misread or crashed: each is refused, naming the way out.


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: 20 * apu.ABmag,
            UnitError,
            r"mag\(AB\) is a logarithmic .*q\.physical",
        ),
        (lambda: 20 * apu.STmag, UnitError, r"logarithmic"),
        (lambda: apu.Magnitude(3.0), UnitError, r"mag is a logarithmic"),
        (lambda: 20 * apu.mag, UnitError, r"logarithmic .*u\.logarithmic\(\)"),
        (lambda: 1.0 * apu.dex, UnitError, r"dex is a logarithmic"),
        (lambda: 3.0 * apu.dB, UnitError, r"dB is a logarithmic"),
        (lambda: apu.Dex(4.4, apu.dex(apu.cm / apu.s**2)), UnitError, r"logarithmic"),
        (lambda: apu.Decibel(3.0, apu.dB(apu.mW)), UnitError, r"dB\(mW\)"),
        (
            lambda: apu.Quantity((1.0, 2.0), apu.StructuredUnit("m,s")),
            UnitError,
            r"structured unit .*from_astropy\(q\['f0'\]\)",
        ),
        (
            lambda: Masked([1.0, 2.0] * apu.m, mask=[False, True]),
            ValueError,
            r"masked quantity.*q\.filled\(fill\)",
        ),
        (lambda: Time("2020-01-01"), TypeError, r"Time` is an instant.*\.to\(u\.s\)"),
        (lambda: TimeDelta(3.0, format="jd"), TypeError, r"TimeDelta.*q\.to\(u\.s\)"),
        (lambda: 3.0, TypeError, r"expected an `astropy.units.Quantity`, got float"),
        (lambda: apu.m, TypeError, r"got IrreducibleUnit.*`3\.0 \* u\.m`"),
        (lambda: 1e300 * apu.m, ValueError, r"beyond float32's range.*x64"),
        (lambda: 1e-50 * apu.m, ValueError, r"below float32's smallest normal"),
        (lambda: 1e-30 * apu.fm, ValueError, r"as small as 1e-45"),
    ],
)
def test_from_astropy_refuses(make, error, match):
    with pytest.raises(error, match=match):
        from_astropy(make())


def test_from_astropy_accepted_inputs_read_right():
    # A scaled unit, a percentage, integers, complex numbers, a masked quantity with
    # nothing masked, and astropy's quantity subclasses: against the SI numbers.
    cases = [
        (2.0 * apu.Unit(100 * apu.m), 200.0, unit("m").dimensions),
        (50.0 * apu.percent, 0.5, unit("").dimensions),
        (
            # astropy's annotation says a float dtype; it keeps an integer one.
            apu.Quantity(np.array([3, 4], np.int16), apu.km, dtype=np.int16),  # pyright: ignore[reportArgumentType]
            [3e3, 4e3],
            None,
        ),
        ((1 + 2j) * apu.m, 1 + 2j, None),
        (Masked([1.0, 2.0] * apu.m, mask=[False, False]), [1.0, 2.0], None),
        (Angle(30, apu.deg), np.pi / 6, unit("rad").dimensions),
        (Distance(2, apu.kpc), 2 * 3.0856775814913673e19, None),
        (np.float16(3.0) * apu.km, 3e3, None),
    ]
    for a, si, dims in cases:
        q = from_astropy(a)
        if dims is not None:
            assert q.units == dims, a
        np.testing.assert_allclose(np.asarray(q.array), si, rtol=1e-6, err_msg=str(a))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda r: r.Quantity(3.0, "dB"), UnitError, r"decibel is a logarithmic"),
        (lambda r: r.Quantity(3.0, "dBm"), UnitError, r"q\.to\('mW'\)"),
        (lambda r: r.Quantity(3.0, "octave"), UnitError, r"octave"),
        (lambda r: r.Quantity(3.0, "neper"), UnitError, r"neper"),
        (
            lambda r: r.Quantity(
                np.ma.masked_array([1.0, 2.0], mask=[False, True]), "m"
            ),
            ValueError,
            r"masked array.*filled\(fill\)",
        ),
        (lambda r: 3.0, TypeError, r"expected a `pint.Quantity`, got float"),
        (lambda r: r.Quantity(1e300, "m"), ValueError, r"beyond float32's range"),
    ],
)
def test_from_pint_refuses(make, error, match):
    with pytest.raises(error, match=match):
        from_pint(make(pint.get_application_registry()))


def test_from_pint_masked_without_mask_and_scalars():
    r = pint.get_application_registry()
    q = from_pint(r.Quantity(np.ma.masked_array([1.0, 2.0], mask=[False, False]), "km"))
    np.testing.assert_allclose(np.asarray(q.array), [1e3, 2e3], rtol=1e-6)
    # A Python number stays weakly typed, as `jnp.asarray(3.0)` is.
    assert jax.typeof(from_pint(r.Quantity(3.0, "m")).array).weak_type
