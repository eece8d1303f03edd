"""`Unitful`: an array with units, and the functions to make and read one."""

import operator
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import quax
from jaxtyping import ArrayLike

from ._dimensions import Dimensions, UnitError, as_dimensions
from ._units import Unit, UnitLike, conversion_factor, si_unit, unit


__all__ = ["Quantity", "Unitful", "fits_any_unit", "ustrip"]


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


_OPERAND = (jax.Array, np.ndarray, np.generic, int, float, complex)


def _operator(op: Callable[..., Any], *, reflected: bool = False) -> Any:
    """A Python operator method of `Unitful`, run through `quax.quaxify` so that the
    rules decide its units (and raise its unit errors)."""
    quaxified = quax.quaxify(op)

    def method(self: "Unitful", other: Any) -> Any:
        if not isinstance(other, (Unitful, *_OPERAND)):
            return NotImplemented
        return quaxified(other, self) if reflected else quaxified(self, other)

    method.__name__ = f"__{'r' if reflected else ''}{op.__name__.strip('_')}__"
    return method


def _unary(op: Callable[[Any], Any]) -> Any:
    quaxified = quax.quaxify(op)

    def method(self: "Unitful") -> Any:
        return quaxified(self)

    method.__name__ = f"__{op.__name__.strip('_')}__"
    return method


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

    Outside `quax.quaxify`, Python operators work too (`q1 + q2`, `q * 2`,
    `q ** 2`, `q < q2`, `q[0]`, `len(q)`): each runs `quax.quaxify` on the operator,
    so the same rules give the units. Inside a quaxified function, use `jax.numpy`.

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

    # A quantity is its array times its units: linear in its leaves, so the tangents
    # and cotangents of `custom_jvp`/`custom_vjp` functions keep their units.
    linear_in_leaves: ClassVar[bool] = True

    # NumPy arrays defer to these operators instead of broadcasting over the object.
    __array_ufunc__ = None

    __add__ = _operator(operator.add)
    __radd__ = _operator(operator.add, reflected=True)
    __sub__ = _operator(operator.sub)
    __rsub__ = _operator(operator.sub, reflected=True)
    __mul__ = _operator(operator.mul)
    __rmul__ = _operator(operator.mul, reflected=True)
    __truediv__ = _operator(operator.truediv)
    __rtruediv__ = _operator(operator.truediv, reflected=True)
    __floordiv__ = _operator(operator.floordiv)
    __rfloordiv__ = _operator(operator.floordiv, reflected=True)
    __mod__ = _operator(operator.mod)
    __rmod__ = _operator(operator.mod, reflected=True)
    __matmul__ = _operator(operator.matmul)
    __rmatmul__ = _operator(operator.matmul, reflected=True)
    __pow__ = _operator(operator.pow)
    __rpow__ = _operator(operator.pow, reflected=True)
    __lt__ = _operator(operator.lt)
    __le__ = _operator(operator.le)
    __gt__ = _operator(operator.gt)
    __ge__ = _operator(operator.ge)
    __eq__ = _operator(operator.eq)  # type: ignore[assignment]
    __ne__ = _operator(operator.ne)  # type: ignore[assignment]
    __neg__ = _unary(operator.neg)
    __pos__ = _unary(operator.pos)
    __abs__ = _unary(operator.abs)
    __hash__ = None  # type: ignore[assignment]  # `==` is elementwise, as for arrays

    def __getitem__(self, index: Any) -> "Unitful":
        return quax.quaxify(lambda x: x[index])(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d quantity")
        return self.shape[0]

    def __iter__(self) -> Iterator["Unitful"]:
        return (self[i] for i in range(len(self)))

    @classmethod
    def lift(cls, array: ArrayLike, like: "Unitful") -> "Unitful | None":
        """`array` as a value of `like`'s units, when a plain array must join a
        `Unitful` (a loop carry or branch output that is plain on one side).

        Quax-core calls this, e.g. for the zero cotangent a reverse-mode loop starts
        its carry with. A plain array counts as dimensionless, so it is lifted when
        `like` is dimensionless or when it fits any unit (a constant of zeros,
        infinities or NaNs); otherwise joining it would be a unit error, and this
        returns `None` (quax-core then reports the join as failed).

        **Arguments:**

        - `array`: the plain array.
        - `like`: the `Unitful` it is joined with.

        **Returns:**

        A `Unitful` with `like`'s dimensions and display unit, or `None`.
        """
        if like.units.is_dimensionless or fits_any_unit(array):
            return cls(array, like.units, like.display)
        return None

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


def fits_any_unit(x: Any) -> bool:
    """Whether a plain operand is a constant known at trace time that fits any unit:
    all zeros, infinities or NaNs (as in `jnp.where(x > 0, x, 0)` inside `jnp`)."""
    if isinstance(x, Unitful | jax.core.Tracer):
        return False
    values = np.asarray(x)
    return bool(np.all((values == 0) | ~np.isfinite(values)))


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
    if u.scale != 1.0 or u.offset:
        if not jnp.issubdtype(array.dtype, jnp.inexact):
            array = array.astype(jnp.result_type(float))
        if u.scale != 1.0:
            array = array * u.scale
        if u.offset:
            array = array + u.offset
    return Unitful(array, u.dimensions, u)


def _to_unit(u: UnitLike) -> Unit:
    return u if isinstance(u, Unit) else unit(u)


def ustrip(u: UnitLike, q: Any) -> Any:
    """The numbers of quantity `q` in unit `u`, as a plain array.

    **Arguments:**

    - `u`: the unit to express `q` in; its dimensions must be those of `q`.
    - `q`: a [`quax_units.Unitful`][]; a plain array counts as dimensionless.

    **Returns:**

    A plain array. Different dimensions raise [`quax_units.UnitError`][]. For an
    offset unit (`degC`), the numbers are measured from its zero.
    """
    target = _to_unit(u)
    if isinstance(q, Unitful):
        factor = conversion_factor(si_unit(q.units), target)
        array = q.array - target.offset if target.offset else q.array
        return array if factor == 1.0 else array * factor
    if not target.is_dimensionless:
        raise UnitError(
            "Cannot express a plain (dimensionless) array in "
            f"{target} ({target.dimensions})."
        )
    return q if target.scale == 1.0 else jnp.asarray(q) / target.scale


def dimensions_of(x: Any) -> Dimensions:
    """The dimensions of an operand (a plain array is dimensionless)."""
    return x.units if isinstance(x, Unitful) else Dimensions()
