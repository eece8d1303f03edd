"""Flax NNX models in `quantise_model`: the selected layers' `nnx.Param` values
replaced by their paths in `nnx.split`'s state, then `nnx.merge`.

Flax is optional: nothing here imports it. A model can only be an NNX module if
`flax.nnx` has been imported already, so that is where it is looked up.
"""

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


__all__ = ["nnx_of", "quantise_layers"]


def nnx_of(model: Any) -> ModuleType | None:
    """`flax.nnx` when `model` is an `nnx.Module`, else `None`."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(model, nnx.Module):
        return nnx
    return None


def _roots(model: Any, modules: dict[int, tuple[Any, ...]], where: Any) -> list[Any]:
    """The paths of the modules `where(model)` returns (the whole model without
    `where`)."""
    if where is None:
        return [()]
    chosen = where(model)
    chosen = chosen if isinstance(chosen, tuple | list) else (chosen,)
    missing = [type(x).__qualname__ for x in chosen if id(x) not in modules]
    if missing:
        raise ValueError(
            f"quantise_model: where= returned {', '.join(missing)}, not a module of "
            "the NNX model: return its layers or sub-modules (e.g. where=lambda m: "
            "(m.mlp, m.head))."
        )
    return [modules[id(x)] for x in chosen]


def quantise_layers(
    model: Any,
    *,
    convert: Callable[[Callable[[], str], Any, Any], Any],
    filter: type | tuple[type, ...] | Callable[[Any], bool],
    where: Callable[[Any], Any] | None,
    attribute: str,
) -> Any:
    """A new NNX module: `model` with the value of the `attribute` variable of
    every layer `filter` selects (inside `where(model)`; not below another
    selected layer) replaced by `convert(path, layer, value)`, where `path()`
    is the layer's path, dotted (`layers.0`)."""
    nnx = nnx_of(model)
    assert nnx is not None
    modules: dict[int, tuple[Any, ...]] = {}
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module):
            modules.setdefault(id(node), tuple(path))
    nodes = {path: node for path, node in nnx.iter_graph(model)}
    roots = _roots(model, modules, where)

    def selected(node: Any) -> bool:
        if isinstance(filter, type | tuple):
            return isinstance(node, filter)
        return bool(filter(node))

    picked = sorted(
        (
            path
            for path in modules.values()
            if any(path[: len(r)] == r for r in roots) and selected(nodes[path])
        ),
        key=len,
    )
    graphdef, state = nnx.split(model)
    flat = dict(nnx.to_flat_state(state))
    done: list[tuple[Any, ...]] = []
    for path in picked:
        if any(path[: len(p)] == p for p in done):
            continue  # below a selected layer
        done.append(path)
        variable = flat.get((*path, attribute))
        if variable is None:
            continue
        value = variable.get_value()
        name = ".".join(map(str, path)) or "<model>"
        new = convert(lambda name=name: name, nodes[path], value)
        if new is not value:
            flat[(*path, attribute)] = variable.replace(value=new)
    return nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())), copy=True)
