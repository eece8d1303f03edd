"""Whole-model helpers: `loraify`, `merge`, the trainable filter, parameter counts,
and saving/loading only the adapter."""

import dataclasses
import io
import itertools
import json
import math
import pathlib
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import equinox as eqx
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import quax
from jaxtyping import PRNGKeyArray, PyTree

from ._value import LoraArray, LoraWarning, MaterialisationError


__all__ = [
    "LegacyAdapterWarning",
    "ParameterCount",
    "adapter_filter",
    "count_parameters",
    "is_lora",
    "load_adapter",
    "loraify",
    "merge",
    "save_adapter",
    "trainable_filter",
]

_CONV = (eqx.nn.Conv, eqx.nn.ConvTranspose)


def is_lora(x: Any) -> bool:
    """Whether `x` is a [`quax_lora.LoraArray`][]; an `is_leaf` for tree maps."""
    return isinstance(x, LoraArray)


def loraify(
    model: PyTree,
    *,
    rank: int,
    scale: float = 0.01,
    alpha: float | None = None,
    allow_materialise: bool = False,
    stop_gradient: bool = True,
    filter: type | tuple[type, ...] | Callable[[Any], bool] = eqx.nn.Linear,
    where: Callable[[PyTree], Any] | None = None,
    key: PRNGKeyArray,
) -> PyTree:
    """Replace the weights of the layers of `model` with [`quax_lora.LoraArray`][]s.

    ```python
    mlp = eqx.nn.MLP(64, 10, 128, depth=2, key=key1)
    lora_mlp = quax_lora.loraify(mlp, rank=4, key=key2)
    y = quax.quaxify(lora_mlp)(x)
    ```

    Nothing else changes, so the model is called as before, inside
    [`quax.quaxify`][]. (It is not wrapped for you: quaxify whichever method or
    loss function you call.)

    **Arguments:**

    - `model`: any PyTree, usually an Equinox module.
    - `rank`, `scale`, `alpha`, `allow_materialise`, `stop_gradient`: as for
        [`quax_lora.LoraArray`][]. A layer whose `(n, m)` matrices are smaller than
        `rank` (say a head with one output) is adapted with rank `min(n, m)`, the
        most it can use, and the same scale `alpha / rank` as the other layers.
    - `filter`: which layers to adapt: a layer type, a tuple of them, or a predicate
        on a layer. By default every `eqx.nn.Linear`. A matching layer's `weight` is
        adapted; for `eqx.nn.Conv` and `eqx.nn.ConvTranspose` the kernel is adapted
        along its output channels (`batch_ndim=0`), as peft does.
        A `weight` may be a `quax.ArrayValue` (say after
        `quax_quant.quantise_model`, for QLoRA): it becomes the `LoraArray`'s
        `w` as it is, read by its shape, never densified.
    - `where`: choose by path, as for `eqx.tree_at`: a function from `model` to the
        sub-tree (or tuple of sub-trees) to adapt, e.g.
        `where=lambda m: (m.query_proj, m.value_proj)`. Only layers inside it that
        match `filter` are adapted. By default the whole model.
    - `key`: a `jax.random` key; each layer gets its own.

    **Returns:**

    A copy of `model` with the selected weights replaced.

    **Raises:**

    `ValueError` when no layer matches: nothing selected by `where` matches
    `filter`, or no matching layer has a `weight` array of at least 2 axes. (A
    model whose matching weights already are `LoraArray`s is returned unchanged.)
    """
    counter = itertools.count()
    matched: list[Any] = []  # layers `filter` selects
    adapted: list[Any] = []  # their weights, adapted now or before

    def adapt(layer: Any) -> Any:
        matched.append(layer)
        weight = getattr(layer, "weight", None)
        if isinstance(weight, LoraArray):
            adapted.append(weight)
            return layer
        if weight is None:
            return layer
        # A `quax.ArrayValue` weight (say a quantised one) is read, never densified.
        if isinstance(weight, quax.ArrayValue):
            shape = weight.shape
        else:
            shape = np.shape(weight)
        if len(shape) < 2:
            return layer
        adapted.append(weight)
        batch_ndim = 0 if isinstance(layer, _CONV) else len(shape) - 2
        # A layer whose matrices are smaller than `rank` (a 1-output head) gets
        # the largest rank it can use, with the same scale `alpha / rank`.
        layer_rank = max(
            1, min(rank, shape[batch_ndim], math.prod(shape[batch_ndim + 1 :]))
        )
        lora = LoraArray(
            weight,
            rank=layer_rank,
            scale=scale,
            alpha=None if alpha is None else alpha * layer_rank / rank,
            allow_materialise=allow_materialise,
            stop_gradient=stop_gradient,
            batch_ndim=batch_ndim,
            key=jr.fold_in(key, next(counter)),
        )
        return eqx.tree_at(lambda x: x.weight, layer, lora)

    out = quax.map_selected(adapt, model, filter=filter, where=where)
    if not adapted:
        raise ValueError(_no_match_message(model, filter, where, matched))
    return out


def _describe(x: Any) -> str:
    if isinstance(x, type):
        return x.__qualname__
    if isinstance(x, tuple):
        return "(" + ", ".join(map(_describe, x)) + ")"
    code = getattr(x, "__code__", None)
    name = getattr(x, "__qualname__", None) or repr(x)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code else name


def _no_match_message(model: Any, filter: Any, where: Any, matched: list[Any]) -> str:
    scope = (
        "the model" if where is None else f"the part where={_describe(where)} selects"
    )
    layers = sorted({type(x).__qualname__ for x in matched})
    if layers:
        found = (
            f"it matched {len(matched)} layer(s) ({', '.join(layers)}), but none has a "
            "`weight` array with at least 2 axes"
        )
    else:
        found = "it matched no layer there"
    return (
        f"loraify adapted nothing in {scope} (a {type(model).__qualname__}) with "
        f"filter={_describe(filter)}: {found}. Pass filter= the layer type(s) "
        "whose `weight` to adapt (eqx.nn.Linear, eqx.nn.Conv, ...; a layer such as "
        "eqx.nn.GRUCell has no `weight`), and a where= that selects layers (or "
        "sub-models) rather than their arrays."
    )


def merge(model: PyTree) -> PyTree:
    """Replace every [`quax_lora.LoraArray`][] in `model` by the dense weight
    `w + s * a @ b`, in the dtype of `w`: a plain model for inference or export,
    which needs no `quax.quaxify`.

    **Arguments:**

    - `model`: a PyTree containing `LoraArray`s.

    **Returns:**

    A copy of `model` with dense weights.

    **Raises:**

    A [`quax_lora.MaterialisationError`][] (a `RuntimeError`) when a `w` is a
    `quax.ArrayValue` (a quantised base weight, for QLoRA) that refuses to be
    densified: the dense sum needs it densified. Allow it on that value first
    (e.g. `.enable_materialise()`, or `allow_materialise=True` where it was made),
    or keep the model unmerged and call it inside `quax.quaxify`.
    """

    def dense(x: Any) -> Any:
        if not isinstance(x, LoraArray):
            return x
        w = x.w
        if isinstance(w, quax.Value):
            try:
                w = w.materialise()
            except RuntimeError as e:
                raise MaterialisationError(
                    f"quax_lora.merge cannot form w + s * a @ b for a LoraArray of "
                    f"shape {x.shape} whose base weight w is a "
                    f"{type(x.w).__qualname__} that cannot be densified: {e} Allow "
                    "the base weight to materialise first (e.g. .enable_materialise() "
                    "on it, or allow_materialise=True where it was made), or keep the "
                    "model unmerged and call it inside quax.quaxify."
                ) from e
        return (w + x.delta()).astype(x.w.dtype)

    return jtu.tree_map(dense, model, is_leaf=is_lora)


def _spec(model: PyTree, train_weights: bool) -> PyTree:
    def leaf(x: Any) -> Any:
        if isinstance(x, LoraArray):
            w = train_weights and not x.stop_gradient
            return eqx.tree_at(lambda y: (y.w, y.a, y.b), x, (w, True, True))
        return False

    return jtu.tree_map(leaf, model, is_leaf=is_lora)


def trainable_filter(model: PyTree) -> PyTree:
    """A filter spec marking what fine-tuning trains: the `a` and `b` of every
    [`quax_lora.LoraArray`][] (and `w` when it was made with `stop_gradient=False`);
    everything else is frozen.

    ```python
    spec = quax_lora.trainable_filter(model)
    params, frozen = eqx.partition(model, spec)
    opt_state = optimiser.init(params)
    # in the loss: model = eqx.combine(params, frozen)
    ```

    **Arguments:**

    - `model`: a PyTree containing `LoraArray`s.

    **Returns:**

    A PyTree of bools with the structure of `model`, for `eqx.partition`,
    `eqx.filter_grad`-style filtering or an optax mask.
    """
    return _spec(model, train_weights=True)


def adapter_filter(model: PyTree) -> PyTree:
    """A filter spec marking the adapter only: the `a` and `b` of every
    [`quax_lora.LoraArray`][]. What [`quax_lora.save_adapter`][] saves.

    **Arguments:**

    - `model`: a PyTree containing `LoraArray`s.

    **Returns:**

    A PyTree of bools with the structure of `model`.
    """
    return _spec(model, train_weights=False)


@dataclasses.dataclass(frozen=True)
class ParameterCount:
    """How many parameters a model has and how many fine-tuning trains.

    **Fields:**

    - `trainable`: elements of the arrays [`quax_lora.trainable_filter`][] selects.
    - `total`: elements of every floating-point array in the model.
    """

    trainable: int
    total: int

    @property
    def fraction(self) -> float:
        """`trainable / total`."""
        return self.trainable / self.total if self.total else 0.0

    def __str__(self) -> str:
        return (
            f"trainable params: {self.trainable:,} || all params: {self.total:,} || "
            f"trainable%: {100 * self.fraction:.4f}"
        )


def count_parameters(model: PyTree) -> ParameterCount:
    """Count the parameters of a LoRA model, like peft's
    `print_trainable_parameters`: `print(quax_lora.count_parameters(model))`.

    Counted are the elements of every floating-point array, and of every
    floating-point `quax.ArrayValue` other than a `LoraArray` by the size of its
    `shape` (not of its leaves): a quantised base weight counts as the weights it
    stands for, not as its scales. Such a value is frozen (as a `LoraArray`'s
    base weight unless made with `stop_gradient=False`); the trainable ones are
    those [`quax_lora.trainable_filter`][] selects.

    **Arguments:**

    - `model`: a PyTree containing `LoraArray`s.

    **Returns:**

    A [`quax_lora.ParameterCount`][].
    """
    # What `trainable_filter` selects: `a`, `b`, and `w` unless it is frozen.
    loras = [x for x in jtu.tree_leaves(model, is_leaf=is_lora) if is_lora(x)]
    trainable = [(x.a, x.b) if x.stop_gradient else (x.w, x.a, x.b) for x in loras]
    return ParameterCount(trainable=_size(trainable), total=_size(model))


def _is_base_value(x: Any) -> bool:
    return isinstance(x, quax.ArrayValue) and not isinstance(x, LoraArray)


def _size(tree: PyTree) -> int:
    """Elements of the floating-point arrays and values (by shape) in `tree`."""
    total = 0
    for x in jtu.tree_leaves(tree, is_leaf=_is_base_value):
        if _is_base_value(x):
            # One whose leaves were all filtered out (`eqx.partition`) counts 0.
            if jtu.tree_leaves(x) and np.issubdtype(x.dtype, np.inexact):
                total += math.prod(x.shape)
        elif eqx.is_inexact_array(x):
            total += int(np.size(x))
    return total


class LegacyAdapterWarning(LoraWarning):
    """An adapter file in the format of earlier quax-lora versions, which saved `a`
    and `b` without the settings that reproduce the outputs: loading it checks the
    shapes (so the ranks) but cannot check `alpha`."""


# An adapter file: this line, the length of the header (8 bytes, little-endian),
# the header (JSON: the settings of every adapted layer), then the leaves `a` and
# `b` as `eqx.tree_serialise_leaves` writes them. Files of earlier versions hold
# the leaves alone, and start as a NumPy array does (`\x93NUMPY`).
_MAGIC = b"quax-lora adapter\n"
_FORMAT_VERSION = 2
# The settings of a layer that must agree between the file and the model, in the
# order they are checked and named.
_SETTINGS = ("shape", "dtype", "batch_ndim", "rank", "scaling", "stop_gradient")
# How many differences a refusal to load names (a model of many layers loraified
# with another alpha differs at every layer).
_PROBLEMS_SHOWN = 4


def _layers(model: PyTree) -> Iterator[tuple[str, LoraArray]]:
    """(path, array) of every `LoraArray` of `model`, in the order of its leaves;
    the path as `jax.tree_util.keystr` writes it (`.layers[0].weight`)."""
    for path, x in jtu.tree_flatten_with_path(model, is_leaf=is_lora)[0]:
        if isinstance(x, LoraArray):
            yield jtu.keystr(path), x


def _settings(lora: LoraArray) -> dict[str, Any]:
    """What reproduces a layer's outputs from its `a` and `b`: the weight's shape
    and dtype, the layout, the rank, `alpha` and the scaling `alpha / rank`, and
    whether `w` is frozen (which decides what fine-tuning trains)."""
    return {
        "shape": list(lora.shape),
        "dtype": str(lora.dtype),
        "batch_ndim": lora.batch_ndim,
        "rank": lora.rank,
        "alpha": lora.alpha,
        "scaling": lora.scaling,
        "stop_gradient": lora.stop_gradient,
    }


def _differs(key: str, saved: Any, current: Any) -> bool:
    if key == "scaling":  # alpha / rank, computed alike on both sides
        return not math.isclose(saved, current, rel_tol=1e-12)
    return saved != current


def _describe_setting(key: str, settings: dict[str, Any]) -> str:
    if key == "scaling":
        return (
            f"alpha={settings['alpha']!r} (scaling alpha / rank = "
            f"{settings['scaling']!r})"
        )
    value = settings[key]
    return f"{key}={tuple(value) if key == 'shape' else value!r}"


def _check_settings(saved: dict[str, dict[str, Any]], model: PyTree) -> None:
    """Raise a `ValueError` naming every layer whose settings in `model` differ
    from those `saved` (by path), and the layers only one of them has."""
    current = {path: _settings(x) for path, x in _layers(model)}
    problems = []
    missing = [p for p in saved if p not in current]
    extra = [p for p in current if p not in saved]
    if missing:
        problems.append(
            f"the file has adapters for {', '.join(f'`{p}`' for p in missing)}, "
            "which the model does not adapt"
        )
    if extra:
        problems.append(
            f"the model adapts {', '.join(f'`{p}`' for p in extra)}, for which the "
            "file has no adapter"
        )
    for path, settings in saved.items():
        if path not in current:
            continue
        for key in _SETTINGS:
            if _differs(key, settings[key], current[path][key]):
                problems.append(
                    f"layer `{path}` was saved with "
                    f"{_describe_setting(key, settings)}, and the model's has "
                    f"{_describe_setting(key, current[path])}"
                )
    if len(problems) > _PROBLEMS_SHOWN:
        hidden = len(problems) - _PROBLEMS_SHOWN
        problems = [*problems[:_PROBLEMS_SHOWN], f"and {hidden} more difference(s)"]
    if problems:
        raise ValueError(
            "quax_lora.load_adapter: the adapter was saved from a model loraified "
            "otherwise than this one, so its outputs would differ: "
            + "; ".join(problems)
            + ". Loraify the model as the adapter's was (the same layers, with "
            "loraify's filter= and where=, and the same rank=, alpha= and "
            "stop_gradient=), then load it."
        )


def _with_suffix(path: str | pathlib.Path) -> pathlib.Path:
    # As `eqx.tree_serialise_leaves` names files, so that the same path works for
    # the files earlier versions wrote.
    path = pathlib.Path(path)
    return path.with_suffix(".eqx") if path.suffix == "" else path


@contextmanager
def _open(path_or_file: str | pathlib.Path | BinaryIO, mode: str) -> Iterator[Any]:
    if isinstance(path_or_file, str | pathlib.Path):
        with open(_with_suffix(path_or_file), mode) as f:
            yield f
    else:
        yield path_or_file


def save_adapter(path_or_file: str | pathlib.Path | BinaryIO, model: PyTree) -> None:
    """Save only the adapter (`a` and `b` of every [`quax_lora.LoraArray`][]) of
    `model`: a few megabytes, not the base model.

    The file also records, for every adapted layer by its path in `model`, the
    settings that reproduce its outputs from `a` and `b`: the weight's shape and
    dtype, `batch_ndim`, `rank`, `alpha` and the scaling `alpha / rank`, and
    `stop_gradient`. [`quax_lora.load_adapter`][] checks them. (The initial
    `scale` of `a` is not recorded: the file replaces `a`.)

    **Arguments:**

    - `path_or_file`: a file name (without a suffix, `.eqx` is added, as
        `eqx.tree_serialise_leaves` does) or a binary file object.
    - `model`: a PyTree containing `LoraArray`s.

    **Returns:**

    Nothing.
    """
    header = json.dumps(
        {
            "version": _FORMAT_VERSION,
            "layers": {path: _settings(x) for path, x in _layers(model)},
        }
    ).encode()
    with _open(path_or_file, "wb") as f:
        f.write(_MAGIC)
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        eqx.tree_serialise_leaves(f, eqx.filter(model, adapter_filter(model)))


def _read_header(f: BinaryIO) -> tuple[dict[str, Any] | None, BinaryIO]:
    """The header of an adapter file (`None` for a file of an earlier version,
    which has none), and the file positioned at its leaves."""
    if not f.seekable():
        # A stream (a pipe, a socket): NumPy's reader of the leaves seeks.
        f = io.BytesIO(f.read())
    start = f.read(len(_MAGIC))
    if start != _MAGIC:
        f.seek(-len(start), io.SEEK_CUR)
        return None, f
    length = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(length).decode())
    if header.get("version") != _FORMAT_VERSION:
        raise ValueError(
            f"quax_lora.load_adapter: the file is an adapter of format version "
            f"{header.get('version')!r}, and this quax-lora reads version "
            f"{_FORMAT_VERSION}. Load it with the quax-lora that wrote it."
        )
    return header, f


def load_adapter(path_or_file: str | pathlib.Path | BinaryIO, model: PyTree) -> PyTree:
    """Load an adapter saved by [`quax_lora.save_adapter`][] into `model`, which
    must be loraified the same way: the same layers, and for each the same shape,
    dtype, rank, `alpha` (so the same scaling `alpha / rank`), layout and
    `stop_gradient`.

    ```python
    base = quax_lora.loraify(pretrained, rank=8, alpha=16.0, key=key)
    tuned = quax_lora.load_adapter("adapter.eqx", base)
    ```

    A file in the format of earlier versions (`a` and `b` alone) records no
    settings: it loads, with a
    [`quax_lora.LegacyAdapterWarning`][], and only the shapes of `a` and `b` (so
    the ranks) are checked. Its `alpha` cannot be: the outputs are right only if
    `model` has the adapter's `alpha`. Save it again to record them.

    **Arguments:**

    - `path_or_file`: a file name (without a suffix, `.eqx` is added) or a binary
        file object.
    - `model`: the loraified model to load into; its `w` and other leaves are kept.

    **Returns:**

    A copy of `model` with the loaded `a` and `b`.

    **Raises:**

    `ValueError` when a setting of `model` differs from the file's, naming the
    layer (by its path) and the setting, or when the file and `model` adapt
    different layers.
    """
    spec = adapter_filter(model)
    adapter, rest = eqx.partition(model, spec)
    with _open(path_or_file, "rb") as f:
        header, f = _read_header(f)
        if header is None:
            layers = dict(_layers(model))
            scalings = sorted({repr(x.scaling) for x in layers.values()})
            warnings.warn(
                "quax_lora.load_adapter: the file is in the format of earlier "
                "quax-lora versions, which did not record the adapter's settings "
                "(rank, alpha, scaling, layers). The shapes of "
                "`a` and `b` (so the ranks) are checked, but alpha cannot be: the "
                "outputs are right only if the adapter was trained with this "
                f"model's alpha (scaling alpha / rank: {', '.join(scalings)} over "
                f"{len(layers)} layer(s)). Save it again with "
                "quax_lora.save_adapter to record its settings.",
                LegacyAdapterWarning,
                stacklevel=2,
            )
        else:
            _check_settings(header["layers"], model)
        loaded = eqx.tree_deserialise_leaves(f, adapter)
    return eqx.combine(loaded, rest)
