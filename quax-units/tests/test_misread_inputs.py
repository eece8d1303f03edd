"""Unit strings and numbers that were accepted and read as something the writer did
not mean.

`"V / Hz^1/2"` (a noise density, volts per root hertz) parsed as `(V / Hz) / 2`, a
half of a volt second; `"hbar"` parsed as the hectobar, a pressure, where pint
reads the reduced Planck constant. Both are now refused with the spelling that says
what is meant. The references are the scales and dimensions written out: literals."""

from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_units import (
    Dimensions,
    Quantity,
    amperes,
    kilograms,
    meters,
    seconds,
    unit,
    ustrip,
)


@pytest.mark.parametrize(
    "text, power, divisor",
    [
        ("Hz^1/2", "Hz^(1/2)", "(Hz^1) / 2"),
        ("V / Hz^1/2", "Hz^(1/2)", "(Hz^1) / 2"),
        ("m**-1/2", "m^(-1/2)", "(m^-1) / 2"),
        ("s^2/3", "s^(2/3)", "(s^2) / 3"),
        ("(m / s)**2/3", "(m / s)^(2/3)", "((m / s)^2) / 3"),
    ],
)
def test_an_exponent_followed_by_a_division_by_a_number_is_refused(
    text, power, divisor
):
    with pytest.raises(ValueError, match=r"reads both as the power") as info:
        unit(text)
    assert f"'{power}'" in str(info.value)
    assert f"'{divisor}'" in str(info.value)
    with pytest.raises(ValueError, match=r"reads both as the power"):
        Quantity(1.0, text)


def test_the_spellings_the_refusal_names_read_as_written():
    volt = Dimensions({kilograms: 1, meters: 2, seconds: -3, amperes: -1})
    root_hertz = unit("V / Hz^(1/2)")
    assert root_hertz.scale == 1.0
    assert root_hertz.dimensions == volt * Dimensions({seconds: Fraction(1, 2)})
    # The inline exponent `Hz1/2` was already the power 1/2.
    assert unit("V / Hz1/2") == root_hertz
    half = unit("(Hz^1) / 2")
    assert half.scale == 0.5
    assert half.dimensions == Dimensions({seconds: -1})


@pytest.mark.parametrize(
    "text", ["m^2 / s", "m/s^2", "kg m^2 s^-2", "m / 10", "s^-1 m"]
)
def test_exponents_and_divisions_that_read_one_way_still_parse(text):
    expected = {
        "m^2 / s": (1.0, {meters: 2, seconds: -1}),
        "m/s^2": (1.0, {meters: 1, seconds: -2}),
        "kg m^2 s^-2": (1.0, {kilograms: 1, meters: 2, seconds: -2}),
        "m / 10": (0.1, {meters: 1}),
        "s^-1 m": (1.0, {meters: 1, seconds: -1}),
    }[text]
    u = unit(text)
    assert u.scale == pytest.approx(expected[0], rel=1e-15)
    assert u.dimensions == Dimensions(expected[1])


def test_hbar_is_refused_as_ambiguous():
    with pytest.raises(ValueError, match=r"Ambiguous unit 'hbar'.*constants\.hbar"):
        unit("hbar")
    with pytest.raises(ValueError, match=r"Ambiguous unit 'hbar'"):
        Quantity(1.0, "hbar / s")
    # The prefixed bars that are not ambiguous keep their SI reading.
    assert unit("kbar").scale == 1e8
    assert unit("mbar").scale == 100.0


# Numbers that leave their dtype's normal range once held in SI-coherent units. A
# `Quantity` holds SI numbers: `3 ns` in float16 was held as 0 s and `100 ns` as the
# subnormal 1.19e-7 s, so that `2 * q` read back 0 ns and 238.9 ns. Overflow was
# already refused; underflow is now refused too.


@pytest.mark.parametrize(
    "numbers, u",
    [
        (np.array([100.0, 3.0], np.float16), "ns"),
        (jnp.array([100.0, 3.0], jnp.float16), "ns"),  # checked on the device
        (jnp.array([5.0], jnp.float16), "ug"),
        (np.array([1e-20], np.float32), "ym"),
    ],
)
def test_numbers_below_the_normal_range_in_si_are_refused(numbers, u):
    with pytest.raises(ValueError, match=rf"nonzero numbers in {u} below .* wider"):
        Quantity(numbers, u)


def test_numbers_that_stay_normal_in_si_are_kept():
    q = Quantity(np.array([100.0, 0.0], np.float32), "ns")
    doubled = quax.quaxify(lambda q: 2 * q)(q)
    np.testing.assert_allclose(ustrip("ns", doubled), [200.0, 0.0], rtol=1e-6)
    # float16 in a unit close to SI, zeros, and integers in small units stay.
    half = Quantity(jnp.array([100.0, 3.0, 0.0], jnp.float16), "mm")
    np.testing.assert_allclose(
        np.asarray(half.array, np.float32), [0.1, 0.003, 0.0], rtol=1e-3
    )
    assert Quantity(jnp.array([1, 7], jnp.int32), "ns").array.dtype == jnp.float32
    assert np.isnan(Quantity(np.array([np.nan], np.float16), "ns").array).all()
