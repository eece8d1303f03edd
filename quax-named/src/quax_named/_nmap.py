"""`nmap`: positional code over chosen named axes, vectorised over the others."""

import functools as ft
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import jax

from ._axes import Axis, as_axes, labels
from ._value import NamedArray


__all__ = ["nmap"]


def _nnx_module(fn: Any) -> tuple[ModuleType, Any] | None:
    """(`flax.nnx`, the module) when `fn` is a Flax NNX module or a method bound
    to one, else `None`. Flax is never imported here: an NNX module exists only
    if the program imported it."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None:
        return None
    for module in (fn, getattr(fn, "__self__", None)):
        if isinstance(module, nnx.Module):
            return nnx, module
    return None


def _keys(axes: Any) -> list[Any]:
    axes = [axes] if isinstance(axes, (str, Axis)) else list(axes)
    return [a if isinstance(a, str) else a.key for a in axes]


def nmap(
    fn: Callable[..., Any],
    axes: Axis | str | Sequence[Axis | str],
    *,
    out_axes: Sequence[Axis | str] | None = None,
) -> Callable[..., Any]:
    """Run `fn`, written for positional arrays, over the named axes `axes` of its
    `NamedArray` arguments, vectorised (`jax.vmap`) over all their other axes.

    ```python
    mlp = eqx.nn.MLP(64, 10, 128, 2, key=key)   # unmodified, positional
    x = NamedArray(data, ("batch", "seq", "feature"))
    y = quax_named.nmap(mlp, "feature", out_axes=("logit",))(x)
    # y: NamedArray over (batch, seq, logit)
    ```

    `fn` sees each `NamedArray` argument as a plain array over the axes of `axes`
    that it has, in the order `axes` lists them; other arguments (weights, flags)
    are passed unchanged. Axes outside `axes` are matched by name across the
    arguments (an argument without one is broadcast over it) and vectorised.

    A Flax NNX module (or a method bound to one) is vectorised as NNX does it
    (`nnx.vmap`, the module passed in rather than closed over): its variables
    are shared by every element, except its random streams (`nnx.Rngs`), which
    are split per element (`nnx.split_rngs`), so that `nnx.Dropout` draws a
    mask per element as it does over a batch, and advance once per call.
    Updating other state per element (`nnx.BatchNorm` collecting statistics)
    is refused by `nnx.vmap`: call the module on the whole batch for that.

    **Arguments:**

    - `fn`: the positional function: a function, an Equinox module, or a Flax NNX
        module or method.
    - `axes`: the axis or axes `fn` works on.
    - `out_axes`: the names of each output's own axes (every output leaf gets the
        vectorised axes first, then these). By default an output whose shape is that
        of `axes` takes those axes, and a scalar output gets none.

    **Returns:**

    A function of the same arguments returning `NamedArray`s.
    """
    core = _keys(axes)
    named_out = None if out_axes is None else as_axes(out_axes, "`nmap`'s `out_axes`")

    @ft.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        is_named = lambda x: isinstance(x, NamedArray)
        leaves, treedef = jax.tree.flatten((args, kwargs), is_leaf=is_named)
        slots = [i for i, leaf in enumerate(leaves) if is_named(leaf)]
        named: list[NamedArray] = [leaves[i] for i in slots]
        batch: list[Axis] = []
        sizes: dict[Any, int] = {}
        core_axes: dict[Any, Axis] = {}
        for x in named:
            for a, n in zip(x.axes, x.aval().shape, strict=True):
                if sizes.setdefault(a.key, n) != n:
                    raise ValueError(
                        f"nmap: axis {a.label()!r} has size {sizes[a.key]} in one "
                        f"argument and {n} in another ({labels(x.axes)})."
                    )
                if a.key in core:
                    core_axes.setdefault(a.key, a)
                elif a.key not in [b.key for b in batch]:
                    batch.append(a)
        missing = [k for k in core if k not in sizes]
        if missing:
            raise ValueError(
                f"nmap: axes {missing!r} are in none of the NamedArray arguments "
                f"({', '.join(labels(x.axes) for x in named)})."
            )
        arrays = []
        for x in named:
            order = [a.key for a in batch if a.key in x.sizes]
            order += [k for k in core if k in x.sizes]
            perm = [[a.key for a in x.axes].index(k) for k in order]
            array = x.array
            if perm != list(range(len(perm))):
                array = jax.numpy.transpose(array, perm)
            arrays.append(array)

        def positional(call: Callable[..., Any], *arrays: Any) -> Any:
            filled = list(leaves)
            for i, array in zip(slots, arrays, strict=True):
                filled[i] = array
            inner_args, inner_kwargs = jax.tree.unflatten(treedef, filled)
            return call(*inner_args, **inner_kwargs)

        nnx = _nnx_module(fn)
        if nnx is None:
            mapped = ft.partial(positional, fn)
            for axis in reversed(batch):
                in_axes = [0 if axis.key in x.sizes else None for x in named]
                mapped = jax.vmap(mapped, in_axes=in_axes, out_axes=0)
            out = mapped(*arrays)
        else:
            out = _nnx_vmapped(fn, *nnx, positional, batch, named, sizes)(*arrays)
        core_shape = tuple(sizes[k] for k in core)

        def name(y: Any) -> Any:
            own = jax.numpy.shape(y)[len(batch) :]
            if named_out is not None:
                axes = named_out
            elif own == core_shape:
                axes = tuple(core_axes[k] for k in core)
            elif own == ():
                axes = ()
            else:
                raise ValueError(
                    f"nmap: an output has shape {own} over the axes "
                    f"{tuple(core)!r} (size {core_shape}); name its axes with "
                    "`out_axes=`."
                )
            if len(axes) != len(own):
                raise ValueError(
                    f"nmap: out_axes {labels(axes)} name {len(axes)} axes, but an "
                    f"output has {len(own)} ({own})."
                )
            out = (*batch, *axes)
            return NamedArray(y, out) if out else y

        return jax.tree.map(name, out)

    return wrapper


def _nnx_vmapped(
    fn: Any,
    nnx: ModuleType,
    module: Any,
    positional: Callable[..., Any],
    batch: list[Axis],
    named: list[NamedArray],
    sizes: dict[Any, int],
) -> Callable[..., Any]:
    """`positional` vectorised over the `batch` axes with `nnx.vmap`, the NNX
    `module` (whose method, or itself, `fn` is) passed in: its random streams
    split per element of each axis, its other state shared."""

    method = None if fn is module else fn.__func__

    def call(module: Any, *arrays: Any) -> Any:
        # The module as it is inside `nnx.vmap`, or the same method bound to it.
        bound = module if method is None else method.__get__(module)
        return positional(bound, *arrays)

    state_axes = nnx.StateAxes({nnx.RngState: 0, ...: None})
    mapped = call
    for axis in reversed(batch):
        in_axes = (state_axes, *(0 if axis.key in x.sizes else None for x in named))
        mapped = nnx.split_rngs(splits=sizes[axis.key])(
            nnx.vmap(mapped, in_axes=in_axes, out_axes=0)
        )
    return ft.partial(mapped, module)
