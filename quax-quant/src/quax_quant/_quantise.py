"""`quantise`: float arrays to `QuantisedArray`s (integers, NF4 with double
quantisation, float8), with absmax, percentile or MSE calibration, and
straight-through gradients for quantisation-aware training."""

import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike

from ._kernels import (
    CALIBRATIONS,
    double_quantise,
    float8_leaves,
    nf4_leaves,
    quantised_leaves,
)
from ._value import (
    FLOAT8_FORMATS,
    FORMATS,
    MATMUL_PATHS,
    QuantisedArray,
    QuantisedScale,
)


__all__ = ["quantise"]


def _axis_index(value: Any, field: str) -> int:
    """`value` as an axis number, or a `ValueError` naming `field`."""
    try:
        return operator.index(value)
    except TypeError:
        kinds = "an int or a sequence of ints" if field == "axis" else "an int"
        raise ValueError(f"quantise: {field} must be {kinds}, got {value!r}.") from None


def _normalise_axis(axis: int, ndim: int, field: str) -> int:
    """`axis` in `[0, ndim)`, as NumPy reads an axis: a negative axis counts from
    the end, and one outside `[-ndim, ndim)` raises NumPy's `AxisError` (a
    `ValueError`) naming `field`, rather than wrapping around."""
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(axis, ndim, msg_prefix=f"quantise: {field}")
    return axis % ndim


def _scale_shape(
    shape: tuple[int, ...],
    axis: int | np.integer | Sequence[int] | None,
    group_size: int | None,
    group_axis: int,
    *,
    size_name: str = "group_size",
    partial: bool = False,
) -> tuple[int, ...]:
    """The scale's shape for `quantise`'s layout arguments. An empty axis (length
    0) has one block whatever the layout: there is nothing to scale along it.

    `size_name` is the argument the group size came from (`"group_size"` or
    `"block_size"`), for the errors; with `partial` (NF4) a group size that does
    not divide its axis cuts it into `ceil(d / group_size)` blocks of equal length
    `ceil(d / blocks)`, the last one shorter (see `QuantisedArray.group_sizes`)."""
    ndim = len(shape)
    if group_size is not None:
        if axis is not None:
            raise ValueError(
                f"quantise takes either `axis` (per-channel scales) or `{size_name}` "
                f"(one scale per group of `{size_name}` along `group_axis`, per "
                "index of every other axis), not both."
            )
        if ndim == 0:
            raise ValueError(f"quantise: {size_name} needs an array with an axis.")
        g_axis = _normalise_axis(
            _axis_index(group_axis, "group_axis"), ndim, "group_axis"
        )
        d = shape[g_axis]
        size = _axis_index(group_size, size_name)
        if size < 1:
            raise ValueError(
                f"quantise: {size_name} must be a positive number of consecutive "
                f"entries sharing a scale, got {size_name}={group_size}."
            )
        if d % size and not partial:
            raise ValueError(
                f"quantise: {size_name}={group_size} must divide the length {d} of "
                f"axis {g_axis} (group_axis={group_axis}) of shape {shape}."
            )
        blocks = max(-(-d // size), 1)
        return tuple(blocks if a == g_axis else max(n, 1) for a, n in enumerate(shape))
    if axis is None:
        return (1,) * ndim
    given = (axis,) if not isinstance(axis, Sequence) else tuple(axis)
    axes = [_normalise_axis(_axis_index(a, "axis"), ndim, "axis") for a in given]
    if len(set(axes)) != len(axes):
        raise ValueError(
            f"quantise: axis={axis!r} repeats an axis of an array with {ndim} axes."
        )
    return tuple(max(n, 1) if a in axes else 1 for a, n in enumerate(shape))


def _check_finite(x: Array) -> None:
    """Refuse a concrete `x` holding a NaN or an infinity, naming the first one:
    the integers of a quantised array cannot stand for it, and a finite result
    from a diverged weight would be silently wrong."""
    with jax.ensure_compile_time_eval():
        finite = jnp.isfinite(x)
        if bool(jnp.all(finite)):
            return
        flat = int(jnp.argmin(finite.ravel()))
        index = tuple(int(i) for i in np.unravel_index(flat, x.shape))
        value = float(x[index])
    raise ValueError(
        f"quantise: x (shape {x.shape}) holds {value} at index {index} (the first "
        "non-finite entry): the integers of a quantised array cannot stand for a "
        "NaN or an infinity, so quantising it would give finite numbers where the "
        "float array gives NaN. Find where the weights diverged, or replace the "
        "non-finite entries (e.g. `jnp.nan_to_num`) before quantising. Under "
        "`jax.jit` or another transform, where x is not known, the block of the "
        "scale that holds it becomes NaN instead, and so does every product using "
        "that block."
    )


# Bits of the stored values of each format.
_BITS = {"int": None, "nf4": 4, "float8_e4m3fn": 8, "float8_e5m2": 8}

# Scales per block of QLoRA's double quantisation.
DOUBLE_QUANT_BLOCK = 256

# NF4's default block length (bitsandbytes' and QLoRA's).
NF4_BLOCK = 64


def _format_arguments(
    format: str,
    bits: int | None,
    symmetric: bool,
    calibration: str,
    axis: Any,
    group_size: int | None,
    block_size: int | None,
) -> tuple[int, int | None, str]:
    """`bits`, the group size and the argument it came from (`"group_size"` or
    `"block_size"`, for the errors) for `format`, or a `ValueError` naming the
    argument that does not fit it."""
    if format not in FORMATS:
        raise ValueError(f"quantise: format must be one of {FORMATS}, got {format!r}.")
    if block_size is not None:
        if group_size is not None:
            raise ValueError(
                "quantise takes `block_size` (bitsandbytes' name) or `group_size`, "
                "not both: they are the same layout."
            )
        group_size = block_size
    size_name = "group_size" if block_size is None else "block_size"
    needs = _BITS[format]
    if needs is None:
        return (8 if bits is None else bits), group_size, size_name
    if bits is not None and bits != needs:
        raise ValueError(
            f"quantise: format={format!r} stores {needs}-bit values, got bits={bits}; "
            "leave bits out."
        )
    if not symmetric:
        raise ValueError(
            f"quantise: format={format!r} has no zero point (its levels are "
            "symmetric about 0); pass symmetric=True."
        )
    if calibration != "absmax":
        raise ValueError(
            f"quantise: format={format!r} scales each block by its absmax; "
            f"calibration={calibration!r} is for format='int'."
        )
    if format == "nf4" and axis is None and group_size is None:
        group_size, size_name = NF4_BLOCK, "block_size"
    return needs, group_size, size_name


def _empty_leaves(
    x: Array, bits: int, format: str, symmetric: bool, scale_shape: tuple[int, ...]
) -> tuple[Array, Array, Array | None]:
    """The leaves of an empty `x` (an axis of length 0), as `quantise` stores
    them for any other array, of the shapes that layout gives: no stored values,
    and scales of 1 (zero points of 0), one block along each empty axis. The
    kernels reduce over each block, which an empty block has nothing for."""
    if format in FLOAT8_FORMATS:
        values = jnp.zeros(x.shape, format)
    elif bits == 4:
        values = jnp.zeros((*x.shape[:-1], (x.shape[-1] + 1) // 2), jnp.int8)
    else:
        values = jnp.zeros(x.shape, jnp.int8)
    scale = jnp.ones(scale_shape, x.dtype)
    return values, scale, None if symmetric else jnp.zeros(scale_shape, x.dtype)


def quantise(
    x: ArrayLike,
    *,
    bits: int | None = None,
    format: str = "int",
    axis: int | np.integer | Sequence[int] | None = None,
    group_size: int | None = None,
    block_size: int | None = None,
    double_quant: bool = False,
    symmetric: bool = True,
    group_axis: int = -1,
    calibration: str = "absmax",
    percentile: float = 99.9,
    straight_through: bool = False,
    allow_materialise: bool = False,
    matmul: str = "auto",
) -> QuantisedArray:
    """Quantise a float array to a [`quax_quant.QuantisedArray`][].

    ```python
    q = quax_quant.quantise(w, bits=4, group_size=64)  # int4, groups along axis -1
    y = quax.quaxify(lambda w, x: w @ x)(q, x)  # never forms the float w
    nf4 = quax_quant.quantise(w, format="nf4", block_size=64, double_quant=True)
    f8 = quax_quant.quantise(w, format="float8_e4m3fn", axis=0)  # per channel
    ```

    **Arguments:**

    - `x`: the floating-point array.
    - `bits`: for `format="int"`, 8 (`int8`, the default) or 4 (packed two per
        byte). The other formats fix it (4 for `"nf4"`, 8 for float8); passing
        another value raises.
    - `format`: what the stored values are. `"int"`: integers. `"nf4"`:
        bitsandbytes' 4-bit NormalFloat (QLoRA's format): each block scaled by
        its absmax and rounded to the nearest of 16 levels that are quantiles of
        a normal distribution (`quax_quant.NF4_CODE`), packed two per byte; by
        default in blocks of 64 along the last axis. `"float8_e4m3fn"` /
        `"float8_e5m2"`: float8 numbers (JAX's dtypes) times a scale per block
        mapping its absmax to the dtype's largest finite number. The formats
        other than `"int"` are symmetric with absmax calibration.
    - `axis`: `None` for one scale for the whole array (per tensor); an axis (or
        axes) to keep one scale per index along it (per channel), e.g. `axis=0` for
        the output channels of an `eqx.nn.Linear` weight `(out, in)`. Axes are read
        as NumPy reads them: negative ones count from the end, and one outside
        `[-x.ndim, x.ndim)` raises NumPy's `AxisError` (a `ValueError`).
    - `group_size`: one scale per `group_size` consecutive indices along
        `group_axis` and per index of every other axis (the usual int4 layout).
        Excludes `axis`. A positive integer dividing the axis' length; for
        `format="nf4"` any length is accepted: an axis of length `d` is cut into
        `ceil(d / group_size)` blocks of `ceil(d / blocks)` entries each, the
        last one shorter where that does not divide `d` (100 entries in blocks
        of at most 64: two blocks of 50; 130: blocks of 44, 44 and 42), the
        same number of scales as padding the last block of 64.
    - `block_size`: the same as `group_size` (bitsandbytes' name); give one.
        Errors about it name `block_size`.
    - `double_quant`: store the block scales themselves as int8 (QLoRA's double
        quantisation, [`quax_quant.QuantisedScale`][]): minus their mean, in
        blocks of 256 scales with one float32 scale each. For NF4 in blocks of
        64 this takes the scales from 32 bits per 64 weights to about 8.1.
    - `symmetric`: `q * s` with `q` in `[-(2^(b-1) - 1), 2^(b-1) - 1]`; or `False`
        for `(q - z) * s` with a zero point `z`, using the full range.
    - `group_axis`: the grouped axis; by default the last, which is the contraction
        axis of an `eqx.nn.Linear` weight. Read as `axis` is.
    - `calibration`: how each block's range is chosen: `"absmax"` (exact range,
        for weights), `"percentile"` (the `percentile`-th percentile of `|x|`,
        clipping outliers, for activations) or `"mse"` (the clipping of the absmax
        range minimising the squared error, for activations).
    - `percentile`: for `calibration="percentile"` (and where the `"mse"` search
        starts), in `(0, 100]`.
    - `straight_through`: keep `x` as the array's `master` so that gradients flow
        through the quantisation as if it were the identity (quantisation-aware
        training). Without it, differentiating with respect to `x` raises.
    - `allow_materialise`: let operations without a quantised rule dequantise
        (otherwise they raise, naming the primitive).
    - `matmul`: the product path with float operands (see
        [`quax_quant.matmul_path`][]). `"weight_only"`: exact with respect to
        `x @ w.dequantise()`. `"int8"`: the activations are quantised too (int8
        per row), faster on CPU for batches of rows but about 1% relative error
        added. `"auto"` (default): weight-only below `WEIGHT_ONLY_MAX_ROWS = 4`
        rows and whenever the scale varies along the contraction, int8 otherwise,
        so **from 4 rows on results carry the activations' rounding error**;
        choose `"weight_only"` where that error matters more than the time.

    **Returns:**

    A `QuantisedArray` of `x`'s shape and dtype. An empty `x` (an axis of
    length 0) gives an empty one, whose products are the empty (or zero)
    arrays that dense JAX gives.

    **Raises:**

    `ValueError` for an argument out of its range (naming it), and for a concrete
    `x` holding a NaN or an infinity (naming the index of the first one): the
    integers cannot stand for it, and a diverged weight must not quantise into
    finite numbers. Where `x` is traced (under `jax.jit`, `jax.vmap`, a gradient),
    it cannot be checked: the scale of each block holding a non-finite entry is
    NaN instead, so that the whole block dequantises to NaN and every product
    using it is NaN (where the float array's product is NaN or infinite only in the
    entries it touches).
    """
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"quantise needs a floating-point array, got {x.dtype}.")
    bits, group_size, size_name = _format_arguments(
        format, bits, symmetric, calibration, axis, group_size, block_size
    )
    if bits not in (4, 8):
        raise ValueError(f"quantise supports bits=8 or 4, got {bits}.")
    if calibration not in CALIBRATIONS:
        raise ValueError(
            f"quantise: calibration must be one of {CALIBRATIONS}, got {calibration!r}."
        )
    if not 0 < percentile <= 100:
        raise ValueError(
            f"quantise: percentile must be in (0, 100], got {percentile} (it is a "
            "percentile of |x|, e.g. 99.9)."
        )
    if bits == 4 and x.ndim == 0:
        raise ValueError("quantise: bits=4 packs along the last axis; got a scalar.")
    if matmul not in MATMUL_PATHS:
        raise ValueError(
            f"quantise: matmul must be one of {MATMUL_PATHS}, got {matmul!r}."
        )
    master = x if straight_through else None
    scale_shape = _scale_shape(
        x.shape,
        axis,
        group_size,
        group_axis,
        size_name=size_name,
        partial=format == "nf4",
    )
    if not isinstance(x, jax.core.Tracer):
        _check_finite(x)
    if x.size == 0:
        values, scale, zero = _empty_leaves(x, bits, format, symmetric, scale_shape)
    elif format == "int":
        values, scale, zero = quantised_leaves(
            x, bits, scale_shape, symmetric, calibration, percentile, straight_through
        )
    else:
        data = jax.lax.stop_gradient(x) if straight_through else x
        if format == "nf4":
            values, scale = nf4_leaves(data, scale_shape)
        else:
            values, scale = float8_leaves(data, format, scale_shape)
        zero = None
    if double_quant:
        codes, block_scale, offset = double_quantise(scale, DOUBLE_QUANT_BLOCK)
        scale = QuantisedScale(
            codes,
            block_scale,
            offset,
            block_size=DOUBLE_QUANT_BLOCK,
            float_dtype=np.dtype(x.dtype),
        )
    return QuantisedArray(
        values,
        scale,
        zero,
        master,
        bits=bits,
        float_dtype=np.dtype(x.dtype),
        odd=bits == 4 and x.ndim > 0 and x.shape[-1] % 2 == 1,
        allow_materialise=allow_materialise,
        matmul=matmul,
        format=format,
    )


quantize = quantise
