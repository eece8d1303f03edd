"""Units: the unit algebra and the parser (property tests with hypothesis), equality,
conversions, the constructor's checks, and unit arithmetic at the edges (zero
denominators, non-finite or inexact exponents, scales out of a float's range),
each raising an error that names the operation, the unit and the exponent rather
than a bare Python error."""

import re
from fractions import Fraction

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from quax_units import (
    Dimensions,
    Quantity,
    Unit,
    UnitError,
    kilograms,
    meters,
    seconds,
    unit,
    ustrip,
)
from quax_units._units import conversion_factor


# Drawing a unit parses and multiplies several; on a loaded shared machine that can
# exceed hypothesis's one-second budget for generating inputs, which says nothing
# about the code under test.
_settings = settings(suppress_health_check=[HealthCheck.too_slow])


_named = st.sampled_from(
    ["m", "km", "s", "h", "kg", "g", "N", "J", "eV", "deg", "Hz", "Pa", "au"]
)

units = st.lists(st.tuples(_named, st.integers(-3, 3)), min_size=1, max_size=4).map(
    lambda terms: _product([unit(name) ** e for name, e in terms])
)


def _product(us: list[Unit]) -> Unit:
    out = us[0]
    for u in us[1:]:
        out = out * u
    return out


@_settings
@given(units)
def test_parse_round_trip(u):
    parsed = unit(str(u))
    assert parsed.dimensions == u.dimensions
    assert parsed.scale == pytest.approx(u.scale, rel=1e-12)


@_settings
@given(units, units)
def test_unit_algebra_matches_dimensions_and_scales(u, v):
    assert (u * v).dimensions == u.dimensions * v.dimensions
    assert (u / v).scale == pytest.approx(u.scale / v.scale, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "scale", "exponents"),
    [
        ("km / s", 1e3, {meters: 1, seconds: -1}),
        ("kg m2 s-2", 1.0, {kilograms: 1, meters: 2, seconds: -2}),
        ("m**(1/2)", 1.0, {meters: Fraction(1, 2)}),
        ("(m / s)^2", 1.0, {meters: 2, seconds: -2}),
        ("kilometer / hour", 1 / 3.6, {meters: 1, seconds: -1}),
        ("N", 1.0, {kilograms: 1, meters: 1, seconds: -2}),
        ("kJ", 1e3, {kilograms: 1, meters: 2, seconds: -2}),
        ("W", 1.0, {kilograms: 1, meters: 2, seconds: -3}),
        ("hPa", 100.0, {kilograms: 1, meters: -1, seconds: -2}),
        ("Hz", 1.0, {seconds: -1}),
        ("min", 60.0, {seconds: 1}),
        ("h", 3600.0, {seconds: 1}),
        ("eV", 1.602176634e-19, {kilograms: 1, meters: 2, seconds: -2}),
        ("µm", 1e-6, {meters: 1}),
        ("mg", 1e-6, {kilograms: 1}),
        ("Gyr", 3.15576e16, {seconds: 1}),
        ("deg", 0.017453292519943295, {}),
        ("rad", 1.0, {}),
        ("", 1.0, {}),
        ("1000 m", 1e3, {meters: 1}),
    ],
)
def test_parse(text, scale, exponents):
    u = unit(text)
    assert u.scale == pytest.approx(scale, rel=1e-12)
    assert u.dimensions == exponents


def test_unit_equality_and_repr():
    assert unit("J") == unit("N m") == "kg m2 / s2"
    assert unit("km") != unit("m")
    assert str(unit("km / s")) == "km / s"
    assert str(unit("kg m2 s-2")) == "kg m2 / s2"
    assert str(unit("1 / (m s)")) == "1 / (m s)"
    assert repr(unit("N")) == "Unit('N')"
    assert unit(meters) == unit("m")
    assert unit({meters: 1, seconds: -1}) == unit("m / s")


@pytest.mark.parametrize("bad", ["furlong", "kmin", "m /", "m ** x", "(m", "m)", "m $"])
def test_parse_errors(bad):
    with pytest.raises(ValueError, match="unit"):
        unit(bad)


def test_unit_type_error():
    with pytest.raises(TypeError, match="Expected a unit"):
        unit(3.0)  # type: ignore[arg-type]


def test_conversion_factor():
    assert conversion_factor(unit("km"), unit("m")) == 1e3
    with pytest.raises(UnitError, match=r"km \(m\) to s \(s\)"):
        conversion_factor(unit("km"), unit("s"))


@pytest.mark.parametrize("text", ["m**(1/0)", "m^(1/0)", "m1/0", "kg m**(-3/0)"])
def test_a_zero_denominator_names_the_unit_and_the_exponent(text):
    # A bare `ZeroDivisionError: Fraction(1, 0)` before.
    with pytest.raises(
        ValueError, match=rf"Cannot parse unit '{re.escape(text)}'.*/0 divides by zero"
    ):
        unit(text)


def test_a_zero_denominator_through_quantity_and_ustrip():
    with pytest.raises(ValueError, match=r"`unit` 'm\*\*\(1/0\)'.*divides by zero"):
        Quantity(1.0, "m**(1/0)")
    with pytest.raises(ValueError, match=r"'m\*\*\(1/0\)'.*divides by zero"):
        ustrip("m**(1/0)", Quantity(1.0, "m"))


@pytest.mark.parametrize(
    "text, match",
    [
        ("1e400 m", "factor 1e400 is out of a float's range"),
        ("0 m", "factor 0 is zero"),
    ],
)
def test_a_factor_that_is_no_scale(text, match):
    # `1e400 m` had an infinite scale (every value inf), and converting to `0 m`
    # divided by zero.
    with pytest.raises(ValueError, match=rf"Cannot parse unit '{text}': its {match}"):
        unit(text)
    with pytest.raises(ValueError, match=match):
        Quantity(1.0, "m").to(text)


@pytest.mark.parametrize("power", [float("inf"), float("nan"), -float("inf")])
def test_a_unit_to_a_non_finite_power(power):
    # A bare `OverflowError` / "cannot convert NaN to integer ratio" before.
    with pytest.raises(
        ValueError, match=rf"Cannot raise the unit km to the power -?{power}: .*finite"
    ):
        _ = unit("km") ** power


def test_a_unit_to_a_power_whose_scale_overflows():
    with pytest.raises(
        ValueError,
        match=r"Cannot raise the unit km to the power 10{26}: its scale, 1000\.0 "
        r"SI-coherent units, to that power is out of a float's range\. Use the "
        r"SI-coherent unit m",
    ):
        unit("km**100000000000000000000000000")
    # The SI-coherent unit has scale 1 to every power.
    assert unit("m") ** 10**26 == unit("m**100000000000000000000000000")


def test_float_exponents_are_simple_fractions_or_refused():
    assert unit("m") ** 0.5 == unit("m**(1/2)")
    assert (unit("m") ** 0.3).dimensions == {meters: Fraction(3, 10)}
    with pytest.raises(
        ValueError,
        match=r"unit m to the power 0\.1234567: exponents of units are exact "
        r"fractions.*nearest is 10/81.*Pass a `fractions\.Fraction`",
    ):
        _ = unit("m") ** 0.1234567
    assert unit("m") ** Fraction(1234567, 10**7) == unit("m**(1234567/10000000)")


def test_unit_constructor_names_the_field():
    d = Dimensions({meters: 1})
    for kwargs, match in [
        ({"scale": 0.0}, "finite `scale` > 0.*scale=0.0"),
        ({"scale": float("nan")}, "finite `scale` > 0.*scale=nan"),
        ({"scale": -2.0}, "finite `scale` > 0.*scale=-2.0"),
        ({"dimensions": {meters: 1}}, "`dimensions` of type Dimensions"),
        ({"offset": float("inf")}, "finite `offset`.*offset=inf"),
    ]:
        with pytest.raises(ValueError, match=match):
            Unit(**{"scale": 1.0, "dimensions": d, "terms": (), **kwargs})


def test_dividing_a_unit_by_something_else_is_a_type_error():
    # An `AttributeError` ('str' object has no attribute '_no_offset') before.
    with pytest.raises(TypeError, match="unsupported operand"):
        unit("m") / "s"  # type: ignore[operator]
