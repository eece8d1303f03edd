"""Flax NNX models: `loraify`, `merge`, `unmerge` and the adapter files on an
`nnx.Module`, through `nnx.split` -> the Equinox path on the state -> `nnx.merge`.

Flax is optional: nothing here imports it. A model can only be an NNX module if
`flax.nnx` has been imported already, so that is where it is looked up.
"""

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax.tree_util as jtu

from ._peft import CONV, EMBEDDING, LINEAR
from ._value import LoraArray


__all__ = ["adapt_layers", "nnx_of", "peft_layers", "via_state"]

# The weight of each NNX layer type loraify adapts, by attribute.
_EMBEDDING = "embedding"
_KERNEL = "kernel"


def nnx_of(model: Any) -> ModuleType | None:
    """`flax.nnx` when `model` is an `nnx.Module`, else `None`."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(model, nnx.Module):
        return nnx
    return None


def via_state(nnx: ModuleType, fn: Callable[[Any], Any], model: Any) -> Any:
    """`nnx.merge(graphdef, fn(state))`, where `nnx.split` gives `model`'s
    `graphdef` and `state`: an Equinox-path function (a map over a PyTree) on
    an NNX module, which returns a new one."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, fn(state), copy=True)


def _node_paths(nnx: ModuleType, model: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """(path, module) of every module in `model`'s graph, once each (a shared
    module under its first path), the paths as `nnx.split`'s state keys them."""
    return [
        (tuple(path), node)
        for path, node in nnx.iter_graph(model)
        if isinstance(node, nnx.Module)
    ]


def _selected(
    nnx: ModuleType,
    model: Any,
    filter: type | tuple[type, ...] | Callable[[Any], bool],
    where: Callable[[Any], Any] | None,
) -> list[tuple[tuple[Any, ...], Any]]:
    """(path, layer) of the modules `filter` selects inside `where(model)` (every
    one by default), skipping those below a selected one, as `quax.map_selected`
    does."""
    nodes = _node_paths(nnx, model)
    if where is None:
        roots = [()]
    else:
        chosen = where(model)
        chosen = chosen if isinstance(chosen, tuple | list) else (chosen,)
        roots = []
        for node in chosen:
            found = [path for path, x in nodes if x is node]
            if not found:
                raise ValueError(
                    f"loraify: where= returned a {type(node).__qualname__}, which "
                    "is not a module of the NNX model: return its layers or "
                    "sub-modules (e.g. where=lambda m: (m.attn.query, m.attn.value))."
                )
            roots.append(found[0])

    def select(x: Any) -> bool:
        if isinstance(filter, type | tuple):
            return isinstance(x, filter)
        return bool(filter(x))

    def under(path: tuple[Any, ...], prefixes: list[tuple[Any, ...]]) -> bool:
        return any(path[: len(p)] == p for p in prefixes)

    picked = [(p, x) for p, x in nodes if under(p, roots) and select(x)]
    tops = [p for p, _ in picked]
    return [
        (p, x)
        for p, x in picked
        if not any(len(q) < len(p) and p[: len(q)] == q for q in tops)
    ]


def _name(path: tuple[Any, ...]) -> str:
    return ".".join(map(str, path))


def _attribute(nnx: ModuleType, path: tuple[Any, ...], layer: Any) -> str | None:
    """The attribute of `layer` loraify adapts (`kernel`, `embedding`), or `None`
    for a layer without one; a `ValueError` for a grouped convolution, whose
    kernel a low-rank update does not fit."""
    if isinstance(layer, nnx.Embed):
        return _EMBEDDING
    if _is_conv(nnx, layer) and getattr(layer, "feature_group_count", 1) != 1:
        raise ValueError(
            f"loraify: the {type(layer).__name__} at `{_name(path)}` of the NNX "
            f"model is grouped (feature_group_count={layer.feature_group_count}): "
            "each group's outputs see only its inputs, which a low-rank update "
            "of the whole kernel would mix. Leave it out of filter=/where=."
        )
    return _KERNEL if hasattr(layer, _KERNEL) else None


def _is_conv(nnx: ModuleType, layer: Any) -> bool:
    return isinstance(layer, nnx.Conv | nnx.ConvTranspose)


def _layout(nnx: ModuleType, layer: Any, ndim: int) -> tuple[int, int]:
    """(batch_ndim, row_ndim) of `layer`'s kernel of `ndim` axes, as the layer
    uses it (`x @ kernel`, its input axes first): a convolution kernel
    `(*window, in, out)` has rows `(*window, in)`, as peft factors a
    convolution; an `nnx.LinearGeneral` kernel `(*batch, *in, *out)` has its
    batch axes and its input axes as rows (the output projection of
    `nnx.MultiHeadAttention`, `(heads, head_dim, out)`, has two); any other
    kernel or an embedding `(n, *m)` one."""
    if _is_conv(nnx, layer):
        return 0, ndim - 1
    if isinstance(layer, nnx.LinearGeneral):
        return len(layer.batch_axis), len(layer.in_features)
    return 0, 1


def adapt_layers(
    model: Any,
    *,
    adapt: Callable[..., Any],
    matched: list[Any],
    filter: type | tuple[type, ...] | Callable[[Any], bool],
    where: Callable[[Any], Any] | None,
    variant: str,
) -> Any:
    """`loraify` on an NNX module: `adapt(weight, embedding=..., batch_ndim=...,
    row_ndim=...)` (the Equinox path's per-weight step, with the layout
    `_layout` gives) on the kernel or embedding of every layer `filter`
    selects, by its path in `nnx.split`'s state. Each selected layer is appended
    to `matched`."""
    nnx = nnx_of(model)
    assert nnx is not None
    layers = _selected(nnx, model, filter, where)
    graphdef, state = nnx.split(model)
    flat = dict(nnx.to_flat_state(state))
    for path, layer in layers:
        matched.append(layer)
        attribute = _attribute(nnx, path, layer)
        variable = flat.get((*path, attribute))
        if variable is None:
            continue
        embedding = attribute == _EMBEDDING
        if variant == "dora" and not embedding:
            # An embedding is refused by `adapt`, with the Equinox path's message.
            raise ValueError(
                f"loraify(variant='dora') does not adapt the NNX kernel at "
                f"`{_name(path)}`: an NNX kernel is (in, out), and DoRA normalises "
                "each output, a column of it, where LoraArray normalises rows. Use "
                "variant='lora' or 'rslora' on NNX models."
            )
        weight = variable.get_value()
        batch_ndim, row_ndim = _layout(nnx, layer, len(weight.shape))
        new = adapt(
            weight, embedding=embedding, batch_ndim=batch_ndim, row_ndim=row_ndim
        )
        if new is not weight:
            flat[(*path, attribute)] = variable.replace(value=new)
    return nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())), copy=True)


def peft_layers(model: Any, state: Any) -> list[tuple[str, LoraArray, str]]:
    """(peft module name, array, what its layer is to peft: `EMBEDDING`, `CONV`
    or `LINEAR`) of every `LoraArray` of an NNX model's `state` (as `nnx.split`
    gives it for `model`), the arrays as `jax.tree_util` maps over `state` meets
    them: the name is the layer's path, dotted (`layers.0`)."""
    nnx = nnx_of(model)
    assert nnx is not None
    convs = {path for path, node in _node_paths(nnx, model) if _is_conv(nnx, node)}
    out = []
    leaves, _ = jtu.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, LoraArray)
    )
    for path, x in leaves:
        if isinstance(x, LoraArray):
            keys = tuple(k.key for k in path if isinstance(k, jtu.DictKey))
            layer = keys[:-1]
            kind = (
                EMBEDDING
                if keys[-1] == _EMBEDDING
                else CONV
                if layer in convs
                else LINEAR
            )
            out.append((_name(layer), x, kind))
    return out
