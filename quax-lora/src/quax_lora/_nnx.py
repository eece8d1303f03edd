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
    for a layer without one; a `ValueError` for a layer whose kernel is no
    `(in, out)` matrix."""
    if isinstance(layer, nnx.Embed):
        return _EMBEDDING
    if isinstance(layer, nnx.Conv | nnx.ConvTranspose):
        raise ValueError(
            f"loraify: the {type(layer).__name__} at `{_name(path)}` of the NNX "
            "model has a kernel (*window, in, out), which quax-lora does not adapt "
            "yet (its LoRA is (window * in) x out, and LoraArray factors a kernel "
            "after its first axis). Leave it out of filter=/where=, or adapt the "
            "Equinox model's eqx.nn.Conv."
        )
    if isinstance(layer, nnx.LinearGeneral) and (
        len(layer.in_features) != 1 or layer.batch_axis
    ):
        raise ValueError(
            f"loraify: the nnx.LinearGeneral at `{_name(path)}` contracts "
            f"{len(layer.in_features)} input axes (in_features={layer.in_features}, "
            f"batch_axis={dict(layer.batch_axis)}); quax-lora adapts a kernel "
            "(in, *out) with one input axis, such as the query, key and value of "
            "nnx.MultiHeadAttention. Select those with where= (e.g. where=lambda "
            "m: (m.attn.query, m.attn.value)), leaving the output projection out."
        )
    return _KERNEL if hasattr(layer, _KERNEL) else None


def adapt_layers(
    model: Any,
    *,
    adapt: Callable[..., Any],
    matched: list[Any],
    filter: type | tuple[type, ...] | Callable[[Any], bool],
    where: Callable[[Any], Any] | None,
    variant: str,
) -> Any:
    """`loraify` on an NNX module: `adapt(weight, embedding=..., batch_ndim=0)`
    (the Equinox path's per-weight step) on the kernel `(in, *out)` or embedding
    `(vocab, features)` of every layer `filter` selects, by its path in
    `nnx.split`'s state. Each selected layer is appended to `matched`."""
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
        new = adapt(weight, embedding=embedding, batch_ndim=0)
        if new is not weight:
            flat[(*path, attribute)] = variable.replace(value=new)
    return nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())), copy=True)


def peft_layers(state: Any) -> list[tuple[str, LoraArray, bool]]:
    """(peft module name, array, whether it is an embedding) of every `LoraArray`
    of an NNX model's `state` (as `nnx.split` gives it), the arrays as
    `jax.tree_util` maps over `state` meets them: the name is the layer's path,
    dotted (`layers.0`)."""
    out = []
    leaves, _ = jtu.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, LoraArray)
    )
    for path, x in leaves:
        if isinstance(x, LoraArray):
            keys = [k.key for k in path if isinstance(k, jtu.DictKey)]
            out.append((_name(tuple(keys[:-1])), x, keys[-1] == _EMBEDDING))
    return out
