"""Units: a scale and `Dimensions`, named, with SI prefixes and a parser for
strings such as `"km / s"`, `"kg m2 s-2"` or `"m**(1/2)"`."""

import math
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from ._codata import CONSTANTS
from ._dimensions import (
    Dimension,
    Dimensions,
    UnitError,
    amperes,
    as_dimensions,
    candelas,
    dimensionless,
    format_exponents,
    kelvins,
    kilograms,
    meters,
    moles,
    rational_exponent,
    seconds,
)


__all__ = ["Unit", "UnitLike", "set_quantity_type", "si_unit", "unit"]


class Unit:
    """A unit of measure: `scale` SI-coherent units of `dimensions`, shown as `terms`.

    Build units by parsing (`unit("km / s")`), or by arithmetic on other units
    (`unit("km") / unit("h")`). Two units are equal when they have the same scale,
    offset and dimensions, whatever their names (`unit("J") == unit("N m")`).

    An *offset* unit (`degC`, `degF`) measures from another zero: `x` of it is
    `x * scale + offset` SI-coherent units (`20 degC` is `293.15 K`). Offset units
    only convert; they cannot be multiplied, divided or raised to a power (use `K`,
    or the differences `delta_degC`, `delta_degF`, in compound units).

    **Arguments:**

    - `scale`: how many SI-coherent units one of this unit is (1000 for `km`).
    - `dimensions`: the unit's `Dimensions`.
    - `terms`: the named units it is a product of, with exponents, for display.
    - `offset`: the SI-coherent value of this unit's zero (273.15 for `degC`).
    """

    __slots__ = ("dimensions", "offset", "scale", "terms")
    scale: float
    dimensions: Dimensions
    terms: tuple[tuple[str, Fraction], ...]
    offset: float

    def __init__(
        self,
        scale: float,
        dimensions: Dimensions,
        terms: tuple[tuple[str, Fraction], ...],
        offset: float = 0.0,
    ) -> None:
        name = format_exponents(list(terms)) if isinstance(terms, tuple) else terms
        if not _positive_finite(scale):
            raise ValueError(
                f"Unit {name!r} needs a finite `scale` > 0 (how many SI-coherent "
                f"units one of it is), got scale={scale!r}: a scale out of a float's "
                "range, zero or negative cannot convert numbers to SI-coherent units."
            )
        if not isinstance(dimensions, Dimensions):
            raise ValueError(
                f"Unit {name!r} needs `dimensions` of type Dimensions (see "
                f"quax_units.Dimensions), got dimensions={dimensions!r}."
            )
        if not _finite(offset):
            raise ValueError(
                f"Unit {name!r} needs a finite `offset` (the SI-coherent value of its "
                f"zero), got offset={offset!r}."
            )
        object.__setattr__(self, "scale", float(scale))
        object.__setattr__(self, "dimensions", dimensions)
        object.__setattr__(self, "terms", terms)
        object.__setattr__(self, "offset", float(offset))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Unit is immutable")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            other = unit(other)
        if not isinstance(other, Unit):
            return NotImplemented
        return (
            self.scale == other.scale
            and self.offset == other.offset
            and self.dimensions == other.dimensions
        )

    def __hash__(self) -> int:
        return hash((self.scale, self.offset, self.dimensions))

    def _no_offset(self, operation: str) -> None:
        if self.offset:
            raise UnitError(
                f"Cannot {operation} the offset unit {self}: its zero is not zero. "
                f"Use {si_unit(self.dimensions)} (or the difference unit "
                f"`delta_{self}`) in compound units."
            )

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, Unit):
            self._no_offset("multiply")
            other._no_offset("multiply")
            return Unit(
                self.scale * other.scale,
                self.dimensions * other.dimensions,
                _merge(self.terms, other.terms, 1),
            )
        return _quantity_type(other, self)

    def __rmul__(self, other: Any) -> Any:
        return _quantity_type(other, self)

    def __truediv__(self, other: "Unit") -> "Unit":
        if not isinstance(other, Unit):
            return NotImplemented
        self._no_offset("divide")
        other._no_offset("divide by")
        return Unit(
            self.scale / other.scale,
            self.dimensions / other.dimensions,
            _merge(self.terms, other.terms, -1),
        )

    def __pow__(self, power: int | float | Fraction) -> "Unit":
        if isinstance(power, int):
            power = Fraction(power)
        elif not isinstance(power, Fraction):
            power = rational_exponent(power, f"raise the unit {self} to the power")
        if power == 1:
            return self
        self._no_offset("raise to a power")
        if self.scale == 1.0:
            scale = 1.0
        else:
            try:
                scale = self.scale ** float(power)
            except OverflowError:  # of the float, or of the power
                scale = math.inf
        if not 0.0 < scale < math.inf:
            raise ValueError(
                f"Cannot raise the unit {self} to the power {power}: its scale, "
                f"{self.scale!r} SI-coherent units, to that power is out of a "
                f"float's range. Use the SI-coherent unit {si_unit(self.dimensions)} "
                "(scale 1), whose powers all have scale 1."
            )
        return Unit(
            scale,
            self.dimensions**power,
            tuple((s, e * power) for s, e in self.terms if e * power != 0),
        )

    @property
    def is_dimensionless(self) -> bool:
        return self.dimensions.is_dimensionless

    @property
    def linear(self) -> "Unit":
        """This unit, or for an offset unit the SI-coherent unit of its dimensions
        (`K` for `degC`): the unit that results of arithmetic are shown in."""
        return si_unit(self.dimensions) if self.offset else self

    def __str__(self) -> str:
        return format_exponents(list(self.terms))

    def __repr__(self) -> str:
        return f"Unit({str(self)!r})"


# What `number * unit` makes: `quax_units.Quantity`. Quantities are built on units
# (`_value` imports this module), so `_value` hands the class down here when it is
# imported, rather than this module importing it, which would be an import cycle.
_quantity_type: Callable[[Any, Unit], Any]


def set_quantity_type(make: Callable[[Any, Unit], Any]) -> None:
    """Make `number * unit` and `unit * number` return `make(number, unit)`.
    `_value` calls it once, with `Quantity`.

    **Arguments:**

    - `make`: the quantity type, called as `make(value, unit)`.

    **Returns:**

    Nothing.
    """
    global _quantity_type
    _quantity_type = make


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _positive_finite(x: Any) -> bool:
    return _finite(x) and float(x) > 0


def _merge(
    a: tuple[tuple[str, Fraction], ...], b: tuple[tuple[str, Fraction], ...], sign: int
) -> tuple[tuple[str, Fraction], ...]:
    exponents = dict(a)
    for symbol, e in b:
        exponents[symbol] = exponents.get(symbol, Fraction(0)) + sign * e
    return tuple((s, e) for s, e in exponents.items() if e != 0)


def si_unit(dimensions: Dimensions) -> Unit:
    """The SI-coherent unit of `dimensions` (scale 1), named by its base units:
    `kg m2 / s2` for energy."""
    return Unit(1.0, dimensions, tuple((d.name, e) for d, e in dimensions.items()))


# Prefixes and the registry of named units (filled at the end of the module) ----------

_PREFIXES = {
    "Q": ("quetta", 1e30), "R": ("ronna", 1e27), "Y": ("yotta", 1e24),
    "Z": ("zetta", 1e21), "E": ("exa", 1e18), "P": ("peta", 1e15),
    "T": ("tera", 1e12), "G": ("giga", 1e9), "M": ("mega", 1e6),
    "k": ("kilo", 1e3), "h": ("hecto", 1e2), "da": ("deca", 1e1),
    "d": ("deci", 1e-1), "c": ("centi", 1e-2), "m": ("milli", 1e-3),
    "u": ("micro", 1e-6), "n": ("nano", 1e-9), "p": ("pico", 1e-12),
    "f": ("femto", 1e-15), "a": ("atto", 1e-18), "z": ("zepto", 1e-21),
    "y": ("yocto", 1e-24), "r": ("ronto", 1e-27), "q": ("quecto", 1e-30),
}  # fmt: skip
_PREFIX_ALIASES = {"µ": "u", "μ": "u"}

# symbol -> Unit; and which symbols take a prefix.
_UNITS: dict[str, Unit] = {}
_ALIASES: dict[str, str] = {}
_PREFIXABLE: set[str] = set()


def _define(
    symbol: str,
    definition: "Unit | Dimensions",
    scale: float = 1.0,
    *,
    names: tuple[str, ...] = (),
    prefixable: bool = True,
    offset: float = 0.0,
) -> None:
    base = si_unit(definition) if isinstance(definition, Dimensions) else definition
    _UNITS[symbol] = Unit(
        scale * base.scale, base.dimensions, ((symbol, Fraction(1)),), offset
    )
    for name in names:
        _ALIASES[name] = symbol
    if prefixable:
        _PREFIXABLE.add(symbol)


_LONG_PREFIXES = {long: short for short, (long, _) in _PREFIXES.items()}


# Names that a prefix rule would read as one unit where common usage means another:
# `hbar` is the reduced Planck constant in pint and in physics texts, and the
# hectobar by SI prefixes (which astropy does not accept either).
_AMBIGUOUS = {
    "hbar": (
        "the reduced Planck constant (pint's reading) or the hectobar (SI prefix h "
        "on bar)? Write 'J s' and multiply by `quax_units.constants.hbar`, or write "
        "'100 bar' for hectobars"
    ),
}


def _lookup(name: str) -> Unit:
    if name in _AMBIGUOUS:
        raise ValueError(f"Ambiguous unit {name!r}: {_AMBIGUOUS[name]}.")
    symbol = _ALIASES.get(name, name)
    if symbol in _UNITS:
        return _UNITS[symbol]
    if name == "dimensionless":
        return Unit(1.0, dimensionless, ())
    for long, short in _LONG_PREFIXES.items():
        rest = name[len(long) :]
        if name.startswith(long) and len(rest) > 3 and rest in _ALIASES:
            return _prefixed(short, _ALIASES[rest], name)
    for prefix in (*_PREFIXES, *_PREFIX_ALIASES):
        rest = name[len(prefix) :]
        if name.startswith(prefix) and rest in _UNITS:
            return _prefixed(_PREFIX_ALIASES.get(prefix, prefix), rest, name)
    raise ValueError(f"Unknown unit {name!r}.")


def _prefixed(prefix: str, symbol: str, name: str) -> Unit:
    if symbol not in _PREFIXABLE:
        raise ValueError(
            f"Unknown unit {name!r}: {symbol!r} does not take SI prefixes."
        )
    base = _UNITS[symbol]
    return Unit(
        _PREFIXES[prefix][1] * base.scale,
        base.dimensions,
        ((prefix + symbol, Fraction(1)),),
    )


# Parsing ------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_%°ΩµμÅ]+)(?P<exp>-?\d+(?:/\d+)?)?"
    r"|(?P<op>\*\*|\^|\*|/|\(|\)|-))"
)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, str | None]] = []
        position, text = 0, text.strip()
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                raise ValueError(
                    f"Cannot parse unit {self.text!r} at {text[position:]!r}."
                )
            kind = match.lastgroup if match.lastgroup != "exp" else "name"
            assert kind is not None
            value = match.group(kind)
            self.tokens.append(
                (kind, value, match.group("exp") if kind == "name" else None)
            )
            position = match.end()
        self.i = 0

    def peek(self) -> tuple[str, str, str | None] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str, str | None]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise ValueError(
                f"Cannot parse unit {self.text!r}: expected {value or 'more'}."
            )
        self.i += 1
        return token

    def parse(self) -> Unit:
        if not self.tokens:
            return Unit(1.0, dimensionless, ())
        out = self.product()
        extra = self.peek()
        if extra is not None:
            raise ValueError(
                f"Cannot parse unit {self.text!r}: unexpected {extra[1]!r}."
            )
        return out

    def product(self) -> Unit:
        out = self.power()
        while (token := self.peek()) is not None:
            if token[1] == "*":
                self.take()
                out = out * self.power()
            elif token[1] == "/":
                self.take()
                out = out / self.power()
            elif token[0] in ("num", "name") or token[1] == "(":
                out = out * self.power()
            else:
                break
        return out

    def power(self) -> Unit:
        base = self.factor()
        token = self.peek()
        if token is not None and token[1] in ("**", "^"):
            self.take()
            parenthesised = self.peek() is not None and self.peek()[1] == "("  # type: ignore[index]
            exponent = self.exponent()
            following = self.tokens[self.i : self.i + 2]
            if (
                not parenthesised
                and len(following) == 2
                and following[0][1] == "/"
                and following[1][0] == "num"
            ):
                # `Hz^1/2` is `Hz^(1/2)` to a reader of `nV/Hz^1/2`, and
                # `(Hz^1) / 2` by the precedence of `**` in Python; the inline
                # exponent `Hz1/2` is the power 1/2. Neither reading is safe.
                name = str(base) if len(base.terms) == 1 else f"({base})"
                divisor = following[1][1]
                raise ValueError(
                    f"Cannot parse unit {self.text!r}: the exponent {exponent} "
                    f"followed by '/ {divisor}' reads both as the power "
                    f"{exponent}/{divisor} and as the power {exponent} divided by "
                    f"{divisor}. Write '{name}^({exponent}/{divisor})' for the "
                    f"power, or '({name}^{exponent}) / {divisor}' for the division."
                )
            return base**exponent
        return base

    def exponent(self) -> Fraction:
        if self.peek() is not None and self.peek()[1] == "(":  # type: ignore[index]
            self.take("(")
            sign = -1 if self._minus() else 1
            value = self._number()
            if self.peek() is not None and self.peek()[1] == "/":  # type: ignore[index]
                self.take("/")
                value = self._ratio(value, self._number())
            self.take(")")
            return sign * value
        sign = -1 if self._minus() else 1
        return sign * self._number()

    def _number(self) -> Fraction:
        kind, value, _ = self.take()
        if kind != "num":
            raise ValueError(
                f"Cannot parse unit {self.text!r}: expected a number, got {value!r}."
            )
        return Fraction(value)

    def _ratio(self, numerator: Fraction, denominator: Fraction) -> Fraction:
        if denominator == 0:
            raise ValueError(
                f"Cannot parse unit {self.text!r}: the exponent {numerator}/0 divides "
                "by zero. Write a nonzero denominator, e.g. 'm**(1/2)'."
            )
        return numerator / denominator

    def _minus(self) -> bool:
        if self.peek() is not None and self.peek()[1] == "-":  # type: ignore[index]
            self.take()
            return True
        return False

    def factor(self) -> Unit:
        kind, value, exp = self.take()
        if kind == "num":
            if not _positive_finite(value):
                problem = "zero" if float(value) == 0 else "out of a float's range"
                raise ValueError(
                    f"Cannot parse unit {self.text!r}: its factor {value} is "
                    f"{problem}, and a unit is a finite number > 0 of SI-coherent "
                    "units."
                )
            return Unit(
                float(value),
                dimensionless,
                ((value, Fraction(1)),) if float(value) != 1 else (),
            )
        if kind == "name":
            named = _lookup(value)
            if not exp:
                return named
            numerator, _, denominator = exp.partition("/")
            power = Fraction(numerator)
            if denominator:
                power = self._ratio(power, Fraction(denominator))
            return named**power
        if value == "(":
            out = self.product()
            self.take(")")
            return out
        raise ValueError(f"Cannot parse unit {self.text!r}: unexpected {value!r}.")


UnitLike = Unit | str | Dimension | Mapping[Dimension, Any]


def unit(u: UnitLike) -> Unit:
    """Make a `Unit`.

    ```python
    unit("km / s")          # parsed; SI prefixes, derived and common non-SI units
    unit("kg m2 s-2")       # exponents after the symbol, astropy-style
    unit("m**(1/2)")        # or with ** / ^, rational exponents in parentheses
    unit(meters)            # a Dimension or {Dimension: exponent}: its SI unit
    ```

    **Arguments:**

    - `u`: a `Unit`, a string, a `Dimension`, or a mapping from `Dimension` to
        exponent.

    **Returns:**

    The `Unit`. An unknown name raises `ValueError`.
    """
    if isinstance(u, Unit):
        return u
    if isinstance(u, str):
        return _Parser(u).parse()
    if isinstance(u, Dimension | Mapping):
        return si_unit(as_dimensions(u))
    raise TypeError(f"Expected a unit (Unit, str, Dimension or mapping), got {u!r}.")


def conversion_factor(source: Unit, target: Unit) -> float:
    """The factor turning numbers in `source` into numbers in `target`, once
    offsets are removed (see `Unit`)."""
    if source.dimensions != target.dimensions:
        raise UnitError(
            f"Cannot convert from {source} ({source.dimensions}) to {target} "
            f"({target.dimensions}): the dimensions differ."
        )
    return source.scale / target.scale


# The unit table ---------------------------------------------------------------------

_define("m", Dimensions({meters: 1}), names=("meter", "metre", "meters", "metres"))
_define("g", Dimensions({kilograms: 1}), 1e-3, names=("gram", "grams"))
_define("s", Dimensions({seconds: 1}), names=("second", "seconds", "sec"))
_define("A", Dimensions({amperes: 1}), names=("ampere", "amperes"))
_define("K", Dimensions({kelvins: 1}), names=("kelvin",))
_define("mol", Dimensions({moles: 1}), names=("mole", "moles"))
_define("cd", Dimensions({candelas: 1}), names=("candela",))
# Angles are dimensionless, as in SI; values are held in radians.
_define("rad", dimensionless, names=("radian", "radians"))
_define("sr", dimensionless, names=("steradian",))
_define("Hz", unit("1 / s"), names=("hertz",))
_define("N", unit("kg m / s2"), names=("newton", "newtons"))
_define("Pa", unit("N / m2"), names=("pascal",))
_define("J", unit("N m"), names=("joule", "joules"))
_define("W", unit("J / s"), names=("watt", "watts"))
_define("C", unit("A s"), names=("coulomb",))
_define("V", unit("W / A"), names=("volt", "volts"))
_define("F", unit("C / V"), names=("farad",))
_define("ohm", unit("V / A"), names=("Ω", "ohms"))
_define("S", unit("A / V"), names=("siemens",))
_define("Wb", unit("V s"), names=("weber",))
_define("T", unit("Wb / m2"), names=("tesla",))
_define("H", unit("Wb / A"), names=("henry",))
_define("lm", unit("cd sr"), names=("lumen",))
_define("lx", unit("lm / m2"), names=("lux",))
_define("Bq", unit("1 / s"), names=("becquerel",))
_define("Gy", unit("J / kg"), names=("gray",))
_define("Sv", unit("J / kg"), names=("sievert",))
_define("kat", unit("mol / s"), names=("katal",))
_define("L", unit("dm3"), names=("l", "liter", "litre", "liters", "litres"))
_define("eV", unit("J"), CONSTANTS["e"].value, names=("electronvolt", "electron_volt"))
_define("bar", unit("Pa"), 1e5)
_define("cal", unit("J"), 4.184, names=("calorie",))
_define("erg", unit("J"), 1e-7)
_define("dyn", unit("N"), 1e-5, names=("dyne",))
# Astronomy: the parsec of IAU 2015 Resolution B2, the Julian year (365.25 days, the
# IAU's year: `Myr`, `Gyr`), and the nominal solar, Earth and Jupiter values of IAU
# 2015 Resolution B3 (masses: nominal mass parameter / G), as in astropy.
_define("pc", unit("m"), CONSTANTS["pc"].value, names=("parsec",))
_define("yr", unit("s"), 365.25 * 86400.0, names=("year", "years"))
_define(
    "Msun",
    unit("kg"),
    CONSTANTS["M_sun"].value,
    names=("solMass", "M_sun"),
    prefixable=False,
)
_define(
    "Rsun",
    unit("m"),
    CONSTANTS["R_sun"].value,
    names=("solRad", "R_sun"),
    prefixable=False,
)
_define(
    "Lsun",
    unit("W"),
    CONSTANTS["L_sun"].value,
    names=("solLum", "L_sun"),
    prefixable=False,
)
_define(
    "Mearth",
    unit("kg"),
    CONSTANTS["M_earth"].value,
    names=("earthMass", "M_earth"),
    prefixable=False,
)
_define(
    "Mjup",
    unit("kg"),
    CONSTANTS["M_jup"].value,
    names=("jupiterMass", "M_jup"),
    prefixable=False,
)
_define("min", unit("s"), 60.0, names=("minute", "minutes"), prefixable=False)
_define("h", unit("s"), 3600.0, names=("hr", "hour", "hours"), prefixable=False)
_define("d", unit("s"), 86400.0, names=("day", "days"), prefixable=False)
_define(
    "deg",
    unit("rad"),
    math.pi / 180,
    names=("°", "degree", "degrees"),
    prefixable=False,
)
_define("arcmin", unit("rad"), math.pi / 10800, names=("arcminute",), prefixable=False)
_define("arcsec", unit("rad"), math.pi / 648000, names=("arcsecond",), prefixable=False)
_define(
    "au",
    unit("m"),
    CONSTANTS["au"].value,
    names=("AU", "astronomical_unit"),
    prefixable=False,
)
_define(
    "lyr", unit("m"), 9.4607304725808e15, names=("ly", "lightyear"), prefixable=False
)
_define("Angstrom", unit("m"), 1e-10, names=("Å", "angstrom"), prefixable=False)
_define("atm", unit("Pa"), 101325.0, names=("atmosphere",), prefixable=False)
_define("inch", unit("m"), 0.0254, names=("in", "inches"), prefixable=False)
_define("ft", unit("m"), 0.3048, names=("foot", "feet"), prefixable=False)
_define("mi", unit("m"), 1609.344, names=("mile", "miles"), prefixable=False)
_define("lb", unit("kg"), 0.45359237, names=("pound",), prefixable=False)
_define("percent", dimensionless, 0.01, names=("%",), prefixable=False)
# Temperatures on other scales: absolute ones (offset units, as in pint) and the
# units of their differences.
_define(
    "degC",
    unit("K"),
    offset=273.15,
    names=("°C", "celsius", "degree_Celsius"),
    prefixable=False,
)
_define(
    "degF",
    unit("K"),
    5 / 9,
    offset=273.15 - 32 * 5 / 9,
    names=("°F", "fahrenheit", "degree_Fahrenheit"),
    prefixable=False,
)
_define("delta_degC", unit("K"), prefixable=False)
_define("delta_degF", unit("K"), 5 / 9, prefixable=False)
_define("degR", unit("K"), 5 / 9, names=("rankine", "°R"), prefixable=False)
