"""The quax rules of quax-units for jitted `jax.numpy` functions whose bodies are
written for plain arrays in a way no primitive rule can follow (registered with
`quax.register_function`, for operands that are quantities or plain arrays; with
another family's value among them the body runs under the rules as usual):

- `jnp.hypot` divides by `where(x == 0, 1, x)`: a plain 1 among lengths. It is
  computed whole on the SI-coherent numbers of operands of one dimension, in the
  first quantity's unit;
- `jnp.isclose` (and `jnp.allclose`, which calls it) adds JAX's default `atol`, a
  plain `1e-8`, to `rtol * |b|`: its `UnitError` names the way out, an `atol` in
  the operands' units (read in the first operand's unit it would be a guess: 1e-8
  cm and 1e-8 km are different tolerances);
- `jnp.round(a, decimals)` (and `jnp.around`) multiplies by `10**decimals`
  before rounding, which turns a temperature in `degC` into one in `K`, where the
  primitive rule for `round` would round the kelvin (20.6 °C to one decimal is
  293.8 K, 20.65 °C): the operand's unit is checked as that rule checks it;
- `jnp.sinc` divides by its operand, so an angle in `deg` came out shown in
  `1 / deg`: it is computed on the numbers of a dimensionless operand (angles in
  radians, as `jnp.sin` reads them) and shown dimensionless;
- `jnp.rad2deg` and `jnp.deg2rad` (and `jnp.degrees`/`jnp.radians`, which call
  them) multiply the numbers by `180 / pi` or `pi / 180`, which on a quantity
  would change the angle (`rad2deg` of pi rad gave 180 rad): they show the same
  angle in `deg` or `rad`, as pint's do, and refuse an operand with dimensions.
  They are `jax.jit(inline=True)`, whose calls quax brings to these rules all the
  same (see `quax.register_function`). Their rules come with their derivatives
  (`jvp`, the angle's own tangent), for `grad`, `jvp`, ... inside `quaxify`;
- `jnp.floor_divide` (`//`) and `jnp.divmod` of two quantities of one dimension:
  the quotient is a number (`5 km // 2 m` is 2500), where their bodies floor the
  quotient shown in `km / m`, a scaled unit that rounding refuses; they are
  computed on the SI-coherent numbers;
- `jnp.angle(z, deg=True)` multiplies the angle in radians by `180 / pi` (an
  inlined `rad2deg` in its body): it is computed on the numbers and shown in `deg`
  (in `rad` without `deg`), of a complex quantity of any dimensions; its `jvp` is
  `Im(conj(z) dz) / |z|^2`;
- `jnp.signbit` (and `jnp.copysign`, which calls it) read the sign bit through
  `bitcast_convert_type`, which no rule can give units (the sign of a quantity
  crashed with a refusal naming that primitive): `signbit` is that of the
  SI-coherent numbers (a temperature's in kelvin, as `jnp.sign` reads it), and
  `copysign(x1, x2)` is `x1`'s magnitude, in `x1`'s units (arithmetic, so an
  offset unit gives way to its SI unit, as for `abs`), with the sign of `x2`'s SI
  numbers, whatever `x2`'s dimensions.
"""

from typing import Any

import jax.numpy as jnp
import quax
from quax.extend import release_traces

from .._dimensions import UnitError, dimensionless
from .._units import Unit, unit
from .._value import Quantity, describe
from ._arrays import (
    _array,
    _dims,
    _Operand,
    _refuse_rounding_in_si,
    _same_units,
    _shown,
    _wrap,
)


@quax.register_function(jnp.hypot)
def _hypot(x: _Operand, y: _Operand, *, call: Any) -> Quantity:
    dims, shown = _same_units("jnp.hypot", [x, y])
    # `hypot(x, y)` is `|x|` times a function of `y / x`: in any unit of the common
    # dimensions it is the same length, so it is computed on the SI numbers.
    return _wrap(jnp.hypot(_array(x), _array(y)), dims, shown.linear)


@quax.register_function(jnp.isclose, static={"equal_nan": (True,)})
def _isclose(*args: _Operand, equal_nan: bool = False, call: Any) -> Any:
    # `equal_nan` (static) changes the body `call` runs, not the units it needs.
    try:
        return call(*args)
    except UnitError as e:
        release_traces(e)
        operands = ", ".join(describe(a) for a in args)
        raise UnitError(
            f"`jnp.isclose`/`jnp.allclose` of {operands}: {e}\n"
            "JAX's default `atol` is a plain 1e-8, which has no units: pass a "
            "tolerance in the operands' dimensions, `atol=Quantity(1e-8, unit)`, or "
            "`atol=0`. (A plain `atol` is not read in the first operand's unit: 1e-8 "
            "cm and 1e-8 km are different tolerances.)"
        ) from None


# The numbers of decimals the rounding rules take (`decimals` is a static argument
# of `jnp.round`: a rule runs only for the values it declares; any other runs the
# body, which rounds the SI numbers: `round(20.65 degC, -9)` gave 0 K, not 0 degC).
# Ordered by magnitude, as quax tries them in turn to find the one a call passes.
_DECIMALS = tuple(sorted(range(-20, 21), key=abs))


@quax.register_function(jnp.round, static={"decimals": _DECIMALS})
def _round(a: Quantity, *, decimals: int = 0, call: Any) -> Any:
    _refuse_rounding_in_si("`jnp.round` of", a)
    return call(a)


@quax.register_function(jnp.around, static={"decimals": _DECIMALS})
def _around(a: Quantity, *, decimals: int = 0, call: Any) -> Any:
    _refuse_rounding_in_si("`jnp.around` of", a)
    return call(a)


@quax.register_function(jnp.sinc)
def _sinc(x: Quantity, *, call: Any) -> Quantity:
    if not x.units.is_dimensionless:
        raise UnitError(
            f"`jnp.sinc` needs a dimensionless operand (angles count, in radians), "
            f"but got {describe(x)}. Divide by a reference quantity, or strip the "
            "units with `quax_units.ustrip`."
        )
    return _wrap(jnp.sinc(x.array), dimensionless, None)


_DEGREE = unit("deg")
_RADIAN = unit("rad")


def _angle_shown_in(function: str, x: Quantity, shown: Unit) -> Quantity:
    """The angle `x` (a dimensionless quantity, in radians whatever its display unit,
    as pint reads a dimensionless operand), shown in `shown`: its numbers unchanged,
    in the inexact dtype `function` gives."""
    if not x.units.is_dimensionless:
        raise UnitError(
            f"`{function}` converts an angle (a dimensionless quantity, such as one "
            f"in rad or deg), but got {describe(x)}. To scale plain numbers by "
            "180 / pi, strip the units first (`quax_units.ustrip(unit, q)`); to "
            "show an angle in another unit, use `q.to(unit)`."
        )
    array = jnp.asarray(x.array)
    dtype = jnp.result_type(array, float)  # JAX's inexact promotion of the operand
    return _wrap(
        array if array.dtype == dtype else array.astype(dtype), dimensionless, shown
    )


def _no_tangent(x: Any) -> Any:
    """The tangent of an angle computed from `x` where `x` has none (an integer or
    boolean operand, whose tangent is JAX's `float0`): zeros of the inexact real
    dtype the angle has."""
    dtype = jnp.finfo(jnp.result_type(x, float)).dtype
    return jnp.zeros(jnp.shape(x), dtype)


def _same_angle_tangent(shown: Unit) -> Any:
    """The `jvp` of `rad2deg`/`deg2rad` (whose rules show an angle in `shown`): the
    tangent of the angle is its own. The rules show the same angle in another unit
    (its SI numbers, radians, unchanged), so its tangent is unchanged too: a plain
    one (as `grad` seeds it), or a quantity, shown in `shown` where it is an angle
    (a tangent that `jax.jvp` gives as a quantity; under `grad` JAX stages the
    tangent before its type is known, and it keeps its numbers and unit)."""

    def jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> Any:
        ((x,), (t,)) = primals, tangents
        if not jnp.issubdtype(t.dtype, jnp.inexact):
            return _no_tangent(x)
        units = getattr(t, "units", None)  # a quantity's, through quax's tracer
        return t.to(shown) if units is not None and units.is_dimensionless else t

    return jvp


def _angle_tangent(
    primals: tuple[Any, ...], tangents: tuple[Any, ...], *, deg: bool = False
) -> Any:
    """The tangent of the phase of `z` (in radians, the SI number of the angle that
    the rule shows in `deg` or `rad`): `Im(conj(z) dz) / |z|^2`, in one over `z`'s
    units where `dz` is plain (per unit of `z`, as `grad` seeds it)."""
    del deg  # the same angle, shown in another unit: the same tangent
    ((z,), (dz,)) = primals, tangents
    if not jnp.issubdtype(dz.dtype, jnp.inexact):
        return _no_tangent(z)
    # `|z|^2` as `Re(z conj(z))`: JAX's derivative of `abs` of a complex quantity
    # is refused inside `quaxify` (it selects a plain 1 beside `|z|`), and this
    # tangent is differentiated again for second derivatives.
    return jnp.imag(jnp.conj(z) * dz) / jnp.real(z * jnp.conj(z))


# The bodies of the angle conversions multiply the angle's number by 180 / pi, where
# the rules show the same angle in another unit: the body's derivative is not the
# rule's. Their `jvp`s give the rules' derivatives where `grad`, `jvp`, `linearize`,
# ... inside `quaxify` differentiate them on quantities; where JAX differentiates
# them while it traces a body on abstract arguments (`grad` inside `jax.jit`), quax
# raises rather than run the body.
@quax.register_function(
    jnp.rad2deg, body_stands_in=False, jvp=_same_angle_tangent(_DEGREE)
)
def _rad2deg(x: Quantity, *, call: Any) -> Quantity:
    return _angle_shown_in("jnp.rad2deg", x, _DEGREE)


@quax.register_function(
    jnp.deg2rad, body_stands_in=False, jvp=_same_angle_tangent(_RADIAN)
)
def _deg2rad(x: Quantity, *, call: Any) -> Quantity:
    return _angle_shown_in("jnp.deg2rad", x, _RADIAN)


@quax.register_function(
    jnp.angle, static={"deg": (True,)}, body_stands_in=False, jvp=_angle_tangent
)
def _angle(z: Quantity, *, deg: bool = False, call: Any) -> Quantity:
    # The phase of `z` does not depend on its (positive) unit: that of its numbers.
    return _wrap(jnp.angle(z.array), dimensionless, _DEGREE if deg else _RADIAN)


def _of_one_dimension(x1: Any, x2: Any) -> tuple[Quantity, Quantity] | None:
    """`(x1, x2)` when both are quantities of one dimension, in units without an
    offset (their quotient is a number, whatever units they are shown in); else
    `None`."""
    if (
        isinstance(x1, Quantity)
        and isinstance(x2, Quantity)
        and x1.units == x2.units
        and not x1.unit.offset
        and not x2.unit.offset
    ):
        return x1, x2
    return None


@quax.register_function(jnp.floor_divide)
def _floor_divide(x1: _Operand, x2: _Operand, *, call: Any) -> Any:
    pair = _of_one_dimension(x1, x2)
    if pair is None:
        return call(x1, x2)  # its `floor` rounds by the rules of `floor`
    q1, q2 = pair
    # `5 km // 2 m` is 2500, as pint's: computed on the SI-coherent numbers, where
    # the body would round the quotient shown in `km / m`, which rounding refuses.
    return _wrap(jnp.floor_divide(q1.array, q2.array), dimensionless, None)


@quax.register_function(jnp.divmod)
def _divmod(x1: _Operand, x2: _Operand, *, call: Any) -> Any:
    pair = _of_one_dimension(x1, x2)
    if pair is None:
        return call(x1, x2)
    q1, q2 = pair
    # The quotient as `floor_divide`'s; the remainder a quantity of their
    # dimension (the same in any unit), shown in the first operand's unit.
    quotient, remainder = jnp.divmod(q1.array, q2.array)
    return _wrap(quotient, dimensionless, None), _wrap(remainder, q1.units, q1.unit)


@quax.register_function(jnp.signbit)
def _signbit(x: Quantity, *, call: Any) -> Any:
    # The sign bit of the SI-coherent numbers: a plain boolean array, whatever the
    # units (the sign of a length is the same in `m` and `km`).
    return jnp.signbit(x.array)


@quax.register_function(jnp.copysign)
def _copysign(x1: _Operand, x2: _Operand, *, call: Any) -> Any:
    # `x1`'s magnitude in its units, with the sign of `x2`'s SI-coherent numbers:
    # `x2` gives only a sign, so its dimensions do not matter.
    if not isinstance(x1, Quantity):
        return jnp.copysign(x1, _array(x2))
    return _wrap(jnp.copysign(x1.array, _array(x2)), _dims(x1), _shown(x1))
