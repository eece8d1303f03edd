"""Choosing parts of a model by type or predicate, and by path: the `filter=` and
`where=` arguments shared by the families' whole-model helpers (`loraify`,
`quantise_model`, ...), on Equinox models (`map_selected`) and Flax NNX models
(`nnx_selected`)."""

import sys
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
from jaxtyping import PyTree


__all__ = ["map_selected", "nnx_selected"]


def map_selected(
    fn: Callable[[Any], Any],
    model: PyTree,
    *,
    filter: type | tuple[type, ...] | Callable[[Any], bool],
    where: Callable[[PyTree], Any] | None = None,
) -> PyTree:
    """Replace each node of `model` that `filter` selects by `fn(node)`.

    ```python
    model = quax.map_selected(adapt, model, filter=eqx.nn.Linear)
    model = quax.map_selected(
        adapt, model, filter=eqx.nn.Linear, where=lambda m: m.layers[-1]
    )
    ```

    This is the `filter=`/`where=` selection of whole-model helpers such as
    `quax_lora.loraify` and `quax_quant.quantise_model`: a family writes `fn` (what
    to do to one layer) and its own error when nothing was changed.

    **Arguments:**

    - `fn`: called on each selected node; its return value replaces the node. The
        nodes below a selected node are not visited.
    - `model`: any PyTree, usually an Equinox module.
    - `filter`: a type, a tuple of types (selects their instances), or a predicate
        on a node (selects where it returns true). Nodes are visited from the root
        down, as `jax.tree.map(..., is_leaf=...)` does.
    - `where`: only inside the sub-tree (or tuple of sub-trees) that `where(model)`
        returns, as for `eqx.tree_at`. By default the whole model.

    **Returns:**

    A copy of `model` with the selected nodes replaced.
    """

    select = _selector(filter)

    def visit(node: Any) -> Any:
        return fn(node) if select(node) else node

    def replace(tree: PyTree) -> PyTree:
        return jtu.tree_map(visit, tree, is_leaf=select)

    return (
        replace(model)
        if where is None
        else eqx.tree_at(where, model, replace_fn=replace)
    )


def _selector(
    filter: type | tuple[type, ...] | Callable[[Any], bool],
) -> Callable[[Any], bool]:
    if isinstance(filter, type | tuple):
        return lambda x: isinstance(x, filter)
    return lambda x: bool(filter(x))


def nnx_selected(
    model: Any,
    *,
    filter: type | tuple[type, ...] | Callable[[Any], bool],
    where: Callable[[Any], Any] | None = None,
    caller: str = "nnx_selected",
) -> list[tuple[tuple[Any, ...], Any]]:
    """The modules of a Flax NNX model that `filter` selects, with their paths:
    `map_selected`'s selection for a model that is a graph of mutable modules
    rather than a PyTree.

    ```python
    model = nnx.clone(model)  # NNX modules are changed in place
    for path, layer in quax.nnx_selected(model, filter=nnx.Linear):
        layer.kernel.set_value(convert(layer.kernel.get_value()))
    ```

    Flax is never imported here: an NNX model exists only if the program imported
    `flax.nnx`.

    **Arguments:**

    - `model`: an `nnx.Module`.
    - `filter`: a type, a tuple of types, or a predicate on a module, as for
        `map_selected`. The modules below a selected one are not selected.
    - `where`: only inside the module (or tuple of modules) `where(model)`
        returns. By default the whole model.
    - `caller`: the name the errors start with (the family's helper).

    **Returns:**

    `(path, module)` for each selected module, in `nnx.iter_graph`'s order, the
    path as `nnx.split`'s state keys it (`("layers", 0)`); a module shared by
    several parents once, under its first path.

    **Raises:**

    `ValueError` when `model` is no `nnx.Module`, or when `where(model)` returns
    something that is no module of `model` (an array, a variable).
    """
    nnx = sys.modules.get("flax.nnx")
    if nnx is None or not isinstance(model, nnx.Module):
        raise ValueError(
            f"{caller}: expected a Flax NNX model (an nnx.Module), got a "
            f"{type(model).__qualname__}; use quax.map_selected for PyTrees."
        )
    paths: dict[int, tuple[Any, ...]] = {}
    modules = []
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and id(node) not in paths:
            paths[id(node)] = tuple(path)
            modules.append((tuple(path), node))
    roots: list[tuple[Any, ...]] = [()]
    if where is not None:
        chosen = where(model)
        chosen = chosen if isinstance(chosen, tuple | list) else (chosen,)
        missing = [type(x).__qualname__ for x in chosen if id(x) not in paths]
        if missing:
            raise ValueError(
                f"{caller}: where= returned {', '.join(missing)}, which is not a "
                "module of the NNX model: return its layers or sub-modules (e.g. "
                "where=lambda m: (m.attn.query, m.attn.value))."
            )
        roots = [paths[id(x)] for x in chosen]
    select = _selector(filter)
    picked: list[tuple[tuple[Any, ...], Any]] = []
    for path, node in sorted(modules, key=lambda item: len(item[0])):
        inside = any(path[: len(r)] == r for r in roots)
        below = any(path[: len(p)] == p for p, _ in picked)
        if inside and not below and select(node):
            picked.append((path, node))
    order = {path: i for i, (path, _) in enumerate(modules)}
    return sorted(picked, key=lambda item: order[item[0]])
