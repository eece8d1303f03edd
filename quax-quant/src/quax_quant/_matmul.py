"""Products with quantised operands, never forming a float copy of the whole weight.

The weight is `W = q * s + o` with `q` the levels (integers, NF4 levels or float8
numbers) and the scale `s` and offset `o = -z * s` constant on blocks (see
`QuantisedArray`). Two paths:

- weight-only: `W` dequantised inside the product. At one row XLA on CPU fuses
  the dequantisation into the product; from two rows on `W` is dequantised one
  block of at most `BLOCK_ELEMENTS` elements at a time inside a loop, forward and
  in the transposed product (the gradient with respect to `x`);
- int8 x int8: `x` quantised per row, the integers multiplied accumulating in
  `int32`, then `x . W = (x . q) * s + (sum of x within blocks) . o` when `s` is
  constant along the contracted axes; groups along a contracted axis become a
  batch axis of the product, summed after scaling. For float8 weights the same
  with `x` as float8 of the weight's format, accumulating in float32; with a
  calibrated `act_scale` (see `quax_quant.calibrate`) `x` takes that one scale
  instead of each row's absmax. While `calibrate` runs, every product is
  weight-only and reports the largest activation it meets
  (`recording_activations`).
"""

import contextlib
import contextvars
import dataclasses
import functools as ft
import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import quax
from jax import lax
from jaxtyping import Array

from ._kernels import (
    DimensionNumbers,
    nf4_levels,
    nf4_table,
    nibbles,
    one_row_dot,
    quantise_rows,
    reduce_dot,
    sides,
    split_groups,
    to_out,
)
from ._pallas import available, plan, weight_only_matmul
from ._value import FLOAT8_FORMATS, QuantisedArray, repeat_blocks


__all__ = [
    "BLOCK_ELEMENTS",
    "DEFAULT_KERNELS",
    "KERNELS",
    "KERNELS_VARIABLE",
    "NF4_DECODES",
    "REDUCE_MAX_ROWS",
    "UNPACKS",
    "WEIGHT_ONLY_MAX_ROWS",
    "Kernels",
    "expand_axes",
    "kernel_choices",
    "kernels",
    "matmul_path",
    "quantised_dot",
    "recording_activations",
    "rows_of",
]

# Below this many rows of activations per weight, `"auto"` takes the weight-only
# path; from it on, the int8 x int8 path. Measured by `benchmarks/quant.py`.
WEIGHT_ONLY_MAX_ROWS = 4

# The weight-only product with more than one row dequantises the weight in blocks of
# at most this many elements (1 MiB of float32) along a free axis; see
# `_blocked_product`.
BLOCK_ELEMENTS = 2**18


# Set by `quax_quant.calibrate` while it runs the model: called (through
# `jax.debug.callback`, so also under `jit` and `vmap`) with each marked weight's
# `act_scale` (its marker) and the absmax of the finite activations it meets.
recording_activations: contextvars.ContextVar[Callable[[Any, Any], None] | None] = (
    contextvars.ContextVar("recording_activations", default=None)
)
# Rules read it while they trace (the products stage a callback to it, on the
# weight-only path), so it joins the key of everything quax reuses: a nested `jit`'s
# body traced for one `calibrate` (recording into that call's table) is never reused
# by another, nor by a run outside `calibrate` (which takes the product's own path
# and saturates at `act_scale`), nor the other way round.
quax.plugins.add_setting(recording_activations.get)


def matmul_path(rows: int, w: QuantisedArray, contract: Sequence[int] = ()) -> str:
    """Which path `"auto"` takes for a product of `w` with a float operand that has
    `rows` rows (the product of its free axes, times the `vmap` batch sizes).

    - `"weight_only"` below `WEIGHT_ONLY_MAX_ROWS` rows, and at any number of rows
        when `w`'s scale varies along a contracted axis (groups along the
        contraction): `w` is dequantised inside the product, in blocks of at most
        `BLOCK_ELEMENTS` elements from 2 rows on, never as a whole float copy. It
        computes exactly `x . w.dequantise()` (up to float rounding), and at one
        row it reads a quarter (int8) or an eighth (int4) of the float weight's
        bytes.
    - `"int8"` from `WEIGHT_ONLY_MAX_ROWS` rows on, when the scale is constant
        along the contraction: the float operand is quantised on the fly, symmetric
        int8 with one scale per row (absmax), the product runs in integers
        accumulating in `int32`, then both scales are applied. Faster on CPU for
        batches of rows, but **less accurate**: it adds the activations' rounding
        error, about 1% relative (0.0121 against 0.0050 for weight-only int8 on the
        README's MLP), so results at batch sizes on either side of the threshold
        differ by that error.

    Override per array with `quantise(..., matmul="weight_only" | "int8")` (or
    `dataclasses.replace(q, matmul=...)`, since `eqx.tree_at` cannot set a static
    field, or `quantise_model(..., matmul=...)`): `"weight_only"` where the error
    matters more than the time. Derivatives always follow the weight-only product
    (straight through the on-the-fly quantisation of the activations).

    **Arguments:**

    - `rows`: rows of the float operand.
    - `w`: the quantised operand.
    - `contract`: `w`'s contracted axes.

    **Returns:**

    `"weight_only"` or `"int8"`.
    """
    if w.matmul != "auto":
        return w.matmul
    if w.format != "int":
        # NF4 levels are not integers; float8 x float8 is emulated on CPU.
        return "weight_only"
    if rows < WEIGHT_ONLY_MAX_ROWS:
        return "weight_only"
    # Groups along the contraction: the int8 product would be a batched product
    # over groups (on CPU several times slower than float32); the blocked
    # weight-only product is exact and about as fast as float32.
    grouped = any(np.shape(w.scale)[a] > 1 for a in contract)
    return "weight_only" if grouped else "int8"


def rows_of(x: Any, contract: Sequence[int], batch: Sequence[int]) -> int:
    """Rows of `x` (its free axes), times the sizes of the `vmap`s around it."""
    shape = np.shape(x)
    rows = math.prod(
        d for a, d in enumerate(shape) if a not in contract and a not in batch
    )
    # A `vmap` batch tracer hides its batch axis from the shape; look through it
    # (only to choose a path: a wrong guess costs speed, never correctness).
    while isinstance(x, jax.core.Tracer):
        dim = getattr(x, "batch_dim", None)
        val = getattr(x, "val", None)
        if not isinstance(dim, int) or val is None:
            break
        rows *= np.shape(val)[dim]
        x = val
    return rows


# Layout helpers -----------------------------------------------------------------------


def expand_axes(w: QuantisedArray, block: Array, axes: Sequence[int]) -> Array:
    """`block` (scale layout) repeated to full size along `axes`."""
    return repeat_blocks(block, w.shape, axes)


# How the weight-only product is written, per backend ----------------------------------

# The formulations of the weight-only product (see `Kernels`).
KERNELS = ("blocked", "fused", "reduce", "pallas")
# How 4-bit values are unpacked by the "fused" and "reduce" formulations.
UNPACKS = ("shift", "halves")
# How NF4 code indices become levels.
NF4_DECODES = ("select", "gather")

# At most this many rows, `"reduce"` multiplies and sums on the vector units;
# above, it takes the "fused" product. Measured on a TPU v5e (`benchmarks/quant.py
# --tpu`, 8192 x 8192, a scan over 32 layers, 2026-12-06): one row of int8 0.55x the
# bfloat16 product (fused 0.77x), but 8 rows 7.8x, where XLA writes out the whole
# `(rows, out, in)` product (256 MiB), against fused 0.57x.
REDUCE_MAX_ROWS = 1


@dataclasses.dataclass(frozen=True)
class Kernels:
    """How the weight-only product (`x . w` dequantised on the fly) is written, per
    format of `w`: `int8` (format `"int"`, 8 bits), `int4` (format `"int"`, 4
    bits), `nf4`, `float8` (both float8 formats). Each is one of:

    - `"blocked"`: `w` dequantised to float32 inside the product: fused into it
        at one row (by XLA on CPU; a TPU's XLA writes the converted weight out
        first, f32 `(out, in)` on a TPU v5e), and from 2 rows on one block of at
        most `BLOCK_ELEMENTS` at a time in a loop, so that no float copy of `w`
        is ever whole. What XLA on CPU needs (it converts a whole integer
        operand before a dot with more than one row); the default on every
        backend but the TPU.
    - `"fused"`: one `dot_general` of `x` with `w`'s levels converted to `x`'s
        dtype (bfloat16 stays bfloat16 at the default precision), accumulating
        in float32; the scale multiplies the output columns after the dot where
        it is constant along the contraction, else it is folded into the
        converted weight. XLA fuses the conversion into the product where it
        can; where it cannot, it writes the converted weight out first.
    - `"reduce"`: at most `REDUCE_MAX_ROWS` rows, a multiply and a sum (no
        matrix unit: a product of few rows reads the weight once on the vector
        units); above, `"fused"`.
    - `"pallas"`: the Pallas TPU kernel of `quax_quant._pallas` (a tiled product
        decoding the stored values in on-chip memory); on a backend other than
        the TPU it runs in interpret mode (for tests: slow). It reads the
        weight as `(out, in)`: one contracted along its first axis is
        transposed back (free where it reached the product transposed, as in
        `x @ w.T` of an `eqx.nn.Linear` weight; a copy of the stored values for
        an NNX kernel `(in, out)`). Where it does not apply (zero points, batch
        axes, more than 2 axes, groups that are not a multiple of 64 inputs,
        4-bit values packed along the free axis) or does not compile for the
        shapes (checked once, logged), `"reduce"` at most `REDUCE_MAX_ROWS`
        rows, else `"fused"`: at one row of int4 in asymmetric groups (zero
        points), `"fused"` wrote the whole converted weight out before the
        product on a TPU v5e (f32 `(out, in)`, JAX 0.10.2, 2026-12-08), where
        `"reduce"` reads the stored values once.

    And for the 4-bit formats under `"fused"`, `unpack`: `"shift"` (shifts,
    then the two halves concatenated: `unpack_int4`), or `"halves"` (no
    concatenation: the product is the sum of the product with the low nibbles
    and the one with the high nibbles, where the packed axis is contracted).
    Reinterpreting the bytes as JAX's `int4` (`lax.bitcast_convert_type`) is not
    offered: under `jax.jit` XLA (JAX 0.10.2, CPU) folds that conversion of a
    constant array into other integers, silently;
    `nf4_levels`: `"select"` (a tree of selects) or `"gather"` (a table
    lookup).

    Every formulation computes `x . w.dequantise()` up to float rounding; they
    differ in speed by backend (`benchmarks/quant.py --tpu` times them side by
    side) and in the rounding of the converted weight (`"fused"` and
    `"pallas"` multiply in `x`'s dtype: exact for integer and float8 levels with
    a scale per output channel, one bfloat16 rounding of NF4 levels and of
    group-scaled weights, as a TPU's default-precision float32 product rounds
    its operands anyway).
    """

    int8: str = "blocked"
    int4: str = "blocked"
    nf4: str = "blocked"
    float8: str = "blocked"
    unpack: str = "shift"
    nf4_levels: str = "select"

    def __post_init__(self) -> None:
        for field in ("int8", "int4", "nf4", "float8"):
            if getattr(self, field) not in KERNELS:
                raise ValueError(
                    f"quax_quant.kernels: {field} must be one of {KERNELS}, got "
                    f"{getattr(self, field)!r}."
                )
        if self.unpack not in UNPACKS:
            raise ValueError(
                f"quax_quant.kernels: unpack must be one of {UNPACKS}, got "
                f"{self.unpack!r}."
            )
        if self.nf4_levels not in NF4_DECODES:
            raise ValueError(
                f"quax_quant.kernels: nf4_levels must be one of {NF4_DECODES}, got "
                f"{self.nf4_levels!r}."
            )

    def of(self, w: QuantisedArray) -> str:
        """The formulation for `w`'s format."""
        if w.format in FLOAT8_FORMATS:
            return self.float8
        if w.format == "nf4":
            return self.nf4
        return self.int4 if w.bits == 4 else self.int8


# The formulations by backend (`jax.default_backend()`); a backend not named here
# takes `Kernels()` (all "blocked"). The TPU's, from `benchmarks/quant.py --tpu` on a
# TPU v5e (2026-12-06; 8192 x 8192 weights, x in bfloat16, time over the bfloat16
# product inside a scan over 32 layers, at 1 / 8 / 4096 rows):
# - int8 weight-only: "reduce" (one row; "fused" above) 0.55 / 0.57 / 1.00, where
#   "blocked" was 6.6x at 4096 rows in a single call;
# - float8 e4m3 weight-only: "reduce" 0.72 / 0.61 / 1.01;
# - int4 in groups of 128: "pallas" 0.81 / 0.78 / 1.12, where "fused" wrote the
#   converted weight out (256 MiB) and took 4.5 / 4.7 / 1.5x;
# - NF4 in blocks of 64: "pallas" 2.55 / 2.53 / 2.68, "fused" 4.7 / 4.8 / 1.40:
#   nothing reaches the bfloat16 product yet (the 16-level decode on the vector
#   units); the kernel is chosen for the few-row products of serving.
# Switch with `quax_quant.kernels(...)` or the environment variable
# `QUAX_QUANT_KERNELS`.
DEFAULT_KERNELS: dict[str, Kernels] = {
    "tpu": Kernels(
        int8="reduce", int4="pallas", nf4="pallas", float8="reduce", unpack="halves"
    ),
}

# `QUAX_QUANT_KERNELS="int4=pallas,nf4_levels=gather"` changes the defaults of every
# backend, for a whole process.
KERNELS_VARIABLE = "QUAX_QUANT_KERNELS"

# Choices of `kernels(...)` blocks, as sorted `(field, value)` pairs: rules read
# them while they trace, so JAX's and quax's caches key on them.
_chosen = quax.plugins.jit_context(())


def _variable_choices() -> dict[str, str]:
    text = os.environ.get(KERNELS_VARIABLE, "").strip()
    if not text:
        return {}
    choices = {}
    for item in text.split(","):
        field, sep, value = item.partition("=")
        if not sep or field.strip() not in Kernels.__dataclass_fields__:
            raise ValueError(
                f"{KERNELS_VARIABLE}={text!r}: each item must be FIELD=VALUE with "
                f"FIELD one of {tuple(Kernels.__dataclass_fields__)}; got {item!r}."
            )
        choices[field.strip()] = value.strip()
    return choices


def kernel_choices(backend: str | None = None) -> Kernels:
    """The formulations the weight-only product takes now: `DEFAULT_KERNELS` for
    `backend` (by default `jax.default_backend()`), changed by the environment
    variable `QUAX_QUANT_KERNELS`, then by the enclosing `quax_quant.kernels`
    blocks.

    **Arguments:**

    - `backend`: a backend name (`"cpu"`, `"gpu"`, `"tpu"`), or `None`.

    **Returns:**

    A [`quax_quant.Kernels`][].
    """
    base = DEFAULT_KERNELS.get(backend or jax.default_backend(), Kernels())
    return dataclasses.replace(base, **{**_variable_choices(), **dict(_chosen.value)})


@contextlib.contextmanager
def kernels(**choices: str) -> Iterator[Kernels]:
    """Choose how the weight-only product is written while the block runs (also
    while it is traced: a `jax.jit` traced in it is traced again outside it).

    ```python
    with quax_quant.kernels(int4="pallas", nf4="fused", nf4_levels="gather"):
        y = jax.jit(quax.quaxify(lambda w, x: x @ w.T))(w, x)
    ```

    **Arguments:**

    - `choices`: fields of [`quax_quant.Kernels`][] (`int8`, `int4`, `nf4`,
        `float8`, `unpack`, `nf4_levels`) and their values; the others keep the
        backend's defaults (or an enclosing block's choices).

    **Returns:**

    A context manager, giving the `Kernels` in force inside.

    **Raises:**

    `ValueError` naming a field or a value that is not one.
    """
    merged = {**dict(_chosen.value), **choices}
    unknown = set(merged) - set(Kernels.__dataclass_fields__)
    if unknown:
        raise ValueError(
            f"quax_quant.kernels: unknown fields {sorted(unknown)}; the fields are "
            f"{tuple(Kernels.__dataclass_fields__)}."
        )
    Kernels(**merged)  # check the values
    with _chosen(tuple(sorted(merged.items()))):
        yield kernel_choices()


def _default_precision(precision: Any) -> bool:
    """Whether a `dot_general`'s `precision` (and JAX's default) leave it at the
    backend's default: a TPU then multiplies float32 operands in bfloat16."""
    if precision is not None:
        values = precision if isinstance(precision, tuple) else (precision,)
        if any(p not in (None, lax.Precision.DEFAULT) for p in values):
            return False
    default = jax.config.values.get("jax_default_matmul_precision")
    return default in (None, "default", "bfloat16", "fastest")


def _compute_dtype(x_dtype: Any, float_dtype: Any, precision: Any) -> Any:
    """The dtype the "fused" and "pallas" products multiply in: a 16-bit float `x`
    at the default precision keeps its dtype (the weight is converted to it);
    otherwise the dtype the dense product computes in."""
    x_dtype = np.dtype(x_dtype)
    narrow = x_dtype in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
    if narrow and _default_precision(precision):
        return x_dtype
    return np.dtype(jnp.promote_types(x_dtype, float_dtype))


def _decode(q: Array, fmt: str, dtype: Any, nf4: str) -> Array:
    """Levels of stored values `q` (integers, nibbles, `int4` or float8) as `dtype`."""
    if fmt == "nf4":
        return (nf4_table if nf4 == "gather" else nf4_levels)(q, dtype)
    return q.astype(dtype)


def _levels(w: QuantisedArray, dtype: Any, choice: Kernels) -> Array:
    """`w.levels(dtype)`, NF4 decoded as `choice.nf4_levels` says."""
    return _decode(w.codes(), w.format, dtype, choice.nf4_levels)


def _operand(
    levels: Array,
    scale: Array,
    zero: Array | None,
    folded: bool,
    dtype: Any,
) -> Array:
    """The weight as a product's operand, of `levels`' shape: `(q - z) * s`
    computed in float32 and converted to `dtype` where `folded` (a scale varying
    along the contraction), else `q - z` in `dtype` (exact for integers and
    float8 numbers; the scale is applied to the output)."""
    shape = levels.shape
    axes = range(len(shape))
    if folded:
        q = levels.astype(jnp.promote_types(dtype, jnp.float32))
        if zero is not None:
            q = q - repeat_blocks(zero.astype(q.dtype), shape, axes)
        return (q * repeat_blocks(scale.astype(q.dtype), shape, axes)).astype(dtype)
    q = levels.astype(dtype)
    if zero is not None:
        q = q - repeat_blocks(zero.astype(dtype), shape, axes)
    return q


def _dot(
    x: Array, op: Array, dn: DimensionNumbers, w_is_lhs: bool, precision: Any
) -> Array:
    lhs, rhs = (op, x) if w_is_lhs else (x, op)
    acc = jnp.promote_types(op.dtype, jnp.float32)
    return lax.dot_general(
        lhs, rhs, dn, precision=precision, preferred_element_type=acc
    )


def _column_scale(
    out: Array, w: QuantisedArray, dn: DimensionNumbers, w_is_lhs: bool, x_ndim: int
) -> Array:
    """`out` times `w`'s scale (constant along the contraction) per output entry.
    An infinite scale gives NaN where its block reaches, as on the int8 path: the
    sum cannot tell an infinity from `0 * inf`."""
    w_contract, _ = sides(dn, w_is_lhs)
    keep = [a for a in range(w.ndim) if a not in w_contract]
    raw = w.scale.astype(out.dtype)
    scale = expand_axes(w, jnp.where(jnp.isinf(raw), jnp.nan, raw), keep)
    lhs_ndim, rhs_ndim = (w.ndim, x_ndim) if w_is_lhs else (x_ndim, w.ndim)
    return out * to_out(scale, w_is_lhs, dn, lhs_ndim, rhs_ndim)


def _halves(w: QuantisedArray, dn: DimensionNumbers, w_is_lhs: bool) -> int | None:
    """The packed axis of a 4-bit `w` when `"halves"` applies: contracted, of even
    length, each half holding whole scale blocks. `None` otherwise."""
    if w.bits != 4 or w.odd:
        return None
    axis = w.packed_axis % w.ndim
    w_contract, _ = sides(dn, w_is_lhs)
    blocks = w.scale.shape[axis]
    if axis not in w_contract or (
        blocks > 1 and (w.shape[axis] % blocks or blocks % 2)
    ):
        return None
    return axis


def _half(block: Array, axis: int, i: int) -> Array:
    """Half `i` (0 or 1) of a scale layout `block` along `axis` (all of it where it
    has one block there)."""
    if block.shape[axis] == 1:
        return block
    n = block.shape[axis] // 2
    return lax.slice_in_dim(block, i * n, (i + 1) * n, axis=axis)


def _fused_product(
    x: Array,
    w: QuantisedArray,
    choice: Kernels,
    *,
    dn: DimensionNumbers,
    w_is_lhs: bool,
    precision: Any,
    out_dtype: Any,
) -> Array:
    """The "fused" formulation (see `Kernels`)."""
    dtype = _compute_dtype(x.dtype, w.float_dtype, precision)
    w_contract, _ = sides(dn, w_is_lhs)
    folded = any(w.scale.shape[a] > 1 for a in w_contract)
    x = x.astype(dtype)
    axis = _halves(w, dn, w_is_lhs) if choice.unpack == "halves" else None
    if axis is None:
        op = _operand(_levels(w, dtype, choice), w.scale, w.zero_point, folded, dtype)
        out = _dot(x, op, dn, w_is_lhs, precision)
    else:
        # The product with the low nibbles (the first half of the packed axis)
        # plus the one with the high nibbles (the second half).
        half = w.shape[axis] // 2
        x_axis = sides(dn, not w_is_lhs)[0][w_contract.index(axis)]
        out = None
        for i, q in enumerate(nibbles(w.values)):
            levels = _decode(q, w.format, dtype, choice.nf4_levels)
            scale = _half(w.scale, axis, i)
            zero = None if w.zero_point is None else _half(w.zero_point, axis, i)
            op = _operand(levels, scale, zero, folded, dtype)
            part = lax.slice_in_dim(x, i * half, (i + 1) * half, axis=x_axis)
            term = _dot(part, op, dn, w_is_lhs, precision)
            out = term if out is None else out + term
    assert out is not None
    if not folded:
        out = _column_scale(out, w, dn, w_is_lhs, x.ndim)
    return out.astype(out_dtype)


def _reduce_product(
    x: Array,
    w: QuantisedArray,
    choice: Kernels,
    *,
    dn: DimensionNumbers,
    w_is_lhs: bool,
    out_dtype: Any,
) -> Array:
    """The "reduce" formulation (see `Kernels`): `w` dequantised in float32 inside
    a multiply and a sum, which XLA fuses into one pass over the stored values."""
    acc = jnp.promote_types(out_dtype, jnp.float32)
    deq = _operand(_levels(w, acc, choice), w.scale, w.zero_point, True, acc)
    lhs, rhs = (deq, x.astype(acc)) if w_is_lhs else (x.astype(acc), deq)
    return reduce_dot(lhs, rhs, dn).astype(out_dtype)


def _on_tpu() -> bool:
    """Whether products run on a TPU (the Pallas kernel compiles for it; elsewhere
    it runs in interpret mode)."""
    return jax.default_backend() == "tpu"


def _pallas_layout(
    x: Array, w: QuantisedArray, dn: DimensionNumbers, w_is_lhs: bool
) -> tuple[QuantisedArray, int] | None:
    """`(w as (N, K), x's contracted axis)` where the Pallas kernel applies to this
    product: a 2-D `w` with one contracted axis, no batch axes, no zero point,
    4-bit values packed along the contracted axis with an even length. A `w`
    contracted along its first axis (`x @ w.T` of an `eqx.nn.Linear` weight
    reaches the product transposed) is transposed back, bytes and scales, which
    XLA cancels against the transpose that made it. `None` otherwise."""
    (lc, rc), (lb, _) = dn
    w_contract, x_contract = (lc, rc) if w_is_lhs else (rc, lc)
    if w.ndim != 2 or len(w_contract) != 1 or lb or w.zero_point is not None:
        return None
    if w.bits == 4 and (w.odd or w.packed_axis % 2 != w_contract[0]):
        return None
    if w_contract[0] == 0:
        w = dataclasses.replace(
            w,
            values=jnp.transpose(w.values),
            scale=jnp.transpose(w.scale),
            master=None,
            packed_axis=-1,
        )
    return w, int(x_contract[0])


@ft.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _pallas_call(static: Any, x: Array, values: Array, scale: Array) -> Array:
    """The kernel on `x` `(M, K)`; derivatives are those of the "fused" product."""
    _, kwargs, _ = static
    return weight_only_matmul(x, values, scale, **dict(kwargs))


@_pallas_call.defjvp
def _(static: Any, primals: Any, tangents: Any) -> Any:
    fields, kwargs, choice = static
    x, values, scale = primals
    dx, _, dscale = tangents
    out = _pallas_call(static, x, values, scale)
    kwargs = dict(kwargs)

    def fused(x: Array, scale: Array) -> Array:
        w = _rebuild(fields, values, scale, None)
        return _fused_product(
            x,
            w,
            choice,
            dn=(((1,), (1,)), ((), ())),
            w_is_lhs=False,
            precision=None,
            out_dtype=kwargs["out_dtype"],
        )

    _, tangent = jax.jvp(fused, (x, scale), (dx, dscale))
    return out, tangent


def _pallas_product(
    x: Array,
    w: QuantisedArray,
    choice: Kernels,
    *,
    dn: DimensionNumbers,
    w_is_lhs: bool,
    precision: Any,
    out_dtype: Any,
) -> Array | None:
    """The "pallas" formulation (see `Kernels`), or `None` where the kernel does not
    apply or does not compile (the caller takes the "fused" one)."""
    layout = _pallas_layout(x, w, dn, w_is_lhs)
    if layout is None or w.size == 0 or np.size(x) == 0:
        return None
    w, x_axis = layout
    fmt = w.format
    n, k = w.shape
    x2 = jnp.moveaxis(x, x_axis, -1)
    free = x2.shape[:-1]
    x2 = x2.reshape(-1, k)
    dtype = _compute_dtype(x.dtype, w.float_dtype, precision)
    scale = jnp.asarray(w.scale)
    tiling = plan(x2.shape[0], n, k, fmt, w.bits == 4, tuple(scale.shape))
    if tiling is None:
        return None
    on_tpu = _on_tpu()
    if on_tpu and not available(
        tuple(x2.shape),
        x2.dtype,
        tuple(w.values.shape),
        w.values.dtype,
        tuple(scale.shape),
        scale.dtype,
        fmt=fmt,
        plan=tiling,
        dtype=dtype,
        out_dtype=out_dtype,
    ):
        return None
    kwargs = (
        ("dtype", np.dtype(dtype)),
        ("fmt", fmt),
        ("interpret", not on_tpu),
        ("out_dtype", np.dtype(out_dtype)),
        ("plan", tiling),
    )
    static = (_static_fields(w), kwargs, choice)
    out = _pallas_call(static, x2, w.values, scale).reshape(*free, n)
    # `w . x` puts `w`'s free axis first.
    return jnp.moveaxis(out, -1, 0) if w_is_lhs else out


def _formulated_product(
    x: Array,
    w: QuantisedArray,
    choice: Kernels,
    *,
    dn: DimensionNumbers,
    w_is_lhs: bool,
    rows: int,
    precision: Any,
    out_dtype: Any,
) -> Array:
    """The weight-only product as `choice` writes it for `w`'s format (not
    "blocked": that is `_canonical_product`); where the "pallas" kernel does not
    apply, the "reduce" formulation's choice by rows."""
    kernel = choice.of(w)
    if kernel == "pallas":
        out = _pallas_product(
            x,
            w,
            choice,
            dn=dn,
            w_is_lhs=w_is_lhs,
            precision=precision,
            out_dtype=out_dtype,
        )
        if out is not None:
            return out
    if kernel in ("reduce", "pallas") and rows <= REDUCE_MAX_ROWS:
        return _reduce_product(
            x, w, choice, dn=dn, w_is_lhs=w_is_lhs, out_dtype=out_dtype
        )
    return _fused_product(
        x,
        w,
        choice,
        dn=dn,
        w_is_lhs=w_is_lhs,
        precision=precision,
        out_dtype=out_dtype,
    )


# The product --------------------------------------------------------------------------


def _dequantised(w: QuantisedArray, acc: Any) -> Array:
    """`w` as floats of dtype `acc` (scaled in `acc`, not in `w.float_dtype`):
    `(q - z) * s`, as `QuantisedArray.dequantise` computes it. The difference of
    two integers is exact, so an entry at its zero point is exactly 0 (an infinite
    activation times it is NaN, as in the dense product); `q * s - z * s` would
    let XLA fuse a multiply-add that leaves a residue of one rounding there."""
    q = w.levels(acc)
    if w.zero_point is not None:
        q = q - w.expanded(w.zero_point.astype(acc))
    return q * w.expanded(w.scale.astype(acc))


def _take(w: QuantisedArray, axis: int, start: int, stop: int) -> QuantisedArray:
    """`w[start:stop]` along `axis`, at scale-block boundaries: `start` at one, and
    `stop` at one or at the end, cutting either whole blocks of the same length
    or only NF4's shorter last block (so that the part has the same blocks). An
    int4 (or NF4) array packed along `axis` comes back unpacked (one value per
    `int8`)."""
    packed = w.bits == 4 and w.packed_axis % w.ndim == axis
    values = w.codes() if packed else w.values
    g = w.group_sizes[axis]
    d = w.shape[axis]
    blocks = w.scale.shape[axis]
    assert blocks == 1 or (
        start % g == 0 and (stop % g == 0 or (start == (blocks - 1) * g and stop == d))
    ), f"_take({start}, {stop}) of an axis of {d} in blocks of {g}"

    def cut(block: Array) -> Array:
        if block.shape[axis] == 1:
            return block
        return lax.slice_in_dim(block, start // g, -(-stop // g), axis=axis)

    fields = _static_fields(w)
    if packed:
        fields = (8, w.float_dtype, False, -1, *fields[4:])
    zero = None if w.zero_point is None else cut(w.zero_point)
    return _rebuild(
        fields, lax.slice_in_dim(values, start, stop, axis=axis), cut(w.scale), zero
    )


def _blocked_product(
    x: Array,
    w: QuantisedArray,
    *,
    dn: DimensionNumbers,
    w_is_lhs: bool,
    acc: Any,
    precision: Any,
) -> Array:
    """The weight-only product for more than one row, dequantising `w` one block at
    a time: XLA on CPU has no mixed integer x float dot, and converts a whole integer
    operand before its dot. The blocks split `w`'s largest free axis (at its scale
    blocks), at most `BLOCK_ELEMENTS` elements each, inside a loop (`lax.map`) whose
    body is rematerialised under differentiation, so that the transposed product
    (`g . w`, the gradient with respect to `x`) also converts one block at a time.
    Exact with respect to `x . w.dequantise()`; a weight of at most
    `BLOCK_ELEMENTS` elements, or with no free axis, is dequantised whole."""
    w_contract, w_batch = sides(dn, w_is_lhs)
    free = [a for a in range(w.ndim) if a not in w_contract and a not in w_batch]

    def product(block: QuantisedArray) -> Array:
        deq = _dequantised(block, acc)
        lhs, rhs = (deq, x.astype(acc)) if w_is_lhs else (x.astype(acc), deq)
        return lax.dot_general(
            lhs, rhs, dn, precision=precision, preferred_element_type=acc
        )

    size = math.prod(w.shape)
    if size <= BLOCK_ELEMENTS or not free:
        return product(w)
    axis = max(free, key=lambda a: w.shape[a])
    # Indices per scale block along `axis` (blocks start at their boundaries).
    unit = w.group_sizes[axis] if w.scale.shape[axis] > 1 else 1
    per_unit = size // w.shape[axis] * unit
    units = max(1, BLOCK_ELEMENTS // per_unit)
    n = w.shape[axis] // (units * unit)
    main = _take(w, axis, 0, n * units * unit)

    def split(leaf: Array | None, mapped: bool) -> Array | None:
        if leaf is None or not mapped:
            return None
        shape = leaf.shape
        leaf = leaf.reshape(*shape[:axis], n, shape[axis] // n, *shape[axis + 1 :])
        return jnp.moveaxis(leaf, axis, 0)

    grouped = main.scale.shape[axis] > 1
    xs = (
        split(main.values, True),
        split(main.scale, grouped),
        split(main.zero_point, grouped),
    )

    @jax.checkpoint
    def body(leaves: tuple[Array, Array | None, Array | None]) -> Array:
        values, scale, zero = leaves
        scale = main.scale if scale is None else scale
        zero = main.zero_point if zero is None else zero
        return product(_rebuild(_static_fields(main), values, scale, zero))

    out = lax.map(body, xs)
    x_free = np.ndim(x) - len(dn[0][0]) - len(dn[1][0])
    position = len(w_batch) + free.index(axis) + (0 if w_is_lhs else x_free)
    out = jnp.moveaxis(out, 0, position)
    out = out.reshape(*out.shape[:position], -1, *out.shape[position + 2 :])
    # The rest: whole blocks, then NF4's shorter last block on its own (a part
    # holding both would have blocks of another length).
    d = w.shape[axis]
    last = d - d % unit if grouped else d
    cuts = [c for c in (main.shape[axis], last, d) if c >= main.shape[axis]]
    parts = [out]
    for start, stop in itertools.pairwise(cuts):
        if start < stop:
            parts.append(product(_take(w, axis, start, stop)))
    return jnp.concatenate(parts, axis=position) if len(parts) > 1 else out


def _product(
    x: Array, w: QuantisedArray, *, dn: DimensionNumbers, w_is_lhs: bool, **kwargs: Any
) -> Array:
    """`dot_general` of `x` and `w` (on the side `w_is_lhs` says) along `dn`.

    Both operands are first laid out as `(batch, free, contracted)`: a weight that
    reached the product transposed (`x @ w.T`) is transposed back, which XLA cancels,
    instead of a product contracting along a strided axis (for `int8` on CPU, six
    times slower).

    The weight-only product takes the formulation `kernel_choices()` gives for
    `w`'s format; all but "blocked" take `dn` as it is."""
    if kwargs["path"] == "weight_only":
        choice = kernel_choices()
        if choice.of(w) != "blocked":
            return _formulated_product(
                x,
                w,
                choice,
                dn=dn,
                w_is_lhs=w_is_lhs,
                rows=kwargs["rows"],
                precision=kwargs["precision"],
                out_dtype=kwargs["out_dtype"],
            )
    w_contract, w_batch = sides(dn, w_is_lhs)
    x_contract, x_batch = sides(dn, not w_is_lhs)
    w_free = [a for a in range(w.ndim) if a not in w_contract and a not in w_batch]
    x_free = [a for a in range(np.ndim(x)) if a not in x_contract and a not in x_batch]
    w_perm = w_batch + w_free + w_contract
    x_perm = x_batch + x_free + x_contract
    if w_perm == sorted(w_perm) and x_perm == sorted(x_perm):
        return _canonical_product(x, w, dn=dn, w_is_lhs=w_is_lhs, **kwargs)
    nb = len(w_batch)
    w_c = list(range(nb + len(w_free), w.ndim))
    x_c = list(range(nb + len(x_free), np.ndim(x)))
    batch = list(range(nb))
    dn2 = ((w_c, x_c), (batch, batch)) if w_is_lhs else ((x_c, w_c), (batch, batch))
    perm = tuple(w_perm)
    zero = None if w.zero_point is None else jnp.transpose(w.zero_point, perm)
    # Unpacked: an int4 weight is transposed as int8 inside the product.
    w2 = QuantisedArray(
        jnp.transpose(w.codes(), perm),
        jnp.transpose(w.scale, perm),
        zero,
        None,
        bits=8,
        float_dtype=w.float_dtype,
        matmul=w.matmul,
        format=w.format,
        act_scale=w.act_scale,
    )
    x2 = jnp.transpose(x, x_perm)
    return _canonical_product(x2, w2, dn=dn2, w_is_lhs=w_is_lhs, **kwargs)


def _canonical_product(
    x: Array,
    w: QuantisedArray,
    *,
    dn: DimensionNumbers,
    w_is_lhs: bool,
    path: str,
    rows: int,
    precision: Any,
    out_dtype: Any,
) -> Array:
    """`_product` once laid out; `rows` of `x` (with its `vmap`s) choose how XLA
    sees a one-row product."""
    acc = jnp.promote_types(out_dtype, jnp.float32)
    w_contract, w_batch = sides(dn, w_is_lhs)
    x_contract, x_batch = sides(dn, not w_is_lhs)
    if path == "weight_only" and rows == 1 and not w_batch:
        # One row: XLA on CPU fuses the conversion and the scaling (whatever the
        # layout) into the product, so no float weight is written.
        deq = _dequantised(w, acc)
        lhs, rhs = (deq, x.astype(acc)) if w_is_lhs else (x.astype(acc), deq)
        return one_row_dot(lhs, rhs, dn, w_is_lhs).astype(out_dtype)
    if path == "weight_only":
        out = _blocked_product(
            x, w, dn=dn, w_is_lhs=w_is_lhs, acc=acc, precision=precision
        )
        return out.astype(out_dtype)
    # The int8 x int8 path (float8 x float8 for the float8 formats).
    q = w.codes()
    w_keep = [a for a in range(q.ndim) if a not in w_contract]
    # An infinite scale block: the dense weight there is an infinity, or NaN
    # where its integer is 0 (`0 * inf`), so the dense product is NaN wherever a
    # column meets such a 0; the integer sum times the infinite scale cannot tell
    # (it gave an infinity where dense JAX has NaN). NaN for the whole block, as
    # for a row of activations holding a non-finite entry: never a finite number.
    raw = w.scale.astype(acc)
    scale = expand_axes(w, jnp.where(jnp.isinf(raw), jnp.nan, raw), w_keep)
    scaled = [i for i in w_contract if w.scale.shape[i] > 1]
    x_op, x_scale = quantise_rows(x, x_contract, w.format, w.act_scale)
    int_format = w.format == "int"

    def dot(a: Array, b: Array, dims: DimensionNumbers, integer: bool) -> Array:
        lhs, rhs = (b, a) if w_is_lhs else (a, b)
        if not integer:
            lhs, rhs = lhs.astype(acc), rhs.astype(acc)
            if rows == 1:
                return one_row_dot(lhs, rhs, dims, w_is_lhs)
        if integer and not int_format:
            # float8 x float8, accumulating in float32.
            return lax.dot_general(
                lhs, rhs, dims, preferred_element_type=jnp.float32
            ).astype(acc)
        return lax.dot_general(
            lhs,
            rhs,
            dims,
            precision=None if integer else precision,
            preferred_element_type=jnp.int32 if integer else acc,
        ).astype(acc)

    lhs_ndim, rhs_ndim = (q.ndim, x.ndim) if w_is_lhs else (x.ndim, q.ndim)
    if scaled:
        # Groups along contracted axes: split them off as batch axes of the product.
        w_groups = {i: w.scale.shape[i] for i in scaled}
        x_groups = {
            j: w.scale.shape[i]
            for i, j in zip(w_contract, x_contract, strict=True)
            if i in w_groups
        }
        q2, w_in, w_out = split_groups(q, w_groups)
        s2, _, _ = split_groups(scale, w_groups)
        x2, x_in, x_out = split_groups(x_op, x_groups)
        pairs = [(i, j) for i, j in zip(w_contract, x_contract, strict=True)]
        new_batch_w = [w_out[i] for i, _ in pairs if i in w_groups] + [
            w_in[i] for i in w_batch
        ]
        new_batch_x = [x_out[j] for i, j in pairs if i in w_groups] + [
            x_in[j] for j in x_batch
        ]
        new_contract_w = [w_in[i] for i, _ in pairs]
        new_contract_x = [x_in[j] for _, j in pairs]
        if w_is_lhs:
            dn2 = ((new_contract_w, new_contract_x), (new_batch_w, new_batch_x))
            nd = (q2.ndim, x2.ndim)
        else:
            dn2 = ((new_contract_x, new_contract_w), (new_batch_x, new_batch_w))
            nd = (x2.ndim, q2.ndim)
        main = dot(x2, q2, dn2, integer=True)
        main = main * to_out(s2, w_is_lhs, dn2, *nd)
        xs2, _, _ = split_groups(x_scale, x_groups)
        main = main * to_out(xs2, not w_is_lhs, dn2, *nd)
        main = jnp.sum(main, axis=tuple(range(len(w_groups))))
    else:
        main = dot(x_op, q, dn, integer=True)
        main = main * to_out(scale, w_is_lhs, dn, lhs_ndim, rhs_ndim)
        main = main * to_out(x_scale, not w_is_lhs, dn, lhs_ndim, rhs_ndim)
    if w.zero_point is not None:
        # The offset `-z * s`: sum `x` within each block of the contracted axes.
        offset = expand_axes(
            w, -(w.zero_point.astype(acc) * w.scale.astype(acc)), w_keep
        )
        x_red = x.astype(acc)
        for i, j in zip(w_contract, x_contract, strict=True):
            n = offset.shape[i]
            x_red = jnp.moveaxis(x_red, j, -1)
            x_red = x_red.reshape(*x_red.shape[:-1], n, x_red.shape[-1] // n).sum(-1)
            x_red = jnp.moveaxis(x_red, -1, j)
        main = main + dot(x_red, offset, dn, integer=False)
    return main.astype(out_dtype)


_Fields = tuple[int, Any, bool, int, bool, str, str]


def _static_fields(w: QuantisedArray) -> _Fields:
    return (
        w.bits,
        w.float_dtype,
        w.odd,
        w.packed_axis,
        w.allow_materialise,
        w.matmul,
        w.format,
    )


def _rebuild(
    fields: _Fields,
    values: Array,
    scale: Array,
    zero: Array | None,
    act_scale: Array | None = None,
) -> QuantisedArray:
    bits, float_dtype, odd, packed_axis, allow_materialise, matmul, fmt = fields
    return QuantisedArray(
        values,
        scale,
        zero,
        None,
        bits=bits,
        float_dtype=float_dtype,
        odd=odd,
        packed_axis=packed_axis,
        allow_materialise=allow_materialise,
        matmul=matmul,
        format=fmt,
        act_scale=act_scale,
    )


@ft.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _straight_through(
    static: Any,
    x: Array,
    values: Array,
    scale: Array,
    zero: Any,
    master: Any,
    act_scale: Any,
) -> Array:
    template, kwargs = static
    w = _rebuild(template, values, scale, zero, act_scale)
    return _product(x, w, **dict(kwargs))


@_straight_through.defjvp
def _(static: Any, primals: Any, tangents: Any) -> Any:
    template, kwargs = static
    x, values, scale, zero, master, act_scale = primals
    dx, _, dscale, dzero, dmaster, _ = tangents
    kwargs = dict(kwargs)
    out = _product(x, _rebuild(template, values, scale, zero, act_scale), **kwargs)
    exact = {**kwargs, "path": "weight_only"}

    def weight_only(x: Array, scale: Array, zero: Any) -> Array:
        return _product(x, _rebuild(template, values, scale, zero), **exact)

    _, tangent = jax.jvp(weight_only, (x, scale, zero), (dx, dscale, dzero))
    if master is not None:
        lhs, rhs = (dmaster, x) if kwargs["w_is_lhs"] else (x, dmaster)
        acc = jnp.promote_types(kwargs["out_dtype"], jnp.float32)
        tangent = tangent + lax.dot_general(
            lhs.astype(acc),
            rhs.astype(acc),
            kwargs["dn"],
            precision=kwargs["precision"],
        ).astype(tangent.dtype)
    return out, tangent


def quantised_dot(
    x: Array,
    w: QuantisedArray,
    *,
    dn: DimensionNumbers,
    w_is_lhs: bool,
    precision: Any,
    preferred_element_type: Any,
) -> Array:
    """`dot_general` of a float array `x` with `w`, on the path `matmul_path`
    chooses; derivatives as the weight-only product, and straight through to
    `w.master` when it has one."""
    x_contract, x_batch = sides(dn, not w_is_lhs)
    rows = rows_of(x, x_contract, x_batch)
    path = matmul_path(rows, w, sides(dn, w_is_lhs)[0])
    record = recording_activations.get()
    if record is not None and w.act_scale is not None:
        # Calibrating: report the activations' range, compute the exact product.
        finite = jnp.where(jnp.isfinite(x), jnp.abs(x), 0)
        jax.debug.callback(record, w.act_scale, jnp.max(finite))
        path = "weight_only"
    out_dtype = preferred_element_type or jnp.result_type(x.dtype, w.float_dtype)
    # Hashable, for `custom_jvp`'s static arguments.
    (lc, rc), (lb, rb) = dn
    hashable = tuple(tuple(int(a) for a in axes) for axes in (lc, rc, lb, rb))
    kwargs: dict[str, Any] = dict(
        dn=(hashable[:2], hashable[2:]),
        w_is_lhs=w_is_lhs,
        path=path,
        rows=rows,
        precision=precision,
        out_dtype=np.dtype(out_dtype),
    )
    if path == "weight_only" and w.master is None:
        return _product(jnp.asarray(x), w, **kwargs)
    static = (_static_fields(w), tuple(sorted(kwargs.items())))
    return _straight_through(
        static, jnp.asarray(x), w.values, w.scale, w.zero_point, w.master, w.act_scale
    )
