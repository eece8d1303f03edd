"""The dimension algebra and the unit system (property tests with hypothesis)."""

from fractions import Fraction

import hypothesis.strategies as st
import pytest
from hypothesis import given
from quax_units import (
    Dimension,
    Dimensions,
    Unit,
    UnitError,
    dimensionless,
    kilograms,
    meters,
    seconds,
    unit,
)
from quax_units._units import conversion_factor


_bases = st.sampled_from(
    [meters, kilograms, seconds, Dimension("A"), Dimension("apple")]
)
_exponents = st.fractions(min_value=-4, max_value=4, max_denominator=3)
dims = st.dictionaries(_bases, _exponents, max_size=4).map(Dimensions)
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


@given(dims, dims, dims)
def test_product_is_associative_and_commutative(a, b, c):
    assert (a * b) * c == a * (b * c)
    assert a * b == b * a


@given(dims)
def test_identity_and_inverse(a):
    assert a * dimensionless == a
    assert a / a == dimensionless
    assert (a / a).is_dimensionless


@given(dims, dims, _exponents)
def test_power_distributes(a, b, p):
    assert (a * b) ** p == a**p * b**p
    if p != 0:
        assert (a**p) ** (1 / p) == a


@given(dims)
def test_equal_to_dict_and_hash_consistent(a):
    assert a == dict(a)
    assert Dimensions(dict(a)) == a
    assert hash(Dimensions(dict(a))) == hash(a)


@given(units)
def test_parse_round_trip(u):
    parsed = unit(str(u))
    assert parsed.dimensions == u.dimensions
    assert parsed.scale == pytest.approx(u.scale, rel=1e-12)


@given(units, units)
def test_unit_algebra_matches_dimensions_and_scales(u, v):
    assert (u * v).dimensions == u.dimensions * v.dimensions
    assert (u / v).scale == pytest.approx(u.scale / v.scale, rel=1e-12)


def test_dimension_identity_by_name():
    assert Dimension("m") == meters
    assert hash(Dimension("m")) == hash(meters)
    assert repr(meters) == "m"
    assert Dimensions({meters: 1, seconds: -2}) == {meters: 1, seconds: -2}
    assert Dimensions({meters: 0}) == dimensionless
    assert Dimensions({meters: Fraction(1, 2)})[meters] == Fraction(1, 2)
    with pytest.raises(TypeError, match="Dimension"):
        Dimensions({"m": 1})  # type: ignore[dict-item]


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
