"""Physical constants as quantities: the CODATA 2022 values, and the IAU's
astronomical constants.

```python
import jax.numpy as jnp, quax
from quax_units import Quantity, constants, ustrip

E = quax.quaxify(lambda m: m * constants.c**2)(Quantity(jnp.array([1.0, 2.0]), "g"))
ustrip("TJ", E)  # about [89.9, 179.8]
```

The constants, by symbol (SI-coherent units):

- exact, as the SI defines them: `c` (speed of light in vacuum, m / s), `h` (Planck
    constant, J s), `e` (elementary charge, C), `k_B` (Boltzmann constant, J / K),
    `N_A` (Avogadro constant, 1 / mol);
- exact, computed from those: `hbar` (reduced Planck constant, J s), `R` (molar gas
    constant, J / (mol K)), `F` (Faraday constant, C / mol), `sigma`
    (Stefan-Boltzmann constant, W / (m2 K4)), `Phi0` (magnetic flux quantum, Wb),
    `K_J` (Josephson constant, Hz / V), `R_K` (von Klitzing constant, ohm), `G0`
    (conductance quantum, S);
- measured (CODATA 2022): `G` (Newtonian constant of gravitation, m3 / (kg s2)),
    `m_e`, `m_p`, `m_n`, `m_mu` (electron, proton, neutron, muon masses, kg), `u`
    (atomic mass constant, kg), `eps0` (vacuum electric permittivity, F / m), `mu0`
    (vacuum magnetic permeability, N / A2), `Z0` (characteristic impedance of
    vacuum, ohm), `alpha` (fine-structure constant, dimensionless), `a0` (Bohr
    radius, m), `r_e` (classical electron radius, m), `Ryd` (Rydberg constant,
    1 / m), `E_h` (Hartree energy, J), `sigma_T` (Thomson cross section, m2), `mu_B`,
    `mu_N` (Bohr and nuclear magnetons, J / T);
- conventional (exact): `g0` (standard acceleration of gravity, m / s2), `atm`
    (standard atmosphere, Pa);
- astronomy: `au` (astronomical unit, IAU 2012 Resolution B2, exact, m), `pc`, `kpc`
    (parsec and kiloparsec, IAU 2015 Resolution B2, exact, m), `GM_sun`, `GM_earth`,
    `GM_jup` (nominal mass parameters of IAU 2015 Resolution B3, m3 / s2), `M_sun`,
    `M_earth`, `M_jup` (those divided by `G`, as astropy does, kg), `R_sun`, `L_sun`,
    `R_earth`, `R_jup` (nominal solar radius and luminosity, Earth and Jupiter
    equatorial radii, IAU 2015 Resolution B3; m, W).

Each name is a new [`quax_units.Quantity`][] every time it is read, made from a
Python float: a weakly typed scalar in the precision JAX has *then* (float32, or
float64 under `jax_enable_x64`), which takes the dtype of the arrays it meets, as a
Python number would. So enabling float64 after importing this module still gives the
constants in float64. In float32 each holds its value to float32's precision
(about 7 digits), which is below the uncertainty of the measured ones but not of
the exact ones.

`constants.table` holds every constant's name, value, unit, standard uncertainty
and source (a [`quax_units.constants.Constant`][]), by symbol. The values were
checked against `scipy.constants.physical_constants` (CODATA 2022, SciPy 1.15 and
later) and `astropy.constants`.
"""

from types import MappingProxyType

from ._codata import CONSTANTS, Constant
from ._units import Unit, unit
from ._value import Quantity


__all__ = [*CONSTANTS, "Constant", "table"]  # pyright: ignore[reportUnsupportedDunderAll]

table: MappingProxyType[str, Constant] = MappingProxyType(CONSTANTS)
"""Every constant of this module, by symbol: its name, value, unit, standard
uncertainty and source."""

# Parsed once: reading a constant builds only the quantity.
_units: dict[str, Unit] = {symbol: unit(k.unit) for symbol, k in CONSTANTS.items()}


def __getattr__(name: str) -> Quantity:
    constant = CONSTANTS.get(name)
    if constant is None:
        raise AttributeError(
            f"module 'quax_units.constants' has no constant {name!r}; its constants "
            f"are {', '.join(CONSTANTS)}."
        )
    return Quantity(constant.value, _units[name])


def __dir__() -> list[str]:
    return sorted([*globals(), *CONSTANTS])
