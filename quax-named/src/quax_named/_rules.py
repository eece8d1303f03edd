"""The rules for `NamedArray` inside unmodified positional code.

Every rule returns an array of exactly the shape the positional program expects, with
names that are right: elementwise operations align their operands by name (never by
position), `dot_general` contracts only matching axes, reductions and positional
reshapes drop or keep the axes at the positions the program names (the storage order,
`NamedArray.axes`), reshapes merge adjacent axes into one named after them, joins
(`concatenate`, `stack`, `pad`, `sort`) line their operands up by name at each
position, indexing (`gather`, `scatter`) names the result after the indices, and
`scan` slices its inputs keeping the other names. What cannot be laid out both ways
refuses with an error naming the axes; every other primitive falls back to the
refusing `default` of `quax.GuardedValue`, unless the array allows materialising.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import quax
from jax import lax
from jax.extend.core import Primitive, primitives as prims
from jaxtyping import ArrayLike

from ._axes import Axis, Broadcast, Flattened, labels
from ._kernels import array_shape, bind, call, relayout, uniform_value
from ._loops import body_of, run_scan
from ._value import NamedArray, like, make


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
    # the sum of two cotangents in reverse mode (`jax.grad` of `x * x`)
    prims.add_jaxvals_p,
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
    where: dict[Any, NamedArray] = {}
    for x in operands:
        if not isinstance(x, NamedArray):
            continue
        for axis, n in zip(x.axes, array_shape(x.array), strict=True):
            if isinstance(axis, Broadcast):
                continue
            if axis.key in sizes and sizes[axis.key] != n:
                raise ValueError(
                    f"Axis {axis.label()!r} has size {sizes[axis.key]} in operand "
                    f"{labels(where[axis.key].axes)} and size {n} in operand "
                    f"{labels(x.axes)} of `{primitive.name}`."
                )
            sizes[axis.key] = n
            where[axis.key] = x
    return sizes


def _same_layout(inputs: Sequence[Any]) -> Sequence[Axis] | None:
    """The axes of an elementwise result whose operands need no laying out (the
    common case, bound as it is): the named operands have one rank and, at each
    position, one axis, of the result's size (a broadcast axis, as `keepdims` and
    `jnp` broadcasting make, adopts the other operands' axis there, and a size-1
    one broadcasts as JAX does), and the others are scalars. Else `None`, and the
    general path aligns or refuses."""
    named = []
    for x in inputs:
        if isinstance(x, NamedArray):
            named.append(x)
        elif array_shape(x):
            return None
    if not named:
        return None
    first = named[0]
    shape = array_shape(first.array)
    if all(x.axes == first.axes and array_shape(x.array) == shape for x in named[1:]):
        return first.axes
    shapes = [array_shape(x.array) for x in named]
    if any(len(s) != len(shape) for s in shapes):
        return None
    axes: list[Axis] = []
    for j in range(len(shape)):
        n = 1
        for s in shapes:
            if s[j] != 1:
                if n not in (1, s[j]):
                    return None
                n = s[j]
        chosen: Axis | None = None
        spare: Axis | None = None
        for x, s in zip(named, shapes, strict=True):
            a = x.axes[j]
            if isinstance(a, Broadcast):
                if s[j] == n:
                    spare = a
                continue
            if s[j] != n or (chosen is not None and chosen.key != a.key):
                return None  # a named axis stretched, or two names at one position
            chosen = a
        axes.append(chosen or spare or Broadcast(n))
    keys = [a.key for a in axes if not isinstance(a, Broadcast)]
    if len(set(keys)) != len(keys):
        return None  # an axis at two positions: refused by the general path
    return axes


def _elementwise(
    primitive: Primitive, *inputs: NamedArray | ArrayLike, **params: Any
) -> Any:
    fast = _same_layout(inputs)
    if fast is not None:
        arrays = [x.array if isinstance(x, NamedArray) else x for x in inputs]
        return make(bind(primitive, *arrays, **params), fast, _allow(inputs))
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
    if len(lc) != len(rc) or len(lb) != len(rb):  # JAX's own refusal, with the names
        raise TypeError(
            "dot_general requires as many contracting dimensions, and as many batch "
            f"dimensions, on each side, got {dimension_numbers} for operands with "
            f"axes {labels(lhs.axes)} and {labels(rhs.axes)}. Contract by name with "
            "`quax_named.dot`/`quax_named.einsum`."
        )
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


def _regroup(
    x: NamedArray, own: tuple[int, ...], new_sizes: Sequence[int]
) -> list[Axis]:
    """The axes of `x` reshaped from `own` to `new_sizes`, where names can follow:
    size-1 axes dropped or added (broadcast), adjacent named axes merged into a
    `Flattened` axis, a `Flattened` axis split back into its parts, a broadcast
    axis merged or split. Anything else is a `ValueError` naming the axes."""
    kept = [(a, n) for a, n in zip(x.axes, own, strict=True) if n != 1]
    new = [n for n in new_sizes if n != 1]

    def refuse(why: str) -> ValueError:
        return ValueError(
            f"`reshape` from shape {own} to {tuple(new_sizes)} on a NamedArray with "
            f"axes {labels(x.axes)} {why}. Merge and split axes by name "
            "(`quax_named.flatten_axes`, `quax_named.unflatten_axis`, "
            "`quax_named.rearrange`), run the positional code through "
            "`quax_named.nmap`, or call `.enable_materialise()` to drop the names."
        )

    groups: list[tuple[list[tuple[Axis, int]], list[int]]] = []
    if 0 in own or 0 in new_sizes:
        if [n for _, n in kept] != new:
            raise refuse("regroups axes of size 0")
        groups = [([k], [n]) for k, n in zip(kept, new, strict=True)]
        i = j = len(kept)
    else:
        i = j = 0
    # Group the axes of both shapes into runs of equal products.
    while i < len(kept) or j < len(new):
        if i == len(kept) or j == len(new):
            raise refuse("regroups its axes")
        old_group, new_group = [kept[i]], [new[j]]
        old_size, new_size = kept[i][1], new[j]
        i, j = i + 1, j + 1
        while old_size != new_size:
            if old_size < new_size and i < len(kept):
                old_group.append(kept[i])
                old_size *= kept[i][1]
                i += 1
            elif new_size < old_size and j < len(new):
                new_group.append(new[j])
                new_size *= new[j]
                j += 1
            else:
                raise refuse("regroups its axes")
        groups.append((old_group, new_group))
    placed: list[Axis] = []
    for old_group, new_group in groups:
        axes = [a for a, _ in old_group]
        if len(axes) == 1 and len(new_group) == 1:
            placed.append(axes[0])
        elif all(isinstance(a, Broadcast) for a in axes):
            placed.extend(Broadcast(n) for n in new_group)
        elif len(new_group) == 1 and len(axes) > 1:
            odd = [a for a in axes if isinstance(a, Broadcast) or a.name is None]
            if odd:
                raise refuse(
                    f"merges axes {labels(axes)}, among them {odd[0].label()!r}, "
                    "which has no name to give the merged axis"
                )
            placed.append(Flattened(axes, [n for _, n in old_group]))
        elif len(axes) == 1 and isinstance(axes[0], Flattened):
            if tuple(new_group) != axes[0].part_sizes:
                raise refuse(
                    f"splits the merged axis {axes[0].label()!r} (of sizes "
                    f"{axes[0].part_sizes}) into sizes {tuple(new_group)}, whose "
                    "pieces have no names"
                )
            placed.extend(axes[0].parts)
        elif len(axes) == 1:
            raise refuse(
                f"splits axis {axes[0].label()!r} into sizes {tuple(new_group)}, "
                "whose pieces have no names"
            )
        else:
            raise refuse(f"regroups axes {labels(axes)} into sizes {tuple(new_group)}")
    it = iter(placed)
    out = [next(it) if n != 1 else Broadcast(1) for n in new_sizes]
    _check_unique("reshape", out, [x])
    return out


def _check_unique(name: str, axes: Sequence[Axis], operands: Sequence[Any]) -> None:
    """Refuse a result that would hold one axis twice."""
    keys = [a.key for a in axes if not isinstance(a, Broadcast)]
    twice = [a for a in axes if not isinstance(a, Broadcast) and keys.count(a.key) > 1]
    if twice:
        named = [o for o in operands if isinstance(o, NamedArray)]
        raise ValueError(
            f"`{name}` would hold axis {twice[0].label()!r} twice (operands "
            f"{' and '.join(labels(o.axes) for o in named)}): a NamedArray holds each "
            "axis once. Rename one of them first (`quax_named.rename`)."
        )


@quax.register(lax.reshape_p)
def _reshape(
    x: NamedArray,
    *dyn: ArrayLike,
    new_sizes: Sequence[int],
    dimensions: Any,
    **params: Any,
) -> Any:
    own = array_shape(x.array)
    try:
        if dimensions is not None:
            raise ValueError(
                f"`reshape` with `dimensions={dimensions}` transposes and regroups "
                f"the axes {labels(x.axes)} at once: transpose first "
                "(`quax_named.transpose`), or call `.enable_materialise()` to drop "
                "the names."
            )
        out = _regroup(x, own, new_sizes)
    except ValueError:
        if x.allow_materialise:
            values = [x, *dyn]
            params = dict(params, new_sizes=new_sizes, dimensions=dimensions)
            return quax.fallback_rule(lax.reshape_p, values)(values, params)
        raise
    result = bind(
        lax.reshape_p,
        x.array,
        *dyn,
        new_sizes=new_sizes,
        dimensions=dimensions,
        **params,
    )
    return make(result, out, x.allow_materialise)


@quax.register(lax.slice_p)
def _slice(x: NamedArray, **params: Any) -> Any:
    return like(x, bind(lax.slice_p, x.array, **params))


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


# Joining, splitting, padding, sorting ----------------------------------------------


def _lined_up(
    primitive: Primitive,
    operands: Sequence[Any],
    shape: Sequence[int],
    skip: int | None = None,
    way_out: str = "",
) -> list[Axis]:
    """The axes of a result whose operands positional code lines up position by
    position (a concatenation, a stack, a sort): at each position the one axis the
    named operands hold there (broadcast axes adopt it), or a broadcast axis of
    `shape`'s size where none holds one. Two different axes at one position are
    refused: quax_named never pairs two names by position. `skip` is a position
    the caller decides."""
    named = [x for x in operands if isinstance(x, NamedArray)]
    out: list[Axis] = []
    for j, n in enumerate(shape):
        if j == skip:
            out.append(Broadcast(n))
            continue
        real = [x.axes[j] for x in named if not isinstance(x.axes[j], Broadcast)]
        for a in real[1:]:
            if a.key != real[0].key:
                raise ValueError(
                    f"`{primitive.name}` lines up its operands position by position, "
                    f"and position {j} holds axes {real[0].label()!r} and "
                    f"{a.label()!r} ({' and '.join(labels(x.axes) for x in named)}): "
                    "quax_named never pairs two names by position. Lay the operands "
                    "out alike by name first (`quax_named.transpose`, "
                    f"`quax_named.align`){way_out}."
                )
        out.append(real[0].resized(n) if real else Broadcast(n))
    return out


def _unnamed_operands(
    primitive: Primitive, operands: list[Any], way_out: str
) -> list[Any] | None:
    """`operands`, each unnamed one that is known to hold one value everywhere
    kept as it is (it lines up with any names); `None` when another unnamed one
    meets the named operands and the arrays allow materialising (the caller falls
    back); else a `ValueError` naming it."""
    named = [x for x in operands if isinstance(x, NamedArray)]
    for x in operands:
        if isinstance(x, NamedArray) or uniform_value(x) is not None:
            continue
        if _allow(named):
            return None
        raise ValueError(
            f"`{primitive.name}` lines up a NamedArray with axes "
            f"{labels(named[0].axes)} and an unnamed array of shape "
            f"{array_shape(x)} position by position: quax_named never aligns an "
            "array by position. Wrap the other operand as `NamedArray(array, axes)`"
            f"{way_out}."
        )
    return operands


_CONCATENATE_WAY_OUT = ", or join by name with `quax_named.concatenate`"


@quax.register(lax.concatenate_p)
def _concatenate(*operands: NamedArray | ArrayLike, dimension: int) -> Any:
    checked = _unnamed_operands(lax.concatenate_p, list(operands), _CONCATENATE_WAY_OUT)
    if checked is None:
        values = list(operands)
        params = {"dimension": dimension}
        return quax.fallback_rule(lax.concatenate_p, values)(values, params)
    result = bind(
        lax.concatenate_p,
        *(x.array if isinstance(x, NamedArray) else x for x in operands),
        dimension=dimension,
    )
    shape = array_shape(result)
    out = _lined_up(lax.concatenate_p, operands, shape, dimension, _CONCATENATE_WAY_OUT)
    # The joined axis: the one name the operands give it (broadcast pieces, as
    # `jnp.pad` makes, adopt it), or a new anonymous axis when none names it (the
    # pieces of a stack).
    joined = [
        x.axes[dimension]
        for x in operands
        if isinstance(x, NamedArray) and not isinstance(x.axes[dimension], Broadcast)
    ]
    names = {a.key for a in joined if a.name is not None}
    if len(names) > 1 or (
        names and len(joined) > len([a for a in joined if a.name is not None])
    ):
        named = [x for x in operands if isinstance(x, NamedArray)]
        raise ValueError(
            f"`concatenate` joins axes {labels(joined)} along position {dimension} "
            f"({' and '.join(labels(x.axes) for x in named)}): a joined axis is one "
            "axis, and quax_named never pairs two names by position. Give the "
            "pieces one name (`quax_named.rename`), or join by name with "
            "`quax_named.concatenate`."
        )
    n = shape[dimension]
    out[dimension] = (
        joined[0].resized(n) if names else (Axis(n) if joined else Broadcast(n))
    )
    _check_unique("concatenate", out, operands)
    return make(result, out, _allow(operands))


@quax.register(lax.stack_p)
def _stack(*operands: NamedArray | ArrayLike, axis: int, **params: Any) -> Any:
    way_out = ", or stack by name with `quax_named.stack`"
    checked = _unnamed_operands(lax.stack_p, list(operands), way_out)
    if checked is None:
        values = list(operands)
        return quax.fallback_rule(lax.stack_p, values)(values, dict(params, axis=axis))
    result = bind(
        lax.stack_p,
        *(x.array if isinstance(x, NamedArray) else x for x in operands),
        axis=axis,
        **params,
    )
    shape = array_shape(result)
    own = [s for j, s in enumerate(shape) if j != axis]
    out = _lined_up(lax.stack_p, operands, own, None, way_out)
    # The new axis has no name in positional code: an anonymous axis.
    out.insert(axis, Axis(shape[axis]))
    return make(result, out, _allow(operands))


@quax.register(lax.unstack_p)
def _unstack(x: NamedArray, *, axis: int, **params: Any) -> Any:
    results = bind(lax.unstack_p, x.array, axis=axis, **params)
    kept = [a for i, a in enumerate(x.axes) if i != axis]
    return [make(r, kept, x.allow_materialise) for r in results]


@quax.register(lax.split_p)
def _split(x: NamedArray, **params: Any) -> Any:
    results = bind(lax.split_p, x.array, **params)
    return [like(x, r) for r in results]


@quax.register(lax.pad_p)
def _pad(x: NamedArray, padding_value: ArrayLike, **params: Any) -> Any:
    return like(x, bind(lax.pad_p, x.array, padding_value, **params))


@quax.register(lax.dynamic_slice_p)
def _dynamic_slice(x: NamedArray, *indices: ArrayLike, **params: Any) -> Any:
    return like(x, bind(lax.dynamic_slice_p, x.array, *indices, **params))


@quax.register(lax.dynamic_update_slice_p)
def _dynamic_update_slice(
    x: NamedArray, update: NamedArray | ArrayLike, *indices: ArrayLike, **params: Any
) -> Any:
    way_out = ", or update by name with `x.at[{...}].set(update)`"
    checked = _unnamed_operands(lax.dynamic_update_slice_p, [x, update], way_out)
    if checked is None:
        values = [x, update, *indices]
        rule = quax.fallback_rule(lax.dynamic_update_slice_p, values)
        return rule(values, params)
    if isinstance(update, NamedArray):
        if len(update.axes) != len(x.axes):  # JAX's own refusal, with the names
            raise TypeError(
                "dynamic_update_slice update must have the same rank as operand, "
                f"got an update with axes {labels(update.axes)} for a NamedArray "
                f"with axes {labels(x.axes)}."
            )
        for j, (a, b) in enumerate(zip(x.axes, update.axes, strict=True)):
            if isinstance(b, Broadcast) or a.key == b.key:
                continue
            raise ValueError(
                "`dynamic_update_slice` writes an update with axes "
                f"{labels(update.axes)} into a NamedArray with axes "
                f"{labels(x.axes)}, and position {j} holds {b.label()!r} in one and "
                f"{a.label()!r} in the other: quax_named never pairs two names by "
                f"position. Lay the update out as the array{way_out}."
            )
        update = update.array
    result = bind(lax.dynamic_update_slice_p, x.array, update, *indices, **params)
    return make(result, x.axes, x.allow_materialise)


@quax.register(lax.sort_p)
def _sort(*operands: NamedArray | ArrayLike, dimension: int, **params: Any) -> Any:
    # Every operand is permuted alike along `dimension`: the named ones line up by
    # position; an unnamed one (the iota `jnp.argsort` sorts alongside) is a rider
    # and comes out with their names.
    arrays = [x.array if isinstance(x, NamedArray) else x for x in operands]
    results = bind(lax.sort_p, *arrays, dimension=dimension, **params)
    shape = array_shape(results[0])
    way_out = ", or sort by name with `quax_named.sort`/`quax_named.argsort`"
    out = _lined_up(lax.sort_p, operands, shape, None, way_out)
    return [make(r, out, _allow(operands)) for r in results]


@quax.register(lax.fft_p)
def _fft(x: NamedArray, **params: Any) -> Any:
    # Along the trailing axes; a real transform changes the last one's size (it
    # keeps its name).
    return like(x, bind(lax.fft_p, x.array, **params))


_TAKE = "take by name with `quax_named.take`"


def _gather_axes(
    operand: Any,
    indices: Any,
    dimension_numbers: Any,
    slice_sizes: Sequence[int],
    shape: Sequence[int],
    what: str = "`gather` (an indexing) reads",
    way_out: str = _TAKE,
) -> list[Axis]:
    """The axes of a `gather` result (shape `shape`). Its offset axes are the
    operand's axes that are neither collapsed nor batched, resized to the slice
    (a window keeps its name, as a slice does); its batch axes are the indices'
    axes (but the last, the index vector), or the operand's batched axes. A plain
    index array names its one axis after the one axis it indexes (`x[idx]`,
    `jnp.take(x, idx, axis=1)`); any other unnamed axis is refused."""
    dn = dimension_numbers
    operand_axes = operand.axes if isinstance(operand, NamedArray) else None
    index_axes = indices.axes[:-1] if isinstance(indices, NamedArray) else None
    offset = [
        d
        for d in range(len(slice_sizes))
        if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims
    ]
    batch_positions = [j for j in range(len(shape)) if j not in dn.offset_dims]
    free = [
        k
        for k in range(len(batch_positions))
        if k not in dn.start_indices_batching_dims
    ]
    out: list[Axis | None] = [None] * len(shape)
    for j, d in zip(dn.offset_dims, offset, strict=True):
        if operand_axes is not None:
            out[j] = operand_axes[d].resized(shape[j])
        elif shape[j] == 1:
            out[j] = Broadcast(1)
    for k, j in enumerate(batch_positions):
        if k in dn.start_indices_batching_dims:
            p = list(dn.start_indices_batching_dims).index(k)
            own = operand_axes[dn.operand_batching_dims[p]] if operand_axes else None
            other = index_axes[k] if index_axes is not None else None
            if own is None or isinstance(own, Broadcast):
                own = other
            elif (
                other is not None
                and not isinstance(other, Broadcast)
                and other.key != own.key
            ):
                raise ValueError(
                    f"{what} with operand axis {own.label()!r} batched with index "
                    f"axis {other.label()!r}: quax_named never pairs two names "
                    "by position. Give them one name (`quax_named.rename`), or "
                    f"{way_out}."
                )
            out[j] = own
        elif index_axes is not None:
            out[j] = index_axes[k]
        elif (
            len(free) == 1
            and operand_axes is not None
            and len(dn.collapsed_slice_dims) == 1
            and tuple(dn.start_index_map) == tuple(dn.collapsed_slice_dims)
        ):
            # One plain index array picking along one axis: the picked entries
            # keep that axis's name, as a slice does.
            out[j] = operand_axes[dn.collapsed_slice_dims[0]].resized(shape[j])
        elif shape[j] == 1:
            out[j] = Broadcast(1)
    if any(a is None for a in out):
        if operand_axes is None:
            read = (
                f"an unnamed array of shape {array_shape(operand)} at a NamedArray "
                f"of indices {labels(indices.axes)}, and the array's axes have no "
                "names. Wrap it as `NamedArray(array, axes)`"
            )
        else:
            read = (
                f"a NamedArray with axes {labels(operand_axes)} at unnamed indices "
                f"of shape {array_shape(indices)[:-1]}, whose axes have no names. "
                "Name the index array (`NamedArray(indices, axes)`: the result "
                "takes its axes)"
            )
        raise ValueError(f"{what} {read}, or {way_out}.")
    return [a for a in out if a is not None]


def _gather(operand: Any, indices: Any, **params: Any) -> Any:
    values = [operand, indices]
    try:
        result = bind(
            lax.gather_p,
            operand.array if isinstance(operand, NamedArray) else operand,
            indices.array if isinstance(indices, NamedArray) else indices,
            **params,
        )
        out = _gather_axes(
            operand,
            indices,
            params["dimension_numbers"],
            params["slice_sizes"],
            array_shape(result),
        )
        _check_unique("gather", out, values)
    except ValueError:
        if _allow(values):
            return quax.fallback_rule(lax.gather_p, values)(values, params)
        raise
    return make(result, out, _allow(values))


@quax.register(lax.gather_p)
def _gather_named(
    operand: NamedArray, indices: NamedArray | ArrayLike, **params: Any
) -> Any:
    return _gather(operand, indices, **params)


@quax.register(lax.gather_p)
def _gather_at_named(operand: ArrayLike, indices: NamedArray, **params: Any) -> Any:
    return _gather(operand, indices, **params)


_SCATTERS = [
    lax.scatter_p, lax.scatter_add_p, lax.scatter_sub_p, lax.scatter_mul_p,
    lax.scatter_min_p, lax.scatter_max_p,
]  # fmt: skip


def _scatter(
    primitive: Primitive,
    operand: NamedArray,
    indices: NamedArray | ArrayLike,
    updates: NamedArray | ArrayLike,
    *,
    dimension_numbers: Any,
    **params: Any,
) -> Any:
    # `x.at[idx].set(v)`: the result has the operand's axes; the updates must be
    # named as what indexing the operand there gives (`x[idx]`), or be one value.
    values = [operand, indices, updates]
    dn = dimension_numbers
    way_out = "update by name with `x.at[{...}].set(v)`"
    try:
        update_array = updates.array if isinstance(updates, NamedArray) else updates
        update_shape = array_shape(update_array)
        window = [
            d
            for d in range(len(operand.axes))
            if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims
        ]
        slice_sizes = [1] * len(operand.axes)
        for j, d in zip(dn.update_window_dims, window, strict=True):
            slice_sizes[d] = update_shape[j]
        read = lax.GatherDimensionNumbers(
            offset_dims=tuple(dn.update_window_dims),
            collapsed_slice_dims=tuple(dn.inserted_window_dims),
            start_index_map=tuple(dn.scatter_dims_to_operand_dims),
            operand_batching_dims=tuple(dn.operand_batching_dims),
            start_indices_batching_dims=tuple(dn.scatter_indices_batching_dims),
        )
        what = f"`{primitive.name}` (an indexed update) writes"
        expected = _gather_axes(
            operand, indices, read, slice_sizes, update_shape, what, way_out
        )
        if isinstance(updates, NamedArray):
            for j, (a, b) in enumerate(zip(expected, updates.axes, strict=True)):
                if isinstance(a, Broadcast) or isinstance(b, Broadcast):
                    continue
                if a.key != b.key:
                    raise ValueError(
                        f"{what} updates with axes {labels(updates.axes)} where "
                        f"indexing the NamedArray with axes {labels(operand.axes)} "
                        f"gives {labels(expected)}: position {j} holds "
                        f"{b.label()!r} in one and {a.label()!r} in the other, and "
                        "quax_named never pairs two names by position. Lay the "
                        f"updates out by name, or {way_out}."
                    )
        elif any(n != 1 for n in update_shape) and uniform_value(updates) is None:
            raise ValueError(
                f"{what} an unnamed array of shape {update_shape} into a NamedArray "
                f"with axes {labels(operand.axes)}: quax_named never aligns an "
                f"array by position. Name the updates as {labels(expected)}, or "
                f"{way_out}."
            )
    except ValueError:
        if _allow(values):
            rule = quax.fallback_rule(primitive, values)
            return rule(values, dict(params, dimension_numbers=dn))
        raise
    result = bind(
        primitive,
        operand.array,
        indices.array if isinstance(indices, NamedArray) else indices,
        update_array,
        dimension_numbers=dn,
        **params,
    )
    return make(result, operand.axes, _allow(values))


for _p in _SCATTERS:
    quax.register_elementwise([_p])(_scatter)
