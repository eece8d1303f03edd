"""A Pallas TPU kernel for the weight-only product `x @ W.T`: the quantised weight
read once from memory, its levels decoded (int8, int4 or NF4 nibbles, float8) and
multiplied on the matrix unit tile by tile, the scales applied to each group's
partial product, accumulating in float32.

XLA fuses a conversion into a product, but not every decoding (unpacking nibbles,
NF4's table): where it does not, it writes the float weight out first. This
kernel is the path that never does. It is chosen where the product runs on a TPU
and `quax_quant.kernels` says `"pallas"` for the format; `available` compiles it
once per shape and layout, and a kernel that does not compile (an operation the
chip's compiler lacks, a layout it refuses) is logged and the XLA path taken,
never an error in a user's call. On other backends it runs only in interpret mode
(`interpret=True`), which the tests use to check it against the XLA path.

Layout: `x` `(M, K)`; the weight `(N, K)` as stored by `QuantisedArray`: int8 or
float8 values `(N, K)`, or 4-bit values packed two per byte along `K` (`(N, K /
2)`: byte `i` holds element `i` in its low bits and element `i + K / 2` in its
high bits); the scale `(S, G)` with `S` 1 or `N` and `G` 1 (per channel) or a
number of groups of a multiple of 64 consecutive inputs. Others (zero points,
batch axes, groups of 32) are not this kernel's (`plan` returns `None`).
"""

import functools as ft
import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array

from ._kernels import nf4_levels


__all__ = ["Plan", "available", "plan", "weight_only_matmul"]

logger = logging.getLogger("quax_quant")

# Lanes of a TPU vector register: the last axis of every block is a multiple of it.
_LANES = 128
# Groups of inputs sharing a scale are multiples of this: half a register's lanes
# (NF4's blocks of 64; the compiler may refuse half-register slices, and then
# `available` says no).
_GROUP = 64
# Scoped on-chip memory the kernel may use (its tiles fit well below it).
_VMEM_LIMIT = 32 * 2**20


class Plan(NamedTuple):
    """How `weight_only_matmul` tiles a product: rows `tm` (the padded rows), output
    columns `tn`, and stored inputs `tk` per step (packed bytes for 4-bit values);
    `group` the scale's group length along the inputs (0 for one per channel)."""

    tm: int
    tn: int
    tk: int
    group: int


def _divisor(n: int, choices: tuple[int, ...]) -> int | None:
    return next((c for c in choices if n % c == 0), None)


def plan(
    rows: int,
    n: int,
    k: int,
    fmt: str,
    packed: bool,
    scale_shape: tuple[int, ...],
    tiles: tuple[int, int, int] | None = None,
) -> Plan | None:
    """The tiling of a product of `rows` rows with a weight `(n, k)`, or `None` where
    the kernel does not apply (shapes off the 128-lane grid, groups that are not
    a multiple of 64 inputs, or, for 4-bit values, groups that straddle the two
    halves of the packing). `tiles` overrides `(tm, tn, tk)` (benchmarks)."""
    s, g = scale_shape
    if rows < 1 or s not in (1, n) or n % _LANES or k % _LANES:
        return None
    stored = k // 2 if packed else k
    if packed and (k % 2 or stored % _LANES):
        return None
    group = 0 if g == 1 else k // g
    if group and (k % g or group % _GROUP or (packed and stored % group)):
        return None
    if tiles is not None:
        tm, tn, tk = tiles
    else:
        tm = rows if rows <= 512 else 512
        tn = _divisor(n, (512, 256, 128))
        tk = _divisor(stored, (512, 256, 128) if packed else (1024, 512, 256, 128))
    if tn is None or tk is None or n % tn or stored % tk:
        return None
    if group and tk % group and group % tk:
        return None
    return Plan(tm, tn, tk, group)


def _decode(q: Array, fmt: str, dtype: Any) -> Array:
    """The levels of stored values `q` (int8, int32 nibbles, or float8) as `dtype`."""
    if fmt == "nf4":
        return nf4_levels(q, jnp.float32).astype(dtype)
    return q.astype(jnp.float32).astype(dtype)


def _dot_nt(a: Array, b: Array) -> Array:
    """`a @ b.T`, accumulating in float32."""
    return lax.dot_general(
        a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )


def _kernel(
    *refs: Any, fmt: str, packed: bool, plan: Plan, steps: int, dtype: Any
) -> None:
    from jax.experimental import pallas as pl

    if packed:
        x_lo, x_hi, w_ref, s_lo, s_hi, o_ref, acc_ref = refs
    else:
        x_lo, w_ref, s_lo, o_ref, acc_ref = refs
        x_hi = s_hi = None
    step = pl.program_id(2)

    @pl.when(step == 0)
    def _() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    stored = w_ref[...]
    if packed:
        wide = stored.astype(jnp.int32)
        # Sign-extend each nibble: the low one shifted to the top and back.
        halves = [
            (x_lo, lax.shift_right_arithmetic(lax.shift_left(wide, 28), 28), s_lo),
            (x_hi, lax.shift_right_arithmetic(wide, 4), s_hi),
        ]
    else:
        halves = [(x_lo, stored, s_lo)]
    acc = acc_ref[...]
    for x_ref, q, s_ref in halves:
        assert x_ref is not None and s_ref is not None
        levels = _decode(q, fmt, dtype)
        x = x_ref[...].astype(dtype)
        if not plan.group:
            acc += _dot_nt(x, levels)
            continue
        # One scale per group of inputs and output column: scale each group's
        # partial product (`s_ref[g]` is that group's row of scales).
        per_tile = max(plan.tk // plan.group, 1)
        width = min(plan.group, plan.tk)
        for g in range(per_tile):
            cut = slice(g * width, (g + 1) * width)
            acc += _dot_nt(x[:, cut], levels[:, cut]) * s_ref[g]
    acc_ref[...] = acc

    @pl.when(step == steps - 1)
    def _() -> None:
        out = acc_ref[...]
        if not plan.group:
            out = out * s_lo[0]
        o_ref[...] = out.astype(o_ref.dtype)


def weight_only_matmul(
    x: Array,
    values: Array,
    scale: Array,
    *,
    fmt: str,
    plan: Plan,
    dtype: Any,
    out_dtype: Any,
    interpret: bool = False,
) -> Array:
    """`x @ W.T` for `x` `(M, K)` and the stored weight `(N, K)` (see the module
    docstring), with `plan` from [`plan`][]; `dtype` is the type the levels and
    `x` are multiplied in (`x`'s, or float32), the sum is float32, the result
    `out_dtype`. `fmt` is `"int"`, `"nf4"` or a float8 format; `values` holds
    4-bit values packed when its last axis is half of `K`."""
    # Imported here: only a product taking this path (or a test) needs Pallas.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    rows, k = x.shape
    n, stored = values.shape
    packed = stored != k
    tm, tn, tk, group = plan
    padded = -(-rows // tm) * tm
    if padded != rows:
        x = jnp.pad(x, ((0, padded - rows), (0, 0)))
    groups = 1 if not group else k // group
    # Scales as `(groups, 1, n)` float32 rows: block `(g, 1, tn)` is lane-dense.
    scale = jnp.broadcast_to(
        jnp.transpose(scale.astype(jnp.float32))[:, None, :], (groups, 1, n)
    )
    steps = stored // tk
    per_step = max(tk // group, 1) if group else 1
    # Group blocks per step, or steps per group where a group spans steps.
    span = 1 if not group or tk >= group else group // tk

    def x_spec(offset: int) -> Any:
        return pl.BlockSpec((tm, tk), lambda i, j, s: (i, s + offset))

    def s_spec(offset: int) -> Any:
        if not group:
            return pl.BlockSpec((1, 1, tn), lambda i, j, s: (0, 0, j))
        return pl.BlockSpec(
            (per_step, 1, tn), lambda i, j, s: (s // span + offset, 0, j)
        )

    w_spec = pl.BlockSpec((tn, tk), lambda i, j, s: (j, s))
    if packed:
        # The high nibbles are inputs `k / 2` on: their `x` columns and groups
        # sit that far along.
        half_groups = (stored // group) // per_step if group else 0
        in_specs = [x_spec(0), x_spec(steps), w_spec, s_spec(0), s_spec(half_groups)]
        operands = (x, x, values, scale, scale)
    else:
        in_specs = [x_spec(0), w_spec, s_spec(0)]
        operands = (x, values, scale)
    call = pl.pallas_call(
        ft.partial(
            _kernel, fmt=fmt, packed=packed, plan=plan, steps=steps, dtype=dtype
        ),
        out_shape=jax.ShapeDtypeStruct((padded, n), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=in_specs,
            out_specs=pl.BlockSpec((tm, tn), lambda i, j, s: (i, j)),
            grid=(padded // tm, n // tn, steps),
            scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_VMEM_LIMIT,
        ),
        interpret=interpret,
    )
    out = call(*operands)
    return out[:rows] if padded != rows else out


# Whether the kernel compiled, by everything its program depends on.
_available: dict[tuple[Any, ...], bool] = {}


def available(
    x_shape: tuple[int, ...],
    x_dtype: Any,
    values_shape: tuple[int, ...],
    values_dtype: Any,
    scale_shape: tuple[int, ...],
    scale_dtype: Any,
    *,
    fmt: str,
    plan: Plan,
    dtype: Any,
    out_dtype: Any,
) -> bool:
    """Whether `weight_only_matmul` compiles for these shapes and types on the
    default backend: compiled once (outside any trace: only shapes and types) and
    remembered. A failure is logged (logger `quax_quant`, level INFO, with the
    compiler's message) and answered `False`: the caller takes the XLA path."""
    key = (
        jax.default_backend(),
        x_shape,
        np.dtype(x_dtype),
        values_shape,
        np.dtype(values_dtype),
        scale_shape,
        np.dtype(scale_dtype),
        fmt,
        plan,
        np.dtype(dtype),
        np.dtype(out_dtype),
    )
    if key not in _available:
        args = (
            jax.ShapeDtypeStruct(x_shape, x_dtype),
            jax.ShapeDtypeStruct(values_shape, values_dtype),
            jax.ShapeDtypeStruct(scale_shape, scale_dtype),
        )
        run = ft.partial(
            weight_only_matmul, fmt=fmt, plan=plan, dtype=dtype, out_dtype=out_dtype
        )
        try:
            jax.jit(run).lower(*args).compile()
            failure = None
        except Exception as e:  # any failure to compile means "not here"
            # Only the message: the exception's frames hold the caller's tracers.
            failure = f"{type(e).__name__}: {e}"
        _available[key] = failure is None
        if failure is not None:
            logger.info(
                "quax_quant: the Pallas weight-only kernel does not compile for "
                "x %s %s, values %s %s, scale %s, format %s, %s on %s; taking the "
                "XLA path. The compiler said: %s",
                x_shape,
                np.dtype(x_dtype),
                values_shape,
                np.dtype(values_dtype),
                scale_shape,
                fmt,
                plan,
                jax.default_backend(),
                failure,
            )
    return _available[key]
