"""Flax NNX models in `quantise_model`: the selected layers (`quax.nnx_selected`)
of a copy of the model get their `nnx.Param` values replaced.

Flax is optional: nothing here imports it. A model can only be an NNX module if
`flax.nnx` has been imported already, so that is where it is looked up.
"""

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import quax


__all__ = ["nnx_of", "quantise_layers"]


def nnx_of(model: Any) -> ModuleType | None:
    """`flax.nnx` when `model` is an `nnx.Module`, else `None`."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(model, nnx.Module):
        return nnx
    return None


def quantise_layers(
    model: Any,
    *,
    convert: Callable[[Callable[[], str], Any, Any], Any],
    filter: type | tuple[type, ...] | Callable[[Any], bool],
    where: Callable[[Any], Any] | None,
    attribute: str,
) -> Any:
    """A new NNX module (a copy, `nnx.clone`): `model` with the value of the
    `attribute` variable of every layer `filter` selects (inside `where(model)`;
    not below another selected layer) replaced by `convert(path, layer, value)`,
    where `path()` is the layer's path, dotted (`layers.0`)."""
    nnx = nnx_of(model)
    assert nnx is not None
    out = nnx.clone(model)
    for path, layer in quax.nnx_selected(
        out, filter=filter, where=where, caller="quantise_model"
    ):
        variable = getattr(layer, attribute, None)
        if variable is None or not isinstance(variable, nnx.Variable):
            continue
        value = variable.get_value()
        name = ".".join(map(str, path)) or "<model>"
        new = convert(lambda name=name: name, layer, value)
        if new is not value:
            variable.set_value(new)
    return out
