"""The value type: `QuantisedArray`, integers times float scales."""

import dataclasses
import math
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import quax
from jax import lax
from jaxtyping import Array

from ._kernels import nf4_levels, unpack_int4


__all__ = [
    "FLOAT8_FORMATS",
    "FORMATS",
    "MATMUL_PATHS",
    "QuantMaterialisationError",
    "QuantisedArray",
    "QuantisedScale",
    "dtype_of",
    "repeat_blocks",
]

# How a product with a float operand is computed; see `quax_quant.matmul_path`.
# `"int8"` quantises the activations to int8 (format `"int"`), `"float8"` to the
# weight's float8 format.
MATMUL_PATHS = ("auto", "weight_only", "int8", "float8")

# What the stored values are: integers (`"int"`), indices into the NF4 code book
# (`"nf4"`), or float8 numbers (JAX's dtypes of those names).
FLOAT8_FORMATS = ("float8_e4m3fn", "float8_e5m2")
FORMATS = ("int", "nf4", *FLOAT8_FORMATS)

# The paths each format's product with a float operand can take.
_PATHS_OF = {
    "int": ("auto", "weight_only", "int8"),
    "nf4": ("auto", "weight_only"),
    "float8_e4m3fn": ("auto", "weight_only", "float8"),
    "float8_e5m2": ("auto", "weight_only", "float8"),
}


class QuantMaterialisationError(quax.MaterialisationError):
    """A `QuantisedArray` with `allow_materialise=False` met an operation that has
    no quantised rule and would need the dequantised float array. Its message starts
    with "Refusing to materialise `QuantisedArray`", as the core's policy
    ([`quax.MaterialisationError`][], a `RuntimeError`) words every refusal."""


class _PassedValueChecks:
    """The JAX arrays whose values a check of `QuantisedArray` has read and
    passed, by check and identity. A value's `__check_init__` runs at
    construction and again each time `quax.quaxify` takes the value in from
    outside (an eager call boxes its arguments on every call); the checks that
    read array values (a host copy of `act_scale`, the sort of `input_order`, a
    reduction over the whole `values`) then run once per array, not once per call.
    A JAX array never changes its values, so an array that passed still passes;
    one rebuilt into the value (`eqx.tree_at`, an optimiser's update) is another
    array, read again. NumPy arrays (mutable) and tracers (no values) are not
    remembered."""

    def __init__(self) -> None:
        self._passed: dict[tuple[str, int], weakref.ref] = {}

    def __contains__(self, key: tuple[str, Any]) -> bool:
        check, array = key
        ref = self._passed.get((check, id(array)))
        return ref is not None and ref() is array

    def add(self, check: str, array: Any) -> None:
        if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer):
            return
        key = (check, id(array))
        # Forgotten when the array is freed (its id may then name another one; a
        # lookup also compares identity, so a stale entry never passes it).
        self._passed[key] = weakref.ref(array, lambda _: self._passed.pop(key, None))


_passed_value_checks = _PassedValueChecks()


def _extremes(values: Any) -> tuple[int, int]:
    """The least and the greatest of concrete, non-empty integer `values`."""
    with jax.ensure_compile_time_eval():
        return int(jnp.min(values)), int(jnp.max(values))


def _blocks_fit(d: int, s: int, *, partial: bool) -> bool:
    """Whether `s` scale blocks lay out an axis of length `d`: one block along an
    empty axis; otherwise `s` dividing `d`, or, with `partial` (NF4), any `s` in
    `[1, d]` whose blocks of `ceil(d / s)` leave none empty."""
    if d == 0:
        return s == 1
    if not 1 <= s <= d:
        return False
    return (s - 1) * -(-d // s) < d if partial else d % s == 0


def repeat_blocks(block: Array, shape: Sequence[int], axes: Sequence[int]) -> Array:
    """`block` (a scale layout: along each axis of length `d` either 1 entry, or
    one per block of `ceil(d / blocks)` consecutive indices) repeated to full
    length `shape[a]` along each of `axes`; a shorter last block is cut."""
    for a in axes:
        n = block.shape[a]
        d = shape[a]
        if n > 1 and d != n:
            g = -(-d // n)
            block = jnp.repeat(block, g, axis=a)
            if n * g != d:
                block = lax.slice_in_dim(block, 0, d, axis=a)
    return block


def dtype_of(x: Any) -> np.dtype:
    """The dtype of an array, a tracer or anything NumPy reads as an array."""
    dtype = getattr(x, "dtype", None)
    return np.dtype(np.asarray(x).dtype if dtype is None else dtype)


class QuantisedScale(eqx.Module):
    """Double quantisation (QLoRA's): the block scales of a `QuantisedArray`,
    themselves stored as 8-bit integers. The scales minus their mean `offset` are
    flattened (row-major) and cut into blocks of `block_size` consecutive scales,
    each stored as symmetric int8 times one float32 scale per block:
    `scale = codes * block_scale[block] + offset`.

    bitsandbytes rounds the centred scales with its 8-bit "dynamic" code book; this
    uses linear int8, with the same memory (8 bits per scale, 32 bits per block of
    256 and one float32 offset).

    **Fields:**

    - `codes`: `int8`, in the layout the scales were quantised in (their
        row-major order gives the blocks).
    - `block_scale`: float32, shape `(ceil(codes.size / block_size),)` (for a
        stack, see below).
    - `offset`: float32 scalar, the mean of the scales (for a stack, see below).
    - `block_size`: scales per block (static).
    - `float_dtype`: the dtype of the dequantised scale (static).
    - `permutation`: `None`, or the axes of `codes` in the order of the scale it
        stands for (`jnp.transpose(codes, permutation)`; static): a transposed
        array keeps its int8 codes in place, its blocks unchanged.

    Transposes ([`QuantisedScale.transpose`][]) and slices that keep whole blocks
    ([`QuantisedScale.slice`][]) stay int8.

    A stack of them, leaf by leaf (as `jnp.stack` over a batch of copies gives,
    e.g. `quax.testing`'s vmap checks or a stack of layers), is one
    `QuantisedScale` with leading batch axes: `offset` then has the batch shape
    `B`, `codes` shape `(*B, *S)` and `block_scale` shape `(*B, ceil(prod(S) /
    block_size))`, each batch element quantised on its own (its own blocks of its
    own codes, its own offset). The batch axes are the first `offset.ndim` axes of
    `codes`; with a scalar `offset` there are none.
    """

    codes: Array
    block_scale: Array
    offset: Array
    block_size: int = eqx.field(static=True, default=256)
    float_dtype: Any = eqx.field(static=True, default=np.dtype(np.float32))
    permutation: tuple[int, ...] | None = eqx.field(static=True, default=None)

    def __check_init__(self) -> None:
        if dtype_of(self.codes) != np.int8:
            raise ValueError(
                f"QuantisedScale's codes must be int8, got {dtype_of(self.codes)}."
            )
        if self.block_size < 1:
            raise ValueError(
                f"QuantisedScale's block_size must be positive, got {self.block_size}."
            )
        stored = tuple(np.shape(self.codes))
        batch = tuple(np.shape(self.offset))
        if stored[: len(batch)] != batch:
            raise ValueError(
                f"QuantisedScale's offset must be a scalar, or, for a stack of "
                f"double-quantised scales, have the shape of the leading (batch) axes "
                f"of codes; got offset shape {batch} for codes of shape {stored}."
            )
        blocks = -(-math.prod(stored[len(batch) :]) // self.block_size)
        if np.shape(self.block_scale) != (*batch, blocks):
            raise ValueError(
                f"QuantisedScale's block_scale must have shape {(*batch, blocks)} (one "
                f"per block of {self.block_size} codes"
                + (f", for each of the {batch} stacked scales" if batch else "")
                + f"), got {np.shape(self.block_scale)}."
            )
        for field in ("block_scale", "offset"):
            if dtype_of(getattr(self, field)) != np.float32:
                raise ValueError(
                    f"QuantisedScale's {field} must be float32, got "
                    f"{dtype_of(getattr(self, field))}."
                )

    @property
    def shape(self) -> tuple[int, ...]:
        stored = tuple(np.shape(self.codes))
        if self.permutation is None:
            return stored
        return tuple(stored[a] for a in self.permutation)

    @property
    def nbytes(self) -> int:
        floats = int(np.size(self.block_scale)) + int(np.size(self.offset))
        return int(np.size(self.codes)) + 4 * floats

    def dequantise(self) -> Array:
        """The float scale, shape `self.shape`, dtype `self.float_dtype` (each
        stacked scale from its own blocks and offset, where there are batch axes)."""
        stored = tuple(np.shape(self.codes))
        batch = tuple(np.shape(self.offset))
        flat = jnp.reshape(self.codes, (*batch, -1)).astype(jnp.float32)
        n = flat.shape[-1]
        pad = (-n) % self.block_size
        widths = [(0, 0)] * len(batch) + [(0, pad)]
        blocks = jnp.pad(flat, widths).reshape(*batch, -1, self.block_size)
        offset = jnp.reshape(self.offset, (*batch, 1, 1))
        out = blocks * self.block_scale[..., None] + offset
        out = out.reshape(*batch, -1)[..., :n].reshape(stored).astype(self.float_dtype)
        return out if self.permutation is None else jnp.transpose(out, self.permutation)

    def transpose(self, axes: Sequence[int]) -> "QuantisedScale":
        """This scale transposed (`jnp.transpose(scale, axes)`), its int8 codes and
        blocks as they are: only the `permutation` changes."""
        current = self.permutation or tuple(range(len(self.shape)))
        new = tuple(current[a] for a in axes)
        identity = new == tuple(range(len(new)))
        return dataclasses.replace(self, permutation=None if identity else new)

    def slice(
        self, starts: Sequence[int], limits: Sequence[int]
    ) -> "QuantisedScale | None":
        """This scale sliced (`scale[starts:limits]` per axis, unit strides) with
        its codes int8, where the slice keeps whole blocks: in the codes' layout,
        the entries kept of each stacked scale are consecutive in row-major order
        (one axis after the batch axes cut, the ones between the batch axes and it
        of size 1, the ones after it whole) and start at a block boundary; the
        batch axes (see the class docstring) may be sliced anyhow, their block
        scales and offsets with them. `None` otherwise (dequantise it instead)."""
        stored = tuple(np.shape(self.codes))
        nb = np.ndim(self.offset)
        order = self.permutation or tuple(range(len(stored)))
        lo, hi = [0] * len(stored), list(stored)
        for a, (start, limit) in enumerate(zip(starts, limits, strict=True)):
            lo[order[a]], hi[order[a]] = int(start), int(limit)
        if (lo, hi) == ([0] * len(stored), list(stored)):
            return self
        cut = [a for a in range(nb, len(stored)) if (lo[a], hi[a]) != (0, stored[a])]
        first_block, end_block = 0, np.shape(self.block_scale)[-1]
        if cut:
            k = cut[0]
            if cut != [k] or any(stored[a] != 1 for a in range(nb, k)):
                return None
            inner = math.prod(stored[k + 1 :])
            first, end = lo[k] * inner, hi[k] * inner
            if first % self.block_size:
                return None
            first_block = first // self.block_size
            end_block = -(-end // self.block_size)
        return dataclasses.replace(
            self,
            codes=lax.slice(self.codes, tuple(lo), tuple(hi)),
            block_scale=lax.slice(
                self.block_scale, (*lo[:nb], first_block), (*hi[:nb], end_block)
            ),
            offset=lax.slice(self.offset, tuple(lo[:nb]), tuple(hi[:nb])),
        )


class QuantisedArray(quax.GuardedValue):
    """A float array stored as integers times float scales: `(q - z) * s`.

    `q` is `int8` (`bits=8`), or 4-bit integers packed two per byte along the last
    axis (`bits=4`). The scale `s` (and the zero point `z`, when asymmetric) has one
    entry per block of the array: it has the array's number of axes, and along each
    axis of size `d` it has size `d / g` for a group size `g` dividing `d`. Size 1 is
    one scale for the whole axis, size `d` one per index (per channel), anything in
    between one per group of `g` consecutive indices. So per-tensor, per-channel (any
    axis) and per-group scaling are the same representation. An empty axis (size
    0) has one block. For `format="nf4"` the size `s` along an axis need not
    divide `d`: the blocks hold `g = ceil(d / s)` consecutive indices each and
    the last one is shorter (none may be empty), which is how `quantise` lays
    out a `block_size` that does not divide the axis.

    The stored values are, by `format`: integers (`"int"`, the above); `"nf4"`,
    4-bit indices into bitsandbytes' NF4 code book (`q` stands for
    `NF4_CODE[q + 8]`, times the block's absmax scale; QLoRA's format); or
    `"float8_e4m3fn"` / `"float8_e5m2"`, float8 numbers (JAX's dtypes) times the
    scale. So the array is always `(level(q) - z) * s`, with `level` the identity
    for `"int"`.

    Build one with [`quax_quant.quantise`][] (or from a GPTQ/AWQ checkpoint with
    [`quax_quant.from_gptq`][]). Inside [`quax.quaxify`][] a product with
    a float array never forms the float weight: the scale is folded in after the
    contraction (or into the activations), and two quantised operands multiply in
    integers accumulating in `int32`. `transpose`, `reshape`, slicing, squeezing,
    negation, multiplication by a scalar and float dtype conversion keep the
    quantisation; any other primitive raises a
    [`quax_quant.QuantMaterialisationError`][] naming it, unless the array was made with
    `allow_materialise=True`: the core's materialisation policy
    ([`quax.GuardedValue`][]).

    The dense array is not a linear function of the leaves (integers times scales):
    `linear_in_leaves = False`.

    **Fields:**

    - `values`: the integers, `int8`; for `bits=4` (`"int"` and `"nf4"`) packed,
        shape `(*shape[:-1], ceil(shape[-1] / 2))`; for the float8 formats, the
        float8 numbers (dtype named by the format).
    - `scale`: the float scales, in `float_dtype`, block layout as above; or a
        [`quax_quant.QuantisedScale`][] (double quantisation), whose `dequantise()`
        is that array. Every operation first dequantises such a scale (it has one
        entry per block, 1/64 of the array's for NF4 blocks of 64): products
        compute it on the fly, structural operations return an array with the
        float scale.
    - `zero_point`: `None` (symmetric) or the zero points, like `scale`, in
        `float_dtype` (integer-valued).
    - `master`: `None`, or the float array the integers were computed from, for
        straight-through gradients (see `quantise(..., straight_through=True)`).
    - `bits`: 8 or 4 (static).
    - `float_dtype`: the dtype of the dequantised array (static); also `.dtype`.
    - `odd`: whether a `bits=4` array's packed axis has odd length (static).
    - `packed_axis`: the axis a `bits=4` array is packed along, counted from the end
        (static; `-1` unless a transpose moved it: transposes permute the bytes and
        never repack).
    - `matmul`: the product path with a float operand: `"auto"`, `"weight_only"`,
        `"int8"` (format `"int"`) or `"float8"` (float8 formats) (static; see
        [`quax_quant.matmul_path`][]).
    - `format`: `"int"`, `"nf4"`, `"float8_e4m3fn"` or `"float8_e5m2"` (static).
    - `act_scale`: `None`, or a float32 scalar: the static scale of the
        activations that the `"int8"` / `"float8"` product quantises, fixed by
        [`quax_quant.calibrate`][] (otherwise one absmax scale per row, per call);
        positive and finite (checked where concrete).
    - `input_order`: `None`, or an integer permutation of the last axis (the
        input features of an `eqx.nn.Linear` weight `(out, in)`): the stored
        integers and blocks hold that axis in this order, column `j` of them
        being column `input_order[j]` of the array (GPTQ's act-order checkpoints,
        read by [`quax_quant.from_gptq`][], whose groups are contiguous only in
        that order). A product contracting the last axis gathers the other
        operand's features in this order (`x[..., input_order]`) and multiplies
        the stored blocks; operations that would move the last axis (transposes,
        reshapes, slices, broadcasts, convolutions, quantised x quantised
        products) refuse, and `dequantise` puts the columns back.
    - `allow_materialise`: whether operations without a rule may dequantise
        (static, keyword-only).
    """

    values: Array
    scale: Array
    zero_point: Array | None
    master: Array | None
    bits: int = eqx.field(static=True)
    float_dtype: Any = eqx.field(static=True)
    odd: bool = eqx.field(static=True, default=False)
    packed_axis: int = eqx.field(static=True, default=-1)
    matmul: str = eqx.field(static=True, default="auto")
    format: str = eqx.field(static=True, default="int")
    act_scale: Array | None = None
    input_order: Array | None = None

    linear_in_leaves: ClassVar[bool] = False
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        QuantMaterialisationError
    )

    def __check_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"QuantisedArray supports bits=8 or 4, got {self.bits}.")
        if self.format not in FORMATS:
            raise ValueError(
                f"QuantisedArray's format must be one of {FORMATS}, got "
                f"{self.format!r}."
            )
        if self.format != "int":
            self._check_format()
        else:
            self._check_values()
        if not -max(np.ndim(self.values), 1) <= self.packed_axis < 0:
            raise ValueError(
                "QuantisedArray's packed_axis counts from the end (-1, -2, ...), got "
                f"{self.packed_axis} for {np.ndim(self.values)} axes."
            )
        if self.matmul not in _PATHS_OF[self.format]:
            raise ValueError(
                f"QuantisedArray's matmul must be one of {_PATHS_OF[self.format]} "
                f"for format {self.format!r}, got {self.matmul!r}."
            )
        if not jnp.issubdtype(self.float_dtype, jnp.floating):
            raise ValueError(
                "QuantisedArray needs a floating float_dtype, got "
                f"{np.dtype(self.float_dtype)}."
            )
        shape = self.shape
        scale_shape = self.scale_shape
        if len(scale_shape) != len(shape) or not all(
            _blocks_fit(d, s, partial=self.format == "nf4")
            for d, s in zip(shape, scale_shape, strict=True)
        ):
            raise ValueError(
                "QuantisedArray's scale must have one axis per array axis, each of a "
                "size dividing the array's (1 along an empty axis"
                + (
                    "; for format 'nf4' any number of blocks from 1 to the axis' "
                    "length that leaves none empty: blocks of ceil(length / blocks) "
                    "entries, the last one shorter"
                    if self.format == "nf4"
                    else ""
                )
                + f"); got scale shape {scale_shape} for array shape {shape}."
            )
        if self.zero_point is not None and np.shape(self.zero_point) != scale_shape:
            raise ValueError(
                f"QuantisedArray's zero_point must have the scale's shape "
                f"{scale_shape}, got {np.shape(self.zero_point)}."
            )
        if self.act_scale is not None and (
            np.shape(self.act_scale) != () or dtype_of(self.act_scale) != np.float32
        ):
            raise ValueError(
                "QuantisedArray's act_scale (the calibrated activation scale) must "
                f"be a float32 scalar, got shape {np.shape(self.act_scale)} and "
                f"dtype {dtype_of(self.act_scale)}."
            )
        if (
            self.act_scale is not None
            and not isinstance(self.act_scale, jax.core.Tracer)
            and ("act_scale", self.act_scale) not in _passed_value_checks
        ):
            act = float(np.asarray(self.act_scale))
            if not (np.isfinite(act) and act > 0):
                # The product divides the activations by it: 0 made every product
                # 0, a negative one flipped and saturated the activations.
                raise ValueError(
                    "QuantisedArray's act_scale (the calibrated activation scale) "
                    f"must be a positive finite number, got {act}: the int8 / "
                    "float8 product divides the activations by it. Set it with "
                    "`quax_quant.calibrate`, or leave it None (one absmax scale "
                    "per row, per call)."
                )
            _passed_value_checks.add("act_scale", self.act_scale)
        if self.input_order is not None:
            self._check_order(shape)
        if self.master is not None and tuple(np.shape(self.master)) != shape:
            raise ValueError(
                f"QuantisedArray's master (the float array for straight-through "
                f"gradients) must have the array's shape {shape}, got "
                f"{tuple(np.shape(self.master))}."
            )
        if isinstance(self.scale, QuantisedScale) and np.dtype(
            self.scale.float_dtype
        ) != np.dtype(self.float_dtype):
            raise ValueError(
                "QuantisedArray's scale (a QuantisedScale) must dequantise to "
                f"float_dtype {np.dtype(self.float_dtype)}, got "
                f"{np.dtype(self.scale.float_dtype)}."
            )
        for field in ("scale", "zero_point", "master"):
            leaf = getattr(self, field)
            if isinstance(leaf, QuantisedScale):
                continue
            if leaf is not None and not jnp.issubdtype(dtype_of(leaf), jnp.floating):
                raise ValueError(
                    f"QuantisedArray's {field} must be floating-point, got "
                    f"{dtype_of(leaf)}."
                )

    def _check_order(self, shape: tuple[int, ...]) -> None:
        """`input_order` permutes the last axis: integers, one per column, each
        column once (where concrete)."""
        order = self.input_order
        assert order is not None
        if (
            not shape
            or np.shape(order) != (shape[-1],)
            or not jnp.issubdtype(dtype_of(order), jnp.integer)
        ):
            columns = shape[-1] if shape else 0
            raise ValueError(
                "QuantisedArray's input_order must be an integer array with one "
                f"entry per column of the last axis, shape ({columns},); got "
                f"{dtype_of(order)} of shape {np.shape(order)} for an array of "
                f"shape {shape}."
            )
        if isinstance(order, jax.core.Tracer) or ("order", order) in (
            _passed_value_checks
        ):
            return
        if not np.array_equal(np.sort(np.asarray(order)), np.arange(shape[-1])):
            raise ValueError(
                f"QuantisedArray's input_order must be a permutation of "
                f"0..{shape[-1] - 1} (each column of the last axis once); it repeats "
                "or leaves out a column."
            )
        _passed_value_checks.add("order", order)

    def _check_format(self) -> None:
        """The stored values of the `"nf4"` and float8 formats."""
        dtype = dtype_of(self.values)
        if self.zero_point is not None:
            raise ValueError(
                f"QuantisedArray's zero_point must be None for format "
                f"{self.format!r} (its levels are symmetric about 0 already)."
            )
        if self.format == "nf4":
            if dtype != np.int8 or (self.bits == 4 and np.ndim(self.values) == 0):
                raise ValueError(
                    "QuantisedArray's values for format 'nf4' must be int8: bytes "
                    "holding two 4-bit code indices each (bits=4, packed along an "
                    "axis, see `quax_quant.pack_int4`), or one per byte (bits=8, "
                    f"as products slice them); got bits={self.bits} and {dtype} "
                    f"values of shape {np.shape(self.values)}."
                )
            if self.bits == 4:
                return
            self._check_nf4_indices()
        elif self.bits != 8 or dtype != np.dtype(self.format):
            raise ValueError(
                f"QuantisedArray's values for format {self.format!r} must be "
                f"{self.format} numbers with bits=8, got bits={self.bits} and "
                f"{dtype} values."
            )
        if self.odd or self.packed_axis != -1:
            raise ValueError(
                "QuantisedArray's odd and packed_axis describe bits=4 packing; with "
                f"format {self.format!r} and bits=8 they must be False and -1, got "
                f"odd={self.odd}, packed_axis={self.packed_axis}."
            )

    def _check_nf4_indices(self) -> None:
        """Unpacked NF4 code indices (one per byte, `bits=8`) lie in `[-8, 7]`: the
        levels read only the low four bits of `q + 8`, so `100` would stand for the
        level of `4`, silently. Traced values cannot be checked; values that passed
        before are not read again."""
        if (
            isinstance(self.values, jax.core.Tracer)
            or ("nf4 indices", self.values) in _passed_value_checks
            or not np.size(self.values)
        ):
            return
        low, high = _extremes(self.values)
        if low < -8 or high > 7:
            raise ValueError(
                "QuantisedArray's values for format 'nf4' with bits=8 are code "
                "indices, one per byte, in [-8, 7] (`q` stands for "
                f"`NF4_CODE[q + 8]`); got values in [{low}, {high}], which name no "
                "level. Build the array with `quax_quant.quantise(x, format='nf4')`, "
                "or clip the indices (`jnp.clip(values, -8, 7)`)."
            )
        _passed_value_checks.add("nf4 indices", self.values)

    def _check_values(self) -> None:
        """`values` are integers in the range of `bits`, stored as the layout says:
        a float `values` would be used as given by the weight-only product and
        truncated by the int8 one."""
        dtype = dtype_of(self.values)
        if not jnp.issubdtype(dtype, jnp.integer):
            raise ValueError(
                f"QuantisedArray's values must be integers, got {dtype} values: "
                "build a QuantisedArray from a float array with "
                "`quax_quant.quantise`, or round and convert the integers yourself "
                "(e.g. `.astype(jnp.int8)`)."
            )
        if self.bits == 4:
            if dtype != np.int8:
                raise ValueError(
                    "QuantisedArray's values must be int8 for bits=4 (two 4-bit "
                    f"integers packed per byte, see `quax_quant.pack_int4`), got "
                    f"{dtype}."
                )
            if np.ndim(self.values) == 0:
                raise ValueError(
                    "QuantisedArray's values need an axis to pack along for bits=4 "
                    "(two 4-bit integers per byte), got a scalar."
                )
            return
        if self.odd or self.packed_axis != -1:
            raise ValueError(
                "QuantisedArray's odd and packed_axis describe bits=4 packing; with "
                f"bits=8 they must be False and -1, got odd={self.odd}, "
                f"packed_axis={self.packed_axis}."
            )
        if (
            dtype == np.int8
            or isinstance(self.values, jax.core.Tracer)
            or ("values", self.values) in _passed_value_checks
        ):
            # int8 is always in range; traced integers cannot be checked (products
            # convert them to int8, wrapping around outside [-128, 127]); these
            # passed before.
            return
        if np.size(self.values):
            low, high = _extremes(self.values)
            if low < -128 or high > 127:
                raise ValueError(
                    "QuantisedArray's values must lie in [-128, 127] for bits=8, got "
                    f"{dtype} values in [{low}, {high}]."
                )
        _passed_value_checks.add("values", self.values)

    # Layout ---------------------------------------------------------------------------

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.shape, self.float_dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(np.shape(self.values))
        if self.bits == 4 and shape:
            shape[self.packed_axis] = 2 * shape[self.packed_axis] - int(self.odd)
        return tuple(shape)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """The shape of the scale (block layout), double-quantised or not."""
        if isinstance(self.scale, QuantisedScale):
            return self.scale.shape
        return tuple(np.shape(self.scale))

    @property
    def group_sizes(self) -> tuple[int, ...]:
        """Along each axis, how many consecutive indices share a scale:
        `ceil(d / s)` for an axis of length `d` with `s` blocks. That divides `d`
        except for NF4 blocks of an axis that `quantise`'s `block_size` does not
        divide, where the last block is shorter."""
        return tuple(
            -(-d // s) for d, s in zip(self.shape, self.scale_shape, strict=True)
        )

    def float_scale(self) -> Array:
        """The scale as a float array (a double-quantised one dequantised)."""
        if isinstance(self.scale, QuantisedScale):
            return self.scale.dequantise()
        return self.scale

    def plain(self) -> "QuantisedArray":
        """This array with its scale as a float array: what every operation acts
        on (a double-quantised scale is dequantised, one entry per block)."""
        if isinstance(self.scale, QuantisedScale):
            return dataclasses.replace(self, scale=self.scale.dequantise())
        return self

    @property
    def nbytes(self) -> int:
        """Bytes of storage: the integers as stored (packed bytes for `bits=4`, each
        entry at its dtype's item size for `bits=8`) plus the scales and zero points
        and the act-order permutation (not the straight-through `master`)."""
        total = 0
        leaves = (self.values, self.scale, self.zero_point, self.act_scale)
        for leaf in (*leaves, self.input_order):
            if isinstance(leaf, QuantisedScale):
                total += leaf.nbytes
            elif leaf is not None:
                total += int(np.size(leaf)) * dtype_of(leaf).itemsize
        return total

    def codes(self) -> Array:
        """The stored values unpacked, shape `self.shape`: `int8` for `"int"` and
        `"nf4"` (4-bit values in `[-8, 7]`), float8 for the float8 formats."""
        if self.format in FLOAT8_FORMATS:
            return self.values
        return self.integers()

    def levels(self, dtype: Any) -> Array:
        """`level(q)` (see the class docstring) as floats of `dtype`, shape
        `self.shape`: the integers, the NF4 levels, or the float8 numbers."""
        if self.format == "nf4":
            return nf4_levels(self.integers(), dtype)
        return self.codes().astype(dtype)

    def integers(self) -> Array:
        """The integers `q` unpacked, as `int8`, shape `self.shape` (for `"nf4"`
        the code indices minus 8)."""
        if self.format in FLOAT8_FORMATS:
            raise ValueError(
                f"QuantisedArray.integers: format {self.format!r} stores float8 "
                "numbers, not integers; use `.codes()` or `.levels(dtype)`."
            )
        if self.bits == 4:
            n = self.shape[self.packed_axis]
            packed = jnp.moveaxis(self.values, self.packed_axis, -1)
            return jnp.moveaxis(unpack_int4(packed, n), -1, self.packed_axis)
        self._check_rebuilt("integers")
        if dtype_of(self.values) != np.int8:
            return jnp.asarray(self.values).astype(jnp.int8)
        return self.values

    def expanded(self, block: Array) -> Array:
        """`block` (in the scale's layout) repeated to the array's shape."""
        return repeat_blocks(block, self.shape, range(self.ndim))

    # Dequantising ---------------------------------------------------------------------

    def dequantise(self) -> Array:
        """The float array `(q - z) * s`, shape `self.shape`, dtype `self.float_dtype`.

        An explicit request: it works whatever `allow_materialise` says. With a
        straight-through `master`, the gradient flows to `master` as if the
        quantisation were the identity.

        **Raises:**

        `ValueError` where the fields break the constructor's checks (a value rebuilt
        by `eqx.tree_at` or `jax.tree.map`, which skip them): `bits=8` integers out
        of `[-128, 127]`, which would wrap around into other integers, NF4 indices
        out of `[-8, 7]`, or an `input_order` that is not a permutation.
        """
        self._check_rebuilt("dequantise")
        q = self.levels(self.float_dtype)
        if self.zero_point is not None:
            q = q - self.expanded(self.zero_point)
        out = q * self.expanded(self.float_scale())
        if self.input_order is not None:
            # Stored column j is column input_order[j]: put each one back.
            out = jnp.take(out, jnp.argsort(self.input_order), axis=-1)
        if self.master is not None:
            out = out + (self.master - lax.stop_gradient(self.master))
        return out

    dequantize = dequantise

    def _check_rebuilt(self, method: str) -> None:
        """Re-run the constructor's checks, as `quax.quaxify` does where it takes a
        value in: `eqx.tree_at`, `jax.tree.map` and an optimiser's update rebuild a
        `QuantisedArray` without them, and `integers` would convert `bits=8` values
        out of `[-128, 127]` to other int8 integers (300 to 44) silently. The checks
        that read array values read each JAX array once (and skip tracers), so a
        second call costs a lookup."""
        try:
            self.__check_init__()
            if isinstance(self.scale, QuantisedScale):
                self.scale.__check_init__()
        except ValueError as e:
            raise ValueError(
                f"QuantisedArray.{method}: its fields break its own checks: {e} Its "
                "constructor refuses such a value; one rebuilt without it "
                "(`eqx.tree_at`, `jax.tree.map`, an optimiser's update) skips the "
                "checks, so they run again here. Build it with "
                "`quax_quant.quantise` or `QuantisedArray(...)`, or swap in leaves "
                "of the dtypes and ranges that the ones replaced had."
            ) from e

    def dense(self) -> Array:
        """The dequantised float array (see `dequantise`), which the core's policy
        forms only where materialising is allowed."""
        return self.dequantise()

    def refusal_reason(self) -> str:
        return (
            f"dequantising would form the float array "
            f"({self.aval().str_short()}) that its integers and scales replace"
        )

    def way_out(self, primitive: Any = None) -> str:
        del primitive
        return (
            "Pass `allow_materialise=True` to `quax_quant.quantise` / "
            "`quantise_model` (or call `.enable_materialise()`) to allow "
            "dequantising, or call `.dequantise()` yourself."
        )
