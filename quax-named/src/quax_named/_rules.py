"""The rules for `NamedArray` inside unmodified positional code.

Every rule returns an array of exactly the shape the positional program expects, with
names that are right: elementwise operations align their operands by name (never by
position), `dot_general` contracts only matching axes, reductions and positional
reshapes drop or keep the axes at the positions the program names (the storage order,
`NamedArray.axes`). What cannot be laid out both ways refuses with an error naming
the axes; every other primitive falls back to the refusing `default` of
`quax.GuardedValue`, unless the array allows materialising.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import quax
from jax import lax
from jax.extend.core import Primitive
from jaxtyping import ArrayLike

from ._axes import Axis, Broadcast, labels
from ._kernels import array_shape, bind, call, relayout, uniform_value
from ._loops import body_of, run_scan
from ._value import NamedArray, make


__all__: list[str] = []


def _allow(values: Sequence[Any]) -> bool:
    named = [v for v in values if isinstance(v, NamedArray)]
    return all(v.allow_materialise for v in named)


# Elementwise ------------------------------------------------------------------------

_ELEMENTWISE = [
    lax.abs_p, lax.acos_p, lax.acosh_p, lax.asin_p, lax.asinh_p, lax.atan_p,
    lax.atanh_p, lax.cbrt_p, lax.ceil_p, lax.conj_p, lax.convert_element_type_p,
    lax.cos_p, lax.cosh_p, lax.digamma_p, lax.erf_inv_p, lax.erf_p,
    lax.erfc_p, lax.exp2_p, lax.exp_p, lax.expm1_p, lax.floor_p, lax.imag_p,
    lax.integer_pow_p, lax.is_finite_p, lax.lgamma_p, lax.log1p_p, lax.log_p,
    lax.logistic_p, lax.neg_p, lax.not_p, lax.real_p, lax.reduce_precision_p,
    lax.round_p, lax.rsqrt_p, lax.sign_p, lax.sin_p, lax.sinh_p, lax.sqrt_p,
    lax.square_p, lax.tan_p, lax.tanh_p,
    lax.population_count_p, lax.sharding_constraint_p,
    # n-ary
    lax.add_p, lax.sub_p, lax.mul_p, lax.div_p, lax.rem_p, lax.pow_p, lax.max_p,
    lax.min_p, lax.atan2_p, lax.nextafter_p, lax.and_p, lax.or_p, lax.xor_p,
    lax.eq_p, lax.ne_p, lax.lt_p, lax.le_p, lax.gt_p, lax.ge_p, lax.complex_p,
    lax.shift_left_p, lax.shift_right_logical_p, lax.shift_right_arithmetic_p,
    lax.select_n_p, lax.clamp_p, lax.igamma_p, lax.igammac_p, lax.zeta_p,
]  # fmt: skip


def _layout(
    primitive: Primitive, operands: Sequence[Any], shape: tuple[int, ...]
) -> list[Axis]:
    """The axes of an elementwise result of positional shape `shape`: every real axis
    of every operand once, at the position its first operand gives it if free, else
    at a free position of its size; broadcast axes fill the rest."""
    out: list[Axis | None] = [None] * len(shape)
    placed: dict[Any, int] = {}
    deferred: list[Axis] = []
    for x in operands:
        if not isinstance(x, NamedArray) or not x.axes:
            continue
        for i, axis in enumerate(x.axes):
            if isinstance(axis, Broadcast) or axis.key in placed:
                continue
            if out[i] is None:
                out[i] = axis
                placed[axis.key] = i
            elif axis.key not in (a.key for a in deferred):
                deferred.append(axis)
    sizes = _axis_sizes(primitive, operands)
    for axis in deferred:
        free = [
            j for j, a in enumerate(out) if a is None and shape[j] == sizes[axis.key]
        ]
        if not free:
            named = [x for x in operands if isinstance(x, NamedArray)]
            raise ValueError(
                f"Cannot align the operands of `{primitive.name}` by name inside "
                f"positional code: their axes "
                f"{' and '.join(labels(x.axes) for x in named)} "
                f"together have more axes than the result's positional shape {shape} "
                "can hold (quax_named never aligns different names by position). "
                "Broadcast explicitly by name (`quax_named.broadcast_to`, the "
                "NamedArray operators) or use `quax_named.nmap`."
            )
        out[free[0]] = axis
        placed[axis.key] = free[0]
    result = [a if a is not None else Broadcast(shape[j]) for j, a in enumerate(out)]
    for x in operands:
        if not isinstance(x, NamedArray):
            continue
        for j, axis in enumerate(x.axes):
            # A real axis that aligning by name moves away from a position that
            # nothing else fills: positional code varies the result along both
            # positions (`v[:, None] * v[None, :]`), one name cannot.
            if not isinstance(axis, Broadcast) and isinstance(result[j], Broadcast):
                if shape[j] == 1:
                    continue
                named = [o for o in operands if isinstance(o, NamedArray)]
                renamed = {axis.name or "<axis>": (axis.name or "<axis>") + "2"}
                raise ValueError(
                    f"`{primitive.name}` would hold axis {axis.label()!r} twice: "
                    f"positional code puts it at position {placed[axis.key]} of one "
                    f"operand and {j} of another "
                    f"({' and '.join(labels(o.axes) for o in named)}), as an outer "
                    "product of an array with itself does, and a NamedArray holds "
                    "each axis once. Rename the axis in one operand first "
                    f"(`quax_named.rename(x, {renamed!r})`), or use "
                    "`quax_named.nmap`."
                )
    for j, axis in enumerate(result):
        if not isinstance(axis, Broadcast) and sizes[axis.key] != shape[j]:
            raise ValueError(
                f"`{primitive.name}` broadcasts axis {axis.label()!r} of size "
                f"{sizes[axis.key]} to size {shape[j]} by position; quax_named refuses "
                "to stretch a named axis. Give the operands matching axes."
            )
    return result


def _axis_sizes(primitive: Primitive, operands: Sequence[Any]) -> dict[Any, int]:
    sizes: dict[Any, int] = {}
    where: dict[Any, str] = {}
    for x in operands:
        if not isinstance(x, NamedArray):
            continue
        for axis, n in zip(x.axes, array_shape(x.array), strict=True):
            if isinstance(axis, Broadcast):
                continue
            if axis.key in sizes and sizes[axis.key] != n:
                raise ValueError(
                    f"Axis {axis.label()!r} has size {sizes[axis.key]} in operand "
                    f"{where[axis.key]} and size {n} in operand {labels(x.axes)} of "
                    f"`{primitive.name}`."
                )
            sizes[axis.key] = n
            where[axis.key] = labels(x.axes)
    return sizes


def _same_layout(inputs: Sequence[Any]) -> NamedArray | None:
    """The first operand when every named operand has its axes and shape and the
    others are scalars (the common case, bound as it is); else `None`."""
    first = None
    for x in inputs:
        if isinstance(x, NamedArray):
            if first is None:
                first = x
            elif x.axes != first.axes or array_shape(x.array) != array_shape(
                first.array
            ):
                return None
        elif np.ndim(x) != 0:
            return None
    return first


def _elementwise(
    primitive: Primitive, *inputs: NamedArray | ArrayLike, **params: Any
) -> Any:
    fast = _same_layout(inputs)
    if fast is not None:
        arrays = [x.array if isinstance(x, NamedArray) else x for x in inputs]
        return make(bind(primitive, *arrays, **params), fast.axes, _allow(inputs))
    operands = list(inputs)
    shapes = [array_shape(x) for x in operands]
    ranked = [s for s in shapes if s]
    shape = tuple(np.broadcast_shapes(*ranked)) if ranked else ()
    named = [x for x in operands if isinstance(x, NamedArray)]
    for k, (x, s) in enumerate(zip(operands, shapes, strict=True)):
        if isinstance(x, NamedArray) or all(n == 1 for n in s):
            continue
        uniform = uniform_value(x)
        if uniform is not None:
            operands[k] = np.reshape(uniform, (1,) * len(s))
            shapes[k] = (1,) * len(s)
            continue
        if _allow(operands):
            return quax.fallback_rule(primitive, operands)(operands, params)
        raise ValueError(
            f"`{primitive.name}` mixes a NamedArray with axes "
            f"{labels(named[0].axes)} and an unnamed array of shape {s}: "
            "quax_named never aligns an array by position. Wrap the other "
            "operand as `NamedArray(array, axes)` (or use `quax_named.nmap`)."
        )
    if not shape:
        arrays = [x.array if isinstance(x, NamedArray) else x for x in operands]
        return bind(primitive, *arrays, **params)
    out = _layout(primitive, operands, shape)
    arrays = []
    for x, s in zip(operands, shapes, strict=True):
        if isinstance(x, NamedArray):
            arrays.append(relayout(x, out, shape))
        elif s:
            arrays.append(
                call(lax.broadcast_in_dim, call(lax.reshape, x, ()), shape, ())
            )
        else:
            arrays.append(x)
    result = bind(primitive, *arrays, **params)
    return make(result, out, _allow(named))


for _p in _ELEMENTWISE:
    quax.register_elementwise([_p])(_elementwise)


# Contractions -----------------------------------------------------------------------


def _same(a: Axis, b: Axis) -> bool:
    return isinstance(a, Broadcast) or isinstance(b, Broadcast) or a.key == b.key


@quax.register(lax.dot_general_p)
def _dot_general(
    lhs: NamedArray, rhs: NamedArray, *, dimension_numbers: Any, **params: Any
) -> Any:
    (lc, rc), (lb, rb) = dimension_numbers
    for i, j in zip(lc, rc, strict=True):
        if not _same(lhs.axes[i], rhs.axes[j]):
            raise TypeError(
                "Cannot contract mismatched dimensions: lhs axis "
                f"{lhs.axes[i].label()!r} (of {labels(lhs.axes)}) with rhs axis "
                f"{rhs.axes[j].label()!r} (of {labels(rhs.axes)}). If they are the "
                "same axis, give them one name (`quax_named.rename`); else contract "
                "the axes you mean by name (`quax_named.dot`, `quax_named.einsum`)."
            )
    for i, j in zip(lb, rb, strict=True):
        if not _same(lhs.axes[i], rhs.axes[j]):
            raise TypeError(
                "Cannot batch mismatched dimensions: lhs axis "
                f"{lhs.axes[i].label()!r} (of {labels(lhs.axes)}) with rhs axis "
                f"{rhs.axes[j].label()!r} (of {labels(rhs.axes)}). If they are the "
                "same axis, give them one name (`quax_named.rename`); else "
                "lay the operands out so the batch axes match "
                "(`quax_named.transpose`), or contract by name (`quax_named.dot`)."
            )
    batch = [
        rhs.axes[j] if isinstance(lhs.axes[i], Broadcast) else lhs.axes[i]
        for i, j in zip(lb, rb, strict=True)
    ]
    lhs_free = [a for i, a in enumerate(lhs.axes) if i not in lc and i not in lb]
    rhs_free = [a for i, a in enumerate(rhs.axes) if i not in rc and i not in rb]
    out = batch + lhs_free + rhs_free
    keys = [a.key for a in out]
    contracted = [lhs.axes[i] for i in lc] + [rhs.axes[j] for j in rc]
    kept = [a for a in contracted if not isinstance(a, Broadcast) and a.key in keys]
    if kept:
        raise TypeError(
            f"Ambiguous contraction: axis {kept[0].label()!r} is contracted (against "
            f"a broadcast axis) and kept in {labels(lhs.axes)} @ {labels(rhs.axes)}. "
            "Contract by name with `quax_named.dot`/`quax_named.einsum`."
        )
    clash = [a for k, a in enumerate(out) if a.key in keys[:k]]
    if clash:
        raise TypeError(
            f"Ambiguous contraction: axis {clash[0].label()!r} is in both operands "
            f"{labels(lhs.axes)} and {labels(rhs.axes)} but the positional program "
            "neither contracts nor batches it. Contract by name with "
            "`quax_named.dot`/`quax_named.einsum`, or rename one of them."
        )
    result = bind(
        lax.dot_general_p,
        lhs.array,
        rhs.array,
        dimension_numbers=dimension_numbers,
        **params,
    )
    return make(result, out, _allow([lhs, rhs]))


def _unnamed_contraction(
    named: NamedArray, other: Any, params: dict[str, Any], values: Any
) -> Any:
    if _allow([named]):
        return quax.fallback_rule(lax.dot_general_p, values)(values, params)
    raise TypeError(
        "Cannot contract mismatched dimensions: a NamedArray with axes "
        f"{labels(named.axes)} meets an unnamed array of shape {array_shape(other)} in "
        "`dot_general`, and quax_named never contracts by position. Wrap the other "
        "operand as `NamedArray(array, axes)`, or use `quax_named.nmap`."
    )


@quax.register(lax.dot_general_p)
def _dot_general_lhs(lhs: NamedArray, rhs: ArrayLike, **params: Any) -> Any:
    return _unnamed_contraction(lhs, rhs, params, [lhs, rhs])


@quax.register(lax.dot_general_p)
def _dot_general_rhs(lhs: ArrayLike, rhs: NamedArray, **params: Any) -> Any:
    return _unnamed_contraction(rhs, lhs, params, [lhs, rhs])


# Reductions and positional reshaping ------------------------------------------------

_REDUCTIONS = [
    lax.reduce_sum_p, lax.reduce_max_p, lax.reduce_min_p, lax.reduce_prod_p,
    lax.reduce_and_p, lax.reduce_or_p, lax.reduce_xor_p, lax.argmax_p, lax.argmin_p,
]  # fmt: skip


def _reduction(
    primitive: Primitive, x: NamedArray, *, axes: Sequence[int], **params: Any
) -> Any:
    result = bind(primitive, x.array, axes=axes, **params)
    kept = [a for i, a in enumerate(x.axes) if i not in axes]
    return make(result, kept, x.allow_materialise)


for _p in _REDUCTIONS:
    quax.register_elementwise([_p])(_reduction)

_CUMULATIVE = [
    lax.cumsum_p,
    lax.cumprod_p,
    lax.cummax_p,
    lax.cummin_p,
    lax.cumlogsumexp_p,
]


def _cumulative(primitive: Primitive, x: NamedArray, **params: Any) -> Any:
    return make(bind(primitive, x.array, **params), x.axes, x.allow_materialise)


for _p in _CUMULATIVE:
    quax.register_elementwise([_p])(_cumulative)


@quax.register(lax.transpose_p)
def _transpose(x: NamedArray, *, permutation: Sequence[int]) -> Any:
    result = bind(lax.transpose_p, x.array, permutation=permutation)
    return make(result, [x.axes[i] for i in permutation], x.allow_materialise)


@quax.register(lax.broadcast_in_dim_p)
def _broadcast_in_dim(
    x: NamedArray,
    *dyn: ArrayLike,
    shape: Sequence[int],
    broadcast_dimensions: Sequence[int],
    **params: Any,
) -> Any:
    result = bind(
        lax.broadcast_in_dim_p,
        x.array,
        *dyn,
        shape=shape,
        broadcast_dimensions=broadcast_dimensions,
        **params,
    )
    own = array_shape(x.array)
    out: list[Axis] = []
    for j, n in enumerate(shape):
        if j in broadcast_dimensions:
            i = list(broadcast_dimensions).index(j)
            out.append(x.axes[i] if own[i] == n else Broadcast(n))
        else:
            out.append(Broadcast(n))
    return make(result, out, x.allow_materialise)


@quax.register(lax.squeeze_p)
def _squeeze(x: NamedArray, *, dimensions: Sequence[int]) -> Any:
    result = bind(lax.squeeze_p, x.array, dimensions=dimensions)
    ndim = len(x.axes)
    dropped = {d % ndim for d in dimensions}
    kept = [a for i, a in enumerate(x.axes) if i not in dropped]
    return make(result, kept, x.allow_materialise)


@quax.register(lax.reshape_p)
def _reshape(
    x: NamedArray,
    *dyn: ArrayLike,
    new_sizes: Sequence[int],
    dimensions: Any,
    **params: Any,
) -> Any:
    own = array_shape(x.array)
    kept = [(a, n) for a, n in zip(x.axes, own, strict=True) if n != 1]
    new = [n for n in new_sizes if n != 1]
    if dimensions is not None or [n for _, n in kept] != new:
        if x.allow_materialise:
            values = [x, *dyn]
            params = dict(params, new_sizes=new_sizes, dimensions=dimensions)
            return quax.fallback_rule(lax.reshape_p, values)(values, params)
        raise ValueError(
            f"`reshape` from shape {own} to {tuple(new_sizes)} would merge or split "
            f"axes of a NamedArray with axes {labels(x.axes)}, and names cannot follow "
            "that. Use `quax_named.nmap` for code that reshapes, or "
            "`.enable_materialise()` to drop the names."
        )
    result = bind(
        lax.reshape_p,
        x.array,
        *dyn,
        new_sizes=new_sizes,
        dimensions=dimensions,
        **params,
    )
    it = iter(kept)
    out = [next(it)[0] if n != 1 else Broadcast(1) for n in new_sizes]
    return make(result, out, x.allow_materialise)


@quax.register(lax.slice_p)
def _slice(x: NamedArray, **params: Any) -> Any:
    result = bind(lax.slice_p, x.array, **params)
    out = [a.resized(n) for a, n in zip(x.axes, array_shape(result), strict=True)]
    return make(result, out, x.allow_materialise)


@quax.register(lax.rev_p)
def _rev(x: NamedArray, **params: Any) -> Any:
    return make(bind(lax.rev_p, x.array, **params), x.axes, x.allow_materialise)


# Loops --------------------------------------------------------------------------------


@quax.register(lax.scan_p)
def _scan(
    *args: NamedArray | ArrayLike,
    jaxpr: Any,
    length: int,
    reverse: bool,
    unroll: Any,
    num_consts: int,
    num_carry: int,
    **params: Any,
) -> list[Any]:
    # `jax.lax.scan` slices each scanned-over input along its leading storage axis;
    # the core's scan would slice a NamedArray's leaf and leave its names. Here each
    # slice keeps the other names, and outputs are stacked under the scanned axis.
    consts = args[:num_consts]
    carry = args[num_consts : num_consts + num_carry]
    xs = args[num_consts + num_carry :]
    body = body_of(jaxpr)

    def step(c: list[Any], slices: list[Any]) -> tuple[list[Any], list[Any]]:
        out = body(*consts, *c, *slices)
        return list(out[:num_carry]), list(out[num_carry:])

    new, ys = run_scan(
        step,
        carry,
        xs,
        length=length,
        reverse=reverse,
        unroll=unroll,
        fn="`jax.lax.scan`",
    )
    return [*new, *ys]
