"""Every named unit quax-units defines (each symbol and each of its other names)
and every SI prefix: its scale in SI-coherent units, its offset and its dimensions
against pint 0.25 and astropy, to a relative 1e-12. The references are read from
those libraries by name, never from quax-units.

Where a unit's definition legitimately differs from one library, that library is
left out for it, with the convention and the reason in `_ONLY`; nothing is compared
with a looser tolerance."""

import math
from typing import cast

import astropy.units as apu
import pint
import pytest
from quax_units import unit
from quax_units._units import _ALIASES, _PREFIXES, _UNITS  # the registry itself


_PINT = pint.UnitRegistry()
_RTOL = 1e-12

# Symbol -> (pint's name, astropy's name), `None` where the library has no such
# unit (pint has no solar or planetary units; astropy no calorie outside its
# imperial module, which is searched too, and no atmosphere or temperature scales).
_REFERENCES: dict[str, tuple[str | None, str | None]] = {
    "m": ("meter", "m"),
    "g": ("gram", "g"),
    "s": ("second", "s"),
    "A": ("ampere", "A"),
    "K": ("kelvin", "K"),
    "mol": ("mole", "mol"),
    "cd": ("candela", "cd"),
    "rad": ("radian", "rad"),
    "sr": ("steradian", "sr"),
    "Hz": ("hertz", "Hz"),
    "N": ("newton", "N"),
    "Pa": ("pascal", "Pa"),
    "J": ("joule", "J"),
    "W": ("watt", "W"),
    "C": ("coulomb", "C"),
    "V": ("volt", "V"),
    "F": ("farad", "F"),
    "ohm": ("ohm", "Ohm"),
    "S": ("siemens", "S"),
    "Wb": ("weber", "Wb"),
    "T": ("tesla", "T"),
    "H": ("henry", "H"),
    "lm": ("lumen", "lm"),
    "lx": ("lux", "lx"),
    "Bq": ("becquerel", "Bq"),
    "Gy": ("gray", "Gy"),
    "Sv": ("sievert", "Sv"),
    "kat": ("katal", "kat"),
    "L": ("liter", "l"),
    "eV": ("electron_volt", "eV"),
    "bar": ("bar", "bar"),
    "cal": ("calorie", "cal"),
    "erg": ("erg", "erg"),
    "dyn": ("dyne", "dyn"),
    "pc": ("parsec", "pc"),
    "yr": ("julian_year", "yr"),
    "Msun": (None, "solMass"),
    "Rsun": (None, "solRad"),
    "Lsun": (None, "solLum"),
    "Mearth": (None, "earthMass"),
    "Mjup": (None, "jupiterMass"),
    "min": ("minute", "min"),
    "h": ("hour", "h"),
    "d": ("day", "d"),
    "deg": ("degree", "deg"),
    "arcmin": ("arcminute", "arcmin"),
    "arcsec": ("arcsecond", "arcsec"),
    "au": ("astronomical_unit", "au"),
    "lyr": ("light_year", "lyr"),
    "Angstrom": ("angstrom", "Angstrom"),
    "atm": ("standard_atmosphere", None),
    "inch": ("inch", "inch"),
    "ft": ("foot", "ft"),
    "mi": ("mile", "mi"),
    "lb": ("pound", "lb"),
    "percent": ("percent", "percent"),
    "degC": ("degree_Celsius", None),
    "degF": ("degree_Fahrenheit", None),
    "delta_degC": ("delta_degree_Celsius", None),
    "delta_degF": ("delta_degree_Fahrenheit", None),
    "degR": ("degree_Rankine", None),
}

# Units whose definition differs from one library's by more than rounding, and so
# are compared with the other alone: the convention quax-units follows, and why.
_ONLY = {
    # IAU 2015 Resolution B2 defines the parsec exactly as 648000 / pi au, which
    # astropy and quax-units follow; pint 0.25 defines it as au / tan(1 arcsec),
    # 7.8e-12 relatively smaller (tan x > x), a definition the IAU no longer uses.
    "pc": "astropy",
}

# pint's names of the base dimensions, by quax-units' base unit.
_PINT_DIMENSIONS = {
    "m": "[length]",
    "kg": "[mass]",
    "s": "[time]",
    "A": "[current]",
    "K": "[temperature]",
    "mol": "[substance]",
    "cd": "[luminosity]",
}


def _astropy_unit(name: str) -> apu.UnitBase:
    with apu.imperial.enable():
        return apu.Unit(name)


def _ours(name: str) -> tuple[float, float, dict[str, float]]:
    """(scale, offset, dimensions by base unit) of quax-units' unit `name`."""
    u = unit(name)
    return u.scale, u.offset, {d.name: float(e) for d, e in u.dimensions.items()}


def _names() -> list[tuple[str, str]]:
    """(symbol, name) of every name quax-units knows a unit by."""
    return [(s, s) for s in _UNITS] + [(s, name) for name, s in _ALIASES.items()]


def test_every_unit_has_a_reference():
    assert set(_REFERENCES) == set(_UNITS)
    assert set(_ALIASES.values()) <= set(_UNITS)


@pytest.mark.parametrize(("symbol", "name"), _names())
def test_scale_offset_and_dimensions_match_pint_and_astropy(symbol, name):
    scale, offset, dimensions = _ours(name)
    assert (scale, offset, dimensions) == _ours(symbol)
    pint_name, astropy_name = _REFERENCES[symbol]
    only = _ONLY.get(symbol)
    compared = 0
    if pint_name is not None and only in (None, "pint"):
        zero = _PINT.Quantity(0.0, pint_name).to_base_units().magnitude
        # An offset unit's step is pint's difference unit (`delta_...`).
        step_name = f"delta_{pint_name}" if zero else pint_name
        step = _PINT.Quantity(1.0, step_name).to_base_units()
        assert math.isclose(scale, step.magnitude, rel_tol=_RTOL), (name, step)
        assert math.isclose(offset, zero, rel_tol=_RTOL), (name, offset, zero)
        got = {_PINT_DIMENSIONS[d]: e for d, e in dimensions.items()}
        assert got == {d: cast(float, e) for d, e in step.dimensionality.items()}
        compared += 1
    if astropy_name is not None and only in (None, "astropy"):
        reference = _astropy_unit(astropy_name).decompose()
        want_scale = cast(float, reference.scale)
        assert math.isclose(scale, want_scale, rel_tol=_RTOL), (name, want_scale)
        assert offset == 0.0
        # astropy keeps angles as units of their own; quax-units, as SI,
        # counts them dimensionless.
        want = {
            str(base): float(power)
            for base, power in zip(reference.bases, reference.powers, strict=True)
            if str(base) not in ("rad", "sr")
        }
        assert dimensions == want, (name, dimensions, want)
        compared += 1
    assert compared >= 1


@pytest.mark.parametrize("prefix", list(_PREFIXES))
def test_prefixes_match_pint_and_astropy(prefix):
    long, _ = _PREFIXES[prefix]
    scale = unit(f"{prefix}m").scale
    assert scale == unit(f"{long}meter").scale
    want = _PINT.Quantity(1.0, f"{long}meter").to("meter").magnitude
    assert math.isclose(scale, want, rel_tol=_RTOL), (prefix, scale, want)
    want = cast(float, apu.Unit(f"{prefix}m").si.scale)
    assert math.isclose(scale, want, rel_tol=_RTOL), (prefix, scale, want)


def test_the_light_year_is_a_julian_year_of_light():
    """The planted bug this file was written for: a light year of 365.2425 days
    (the Gregorian year) is 6.8e-5 relatively short; pint, astropy and the IAU
    take the Julian year."""
    julian = 299792458.0 * 365.25 * 86400.0
    assert unit("lyr").scale == julian == unit("ly").scale
    assert not math.isclose(
        unit("lyr").scale, 299792458.0 * 365.2425 * 86400.0, rel_tol=_RTOL
    )
