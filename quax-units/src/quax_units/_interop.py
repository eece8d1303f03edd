"""Conversion to and from `pint` and `astropy` quantities (imported only when used)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._dimensions import Dimension, Dimensions, UnitError
from ._units import Unit, unit
from ._value import Quantity, float64_emulated, held_range


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


def _numbers(value: Any, source: str) -> jax.Array:
    """`value` (numbers in SI-coherent units) as a JAX array, refusing numbers that
    JAX's dtype for them cannot hold: without 64-bit mode a float64 `1e300` would be
    `inf` and `1e-50` would be 0 in float32; on a TPU, whose float64 holds float32's
    range (`held_range`), so would they in float64."""
    scalar = isinstance(value, int | float | complex) and not isinstance(value, bool)
    value = np.asarray(value)
    if value.dtype == object:
        value = value.astype(np.result_type(*value.ravel()) if value.size else float)
    dtype = jax.dtypes.canonicalize_dtype(value.dtype)
    if np.issubdtype(value.dtype, np.inexact):
        _check_held(value, dtype, source)
    if scalar:  # a Python number stays weakly typed, as JAX keeps it
        return jnp.asarray(value.item())
    return jnp.asarray(value.astype(dtype))


def _check_held(value: Any, dtype: Any, source: str) -> None:
    """Refuse floating `value` that JAX's `dtype` holds as infinities or zeros
    (or fewer digits) on JAX's default backend (`held_range`)."""
    tiny, most = held_range(dtype)
    emulated = float64_emulated(dtype)
    if dtype == value.dtype and not emulated:
        return
    parts = (value.real, value.imag) if np.iscomplexobj(value) else (value,)
    sizes = np.concatenate([np.abs(p[np.isfinite(p)]).ravel() for p in parts])
    fix = (
        f"On a {jax.default_backend()}, XLA emulates {dtype} with pairs of float32 "
        "numbers, which hold float32's range: convert on the CPU (`with "
        "jax.default_device(jax.devices('cpu')[0]):`), or scale the numbers into "
        "range first."
        if emulated
        else "Enable 64-bit numbers (`jax.config.update('jax_enable_x64', True)`) "
        "before converting, or scale the numbers into range first."
    )
    if np.any(sizes > most):
        raise ValueError(
            f"{source}: numbers up to {sizes.max():.6g} in SI-coherent units (what "
            f"a Quantity holds) are beyond {dtype}'s range (at most "
            f"{most:.6g}): they would be infinite. {fix}"
        )
    small = sizes[sizes != 0]
    if np.any(small < tiny):
        raise ValueError(
            f"{source}: nonzero numbers as small as {small.min():.6g} in "
            f"SI-coherent units (what a Quantity holds) are below {dtype}'s "
            f"smallest normal number {tiny:.6g}: they would keep "
            f"fewer digits or be 0. {fix}"
        )


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
    import pint

    if not isinstance(q, pint.Quantity):
        raise TypeError(
            f"from_pint: expected a `pint.Quantity`, got {type(q).__name__} {q!r}; "
            "multiply the numbers by a pint unit first (`registry.Quantity(3.0, "
            "'m')`), or build a `quax_units.Quantity` directly."
        )
    magnitude = q.magnitude
    masked = isinstance(magnitude, np.ma.MaskedArray)
    if masked and np.any(np.ma.getmaskarray(magnitude)):
        raise ValueError(
            "from_pint: the magnitude is a masked array, and a Quantity has no mask "
            "(converting would read the masked numbers as valid). Fill them first "
            "(`registry.Quantity(q.magnitude.filled(fill), q.units)`), or convert "
            "the unmasked ones (`q.magnitude.compressed()`)."
        )
    registry = q._REGISTRY
    logarithmic = [
        name
        for name, _ in q.unit_items()
        if getattr(registry._units[name].converter, "is_logarithmic", False)
    ]
    if logarithmic:
        raise UnitError(
            f"from_pint: {q.units} is a logarithmic unit ({', '.join(logarithmic)}), "
            "which quax-units does not support: its numbers add as logarithms, "
            "where a Quantity's would add as the ratios they stand for. Convert to "
            "the linear quantity first, e.g. `q.to('dimensionless')` for a ratio "
            "or `q.to('mW')` for `dBm`."
        )
    if masked:  # with nothing masked
        q = registry.Quantity(np.ma.getdata(magnitude), q.units)
    base = q.to_base_units()
    exponents = {}
    for name, exponent in dict(q.dimensionality).items():
        if name not in _PINT_DIMENSIONS:
            raise UnitError(f"No quax-units dimension for pint's {name}.")
        exponents[Dimension(_PINT_DIMENSIONS[name])] = exponent
    dims = Dimensions(exponents)
    value = _numbers(base.magnitude, "from_pint")
    return Quantity(value, dims, _display(str(q.units), dims))


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
    from astropy.utils.masked import Masked

    _check_astropy_input(q)
    if isinstance(q, Masked):  # with nothing masked
        q = q.unmasked
    for name, scale in _astropy_offset_units().items():
        if q.unit == scale:  # a temperature scale: 20 deg_C is 293.15 K
            return Quantity(_numbers(q.value, "from_astropy"), name)
    decomposed = q.unit.decompose()
    exponents = {}
    for base, power in zip(decomposed.bases, decomposed.powers, strict=True):
        if base.name in _ASTROPY_DIMENSIONLESS_BASES:
            continue
        if base.name == "dex":  # mag, dB and dex decompose to it
            raise UnitError(_logarithmic(q))
        if base.name not in _SI_BASES:
            raise UnitError(f"No quax-units dimension for astropy's base unit {base}.")
        exponents[Dimension(base.name)] = power
    dims = Dimensions(exponents)
    value = _numbers(np.asarray(q.value) * decomposed.scale, "from_astropy")
    return Quantity(value, dims, _display(q.unit.to_string(), dims))


def _logarithmic(q: Any) -> str:
    return (
        f"from_astropy: {q.unit} is a logarithmic unit (magnitudes, dex, dB), which "
        "quax-units does not support: its numbers add as logarithms, where a "
        "Quantity's would add as the ratios they stand for. Convert to the linear "
        "quantity first: `q.physical` (for `20 * u.ABmag`, a flux density), or "
        "`q.to(u.one, u.logarithmic())` for a plain `u.mag`/`u.dex`/`u.dB` ratio."
    )


def _check_astropy_input(q: Any) -> None:
    """Refuse what `from_astropy` would misread or fail on, naming the way out."""
    import astropy.units as apu
    from astropy.time import Time, TimeDelta
    from astropy.utils.masked import Masked

    if isinstance(q, TimeDelta):
        raise TypeError(
            "from_astropy: an `astropy.time.TimeDelta` is not a Quantity; convert "
            "it with `q.to(u.s)` first."
        )
    if isinstance(q, Time):
        raise TypeError(
            "from_astropy: an `astropy.time.Time` is an instant on a time scale, "
            "not a Quantity; convert a duration from it, e.g. `(t - t0).to(u.s)`, "
            "or a Julian date with `t.jd * u.day`."
        )
    if not isinstance(q, apu.Quantity):
        raise TypeError(
            f"from_astropy: expected an `astropy.units.Quantity`, got "
            f"{type(q).__name__} {q!r}; multiply the numbers by a unit first "
            "(`3.0 * u.m`), or build a `quax_units.Quantity` directly."
        )
    if isinstance(q.unit, apu.FunctionUnitBase) or isinstance(q, apu.FunctionQuantity):
        raise UnitError(_logarithmic(q))
    if isinstance(q.unit, apu.StructuredUnit):
        raise UnitError(
            f"from_astropy: {q.unit} is a structured unit (one unit per field), "
            "which a Quantity cannot hold; convert each field on its own, e.g. "
            f"`from_astropy(q[{q.unit.field_names[0]!r}])`."
        )
    if isinstance(q, Masked) and np.any(q.mask):
        raise ValueError(
            "from_astropy: a masked quantity, and a Quantity has no mask "
            "(converting would read the masked numbers as valid). Fill them first "
            "(`q.filled(fill)`), or convert the unmasked ones "
            "(`q.unmasked[~q.mask]`)."
        )
