"""Physical dimensions: base `Dimension`s and their products, `Dimensions`."""

from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any


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


class Dimensions(Mapping[Dimension, Fraction]):
    """A product of base dimensions with rational exponents, e.g. `{m: 1, s: -2}`.

    An immutable, hashable mapping (equal to a `dict` with the same items), so it can
    be a static field: it is part of a value's pytree structure and checked at trace
    time. Exponents are `Fraction`s, so `sqrt` of an area is a length, exactly.

    **Arguments:**

    - `exponents`: a mapping from `Dimension` to exponent (int or `Fraction`); zero
        exponents are dropped.
    """

    __slots__ = ("_hash", "_items")
    _items: tuple[tuple[Dimension, Fraction], ...]
    _hash: int

    def __init__(self, exponents: Mapping[Dimension, int | Fraction] = {}) -> None:
        items = []
        for dim, exponent in exponents.items():
            if not isinstance(dim, Dimension):
                raise TypeError(f"Expected a Dimension as key, got {dim!r}.")
            exponent = Fraction(exponent)
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

    def __pow__(self, power: int | Fraction) -> "Dimensions":
        power = Fraction(power)
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
