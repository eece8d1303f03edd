"""The numbers behind `quax_units.constants` and the unit table's physical units:
the CODATA 2022 fundamental constants, and the IAU's astronomical constants (IAU
2012 Resolution B2, IAU 2015 Resolutions B2 and B3).

Plain Python floats, in SI-coherent units, so that `_units` can define units such
as `eV` and `Msun` from them without building a quantity."""

import math
from typing import NamedTuple


__all__ = ["CONSTANTS", "Constant"]


class Constant(NamedTuple):
    """A physical constant, as published.

    **Arguments:**

    - `name`: what it is called ("speed of light in vacuum").
    - `value`: its value in `unit`.
    - `unit`: its unit, SI-coherent ("m / s"), or `""` for a number.
    - `uncertainty`: its standard uncertainty in `unit` (0 for an exact value).
    - `reference`: where the value comes from.
    """

    name: str
    value: float
    unit: str
    uncertainty: float
    reference: str


_SI = "SI 2019 (exact by the definition of the SI units)"
_CODATA = "CODATA 2022 (NIST, physics.nist.gov/cuu/Constants)"
_EXACT = "CODATA 2022, exact: computed from the constants that define the SI"
_CONVENTION = "CGPM convention (exact)"
_IAU2012 = "IAU 2012 Resolution B2 (exact)"
_IAU2015_B2 = "IAU 2015 Resolution B2 (exact)"
_IAU2015_B3 = "IAU 2015 Resolution B3 (nominal value, exact)"
_IAU2015_MASS = (
    "IAU 2015 Resolution B3 nominal mass parameter divided by the CODATA 2022 G "
    "(its uncertainty is G's)"
)

# The constants that define the SI (exact).
_c = 299792458.0
_h = 6.62607015e-34
_e = 1.602176634e-19
_k = 1.380649e-23
_N_A = 6.02214076e23

_G, _dG = 6.67430e-11, 0.00015e-11
_au = 149597870700.0

CONSTANTS: dict[str, Constant] = {
    # The SI's defining constants.
    "c": Constant("speed of light in vacuum", _c, "m / s", 0.0, _SI),
    "h": Constant("Planck constant", _h, "J s", 0.0, _SI),
    "e": Constant("elementary charge", _e, "C", 0.0, _SI),
    "k_B": Constant("Boltzmann constant", _k, "J / K", 0.0, _SI),
    "N_A": Constant("Avogadro constant", _N_A, "1 / mol", 0.0, _SI),
    # Exact: products and quotients of the defining constants.
    "hbar": Constant("reduced Planck constant", _h / (2 * math.pi), "J s", 0.0, _EXACT),
    "R": Constant("molar gas constant", _N_A * _k, "J / (mol K)", 0.0, _EXACT),
    "F": Constant("Faraday constant", _N_A * _e, "C / mol", 0.0, _EXACT),
    "sigma": Constant(
        "Stefan-Boltzmann constant",
        2 * math.pi**5 * _k**4 / (15 * _h**3 * _c**2),
        "W / (m2 K4)",
        0.0,
        _EXACT,
    ),
    "Phi0": Constant("magnetic flux quantum", _h / (2 * _e), "Wb", 0.0, _EXACT),
    "K_J": Constant("Josephson constant", 2 * _e / _h, "Hz / V", 0.0, _EXACT),
    "R_K": Constant("von Klitzing constant", _h / _e**2, "ohm", 0.0, _EXACT),
    "G0": Constant("conductance quantum", 2 * _e**2 / _h, "S", 0.0, _EXACT),
    # Measured.
    "G": Constant(
        "Newtonian constant of gravitation", _G, "m3 / (kg s2)", _dG, _CODATA
    ),
    "m_e": Constant("electron mass", 9.1093837139e-31, "kg", 0.0000000028e-31, _CODATA),
    "m_p": Constant("proton mass", 1.67262192595e-27, "kg", 0.00000000052e-27, _CODATA),
    "m_n": Constant(
        "neutron mass", 1.67492750056e-27, "kg", 0.00000000085e-27, _CODATA
    ),
    "m_mu": Constant("muon mass", 1.883531627e-28, "kg", 0.000000042e-28, _CODATA),
    "u": Constant(
        "atomic mass constant", 1.66053906892e-27, "kg", 0.00000000052e-27, _CODATA
    ),
    "eps0": Constant(
        "vacuum electric permittivity",
        8.8541878188e-12,
        "F / m",
        0.0000000014e-12,
        _CODATA,
    ),
    "mu0": Constant(
        "vacuum magnetic permeability",
        1.25663706127e-6,
        "N / A2",
        0.00000000020e-6,
        _CODATA,
    ),
    "Z0": Constant(
        "characteristic impedance of vacuum",
        376.730313412,
        "ohm",
        0.000000059,
        _CODATA,
    ),
    "alpha": Constant(
        "fine-structure constant", 7.2973525643e-3, "", 0.0000000011e-3, _CODATA
    ),
    "a0": Constant("Bohr radius", 5.29177210544e-11, "m", 0.00000000082e-11, _CODATA),
    "Ryd": Constant("Rydberg constant", 10973731.568157, "1 / m", 0.000012, _CODATA),
    "E_h": Constant(
        "Hartree energy", 4.3597447222060e-18, "J", 0.0000000000048e-18, _CODATA
    ),
    "r_e": Constant(
        "classical electron radius", 2.8179403205e-15, "m", 0.0000000013e-15, _CODATA
    ),
    "sigma_T": Constant(
        "Thomson cross section", 6.6524587051e-29, "m2", 0.0000000062e-29, _CODATA
    ),
    "mu_B": Constant(
        "Bohr magneton", 9.2740100657e-24, "J / T", 0.0000000029e-24, _CODATA
    ),
    "mu_N": Constant(
        "nuclear magneton", 5.0507837393e-27, "J / T", 0.0000000016e-27, _CODATA
    ),
    # Conventional values.
    "g0": Constant(
        "standard acceleration of gravity", 9.80665, "m / s2", 0.0, _CONVENTION
    ),
    "atm": Constant("standard atmosphere", 101325.0, "Pa", 0.0, _CONVENTION),
    # Astronomy.
    "au": Constant("astronomical unit", _au, "m", 0.0, _IAU2012),
    "pc": Constant("parsec", _au * 648000 / math.pi, "m", 0.0, _IAU2015_B2),
    "kpc": Constant(
        "kiloparsec", 1e3 * (_au * 648000 / math.pi), "m", 0.0, _IAU2015_B2
    ),
    "R_sun": Constant("nominal solar radius", 6.957e8, "m", 0.0, _IAU2015_B3),
    "L_sun": Constant("nominal solar luminosity", 3.828e26, "W", 0.0, _IAU2015_B3),
    "R_earth": Constant(
        "nominal Earth equatorial radius", 6.3781e6, "m", 0.0, _IAU2015_B3
    ),
    "R_jup": Constant(
        "nominal Jupiter equatorial radius", 7.1492e7, "m", 0.0, _IAU2015_B3
    ),
}
"""Every constant of `quax_units.constants`, by symbol."""

# The IAU's nominal mass parameters (G M, exact), and the masses they give with the
# measured G (whose relative uncertainty the masses inherit), as astropy defines them.
for _body, _name, _gm in [
    ("sun", "solar", 1.3271244e20),
    ("earth", "Earth", 3.986004e14),
    ("jup", "Jupiter", 1.2668653e17),
]:
    CONSTANTS[f"GM_{_body}"] = Constant(
        f"nominal {_name} mass parameter", _gm, "m3 / s2", 0.0, _IAU2015_B3
    )
    CONSTANTS[f"M_{_body}"] = Constant(
        f"{_name} mass", _gm / _G, "kg", _gm / _G * (_dG / _G), _IAU2015_MASS
    )
