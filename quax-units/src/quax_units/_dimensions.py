"""Physical dimensions: base `Dimension`s and their products, `Dimensions`."""

import math
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

import numpy as np


__all__ = [
    "Dimension",
    "Dimensions",
    "UnitError",
    "amperes",
    "as_dimensions",
    "candelas",
    "dimensionless",
    "format_exponents",
    "kelvins",
    "kilograms",
    "meters",
    "moles",
    "rational_exponent",
    "seconds",
]


class UnitError(TypeError):
    """An operation on quantities whose units do not fit together: adding metres to
    seconds, the sine of a length, a loop whose carry changes units, ...

    Raised at trace time, so a jitted function fails when it is traced, before it runs.
    """


class Dimension:
    """A base dimension, named by the symbol of its coherent SI unit.

    `Dimension("m")` is length, measured in metres. Two dimensions with the same name
    are the same dimension; a new name (`Dimension("apple")`) is a new base dimension.

    **Arguments:**

    - `name`: the symbol of the dimension's base unit.
    """

    __slots__ = ("name",)
    name: str

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(
                "Dimension needs a `name`: the symbol of its base unit, a non-empty "
                f"string such as 'm' or 'apple', got name={name!r}."
            )
        object.__setattr__(self, "name", name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Dimension is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dimension) and other.name == self.name

    def __hash__(self) -> int:
        return hash((Dimension, self.name))

    def __lt__(self, other: "Dimension") -> bool:
        return _order(self) < _order(other)

    def __repr__(self) -> str:
        return self.name


meters = Dimension("m")
kilograms = Dimension("kg")
seconds = Dimension("s")
amperes = Dimension("A")
kelvins = Dimension("K")
moles = Dimension("mol")
candelas = Dimension("cd")

_BASE_ORDER = {
    d.name: i
    for i, d in enumerate(
        [kilograms, meters, seconds, amperes, kelvins, moles, candelas]
    )
}


def _order(d: Dimension) -> tuple[int, str]:
    return (_BASE_ORDER.get(d.name, len(_BASE_ORDER)), d.name)


# The largest denominator of an exponent given as a float: float32's `1 / 3`
# (0.33333334) is the exponent 1/3.
_MAX_DENOMINATOR = 1000


def rational_exponent(
    value: Any,
    operation: str,
    error: type[Exception] = ValueError,
    way_out: str = "Pass a `fractions.Fraction` for an exact exponent.",
) -> Fraction:
    """`value` as the exact exponent of a unit or of dimensions.

    Integers and `Fraction`s are exact, and so is a string such as `"3/2"`. A
    float (Python's, NumPy's or JAX's, in its own precision) is the fraction with
    the smallest denominator, at most 1000, that rounds to it: `0.5` is 1/2, and
    `1 / 3` is 1/3 in float64, float32 and bfloat16 alike.

    **Arguments:**

    - `value`: the exponent.
    - `operation`: what is raised to it, for the message: "raise the unit km
        to the power".
    - `error`: the class of the error to raise.
    - `way_out`: what to do instead of an exponent that is not finite or not a
        simple fraction, for the message.

    **Returns:**

    The exponent, a `Fraction`.

    **Raises:**

    `error`, naming the operation and the exponent, when `value` is not a real
    number, is not finite, or is a float that no fraction with a denominator up
    to 1000 rounds to.
    """
    if isinstance(value, Fraction):
        return value
    if isinstance(value, str):
        try:
            return Fraction(value)
        except (ValueError, ZeroDivisionError):
            raise error(
                f"Cannot {operation} {value!r}: it is not a number. Write an "
                "exponent as an integer, a fraction ('3/2') or a float."
            ) from None
    if isinstance(value, int):
        return Fraction(value)
    number = np.asarray(value)
    shown = str(number) if number.ndim == 0 else repr(value)
    # Floats include JAX's own (bfloat16 is NumPy's kind "V").
    if number.ndim != 0 or number.dtype.kind in "cmMOSUa":
        raise error(
            f"Cannot {operation} {shown}: an exponent is one real number (an "
            "integer, a fraction or a float)."
        )
    if number.dtype.kind in "biu":
        return Fraction(int(number))
    if not math.isfinite(float(number)):
        raise error(
            f"Cannot {operation} {shown}: the exponent of a unit is a finite "
            f"number, and the units of the result would be undefined. {way_out}"
        )
    # The simplest fraction that rounds to the float in its own dtype: the first
    # denominator q whose nearest numerator p gives p / q == value.
    denominators = np.arange(1, _MAX_DENOMINATOR + 1)
    numerators = np.round(float(number) * denominators)
    with np.errstate(over="ignore"):
        matches = (numerators / denominators).astype(number.dtype) == number
    if not matches.any():
        nearest = Fraction(float(number)).limit_denominator(_MAX_DENOMINATOR)
        raise error(
            f"Cannot {operation} {shown}: exponents of units are exact fractions, "
            f"and no fraction with a denominator up to {_MAX_DENOMINATOR} rounds to "
            f"this float (the nearest is {nearest}, {float(nearest)!r}). {way_out}"
        )
    q = int(np.argmax(matches))
    return Fraction(int(numerators[q]), int(denominators[q]))


class Dimensions(Mapping[Dimension, Fraction]):
    """A product of base dimensions with rational exponents, e.g. `{m: 1, s: -2}`.

    An immutable, hashable mapping (equal to a `dict` with the same items), so it can
    be a static field: it is part of a value's pytree structure and checked at trace
    time. Exponents are `Fraction`s, so `sqrt` of an area is a length, exactly.

    **Arguments:**

    - `exponents`: a mapping from `Dimension` to exponent (an int, a `Fraction`, or
        a float that a simple fraction rounds to, see `rational_exponent`); zero
        exponents are dropped.
    """

    __slots__ = ("_hash", "_items")
    _items: tuple[tuple[Dimension, Fraction], ...]
    _hash: int

    def __init__(
        self, exponents: Mapping[Dimension, int | float | Fraction] = {}
    ) -> None:
        items = []
        for dim, exponent in exponents.items():
            if not isinstance(dim, Dimension):
                raise TypeError(f"Expected a Dimension as key, got {dim!r}.")
            if isinstance(exponent, int):
                exponent = Fraction(exponent)
            elif not isinstance(exponent, Fraction):
                exponent = rational_exponent(
                    exponent, f"give the dimension {dim} the exponent"
                )
            if exponent != 0:
                items.append((dim, exponent))
        items.sort(key=lambda item: _order(item[0]))
        object.__setattr__(self, "_items", tuple(items))
        object.__setattr__(self, "_hash", hash(self._items))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Dimensions is immutable")

    def __getitem__(self, dim: Dimension) -> Fraction:
        for d, exponent in self._items:
            if d == dim:
                return exponent
        raise KeyError(dim)

    def __iter__(self) -> Iterator[Dimension]:
        return (d for d, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Dimensions):
            return self._items == other._items
        if isinstance(other, Mapping):
            try:
                return self == Dimensions(other)
            except TypeError:
                return False
        return NotImplemented

    def __mul__(self, other: "Dimensions") -> "Dimensions":
        exponents = dict(self._items)
        for d, e in other._items:
            exponents[d] = exponents.get(d, Fraction(0)) + e
        return Dimensions(exponents)

    def __truediv__(self, other: "Dimensions") -> "Dimensions":
        return self * other**-1

    def __pow__(self, power: int | float | Fraction) -> "Dimensions":
        if isinstance(power, int):
            power = Fraction(power)
        elif not isinstance(power, Fraction):
            power = rational_exponent(
                power, f"raise the dimensions {self} to the power"
            )
        return Dimensions({d: e * power for d, e in self._items})

    @property
    def is_dimensionless(self) -> bool:
        return not self._items

    def __repr__(self) -> str:
        return (
            format_exponents([(d.name, e) for d, e in self._items]) or "dimensionless"
        )


dimensionless = Dimensions()


def as_dimensions(
    units: "Dimension | Mapping[Dimension, int | Fraction]",
) -> Dimensions:
    """Convert the published quax `units` argument (a `Dimension`, or a mapping from
    `Dimension` to exponent) into `Dimensions`."""
    if isinstance(units, Dimensions):
        return units
    if isinstance(units, Dimension):
        return Dimensions({units: 1})
    if isinstance(units, Mapping):
        return Dimensions(units)
    raise TypeError(
        "Expected units as a Dimension or a mapping from Dimension to exponent, "
        f"got {units!r}."
    )


def _format_exponent(symbol: str, exponent: Fraction) -> str:
    if exponent == 1:
        return symbol
    if exponent.denominator == 1:
        return f"{symbol}{exponent.numerator}"
    return f"{symbol}({exponent.numerator}/{exponent.denominator})"


def format_exponents(terms: list[tuple[str, Fraction]]) -> str:
    """Format symbols with exponents astropy-style: `kg m2 / s2`, `1 / s`."""
    numerator = [_format_exponent(s, e) for s, e in terms if e > 0]
    denominator = [_format_exponent(s, -e) for s, e in terms if e < 0]
    if not denominator:
        return " ".join(numerator)
    top = " ".join(numerator) or "1"
    bottom = " ".join(denominator)
    if len(denominator) > 1:
        bottom = f"({bottom})"
    return f"{top} / {bottom}"
