"""Operations by name: reductions, contractions, renaming, transposing, indexing,
arithmetic aligned by name, the published `trace`."""

import operator
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._named import Axis, Broadcast, NamedArray, labels
from ._rules import _relayout, call, make


__all__ = [
    "align",
    "argmax",
    "argmin",
    "broadcast_to",
    "cumprod",
    "cumsum",
    "dot",
    "einsum",
    "log_softmax",
    "logsumexp",
    "max",
    "mean",
    "min",
    "prod",
    "rename",
    "softmax",
    "std",
    "sum",
    "trace",
    "transpose",
    "var",
    "where",
]

AxisLike = Axis | str
AxisSelection = AxisLike | Sequence[AxisLike] | None


def _labels_of(arrays: Sequence[Any]) -> str:
    return ", ".join(labels(x.axes) for x in arrays if isinstance(x, NamedArray))


def _check(x: Any, fn: str) -> NamedArray:
    """`x` if it is a `NamedArray` whose array has one axis per name (which
    `NamedArray.aval` checks: `jax.vmap` over a `NamedArray` breaks it)."""
    if not isinstance(x, NamedArray):
        inside = (
            " Inside `quax.quaxify` positional code sees plain arrays (the rules "
            "keep the names): call the by-name functions outside it, or run "
            "positional code over named axes with `quax_named.nmap`."
            if isinstance(x, jax.core.Tracer)
            else ""
        )
        raise TypeError(
            f"quax_named.{fn} needs a NamedArray, got {type(x).__name__}.{inside}"
        )
    x.aval()
    return x


def _positions(x: NamedArray, axis: AxisSelection) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(len(x.axes)))
    if isinstance(axis, (str, Axis)):
        return (x.index(axis),)
    return tuple(x.index(a) for a in axis)


def _reduce(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def reduction(x: NamedArray, axis: AxisSelection = None, **kwargs: Any) -> Any:
        x = _check(x, name)
        positions = _positions(x, axis)
        result = call(fn, x.array, axis=positions, **kwargs)
        kept = [a for i, a in enumerate(x.axes) if i not in positions]
        return make(result, kept, x.allow_materialise)

    reduction.__name__ = reduction.__qualname__ = name
    reduction.__doc__ = f"""`jnp.{name}` over named axes.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axis`: an axis (name or `Axis`), a sequence of them, or `None` for all.
    - `**kwargs`: passed to `jnp.{name}` (e.g. `where`, `dtype`).

    **Returns:**

    A `NamedArray` without the reduced axes (a plain scalar when none is left).
    """
    return reduction


sum = _reduce(jnp.sum, "sum")
mean = _reduce(jnp.mean, "mean")
max = _reduce(jnp.max, "max")
min = _reduce(jnp.min, "min")
prod = _reduce(jnp.prod, "prod")
var = _reduce(jnp.var, "var")
std = _reduce(jnp.std, "std")
logsumexp = _reduce(jax.nn.logsumexp, "logsumexp")


def _along(fn: Callable[..., Any], name: str, keeps: bool) -> Callable[..., Any]:
    def along(x: NamedArray, axis: AxisLike, **kwargs: Any) -> Any:
        x = _check(x, name)
        i = x.index(axis)
        result = call(fn, x.array, axis=i, **kwargs)
        axes = x.axes if keeps else x.axes[:i] + x.axes[i + 1 :]
        return make(result, axes, x.allow_materialise)

    along.__name__ = along.__qualname__ = name
    along.__doc__ = f"""`{fn.__module__}.{name}` along one named axis.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axis`: the axis (name or `Axis`).

    **Returns:**

    A `NamedArray` {"with the same axes" if keeps else "without `axis`"}.
    """
    return along


argmax = _along(jnp.argmax, "argmax", keeps=False)
argmin = _along(jnp.argmin, "argmin", keeps=False)
softmax = _along(jax.nn.softmax, "softmax", keeps=True)
log_softmax = _along(jax.nn.log_softmax, "log_softmax", keeps=True)
cumsum = _along(jnp.cumsum, "cumsum", keeps=True)
cumprod = _along(jnp.cumprod, "cumprod", keeps=True)


def rename(x: NamedArray, mapping: Mapping[AxisLike, AxisLike]) -> NamedArray:
    """Rename axes: `rename(x, {"feature": "hidden"})`. The array is unchanged.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `mapping`: old axis (name or `Axis`) -> new axis (name or `Axis`).

    **Returns:**

    A `NamedArray` with the same array and the new axes.
    """
    x = _check(x, "rename")
    axes = list(x.axes)
    for old, new in mapping.items():
        i = x.index(old)
        axes[i] = Axis(new, axes[i].size) if isinstance(new, str) else new
    return NamedArray(x.array, tuple(axes), x.allow_materialise)


def transpose(x: NamedArray, order: Sequence[AxisLike | Any]) -> NamedArray:
    """Lay `x` out in the order of `order` (names or `Axis`es; one `...` stands for
    the axes not listed, in their current order). By-name operations never need it:
    it only changes the storage order, which positional code sees. Under `jit`, XLA
    fuses the transposition into its consumers rather than copying.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `order`: the new order.

    **Returns:**

    A `NamedArray` with the same axes in the new order.
    """
    x = _check(x, "transpose")
    listed = [x.index(a) for a in order if a is not Ellipsis]
    if len(set(listed)) != len(listed):
        raise ValueError(f"transpose lists an axis twice: {order!r}.")
    rest = [i for i in range(len(x.axes)) if i not in listed]
    if Ellipsis in order:
        k = list(order).index(Ellipsis)
        permutation = listed[:k] + rest + listed[k:]
    elif rest:
        raise ValueError(
            f"transpose to {tuple(order)!r} omits axes "
            f"{labels([x.axes[i] for i in rest])} of {labels(x.axes)}; add them "
            "or `...`."
        )
    else:
        permutation = listed
    if permutation == list(range(len(x.axes))):
        return x
    array = call(jax.lax.transpose, x.array, permutation)
    return make(array, [x.axes[i] for i in permutation], x.allow_materialise)


def align(*arrays: Any) -> tuple[Any, ...]:
    """Lay out `NamedArray`s on the union of their axes (in order of first
    appearance), broadcasting the axes each lacks; plain scalars pass through.

    **Returns:**

    The arrays, all with the same axes in the same order.
    """
    axes: list[Axis] = []
    for x in arrays:
        if isinstance(x, NamedArray):
            for a in x.axes:
                if not isinstance(a, Broadcast) and a.key not in [b.key for b in axes]:
                    axes.append(a)
        elif np.ndim(x) != 0:
            raise ValueError(
                f"Cannot align an unnamed array of shape {np.shape(x)} with "
                "NamedArrays: wrap it as `NamedArray(array, axes)`."
            )
    sizes: dict[Any, int] = {}
    for x in arrays:
        if isinstance(x, NamedArray):
            for a, n in x.sizes.items():
                if isinstance(a, Broadcast):
                    continue
                if sizes.setdefault(a, n) != n:
                    shown = a if isinstance(a, str) else a.label()
                    raise ValueError(
                        f"Axis {shown!r} has size {sizes[a]} and {n} in the arrays "
                        f"being aligned ({_labels_of(arrays)})."
                    )
    shape = tuple(sizes[a.key] for a in axes)
    out = []
    for x in arrays:
        if isinstance(x, NamedArray):
            array = _relayout(x, axes, shape) if x.axes != tuple(axes) else x.array
            out.append(NamedArray(array, tuple(axes), x.allow_materialise))
        else:
            out.append(x)
    return tuple(out)


def where(condition: Any, x: Any, y: Any) -> Any:
    """`jnp.where(condition, x, y)` aligned and broadcast by name.

    **Arguments:**

    - `condition`, `x`, `y`: `NamedArray`s or scalars (at least one `NamedArray`).

    **Returns:**

    A `NamedArray` over the union of their axes.
    """
    condition, x, y = align(condition, x, y)
    arrays = [v.array if isinstance(v, NamedArray) else v for v in (condition, x, y)]
    first = next(v for v in (condition, x, y) if isinstance(v, NamedArray))
    return make(call(jnp.where, *arrays), first.axes, first.allow_materialise)


def broadcast_to(
    x: NamedArray, axes: Sequence[AxisLike], sizes: Mapping[Any, int] | None = None
) -> NamedArray:
    """`x` laid out on `axes` (which must include its own), broadcasting the new ones.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axes`: the result's axes, in order. New axes need a size: from the `Axis`,
        or from `sizes`.
    - `sizes`: axis name -> size, for new axes given without one.

    **Returns:**

    A `NamedArray` with axes `axes`.
    """
    x = _check(x, "broadcast_to")
    out = [Axis(a) if isinstance(a, str) else a for a in axes]
    missing = [a for a in x.axes if a.key not in [b.key for b in out]]
    if missing:
        raise ValueError(
            f"broadcast_to {labels(out)} would drop axes {labels(missing)}."
        )
    have = x.sizes
    shape = []
    for a in out:
        n = have.get(a.key, a.size if a.size is not None else (sizes or {}).get(a.key))
        if n is None:
            raise ValueError(f"broadcast_to needs a size for new axis {a.label()!r}.")
        shape.append(n)
    return NamedArray(_relayout(x, out, tuple(shape)), tuple(out), x.allow_materialise)


def _letters(arrays: Sequence[NamedArray]) -> dict[Any, str]:
    letters: dict[Any, str] = {}
    for x in arrays:
        for a in x.axes:
            if a.key not in letters:
                letters[a.key] = string.ascii_letters[len(letters)]
    return letters


def _check_sizes(arrays: Sequence[NamedArray], fn: str) -> dict[Any, Axis]:
    sizes: dict[Any, int] = {}
    axes: dict[Any, Axis] = {}
    for x in arrays:
        for a, n in zip(x.axes, x.aval().shape, strict=True):
            if sizes.setdefault(a.key, n) != n:
                raise ValueError(
                    f"quax_named.{fn}: axis {a.label()!r} has size {sizes[a.key]} in "
                    f"one operand and {n} in another ({_labels_of(arrays)})."
                )
            axes.setdefault(a.key, a)
    return axes


def dot(*arrays: NamedArray, axis: AxisSelection, **kwargs: Any) -> Any:
    """Contract `arrays` over `axis` by name: axes shared but not contracted are
    batch axes, the others are kept (haliax's `dot`).

    **Arguments:**

    - `arrays`: `NamedArray`s.
    - `axis`: the axis or axes to contract (names or `Axis`es); `None` contracts
        every axis.
    - `**kwargs`: passed to `jnp.einsum` (`precision`, `preferred_element_type`).

    **Returns:**

    A `NamedArray` over the remaining axes, in order of first appearance (a plain
    scalar when none is left).
    """
    arrays = tuple(_check(x, "dot") for x in arrays)
    axes = _check_sizes(arrays, "dot")
    if axis is None:
        contracted = set(axes)
    else:
        selection = [axis] if isinstance(axis, (str, Axis)) else list(axis)
        contracted = {a if isinstance(a, str) else a.key for a in selection}
        for key in contracted:
            if key not in axes:
                shown = key if isinstance(key, str) else key.label()
                raise ValueError(
                    f"quax_named.dot: axis {shown!r} to contract is in none of "
                    f"{', '.join(labels(x.axes) for x in arrays)}."
                )
    letters = _letters(arrays)
    out = [a for k, a in axes.items() if k not in contracted]
    spec = ",".join("".join(letters[a.key] for a in x.axes) for x in arrays)
    spec += "->" + "".join(letters[a.key] for a in out)
    result = call(jnp.einsum, spec, *(x.array for x in arrays), **kwargs)
    return make(result, out, all(x.allow_materialise for x in arrays))


def einsum(spec: str, *arrays: NamedArray, **kwargs: Any) -> Any:
    """`jnp.einsum` with axis names: `einsum("batch feature, feature hidden -> batch
    hidden", x, w)`. Each operand lists its axes by name (in any order: operands are
    matched by name, not by position); the output lists the axes to keep, in order.

    **Arguments:**

    - `spec`: operands' axis names separated by `,`, then `->` and the output's.
    - `arrays`: the `NamedArray`s.
    - `**kwargs`: passed to `jnp.einsum`.

    **Returns:**

    A `NamedArray` with the output's axes (a plain scalar for `-> `).
    """
    arrays = tuple(_check(x, "einsum") for x in arrays)
    if "->" not in spec:
        raise ValueError(f"quax_named.einsum needs an explicit output: {spec!r}.")
    inputs, output = spec.split("->")
    operands = [part.split() for part in inputs.split(",")]
    if len(operands) != len(arrays):
        raise ValueError(
            f"quax_named.einsum: {spec!r} has {len(operands)} operands, got "
            f"{len(arrays)} arrays."
        )
    for names, x in zip(operands, arrays, strict=True):
        if sorted(names) != sorted(str(n) for n in x.names) or None in x.names:
            raise ValueError(
                f"quax_named.einsum: operand {' '.join(names)!r} of {spec!r} does not "
                f"name the axes {labels(x.axes)} of its array."
            )
    axes = _check_sizes(arrays, "einsum")
    out_names = output.split()
    for name in out_names:
        if name not in axes:
            raise ValueError(
                f"quax_named.einsum: output axis {name!r} is in no operand."
            )
    letters = _letters(arrays)
    subs = ",".join("".join(letters[a.key] for a in x.axes) for x in arrays)
    subs += "->" + "".join(letters[n] for n in out_names)
    result = call(jnp.einsum, subs, *(x.array for x in arrays), **kwargs)
    return make(
        result, [axes[n] for n in out_names], all(x.allow_materialise for x in arrays)
    )


def trace(
    array: NamedArray,
    *,
    offset: int = 0,
    axis1: AxisLike,
    axis2: AxisLike,
    dtype: Any = None,
) -> Any:
    """As `jax.numpy.trace`, along two axes given by name (the published API).

    **Arguments:**

    - `array`: a `NamedArray`.
    - `offset`: the diagonal's offset, positive or negative.
    - `axis1`, `axis2`: the two axes (names or `Axis`es).
    - `dtype`: the accumulator's and result's dtype.

    **Returns:**

    A `NamedArray` without `axis1` and `axis2` (a plain scalar when none is left).
    """
    array = _check(array, "trace")
    i, j = array.index(axis1), array.index(axis2)
    if i == j:
        raise ValueError("Cannot trace along the same named axis.")
    inner = call(jnp.trace, array.array, offset=offset, axis1=i, axis2=j, dtype=dtype)
    axes = [a for k, a in enumerate(array.axes) if k not in (i, j)]
    return make(inner, axes, array.allow_materialise)


# Indexing ---------------------------------------------------------------------------


def _index(
    x: NamedArray, selection: Any
) -> tuple[tuple[Any, ...], list[Axis], list[int]]:
    """The positional index, the result's axes and its shape for a by-name
    `selection`."""
    if not isinstance(selection, Mapping):
        raise TypeError(
            "NamedArray is indexed by name: x[{'batch': 0, 'seq': slice(0, 4)}], not "
            f"by position (got {selection!r}). Positional code runs through "
            "quax.quaxify."
        )
    index: list[Any] = [slice(None)] * len(x.axes)
    for key, item in selection.items():
        index[x.index(key)] = item
    shape = x.aval().shape
    axes: list[Axis] = []
    sizes: list[int] = []
    for i, (axis, item) in enumerate(zip(x.axes, index, strict=True)):
        if isinstance(item, slice):
            n = len(range(*item.indices(shape[i])))
            axes.append(axis.resized(n))
            sizes.append(n)
        elif isinstance(item, NamedArray):
            axes.extend(item.axes)
            sizes.extend(item.aval().shape)
        elif np.ndim(item) != 0:
            raise TypeError(
                f"Index for axis {axis.label()!r} is an unnamed array of shape "
                f"{np.shape(item)}: wrap it as a NamedArray to name the result's axes."
            )
    arrays = [item for item in index if isinstance(item, NamedArray)]
    if len(arrays) > 1:
        raise TypeError("NamedArray indexing takes at most one NamedArray index.")
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise ValueError(f"Indexing would repeat an axis: {labels(axes)}.")
    if arrays:
        # A single array index keeps its axes where the indexed axis was.
        k = next(i for i, item in enumerate(index) if isinstance(item, NamedArray))
        if any(not isinstance(item, slice) for i, item in enumerate(index) if i != k):
            raise TypeError(
                "A NamedArray index combines only with slices in NamedArray indexing."
            )
    positional = tuple(
        item.array if isinstance(item, NamedArray) else item for item in index
    )
    return positional, axes, sizes


def getitem(x: NamedArray, selection: Any) -> Any:
    index, axes, _ = _index(x, selection)
    result = call(operator.getitem, x.array, index)
    return make(result, axes, x.allow_materialise)


class _At:
    """`x.at[{"batch": 0}].set(v)`: functional updates by name."""

    def __init__(self, x: NamedArray, selection: Any):
        self.x, self.selection = x, selection
        self.index, self.axes, self.shape = _index(x, selection)

    def _update(self, method: str, value: Any, **kwargs: Any) -> NamedArray:
        if isinstance(value, NamedArray):
            sizes = {a.key: n for a, n in zip(self.axes, self.shape, strict=True)}
            value = broadcast_to(value, self.axes, sizes).array
        elif np.ndim(value) != 0:
            raise TypeError(
                f"`.at[...].{method}` takes a scalar or a NamedArray, got an unnamed "
                f"array of shape {np.shape(value)}."
            )

        def update(array: Any, value: Any) -> Any:
            return getattr(array.at[self.index], method)(value, **kwargs)

        result = call(update, self.x.array, value)
        return NamedArray(result, self.x.axes, self.x.allow_materialise)

    def set(self, value: Any, **kwargs: Any) -> NamedArray:
        return self._update("set", value, **kwargs)

    def add(self, value: Any, **kwargs: Any) -> NamedArray:
        return self._update("add", value, **kwargs)

    def multiply(self, value: Any, **kwargs: Any) -> NamedArray:
        return self._update("multiply", value, **kwargs)

    def min(self, value: Any, **kwargs: Any) -> NamedArray:
        return self._update("min", value, **kwargs)

    def max(self, value: Any, **kwargs: Any) -> NamedArray:
        return self._update("max", value, **kwargs)

    def get(self, **kwargs: Any) -> Any:
        result = call(lambda a: a.at[self.index].get(**kwargs), self.x.array)
        return make(result, self.axes, self.x.allow_materialise)


class _AtIndexer:
    def __init__(self, x: NamedArray):
        self.x = x

    def __getitem__(self, selection: Any) -> _At:
        return _At(self.x, selection)


def binary(op: Callable[[Any, Any], Any], x: Any, y: Any) -> Any:
    """`op(x, y)` aligned and broadcast by name."""
    x, y = align(x, y)
    arrays = [v.array if isinstance(v, NamedArray) else v for v in (x, y)]
    named = x if isinstance(x, NamedArray) else y
    result = call(op, *arrays)
    return make(result, named.axes, named.allow_materialise)
