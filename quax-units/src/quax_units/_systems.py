"""Unit systems: a choice of one unit per base dimension, in which a quantity is
shown (`Quantity.decompose(system)`). `si`, `cgs` and `galactic` are defined here."""

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ._dimensions import Dimension, Dimensions, dimensionless
from ._units import Unit, UnitLike, si_unit, unit


__all__ = ["UnitSystem", "cgs", "galactic", "si", "unit_system"]


class UnitSystem:
    """A unit system: one unit for each base dimension it names, and the SI unit for
    the others (`A`, `K`, `mol`, `cd`, or a new `Dimension`'s own unit).

    ```python
    from quax_units import Quantity, UnitSystem

    solar = UnitSystem("solar", "au", "yr", "Msun")
    Quantity(30.0, "km / s").decompose(solar)  # about 6.33 au / yr
    ```

    A quantity's array is always held in SI-coherent units, so a system only
    chooses how quantities are shown ([`quax_units.Quantity.decompose`][]) and
    which unit [`quax_units.ustrip`][] is given (`ustrip(system.unit_for("m / s"),
    v)`): it changes no number a program computes with.

    **Arguments:**

    - `name`: the system's name, for display (`"galactic"`).
    - `*bases`: its base units, each a unit of one base dimension to the power one
        (`"kpc"`, `"Myr"`, `"Msun"`), with no two of the same dimension.
    """

    __slots__ = ("bases", "name")
    name: str
    bases: Mapping[Dimension, Unit]

    def __init__(self, name: str, *bases: UnitLike) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(
                "UnitSystem needs a `name`, a non-empty string such as 'galactic', "
                f"got name={name!r}."
            )
        units: dict[Dimension, Unit] = {}
        for base in bases:
            u = unit(base)
            items = list(u.dimensions.items())
            if u.dimensions == dimensionless:
                raise ValueError(
                    f"UnitSystem {name!r}: the base unit {base!r} is dimensionless "
                    "(angles are numbers in radians in quax-units), and a system "
                    "chooses units only for dimensions. Leave it out."
                )
            if len(items) != 1 or items[0][1] != 1:
                raise ValueError(
                    f"UnitSystem {name!r}: the base unit {base!r} has dimensions "
                    f"{u.dimensions}; each base unit measures one base dimension "
                    "(a length, a mass, a time, ...) to the power one."
                )
            if u.offset:
                raise ValueError(
                    f"UnitSystem {name!r}: the base unit {base!r} is an offset unit "
                    f"(its zero is not zero); use {si_unit(u.dimensions)} or a "
                    "scaled unit such as 'degR'."
                )
            dim = items[0][0]
            if dim in units:
                raise ValueError(
                    f"UnitSystem {name!r}: the base units {units[dim]} and {base!r} "
                    f"both measure {dim}; give one unit per base dimension."
                )
            units[dim] = u
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "bases", MappingProxyType(units))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("UnitSystem is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UnitSystem):
            return NotImplemented
        return self.name == other.name and self.bases == other.bases

    def __hash__(self) -> int:
        return hash((self.name, tuple(self.bases.items())))

    def unit_for(self, dimensions: Dimensions | UnitLike) -> Unit:
        """The unit of this system for `dimensions`: the product of its base units
        to their exponents (`kpc / Myr` for a velocity in `galactic`).

        **Arguments:**

        - `dimensions`: `Dimensions`, or a unit whose dimensions are meant
            (`"m / s"`, `unit("J")`).

        **Returns:**

        A `Unit`, named by the base units (`Msun kpc2 / Myr2`).
        """
        if not isinstance(dimensions, Dimensions):
            dimensions = unit(dimensions).dimensions
        out = Unit(1.0, dimensionless, ())
        for dim, exponent in dimensions.items():
            base = self.bases.get(dim) or si_unit(Dimensions({dim: 1}))
            out = out * base**exponent
        return out

    def __repr__(self) -> str:
        bases = "".join(f", {str(u)!r}" for u in self.bases.values())
        return f"UnitSystem({self.name!r}{bases})"


si = UnitSystem("SI", "m", "kg", "s", "A", "K", "mol", "cd")
"""The International System: `m`, `kg`, `s`, `A`, `K`, `mol`, `cd` (the units a
`Quantity` holds its array in)."""

cgs = UnitSystem("cgs", "cm", "g", "s")
"""Centimetre-gram-second, for mechanics (`dyn`, `erg`, `g / cm3`): electric
current stays in `A` (the Gaussian and electrostatic systems give charge other
dimensions, which quax-units does not model)."""

galactic = UnitSystem("galactic", "kpc", "Myr", "Msun")
"""Galactic dynamics (as in gala and unxt): `kpc`, `Myr` (Julian), `Msun` (IAU 2015
nominal), SI for the other dimensions. In it `G` is about `4.4985e-12 kpc3 / (Msun
Myr2)` and `1 kpc / Myr` is about `977.79 km / s`."""

_SYSTEMS = {"si": si, "cgs": cgs, "galactic": galactic}


def unit_system(system: "UnitSystem | str") -> UnitSystem:
    """`system`, or the system it names: `"si"`, `"cgs"` or `"galactic"` (in any
    case).

    **Arguments:**

    - `system`: a `UnitSystem` or a name.

    **Returns:**

    The `UnitSystem`.
    """
    if isinstance(system, UnitSystem):
        return system
    if isinstance(system, str) and system.lower() in _SYSTEMS:
        return _SYSTEMS[system.lower()]
    raise ValueError(
        f"Unknown unit system {system!r}: pass a quax_units.UnitSystem, or one of "
        f"the names {', '.join(repr(n) for n in _SYSTEMS)}."
    )
