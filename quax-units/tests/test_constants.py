"""`quax_units.constants`: every value, unit and uncertainty against
`scipy.constants.physical_constants` (CODATA 2022 from SciPy 1.15) and the
astronomical ones against `astropy.constants` (IAU 2015) and literals; the
quantities' dtypes, and the constants inside quaxified programs."""

import math

import astropy.constants as apc
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
import scipy.constants as sc
from quax_units import Quantity, constants, unit, ustrip


# Symbol -> the name SciPy's CODATA table gives it.
_SCIPY = {
    "c": "speed of light in vacuum",
    "h": "Planck constant",
    "hbar": "reduced Planck constant",
    "e": "elementary charge",
    "k_B": "Boltzmann constant",
    "N_A": "Avogadro constant",
    "R": "molar gas constant",
    "F": "Faraday constant",
    "sigma": "Stefan-Boltzmann constant",
    "Phi0": "mag. flux quantum",
    "K_J": "Josephson constant",
    "R_K": "von Klitzing constant",
    "G0": "conductance quantum",
    "G": "Newtonian constant of gravitation",
    "m_e": "electron mass",
    "m_p": "proton mass",
    "m_n": "neutron mass",
    "m_mu": "muon mass",
    "u": "atomic mass constant",
    "eps0": "vacuum electric permittivity",
    "mu0": "vacuum mag. permeability",
    "Z0": "characteristic impedance of vacuum",
    "alpha": "fine-structure constant",
    "a0": "Bohr radius",
    "Ryd": "Rydberg constant",
    "E_h": "Hartree energy",
    "r_e": "classical electron radius",
    "sigma_T": "Thomson cross section",
    "mu_B": "Bohr magneton",
    "mu_N": "nuclear magneton",
    "g0": "standard acceleration of gravity",
    "atm": "standard atmosphere",
}
# Symbol -> astropy's constant (IAU 2015, with CODATA 2022's G for the masses),
# read by name: astropy.constants sets them at import, from its configured
# versions, where pyright cannot see them.
_ASTROPY = {
    symbol: getattr(apc, symbol)
    for symbol in (
        "au",
        "pc",
        "kpc",
        "GM_sun",
        "M_sun",
        "R_sun",
        "L_sun",
        "GM_earth",
        "M_earth",
        "R_earth",
        "GM_jup",
        "M_jup",
        "R_jup",
    )
}


def test_every_constant_has_a_reference():
    assert set(constants.table) == set(_SCIPY) | set(_ASTROPY)


def test_scipy_is_codata_2022():
    # SciPy 1.15 moved from CODATA 2018 to 2022; the comparisons below need 2022
    # (the 2018 electron mass was 9.1093837015e-31 kg).
    assert sc.physical_constants["electron mass"][0] == 9.1093837139e-31, (
        "scipy.constants is not CODATA 2022: install SciPy 1.15 or later"
    )


@pytest.mark.parametrize("symbol", sorted(_SCIPY))
def test_codata_value_unit_and_uncertainty_match_scipy(symbol):
    value, scipy_unit, uncertainty = sc.physical_constants[_SCIPY[symbol]]
    ours = constants.table[symbol]
    # Measured values are the same decimal literals; exact derived ones (hbar, R,
    # sigma, ...) are computed from the SI's defining constants, here and in SciPy,
    # so they may differ in the last bit.
    assert ours.value == pytest.approx(value, rel=4e-16, abs=0.0)
    assert ours.uncertainty == pytest.approx(uncertainty, rel=1e-9, abs=0.0)
    expected = unit(scipy_unit)
    assert expected.scale == 1.0
    q = getattr(constants, symbol)
    assert q.units == expected.dimensions, (symbol, q.unit, scipy_unit)
    assert unit(ours.unit).scale == 1.0


@pytest.mark.parametrize("symbol", sorted(_ASTROPY))
def test_astronomical_constants_match_astropy(symbol):
    reference = _ASTROPY[symbol].si
    ours = constants.table[symbol]
    assert ours.value == pytest.approx(reference.value, rel=4e-16, abs=0.0)
    assert ours.uncertainty == pytest.approx(reference.uncertainty, rel=1e-12)
    assert unit(ours.unit) == unit(reference.unit.to_string())
    assert "IAU" in ours.reference


def test_astronomical_literals():
    # IAU 2012 B2: the au in metres; IAU 2015 B2: pc = au * 648000 / pi; IAU 2015 B3:
    # the nominal solar mass parameter, and the mass it gives with G = 6.67430e-11.
    table = constants.table
    assert table["au"].value == 149597870700.0
    assert table["pc"].value == 3.085677581491367e16 == sc.parsec
    assert table["kpc"].value == 1e3 * table["pc"].value == unit("kpc").scale
    assert table["GM_sun"].value == 1.3271244e20
    assert table["M_sun"].value == pytest.approx(1.988409870698051e30, rel=1e-15)
    assert unit("Msun").scale == table["M_sun"].value
    assert unit("pc").scale == table["pc"].value
    assert unit("yr").scale == sc.Julian_year == 31557600.0
    assert unit("Myr").scale == 31557600.0e6
    assert unit("eV").scale == sc.electron_volt


def test_exact_constants_are_exact():
    table = constants.table
    for symbol, value in [
        ("c", 299792458.0),
        ("h", 6.62607015e-34),
        ("e", 1.602176634e-19),
        ("k_B", 1.380649e-23),
        ("N_A", 6.02214076e23),
    ]:
        assert table[symbol].value == value and table[symbol].uncertainty == 0.0
    assert table["hbar"].value == pytest.approx(1.054571817e-34, rel=1e-9)
    assert table["sigma"].value == pytest.approx(5.670374419e-8, rel=1e-9)
    assert table["R"].value == pytest.approx(8.314462618, rel=1e-9)


@pytest.mark.float64
def test_quantities_hold_the_values_in_float64():
    with jax.enable_x64(True):
        for symbol, k in constants.table.items():
            q = getattr(constants, symbol)
            assert isinstance(q, Quantity)
            assert q.dtype == jnp.float64 and jax.typeof(q.array).weak_type
            assert float(ustrip(k.unit, q)) == k.value, symbol


def test_quantities_in_float32_are_weak_and_rounded_once():
    for symbol, k in constants.table.items():
        q = getattr(constants, symbol)
        assert q.dtype == jnp.float32 and q.array.weak_type
        assert q.array == np.float32(k.value), symbol
    # Weakly typed: a float16 program stays float16 (as with a Python number).
    x = Quantity(jnp.ones(2, jnp.float16), "kg")
    assert quax.quaxify(lambda m: m * constants.g0)(x).dtype == jnp.float16


def test_dimensionless_and_display():
    assert constants.alpha.units.is_dimensionless
    alpha = float(np.asarray(constants.alpha))
    assert alpha == pytest.approx(1 / 137.035999177, rel=1e-7)
    assert str(constants.G.unit) == "m3 / (kg s2)"
    assert constants.c is not constants.c  # a new quantity on every read


def test_unknown_constant():
    with pytest.raises(AttributeError, match=r"no constant 'speed'.*c, h, e"):
        constants.speed  # noqa: B018
    with pytest.raises(TypeError):
        constants.table["c"] = constants.table["h"]  # type: ignore[index]
    assert "hbar" in dir(constants) and "table" in dir(constants)
    assert quax_units.constants is constants


def test_constants_in_programs_jit_and_grad():
    m = Quantity(jnp.array([1.0, 2.0]), "g")

    @jax.jit
    @quax.quaxify
    def rest_energy(m):
        return m * constants.c**2

    np.testing.assert_allclose(
        ustrip("TJ", rest_energy(m)), [89.875517873681764, 179.75103574736353], 1e-6
    )
    dE = quax_units.grad(quax.quaxify(lambda m: jnp.sum(m * constants.c**2)))(m)
    assert dE.units == unit("J / kg").dimensions
    np.testing.assert_allclose(ustrip("m2 / s2", dE), [299792458.0**2] * 2, 1e-6)


@pytest.mark.float64
def test_bohr_radius_from_its_definition_in_float64():
    # 4 pi eps0 hbar^2 / (m_e e^2): hbar^2 is 1.1e-68, beyond float32's range (and
    # so beyond a TPU's float64, which holds float32's: NaN there).
    with jax.enable_x64(True):
        a0 = quax.quaxify(
            lambda eps0, hbar, m_e, e: 4 * math.pi * eps0 * hbar**2 / (m_e * e**2)
        )(constants.eps0, constants.hbar, constants.m_e, constants.e)
        assert a0.units == unit("m").dimensions
        assert float(ustrip("m", a0)) == pytest.approx(5.29177210544e-11, rel=1e-10)
