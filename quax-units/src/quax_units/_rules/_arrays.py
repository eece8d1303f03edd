"""The quax rules for `Quantity`: which primitives keep, combine or require units.

Every rule runs at trace time and works on the SI-coherent arrays, so a unitful
program compiles to the same operations as the plain one. Plain arrays are
dimensionless, except constants known at trace time that fit any unit (zeros,
infinities, NaNs), which `jax.numpy` functions use internally.
"""

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import jax
import jax.core
import jax.extend.core.primitives as jprim
import numpy as np
import quax
from equinox.internal._loop.common import maybe_set_p, select_if_vmap_p
from jax import lax
from jaxtyping import ArrayLike

from .._dimensions import Dimensions, UnitError, dimensionless, rational_exponent
from .._units import Unit, si_unit, unit
from .._value import Quantity, describe, fits_any_unit, make


_Operand = Quantity | ArrayLike
_RADIAN = unit("rad")


# Helpers ------------------------------------------------------------------------------


def _array(x: Any) -> Any:
    return x.array if isinstance(x, Quantity) else x


def _dims(x: Any) -> Dimensions:
    return x.units if isinstance(x, Quantity) else dimensionless


def _shown(x: Any) -> Unit:
    """The display unit of the result of arithmetic on an operand (a plain array
    shows as dimensionless). Arithmetic happens on the SI-coherent arrays, so its
    results are absolute: an offset unit (`degC`) gives way to its SI unit (`K`)."""
    if isinstance(x, Quantity):
        return x.unit.linear
    return si_unit(dimensionless)


_wrap = make


_TRACED_CONSTANT_HINT = (
    " The plain operand is only known at run time (a loop carry or a traced value), "
    "so it cannot be checked to be a zero, infinity or NaN constant, which fits any "
    "unit: start it as a quantity (`Quantity(jnp.zeros(...), unit)`). If it holds "
    "the numbers of a quantity that code took apart leaf by leaf "
    "(`jax.tree_util.tree_map` over a `Quantity` that is a pytree, not traced: one "
    "built inside the quaxified function and handed to a library such as diffrax, "
    "whose step-size controller maps over its state), pass the quantity to the "
    "quaxified function as an argument, or write `jnp.asarray(q)` where it is "
    "built, which joins it to the quax trace."
)


def _fits_any_unit(x: Any) -> bool:
    """Whether an operand fits any unit: a plain constant of zeros, infinities or
    NaNs (`fits_any_unit`), or a dimensionless quantity whose numbers are known to
    be all such (`0 * dt` with a dimensionless `dt`, where a solver's step size is
    a quantity): a dimensionless quantity is a plain array with units, and fits
    where that plain array would."""
    if isinstance(x, Quantity):
        return x.units.is_dimensionless and quax.known_scale_invariant(
            x.array, np.size(x.array)
        )
    return fits_any_unit(x)


def _same_units(
    primitive: Any, operands: Sequence[Any], way_out: str = ""
) -> tuple[Dimensions, Unit]:
    """The common dimensions of `operands` (all must agree), and the display unit of
    the first quantity among them, which a result that selects among the operands
    takes (arithmetic results use its `.linear` unit). `primitive` (or a
    function's name) names the operation in the error, and `way_out` (a sentence,
    if given) ends it."""
    quantities = [x for x in operands if isinstance(x, Quantity)]
    first = quantities[0]
    if any(q.units != first.units for q in quantities):
        # The dimensions are those of a quantity that does not fit any unit.
        first = next((q for q in quantities if not _fits_any_unit(q)), first)
    for x in operands:
        if x is first or _dims(x) == first.units or _fits_any_unit(x):
            continue
        hint = _TRACED_CONSTANT_HINT if isinstance(x, jax.core.Tracer) else ""
        raise UnitError(
            f"`{getattr(primitive, 'name', primitive)}` needs operands of the same "
            "dimensions, but got "
            f"{describe(first)} and {describe(x)}. Quantities with the same dimensions "
            f"in different units (m, km) combine; these cannot.{hint}"
            f"{' ' + way_out if way_out else ''}"
        )
    return first.units, first.unit


def _require_dimensionless(primitive: Any, x: Any, role: str = "operand") -> Any:
    if isinstance(x, Quantity) and not x.units.is_dimensionless:
        raise UnitError(
            f"`{primitive.name}` needs a dimensionless {role} (angles count, in "
            f"radians), but got {describe(x)}. Divide by a reference quantity, or "
            "strip the units with `quax_units.ustrip`."
        )
    return _array(x)


def _static_exponent(primitive: Any, x: Quantity, y: Any) -> Fraction:
    """The exponent of `pow(x, y)`, which must be known at trace time to give units."""
    exponent = _require_dimensionless(primitive, y, "exponent")
    try:
        values = np.asarray(exponent)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise UnitError(
            f"`{primitive.name}` of {describe(x)} with an exponent only known at run "
            "time: the units of the result would depend on it. Use a constant "
            "exponent (`x ** 1.5`)."
        ) from None
    flat = values.reshape(-1)
    operation = f"take `{primitive.name}` of {describe(x)} with the exponent"
    way_out = (
        "Use a finite exponent that is a simple fraction (`x ** (1 / 3)`, "
        "`x ** 1.5`), or make the base dimensionless first (divide it by a "
        "reference quantity)."
    )
    for value in flat[~np.isfinite(flat)][:1]:
        rational_exponent(value, operation, UnitError, way_out)  # raises
    if flat.size == 0 or np.any(flat != flat[0]):
        raise UnitError(
            f"`{primitive.name}` of {describe(x)} with differing exponents {values}: "
            "every element would get different units. Use a single exponent."
        )
    return rational_exponent(flat[0], operation, UnitError, way_out)


def _powered(x: Any, exponent: Fraction | int) -> tuple[Dimensions, Unit]:
    """The dimensions and display unit of `x` to the power `exponent`. The display
    unit is `x`'s to that power, or the SI-coherent one where that power's scale
    is out of a float's range (`km ** 200`): the numbers are held in SI-coherent
    units either way."""
    dims = _dims(x) ** exponent
    try:
        return dims, _shown(x) ** exponent
    except ValueError:
        return dims, si_unit(dims)


# Operands of the same dimensions ------------------------------------------------------

_SAME_UNITS = [lax.add_p, lax.sub_p, lax.max_p, lax.min_p, lax.rem_p, lax.nextafter_p]
_SELECTING = {lax.max_p, lax.min_p, lax.nextafter_p, lax.scatter_p}
_SELECTING |= {lax.scatter_min_p, lax.scatter_max_p}


@quax.register_elementwise(_SAME_UNITS)
def _same(primitive: Any, x: _Operand, y: _Operand, **params: Any) -> Quantity:
    dims, shown = _same_units(primitive, [x, y])
    shown = shown if primitive in _SELECTING else shown.linear
    return _wrap(primitive.bind(_array(x), _array(y), **params), dims, shown)


_PLAIN_TANGENTS = (
    "`add_any` sums the tangents (or cotangents) that reach one value along several "
    "paths. Under `jax.jvp` (`linearize`, `jacfwd`) a plain tangent counts per unit "
    "of its input, so plain tangents of inputs in different units give parts in "
    "different units: pass the tangents as quantities in their inputs' units "
    "(`Quantity(dx, unit)`)."
)


@quax.register(jprim.add_jaxvals_p)
def _add_any(x: _Operand, y: _Operand) -> Quantity:
    # Autodiff's accumulation of tangents and cotangents. Cotangents of one variable
    # share units (the forward rules checked the program, and `grad` seeds one
    # output), so a plain operand beside a dimensional quantity is an instantiated
    # symbolic zero (a loop's cotangent carry, traced, before quax-core lifts it):
    # it takes the other operand's units. Tangents need not: `jvp` with plain
    # tangents of a quantity and of a plain input adds a part per unit of the
    # quantity to one in its units, refused where the plain part is a known number
    # other than zeros (a traced one, under `jax.jit`, is taken as a zero).
    first = x if isinstance(x, Quantity) else y
    assert isinstance(first, Quantity)
    if isinstance(x, Quantity) and isinstance(y, Quantity):
        _same_units(jprim.add_jaxvals_p, [x, y], _PLAIN_TANGENTS)
    else:
        plain = y if first is x else x
        if (
            not first.units.is_dimensionless
            and not fits_any_unit(plain)
            and quax.known_constant(plain) is not None
        ):
            raise UnitError(
                f"`add_any` of {describe(first)} and {describe(plain)}, a plain part "
                f"other than zeros beside a dimensional one. {_PLAIN_TANGENTS}"
            )
    return _wrap(
        jprim.add_jaxvals_p.bind(_array(x), _array(y)), first.units, _shown(first)
    )


_COMPARISONS = [lax.eq_p, lax.ne_p, lax.lt_p, lax.le_p, lax.gt_p, lax.ge_p]
# The total-order comparisons of `sort` and `searchsorted` (`jnp.interp`).
_COMPARISONS += [lax.eq_to_p, lax.le_to_p, lax.lt_to_p]


@quax.register_elementwise(_COMPARISONS)
def _compare(primitive: Any, x: _Operand, y: _Operand, **params: Any) -> Any:
    _same_units(primitive, [x, y])
    return primitive.bind(_array(x), _array(y), **params)


@quax.register(lax.atan2_p)
def _atan2(x: _Operand, y: _Operand, **params: Any) -> Quantity:
    _same_units(lax.atan2_p, [x, y])
    return _wrap(
        lax.atan2_p.bind(_array(x), _array(y), **params), dimensionless, _RADIAN
    )


@quax.register(lax.complex_p)
def _complex(x: _Operand, y: _Operand) -> Quantity:
    # `x + i y`: both parts of one dimension, as for `add` (the arrays are already in
    # its SI-coherent unit), shown in the first quantity's unit. A plain zero part
    # (`lax.complex(0, y)`, as JAX's transposes of `real` and `imag` bind it) fits
    # any unit.
    dims, shown = _same_units(
        lax.complex_p,
        [x, y],
        "Give both parts in one dimension (`lax.complex(x, Quantity(y, unit))`), or "
        "strip the units of both first with `quax_units.ustrip(unit, q)` (and "
        "reattach them with `quax_units.Quantity`).",
    )
    return _wrap(lax.complex_p.bind(_array(x), _array(y)), dims, shown.linear)


@quax.register(lax.clamp_p)
def _clamp(low: _Operand, x: _Operand, high: _Operand, **params: Any) -> Quantity:
    dims, shown = _same_units(lax.clamp_p, [x, low, high])
    return _wrap(
        lax.clamp_p.bind(_array(low), _array(x), _array(high), **params), dims, shown
    )


# JAX's derivative of `abs` of a complex `z` is `Re(dz conj(z) / where(|z| == 0, 1,
# |z|))`: a plain 1 selected beside `|z|`, a quantity, which no rule can give
# units (a plain non-zero constant selected beside a quantity is refused: the same
# select written by hand would be a unit error). A plain complex case among
# quantities is such a derivative, or code that wrote one.
_ABS_WAY_OUT = (
    "If this is JAX's derivative of `jnp.abs` of a complex quantity (under `grad`, "
    "`jvp`, `vjp`, ... inside `quax.quaxify`), which divides by `where(|z| == 0, 1, "
    "|z|)` (a plain 1 beside `|z|`'s units): take the absolute value of a "
    "dimensionless ratio, `jnp.abs(z / z0) * z0` with `z0 = Quantity(1.0, unit)` "
    "(the same numbers and derivative), or differentiate outside `quax.quaxify` "
    "(`quax_units.grad(quax.quaxify(f))`)."
)


# A plain constant selected beside quantities is the guard of a division by a
# difference in library code (`where(t0 == t1, 1, t1 - t0)`): its constant has no
# units to take, and giving it the quantities' would read `where(m, 1.0, x_km)` as
# 1 m. Said where the refusal names it.
_GUARD_WAY_OUT = (
    "A plain constant beside a quantity has no units to take. If it is library "
    "code guarding a division by a difference, as diffrax's `linear_rescale` "
    "divides by `jnp.where(t0 == t1, 1, t1 - t0)` where times are quantities "
    "(`t0`, `t1`, `dt0` of `diffeqsolve`, or `SaveAt(ts=...)`), call "
    "`quax_units.diffrax.diffeqsolve` instead (diffrax's arguments, with times "
    "as quantities), which gives that code plain numbers; or give them by hand: "
    "the times in seconds (`quax_units.ustrip('s', t0)`), and a vector field "
    "that makes its time a quantity again and returns its rate times one second "
    "(`lambda t, y, args: f(t * s, y, args) * s`, with `s = Quantity(1.0, 's')`)."
)


@quax.register(lax.select_n_p)
def _select_n(which: ArrayLike, *cases: _Operand) -> Quantity:
    plain_complex = any(
        not isinstance(c, Quantity) and np.iscomplexobj(c) for c in cases
    )
    try:
        dims, shown = _same_units(
            lax.select_n_p, cases, _ABS_WAY_OUT if plain_complex else ""
        )
    except UnitError as e:
        constants = [
            quax.known_constant(c) for c in cases if not isinstance(c, Quantity)
        ]
        if plain_complex or all(c is None for c in constants):
            raise
        raise UnitError(f"{e} {_GUARD_WAY_OUT}") from None
    return _wrap(lax.select_n_p.bind(which, *map(_array, cases)), dims, shown)


@quax.register(select_if_vmap_p)
def _select_if_vmap(pred: ArrayLike, x: _Operand, y: _Operand, **params: Any) -> Any:
    # Equinox's loops (used by diffrax, optimistix) select with this primitive.
    dims, shown = _same_units(select_if_vmap_p, [x, y])
    return _wrap(
        select_if_vmap_p.bind(pred, _array(x), _array(y), **params), dims, shown
    )


@quax.register(maybe_set_p)
def _maybe_set(
    pred: ArrayLike, xs: _Operand, x: _Operand, *index: _Operand, **params: Any
) -> list[Any]:
    # Equinox's loop buffers (diffrax's saved solution) are written with this one.
    dims, shown = _same_units(maybe_set_p, [xs, x])
    plain_index = [_require_dimensionless(maybe_set_p, i, "index") for i in index]
    (out,) = maybe_set_p.bind(pred, _array(xs), _array(x), *plain_index, **params)
    return [_wrap(out, dims, shown)]


@quax.register(lax.concatenate_p)
def _concatenate(*operands: _Operand, **params: Any) -> Quantity:
    dims, shown = _same_units(lax.concatenate_p, operands)
    return _wrap(lax.concatenate_p.bind(*map(_array, operands), **params), dims, shown)


@quax.register(lax.stack_p)
def _stack(*operands: _Operand, **params: Any) -> Quantity:
    dims, shown = _same_units(lax.stack_p, operands)
    return _wrap(lax.stack_p.bind(*map(_array, operands), **params), dims, shown)


@quax.register(lax.pad_p)
def _pad(operand: _Operand, padding_value: _Operand, **params: Any) -> Quantity:
    dims, shown = _same_units(lax.pad_p, [operand, padding_value])
    return _wrap(
        lax.pad_p.bind(_array(operand), _array(padding_value), **params), dims, shown
    )


@quax.register(lax.dynamic_update_slice_p)
def _dynamic_update_slice(
    operand: _Operand, update: _Operand, *indices: _Operand, **params: Any
) -> Quantity:
    p = lax.dynamic_update_slice_p
    if (
        isinstance(update, Quantity)
        and not isinstance(operand, Quantity)
        and update.shape == np.shape(operand)
    ):
        # The update covers the plain operand, so none of its values remain (a
        # solver's buffer of one saved step): the result has the update's units.
        dims, shown = update.units, update.unit
    else:
        dims, shown = _same_units(p, [operand, update])
    starts = [_require_dimensionless(p, i, "index") for i in indices]
    return _wrap(
        p.bind(_array(operand), _array(update), *starts, **params), dims, shown
    )


_SCATTERS = [
    lax.scatter_p,
    lax.scatter_add_p,
    lax.scatter_sub_p,
    lax.scatter_min_p,
    lax.scatter_max_p,
]


@quax.register_elementwise(_SCATTERS)
def _scatter(
    primitive: Any,
    operand: _Operand,
    indices: _Operand,
    updates: _Operand,
    **params: Any,
) -> Quantity:
    dims, shown = _same_units(primitive, [operand, updates])
    shown = shown if primitive in _SELECTING else shown.linear
    index = _require_dimensionless(primitive, indices, "index")
    return _wrap(
        primitive.bind(_array(operand), index, _array(updates), **params), dims, shown
    )


@quax.register(lax.scatter_mul_p)
def _scatter_mul(
    operand: _Operand, indices: _Operand, updates: _Operand, **params: Any
) -> Any:
    p = lax.scatter_mul_p
    index = _require_dimensionless(p, indices, "index")
    factors = _require_dimensionless(p, updates, "update")
    return _wrap(
        p.bind(_array(operand), index, factors, **params),
        _dims(operand),
        _shown(operand),
    )


# Operations that keep the units -------------------------------------------------------

_KEEP_UNITS = [
    lax.reduce_max_p, lax.reduce_min_p, lax.cummax_p, lax.cummin_p, lax.reshape_p,
    lax.squeeze_p, lax.broadcast_in_dim_p, lax.transpose_p, lax.slice_p, lax.rev_p,
    lax.reduce_precision_p, jprim.copy_p, lax.tile_p,
    lax.sharding_constraint_p, lax.reduce_window_max_p, lax.reduce_window_min_p,
    lax.pmax_p, lax.pmin_p,
]  # fmt: skip
# `psum` (and `pmean`, its quotient by the axis size) over a named axis of `vmap`,
# `shard_map` or `pmap` is a sum, as `reduce_sum`.
_KEEP_DIMENSIONS = [
    lax.neg_p, lax.abs_p, lax.real_p, lax.imag_p, lax.conj_p, lax.reduce_sum_p,
    lax.cumsum_p, lax.reduce_window_sum_p, lax.psum_p,
]  # fmt: skip


@quax.register_elementwise(_KEEP_UNITS)
def _keep(primitive: Any, x: Quantity, **params: Any) -> Quantity:
    return _wrap(primitive.bind(x.array, **params), x.units, x.unit)


@quax.register_elementwise(_KEEP_DIMENSIONS)
def _keep_dimensions(primitive: Any, x: Quantity, **params: Any) -> Quantity:
    # Arithmetic on the SI-coherent numbers: shown in `degC` it would be wrong.
    return _wrap(primitive.bind(x.array, **params), x.units, _shown(x))


def _refuse_rounding_in_si(what: str, x: Quantity) -> None:
    """Rounding a dimensional quantity depends on the unit its numbers are in:
    `floor` of 1.6 km is 1 km, but the numbers are held in metres, where it would be
    1600 m (1.6 km). Where the display unit is not SI-coherent (a scale other than
    1, or an offset: `km`, `degC`), the numbers cannot be rounded in it exactly
    either (1.6 ft read back from metres may be 1.5999999 ft), so rounding is
    refused there. So it is for a dimensionless quantity shown in a scaled unit
    (`deg`, `%`, `km / m`): its numbers are held as plain numbers (an angle in
    radians), where `floor` of 90.5 deg would be 1 (57.3 deg) and of 50.4 % 0 %;
    pint gives 90 deg and 50 %. (`5 km // 2 m`, the quotient of two quantities of
    one dimension, is a number, 2500: see `jnp.floor_divide`'s rule.)"""
    shown = x.unit
    if shown.scale != 1.0 or shown.offset:
        si = str(si_unit(x.units))
        held = si or "plain numbers (an angle in radians)"
        raise UnitError(
            f"{what} a quantity in {describe(x)}: rounding depends on the unit, and "
            f"its numbers are held in {held}, not {shown} (`floor` of 1.6 km is 1 "
            "km, of 1600 m it is 1600 m). Round the numbers in the unit you mean: "
            "`Quantity(jnp.floor(quax_units.ustrip(unit, q)), unit)`, or show the "
            f"quantity in SI-coherent units first (`q.to({si!r})`) to round those."
        )


@quax.register_elementwise([lax.floor_p, lax.ceil_p, lax.round_p])
def _round(primitive: Any, x: Quantity, **params: Any) -> Quantity:
    _refuse_rounding_in_si(f"`{primitive.name}` (`jnp.{primitive.name}`) of", x)
    return _wrap(primitive.bind(x.array, **params), x.units, x.unit)


@quax.register(lax.convert_element_type_p)
def _convert_element_type(x: Quantity, *, new_dtype: Any, **params: Any) -> Any:
    if new_dtype is not None and jax.numpy.issubdtype(new_dtype, np.integer):
        _refuse_rounding_in_si(f"casting to {np.dtype(new_dtype).name}", x)
    out = lax.convert_element_type_p.bind(x.array, new_dtype=new_dtype, **params)
    if new_dtype is not None and np.dtype(new_dtype) == np.bool_:
        # Whether each number is nonzero: plain booleans, as a comparison gives,
        # the same in any unit without an offset (a temperature's in kelvin, as a
        # plain zero meeting it is read). A quantity of booleans read True as 1 in
        # SI units: `astype(bool)` of 2 m gave 1 m, and of 1e-3 mm 1000 mm.
        return out
    return _wrap(out, x.units, x.unit)


@quax.register_elementwise([lax.dynamic_slice_p, lax.gather_p])
def _index(
    primitive: Any, operand: Quantity, *indices: _Operand, **params: Any
) -> Quantity:
    index = [_require_dimensionless(primitive, i, "index") for i in indices]
    fill = params.get("fill_value")
    if (
        params.get("mode") == lax.GatherScatterMode.FILL_OR_DROP
        and fill is not None
        and not operand.units.is_dimensionless
        and not fits_any_unit(np.asarray(fill))
    ):
        # The fill is a param, a plain number that no rule's check of operands
        # sees: written into the SI-coherent numbers, 5.0 for a length in km
        # would read 0.005 km, and for a temperature in degC -268.15 degC.
        raise UnitError(
            f"`{primitive.name}` fills the entries out of bounds of "
            f"{describe(operand)} with the plain number {fill}, which has no "
            "units: a plain number fits a dimensional quantity only where it is 0, "
            "infinite or NaN. Fill with NaN (the default for `mode='fill'`) and "
            "put a quantity in the filled entries (`jnp.where`), or strip the units "
            "first (`quax_units.ustrip`)."
        )
    return _wrap(
        primitive.bind(operand.array, *index, **params), operand.units, operand.unit
    )


@quax.register_elementwise([lax.split_p, lax.unstack_p])
def _split(primitive: Any, operand: Quantity, **params: Any) -> list[Quantity]:
    return [
        _wrap(out, operand.units, operand.unit)
        for out in primitive.bind(operand.array, **params)
    ]


@quax.register_elementwise([lax.sort_p, lax.device_put_p])
def _each_keeps_units(primitive: Any, *operands: _Operand, **params: Any) -> list[Any]:
    # Output i is operand i sorted (by the keys among the operands), or moved to a
    # device: it keeps its operand's units, and a plain operand stays plain.
    outs = primitive.bind(*map(_array, operands), **params)
    return [
        _wrap(o, x.units, x.unit) if isinstance(x, Quantity) else o
        for o, x in zip(outs, operands, strict=True)
    ]


@quax.register(lax.top_k_p)
def _top_k(operand: Quantity, **params: Any) -> list[Any]:
    values, indices = lax.top_k_p.bind(operand.array, **params)
    return [_wrap(values, operand.units, operand.unit), indices]


@quax.register_elementwise([lax.argmax_p, lax.argmin_p, lax.is_finite_p])
def _plain_result(primitive: Any, x: Quantity, **params: Any) -> Any:
    return primitive.bind(x.array, **params)


@quax.register(lax.sign_p)
def _sign(x: Quantity, **params: Any) -> Quantity:
    return _wrap(lax.sign_p.bind(x.array, **params), dimensionless, None)


# Operations that combine units --------------------------------------------------------


@quax.register_elementwise([lax.mul_p, lax.dot_general_p, lax.conv_general_dilated_p])
def _product(primitive: Any, x: _Operand, y: _Operand, **params: Any) -> Quantity:
    return _wrap(
        primitive.bind(_array(x), _array(y), **params),
        _dims(x) * _dims(y),
        _shown(x) * _shown(y),
    )


@quax.register(lax.div_p)
def _div(x: _Operand, y: _Operand, **params: Any) -> Quantity:
    return _wrap(
        lax.div_p.bind(_array(x), _array(y), **params),
        _dims(x) / _dims(y),
        _shown(x) / _shown(y),
    )


def _power_rule(primitive: Any, exponent: Fraction) -> None:
    @quax.register(primitive)
    def _(x: Quantity, **params: Any) -> Quantity:
        return _wrap(primitive.bind(x.array, **params), *_powered(x, exponent))


for _p, _e in [
    (lax.sqrt_p, Fraction(1, 2)),
    (lax.cbrt_p, Fraction(1, 3)),
    (lax.rsqrt_p, Fraction(-1, 2)),
    (lax.square_p, Fraction(2)),
]:
    _power_rule(_p, _e)


@quax.register(lax.integer_pow_p)
def _integer_pow(x: Quantity, *, y: int) -> Quantity:
    return _wrap(lax.integer_pow_p.bind(x.array, y=y), *_powered(x, y))


@quax.register(lax.pow_p)
def _pow(x: _Operand, y: _Operand, **params: Any) -> Quantity:
    if not isinstance(x, Quantity) or x.units.is_dimensionless:
        base = _array(x)
        exponent = _require_dimensionless(lax.pow_p, y, "exponent")
        return _wrap(lax.pow_p.bind(base, exponent, **params), dimensionless, None)
    e = _static_exponent(lax.pow_p, x, y)
    return _wrap(lax.pow_p.bind(x.array, _array(y), **params), *_powered(x, e))


@quax.register(lax.reduce_prod_p)
def _reduce_prod(x: Quantity, *, axes: Sequence[int], **params: Any) -> Quantity:
    n = math.prod(x.shape[a] for a in axes)
    return _wrap(lax.reduce_prod_p.bind(x.array, axes=axes, **params), *_powered(x, n))


# Operations that need dimensionless operands ------------------------------------------

_DIMENSIONLESS = [
    lax.exp_p, lax.exp2_p, lax.log_p, lax.log1p_p, lax.expm1_p, lax.sin_p, lax.cos_p,
    lax.tan_p, lax.sinh_p, lax.cosh_p, lax.tanh_p, lax.asinh_p, lax.acosh_p,
    lax.atanh_p, lax.logistic_p, lax.erf_p, lax.erfc_p, lax.erf_inv_p, lax.lgamma_p,
    lax.digamma_p, lax.cumlogsumexp_p,
]  # fmt: skip


@quax.register_elementwise(_DIMENSIONLESS)
def _dimensionless(primitive: Any, x: Quantity, **params: Any) -> Quantity:
    return _wrap(
        primitive.bind(_require_dimensionless(primitive, x), **params),
        dimensionless,
        None,
    )


@quax.register_elementwise([lax.asin_p, lax.acos_p, lax.atan_p])
def _inverse_trig(primitive: Any, x: Quantity, **params: Any) -> Quantity:
    return _wrap(
        primitive.bind(_require_dimensionless(primitive, x), **params),
        dimensionless,
        _RADIAN,
    )


@quax.register(lax.cumprod_p)
def _cumprod(x: Quantity, **params: Any) -> Quantity:
    if not x.units.is_dimensionless:
        raise UnitError(
            "`cumprod` needs a dimensionless operand (element i of a cumulative "
            "product has the units raised to the power i + 1: m, m2, m3, ..., and an "
            f"array holds one unit for all its elements), but got {describe(x)}. "
            "Take the cumulative product of a "
            "dimensionless ratio (`x / x0`, then multiply by `x0 ** n` where needed) "
            "or strip the units with `quax_units.ustrip`."
        )
    return _wrap(lax.cumprod_p.bind(x.array, **params), dimensionless, None)
