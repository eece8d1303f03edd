"""Whole-model helpers: `quantise_model` and `memory_report`."""

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
import numpy as np
import quax
from jaxtyping import PyTree

from ._quantise import quantise
from ._value import QuantisedArray


__all__ = ["MemoryReport", "is_quantised", "memory_report", "quantise_model"]

_logger = logging.getLogger("quax_quant")


def is_quantised(x: Any) -> bool:
    """Whether `x` is a [`quax_quant.QuantisedArray`][]; an `is_leaf` for tree maps."""
    return isinstance(x, QuantisedArray)


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """The weight memory of a model with quantised arrays.

    **Fields:**

    - `quantised_arrays`: how many `QuantisedArray`s the model holds.
    - `float_bytes`: what those arrays would take as floats (of their dtype).
    - `quantised_bytes`: what they take: integers, scales and zero points.
    - `other_bytes`: every other array leaf of the model.
    """

    quantised_arrays: int
    float_bytes: int
    quantised_bytes: int
    other_bytes: int

    @property
    def saved_bytes(self) -> int:
        """`float_bytes - quantised_bytes`."""
        return self.float_bytes - self.quantised_bytes

    @property
    def ratio(self) -> float:
        """`quantised_bytes / float_bytes` for the quantised arrays."""
        return self.quantised_bytes / self.float_bytes if self.float_bytes else 1.0

    def __str__(self) -> str:
        mib = 2.0**20
        return (
            f"{self.quantised_arrays} quantised arrays: "
            f"{self.quantised_bytes / mib:.3f} MiB instead of "
            f"{self.float_bytes / mib:.3f} MiB ({self.ratio:.3f}x, "
            f"{self.saved_bytes / mib:.3f} MiB saved); other arrays "
            f"{self.other_bytes / mib:.3f} MiB"
        )


def memory_report(model: PyTree) -> MemoryReport:
    """Measure the weight memory of `model` and what quantisation saved.

    **Arguments:**

    - `model`: any PyTree, possibly holding [`quax_quant.QuantisedArray`][]s.

    **Returns:**

    A [`quax_quant.MemoryReport`][].
    """
    count = float_bytes = quantised_bytes = other = 0
    for leaf in jtu.tree_leaves(model, is_leaf=is_quantised):
        if isinstance(leaf, QuantisedArray):
            count += 1
            float_bytes += (
                int(np.prod(leaf.shape)) * np.dtype(leaf.float_dtype).itemsize
            )
            quantised_bytes += leaf.nbytes
        elif eqx.is_array(leaf):
            other += int(leaf.size) * leaf.dtype.itemsize
    return MemoryReport(count, float_bytes, quantised_bytes, other)


def _path_of(model: PyTree, node: Any) -> str:
    """Where `node` (an object inside `model`) is, as `jax.tree_util.keystr` writes
    it (`.layers[1]`); `<model>` for the model itself."""
    if node is model:
        return "<model>"
    found = jtu.tree_flatten_with_path(model, is_leaf=lambda x: x is node)[0]
    for path, leaf in found:
        if leaf is node:
            return jtu.keystr(path)
    return "<unknown path>"


def quantise_model(
    model: PyTree,
    *,
    bits: int = 8,
    axis: int | Sequence[int] | None = 0,
    group_size: int | None = None,
    symmetric: bool = True,
    filter: type | tuple[type, ...] | Callable[[Any], bool] = (
        eqx.nn.Linear,
        eqx.nn.Conv,
    ),
    where: Callable[[PyTree], Any] | None = None,
    attribute: str = "weight",
    straight_through: bool = False,
    allow_materialise: bool = False,
    matmul: str = "auto",
) -> PyTree:
    """Replace the weights of the chosen layers of `model` with
    [`quax_quant.QuantisedArray`][]s, like `quax_lora.loraify`.

    ```python
    qmodel = quax_quant.quantise_model(model, bits=4, group_size=64)
    print(quax_quant.memory_report(qmodel))  # what was saved
    y = quax.quaxify(qmodel)(x)
    ```

    The memory saved is logged (logger `"quax_quant"`, level INFO) and given by
    [`quax_quant.memory_report`][].

    **Arguments:**

    - `model`: any PyTree, usually an Equinox module.
    - `bits`, `symmetric`, `straight_through`, `allow_materialise`, `matmul`: as
        for [`quax_quant.quantise`][]. With `straight_through=True`, call it inside
        the differentiated loss for quantisation-aware training.
    - `axis`: the per-channel axis of each weight; by default 0, the output
        channels of `eqx.nn.Linear` `(out, in)` and `eqx.nn.Conv` `(out, in, ...)`.
        `None` for one scale per weight. Ignored when `group_size` is given. An
        axis out of range for a weight raises, as NumPy does.
    - `group_size`: one scale per group of this many inputs (along the last axis)
        and per output channel. Convolution kernels are always quantised per output
        channel.
    - `filter`: which layers: a layer type, a tuple of them, or a predicate on a
        layer. By default every `eqx.nn.Linear` and `eqx.nn.Conv`. A matching
        layer's floating-point `weight` (see `attribute`) is quantised.
    - `where`: choose by path, as for `eqx.tree_at`: only layers inside the
        sub-tree(s) `where(model)` that match `filter`. By default the whole model.
    - `attribute`: the attribute of a matching object to quantise. With
        `filter=quax_lora.is_lora, attribute="w"` it quantises the base weights of
        a LoRA model (QLoRA).

    **Returns:**

    A copy of `model` with the selected weights quantised.

    **Raises:**

    `ValueError` when no layer matched (a quantised model with nothing quantised is
    almost always a wrong `filter` or `where`), and where `quantise` refuses a
    weight (an `axis` out of range for it, a concrete weight holding a NaN or an
    infinity: a diverged model), naming the layer by its path in `model`.
    """
    changed = []

    def convert(layer: Any) -> Any:
        weight = getattr(layer, attribute, None)
        if weight is None or not eqx.is_inexact_array(weight) or np.ndim(weight) < 1:
            return layer
        # The quantised convolution takes one scale per output channel.
        conv = isinstance(layer, eqx.nn.Conv | eqx.nn.ConvTranspose)
        groups = None if conv else group_size
        try:
            q = quantise(
                weight,
                bits=bits,
                axis=0 if conv else (None if group_size is not None else axis),
                group_size=groups,
                symmetric=symmetric,
                straight_through=straight_through,
                allow_materialise=allow_materialise,
                matmul=matmul,
            )
        except ValueError as e:
            raise type(e)(
                f"quantise_model: the `{attribute}` of the {type(layer).__name__} at "
                f"{_path_of(model, layer)}: {e}"
            ) from e
        changed.append(q)
        return eqx.tree_at(lambda x: getattr(x, attribute), layer, q)

    out = quax.map_selected(convert, model, filter=filter, where=where)
    if not changed:
        raise ValueError(
            f"quantise_model matched no layer with a floating-point `{attribute}` "
            f"(filter={filter!r}, where={where!r}): nothing was quantised."
        )
    if _logger.isEnabledFor(logging.INFO):
        _logger.info("quantise_model: %s", memory_report(out))
    return out
