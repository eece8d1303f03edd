"""The by-name functions a user writes named code with (reductions, softmax,
cumulative sums, contractions, `where`, the published `trace`, `scan`, joining,
splitting and reshaping, `take`, `sort`, `roll`, `pad`) and `shard`, which places a
model's named arrays on devices by their names.

They are model-level: built on the value, its by-name methods and the mesh
mapping, called by user code and never by a rule."""

import re
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from ._axes import (
    Axis,
    AxisLike,
    AxisSelection,
    Flattened,
    as_axes,
    check_name,
    labels,
)
from ._kernels import call
from ._loops import run_scan
from ._sharding import MeshAxes, named_sharding
from ._value import (
    NamedArray,
    align,
    check_named,
    describe_argument,
    labels_of,
    like,
    make,
    positions,
    transpose,
)


__all__ = [
    "argmax",
    "argmin",
    "argsort",
    "concatenate",
    "cumprod",
    "cumsum",
    "dot",
    "einsum",
    "flatten_axes",
    "log_softmax",
    "logsumexp",
    "max",
    "mean",
    "min",
    "pad",
    "prod",
    "rearrange",
    "roll",
    "scan",
    "shard",
    "softmax",
    "sort",
    "split",
    "stack",
    "std",
    "sum",
    "take",
    "trace",
    "unflatten_axis",
    "var",
    "where",
]


def _reduce(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def reduction(x: NamedArray, axis: AxisSelection = None, **kwargs: Any) -> Any:
        x = check_named(x, name)
        reduced = positions(x, axis)
        result = call(fn, x.array, axis=reduced, **kwargs)
        kept = [a for i, a in enumerate(x.axes) if i not in reduced]
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


# Joining and splitting by name -----------------------------------------------------


def concatenate(arrays: Sequence[NamedArray], axis: AxisLike) -> Any:
    """`jnp.concatenate` along a named axis: the arrays are joined along `axis`, and
    laid out alike by name first (they must hold the same axes, of equal sizes but
    along `axis`).

    **Arguments:**

    - `arrays`: the `NamedArray`s, each holding `axis`.
    - `axis`: the axis to join along (name or `Axis`).

    **Returns:**

    A `NamedArray` with the first array's axes, `axis` of the summed size.
    """
    arrays = [check_named(x, "concatenate") for x in arrays]
    if not arrays:
        raise ValueError("quax_named.concatenate needs at least one array.")
    first = arrays[0]
    i = first.index(axis)
    joined = first.axes[i]
    others = {a.key: n for a, n in zip(first.axes, first.aval().shape, strict=True)}
    del others[joined.key]
    laid = []
    for x in arrays:
        x.index(axis)
        own = dict(x.sizes)
        del own[joined.key]
        if own != others:
            raise ValueError(
                "quax_named.concatenate joins arrays holding the same axes, of the "
                f"same sizes but along {joined.label()!r}: got {labels_of(arrays)} "
                "(sizes "
                + "; ".join(str(y.sizes) for y in arrays)
                + "). Broadcast or slice them first (`quax_named.broadcast_to`, "
                "indexing by name)."
            )
        laid.append(transpose(x, first.axes).array)
    result = call(jnp.concatenate, laid, axis=i)
    n = 0  # (`sum` is quax_named.sum here)
    for x in arrays:
        n += x.sizes[joined.key]
    axes = [*first.axes[:i], joined.resized(n), *first.axes[i + 1 :]]
    return make(result, axes, all(x.allow_materialise for x in arrays))


def stack(arrays: Sequence[NamedArray], axis: AxisLike) -> Any:
    """`jnp.stack` under a new named axis: the arrays are aligned by name (the axes
    one lacks are broadcast, as the `NamedArray` operators do) and stacked along a
    new first axis `axis`.

    **Arguments:**

    - `arrays`: the `NamedArray`s.
    - `axis`: the new axis (a name, or an `Axis`), held by none of them.

    **Returns:**

    A `NamedArray` with `axis` first (of size `len(arrays)`), then the union of the
    arrays' axes.
    """
    arrays = [check_named(x, "stack") for x in arrays]
    if not arrays:
        raise ValueError("quax_named.stack needs at least one array.")
    (new,) = as_axes([axis], "quax_named.stack's `axis`")
    aligned = align(*arrays)
    if new.key in [a.key for a in aligned[0].axes]:
        raise ValueError(
            f"quax_named.stack: the new axis {new.label()!r} is already an axis of "
            f"the arrays ({labels_of(arrays)}); name the new axis otherwise."
        )
    result = call(jnp.stack, [x.array for x in aligned], axis=0)
    axes = [new.resized(len(arrays)), *aligned[0].axes]
    if new.size is not None and new.size != len(arrays):
        raise ValueError(
            f"quax_named.stack: the new axis {new!r} has size {new.size}, and "
            f"{len(arrays)} arrays are stacked."
        )
    return make(result, axes, all(x.allow_materialise for x in arrays))


def split(x: NamedArray, axis: AxisLike, indices_or_sections: Any) -> list[Any]:
    """`jnp.split` along a named axis: each piece keeps the name, at its size.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axis`: the axis to split (name or `Axis`).
    - `indices_or_sections`: as for `jnp.split`: a number of equal pieces, or the
        indices along `axis` where the pieces start.

    **Returns:**

    A list of `NamedArray`s.
    """
    x = check_named(x, "split")
    pieces = call(jnp.split, x.array, indices_or_sections, axis=x.index(axis))
    return [like(x, piece) for piece in pieces]


# Reshaping by name ----------------------------------------------------------------


def _sizes_of(parts: Sequence[Axis], total: int, what: str) -> list[int]:
    """The sizes of `parts`, which split an axis of size `total`; at most one part
    may lack a size, which is then inferred."""
    missing = [a for a in parts if a.size is None]
    if len(missing) > 1:
        raise ValueError(
            f"{what}: parts {labels(missing)} have no size; give every part but "
            "one a size (`Axis(name, size)`, or a keyword of `rearrange`)."
        )
    known = 1
    for a in parts:
        known *= a.size if a.size is not None else 1
    if missing and (known == 0 or total % known):
        raise ValueError(
            f"{what}: an axis of size {total} cannot be split into parts "
            f"{labels(parts)} of known sizes multiplying to {known}."
        )
    sizes = [a.size if a.size is not None else total // known for a in parts]
    product = 1
    for n in sizes:
        product *= n
    if product != total:
        raise ValueError(
            f"{what}: the parts {labels(parts)} have sizes {sizes}, multiplying to "
            f"{product}, and the axis has size {total}."
        )
    return sizes


def flatten_axes(x: NamedArray, axes: Sequence[AxisLike], new: AxisLike) -> Any:
    """Merge named axes into one: `flatten_axes(x, ("seq", "embed"), "tokens")`.

    The axes are merged in the order given (the first varies slowest, as in a
    row-major reshape), where the first of them is stored.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axes`: the axes to merge (names or `Axis`es), at least one.
    - `new`: the merged axis (a name, or an `Axis`).

    **Returns:**

    A `NamedArray` with `new` in place of `axes`.
    """
    x = check_named(x, "flatten_axes")
    if isinstance(axes, (str, Axis)) or not axes:
        raise ValueError(
            "quax_named.flatten_axes merges a sequence of axes (at least one), got "
            f"{axes!r}."
        )
    positions = [x.index(a) for a in axes]
    if len(set(positions)) != len(positions):
        raise ValueError(f"quax_named.flatten_axes lists an axis twice: {axes!r}.")
    (merged,) = as_axes([new], "quax_named.flatten_axes's `new`")
    start = sorted(positions)[0]  # (`min` is quax_named.min here)
    order = [i for i in range(start) if i not in positions]
    order += positions
    order += [i for i in range(start, len(x.axes)) if i not in positions]
    laid = transpose(x, [x.axes[i] for i in order])
    shape = laid.aval().shape
    k = len(positions)
    size = 1
    for n in shape[start : start + k]:
        size *= n
    if merged.size is not None and merged.size != size:
        raise ValueError(
            f"quax_named.flatten_axes: the merged axis {merged!r} has size "
            f"{merged.size}, and the axes {labels([x.axes[i] for i in positions])} "
            f"multiply to {size}."
        )
    outer = [a.key for a in laid.axes[:start]] + [a.key for a in laid.axes[start + k :]]
    if merged.key in outer:
        raise ValueError(
            f"quax_named.flatten_axes: the merged axis {merged.label()!r} is already "
            f"an axis of {labels(x.axes)}."
        )
    result = call(jnp.reshape, laid.array, (*shape[:start], size, *shape[start + k :]))
    out = [*laid.axes[:start], merged.resized(size), *laid.axes[start + k :]]
    return make(result, out, x.allow_materialise)


def unflatten_axis(x: NamedArray, axis: AxisLike, parts: Sequence[AxisLike]) -> Any:
    """Split a named axis into several: `unflatten_axis(x, "embed",
    (Axis("heads", 4), Axis("head_dim", 16)))`. The first part varies slowest (a
    row-major reshape), as `flatten_axes` merges them.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axis`: the axis to split (name or `Axis`).
    - `parts`: the new axes, in order, with sizes multiplying to `axis`'s size; one
        of them may be given without a size (a name), which is then inferred.

    **Returns:**

    A `NamedArray` with `parts` in place of `axis`.
    """
    x = check_named(x, "unflatten_axis")
    i = x.index(axis)
    new = as_axes(parts, "quax_named.unflatten_axis's `parts`")
    shape = x.aval().shape
    sizes = _sizes_of(new, shape[i], "quax_named.unflatten_axis")
    out = [*x.axes[:i], *(a.resized(n) for a, n in zip(new, sizes, strict=True))]
    out += x.axes[i + 1 :]
    keys = [a.key for a in out]
    if len(set(keys)) != len(keys):
        raise ValueError(
            f"quax_named.unflatten_axis: splitting {x.axes[i].label()!r} of "
            f"{labels(x.axes)} into {labels(new)} would repeat an axis."
        )
    result = call(jnp.reshape, x.array, (*shape[:i], *sizes, *shape[i + 1 :]))
    return make(result, out, x.allow_materialise)


_TOKEN = re.compile(r"\(([^()]*)\)|\.\.\.|[^\s()]+")


def _parse_side(side: str, spec: str) -> list[Any]:
    """One side of a `rearrange` spec: a list of names, `...`, and groups
    `(name: part part)` or `(part part)` as `(name or None, [parts])`."""
    items: list[Any] = []
    rest = side
    for match in _TOKEN.finditer(side):
        rest = rest.replace(match.group(0), " ", 1)
        if match.group(1) is None:
            items.append(match.group(0))
            continue
        inner = match.group(1)
        name = None
        if ":" in inner:
            name, inner = (part.strip() for part in inner.split(":", 1))
        parts = inner.split()
        if not parts:
            raise ValueError(f"quax_named.rearrange: an empty group in {spec!r}.")
        items.append((name, parts))
    if rest.strip():
        raise ValueError(
            f"quax_named.rearrange cannot read {rest.strip()!r} in {spec!r}: write "
            "names, `...`, and groups `(a b)` or `(name: a b)`."
        )
    return items


def rearrange(x: NamedArray, spec: str, **sizes: int) -> Any:
    """Transpose, split and merge axes by name, in einops' notation:

    ```python
    rearrange(x, "batch seq (embed: heads dim) -> batch heads seq dim", heads=4)
    rearrange(y, "batch heads seq dim -> batch seq (embed: heads dim)")
    rearrange(y, "... heads dim -> ... (heads dim)")  # merged axis "(heads dim)"
    ```

    The left side names the axes of `x`, in any order (they are found by name, as
    in [`quax_named.einsum`][]): all of them, or some and `...` for the rest. A
    group `(name: a b)` splits the axis `name` into new axes `a` and `b` (all
    sizes but one given as keywords, or known from the axes); a group `(a b)`
    splits the merged axis named `"(a b)"` (what a positional reshape that merges
    `a` and `b` makes) back into them. The right side lists the result's axes in
    order, `...` standing for the axes it does not list, in their storage order; a
    group `(name: a b)` merges `a` and `b` (the first varying slowest) into an axis
    named `name`, and a group `(a b)` into the merged axis `"(a b)"`. Every axis
    is kept: nothing is reduced or repeated.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `spec`: `"left -> right"`.
    - `**sizes`: sizes of split parts, by name.

    **Returns:**

    A `NamedArray` with the right side's axes.
    """
    x = check_named(x, "rearrange")
    if spec.count("->") != 1:
        raise ValueError(f"quax_named.rearrange needs one `->` in {spec!r}.")
    left, right = (_parse_side(part, spec) for part in spec.split("->"))
    shape = dict(zip((a.key for a in x.axes), x.aval().shape, strict=True))

    # The left side: each axis of `x` stays whole or is split into parts, each
    # with its size.
    pieces: dict[Any, list[tuple[Axis, int]]] = {}
    for item in left:
        if item == "...":
            continue
        if isinstance(item, str):
            axis = x.axis(item)
            pieces[axis.key] = [(axis, shape[axis.key])]
            continue
        name, parts = item
        axis = x.axis(name if name is not None else f"({' '.join(parts)})")
        known: list[Any] = [None] * len(parts)
        if (
            name is None
            and isinstance(axis, Flattened)
            and len(axis.part_sizes) == len(parts)
        ):
            known = list(axis.part_sizes)
        new = [
            Axis(check_name(part, "An axis of `rearrange`"), sizes.get(part, n))
            for part, n in zip(parts, known, strict=True)
        ]
        split_sizes = _sizes_of(new, shape[axis.key], "quax_named.rearrange")
        pieces[axis.key] = list(zip(new, split_sizes, strict=True))
    if "..." not in left:
        unlisted = [a for a in x.axes if a.key not in pieces]
        if unlisted:
            raise ValueError(
                f"quax_named.rearrange: the left side of {spec!r} does not list axes "
                f"{labels(unlisted)} of {labels(x.axes)}; list them or add `...`."
            )
    for a in x.axes:
        pieces.setdefault(a.key, [(a, shape[a.key])])
    flat = [p for a in x.axes for p, _ in pieces[a.key]]
    flat_sizes = [n for a in x.axes for _, n in pieces[a.key]]
    by_key = {p.key: k for k, p in enumerate(flat)}
    if len(by_key) != len(flat):
        raise ValueError(
            f"quax_named.rearrange: {spec!r} gives {labels(flat)}, which repeats an "
            "axis."
        )

    # The right side: the pieces in order, runs of them merged.
    def find(name: str) -> int:
        if name not in by_key:
            raise ValueError(
                f"quax_named.rearrange: the right side of {spec!r} names {name!r}, "
                f"which the left side does not give (it gives {labels(flat)})."
            )
        return by_key[name]

    listed = []
    for item in right:
        if item != "...":
            listed += [find(n) for n in ([item] if isinstance(item, str) else item[1])]
    if len(set(listed)) != len(listed):
        raise ValueError(f"quax_named.rearrange: {spec!r} lists an axis twice.")
    rest = [k for k in range(len(flat)) if k not in listed]
    if rest and "..." not in right:
        raise ValueError(
            f"quax_named.rearrange: the right side of {spec!r} does not list "
            f"{labels([flat[k] for k in rest])}; rearrange neither reduces nor "
            "drops an axis (list them, or add `...`)."
        )
    order: list[int] = []
    out: list[Axis] = []
    out_sizes: list[int] = []
    for item in right:
        if item == "...":
            runs = [[k] for k in rest]
        else:
            runs = (
                [[find(item)]] if isinstance(item, str) else [list(map(find, item[1]))]
            )
        for run in runs:
            order += run
            size = 1
            for k in run:
                size *= flat_sizes[k]
            if len(run) == 1 and (isinstance(item, str) or item == "..."):
                out.append(flat[run[0]])
            elif item[0] is None:
                out.append(
                    Flattened([flat[k] for k in run], [flat_sizes[k] for k in run])
                )
            else:
                out.append(Axis(check_name(item[0], "An axis of `rearrange`"), size))
            out_sizes.append(size)
    keys = [a.key for a in out]
    if len(set(keys)) != len(keys):
        raise ValueError(
            f"quax_named.rearrange: {spec!r} gives {labels(out)}, which repeats an "
            "axis."
        )
    array = x.array
    if flat_sizes != list(x.aval().shape):
        array = call(jnp.reshape, array, flat_sizes)
    if order != list(range(len(flat))):
        array = call(jax.lax.transpose, array, order)
    if out_sizes != [flat_sizes[k] for k in order]:
        array = call(jnp.reshape, array, out_sizes)
    return make(array, out, x.allow_materialise)


# Indexing, sorting, shifting, padding by name -----------------------------------------


def _check_not_swapped(indices: Any, axis: Any) -> None:
    """A `TypeError` for `take(x, "b", idx)`: the axis given as the indices."""
    if isinstance(indices, str | Axis) and not isinstance(axis, str | Axis):
        raise TypeError(
            f"quax_named.take(x, indices, axis) takes the indices before the axis: "
            f"got the axis {indices!r} as `indices` and {describe_argument(axis)} as "
            f"`axis`. Pass the indices second and the axis third: "
            f"quax_named.take(x, indices, {indices!r})."
        )


def take(x: NamedArray, indices: Any, axis: AxisLike, **kwargs: Any) -> Any:
    """`jnp.take` along a named axis.

    A `NamedArray` of indices puts its axes where `axis` was (an embedding lookup:
    `take(table, tokens, "vocab")` over tokens `(batch, seq)` gives `(batch, seq,
    embed)`); a plain 1-D index array keeps the name `axis`, at the number of
    indices; a scalar index drops `axis`.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `indices`: an integer, a 1-D integer array, or a `NamedArray` of integers.
    - `axis`: the axis to take along (name or `Axis`).
    - `**kwargs`: passed to `jnp.take` (`mode`, `fill_value`, ...).

    **Returns:**

    A `NamedArray` (a plain scalar when no axis is left).
    """
    x = check_named(x, "take")
    _check_not_swapped(indices, axis)
    i = x.index(axis)
    if isinstance(indices, NamedArray):
        indices = check_named(indices, "take")
        result = call(jnp.take, x.array, indices.array, axis=i, **kwargs)
        out = [*x.axes[:i], *indices.axes, *x.axes[i + 1 :]]
        keys = [a.key for a in out]
        if len(set(keys)) != len(keys):
            raise ValueError(
                f"quax_named.take: the indices' axes {labels(indices.axes)} in place "
                f"of {x.axes[i].label()!r} of {labels(x.axes)} would repeat an axis; "
                "rename one of them (`quax_named.rename`)."
            )
        allow = x.allow_materialise and indices.allow_materialise
        return make(result, out, allow)
    ndim = np.ndim(indices)
    if ndim > 1:
        raise ValueError(
            f"quax_named.take: unnamed indices of shape {np.shape(indices)} would "
            "give the result axes without names: wrap them as "
            "`NamedArray(indices, axes)`."
        )
    result = call(jnp.take, x.array, indices, axis=i, **kwargs)
    if ndim == 0:
        return make(result, x.axes[:i] + x.axes[i + 1 :], x.allow_materialise)
    return like(x, result)


sort = _along(jnp.sort, "sort", keeps=True)
argsort = _along(jnp.argsort, "argsort", keeps=True)


def roll(x: NamedArray, shift: Any, axis: AxisLike | Sequence[AxisLike]) -> Any:
    """`jnp.roll` along named axes: `roll(x, 1, "seq")`, `roll(x, (1, -2),
    ("seq", "embed"))`.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `shift`: the shift (an integer, or one per axis).
    - `axis`: the axis or axes (names or `Axis`es).

    **Returns:**

    A `NamedArray` with the same axes.
    """
    x = check_named(x, "roll")
    rolled: Any = positions(x, axis)
    if isinstance(axis, (str, Axis)):
        rolled = rolled[0]
    result = call(jnp.roll, x.array, shift, axis=rolled)
    return make(result, x.axes, x.allow_materialise)


def pad(
    x: NamedArray,
    pad_width: Mapping[AxisLike, int | tuple[int, int]],
    mode: str = "constant",
    **kwargs: Any,
) -> Any:
    """`jnp.pad` by name: `pad(x, {"seq": (1, 2)})`. Each padded axis keeps its name,
    at its new size.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `pad_width`: axis (name or `Axis`) -> `(before, after)`, or one number for
        both; axes not listed are not padded.
    - `mode`, `**kwargs`: as for `jnp.pad` (`constant_values`, ...).

    **Returns:**

    A `NamedArray` with the same axes, padded.
    """
    x = check_named(x, "pad")
    widths: list[Any] = [(0, 0)] * len(x.axes)
    for axis, width in pad_width.items():
        widths[x.index(axis)] = (width, width) if np.ndim(width) == 0 else width
    result = call(jnp.pad, x.array, widths, mode=mode, **kwargs)
    return like(x, result)
