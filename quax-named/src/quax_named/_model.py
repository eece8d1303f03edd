"""The by-name functions a user writes named code with (reductions, softmax,
cumulative sums, contractions, `where`, the published `trace`) and `shard`,
which places a model's named arrays on devices by their names.

They are model-level: built on the value, its by-name methods and the mesh
mapping, called by user code and never by a rule."""

import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
from jax.sharding import Mesh

from ._axes import Axis, AxisLike, AxisSelection, labels
from ._kernels import call
from ._loops import run_scan
from ._sharding import MeshAxes, named_sharding
from ._value import NamedArray, align, check_named, labels_of, make, transpose


__all__ = [
    "argmax",
    "argmin",
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
    "scan",
    "shard",
    "softmax",
    "std",
    "sum",
    "trace",
    "var",
    "where",
]


def _positions(x: NamedArray, axis: AxisSelection) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(len(x.axes)))
    if isinstance(axis, (str, Axis)):
        return (x.index(axis),)
    return tuple(x.index(a) for a in axis)


def _reduce(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def reduction(x: NamedArray, axis: AxisSelection = None, **kwargs: Any) -> Any:
        x = check_named(x, name)
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
        x = check_named(x, name)
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
                    f"one operand and {n} in another ({labels_of(arrays)})."
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
    arrays = tuple(check_named(x, "dot") for x in arrays)
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
    arrays = tuple(check_named(x, "einsum") for x in arrays)
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
    array = check_named(array, "trace")
    i, j = array.index(axis1), array.index(axis2)
    if i == j:
        raise ValueError("Cannot trace along the same named axis.")
    inner = call(jnp.trace, array.array, offset=offset, axis1=i, axis2=j, dtype=dtype)
    axes = [a for k, a in enumerate(array.axes) if k not in (i, j)]
    return make(inner, axes, array.allow_materialise)


def shard(
    tree: Any, mesh: Mesh | None = None, mapping: Mapping[str, MeshAxes] | None = None
) -> Any:
    """Place every `NamedArray` in `tree` on the devices by its names: `device_put`
    outside `jit`, `with_sharding_constraint` inside it. Other leaves are unchanged.

    **Arguments:**

    - `tree`: any pytree.
    - `mesh`, `mapping`: default to those of the active [`quax_named.axis_mapping`][].

    **Returns:**

    `tree`, with each `NamedArray`'s array sharded.
    """

    def place(x: Any) -> Any:
        if not isinstance(x, NamedArray):
            return x
        sharding = named_sharding(x, mesh, mapping)
        if isinstance(x.array, jax.core.Tracer):
            array = jax.lax.with_sharding_constraint(x.array, sharding)
        else:
            array = jax.device_put(x.array, sharding)
        return NamedArray(array, x.axes, x.allow_materialise)

    return jax.tree.map(place, tree, is_leaf=lambda x: isinstance(x, NamedArray))


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    axis: AxisLike,
    *,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> tuple[Any, Any]:
    """`jax.lax.scan` along a named axis: `scan(f, init, xs, axis="seq")`.

    Every `NamedArray` in `xs` is sliced along `axis`, wherever it is stored, and
    `f` receives each slice with the other names; plain arrays in `xs` are sliced
    along their leading axis (of the same size). `f(carry, x)` returns `(carry,
    y)`: the carry keeps its type and axes from step to step (a carry returned
    with its axes in another order is laid back out by name), and each
    `NamedArray` in `y` is stacked with `axis` first, under its name, while plain
    outputs stay plain, stacked along a leading unnamed axis.

    `f` runs on `NamedArray`s, outside `quax.quaxify`: write it with the
    by-name functions and operators, or pass `quax.quaxify(g)` to run positional
    code `g` on the slices.

    **Arguments:**

    - `f`: `(carry, x) -> (carry, y)`, on pytrees.
    - `init`: the initial carry (any pytree).
    - `xs`: a pytree of `NamedArray`s holding `axis` (and plain arrays).
    - `axis`: the axis to scan along (name or `Axis`).
    - `reverse`, `unroll`: as for `jax.lax.scan`.

    **Returns:**

    `(carry, ys)`: the final carry, and the stacked outputs.
    """
    is_named = lambda x: isinstance(x, NamedArray)
    leaves, treedef = jax.tree.flatten(xs, is_leaf=is_named)
    front = []
    for leaf in leaves:
        if isinstance(leaf, NamedArray):
            leaf = check_named(leaf, "scan")
            leaf.index(axis)  # a ValueError naming the axes when it is missing
            leaf = transpose(leaf, (axis, ...))
        front.append(leaf)
    named = [x for x in front if isinstance(x, NamedArray)]
    if not named:
        raise ValueError(
            f"quax_named.scan scans along the named axis {axis!r}, and `xs` holds no "
            "NamedArray: use `jax.lax.scan` for plain arrays."
        )
    length = named[0].sizes[named[0].axes[0].key]
    init_leaves, init_def = jax.tree.flatten(init, is_leaf=is_named)

    def body(c: list[Any], slices: list[Any]) -> tuple[list[Any], list[Any]]:
        carry = jax.tree.unflatten(init_def, c)
        carry, y = f(carry, jax.tree.unflatten(treedef, slices))
        new, new_def = jax.tree.flatten(carry, is_leaf=is_named)
        if new_def != init_def:
            raise ValueError(
                "quax_named.scan: `f` returns a carry of another structure than "
                f"`init`'s ({new_def} against {init_def})."
            )
        ys, ys_def[0] = jax.tree.flatten(y, is_leaf=is_named)
        return new, ys

    ys_def: list[Any] = [None]
    carry, ys = run_scan(
        body,
        init_leaves,
        front,
        length=length,
        reverse=reverse,
        unroll=unroll,
        fn="quax_named.scan",
    )
    return jax.tree.unflatten(init_def, carry), jax.tree.unflatten(ys_def[0], ys)
