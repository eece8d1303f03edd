"""`Unitful`: an array with units, and the functions to make and read one."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import quax
from jaxtyping import ArrayLike

from ._dimensions import Dimensions, UnitError, as_dimensions
from ._units import Unit, UnitLike, conversion_factor, si_unit, unit


__all__ = ["Quantity", "Unitful", "ustrip"]


class DisplayUnit:
    """The unit a `Unitful` is shown in: a presentation hint, not part of its identity.

    All display units compare equal (and hash alike), so values that differ only in
    their display unit (`m` and `km`) have the same pytree structure: a jitted function
    compiles once for both. The numbers never depend on it, since a `Unitful` holds
    its array in SI-coherent units; a compiled function reused for `km` inputs shows
    its outputs in the units of its first trace, which are equally correct.
    """

    __slots__ = ("unit",)
    unit: Unit | None

    def __init__(self, unit: Unit | None) -> None:
        object.__setattr__(self, "unit", unit)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("DisplayUnit is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DisplayUnit)

    def __hash__(self) -> int:
        return hash(DisplayUnit)

    def __repr__(self) -> str:
        return f"DisplayUnit({self.unit!r})"


def _as_display(u: "DisplayUnit | UnitLike | None") -> DisplayUnit:
    if isinstance(u, DisplayUnit):
        return u
    return DisplayUnit(None if u is None else unit(u))


class Unitful(quax.ArrayValue):
    """An array with physical units, for `quax.quaxify`.

    ```python
    x = Unitful(jnp.array([1.0, 2.0]), meters)              # published quax API
    v = Quantity(jnp.array([3.0, 4.0]), "km / h")            # any unit
    ```

    The array is held in SI-coherent units (`.array` of `Quantity(1.0, "km")` is
    `1000.0`), and the dimensions (`.units`) are a static field: they are part of the
    pytree structure, checked when a program is traced and free when it runs. The unit
    a value was made in is kept only for display (`.unit`), so `m` and `km` inputs
    share one compilation. Unit errors (adding metres to seconds, the sine of a length)
    raise [`quax_units.UnitError`][] at trace time.

    **Arguments:**

    - `array`: the values, in SI-coherent units of `units`.
    - `units`: the dimensions: a `Dimension`, or a mapping from `Dimension` to exponent.
    - `display`: the unit to show the value in (default: the SI unit of `units`).
    """

    array: ArrayLike
    units: Dimensions = eqx.field(static=True, converter=as_dimensions)
    display: DisplayUnit = eqx.field(static=True, converter=_as_display, default=None)

    def __check_init__(self) -> None:
        shown = self.display.unit
        if shown is not None and shown.dimensions != self.units:
            raise UnitError(
                f"Display unit {shown} ({shown.dimensions}) does not have the "
                f"dimensions of the value ({self.units})."
            )

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> Any:
        if self.units.is_dimensionless:
            return self.array
        raise UnitError(
            f"Refusing to turn a quantity in {self.unit} ({self.units}) into a plain "
            "array, which would drop its units. Strip them explicitly with "
            "`quax_units.ustrip(unit, q)`, or keep the units unchanged here."
        )

    @staticmethod
    def default(primitive: Any, values: Any, params: dict[str, Any]) -> Any:
        dimensionful = [
            v for v in values if isinstance(v, Unitful) and not v.units.is_dimensionless
        ]
        if dimensionful:
            described = ", ".join(describe(v) for v in values)
            raise UnitError(
                f"quax-units has no rule for `{primitive.name}` on ({described}), and "
                "applying it to the bare numbers would drop or corrupt the units. "
                "Strip "
                "the units first with `quax_units.ustrip(unit, q)` (and reattach them "
                "with `quax_units.Quantity`), or register a rule with `quax.register`."
            )
        dense = [v.array if isinstance(v, Unitful) else v for v in values]
        return primitive.bind(*dense, **params)

    @property
    def unit(self) -> Unit:
        """The unit the value is shown in."""
        return self.display.unit or si_unit(self.units)

    @property
    def value(self) -> Any:
        """The numbers in the display unit (`.array` is in SI-coherent units)."""
        return self.to_value(self.unit)

    def to(self, u: UnitLike) -> "Unitful":
        """The same quantity, shown in unit `u` (which must have the same dimensions).

        **Arguments:**

        - `u`: the unit, e.g. `"km / h"`.

        **Returns:**

        A `Unitful` with the same array and pytree structure, displayed in `u`.
        """
        target = unit(u)
        conversion_factor(si_unit(self.units), target)
        return Unitful(self.array, self.units, target)

    def to_value(self, u: UnitLike) -> Any:
        """The numbers of this quantity in unit `u`; see [`quax_units.ustrip`][]."""
        return ustrip(u, self)

    def __repr__(self) -> str:
        if isinstance(self.array, jax.core.Tracer):
            numbers = self.aval().str_short()
        else:
            numbers = repr(self.value)
        return f"Quantity({numbers}, unit={str(self.unit)!r})"


def describe(x: Any) -> str:
    """How an operand is named in error messages: its unit and dimensions."""
    if isinstance(x, Unitful):
        return f"{str(x.unit) or 'dimensionless'} [{x.units}]"
    return f"plain array {jax.typeof(x).str_short()} [dimensionless]"


def Quantity(value: ArrayLike, unit: UnitLike) -> Unitful:
    """A quantity: `value` in `unit`, e.g. `Quantity(jnp.array([1.0, 2.0]), "km")`.

    **Arguments:**

    - `value`: numbers, measured in `unit`.
    - `unit`: a `Unit`, a string such as `"m / s2"`, a `Dimension` or a mapping.

    **Returns:**

    A [`quax_units.Unitful`][] holding `value` converted to SI-coherent units,
    displayed in `unit`.
    """
    u = _to_unit(unit)
    array = jnp.asarray(value)
    if u.scale != 1.0:
        if not jnp.issubdtype(array.dtype, jnp.inexact):
            array = array.astype(jnp.result_type(float))
        array = array * u.scale
    return Unitful(array, u.dimensions, u)


def _to_unit(u: UnitLike) -> Unit:
    return u if isinstance(u, Unit) else unit(u)


def ustrip(u: UnitLike, q: Any) -> Any:
    """The numbers of quantity `q` in unit `u`, as a plain array.

    **Arguments:**

    - `u`: the unit to express `q` in; its dimensions must be those of `q`.
    - `q`: a [`quax_units.Unitful`][]; a plain array counts as dimensionless.

    **Returns:**

    A plain array. Different dimensions raise [`quax_units.UnitError`][].
    """
    target = _to_unit(u)
    if isinstance(q, Unitful):
        factor = conversion_factor(si_unit(q.units), target)
        return q.array if factor == 1.0 else q.array * factor
    if not target.is_dimensionless:
        raise UnitError(
            "Cannot express a plain (dimensionless) array in "
            f"{target} ({target.dimensions})."
        )
    return q if target.scale == 1.0 else jnp.asarray(q) / target.scale


def dimensions_of(x: Any) -> Dimensions:
    """The dimensions of an operand (a plain array is dimensionless)."""
    return x.units if isinstance(x, Unitful) else Dimensions()
