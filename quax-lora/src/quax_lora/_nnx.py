"""Flax NNX models: `loraify`, `merge`, `unmerge` and the adapter files on an
`nnx.Module`.

An adapted layer's `kernel` (or `embedding`) becomes a `LoraKernel`: an
`nnx.Module` holding the base weight `w` as an `nnx.Param` and the factors `a`
and `b` as `nnx.LoRAParam`s, so that NNX's filters tell them apart
(`nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)` trains the factors only). The
layer reads it as it read its `nnx.Param` (`kernel[...]`) and gets the
`LoraArray`. As a JAX PyTree (what `quax.quaxify`, `jax.jit` and
`jax.tree_util` see) a `LoraKernel` is that one `LoraArray`, so that a
quaxified call dispatches on it.

Flax is optional: nothing here imports it. A model can only be an NNX module if
`flax.nnx` has been imported already, so that is where it is looked up.
"""

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax.tree_util as jtu
import quax

from ._peft import CONV, EMBEDDING, LINEAR
from ._value import LoraArray


__all__ = [
    "adapt_layers",
    "adapters_of",
    "layer_name",
    "lora_kernels",
    "nnx_of",
    "peft_kinds",
    "replace_kernels",
    "update_kernels",
    "weights_of",
]

# The weight of each NNX layer type loraify adapts, by attribute.
_EMBEDDING = "embedding"
_KERNEL = "kernel"


def nnx_of(model: Any) -> ModuleType | None:
    """`flax.nnx` when `model` is an `nnx.Module`, else `None`."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(model, nnx.Module):
        return nnx
    return None


class _HeldKernel:
    """What a `LoraKernel` is rebuilt as from a leaf that is no `LoraArray` (say
    the tracer `quax.quaxify` makes of it): a holder the layer reads as it reads
    a variable (`kernel[...]`, `kernel.get_value()`)."""

    def __init__(self, value: Any):
        self.value = value

    def get_value(self, index: Any = None) -> Any:
        return _indexed(self.value, index)

    def __getitem__(self, index: Any) -> Any:
        return self.get_value(index)


def _indexed(value: Any, index: Any) -> Any:
    if index is None or index is Ellipsis:
        return value
    raise TypeError(
        f"An NNX layer's LoRA kernel is read whole (`kernel[...]` or "
        f"`kernel.get_value()`), not indexed with {index!r}: index the array it "
        "gives inside quax.quaxify."
    )


def _flatten(kernel: Any) -> tuple[tuple[Any], None]:
    return (kernel.get_value(),), None


def _flatten_with_keys(kernel: Any) -> tuple[tuple[tuple[Any, Any]], None]:
    return ((jtu.GetAttrKey("value"), kernel.get_value()),), None


def _unflatten(_: None, children: Any) -> Any:
    """A `LoraKernel` again from a `LoraArray` (say after `jax.jit`, or a
    `jax.tree_util` map over the model); else a `_HeldKernel`."""
    (value,) = children
    if isinstance(value, LoraArray):
        return kernel_type(sys.modules["flax.nnx"])(value)
    return _HeldKernel(value)


jtu.register_pytree_with_keys(_HeldKernel, _flatten_with_keys, _unflatten, _flatten)
_kernel_types: dict[int, type] = {}


def kernel_type(nnx: ModuleType) -> type:
    """The `LoraKernel` class (an `nnx.Module`), defined once `flax.nnx` is
    imported."""
    cls = _kernel_types.get(id(nnx))
    if cls is not None:
        return cls

    class LoraKernel(nnx.Module, pytree=False):  # type: ignore[call-arg]
        """A `LoraArray` as an NNX layer's weight: the base weight `w` an
        `nnx.Param`, the factors `a` (`(*rows, rank)`) and `b` (`(rank,
        *columns)`) `nnx.LoRAParam`s, and its settings (rank, scaling, layout)
        static. `kernel[...]` and `kernel.get_value()` give the `LoraArray`."""

        def __init__(self, lora: LoraArray):
            extra = [
                name
                for name in ("magnitude", "dropout_key", "index")
                if getattr(lora, name) is not None
            ]
            if extra or lora.adapters is not None:
                raise ValueError(
                    "An NNX layer's LoRA kernel holds w, a and b as NNX variables, "
                    f"and not a LoraArray's {', '.join(extra) or 'stacked adapters'}"
                    ": DoRA, dropout keys and stacked adapters are for Equinox "
                    "models. Use them on an Equinox model, or leave them out."
                )
            self.w = nnx.Param(lora.w)
            self.a = nnx.LoRAParam(lora.a)
            self.b = nnx.LoRAParam(lora.b)
            self.settings = lora.replace(w=None, a=None, b=None)

        def get_value(self, index: Any = None) -> LoraArray:
            lora = self.settings.replace(
                w=self.w.get_value(), a=self.a.get_value(), b=self.b.get_value()
            )
            return _indexed(lora, index)

        def __getitem__(self, index: Any) -> LoraArray:
            return self.get_value(index)

    # Not NNX's own PyTree (`pytree=False`): to JAX, the one `LoraArray`.
    jtu.register_pytree_with_keys(LoraKernel, _flatten_with_keys, _unflatten, _flatten)
    _kernel_types[id(nnx)] = LoraKernel
    return LoraKernel


def _node_paths(nnx: ModuleType, model: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """(path, module) of every module in `model`'s graph, once each (a shared
    module under its first path), the paths as `nnx.split`'s state keys them."""
    return [
        (tuple(path), node)
        for path, node in nnx.iter_graph(model)
        if isinstance(node, nnx.Module)
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
    kernel = kernel_type(nnx)
    out = nnx.clone(model)
    layers = quax.nnx_selected(out, filter=filter, where=where, caller="loraify")
    for path, layer in layers:
        matched.append(layer)
        attribute = _attribute(nnx, path, layer)
        if attribute is None:
            continue
        variable = getattr(layer, attribute)
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
            setattr(layer, attribute, kernel(new))
    return out


def lora_kernels(model: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """(path, `LoraKernel`) of every adapted weight of the NNX `model`, the path
    the weight's in `nnx.split`'s state (`("layers", 0, "kernel")`)."""
    nnx = nnx_of(model)
    assert nnx is not None
    kernel = kernel_type(nnx)
    return [
        (tuple(path), node)
        for path, node in nnx.iter_graph(model)
        if isinstance(node, kernel)
    ]


def replace_kernels(
    model: Any, new: Callable[[tuple[Any, ...], LoraArray], Any]
) -> Any:
    """A copy of the NNX `model` whose every `LoraKernel` (at `path`) is
    replaced by an `nnx.Param` holding `new(path, its LoraArray)`."""
    nnx = nnx_of(model)
    assert nnx is not None
    out = nnx.clone(model)
    parents = dict(_node_paths(nnx, out))
    for path, node in lora_kernels(out):
        setattr(parents[path[:-1]], path[-1], nnx.Param(new(path, node.get_value())))
    return out


def _kind(nnx: ModuleType, layer: Any, attribute: Any) -> str:
    if attribute == _EMBEDDING:
        return EMBEDDING
    return CONV if _is_conv(nnx, layer) else LINEAR


def layer_name(path: tuple[Any, ...]) -> str:
    """The dotted name (`layers.0`) of the layer whose weight is at `path`."""
    return _name(path[:-1])


def adapters_of(model: Any) -> dict[str, LoraArray]:
    """The `LoraArray` of every adapted layer of the NNX `model`, by the layer's
    name (`layer_name`): the Equinox path's functions run on this dict."""
    return {layer_name(path): node.get_value() for path, node in lora_kernels(model)}


def update_kernels(
    model: Any, new: Callable[[tuple[Any, ...], LoraArray], LoraArray]
) -> Any:
    """A copy of the NNX `model` whose every `LoraKernel` (at `path`) holds the
    leaves `w`, `a` and `b` of `new(path, its LoraArray)`."""
    nnx = nnx_of(model)
    assert nnx is not None
    out = nnx.clone(model)
    for path, node in lora_kernels(out):
        lora = new(path, node.get_value())
        node.w.set_value(lora.w)
        node.a.set_value(lora.a)
        node.b.set_value(lora.b)
    return out


def weights_of(model: Any) -> dict[tuple[Any, ...], Any]:
    """The value of every variable of the NNX `model`, by its path in
    `nnx.split`'s state."""
    nnx = nnx_of(model)
    assert nnx is not None
    return {
        tuple(path): variable.get_value()
        for path, variable in nnx.to_flat_state(nnx.state(model))
    }


def peft_kinds(model: Any) -> dict[str, str]:
    """What each adapted layer of the NNX `model` is to peft (`EMBEDDING`,
    `CONV` or `LINEAR`), by its name in `adapters_of(model)`."""
    nnx = nnx_of(model)
    assert nnx is not None
    nodes = dict(_node_paths(nnx, model))
    return {
        layer_name(path): _kind(nnx, nodes[path[:-1]], path[-1])
        for path, _ in lora_kernels(model)
    }
