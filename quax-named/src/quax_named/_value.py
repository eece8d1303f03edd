"""The value type: `NamedArray`, an array whose every axis carries an `Axis`,
and what its own methods do by name: operators aligned and broadcast by name,
renaming, transposing, indexing and `.at` updates, and `make`, which builds a
rule's or an operation's result (sharded by its names under
`quax_named.axis_mapping`)."""

import functools as ft
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import numpy as np
import quax

from ._axes import Axis, AxisLike, Broadcast, as_axes, intern_axes, labels
from ._kernels import call, relayout
from ._sharding import constrain


__all__ = [
    "NamedArray",
    "NamedMaterialisationError",
    "align",
    "binary",
    "broadcast_to",
    "check_named",
    "describe_argument",
    "getitem",
    "labels_of",
    "like",
    "make",
    "positions",
    "rename",
    "transpose",
]


class NamedMaterialisationError(quax.MaterialisationError):
    """A `NamedArray` with `allow_materialise=False` met an operation that has no rule
    keeping its axis names. A [`quax.MaterialisationError`][] (a `RuntimeError`):
    its message starts with "Refusing to materialise"."""


def _shape(array: Any) -> tuple[int, ...]:
    if quax.is_value(array):
        return tuple(array.aval().shape)
    return tuple(jax.typeof(array).shape)


def _axes_field(axes: Any) -> tuple[Axis, ...]:
    """`NamedArray`'s `axes`, checked, as the one tuple of equal axes (see
    `intern_axes`)."""
    return intern_axes(as_axes(axes))


@ft.cache
def _quaxified(op: Callable[[Any, Any], Any]) -> Any:
    """`quax.quaxify(op)`, made once per operator."""
    return quax.quaxify(op)


class NamedArray(quax.OperatorMethods, quax.BitwiseOperatorMethods, quax.GuardedValue):
    """An array with each axis bound to an [`quax_named.Axis`][].

    Inside [`quax.quaxify`][], unmodified positional code runs on it with the names
    checked: elementwise operations align and broadcast by name (never by position),
    `@`/`dot_general` contracts only matching axes, reductions drop the axes they
    reduce. It follows the core's materialisation policy ([`quax.GuardedValue`][]):
    an operation without a rule that keeps the names raises a
    [`quax_named.NamedMaterialisationError`][] naming it, unless
    `allow_materialise=True`.

    **Fields:**

    - `array`: the wrapped array (a JAX array, or another quax value).
    - `axes`: one `Axis` per axis of `array` (static).
    - `allow_materialise`: whether an operation without a named rule may drop the
        names and run on the plain array (static).
    """

    array: Any
    axes: tuple[Axis, ...] = eqx.field(static=True, converter=_axes_field)

    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        NamedMaterialisationError
    )
    linear_in_leaves: ClassVar[bool] = True

    def __init__(
        self,
        array: Any,
        axes: Sequence[Axis | str],
        allow_materialise: bool = False,
    ):
        """**Arguments:**

        - `array`: the wrapped array (a JAX or NumPy array, or another quax value).
        - `axes`: one `Axis` or name per axis of `array`, in storage order.
        - `allow_materialise`: whether an operation without a named rule may drop
            the names and run on the plain array (the published quax's positional
            third argument).
        """
        self.array = array
        self.axes = axes  # pyright: ignore[reportAttributeAccessIssue]
        self.allow_materialise = allow_materialise

    def __check_init__(self) -> None:
        if not isinstance(self.allow_materialise, bool):
            raise ValueError(
                "`allow_materialise` of a `NamedArray` must be a bool, got "
                f"{type(self.allow_materialise).__name__} {self.allow_materialise!r}."
            )
        keys = [a.key for a in self.axes]
        repeated = [a for i, a in enumerate(self.axes) if a.key in keys[:i]]
        if repeated:
            raise ValueError(
                "Axis names for `NamedArray` must be unique; repeated: "
                f"{labels(repeated)} in {labels(self.axes)}. Give each axis its own "
                "name (a square matrix over one space is, say, ('in', 'out'))."
            )
        try:
            shape = _shape(self.array)
        except TypeError:
            raise ValueError(
                "`array` of a `NamedArray` must be an array (JAX or NumPy) or a quax "
                f"value, got {type(self.array).__name__}. Convert it with "
                "`jnp.asarray` first."
            ) from None
        if len(shape) != len(self.axes):
            # Past the constructor (`jax.vmap`'s view, a tree map), quaxify re-runs
            # this check before the aval is read: the way out is the aval's.
            raise ValueError(
                "`NamedArray` must have every axis be named: got "
                f"{len(self.axes)} axes {labels(self.axes)} for an array of shape "
                f"{shape}. Where JAX built it past the constructor: "
                f"{_names_mismatch(self.axes, shape)}"
            )
        for size, axis in zip(shape, self.axes, strict=True):
            if axis.size is not None and size != axis.size:
                raise ValueError(
                    f"Mismatched axis size for axis {axis}: the array has size {size} "
                    f"along it (array shape {shape}, axes {labels(self.axes)})."
                )

    @classmethod
    def _unchecked(
        cls, array: Any, axes: tuple[Axis, ...], allow_materialise: bool
    ) -> "NamedArray":
        """A `NamedArray` whose axes are known to fit (a rule's result): built as
        equinox unflattens a module, without the converter and checks of
        `__init__`, which would cost more than the rule itself."""
        self = object.__new__(cls)
        object.__setattr__(self, "array", array)
        object.__setattr__(self, "axes", intern_axes(axes))
        object.__setattr__(self, "allow_materialise", allow_materialise)
        return self

    # The published API ---------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:  # pyright: ignore[reportIncompatibleVariableOverride]
        if self.allow_materialise:
            return super().shape
        raise NamedMaterialisationError(
            "Refusing to access the shape of a `NamedArray` with "
            "`allow_materialise=False`: positions are not names. Use `.sizes` "
            "(a dict from axis name to size) or `.axes`, or call "
            "`.enable_materialise()`."
        )

    def aval(self) -> jax.core.ShapedArray:
        array = self.array
        aval: Any
        if isinstance(array, jax.core.Tracer):
            # `jax.typeof(array)` without its lookup: quax reads the aval of every
            # value a rule returns.
            aval = array.aval
        elif quax.is_value(array):
            aval = array.aval()
        else:
            aval = jax.typeof(array)
        if len(aval.shape) != len(self.axes):
            raise ValueError(_names_mismatch(self.axes, aval.shape))
        return aval  # pyright: ignore[reportReturnType]

    def dense(self) -> Any:
        if quax.is_value(self.array):
            return self.array.materialise()
        return self.array

    def refusal_reason(self) -> str:
        return (
            f"quax_named keeps its axis names {labels(self.axes)}, which a plain "
            "array would drop"
        )

    def way_out(self, primitive: Any = None) -> str:
        if primitive is None:
            return (
                "Pass allow_materialise=True or call `.enable_materialise()` to drop "
                "the names, or use `.array`."
            )
        return (
            "Ways out: run the positional code through `quax_named.nmap` over the "
            "axes it needs, use the by-name functions of quax_named, or pass "
            "allow_materialise=True / call `.enable_materialise()` to drop the names."
        )

    # Names ---------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str | None, ...]:
        """The axis names in storage order (`None` for an anonymous axis)."""
        return tuple(a.name for a in self.axes)

    @property
    def sizes(self) -> dict[Any, int]:
        """Each axis's size, keyed by its name (by the `Axis` itself if anonymous)."""
        return dict(zip((a.key for a in self.axes), self.aval().shape, strict=True))

    def index(self, axis: Axis | str) -> int:
        """The position of `axis` (an `Axis` or a name) among this array's axes.

        **Arguments:**

        - `axis`: the axis, or its name.

        **Returns:**

        Its position. Raises a `ValueError` naming the axes if it is missing, and
        if `axis` is an `Axis` with a size that this array's axis does not have
        (every array must have an `Axis`'s size along it); a `TypeError` if
        `axis` is neither a name nor an `Axis` (an index or an array: axes are
        named, not numbered).
        """
        if not isinstance(axis, str | Axis):
            raise TypeError(
                f"An axis of a NamedArray is named: a name (a string) or an "
                f"`Axis`, got {describe_argument(axis)}. This array's axes are "
                f"{labels(self.axes)}."
            )
        key = axis if isinstance(axis, str) else axis.key
        for i, a in enumerate(self.axes):
            if a.key == key:
                if isinstance(axis, Axis) and axis.size is not None:
                    size = _shape(self.array)[i]
                    if size != axis.size:
                        raise ValueError(
                            f"{axis!r} has size {axis.size}, but this NamedArray "
                            f"has size {size} along {a.label()!r} (axes "
                            f"{labels(self.axes)}): give the axis's name, or its "
                            "size."
                        )
                return i
        shown = axis if isinstance(axis, str) else axis.label()
        raise ValueError(
            f"Axis {shown!r} is not an axis of this NamedArray; its axes are "
            f"{labels(self.axes)}."
        )

    def axis(self, axis: Axis | str) -> Axis:
        """The `Axis` object for `axis` (an `Axis` or a name)."""
        return self.axes[self.index(axis)]

    # By name -------------------------------------------------------------------------

    def rename(self, mapping: Any) -> "NamedArray":
        """See [`quax_named.rename`][]."""
        return rename(self, mapping)

    def transpose(self, *order: Any) -> "NamedArray":
        """See [`quax_named.transpose`][]: `x.transpose("feature", "batch")`."""
        return transpose(self, order)

    def __getitem__(self, selection: Any) -> Any:
        """Index by name: `x[{"batch": 0, "seq": slice(0, 4)}]`."""
        return getitem(self, selection)

    @property
    def at(self) -> Any:
        """Functional updates by name: `x.at[{"batch": 0}].set(v)` (also `add`,
        `multiply`, `min`, `max`, `get`)."""
        return _AtIndexer(self)

    def _binary(self, op: Any, other: Any, reverse: bool = False) -> Any:
        if isinstance(other, jax.core.Tracer):
            # A traced operand (inside `quax.quaxify` it may stand for a value: a
            # `NamedArray` whose names only the rules see) goes to the rules, which
            # this array joins as a constant of the trace (see `quax.quaxify`).
            return _quaxified(op)(*((other, self) if reverse else (self, other)))
        return binary(op, other, self) if reverse else binary(op, self, other)

    # NumPy arrays defer to these operators rather than broadcasting over the
    # object (`np.ones(3) + x` was an object array of `NamedArray`s).
    __array_ufunc__ = None

    def _binary_operator(
        self, op: Callable[[Any, Any], Any], other: Any, reflected: bool
    ) -> Any:
        """Python's binary operators (from `quax.OperatorMethods` and
        `quax.BitwiseOperatorMethods`): aligned and broadcast by name (see
        `binary`), or, with a traced operand, run by the rules (see `_binary`).
        `==` and `!=` are elementwise, as a JAX array's: `x == y` is an array of
        booleans (so, as a JAX array, a `NamedArray` is not hashable)."""
        return self._binary(op, other, reverse=reflected)

    __hash__ = None  # pyright: ignore[reportAssignmentType]

    def __matmul__(self, other: Any) -> Any:
        """`x @ y` as in positional code inside `quax.quaxify`: the contracted axes
        must be the same axis (`TypeError: Cannot contract mismatched
        dimensions`)."""
        return _quaxified(operator.matmul)(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return _quaxified(operator.matmul)(other, self)

    def __neg__(self) -> Any:
        return NamedArray(
            call(operator.neg, self.array), self.axes, self.allow_materialise
        )

    def __repr__(self) -> str:
        parts = []
        for axis, size in zip(self.axes, self.aval().shape, strict=True):
            parts.append(f"{axis.label()}={size}")
        aval = self.aval()
        return f"NamedArray({aval.dtype}[{', '.join(parts)}])"


def _names_mismatch(axes: Sequence[Axis], shape: tuple[int, ...]) -> str:
    """Why a `NamedArray` whose array has another number of axes than it has names
    (a JAX transform mapped or sliced it by position) is refused, and the way out."""
    return (
        f"This NamedArray names {len(axes)} axes {labels(axes)} but "
        f"its array has shape {shape}: a JAX transform mapped or sliced "
        "its stored array by position (`jax.vmap` maps storage axis 0, or "
        "the one `in_axes` gives; `jax.lax.scan` and `jax.lax.map` slice "
        "axis 0), or a tree map stacked or sliced its leaves. quax_named "
        "refuses it: the names no longer match the array's axes. To run "
        "code over some named axes, vectorised over the others, use "
        "`quax_named.nmap(fn, axes)`; to `jax.vmap` over a batch, map plain "
        "arrays and name them inside the mapped function "
        "(`NamedArray(a, axes)`), or call `jax.vmap` inside `quax.quaxify`, "
        "where it maps the array positional code sees and every name is "
        "kept. To scan, use `quax_named.scan(f, init, xs, axis=...)`, or "
        "call `jax.lax.scan` inside `quax.quaxify`, where each slice keeps "
        "the other names."
    )


def make(array: Any, axes: Sequence[Axis], allow_materialise: bool = False) -> Any:
    """The result of a rule: a `NamedArray`, or the plain array when no axis is left
    (a full reduction is a plain scalar, so a loss can be differentiated)."""
    if not axes:
        return array
    return NamedArray._unchecked(constrain(array, axes), tuple(axes), allow_materialise)


def positions(x: NamedArray, axis: Any) -> tuple[int, ...]:
    """The storage positions of `axis` in `x`: one axis (a name or an `Axis`), a
    sequence of them, or `None` for all."""
    if axis is None:
        return tuple(range(len(x.axes)))
    if isinstance(axis, (str, Axis)):
        return (x.index(axis),)
    return tuple(x.index(a) for a in axis)


def like(x: NamedArray, result: Any) -> Any:
    """`result`, an array of `x`'s rank, named with `x`'s axes resized to its shape
    (a padded, sliced, split or transformed `x`: each axis keeps its name)."""
    shape = result.aval().shape if quax.is_value(result) else jax.typeof(result).shape
    out = [a.resized(n) for a, n in zip(x.axes, shape, strict=True)]
    return make(result, out, x.allow_materialise)


def labels_of(arrays: Sequence[Any]) -> str:
    return ", ".join(labels(x.axes) for x in arrays if isinstance(x, NamedArray))


def check_named(x: Any, fn: str) -> NamedArray:
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


# Renaming, transposing, aligning -----------------------------------------------


def rename(x: NamedArray, mapping: Mapping[AxisLike, AxisLike]) -> NamedArray:
    """Rename axes: `rename(x, {"feature": "hidden"})`. The array is unchanged.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `mapping`: old axis (name or `Axis`) -> new axis (name or `Axis`).

    **Returns:**

    A `NamedArray` with the same array and the new axes.
    """
    x = check_named(x, "rename")
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
    x = check_named(x, "transpose")
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
                        f"being aligned ({labels_of(arrays)})."
                    )
    shape = tuple(sizes[a.key] for a in axes)
    out = []
    for x in arrays:
        if isinstance(x, NamedArray):
            array = relayout(x, axes, shape) if x.axes != tuple(axes) else x.array
            out.append(NamedArray(array, tuple(axes), x.allow_materialise))
        else:
            out.append(x)
    return tuple(out)


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
    x = check_named(x, "broadcast_to")
    out = [Axis(a) if isinstance(a, str) else a for a in axes]
    missing = [a for a in x.axes if a.key not in [b.key for b in out]]
    if missing:
        raise ValueError(
            f"broadcast_to {labels(out)} would drop axes {labels(missing)}."
        )
    have = x.sizes
    keys = [a.key for a in out]
    for name, n in (sizes or {}).items():
        key = name.key if isinstance(name, Axis) else name
        if key not in keys:
            raise ValueError(
                f"broadcast_to got a size for {name!r}, which is not among the axes "
                f"{labels(out)}: name it in `axes`, or leave it out of `sizes`."
            )
        if key in have and have[key] != n:
            raise ValueError(
                f"broadcast_to got size {n} for {name!r}, which `x` has with size "
                f"{have[key]} (axes {labels(x.axes)}): `sizes` gives the sizes of "
                "new axes; an axis of `x` keeps its size."
            )
    shape = []
    for a in out:
        n = have.get(a.key, a.size if a.size is not None else (sizes or {}).get(a.key))
        if n is None:
            raise ValueError(f"broadcast_to needs a size for new axis {a.label()!r}.")
        shape.append(n)
    return NamedArray(relayout(x, out, tuple(shape)), tuple(out), x.allow_materialise)


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


def describe_argument(x: Any) -> str:
    """How a message names an argument that is of the wrong kind: its type, and
    its shape or value."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"
