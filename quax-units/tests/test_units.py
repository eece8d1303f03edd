"""Units: the constructor's checks, the parser's errors and unit arithmetic at the
edges (zero denominators, non-finite or inexact exponents, scales out of a float's
range), each raising an error that names the operation, the unit and the
exponent rather than a bare Python error."""

import re
from fractions import Fraction

import pytest
from quax_units import Dimension, Dimensions, Quantity, Unit, meters, unit, ustrip


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
        unit("km") ** power


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
        unit("m") ** 0.1234567
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


def test_dimension_and_dimensions_check_their_inputs():
    for name in ["", "  ", 3]:
        with pytest.raises(ValueError, match=r"Dimension needs a `name`"):
            Dimension(name)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"dimension m the exponent nan: .*finite"):
        Dimensions({meters: float("nan")})
    with pytest.raises(ValueError, match="dimension m the exponent inf"):
        Dimensions({meters: float("inf")})
    with pytest.raises(ValueError, match=r"dimension m the exponent 'a': .*a number"):
        Dimensions({meters: "a"})
    with pytest.raises(ValueError, match="dimensions m to the power nan"):
        Dimensions({meters: 1}) ** float("nan")
    # A float exponent is the simple fraction it stands for, not the float's own
    # 5404319552844595/18014398509481984.
    assert Dimensions({meters: 0.3})[meters] == Fraction(3, 10)
