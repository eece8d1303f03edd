"""Choosing parts of a model by type or predicate, and by path: the `filter=` and
`where=` arguments shared by the families' whole-model helpers (`loraify`,
`quantise_model`, ...)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
from jaxtyping import PyTree


__all__ = ["map_selected"]


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

    def select(x: Any) -> bool:
        if isinstance(filter, type | tuple):
            return isinstance(x, filter)
        return filter(x)

    def visit(node: Any) -> Any:
        return fn(node) if select(node) else node

    def replace(tree: PyTree) -> PyTree:
        return jtu.tree_map(visit, tree, is_leaf=select)

    return (
        replace(model)
        if where is None
        else eqx.tree_at(where, model, replace_fn=replace)
    )
