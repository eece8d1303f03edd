"""Conversion to and from `pint` and `astropy` quantities (imported only when used)."""

from typing import Any

import jax.numpy as jnp
import numpy as np

from ._dimensions import Dimension, Dimensions, UnitError
from ._units import Unit, unit
from ._value import Quantity


__all__ = ["from_astropy", "from_pint", "to_astropy", "to_pint"]

_PINT_DIMENSIONS = {
    "[length]": "m", "[mass]": "kg", "[time]": "s", "[current]": "A",
    "[temperature]": "K", "[substance]": "mol", "[luminosity]": "cd",
}  # fmt: skip
_SI_BASES = set(_PINT_DIMENSIONS.values())
_ASTROPY_DIMENSIONLESS_BASES = {"rad", "sr"}


def _astropy_offset_units() -> dict[str, Any]:
    """Our offset units and astropy's temperature scales for them."""
    import astropy.units as apu
    from astropy.units import imperial

    return {"degC": apu.deg_C, "degF": imperial.deg_F}


def _display(text: str, dims: Dimensions) -> Unit | None:
    """Our unit for another library's unit string, when we parse it to the same
    dimensions; else `None` (show in SI)."""
    try:
        parsed = unit(text)
    except ValueError:
        return None
    return parsed if parsed.dimensions == dims else None


def _si_symbols(q: Quantity) -> list[tuple[str, Any]]:
    unknown = [d.name for d in q.units if d.name not in _SI_BASES]
    if unknown:
        raise UnitError(
            f"No pint or astropy unit for the non-SI dimension(s) {unknown}."
        )
    return [(d.name, e) for d, e in q.units.items()]


def to_pint(q: Quantity, registry: Any = None) -> Any:
    """Convert to a `pint.Quantity` (in the display unit when pint knows it, else SI).

    **Arguments:**

    - `q`: a concrete [`quax_units.Quantity`][] (not inside a traced function).
    - `registry`: the `pint.UnitRegistry` to use; default pint's application registry.

    **Returns:**

    A `pint.Quantity` holding a NumPy array.
    """
    import pint

    registry = registry or pint.get_application_registry()
    try:
        pint_unit = registry.Unit("dimensionless")
        for symbol, exponent in q.unit.terms:
            pint_unit = pint_unit * registry.Unit(symbol) ** float(exponent)
        magnitude = q.value
    except (pint.errors.UndefinedUnitError, ValueError):
        pint_unit = registry.Unit("dimensionless")
        for symbol, exponent in _si_symbols(q):
            pint_unit = pint_unit * registry.Unit(symbol) ** float(exponent)
        magnitude = q.array
    return registry.Quantity(np.asarray(magnitude), pint_unit)


def from_pint(q: Any) -> Quantity:
    """Convert a `pint.Quantity` into a [`quax_units.Quantity`][], keeping its unit
    for display when it is one quax-units knows.

    **Arguments:**

    - `q`: a `pint.Quantity`.

    **Returns:**

    The `Quantity`.
    """
    base = q.to_base_units()
    exponents = {}
    for name, exponent in dict(q.dimensionality).items():
        if name not in _PINT_DIMENSIONS:
            raise UnitError(f"No quax-units dimension for pint's {name}.")
        exponents[Dimension(_PINT_DIMENSIONS[name])] = exponent
    dims = Dimensions(exponents)
    return Quantity(jnp.asarray(base.magnitude), dims, _display(str(q.units), dims))


def to_astropy(q: Quantity) -> Any:
    """Convert to an `astropy.units.Quantity` (in the display unit when astropy
    parses it, else SI).

    **Arguments:**

    - `q`: a concrete [`quax_units.Quantity`][] (not inside a traced function).

    **Returns:**

    An `astropy.units.Quantity`.
    """
    import astropy.units as apu

    if q.unit.offset:  # astropy's temperature scales (see `apu.temperature()`)
        return np.asarray(q.value) * _astropy_offset_units()[str(q.unit)]
    try:
        return np.asarray(q.value) * apu.Unit(str(q.unit) or "dimensionless")
    except ValueError:
        si = apu.dimensionless_unscaled
        for symbol, exponent in _si_symbols(q):
            si = si * apu.Unit(symbol) ** exponent
        return np.asarray(q.array) * si


def from_astropy(q: Any) -> Quantity:
    """Convert an `astropy.units.Quantity` into a [`quax_units.Quantity`][].

    **Arguments:**

    - `q`: an `astropy.units.Quantity`.

    **Returns:**

    The `Quantity`, shown in the astropy unit when quax-units knows it.
    """
    for name, scale in _astropy_offset_units().items():
        if q.unit == scale:  # a temperature scale: 20 deg_C is 293.15 K
            return Quantity(jnp.asarray(q.value), name)
    decomposed = q.unit.decompose()
    exponents = {}
    for base, power in zip(decomposed.bases, decomposed.powers, strict=True):
        if base.name in _ASTROPY_DIMENSIONLESS_BASES:
            continue
        if base.name not in _SI_BASES:
            raise UnitError(f"No quax-units dimension for astropy's base unit {base}.")
        exponents[Dimension(base.name)] = power
    dims = Dimensions(exponents)
    value = np.asarray(q.value) * decomposed.scale
    return Quantity(jnp.asarray(value), dims, _display(q.unit.to_string(), dims))
