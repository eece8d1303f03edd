"""The dimension algebra (property tests with hypothesis), dimensions by name, and
the checks of `Dimension`'s and `Dimensions`' inputs."""

from fractions import Fraction

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from quax_units import (
    Dimension,
    Dimensions,
    dimensionless,
    kilograms,
    meters,
    seconds,
)


_bases = st.sampled_from(
    [meters, kilograms, seconds, Dimension("A"), Dimension("apple")]
)
_exponents = st.fractions(min_value=-4, max_value=4, max_denominator=3)
dims = st.dictionaries(_bases, _exponents, max_size=4).map(Dimensions)
# Three dictionaries of fractions per example: on a loaded shared machine drawing
# them can exceed hypothesis's one-second budget for generating inputs (it did,
# with 4 examples in 1.01 s), which says nothing about the code under test.
_settings = settings(suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(dims, dims, dims)
def test_product_is_associative_and_commutative(a, b, c):
    assert (a * b) * c == a * (b * c)
    assert a * b == b * a


@_settings
@given(dims)
def test_identity_and_inverse(a):
    assert a * dimensionless == a
    assert a / a == dimensionless
    assert (a / a).is_dimensionless


@_settings
@given(dims, dims, _exponents)
def test_power_distributes(a, b, p):
    assert (a * b) ** p == a**p * b**p
    if p != 0:
        assert (a**p) ** (1 / p) == a


@_settings
@given(dims)
def test_equal_to_dict_and_hash_consistent(a):
    assert a == dict(a)
    assert Dimensions(dict(a)) == a
    assert hash(Dimensions(dict(a))) == hash(a)


def test_dimension_identity_by_name():
    assert Dimension("m") == meters
    assert hash(Dimension("m")) == hash(meters)
    assert repr(meters) == "m"
    assert Dimensions({meters: 1, seconds: -2}) == {meters: 1, seconds: -2}
    assert Dimensions({meters: 0}) == dimensionless
    assert Dimensions({meters: Fraction(1, 2)})[meters] == Fraction(1, 2)
    with pytest.raises(TypeError, match="Dimension"):
        Dimensions({"m": 1})  # type: ignore[dict-item]


def test_dimension_and_dimensions_check_their_inputs():
    for name in ["", "  ", 3]:
        with pytest.raises(ValueError, match=r"Dimension needs a `name`"):
            Dimension(name)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"dimension m the exponent nan: .*finite"):
        Dimensions({meters: float("nan")})
    with pytest.raises(ValueError, match="dimension m the exponent inf"):
        Dimensions({meters: float("inf")})
    with pytest.raises(ValueError, match=r"dimension m the exponent 'a': .*a number"):
        Dimensions({meters: "a"})  # pyright: ignore[reportArgumentType]  (the error tested)
    with pytest.raises(ValueError, match="dimensions m to the power nan"):
        _ = Dimensions({meters: 1}) ** float("nan")
    # A float exponent is the simple fraction it stands for, not the float's own
    # 5404319552844595/18014398509481984.
    assert Dimensions({meters: 0.3})[meters] == Fraction(3, 10)
