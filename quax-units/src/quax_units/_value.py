"""`Quantity` (also `Unitful`): an array with units, and the functions to make and
read one."""

import functools as ft
import math
import operator
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import quax
from jaxtyping import ArrayLike

from ._dimensions import Dimensions, UnitError, dimensionless
from ._strip import _check_dimensions, strip_p
from ._systems import UnitSystem, unit_system
from ._units import (
    Unit,
    UnitLike,
    conversion_factor,
    set_quantity_type,
    si_unit,
    unit,
)


__all__ = [
    "UnitsMaterialisationError",
    "Quantity",
    "Unitful",
    "fits_any_unit",
    "make",
    "ustrip",
]


class UnitsMaterialisationError(UnitError, quax.MaterialisationError):
    """A `Quantity` with dimensions refused to become a plain array: turning it
    into its numbers would drop its units. Raised by `materialise()` and by a
    primitive that has no rule for quantities, unless the quantity allows it
    (`allow_materialise=True`, `.enable_materialise()`).

    Its message starts with "Refusing to materialise `Quantity`". It is a
    [`quax_units.UnitError`][] (a `TypeError`), as the family's refusals always
    were, and a [`quax.MaterialisationError`][] (a `RuntimeError`), as every
    family's refusal is.
    """


class DisplayUnit:
    """The unit a `Quantity` is shown in: a presentation hint, not part of its identity.

    All display units compare equal (and hash alike), so values that differ only in
    their display unit (`m` and `km`) have the same pytree structure: a jitted function
    compiles once for both. The numbers never depend on it, since a `Quantity` holds
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


@ft.cache
def _quaxified(op: Callable[..., Any]) -> Any:
    """`quax.quaxify(op)`, made once per operator."""
    return quax.quaxify(op)


def _unary(op: Callable[[Any], Any]) -> Any:
    quaxified = quax.quaxify(op)

    def method(self: "Quantity") -> Any:
        return quaxified(self)

    method.__name__ = f"__{op.__name__.strip('_')}__"
    return method


class Quantity(quax.OperatorMethods, quax.GuardedValue):
    """An array with physical units, for `quax.quaxify`.

    ```python
    v = Quantity(jnp.array([3.0, 4.0]), "km / h")            # any unit
    x = Unitful(jnp.array([1.0, 2.0]), meters)              # published quax API
    isinstance(x, Quantity)                                  # True: the same class
    ```

    `Quantity` is a class: `isinstance(q, Quantity)` works, and so does `x: Quantity`
    as the annotation of a rule. `Unitful` is the same class under the name of the
    published quax example, whose `Unitful(array, units)` takes `units` as a
    `Dimension` or a mapping from `Dimension` to exponent (the SI unit of those
    dimensions).

    The array is held in SI-coherent units (`.array` of `Quantity(1.0, "km")` is
    `1000.0`), and the dimensions (`.units`) are a static field: they are part of the
    pytree structure, checked when a program is traced and free when it runs. The unit
    a value was made in is kept only for display (`.unit`), so `m` and `km` inputs
    share one compilation. Unit errors (adding metres to seconds, the sine of a length)
    raise [`quax_units.UnitError`][] at trace time.

    Outside `quax.quaxify`, Python operators work too (`q1 + q2`, `q * 2`,
    `q ** 2`, `q < q2`, `q[0]`, `len(q)`): each runs `quax.quaxify` on the operator,
    so the same rules give the units. Inside a quaxified function, use `jax.numpy`.

    A quantity is not an array: `jnp.asarray(q)` and `np.asarray(q)` of a quantity
    with dimensions raise [`quax_units.UnitError`][] (strip the units with
    [`quax_units.ustrip`][] or `q.to_value(unit)`); a dimensionless one converts to
    its numbers (`Quantity(50.0, "%")` to `0.5`).

    **Arguments:**

    - `value`: the numbers, measured in `unit`.
    - `unit`: a `Unit`, a string such as `"m / s2"`, a `Dimension` or a mapping from
        `Dimension` to exponent (default: dimensionless).
    - `display`: the unit to show the value in (default: `unit`); it must have the
        same dimensions.
    - `allow_materialise`: whether the quantity may drop its units and become its
        SI-coherent numbers: in `materialise()`, and for a primitive without a rule
        for quantities, which then runs on the numbers (default: refuse, with a
        [`quax_units.UnitsMaterialisationError`][]). A dimensionless quantity is a
        number: it always may, and its flag is `True` whatever is passed. See
        `enable_materialise`.

    It follows the core's materialisation policy ([`quax.GuardedValue`][]).
    """

    array: ArrayLike
    units: Dimensions = eqx.field(static=True)
    display: DisplayUnit = eqx.field(static=True)
    # The aval is the array's (with its weak type, as for the dense numbers): quax
    # reads it without calling `aval`, which stays as the reference.
    aval_leaf: ClassVar[str] = "array"

    def __init__(
        self,
        value: ArrayLike,
        unit: UnitLike = dimensionless,
        display: "DisplayUnit | UnitLike | None" = None,
        *,
        allow_materialise: bool = False,
    ) -> None:
        u = _checked(_to_unit, unit, "unit")
        shown = _checked(_as_display, u if display is None else display, "display")
        given = value
        try:
            value = jnp.asarray(value)
        except (TypeError, ValueError) as e:
            raise ValueError(
                "Quantity needs numbers as its `value` (an array, a scalar or nested "
                f"lists of them), got {value!r}: {e}"
            ) from None
        if shown.unit is not None and shown.unit.dimensions != u.dimensions:
            raise UnitError(
                f"Display unit {shown.unit} ({shown.unit.dimensions}) does not have "
                f"the dimensions of the value ({u.dimensions})."
            )
        self.array = _to_si(value, u)
        if u.scale != 1.0 and not isinstance(self.array, jax.core.Tracer):
            _check_in_range(given, value, self.array, u)
        self.units = u.dimensions
        self.display = shown
        self.allow_materialise = bool(allow_materialise) or u.is_dimensionless
        if u.scale != 1.0 or u.offset:
            magnitude = jnp.asarray(value)
            if not isinstance(magnitude, jax.core.Tracer):
                _remember_given(self, magnitude, u)

    # A quantity is its array times its units: linear in its leaves, so the tangents
    # of `custom_jvp` functions keep its units, and the cotangents of `custom_vjp`
    # functions are per its units (`cotangent`).
    linear_in_leaves: ClassVar[bool] = True
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        UnitsMaterialisationError
    )

    # NumPy arrays defer to these operators instead of broadcasting over the object.
    __array_ufunc__ = None

    def _binary_operator(
        self, op: Callable[[Any, Any], Any], other: Any, reflected: bool
    ) -> Any:
        """Python's operators (`+`, `-`, `@`, comparisons, ... from
        `quax.OperatorMethods`), run through `quax.quaxify` so that the rules decide
        their units (and raise their unit errors); operands other than quantities,
        arrays and numbers are declined."""
        if not isinstance(other, (Quantity, *_OPERAND)):
            return NotImplemented
        run = _quaxified(op)
        return run(other, self) if reflected else run(self, other)

    __neg__ = _unary(operator.neg)
    __pos__ = _unary(operator.pos)
    __abs__ = _unary(operator.abs)
    __hash__ = None  # type: ignore[assignment]  # `==` is elementwise, as for arrays

    def __getitem__(self, index: Any) -> "Quantity":
        return quax.quaxify(lambda x: x[index])(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d quantity")
        return self.shape[0]

    def __iter__(self) -> Iterator["Quantity"]:
        return (self[i] for i in range(len(self)))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # `np.asarray(q)` and `jnp.asarray(q)` both come here.
        if self.units.is_dimensionless:
            return np.asarray(self.array, dtype=dtype)
        raise UnitError(
            f"Converting a quantity in {self.unit} ({self.units}) to an array "
            "(`jnp.asarray`, `np.asarray`) would drop its units. Take its numbers "
            "in a unit of your choice with "
            f"`quax_units.ustrip(unit, q)` or `q.to_value(unit)` (e.g. "
            f"`q.to_value({str(self.unit)!r})`)."
        )

    @classmethod
    def lift(cls, array: ArrayLike, like: "Quantity") -> "Quantity | None":
        """`array` as a value of `like`'s units, when a plain array must join a
        `Quantity` (a loop carry or branch output that is plain on one side).

        Quax-core calls this, e.g. for the zero cotangent a reverse-mode loop starts
        its carry with. A plain array counts as dimensionless, so it is lifted when
        `like` is dimensionless or when it fits any unit (a constant of zeros,
        infinities or NaNs); otherwise joining it would be a unit error, and this
        returns `None` (quax-core then reports the join as failed).

        **Arguments:**

        - `array`: the plain array.
        - `like`: the `Quantity` it is joined with.

        **Returns:**

        A `Quantity` with `like`'s dimensions and display unit, or `None`.
        """
        if like.units.is_dimensionless or fits_any_unit(array):
            return make(array, like.units, like.display.unit)
        return None

    def cotangent(self, bar: "Quantity") -> "Quantity":
        """The cotangent of this quantity in a `custom_vjp` rule: its leaf's
        cotangent per this quantity's units (`1 / m` for a length), as reverse mode
        gives cotangents inside `quax.quaxify` (see `quax.Value.cotangent`).

        A rule mixes cotangents with residuals: diffrax's adjoint of `y' = -k y`
        takes `sum(ct * y)` as the cotangent of a plain `k`, dimensionless only with
        `ct` per metre. The numbers are the leaf's cotangent, unchanged: the
        cotangent of the SI-coherent numbers.

        **Arguments:**

        - `bar`: a quantity with this one's units, holding the leaf's cotangent.

        **Returns:**

        The same numbers, in units of one over this quantity's.
        """
        per = dimensionless / self.units
        return make(bar.array, per, si_unit(per))

    def aval(self) -> jax.core.ShapedArray:
        return jax.typeof(self.array)  # pyright: ignore[reportReturnType]

    def dense(self) -> Any:
        """The numbers in SI-coherent units (`.array`), without the units."""
        return self.array

    def refusal_reason(self) -> str:
        return (
            f"turning a quantity in {self.unit} ({self.units}) into a plain array "
            "would drop its units"
        )

    def way_out(self, primitive: Any = None) -> str:
        allow = (
            "allow it with `q.enable_materialise()` (`allow_materialise=True`), "
            "which gives the SI-coherent numbers"
        )
        if primitive is None:
            return (
                "Strip the units explicitly with `quax_units.ustrip(unit, q)`, keep "
                f"the units unchanged here, or {allow}."
            )
        return (
            "Strip the units first with `quax_units.ustrip(unit, q)` (and reattach "
            f"them with `quax_units.Quantity`), register a rule for "
            f"`{primitive.name}` with `quax.register`, or {allow} (to run it on them)."
        )

    @property
    def unit(self) -> Unit:
        """The unit the value is shown in."""
        return self.display.unit or si_unit(self.units)

    @property
    def value(self) -> Any:
        """The numbers in the display unit (`.array` is in SI-coherent units).

        For a quantity made by `Quantity(value, unit)` (or converted from one with
        `.to`), they are computed from the numbers it was given, so they come back
        exactly: `Quantity(3.0, "km").value` is `3.0`, and
        `Quantity(20.0, "degC").to("degF").value` is `68.0`. For a computed one
        (the output of a rule or of `jax.jit`), from its SI-coherent array.
        """
        return self.to_value(self.unit)

    def to(self, u: UnitLike) -> "Quantity":
        """The same quantity, shown in unit `u` (which must have the same dimensions).

        **Arguments:**

        - `u`: the unit, e.g. `"km / h"`.

        **Returns:**

        A `Quantity` with the same array and pytree structure, displayed in `u`.
        """
        target = unit(u)
        conversion_factor(si_unit(self.units), target)
        out = make(self.array, self.units, target)
        given = _given.get(id(self))
        if given is not None:
            _remember_given(out, *given)
        return out

    def decompose(self, system: UnitSystem | str = "si") -> "Quantity":
        """The same quantity, shown in the units of a unit system: the product of
        its base units (`kpc / Myr` for a velocity in `galactic`, `g cm2 / s2` for
        an energy in `cgs`, `kg m2 / s2` in SI), as astropy's and unxt's
        `decompose`.

        ```python
        Quantity(1.0, "kpc / Myr").decompose("si")  # 977792.2... m / s
        constants.G.decompose(galactic)  # 4.4985...e-12 kpc3 / (Msun Myr2)
        ```

        **Arguments:**

        - `system`: a [`quax_units.UnitSystem`][], or the name of one: `"si"`
            (default), `"cgs"` or `"galactic"`.

        **Returns:**

        A `Quantity` with the same array and pytree structure (the array is held
        in SI-coherent units whatever the display), shown in the system's unit:
        `.value` gives its numbers there.
        """
        return self.to(unit_system(system).unit_for(self.units))

    def to_value(self, u: UnitLike) -> Any:
        """The numbers of this quantity in unit `u`; see [`quax_units.ustrip`][]."""
        return ustrip(u, self)

    def __repr__(self) -> str:
        if isinstance(self.array, jax.core.Tracer):
            numbers = self.aval().str_short()
        elif isinstance(self.array, jax.ShapeDtypeStruct):
            # A shape (`jax.eval_shape`'s output): no numbers to convert.
            numbers = repr(self.array)
        else:
            numbers = repr(self.value)
        return f"Quantity({numbers}, unit={str(self.unit)!r})"


set_quantity_type(Quantity)  # `number * unit` makes a quantity

Unitful = Quantity
"""The published quax example's name of [`quax_units.Quantity`][] (the same class):
`Unitful(array, units)` with `units` a `Dimension` or a mapping from `Dimension` to
exponent."""


# The numbers a quantity was made with, in the unit it was made in, by `id` of the
# quantity (while it lives): to read them back exactly (see `Quantity.value`). Kept
# out of the quantity itself, as an attribute would change its pytree structure.
# Anything computed (by a rule, `jax.jit`, `jax.tree.map`, a copy) is a new object
# and reads its numbers from its SI-coherent array.
_given: dict[int, tuple[Any, Unit]] = {}


def _remember_given(q: Quantity, magnitude: Any, u: Unit) -> None:
    _given[id(q)] = (magnitude, u)
    weakref.finalize(q, _given.pop, id(q), None)


def make(array: Any, dims: Dimensions, shown: Unit | None) -> Quantity:
    """A `Quantity` from its SI-coherent array, without the checks of `__init__`:
    what rules return, on quax's hot path."""
    out = object.__new__(Quantity)
    object.__setattr__(out, "array", array)
    object.__setattr__(out, "units", dims)
    object.__setattr__(out, "display", DisplayUnit(shown))
    object.__setattr__(out, "allow_materialise", dims.is_dimensionless)
    return out


def fits_any_unit(x: Any) -> bool:
    """Whether a plain operand is a constant known at trace time that fits any unit:
    all zeros, infinities or NaNs (as in `jnp.where(x > 0, x, 0)` inside `jnp`)."""
    if isinstance(x, Quantity):
        return False
    # Through `quax.known_scale_invariant`, which also sees a traced product with
    # zeros (`dt * jnp.zeros_like(y)`, where a solver starts from zeros) as one.
    # Where quax compiles eager code, a plain operand computed from a quantity's
    # numbers is traced, and the code runs equation by equation instead, where it
    # is known.
    return quax.known_scale_invariant(x, np.size(x))


def describe(x: Any) -> str:
    """How an operand is named in error messages: its unit and dimensions."""
    if isinstance(x, Quantity):
        return f"{str(x.unit) or 'dimensionless'} [{x.units}]"
    return f"plain array {jax.typeof(x).str_short()} [dimensionless]"


def _to_si(value: ArrayLike, u: Unit) -> Any:
    """`value`, measured in `u`, in SI-coherent units of `u`'s dimensions."""
    array = jnp.asarray(value)
    if u.scale != 1.0 or u.offset:
        if not jnp.issubdtype(array.dtype, jnp.inexact):
            array = array.astype(jnp.result_type(float))
        if u.scale != 1.0:
            array = scaled(array, u.scale)
        if u.offset:
            array = array + u.offset
    return array


def scaled(array: Any, factor: float, *, divide: bool = False) -> Any:
    """`array * factor` (or `array / factor`), in the array's floating dtype, also
    where `factor` is out of that dtype's range.

    The factors between units of different systems can be: a joule is 5.3e-43
    `Msun kpc2 / Myr2`, beyond float32's range (1.2e-38 to 3.4e38), where a single
    multiplication would give 0 or infinity for numbers that the dtype holds at both
    ends (1e30 J is 5.3e-13 of the galactic unit). Then the factor is split into a
    mantissa in range and a power of two (`math.frexp`), and each number into its
    own (`jnp.frexp`): the mantissas are multiplied (one rounding, as a single
    product would round) and the powers of two added as integers, exactly. No
    constant is left for XLA to fold into one out of range (as it folds `x * a * b`
    into `x * (a * b)`), so no optimisation barrier is needed, which TPUs cannot
    compile. It is a linear map with its own transpose (`lax.custom_linear_solve`),
    so `jvp`, `grad` and `vmap` go through it as through a product. The range is the
    one the dtype holds on JAX's default backend (`held_range`): on a TPU, float64's
    is float32's.
    """
    dtype = jnp.result_type(array)
    if jnp.issubdtype(dtype, jnp.inexact):
        tiny, largest = held_range(dtype)
        if not tiny <= factor <= largest:
            if float64_emulated(dtype):
                return _scaled_in_two_steps(array, factor, divide)
            return jax.lax.custom_linear_solve(
                lambda y: _exactly_scaled(y, factor, not divide),
                jnp.asarray(array),
                lambda _, b: _exactly_scaled(b, factor, divide),
                symmetric=True,
            )
    return array / factor if divide else array * factor


def _scaled_in_two_steps(array: Any, factor: float, divide: bool) -> Any:
    """`array * factor` (or `/`) in float64 on a platform that emulates float64 with
    pairs of float32 numbers (a TPU), for a `factor` out of float32's range: there
    `jnp.frexp` of a float64 does not compile ("Binary op and with different element
    types: s32 and u32", TPU v5e), so `_exactly_scaled` cannot run. Two products
    by factors in range instead, a power of two and the rest: where the result is in
    range, so is the number between the two products (it lies between the number
    and the result). The TPU's compiler does not fold the two constants into one out
    of range (seen on a TPU v5e, JAX 0.10.2: 1e30 J in `Msun kpc2 / Myr2` gave
    5.26018397e-13). A division is a product with the reciprocal (a division by
    both steps gave 1e-30 J in those units to 3e-9 there; products to 1e-12).
    Two roundings, not one; where a factor is beyond what two
    steps in range make, no result is in range, and one product gives it."""
    if divide:  # by products with reciprocals: the emulation's division is coarser
        factor = 1 / factor
    mantissa, power = math.frexp(factor)
    first = 2.0 ** (power // 2)
    second = mantissa * 2.0 ** (power - power // 2)
    tiny, largest = held_range(jnp.float32)
    if not (tiny <= first <= largest and tiny <= second <= largest):
        return array * factor
    return array * first * second


def _exactly_scaled(array: Any, factor: float, divide: bool) -> Any:
    """`array * factor` (or `/`) for a `factor` of any size: the numbers'
    mantissas times the factor's, rounded once, their powers of two summed as
    integers (see `scaled`)."""
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        return jax.lax.complex(
            _exactly_scaled(jnp.real(array), factor, divide),
            _exactly_scaled(jnp.imag(array), factor, divide),
        )
    mantissa, power = math.frexp(factor)  # factor = mantissa * 2**power
    if divide:  # by a mantissa in [1, 2), so that the quotient is in (0.25, 1)
        mantissa, power = 2 * mantissa, 1 - power
    numbers, exponents = jnp.frexp(array)  # in [0.5, 1) where finite and nonzero
    product = numbers / mantissa if divide else numbers * mantissa
    fraction, extra = jnp.frexp(product)
    out = _times_power_of_two(fraction, exponents + extra + power)
    # Zeros, infinities and NaNs (which `jnp.frexp` returns as they are) give
    # what a product gives: so do subnormal numbers on backends that read them
    # as zeros (XLA's CPU, GPU and TPU backends flush them).
    return jnp.where((array == 0) | ~jnp.isfinite(array), product, out)


def _times_power_of_two(fraction: Any, exponent: Any) -> Any:
    """`fraction * 2**exponent` for `fraction` in [0.5, 1) (in magnitude) and an
    integer array `exponent`, built from the bits: the exponent field set where
    the result is normal, infinity above the dtype's range, and below it a
    normal number scaled down by a constant power of two (rounding once to the
    subnormal numbers, or to zero)."""
    finfo = jnp.finfo(fraction.dtype)
    bits = jnp.dtype(f"int{8 * fraction.dtype.itemsize}")
    step = finfo.nmant + 2  # what lifts every nonzero subnormal result to normal
    low = exponent < finfo.minexp
    shifted = jnp.where(low, exponent + step, exponent).astype(bits)
    # `fraction`'s exponent field stands for 2**-1: adding `shifted` to it gives
    # `fraction * 2**shifted` wherever that is normal.
    out = jax.lax.bitcast_convert_type(
        jax.lax.bitcast_convert_type(fraction, bits)
        + jax.lax.shift_left(shifted, jnp.asarray(finfo.nmant, bits)),
        fraction.dtype,
    )
    out = jnp.where(low, out * jnp.asarray(2.0**-step, fraction.dtype), out)
    out = jnp.where(exponent + step < finfo.minexp, jnp.copysign(0, fraction), out)
    return jnp.where(exponent > finfo.maxexp, jnp.copysign(jnp.inf, fraction), out)


# The platforms whose hardware has no float64 arithmetic, where XLA emulates float64
# with pairs of float32 numbers: their float64 holds float32's exponent range. Seen on
# a TPU v5e (JAX 0.10.2): `Quantity(1e12, "Msun")` in float64 (1.99e42 kg) was held as
# NaN and 1.05e-39 as 0, where the CPU holds both.
_FLOAT64_IN_FLOAT32_RANGE = frozenset({"tpu"})


def held_range(dtype: Any, platform: str | None = None) -> tuple[float, float]:
    """The smallest normal number and the largest finite number that arrays of
    `dtype` hold on `platform`.

    **Arguments:**

    - `dtype`: a floating or complex dtype.
    - `platform`: `"cpu"`, `"gpu"`, `"tpu"`, ...; JAX's default backend where
        `None`.

    **Returns:**

    `jnp.finfo(dtype)`'s `tiny` and `max`, but float32's for float64 and complex128
    on a platform that emulates float64 with pairs of float32 numbers (a TPU: see
    `float64_emulated`).
    """
    finfo = jnp.finfo(jnp.float32 if float64_emulated(dtype, platform) else dtype)
    return float(finfo.tiny), float(finfo.max)


def float64_emulated(dtype: Any, platform: str | None = None) -> bool:
    """Whether `dtype` is float64 or complex128 and `platform` (JAX's default backend
    where `None`) emulates float64 with pairs of float32 numbers, which hold
    float32's range (a TPU)."""
    return (
        jnp.finfo(dtype).bits == 64
        and (platform or jax.default_backend()) in _FLOAT64_IN_FLOAT32_RANGE
    )


def _platform_of(array: Any) -> str:
    """The platform that the concrete `array` is on."""
    return next(iter(array.devices())).platform


@jax.jit
def _leaves_range(value: Any, array: Any, tiny: Any, most: Any) -> Any:
    """Whether a finite number of `value` is out of `array`'s normal range there
    (from `tiny` to `most`, its `held_range`): not finite (infinite, or NaN where XLA
    emulates the dtype), above `most`, or (a nonzero one) below `tiny`, where it
    keeps fewer digits or is 0 (one dispatch)."""
    finite = jnp.isfinite(value)
    overflow = ~(jnp.abs(array) <= most) & finite
    underflow = (jnp.abs(array) < tiny) & (value != 0) & finite
    return jnp.any(overflow | underflow)


def _cannot_leave_range(
    value_dtype: Any, held: tuple[float, float], factor: float
) -> bool:
    """Whether every number of `value_dtype`, times `factor`, is finite and (if
    nonzero) normal in the range `held` (a dtype's `held_range`): booleans and
    integers (`int32` up to 2.1e9, or as small as 1) converted to a float array, for
    the factors of most units. (Floats keep their dtype, where the largest ones
    overflow and the smallest underflow.)"""
    if not (
        jnp.issubdtype(value_dtype, jnp.bool_)
        or jnp.issubdtype(value_dtype, jnp.integer)
    ):
        return False
    tiny, most = held
    # With a margin for the rounding of the product and of `factor` in `dtype`.
    if factor * (1 - 1e-6) < tiny:
        return False
    if jnp.issubdtype(value_dtype, jnp.bool_):
        return factor * (1 + 1e-6) < most
    info = jnp.iinfo(value_dtype)
    largest = max(abs(int(info.min)), int(info.max))
    return largest * factor * (1 + 1e-6) < most


def _check_in_range(given: Any, value: Any, array: Any, u: Unit) -> None:
    """Refuse finite numbers in `u` that are out of their dtype's normal range in
    SI-coherent units: `1e12 Msun` is 2e42 kg, beyond float32's 3.4e38, where the
    array would hold infinities; `3 ns` is 3e-9 s, below float16's smallest normal
    number 6.1e-5, where the array would hold 0 (and `100 ns` a subnormal 1.19e-7
    s, read back as 119 ns). The range is the one the dtype holds on the array's
    platform (`held_range`): on a TPU, float64 holds float32's.

    Reading whether any number left the range waits for the device: it is skipped
    where no number of the given dtype can (integers, for most factors), and done
    on the host where the numbers were given there (NumPy arrays, Python numbers)
    and one multiplication converts them, as `scaled` does for a factor in the
    dtype's range. Otherwise the device computes it in one dispatch.
    """
    dtype = jnp.result_type(array)
    platform = _platform_of(array)
    tiny, most = held_range(dtype, platform)
    if _cannot_leave_range(jnp.result_type(value), (tiny, most), u.scale):
        return
    if isinstance(given, np.ndarray | np.generic | int | float) and (
        tiny <= u.scale <= most
    ):
        numbers = np.asarray(given).astype(dtype)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            product = np.abs(numbers * dtype.type(u.scale))
            finite = np.isfinite(numbers)
            out = ~(product <= most) & finite
            out |= (product < tiny) & (numbers != 0) & finite
    else:
        out = _leaves_range(value, array, tiny, most)
    if not bool(np.any(out)):
        return
    emulated = fix = ""
    if float64_emulated(dtype, platform):
        emulated = (
            f" on a {platform}, where XLA emulates {dtype} with pairs of float32 "
            "numbers, which hold float32's range"
        )
        fix = (
            "compute with such values on the CPU (`with jax.default_device("
            "jax.devices('cpu')[0]):`), or give them in a form that stays in range "
            "(their logarithm, or a plain array in the unit you read them in)."
        )
    if u.scale > 1.0:
        raise ValueError(
            f"Quantity: numbers in {u} out of {dtype}'s range once held in "
            f"SI-coherent units ({si_unit(u.dimensions)}, {u.scale:.6g} per {u}; "
            f"{dtype} holds at most {most:.6g}{emulated}), which would "
            "be infinite. A Quantity holds its array in SI-coherent units: "
            + (
                fix
                or "use float64 (`jax.config.update('jax_enable_x64', True)` and "
                "float64 numbers) for such values."
            )
        )
    raise ValueError(
        f"Quantity: nonzero numbers in {u} below {dtype}'s normal range once held "
        f"in SI-coherent units ({si_unit(u.dimensions)}, {u.scale:.6g} per {u}; "
        f"{dtype}'s smallest normal number is {tiny:.6g}{emulated}), where they "
        "would keep fewer digits or be 0. A Quantity holds its array in SI-coherent "
        "units: "
        + (
            fix
            or "use a wider dtype (float32, or float64 with "
            "`jax.config.update('jax_enable_x64', True)`) for such values."
        )
    )


def _to_unit(u: UnitLike) -> Unit:
    return u if isinstance(u, Unit) else unit(u)


def _checked(convert: Callable[[Any], Any], value: Any, field: str) -> Any:
    """`convert(value)` for the constructor's argument `field`: an error names the
    field, and keeps its class (`ValueError` for a unit that does not parse,
    `TypeError` for something that is not a unit)."""
    try:
        return convert(value)
    except (TypeError, ValueError) as e:
        raise type(e)(f"Quantity's `{field}` {value!r} is not a unit: {e}") from e


def ustrip(u: UnitLike, q: Any) -> Any:
    """The numbers of quantity `q` in unit `u`, as a plain array.

    It works everywhere: on a quantity, on a plain array, and inside `quax.quaxify`
    on a traced quantity (also under `jax.grad` and `jax.vmap` there).

    **Arguments:**

    - `u`: the unit to express `q` in; its dimensions must be those of `q`.
    - `q`: a [`quax_units.Quantity`][]; a plain array counts as dimensionless.

    **Returns:**

    A plain array. Different dimensions raise [`quax_units.UnitError`][]. For an
    offset unit (`degC`), the numbers are measured from its zero.
    """
    target = _to_unit(u)
    if isinstance(q, Quantity):
        conversion_factor(si_unit(q.units), target)
        given = _given.get(id(q))
        if given is not None:
            magnitude, source = given
            return _convert(
                jnp.asarray(magnitude, jnp.result_type(q.array)), source, target
            )
        array = q.array
    elif isinstance(q, jax.core.Tracer):
        # Inside `quax.quaxify`, a traced quantity is a tracer: the primitive's rule
        # reads (and checks) its units, and plain tracers count as dimensionless.
        array = strip_p.bind(q, dimensions=target.dimensions)
    else:
        _check_dimensions(target.dimensions, dimensionless)
        array = jnp.asarray(q)
    if target.offset:
        array = array - target.offset
    return array if target.scale == 1.0 else scaled(array, target.scale, divide=True)


def _convert(magnitude: Any, source: Unit, target: Unit) -> Any:
    """Numbers in `source` as numbers in `target` (same dimensions), in their dtype:
    unchanged when the units are the same, and with the fewest roundings otherwise
    (`20 degC` is `68 degF` exactly in float32)."""
    ratio = source.scale / target.scale
    shift = (source.offset - target.offset) / target.scale
    out = magnitude if ratio == 1.0 else scaled(magnitude, ratio)
    return out if shift == 0.0 else out + shift


def dimensions_of(x: Any) -> Dimensions:
    """The dimensions of an operand (a plain array is dimensionless)."""
    return x.units if isinstance(x, Quantity) else Dimensions()
