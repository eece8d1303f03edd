"""The value type: `QuantisedArray`, integers times float scales."""

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import quax
from jax import lax
from jaxtyping import Array

from ._kernels import unpack_int4


__all__ = [
    "MATMUL_PATHS",
    "MaterialisationError",
    "QuantisedArray",
    "dtype_of",
]

# How a product with a float operand is computed; see `quax_quant.matmul_path`.
MATMUL_PATHS = ("auto", "weight_only", "int8")


class MaterialisationError(quax.MaterialisationError):
    """A `QuantisedArray` with `allow_materialise=False` met an operation that has
    no quantised rule and would need the dequantised float array. Its message starts
    with "Refusing to materialise `QuantisedArray`", as the core's policy
    ([`quax.MaterialisationError`][], a `RuntimeError`) words every refusal."""


def dtype_of(x: Any) -> np.dtype:
    """The dtype of an array, a tracer or anything NumPy reads as an array."""
    dtype = getattr(x, "dtype", None)
    return np.dtype(np.asarray(x).dtype if dtype is None else dtype)


class QuantisedArray(quax.GuardedValue):
    """A float array stored as integers times float scales: `(q - z) * s`.

    `q` is `int8` (`bits=8`), or 4-bit integers packed two per byte along the last
    axis (`bits=4`). The scale `s` (and the zero point `z`, when asymmetric) has one
    entry per block of the array: it has the array's number of axes, and along each
    axis of size `d` it has size `d / g` for a group size `g` dividing `d`. Size 1 is
    one scale for the whole axis, size `d` one per index (per channel), anything in
    between one per group of `g` consecutive indices. So per-tensor, per-channel (any
    axis) and per-group scaling are the same representation.

    Build one with [`quax_quant.quantise`][]. Inside [`quax.quaxify`][] a product with
    a float array never forms the float weight: the scale is folded in after the
    contraction (or into the activations), and two quantised operands multiply in
    integers accumulating in `int32`. `transpose`, `reshape`, slicing, squeezing,
    negation, multiplication by a scalar and float dtype conversion keep the
    quantisation; any other primitive raises a
    [`quax_quant.MaterialisationError`][] naming it, unless the array was made with
    `allow_materialise=True`: the core's materialisation policy
    ([`quax.GuardedValue`][]).

    The dense array is not a linear function of the leaves (integers times scales):
    `linear_in_leaves = False`.

    **Fields:**

    - `values`: the integers, `int8`; for `bits=4` packed, shape
        `(*shape[:-1], ceil(shape[-1] / 2))`.
    - `scale`: the float scales, in `float_dtype`, block layout as above.
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
    - `matmul`: the product path with a float operand: `"auto"`, `"weight_only"` or
        `"int8"` (static; see [`quax_quant.matmul_path`][]).
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

    linear_in_leaves: ClassVar[bool] = False
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        MaterialisationError
    )

    def __check_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"QuantisedArray supports bits=8 or 4, got {self.bits}.")
        self._check_values()
        if not -max(np.ndim(self.values), 1) <= self.packed_axis < 0:
            raise ValueError(
                "QuantisedArray's packed_axis counts from the end (-1, -2, ...), got "
                f"{self.packed_axis} for {np.ndim(self.values)} axes."
            )
        if self.matmul not in MATMUL_PATHS:
            raise ValueError(
                f"QuantisedArray's matmul must be one of {MATMUL_PATHS}, got "
                f"{self.matmul!r}."
            )
        if not jnp.issubdtype(self.float_dtype, jnp.floating):
            raise ValueError(
                "QuantisedArray needs a floating float_dtype, got "
                f"{np.dtype(self.float_dtype)}."
            )
        shape = self.shape
        if np.ndim(self.scale) != len(shape) or any(
            s == 0 or d % s for d, s in zip(shape, np.shape(self.scale), strict=True)
        ):
            raise ValueError(
                f"QuantisedArray's scale must have one axis per array axis, each of a "
                f"size dividing the array's; got scale shape {np.shape(self.scale)} "
                f"for array shape {shape}."
            )
        if self.zero_point is not None and np.shape(self.zero_point) != np.shape(
            self.scale
        ):
            raise ValueError(
                f"QuantisedArray's zero_point must have the scale's shape "
                f"{np.shape(self.scale)}, got {np.shape(self.zero_point)}."
            )
        if self.master is not None and tuple(np.shape(self.master)) != shape:
            raise ValueError(
                f"QuantisedArray's master (the float array for straight-through "
                f"gradients) must have the array's shape {shape}, got "
                f"{tuple(np.shape(self.master))}."
            )
        for field in ("scale", "zero_point", "master"):
            leaf = getattr(self, field)
            if leaf is not None and not jnp.issubdtype(dtype_of(leaf), jnp.floating):
                raise ValueError(
                    f"QuantisedArray's {field} must be floating-point, got "
                    f"{dtype_of(leaf)}."
                )

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
        if dtype == np.int8 or isinstance(self.values, jax.core.Tracer):
            # int8 is always in range; traced integers cannot be checked (products
            # convert them to int8, wrapping around outside [-128, 127]).
            return
        if np.size(self.values):
            with jax.ensure_compile_time_eval():
                low = int(jnp.min(self.values))
                high = int(jnp.max(self.values))
            if low < -128 or high > 127:
                raise ValueError(
                    "QuantisedArray's values must lie in [-128, 127] for bits=8, got "
                    f"{dtype} values in [{low}, {high}]."
                )

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
    def group_sizes(self) -> tuple[int, ...]:
        """Along each axis, how many consecutive indices share a scale."""
        return tuple(
            d // s for d, s in zip(self.shape, np.shape(self.scale), strict=True)
        )

    @property
    def nbytes(self) -> int:
        """Bytes of storage: the integers as stored (packed bytes for `bits=4`, each
        entry at its dtype's item size for `bits=8`) plus the scales and zero points
        (not the straight-through `master`)."""
        total = 0
        for leaf in (self.values, self.scale, self.zero_point):
            if leaf is not None:
                total += int(np.size(leaf)) * dtype_of(leaf).itemsize
        return total

    def integers(self) -> Array:
        """The integers `q` unpacked, as `int8`, shape `self.shape`."""
        if self.bits == 4:
            n = self.shape[self.packed_axis]
            packed = jnp.moveaxis(self.values, self.packed_axis, -1)
            return jnp.moveaxis(unpack_int4(packed, n), -1, self.packed_axis)
        if dtype_of(self.values) != np.int8:
            return jnp.asarray(self.values).astype(jnp.int8)
        return self.values

    def expanded(self, block: Array) -> Array:
        """`block` (in the scale's layout) repeated to the array's shape."""
        for axis, g in enumerate(self.group_sizes):
            if g > 1 and block.shape[axis] > 1:
                block = jnp.repeat(block, g, axis=axis)
        return block

    # Dequantising ---------------------------------------------------------------------

    def dequantise(self) -> Array:
        """The float array `(q - z) * s`, shape `self.shape`, dtype `self.float_dtype`.

        An explicit request: it works whatever `allow_materialise` says. With a
        straight-through `master`, the gradient flows to `master` as if the
        quantisation were the identity.
        """
        q = self.integers().astype(self.float_dtype)
        if self.zero_point is not None:
            q = q - self.expanded(self.zero_point)
        out = q * self.expanded(self.scale)
        if self.master is not None:
            out = out + (self.master - lax.stop_gradient(self.master))
        return out

    dequantize = dequantise

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
