"""Whole-model helpers: `quantise_model`, `memory_report` and `calibrate`."""

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import quax
from jaxtyping import PyTree

from ._matmul import recording_activations
from ._nnx import nnx_of, quantise_layers
from ._quantise import NF4_BLOCK, quantise
from ._value import QuantisedArray


__all__ = [
    "MemoryReport",
    "calibrate",
    "is_quantised",
    "memory_report",
    "quantise_model",
]

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
    bits: int | None = None,
    format: str = "int",
    axis: int | Sequence[int] | Literal["output"] | None = "output",
    group_size: int | None = None,
    block_size: int | None = None,
    double_quant: bool = False,
    symmetric: bool = True,
    filter: type | tuple[type, ...] | Callable[[Any], bool] | None = None,
    where: Callable[[PyTree], Any] | None = None,
    attribute: str | None = None,
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

    - `model`: any PyTree, usually an Equinox module; or a Flax NNX module
        (`nnx.Module`), see below.
    - `bits`, `format`, `double_quant`, `symmetric`, `straight_through`,
        `allow_materialise`, `matmul`: as for [`quax_quant.quantise`][]
        (`bits` 8 by default for `format="int"`). With `straight_through=True`,
        call it inside the differentiated loss for quantisation-aware training.
    - `axis`: the per-channel axis of each weight; by default `"output"`, the
        output channels: axis 0 of `eqx.nn.Linear` `(out, in)` and `eqx.nn.Conv`
        `(out, in, ...)`, the last axis of an NNX kernel `(in, out)`. `None` for
        one scale per weight. Ignored when `group_size` is given. An axis out of
        range for a weight raises, as NumPy does.
    - `group_size`: one scale per group of this many inputs (along the last axis
        of an Equinox weight, the first of an NNX kernel) and per output channel.
        Convolution kernels are always quantised per output channel.
        `block_size` is the same (bitsandbytes' name); for `format="nf4"` without
        either, blocks of 64.
    - `filter`: which layers: a layer type, a tuple of them, or a predicate on a
        layer. By default every `eqx.nn.Linear` and `eqx.nn.Conv` (every
        `nnx.Linear` and `nnx.Conv` of an NNX model). A matching layer's
        floating-point `weight` (see `attribute`) is quantised.
    - `where`: choose by path, as for `eqx.tree_at`: only layers inside the
        sub-tree(s) `where(model)` that match `filter`. By default the whole model.
    - `attribute`: the attribute of a matching object to quantise: by default
        `"weight"` (`"kernel"` on an NNX model). With `filter=quax_lora.is_lora,
        attribute="w"` it quantises the base weights of a LoRA model (QLoRA).

    **Flax NNX models.** An `nnx.Module` is split (`nnx.split`), the value of
    each selected layer's `kernel` (an `nnx.Param`) replaced by a
    `QuantisedArray` by its path in the state, and merged back (`nnx.merge`)
    into a new module; the model passed in is unchanged. An NNX kernel is
    `(in, out)` (`nnx.Conv`'s `(*window, in, out)`): it is quantised per output
    channel along its last axis, in groups along its first. For QLoRA, quantise
    first, then `quax_lora.loraify` the quantised model.

    **Returns:**

    A copy of `model` with the selected weights quantised.

    **Raises:**

    `ValueError` when no layer matched (a quantised model with nothing quantised is
    almost always a wrong `filter` or `where`), and where `quantise` refuses a
    weight (an `axis` out of range for it, a concrete weight holding a NaN or an
    infinity: a diverged model), naming the layer by its path in `model`.
    """
    changed = []
    nnx = nnx_of(model)
    name = attribute or ("weight" if nnx is None else "kernel")

    def convert(path: Callable[[], str], layer: Any, weight: Any) -> Any:
        if weight is None or not eqx.is_inexact_array(weight) or np.ndim(weight) < 1:
            return weight
        # The quantised convolution takes one scale per output channel.
        if nnx is None:
            conv = isinstance(layer, eqx.nn.Conv | eqx.nn.ConvTranspose)
            output, inputs = 0, -1  # (out, in, ...)
        else:
            conv = isinstance(layer, nnx.Conv | nnx.ConvTranspose)
            output, inputs = -1, 0  # (in, out), (*window, in, out)
        # Passed on as given, so that `quantise`'s errors name the argument.
        groups, blocks = None, None
        if conv:
            channels = output
        elif group_size is not None or block_size is not None:
            groups, blocks = group_size, block_size
            channels = None
        elif format == "nf4":
            blocks = NF4_BLOCK
            channels = None
        else:
            channels = output if axis == "output" else axis
        try:
            q = quantise(
                weight,
                bits=bits,
                format=format,
                axis=channels,
                group_size=groups,
                block_size=blocks,
                group_axis=inputs,
                double_quant=double_quant,
                symmetric=symmetric,
                straight_through=straight_through,
                allow_materialise=allow_materialise,
                matmul=matmul,
            )
        except ValueError as e:
            raise type(e)(
                f"quantise_model: the `{name}` of the {type(layer).__name__} at "
                f"{path()}: {e}"
            ) from e
        changed.append(q)
        return q

    if nnx is not None:
        out = quantise_layers(
            model,
            convert=convert,
            filter=(nnx.Linear, nnx.Conv) if filter is None else filter,
            where=where,
            attribute=name,
        )
    else:

        def replace(layer: Any) -> Any:
            weight = getattr(layer, name, None)
            q = convert(lambda: _path_of(model, layer), layer, weight)
            if q is weight:
                return layer
            return eqx.tree_at(lambda x: getattr(x, name), layer, q)

        out = quax.map_selected(
            replace,
            model,
            filter=(eqx.nn.Linear, eqx.nn.Conv) if filter is None else filter,
            where=where,
        )
    if not changed:
        raise ValueError(
            f"quantise_model matched no layer with a floating-point `{name}` "
            f"(filter={filter!r}, where={where!r}): nothing was quantised."
        )
    if _logger.isEnabledFor(logging.INFO):
        _logger.info("quantise_model: %s", memory_report(out))
    return out


def _calibrated(w: QuantisedArray) -> bool:
    """Whether `w` has a product that quantises activations: format `"int"` or
    float8, and a path other than `"weight_only"`."""
    return w.format != "nf4" and w.matmul != "weight_only"


def calibrate(
    model: PyTree,
    batches: Iterable[Any],
    *,
    apply: Callable[[PyTree, Any], Any] | None = None,
) -> PyTree:
    """Fix the activation scale of every quantised weight from sample inputs, so
    that its int8 x int8 (or float8 x float8) product quantises the activations
    with that one static scale instead of each row's absmax on every call.

    ```python
    qmodel = quax_quant.quantise_model(model, bits=8, matmul="int8")
    qmodel = quax_quant.calibrate(qmodel, batches, apply=lambda m, x: jax.vmap(m)(x))
    y = quax.quaxify(lambda m, x: jax.vmap(m)(x))(qmodel, x)  # static scales
    ```

    Runs `apply(model, batch)` for every batch inside [`quax.quaxify`][] (compiled
    once), with every product exact (weight-only) and recording the largest finite
    absolute activation each quantised weight meets; then sets each weight's
    `act_scale` to it over the largest level (127 for int8, the largest finite
    float8 number). At run time activations beyond the calibrated range saturate
    (are clipped to it); a row holding a NaN or an infinity still gives a NaN row.
    The path each product takes is unchanged (`matmul`; `"auto"` still takes the
    weight-only product below `WEIGHT_ONLY_MAX_ROWS` rows, which ignores the scale).

    **Arguments:**

    - `model`: a model holding [`quax_quant.QuantisedArray`][]s.
    - `batches`: an iterable of inputs, each passed to `apply`.
    - `apply`: `apply(model, batch)` runs the model; by default `model(batch)`. For
        an Equinox model of one example, `lambda m, x: jax.vmap(m)(x)`.

    **Returns:**

    A copy of `model` whose quantised weights of format `"int"` or float8 with a
    product path other than `"weight_only"` carry a float32 `act_scale`; NF4 and
    weight-only arrays are unchanged (their products quantise no activations).

    **Raises:**

    `ValueError` when `batches` is empty, when the model holds no array to
    calibrate, and when one of them met no product with a float operand in any
    batch (naming its path: an unused weight, or one whose product is not a
    `dot_general`), since its scale would be a guess.
    """
    run = apply if apply is not None else (lambda m, b: m(b))
    leaves, treedef = jtu.tree_flatten(model, is_leaf=is_quantised)
    paths = [
        jtu.keystr(p)
        for p, _ in jtu.tree_flatten_with_path(model, is_leaf=is_quantised)[0]
    ]
    targets = [
        i
        for i, leaf in enumerate(leaves)
        if isinstance(leaf, QuantisedArray) and _calibrated(leaf)
    ]
    if not targets:
        raise ValueError(
            "calibrate: the model holds no QuantisedArray whose product quantises "
            "activations (format 'int' or float8 with matmul other than "
            "'weight_only'); NF4 and weight-only arrays need no activation scale."
        )
    # Each target is marked by its number plus one as `act_scale` (positive, as
    # the constructor requires), which the products report back to `record`.
    marked = list(leaves)
    for k, i in enumerate(targets):
        marked[i] = dataclasses.replace(leaves[i], act_scale=jnp.float32(k + 1))
    seen: dict[int, float] = {}

    def record(marker: Any, absmax: Any) -> None:
        markers = np.ravel(np.asarray(marker))
        highs = np.ravel(np.broadcast_to(np.asarray(absmax), np.shape(marker)))
        for m, h in zip(markers, highs, strict=True):
            k = int(m) - 1
            seen[k] = max(seen.get(k, 0.0), float(h))

    @eqx.filter_jit
    def forward(model: PyTree, batch: Any) -> Any:
        # A new function per call, so that no compiled program of an earlier call
        # (with its `record`) is reused: the callback is traced in.
        return quax.quaxify(run)(model, batch)

    token = recording_activations.set(record)
    count = 0
    try:
        calibrating = jtu.tree_unflatten(treedef, marked)
        for batch in batches:
            jax.block_until_ready(forward(calibrating, batch))
            count += 1
        jax.effects_barrier()
    finally:
        recording_activations.reset(token)
    if not count:
        raise ValueError("calibrate: `batches` is empty; pass at least one input.")
    missing = [paths[i] for k, i in enumerate(targets) if k not in seen]
    if missing:
        raise ValueError(
            f"calibrate: the QuantisedArray(s) at {', '.join(missing)} met no "
            "product with a float operand in any batch: check `apply` runs the "
            "model on the batches, or quantise those weights with "
            "matmul='weight_only' (no activation scale)."
        )
    out = list(leaves)
    for k, i in enumerate(targets):
        w = leaves[i]
        top = 127.0 if w.format == "int" else float(jnp.finfo(w.format).max)
        high = seen[k]
        scale = np.float32(high / top if high > 0 else 1.0)
        out[i] = dataclasses.replace(w, act_scale=jnp.asarray(scale))
    return jtu.tree_unflatten(treedef, out)
