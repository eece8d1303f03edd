"""The numerical routines on plain arrays that quantising and the quantised products
run: int4 packing, the calibration of each scale block (absmax, percentile, MSE) and
its integers, the on-the-fly quantisation of activations, and the `dot_general`
layout helpers. Nothing here knows `QuantisedArray`: the values, the rules and the
products call these on its leaves.
"""

import functools as ft
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array


__all__ = [
    "CALIBRATIONS",
    "NF4_CODE",
    "double_quantise",
    "float8_leaves",
    "nf4_leaves",
    "nf4_levels",
    "nf4_table",
    "nibbles",
    "DimensionNumbers",
    "one_row_dot",
    "pack_int4",
    "pack_nibbles",
    "quantise_rows",
    "quantised_leaves",
    "reduce_dot",
    "sides",
    "split_groups",
    "to_out",
    "unpack_int4",
]


# bitsandbytes' NF4 ("4-bit NormalFloat", QLoRA, Dettmers et al. 2023) code book:
# the 16 levels a block of weights divided by its absmax is rounded to. They are
# quantiles of the standard normal distribution normalised to [-1, 1], with an exact
# 0: 8 positive levels `ppf(p)` for `p` in `linspace(0.9677083, 0.5, 9)[:-1]`, 7
# negative ones `-ppf(p)` for `p` in `linspace(0.9677083, 0.5, 8)[:-1]`, and 0, all
# divided by the largest (`ppf(0.9677083)`). These are the float32 values
# bitsandbytes ships; the tests recompute them from the definition.
# A stored 4-bit value `q` in `[-8, 7]` stands for level `NF4_CODE[q + 8]`.
NF4_CODE = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    np.float32,
)


DimensionNumbers = tuple[
    tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]
]


# int4 packing -------------------------------------------------------------------------


def pack_int4(values: Array) -> Array:
    """Pack signed 4-bit integers (an integer array with entries in `[-8, 7]`) two
    per byte along the last axis: the first half of the (zero-padded to even) last
    axis in the low four bits, the second half in the high four bits. Unpacking is
    then a concatenation, which XLA vectorises (an interleave runs 3-5x slower).

    **Arguments:**

    - `values`: an integer array, shape `(*shape, n)`. A float array is refused
        (its fractions would be truncated), and so are concrete entries outside
        `[-8, 7]` (their high bits would be dropped: 9 would unpack as -7);
        traced ones (under `jit`) cannot be checked and keep their low four bits.

    **Returns:**

    An `int8` array of shape `(*shape, ceil(n / 2))`: byte `i` holds element `i`
    (low bits) and element `i + ceil(n / 2)` (high bits).
    """
    values = jnp.asarray(values)
    if not jnp.issubdtype(values.dtype, jnp.integer):
        raise ValueError(
            f"pack_int4 packs integers; got {values.dtype} values, whose fractions "
            "would be truncated. Round and convert them first "
            "(`jnp.round(x).astype(jnp.int8)`), or quantise a float array with "
            "`quax_quant.quantise(x, bits=4)`."
        )
    if not isinstance(values, jax.core.Tracer) and values.size:
        with jax.ensure_compile_time_eval():
            low, high = int(jnp.min(values)), int(jnp.max(values))
        if low < -8 or high > 7:
            raise ValueError(
                f"pack_int4 packs signed 4-bit integers, in [-8, 7]; got values in "
                f"[{low}, {high}], whose bits beyond the low four would be dropped "
                "(9 would unpack as -7). Clip them (`jnp.clip(values, -8, 7)`) or "
                "keep them as int8 (`quax_quant.quantise(x, bits=8)`)."
            )
    return pack_nibbles(values)


def pack_nibbles(values: Array) -> Array:
    """`pack_int4` without its checks: for the family's own integers, in range by
    construction (rounded and clipped to the 4-bit levels)."""
    values = values.astype(jnp.int8)
    n = values.shape[-1]
    if n % 2:
        values = jnp.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, 1)])
    half = values.shape[-1] // 2
    low = lax.bitwise_and(values[..., :half], jnp.int8(0x0F))
    high = lax.shift_left(values[..., half:], jnp.int8(4))
    return lax.bitwise_or(low, high)


def unpack_int4(packed: Array, n: int) -> Array:
    """The inverse of [`quax_quant.pack_int4`][]: the first `n` signed 4-bit values
    along the last axis, as `int8`.

    **Arguments:**

    - `packed`: an `int8` array, shape `(*shape, ceil(n / 2))`.
    - `n`: the length of the unpacked last axis. It must be the length that was
        packed: byte `i` holds element `i + ceil(n / 2)` in its high bits, so
        another `n` (with another `ceil(n / 2)`) would read other elements.

    **Returns:**

    An `int8` array of shape `(*shape, n)`.
    """
    packed = jnp.asarray(packed)
    if packed.dtype != jnp.int8 or packed.ndim == 0:
        raise ValueError(
            "unpack_int4 needs the int8 bytes `pack_int4` returns (an array with a "
            f"last axis); got {packed.dtype} of shape {packed.shape}."
        )
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"unpack_int4 needs a length n >= 0, got n={n!r}.")
    if (n + 1) // 2 != packed.shape[-1]:
        raise ValueError(
            f"unpack_int4 got n={n} for {packed.shape[-1]} bytes along the last "
            f"axis; {n} values pack into ceil(n / 2) = {(n + 1) // 2} bytes, and "
            "byte i holds element i + ceil(n / 2) in its high bits, so another n "
            "would read other elements. Pass the length that was packed "
            f"({2 * packed.shape[-1] - 1} or {2 * packed.shape[-1]})."
        )
    four = jnp.int8(4)
    low = lax.shift_right_arithmetic(lax.shift_left(packed, four), four)
    high = lax.shift_right_arithmetic(packed, four)
    both = jnp.concatenate([low, high], axis=-1)
    return both if both.shape[-1] == n else both[..., :n]


def nibbles(packed: Array) -> tuple[Array, Array]:
    """The low and the high 4-bit values of `pack_int4`'s bytes, each sign-extended
    to `int8` and of `packed`'s shape: the first and the second half of the packed
    axis, without concatenating them (`unpack_int4` does)."""
    four = jnp.int8(4)
    low = lax.shift_right_arithmetic(lax.shift_left(packed, four), four)
    return low, lax.shift_right_arithmetic(packed, four)


# Quantising blocks --------------------------------------------------------------------


CALIBRATIONS = ("absmax", "percentile", "mse")


# Clipping ratios of the absmax range tried by `calibration="mse"`.
_MSE_RATIOS = np.linspace(0.3, 1.0, 36)


def _levels(bits: int, symmetric: bool) -> tuple[int, int]:
    """The integer range `[lo, hi]`: symmetric is the narrow range `[-m, m]`."""
    m = 2 ** (bits - 1)
    return (-(m - 1), m - 1) if symmetric else (-m, m - 1)


def _blocks(x: Array, scale_shape: tuple[int, ...]) -> Array:
    """`x` reshaped to `(s_0, g_0, s_1, g_1, ...)`: block `(i_0, i_1, ...)` of the
    scale layout is `x[i_0, :, i_1, :, ...]`, with `g = ceil(d / s)`. Where the
    blocks do not divide an axis (NF4's shorter last block), the axis is padded
    with zeros to `s * g` first, which changes no block's absmax (`_unblocks`
    cuts them off again)."""
    split = []
    pad = []
    for d, s in zip(x.shape, scale_shape, strict=True):
        g = -(-d // s)
        split += [s, g]
        pad.append((0, s * g - d))
    if any(p for _, p in pad):
        x = jnp.pad(x, pad)
    return x.reshape(split)


def _unblocks(blocks: Array, shape: tuple[int, ...]) -> Array:
    """The inverse of `_blocks`: `blocks` back to an array of `shape`."""
    padded = [blocks.shape[i] * blocks.shape[i + 1] for i in range(0, blocks.ndim, 2)]
    out = blocks.reshape(padded)
    if tuple(padded) != tuple(shape):
        out = lax.slice(out, (0,) * len(shape), tuple(shape))
    return out


def _reduce(blocks: Array, fn: Any) -> Array:
    """Reduce the within-block axes (the odd ones) of `_blocks`' output."""
    axes = tuple(range(1, blocks.ndim, 2))
    return fn(blocks, axis=axes)


def _round_trip(x: Array, scale: Array, zero: Array | None, lo: int, hi: int) -> Array:
    """The integers of `x` for `scale` and `zero` (in block layout `(s_0, 1, ...)`)."""
    q = jnp.round(x / scale)
    if zero is not None:
        q = q + zero
    return jnp.clip(q, lo, hi)


def _range(
    blocks: Array, calibration: str, percentile: float, symmetric: bool
) -> tuple[Array, Array]:
    """The calibrated `(low, high)` of each block, with `low <= 0 <= high`."""
    if calibration == "absmax":
        if symmetric:
            high = _reduce(jnp.abs(blocks), jnp.max)
            return -high, high
        return _reduce(blocks, jnp.min), _reduce(blocks, jnp.max)
    # percentile (and the starting point of the MSE search)
    axes = tuple(range(1, blocks.ndim, 2))
    if symmetric:
        high = jnp.percentile(jnp.abs(blocks), percentile, axis=axes)
        return -high, high
    low = jnp.percentile(blocks, 100 - percentile, axis=axes)
    return low, jnp.percentile(blocks, percentile, axis=axes)


def _scale_zero(
    low: Array, high: Array, bits: int, symmetric: bool
) -> tuple[Array, Array | None]:
    lo, hi = _levels(bits, symmetric)
    low, high = jnp.minimum(low, 0), jnp.maximum(high, 0)
    if symmetric:
        scale = high / hi
        zero = None
    else:
        scale = (high - low) / (hi - lo)
    scale = jnp.where(scale > 0, scale, jnp.ones_like(scale))
    if not symmetric:
        zero = jnp.clip(jnp.round(lo - low / scale), lo, hi)
    return scale, zero


def _expand(block: Array) -> Array:
    """A per-block array `(s_0, s_1, ...)` as `(s_0, 1, s_1, 1, ...)`."""
    return block.reshape([n for s in block.shape for n in (s, 1)])


def _mse_range(
    blocks: Array, bits: int, symmetric: bool, low: Array, high: Array
) -> tuple[Array, Array]:
    """Shrink `(low, high)` by the ratio (of `_MSE_RATIOS`) that minimises each
    block's squared quantisation error."""
    lo, hi = _levels(bits, symmetric)

    def error(ratio: Array) -> Array:
        scale, zero = _scale_zero(low * ratio, high * ratio, bits, symmetric)
        s = _expand(scale)
        z = None if zero is None else _expand(zero)
        q = _round_trip(blocks, s, z, lo, hi)
        deq = (q if z is None else q - z) * s
        return _reduce(jnp.square(deq - blocks), jnp.sum)

    ratios = jnp.asarray(_MSE_RATIOS, blocks.dtype)
    errors = jax.lax.map(error, ratios)
    best = ratios[jnp.argmin(errors, axis=0)]
    return low * best, high * best


@jax.custom_jvp
def _not_differentiable(x: Array) -> Array:
    return x


@_not_differentiable.defjvp
def _(primals: Any, tangents: Any) -> Any:
    del primals, tangents
    raise ValueError(
        "quax_quant.quantise is being differentiated with respect to its input, "
        "whose integers have no gradient. For quantisation-aware training pass "
        "straight_through=True (the gradient then flows through the quantisation as "
        "if it were the identity); otherwise quantise lax.stop_gradient(x)."
    )


@ft.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5, 6))
def quantised_leaves(
    x: Array,
    bits: int,
    scale_shape: tuple[int, ...],
    symmetric: bool,
    calibration: str,
    percentile: float,
    straight_through: bool,
) -> tuple[Array, Array, Array | None]:
    """The integers (packed for 4 bits), scales and zero points of `x`: one compiled
    program per layout, rather than a few dozen small ones when called eagerly."""
    data = lax.stop_gradient(x) if straight_through else _not_differentiable(x)
    # Calibrate in at least float32.
    data = data.astype(jnp.promote_types(x.dtype, jnp.float32))
    blocks = _blocks(data, scale_shape)
    low, high = _range(blocks, calibration, percentile, symmetric)
    if calibration == "mse":
        low, high = _mse_range(blocks, bits, symmetric, low, high)
    scale, zero = _scale_zero(low, high, bits, symmetric)
    # A block holding a NaN or an infinity has no integers that stand for it: its
    # scale becomes NaN, so that the whole block dequantises to NaN and every
    # product using it is NaN, never a finite number (its integers are stored as
    # 0, its zero point as 0). `quantise` refuses such a weight where it is
    # concrete; this is what a traced one gives.
    nonfinite = _reduce(~jnp.isfinite(blocks), jnp.any)
    scale = jnp.where(nonfinite, jnp.nan, scale)
    if zero is not None:
        zero = jnp.where(nonfinite, 0, zero)
    lo, hi = _levels(bits, symmetric)
    z = None if zero is None else _expand(zero)
    q = _round_trip(blocks, _expand(scale), z, lo, hi)
    q = _unblocks(jnp.where(jnp.isnan(q), 0, q).astype(jnp.int8), x.shape)
    values = pack_nibbles(q) if bits == 4 else q
    scale = scale.astype(x.dtype).reshape(scale_shape)
    if zero is not None:
        zero = zero.astype(x.dtype).reshape(scale_shape)
    return values, scale, zero


def _nonfinite_nan(blocks: Array, scale: Array) -> Array:
    """`scale` (per block of `blocks`) made NaN where its block holds a NaN or an
    infinity: no stored value stands for it, so the whole block dequantises to NaN
    and every product using it is NaN, never a finite number."""
    return jnp.where(_reduce(~jnp.isfinite(blocks), jnp.any), jnp.nan, scale)


def nf4_levels(q: Array, dtype: Any) -> Array:
    """The NF4 levels `NF4_CODE[q + 8]` of 4-bit values `q` in `[-8, 7]`, as `dtype`:
    a tree of selects on the four bits of `q + 8` between constants, which XLA on
    CPU vectorises (and fuses into a one-row product), where a gather from the
    16-entry table runs about twice as slowly."""
    index = q.astype(jnp.int32) + 8
    levels = [jnp.asarray(c, dtype) for c in NF4_CODE]
    for bit in range(4):
        set_ = ((index >> bit) & 1) == 1
        levels = [
            jnp.where(set_, levels[2 * i + 1], levels[2 * i])
            for i in range(len(levels) // 2)
        ]
    return levels[0]


def nf4_table(q: Array, dtype: Any) -> Array:
    """`nf4_levels` as a gather from the 16-entry table (`NF4_CODE[q + 8]`), which
    some backends run faster than the tree of selects."""
    return jnp.asarray(NF4_CODE, dtype)[q.astype(jnp.int32) + 8]


@ft.partial(jax.jit, static_argnums=(1,))
def nf4_leaves(x: Array, scale_shape: tuple[int, ...]) -> tuple[Array, Array]:
    """NF4 of `x` (bitsandbytes' format): each block's absmax is its scale, and each
    entry divided by it is rounded to the nearest level of `NF4_CODE`. Returns the
    level indices minus 8 (in `[-8, 7]`), packed two per byte along the last axis
    (`pack_int4`), and the scale (`x`'s dtype, `scale_shape`)."""
    data = _not_differentiable(x).astype(jnp.promote_types(x.dtype, jnp.float32))
    blocks = _blocks(data, scale_shape)
    absmax = _reduce(jnp.abs(blocks), jnp.max)
    scale = _nonfinite_nan(blocks, jnp.where(absmax > 0, absmax, 1))
    normed = blocks / _expand(scale)
    code = jnp.asarray(NF4_CODE, normed.dtype)
    # The nearest level: how many midpoints between neighbouring levels lie below.
    index = jnp.searchsorted((code[1:] + code[:-1]) / 2, normed.ravel())
    q = jnp.where(jnp.isnan(normed.ravel()), 8, index) - 8
    values = pack_nibbles(_unblocks(q.astype(jnp.int8).reshape(normed.shape), x.shape))
    return values, scale.astype(x.dtype).reshape(scale_shape)


@ft.partial(jax.jit, static_argnums=(1, 2))
def float8_leaves(
    x: Array, fmt: str, scale_shape: tuple[int, ...]
) -> tuple[Array, Array]:
    """`x` as float8 numbers of dtype `fmt` times a float scale per block: each
    block's absmax maps to the dtype's largest finite number (448 for
    `float8_e4m3fn`, 57344 for `float8_e5m2`). Entries are clipped to it before the
    cast (the scaled absmax can round just past it, and a float8 cast beyond it
    gives NaN or an infinity). Returns the values and the scale (`x`'s dtype)."""
    data = _not_differentiable(x).astype(jnp.promote_types(x.dtype, jnp.float32))
    blocks = _blocks(data, scale_shape)
    top = float(jnp.finfo(fmt).max)
    absmax = _reduce(jnp.abs(blocks), jnp.max)
    scale = _nonfinite_nan(blocks, jnp.where(absmax > 0, absmax / top, 1))
    scaled = jnp.clip(blocks / _expand(scale), -top, top)
    values = _unblocks(jnp.where(jnp.isnan(scaled), 0, scaled).astype(fmt), x.shape)
    return values, scale.astype(x.dtype).reshape(scale_shape)


@ft.partial(jax.jit, static_argnums=(1,))
def double_quantise(scale: Array, block_size: int) -> tuple[Array, Array, Array]:
    """QLoRA's double quantisation of a float `scale` array: minus its mean
    (`offset`, float32), flattened and cut into blocks of `block_size`, each block
    symmetric int8 with one float32 scale (its absmax over 127). Returns
    `(codes, block_scale, offset)`: `codes` int8 of `scale`'s shape.

    A NaN or infinite scale (a block of the weight holding one, under a transform)
    is left out of the mean and makes its whole block's `block_scale` NaN, so that
    every scale of that block dequantises to NaN, never a finite number."""
    flat = jnp.ravel(scale).astype(jnp.float32)
    n = flat.shape[0]
    finite = jnp.isfinite(flat)
    offset = jnp.sum(jnp.where(finite, flat, 0)) / jnp.maximum(jnp.sum(finite), 1)
    pad = (-n) % block_size
    centred = jnp.pad(jnp.where(finite, flat - offset, 0), (0, pad))
    blocks = centred.reshape(-1, block_size)
    high = jnp.max(jnp.abs(blocks), axis=1)
    block_scale = jnp.where(high > 0, high / 127, 1)
    codes = jnp.clip(jnp.round(blocks / block_scale[:, None]), -127, 127)
    bad = jnp.pad(~finite, (0, pad)).reshape(-1, block_size).any(axis=1)
    block_scale = jnp.where(bad, jnp.nan, block_scale)
    codes = codes.astype(jnp.int8).ravel()[:n].reshape(jnp.shape(scale))
    return codes, block_scale, offset


# Products -----------------------------------------------------------------------------


def sides(dn: DimensionNumbers, lhs: bool) -> tuple[list[int], list[int]]:
    (lc, rc), (lb, rb) = dn
    return (list(lc), list(lb)) if lhs else (list(rc), list(rb))


def to_out(
    block: Array, lhs: bool, dn: DimensionNumbers, lhs_ndim: int, rhs_ndim: int
) -> Array:
    """`block`, defined on the axes of one operand (`lhs` or not) with size 1 on its
    contracted axes, laid out for broadcasting against `dot_general`'s output
    `(batch, lhs free, rhs free)`."""
    contract, batch = sides(dn, lhs)
    ndim = lhs_ndim if lhs else rhs_ndim
    free = [a for a in range(ndim) if a not in contract and a not in batch]
    order = batch + free
    block = jnp.transpose(block, order + contract)
    block = block.reshape(block.shape[: len(order)])
    other_contract, other_batch = sides(dn, not lhs)
    other_free = (
        (rhs_ndim if lhs else lhs_ndim) - len(other_contract) - len(other_batch)
    )
    shape = list(block.shape)
    if lhs:
        shape += [1] * other_free
    else:
        shape = shape[: len(batch)] + [1] * other_free + shape[len(batch) :]
    return block.reshape(shape)


def split_groups(
    arr: Array, groups: dict[int, int]
) -> tuple[Array, dict[int, int], dict[int, int]]:
    """Split each axis `a` in `groups` into `(groups[a], rest)`. `arr` is an operand
    (full size along `a`) or a block array (size `groups[a]` or 1 along `a`).
    Returns the new array, and maps old axis -> new axis of the rest (every axis)
    and old axis -> new axis of the groups (split axes)."""
    shape: list[int] = []
    inner: dict[int, int] = {}
    outer: dict[int, int] = {}
    for a, d in enumerate(arr.shape):
        if a in groups:
            n = groups[a]
            outer[a] = len(shape)
            shape += [n, d // n] if d % n == 0 and d > n else [d, 1]
        inner[a] = len(shape) - 1 if a in groups else len(shape)
        if a not in groups:
            shape.append(d)
    return arr.reshape(shape), inner, outer


def quantise_rows(
    x: Array,
    contract: Sequence[int],
    fmt: str = "int",
    static_scale: Array | None = None,
) -> tuple[Array, Array]:
    """`x` quantised with one scale per row (constant along the contracted axes), as
    `(values, scale)`; the scale keeps `x`'s axes. For `fmt="int"` symmetric int8
    (`x / scale` rounded, in `[-127, 127]`), for a float8 format `x / scale` in
    that dtype, clipped to its largest finite number first (a float8 cast beyond it
    gives NaN or an infinity, not the largest number).

    The scale is the row's absmax over the largest level, or `static_scale` (a
    float32 scalar fixed by `quax_quant.calibrate`) for every row: entries beyond
    its range are clipped (saturate).

    A row holding a NaN or an infinity gets a NaN scale (and values 0), so that
    its products are NaN, as the float product is NaN (or infinite) there: int8
    has no integer for it, and clipping would give a finite row."""
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    top = 127.0 if fmt == "int" else float(jnp.finfo(fmt).max)
    # `initial`: a row with nothing to contract (an empty axis) has absmax 0.
    high = jnp.max(jnp.abs(x32), axis=tuple(contract), keepdims=True, initial=0)
    if static_scale is None:
        scale = jnp.where(high > 0, high / top, 1)
    else:
        scale = jnp.broadcast_to(static_scale.astype(high.dtype), high.shape)
    scale = jnp.where(jnp.isfinite(high), scale, jnp.nan).astype(high.dtype)
    scaled = x32 / scale
    if fmt == "int":
        scaled = jnp.round(scaled)
    q = jnp.clip(scaled, -top, top)
    return jnp.where(jnp.isnan(q), 0, q).astype(jnp.int8 if fmt == "int" else fmt), (
        scale
    )


def reduce_dot(lhs: Array, rhs: Array, dn: DimensionNumbers) -> Array:
    """`dot_general` as a broadcast multiply and a sum: for one row, XLA fuses the
    integer-to-float conversion into it instead of writing out a float weight.
    Free axes of size 1 are left out of the multiply (XLA on CPU runs a reduction
    with a leading unit axis two hundred times slower)."""
    (lc, rc), (lb, rb) = dn
    lf = [a for a in range(lhs.ndim) if a not in lc and a not in lb]
    rf = [a for a in range(rhs.ndim) if a not in rc and a not in rb]
    batch = [lhs.shape[a] for a in lb]
    contract = [lhs.shape[a] for a in lc]
    l_free = [lhs.shape[a] for a in lf if lhs.shape[a] != 1]
    r_free = [rhs.shape[a] for a in rf if rhs.shape[a] != 1]
    lhs2 = jnp.transpose(lhs, [*lb, *lf, *lc]).reshape(
        *batch, *l_free, *[1] * len(r_free), *contract
    )
    rhs2 = jnp.transpose(rhs, [*rb, *rf, *rc]).reshape(
        *batch, *[1] * len(l_free), *r_free, *contract
    )
    out = jnp.sum(lhs2 * rhs2, axis=tuple(range(-len(contract), 0)))
    shape = [*batch, *[lhs.shape[a] for a in lf], *[rhs.shape[a] for a in rf]]
    return out.reshape(shape)


def one_row_dot(lhs: Array, rhs: Array, dn: DimensionNumbers, w_is_lhs: bool) -> Array:
    """A one-row product, written as `x @ w.T` with `x` of shape `(1, k)`: the form
    for which XLA on CPU fuses the conversion of `w` into the product (0.35x the
    float32 time at 2048 x 2048, where `w @ x` converts the whole weight first and
    takes 10x). With batch axes, a fused multiply-and-sum."""
    if dn[1][0]:
        return reduce_dot(lhs, rhs, dn)
    w, x = (lhs, rhs) if w_is_lhs else (rhs, lhs)
    w_contract = dn[0][0] if w_is_lhs else dn[0][1]
    k = math.prod(w.shape[a] for a in w_contract)
    free = math.prod(d for a, d in enumerate(w.shape) if a not in w_contract)
    # Canonical layout (`_product`): free axes, then contracted ones.
    w2 = w.reshape(free, k)
    out = lax.dot_general(x.reshape(1, k), jnp.transpose(w2), (((1,), (0,)), ((), ())))
    shape = [lhs.shape[a] for a in range(lhs.ndim) if a not in dn[0][0]]
    shape += [rhs.shape[a] for a in range(rhs.ndim) if a not in dn[0][1]]
    return out.reshape(shape)
