"""Whole-model helpers: `loraify`, `merge`, the trainable filter, parameter counts,
and saving/loading only the adapter."""

import dataclasses
import io
import itertools
import json
import math
import pathlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import quax
from jax.core import Tracer
from jaxtyping import DTypeLike, PRNGKeyArray, PyTree

from ._init_base_changing import apply_init, check_init
from ._nnx import (
    adapt_layers,
    adapters_of,
    layer_name,
    nnx_of,
    peft_kinds,
    replace_kernels,
    update_kernels,
    weights_of,
)
from ._peft import (
    CONFIG_NAME,
    CONV,
    EMBEDDING,
    LINEAR,
    _is_int,
    _is_number,
    _json_kind,
    corrupt,
    file_label,
    module_name,
    narrowing_error,
    narrows,
    read_json_header,
    read_peft,
    refused_dtype,
    summarise,
    write_peft,
)
from ._value import LoraArray, LoraMaterialisationError, LoraWarning


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
    "unmerge",
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
    filter: type | tuple[type, ...] | Callable[[Any], bool] | None = None,
    where: Callable[[PyTree], Any] | None = None,
    variant: str = "lora",
    dropout: float = 0.0,
    adapter_dtype: DTypeLike | None = None,
    init: str | None = None,
    loftq_bits: int = 4,
    loftq_iters: int = 1,
    loftq_format: str | None = None,
    loftq_quantiser: Callable[[Any], Any] | None = None,
    loftq_base: PyTree | None = None,
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

    - `model`: any PyTree, usually an Equinox module; or a Flax NNX module
        (`nnx.Module`), see below.
    - `rank`, `scale`, `alpha`, `allow_materialise`, `stop_gradient`, `variant`
        (`"lora"`, `"rslora"` or `"dora"`), `dropout`, `adapter_dtype` (say
        `jnp.float32` for a bfloat16 model, as peft does): as for
        [`quax_lora.LoraArray`][]. A layer whose `(n, m)` matrices are smaller than
        `rank` (say a head with one output) is adapted with rank `min(n, m)`, the
        most it can use, and the same scaling (`alpha / rank`, or
        `alpha / sqrt(rank)` for rsLoRA) as the other layers.
    - `filter`: which layers to adapt: a layer type, a tuple of them, or a predicate
        on a layer. By default every `eqx.nn.Linear` (every `nnx.Linear` of a Flax
        NNX model). A matching layer's `weight` is
        adapted; for `eqx.nn.Conv` and `eqx.nn.ConvTranspose` the kernel is adapted
        along its output channels (`batch_ndim=0`), as peft does; pass
        `eqx.nn.Embedding` to adapt embeddings (`w[i] + s a[i] b`, a gather of
        `a`'s rows; not with DoRA).
        A `weight` may be a `quax.ArrayValue` (say after
        `quax_quant.quantise_model`, for QLoRA): it becomes the `LoraArray`'s
        `w` as it is, read by its shape, never densified.
    - `where`: choose by path, as for `eqx.tree_at`: a function from `model` to the
        sub-tree (or tuple of sub-trees) to adapt, e.g.
        `where=lambda m: (m.query_proj, m.value_proj)`. Only layers inside it that
        match `filter` are adapted. By default the whole model.
    - `init`: how the adapter starts. `None` (the default): `b = 0` and `a`
        drawn from `Normal(0, scale^2)`, so the model computes what it did, on
        its base weights unchanged. Or one of peft's initialisations that change
        the base weight `w` (peft's `init_lora_weights`), computed once here on
        the dense weight laid out as torch's `(out, in)` (a Flax NNX kernel
        transposed), in float32:
        - `"pissa"`: `s B A` is the rank-`rank` truncated SVD `U_r S_r V_r^T`
          (`B = U_r sqrt(S_r / s)`, `A = sqrt(S_r / s) V_r^T`; peft's `lora_B`
          is our `a`, its `lora_A` our `b`), and `w` becomes the residual
          `w - s B A`. `"pissa_niter_<k>"`: the same from a randomised SVD
          with `k` power iterations (`torch.svd_lowrank`'s algorithm; faster
          for large matrices, and the residual is still exact).
        - `"olora"`: `B` and `A` the first `rank` columns of `Q` and rows of
          `R` of `w = Q R`, and `w` becomes `w - s B A`.
        - `"loftq"`: `w` becomes its quantisation `Q`, and `s B A` the rank-`rank`
          SVD of `W - Q`, alternated `loftq_iters` times (`Q` of `W - s B A`),
          so that `Q + s B A` is closer to the original `W` than `Q` alone.
          `loftq_bits=4` quantises to NF4 (blocks of 64, as bitsandbytes;
          `loftq_format="int"` for int4 in the same blocks), `loftq_bits=8` to
          int8 per row; `w` is then the dequantised `Q` in `w`'s dtype, as peft
          stores it. `loftq_quantiser=` a function from a weight (the layer's
          shape and dtype) to its quantisation (an array, or a value with
          `.dequantise()`, say `lambda w: quax_quant.quantise(w,
          format="nf4")`) replaces it, and what it returns is the base (QLoRA).
        The changed base is part of the model: save it with the model (the
        adapter alone applies to it only). Embeddings and DoRA are refused.
    - `loftq_bits`, `loftq_iters`, `loftq_format`, `loftq_quantiser`: LoftQ's
        settings, above (peft's `loftq_config`: `loftq_bits`, `loftq_iter`).
    - `loftq_base`: for `init="loftq"` on a model already quantised, say by
        `quax_quant.gptq(model, ...)`: that quantised model, of which `model` is
        the float original. Each selected layer's weight in `loftq_base` (an
        array, or a value with `.dequantise()`) becomes its base `Q` as it is,
        and `s B A` the rank-`rank` SVD of `W - Q`: LoftQ's step with that
        quantisation, which is not run again (`loftq_iters` must be 1;
        `loftq_quantiser` not given). Everything else in `loftq_base` must
        equal `model` (a `ValueError` names the first difference): a
        quantisation that also changes other layers, as AWQ folds its scales
        into the operations before, is refused, since the float weights it
        approximates are not `model`'s. Equinox models only, called on concrete
        models (not under `jax.jit`: traced leaves cannot be compared).
    - `key`: a `jax.random` key; each layer gets its own.

    **Flax NNX models.** An `nnx.Module` is copied (`nnx.clone`; the model passed
    in is unchanged), and each selected layer's `kernel` (or `embedding`)
    replaced by a LoRA kernel: an `nnx.Module` holding `w` as an `nnx.Param` and
    `a` and `b` as `nnx.LoRAParam`s, which the layer reads (`kernel[...]`) as the
    `LoraArray`, and which JAX sees as that `LoraArray`. NNX's filters then pick
    the adapter: `nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)`,
    `nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))`. By default
    `filter` selects every `nnx.Linear`; pass
    `nnx.Embed` for embeddings (`w[i] + s a[i] b`, a gather), `nnx.Conv` (or
    `nnx.ConvTranspose`) for convolutions and `nnx.LinearGeneral` for the
    projections of `nnx.MultiHeadAttention`. An NNX kernel is used as
    `x @ kernel`, its input axes first, so its rows are its input axes
    (`LoraArray`'s `row_ndim`): a `Linear` kernel `(in, out)` has `a` of shape
    `(in, rank)` and `b` `(rank, out)`; the query, key and value `(in, heads,
    head_dim)` are adapted as `in x (heads * head_dim)`, the output projection
    `(heads, head_dim, out)` as `(heads * head_dim) x out`; a convolution kernel
    `(*window, in, out)` as `(window * in) x out`, as peft factors a
    convolution (`a` a kernel with `rank` outputs, `b` a 1x1 one). `b = 0` at
    first. Not on NNX: grouped convolutions (`feature_group_count > 1`) and DoRA
    (which normalises the outputs, the columns of an NNX kernel); each raises a
    `ValueError` naming the layer.

    **Returns:**

    A copy of `model` with the selected weights replaced.

    **Raises:**

    `ValueError` when no layer matches: nothing selected by `where` matches
    `filter`, or no matching layer has a `weight` array of at least 2 axes. (A
    model whose matching weights already are `LoraArray`s is returned unchanged.)
    Also for an `init=` or LoftQ setting it does not know, and for a
    `loftq_base` that is not `model` quantised (see above).
    """
    check_init(init, loftq_bits, loftq_iters, loftq_format)
    nnx = nnx_of(model)
    if loftq_base is not None:
        _check_loftq_base(init, loftq_iters, loftq_quantiser, nnx)
    counter = itertools.count()
    matched: list[Any] = []  # layers `filter` selects
    adapted: list[Any] = []  # their weights, adapted now or before

    def adapt_weight(
        weight: Any,
        *,
        embedding: bool,
        batch_ndim: int | None,
        row_ndim: int = 1,
        base: Any = None,
    ) -> Any:
        """The `LoraArray` of a selected layer's `weight` (`batch_ndim` of its
        leading axes batch axes, by default all but two; its rows the `row_ndim`
        axes after them), or `weight` itself where there is nothing to adapt.
        `base`: the layer's weight in `loftq_base`, if given."""
        if isinstance(weight, LoraArray):
            adapted.append(weight)
            return weight
        if weight is None:
            return weight
        # A `quax.ArrayValue` weight (say a quantised one) is read, never densified.
        if isinstance(weight, quax.ArrayValue):
            shape = weight.shape
        else:
            shape = np.shape(weight)
        if len(shape) < 2:
            return weight
        if init is not None and (embedding or variant == "dora"):
            raise ValueError(
                f"loraify(init={init!r}) does not adapt "
                + ("embeddings" if embedding else "with variant='dora'")
                + ": peft's base-changing initialisations are for the matrices "
                "of linear (and convolution) layers, and DoRA's magnitude would "
                "be taken from the changed base. Leave them out of filter=, or "
                "use init=None."
            )
        if variant == "dora" and embedding:
            raise ValueError(
                "loraify(variant='dora') does not adapt embeddings (eqx.nn.Embedding, "
                "nnx.Embed: DoRA normalises the rows of a weight that is "
                "multiplied; an embedding's rows are gathered). Leave them out of "
                "filter=, or use variant='lora' or 'rslora'."
            )
        adapted.append(weight)
        if batch_ndim is None:
            batch_ndim = len(shape) - 2
        # A layer whose matrices are smaller than `rank` (a 1-output head) gets
        # the largest rank it can use, with the same scale `alpha / rank`.
        split = batch_ndim + row_ndim
        layer_rank = max(
            1,
            min(rank, math.prod(shape[batch_ndim:split]), math.prod(shape[split:])),
        )
        # The same scaling for every layer: alpha / rank (alpha / sqrt(rank)).
        ratio = layer_rank / rank
        if alpha is None:
            layer_alpha = None
        elif variant == "rslora":
            layer_alpha = alpha * math.sqrt(ratio)
        else:
            layer_alpha = alpha * ratio
        layer_key = jr.fold_in(key, next(counter))
        lora = LoraArray(
            weight,
            rank=layer_rank,
            scale=scale,
            alpha=layer_alpha,
            allow_materialise=allow_materialise,
            stop_gradient=stop_gradient,
            batch_ndim=batch_ndim,
            row_ndim=row_ndim,
            variant=variant,
            dropout=dropout,
            adapter_dtype=adapter_dtype,
            key=layer_key,
        )
        if init is None:
            return lora
        return apply_init(
            lora,
            init,
            transposed=nnx is not None,
            key=jr.fold_in(layer_key, 1),
            loftq_bits=loftq_bits,
            loftq_iters=loftq_iters,
            loftq_format=loftq_format,
            # A given base is LoftQ's quantisation of `weight` (one step).
            loftq_quantiser=loftq_quantiser if base is None else lambda _: base,
        )

    if nnx is not None:
        selection = nnx.Linear if filter is None else filter
        out = adapt_layers(
            model,
            adapt=adapt_weight,
            matched=matched,
            filter=selection,
            where=where,
            variant=variant,
        )
        if not adapted:
            raise ValueError(_no_match_message(model, selection, where, matched))
        return out
    selection = eqx.nn.Linear if filter is None else filter
    bases = (
        None
        if loftq_base is None
        else _loftq_bases(model, loftq_base, selection, where)
    )

    def adapt(layer: Any) -> Any:
        matched.append(layer)
        weight = getattr(layer, "weight", None)
        new = adapt_weight(
            weight,
            embedding=isinstance(layer, eqx.nn.Embedding),
            batch_ndim=0 if isinstance(layer, _CONV) else None,
            base=None if bases is None else bases[len(matched) - 1],
        )
        return layer if new is weight else eqx.tree_at(lambda x: x.weight, layer, new)

    out = quax.map_selected(adapt, model, filter=selection, where=where)
    if not adapted:
        raise ValueError(_no_match_message(model, selection, where, matched))
    return out


def _check_loftq_base(
    init: str | None, loftq_iters: int, loftq_quantiser: Any, nnx: Any
) -> None:
    """Raise a `ValueError` naming the argument when `loftq_base` is given with
    settings it excludes."""
    problem = None
    if init != "loftq":
        problem = f"it is the base of init='loftq', and init={init!r}"
    elif loftq_quantiser is not None:
        problem = "loftq_quantiser= is given too: give one of them"
    elif loftq_iters != 1:
        problem = (
            f"loftq_iters={loftq_iters}: a given base is not quantised again, so "
            "LoftQ runs one step (loftq_iters=1); for more, pass loftq_quantiser= "
            "a function quantising any weight"
        )
    elif nnx is not None:
        problem = (
            "the model is a Flax NNX module, and loftq_base= takes Equinox models "
            "(pass loftq_quantiser= instead)"
        )
    if problem is not None:
        raise ValueError(f"loraify(loftq_base=...): {problem}.")


def _loftq_bases(
    model: PyTree, loftq_base: PyTree, filter: Any, where: Any
) -> list[Any]:
    """The `weight` of each layer of `loftq_base` that `filter` and `where`
    select (`None` where it has none), in the order `loraify` visits `model`'s;
    a `ValueError` naming the first difference where `loftq_base` differs from
    `model` elsewhere than in those weights, or where a weight's shape differs."""

    def without_weights(tree: PyTree) -> tuple[PyTree, list[Any]]:
        weights: list[Any] = []

        def take(layer: Any) -> Any:
            weight = getattr(layer, "weight", None)
            weights.append(weight)
            if weight is None:
                return layer
            return eqx.tree_at(lambda layer: layer.weight, layer, None)

        return quax.map_selected(take, tree, filter=filter, where=where), weights

    rest, weights = without_weights(model)
    base_rest, bases = without_weights(loftq_base)
    leaves, tree = jtu.tree_flatten_with_path(rest)
    base_leaves, base_tree = jtu.tree_flatten_with_path(base_rest)
    problem = None
    if tree != base_tree or len(weights) != len(bases):
        problem = (
            "it is not the same model: its structure outside the selected "
            "layers' weights, or the layers selected, differ"
        )
    else:
        for (path, x), (_, y) in zip(leaves, base_leaves, strict=True):
            if x is not y and (isinstance(x, Tracer) or isinstance(y, Tracer)):
                raise ValueError(
                    "loraify(loftq_base=...) compares loftq_base with the model, "
                    f"leaf by leaf, and their leaves at {jtu.keystr(path)} are "
                    "traced (under jax.jit or another transform): call loraify "
                    "outside it, on concrete models."
                )
            same = x is y or (
                eqx.is_array(x)
                and eqx.is_array(y)
                and np.shape(x) == np.shape(y)
                and bool(np.array_equal(x, y))
            )
            if not same:
                problem = (
                    f"its leaf at {jtu.keystr(path)} differs from the model's (a "
                    "quantisation that changes more than the selected weights, "
                    "as AWQ's folded scales do, approximates other float weights "
                    "than the model's)"
                )
                break
    pairs = [] if problem is not None else zip(weights, bases, strict=True)
    for k, (weight, base) in enumerate(pairs):
        if weight is not None and np.shape(base) != np.shape(weight):
            shape = "no weight" if base is None else f"shape {np.shape(base)}"
            problem = (
                f"its selected layer {k} has {shape} where the model's weight has "
                f"shape {np.shape(weight)}"
            )
            break
    if problem is not None:
        raise ValueError(
            "loraify(loftq_base=...) takes the model quantised, with only the "
            f"selected layers' weights changed, and {problem}."
        )
    return bases


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
        "eqx.nn.GRUCell has no `weight`; for a Flax NNX model nnx.Linear, nnx.Embed, "
        "nnx.Conv or nnx.LinearGeneral, whose `kernel` or `embedding` is adapted), "
        "and a "
        "where= that selects layers (or sub-models) rather than their arrays."
    )


def merge(model: PyTree) -> PyTree:
    """Replace every [`quax_lora.LoraArray`][] in `model` by the dense weight
    `w + s * a @ b` (for DoRA, its rows scaled to `magnitude`; for stacked
    adapters, of the one selected), in the dtype of `w`: a plain model for
    inference or export, which needs no `quax.quaxify`.

    **Arguments:**

    - `model`: a PyTree containing `LoraArray`s, or a Flax NNX module (a new
        one is returned, with the dense weights in its `nnx.Param`s).

    **Returns:**

    A copy of `model` with dense weights.

    **Raises:**

    A [`quax_lora.LoraMaterialisationError`][] (a `RuntimeError`) when a `w` is a
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
                raise LoraMaterialisationError(
                    f"quax_lora.merge cannot form w + s * a @ b for a LoraArray of "
                    f"shape {x.shape} whose base weight w is a "
                    f"{type(x.w).__qualname__} that cannot be densified: {e} Allow "
                    "the base weight to materialise first (e.g. .enable_materialise() "
                    "on it, or allow_materialise=True where it was made), or keep the "
                    "model unmerged and call it inside quax.quaxify."
                ) from e
        return x.dense_from(w)

    if nnx_of(model) is not None:
        return replace_kernels(model, lambda _, lora: dense(lora))
    return jtu.tree_map(dense, model, is_leaf=is_lora)


def unmerge(merged: PyTree, model: PyTree) -> PyTree:
    """Undo [`quax_lora.merge`][]: take the base weights back out of a merged model,
    `w = merged - s * a @ b`, with the adapter of `model`.

    ```python
    merged = quax_lora.merge(tuned)             # the base weights are not kept
    base = quax_lora.unmerge(merged, tuned)     # tuned, its w recovered from merged
    ```

    **Arguments:**

    - `merged`: a model as `merge` returns it (dense weights where `model` has
        `LoraArray`s).
    - `model`: the loraified model whose adapters were merged (its `w` is not
        read). For Flax NNX modules, both are NNX modules, and a new one is
        returned.

    **Returns:**

    `model` with the leaves of `merged` (its biases, and so on) and, in each
    `LoraArray`, `w = merged - s * a @ b` in the dtype of the merged weight.

    **Raises:**

    `ValueError` for a DoRA array (the merged weight keeps the rows' directions
    and magnitudes, not the norms of `w + s a b` that divided them: `w` cannot be
    recovered; keep the loraified model instead), for stacked adapters (merge
    one first), or for a base weight that was a `quax.ArrayValue` (say
    quantised: the difference is a dense array; quantise it again yourself).
    """

    def base(lora: Any, dense: Any) -> Any:
        if not isinstance(lora, LoraArray):
            return dense
        problem = None
        if lora.variant == "dora":
            problem = (
                "it is a DoRA array: the merged weight is magnitude times the "
                "direction of w + s a b, and the norms that divided it are not "
                "kept, so w cannot be recovered. Keep the loraified model (merge "
                "returns a new one) to go back"
            )
        elif lora.adapters is not None:
            problem = (
                f"it stacks {lora.adapters} adapters. Unstack the one that was "
                "merged with quax_lora.unstack_adapters first"
            )
        elif isinstance(lora.w, quax.Value):
            problem = (
                f"its base weight is a {type(lora.w).__qualname__}, and the "
                "difference is a dense array. Replace the LoraArray's w yourself "
                "(say by quantising merged - lora.delta() again)"
            )
        if problem is not None:
            raise ValueError(
                f"quax_lora.unmerge cannot take the base weight of shape "
                f"{lora.shape} out of the merged one: {problem}."
            )
        dense = np.asarray(dense) if not hasattr(dense, "dtype") else dense
        if tuple(dense.shape) != tuple(lora.shape):
            raise ValueError(
                f"quax_lora.unmerge: the merged weight has shape {dense.shape} where "
                f"the LoraArray has {lora.shape}; pass the model merge made from it."
            )
        w = (dense - lora.delta()).astype(dense.dtype)
        return lora.replace(w=w)

    if nnx_of(model) is not None:
        weights = weights_of(merged)

        def nnx_base(path: tuple[Any, ...], lora: LoraArray) -> LoraArray:
            if path not in weights:
                raise ValueError(
                    f"quax_lora.unmerge: the merged NNX model has no weight at "
                    f"`{'.'.join(map(str, path))}`, where the model has a LoRA "
                    "kernel; pass the model merge made from it."
                )
            return base(lora, weights[path])

        return update_kernels(model, nnx_base)
    return jtu.tree_map(base, model, merged, is_leaf=is_lora)


def _spec(model: PyTree, train_weights: bool) -> PyTree:
    def leaf(x: Any) -> Any:
        if isinstance(x, LoraArray):
            w = train_weights and not x.stop_gradient
            spec = jtu.tree_map(lambda _: False, x)
            # DoRA's magnitude is trained (and saved) with `a` and `b`; the
            # dropout key and the adapter index are not parameters.
            magnitude = None if x.magnitude is None else True
            return spec.replace(w=w, a=True, b=True, magnitude=magnitude)
        return False

    return jtu.tree_map(leaf, model, is_leaf=is_lora)


def trainable_filter(model: PyTree) -> PyTree:
    """A filter spec marking what fine-tuning trains: the `a` and `b` of every
    [`quax_lora.LoraArray`][] (with DoRA's `magnitude`, and `w` when it was made
    with `stop_gradient=False`); everything else is frozen.

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
    [`quax_lora.LoraArray`][], and DoRA's `magnitude`. What
    [`quax_lora.save_adapter`][] saves.

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
    # (An NNX model is a PyTree too, its LoRA kernels `LoraArray`s.)
    # What `trainable_filter` selects: `a`, `b`, and `w` unless it is frozen.
    loras = [x for x in jtu.tree_leaves(model, is_leaf=is_lora) if is_lora(x)]
    trainable = [
        (x.a, x.b, x.magnitude) if x.stop_gradient else (x.w, x.a, x.b, x.magnitude)
        for x in loras
    ]
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
_FORMAT_VERSION = 3
# Version 2 did not record the variant and the stacked adapters (it had neither);
# files of versions 2 and 3 written before `row_ndim` existed do not record it
# (every array then had rows of one axis).
_READ_VERSIONS = (2, 3)
# The settings of a layer that must agree between the file and the model, in the
# order they are checked and named, and what an earlier file had for the ones it
# did not record. (The adapter's dtype is recorded too, and checked from the
# leaves themselves, as for a file that does not record it: it need not agree, a
# narrower one loads exactly; see `_read_leaves`.)
_SETTINGS = (
    "shape",
    "dtype",
    "batch_ndim",
    "row_ndim",
    "variant",
    "adapters",
    "rank",
    "scaling",
    "stop_gradient",
    "init",
    "init_settings",
)
_DEFAULTS = {
    "variant": "lora",
    "adapters": None,
    "row_ndim": 1,
    "init": None,
    "init_settings": {},
}


def _layers(model: PyTree) -> Iterator[tuple[str, LoraArray]]:
    """(path, array) of every `LoraArray` of `model`, in the order of its leaves;
    the path as `jax.tree_util.keystr` writes it (`.layers[0].weight`)."""
    for path, x in jtu.tree_flatten_with_path(model, is_leaf=is_lora)[0]:
        if isinstance(x, LoraArray):
            yield jtu.keystr(path), x


def _settings(lora: LoraArray) -> dict[str, Any]:
    """What reproduces a layer's outputs from its `a` and `b`: the weight's shape
    and dtype, the adapter's dtype (see `LoraArray`'s mixed precision), the
    layout, the variant (`"lora"`, `"rslora"`, `"dora"`), how many adapters it
    stacks, the rank, `alpha` and the scaling (`alpha / rank`, or
    `alpha / sqrt(rank)`), whether `w` is frozen (which decides what
    fine-tuning trains), and the initialisation that changed the base weight
    (`init`, `init_settings`: an adapter applies only to a base changed alike)."""
    return {
        "shape": list(lora.shape),
        "dtype": str(lora.dtype),
        "adapter_dtype": str(lora.adapter_dtype),
        "batch_ndim": lora.batch_ndim,
        "row_ndim": lora.row_ndim,
        "variant": lora.variant,
        "adapters": lora.adapters,
        "rank": lora.rank,
        "alpha": lora.alpha,
        "scaling": lora.scaling,
        "stop_gradient": lora.stop_gradient,
        "init": lora.init,
        "init_settings": dict(lora.init_settings),
    }


def _differs(key: str, saved: Any, current: Any) -> bool:
    if key == "scaling":  # alpha / rank, computed alike on both sides
        return not math.isclose(saved, current, rel_tol=1e-12)
    return saved != current


def _describe_setting(key: str, settings: dict[str, Any]) -> str:
    if key == "scaling":
        rank = "sqrt(rank)" if settings.get("variant") == "rslora" else "rank"
        return (
            f"alpha={settings['alpha']!r} (scaling alpha / {rank} = "
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
        settings = {**_DEFAULTS, **settings}
        for key in _SETTINGS:
            if _differs(key, settings[key], current[path][key]):
                problems.append(
                    f"layer `{path}` was saved with "
                    f"{_describe_setting(key, settings)}, and the model's has "
                    f"{_describe_setting(key, current[path])}"
                )
    if problems:
        raise ValueError(
            "quax_lora.load_adapter: the adapter was saved from a model loraified "
            "otherwise than this one, so its outputs would differ: "
            + summarise(problems)
            + ". Loraify the model as the adapter's was (the same layers, with "
            "loraify's filter= and where=, and the same rank=, alpha=, variant= "
            "and stop_gradient=), then load it."
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


def _peft_layers(model: PyTree) -> list[tuple[str, LoraArray, str]]:
    """(module name, array, what its layer is to peft: an `eqx.nn.Embedding`, a
    kernel of more than two axes (a convolution) or a `Linear`) of every
    `LoraArray` of `model`, the name as peft writes it (`layers.0`)."""
    embeddings = {
        jtu.keystr(path) + ".weight"
        for path, x in jtu.tree_flatten_with_path(
            model, is_leaf=lambda x: isinstance(x, eqx.nn.Embedding)
        )[0]
        if isinstance(x, eqx.nn.Embedding)
    }
    return [
        (
            module_name(path),
            x,
            EMBEDDING if path in embeddings else CONV if x.ndim > 2 else LINEAR,
        )
        for path, x in _layers(model)
    ]


def _nnx_peft_layers(model: Any) -> list[tuple[str, LoraArray, str]]:
    """(module name, array, what its layer is to peft) of every adapted layer of
    the NNX `model`, the name its path, dotted (`layers.0`)."""
    kinds = peft_kinds(model)
    return [(name, x, kinds[name]) for name, x in adapters_of(model).items()]


def save_adapter(
    path_or_file: str | pathlib.Path | BinaryIO,
    model: PyTree,
    *,
    format: str = "quax",
    name_map: Mapping[str, str] | Callable[[str], str] | None = None,
    fan_in_fan_out: bool | None = None,
) -> None:
    """Save only the adapter (`a` and `b` of every [`quax_lora.LoraArray`][], and
    DoRA's `magnitude`) of `model`: a few megabytes, not the base model.

    In quax-lora's own format (`format="quax"`, one file), it also records, for
    every adapted layer by its path in `model`, the settings that reproduce its
    outputs from `a` and `b`: the weight's shape and dtype, the adapter's dtype,
    `batch_ndim`, the variant, how many adapters it stacks, `rank`, `alpha` and
    the scaling, and `stop_gradient`. [`quax_lora.load_adapter`][] checks them.
    (The initial `scale` of `a` is not recorded: the file replaces `a`.)

    In peft's layout (`format="peft"`), `path_or_file` is a directory, which gets
    `adapter_model.safetensors` and `adapter_config.json`, as peft's
    `save_pretrained` writes them: the tensors named
    `base_model.model.<module>.lora_A.weight` (`b`, the input's side, shape
    `(rank, in)`) and `.lora_B.weight` (`a`, `(out, rank)`), as torch stores a
    `Linear`'s weight `(out, in)` like `eqx.nn.Linear`;
    `lora_embedding_A`/`lora_embedding_B` (`a` and `b` transposed) for an
    `eqx.nn.Embedding`; a convolution's `lora_B.weight` is a 1x1 kernel; and
    `lora_magnitude_vector` for DoRA. The config holds `r` and `lora_alpha` (the
    most common rank and its alpha, the others in `rank_pattern` and
    `alpha_pattern`), `target_modules` (every adapted module), `use_rslora`,
    `use_dora`, `fan_in_fan_out` and `lora_dropout`. peft's `PeftModel.from_pretrained`
    loads it into the torch model whose modules carry those names.

    **Arguments:**

    - `path_or_file`: for `format="quax"`, a file name (without a suffix, `.eqx`
        is added, as `eqx.tree_serialise_leaves` does) or a binary file object;
        for `format="peft"`, a directory (made if missing).
    - `model`: a PyTree containing `LoraArray`s.
    - `format`: `"quax"` (the default) or `"peft"`.
    - `name_map`: for `format="peft"`, the peft module name of each adapted
        layer, from ours (the path of its weight without `.weight`, dotted:
        `layers.0`): a dict (names not in it are kept) or a function. By
        default ours.
    - `fan_in_fan_out`: for `format="peft"`, whether the model's weights are
        stored `(in, out)` (used as `x @ w`), as peft's flag says of GPT-2's
        `Conv1D`. By default `False` (`eqx.nn.Linear`'s are `(out, in)`), and
        `True` for a Flax NNX model (its kernels are `(in, out)`).

    A Flax NNX model is saved from its LoRA kernels: each layer is named by its
    path (`layers.0` for the kernel of `model.layers[0]`), in both formats.

    **Returns:**

    Nothing.

    **Raises:**

    `ValueError` for `format="peft"` when a layer has no peft counterpart (a
    stack of matrices, stacked adapters), or the layers mix variants.
    """
    nnx = nnx_of(model)
    if format == "peft":
        if not isinstance(path_or_file, str | pathlib.Path):
            raise ValueError(
                "quax_lora.save_adapter(format='peft') writes a directory (two "
                "files, as peft does): pass its path, not a file object."
            )
        if fan_in_fan_out is None:
            fan_in_fan_out = nnx is not None
        write_peft(
            path_or_file,
            _peft_layers(model) if nnx is None else _nnx_peft_layers(model),
            name_map=name_map,
            fan_in_fan_out=fan_in_fan_out,
        )
        return
    if format != "quax":
        raise ValueError(
            f"quax_lora.save_adapter needs format='quax' or 'peft', got {format!r}."
        )
    if nnx is not None:
        model = adapters_of(model)
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


def _read_header(f: BinaryIO, file: str) -> tuple[dict[str, Any] | None, BinaryIO]:
    """The header of the adapter file `f` (named `file` in messages; `None` for a
    file of an earlier version, which has none), and the file positioned at its
    leaves. A header that cannot be one `save_adapter` wrote (its length beyond
    the file, not JSON, a layer's settings missing or of another type) raises a
    `CorruptAdapterError` naming the field."""
    if not f.seekable():
        # A stream (a pipe, a socket): the header's length is checked against
        # the size of the file, and the leaves are read with seeks.
        f = io.BytesIO(f.read())
    start = f.read(len(_MAGIC))
    if start != _MAGIC:
        f.seek(-len(start), io.SEEK_CUR)
        return None, f
    header = read_json_header(f, file)
    if header.get("version") not in _READ_VERSIONS:
        raise ValueError(
            f"quax_lora.load_adapter: the file is an adapter of format version "
            f"{header.get('version')!r}, and this quax-lora reads versions "
            f"{', '.join(map(str, _READ_VERSIONS))}. Load it with the quax-lora "
            "that wrote it."
        )
    layers = header.get("layers")
    if not isinstance(layers, dict):
        raise corrupt(
            file, "header's `layers`", f"is a JSON {_json_kind(layers)}, not an object"
        )
    for path, settings in layers.items():
        field = f"header's settings of layer `{path}`"
        if not isinstance(settings, dict):
            raise corrupt(
                file, field, f"are a JSON {_json_kind(settings)}, not an object"
            )
        missing = [
            k for k in (*_SETTINGS, "alpha") if k not in {**_DEFAULTS, **settings}
        ]
        if missing:
            raise corrupt(file, field, f"lack {', '.join(map(repr, missing))}")
        shape, scaling = settings["shape"], settings["scaling"]
        if not (isinstance(shape, list) and all(map(_is_int, shape))):
            raise corrupt(file, f"{field}: `shape`", f"is {shape!r}, not integers")
        if not _is_number(scaling):
            raise corrupt(file, f"{field}: `scaling`", f"is {scaling!r}, not a number")
    return header, f


def _read_array(f: BinaryIO, file: str, field: str) -> np.ndarray | None:
    """The next array of `f` as `np.save` wrote it, or `None` at the end of the
    file. Its header is read by NumPy, and its length checked against what is
    left of the file before its data is read; an array of Python objects is
    refused (nothing is unpickled). A `CorruptAdapterError` naming `field` when
    it cannot be such an array."""
    position = f.tell()
    end = f.seek(0, io.SEEK_END)
    f.seek(position)
    if position == end:
        return None
    npy = np.lib.format
    try:
        version = npy.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"NumPy format version {version}, not 1.0 or 2.0")
        read = (
            npy.read_array_header_1_0
            if version == (1, 0)
            else npy.read_array_header_2_0
        )
        shape, fortran, dtype = read(f)
    except Exception as e:  # NumPy's parser of the header raises several types
        raise corrupt(
            file, field, f"is not an array as np.save writes one ({e!r})"
        ) from e
    if dtype.hasobject or dtype.itemsize == 0 or any(d < 0 for d in shape):
        raise corrupt(
            file,
            field,
            f"is of dtype {dtype} and shape {shape}, which no array of an adapter has",
        )
    size = math.prod(shape) * dtype.itemsize
    left = end - f.tell()
    if size > left:
        raise corrupt(
            file,
            field,
            f"says it holds {dtype} of shape {shape} ({size} bytes), and only "
            f"{left} byte(s) are left in the file",
        )
    value = np.frombuffer(f.read(size), dtype=dtype, count=math.prod(shape))
    value = value.reshape(shape, order="F" if fortran else "C")
    return value.view(jnp.bfloat16) if value.dtype == "V2" else value


def load_adapter(
    path_or_file: str | pathlib.Path | BinaryIO,
    model: PyTree,
    *,
    format: str | None = None,
    name_map: Mapping[str, str] | Callable[[str], str] | None = None,
    fan_in_fan_out: bool | None = None,
    cast: bool = False,
) -> PyTree:
    """Load an adapter saved by [`quax_lora.save_adapter`][] (or by peft) into
    `model`, which must be loraified the same way: the same layers, and for each
    the same shape, dtype, variant, rank, `alpha` (so the same scaling), layout
    and `stop_gradient`, and an adapter dtype that holds the file's exactly.

    ```python
    base = quax_lora.loraify(pretrained, rank=8, alpha=16.0, key=key)
    tuned = quax_lora.load_adapter("adapter.eqx", base)
    ```

    A file in the format of earlier versions (`a` and `b` alone) records no
    settings: it loads, with a
    [`quax_lora.LegacyAdapterWarning`][], and only the shapes of `a` and `b` (so
    the ranks) are checked. Its `alpha` cannot be: the outputs are right only if
    `model` has the adapter's `alpha`. Save it again to record them.

    An adapter in peft's layout (a directory with `adapter_config.json` and
    `adapter_model.safetensors`, as peft's `save_pretrained` writes it) is read
    by its module names: the config's rank (with `rank_pattern`), `lora_alpha`
    (with `alpha_pattern`, both read in peft's order), `use_rslora` and
    `use_dora` are checked against each layer of `model`, and so are the
    tensors' shapes; every module with tensors must be one the config's
    `target_modules` selects (with `exclude_modules`, `modules_to_save`,
    `layers_to_transform` and `layers_pattern`, as peft selects them), and
    every tensor must be read (a file holding biases, `bias="all"` or
    `"lora_only"`, or whole modules, `modules_to_save`, is refused, naming
    them). A config setting what quax-lora does not reproduce is refused,
    naming it: an `init_lora_weights` that changes the base weights (PiSSA,
    OLoRA, CorDA, LoftQ, LoRA-GA), `layer_replication`, `lora_bias`, Activated
    LoRA, QA-LoRA, `target_parameters`, `trainable_token_indices`, the variants
    quax-lora does not implement, and any key it does not know whose value is
    not null, false or empty. (`lora_dropout` is read as training only: a
    loaded model drops nothing until given a dropout key.)

    **Dtypes**, in both formats: a tensor whose dtype the model's adapter dtype
    holds exactly (the same, or a narrower one of the same kind: bfloat16 or
    float16 into float32, float32 into float64) loads, converted exactly. One
    it would round (float32 into bfloat16 or float16, float16 into bfloat16 and
    back, float64 into float32) raises a `ValueError` naming the layer, the
    tensors and both dtypes: loraify the model with the file's dtype
    (`loraify(..., adapter_dtype=jnp.float32)`, as peft keeps a float32
    adapter on a bfloat16 base by default), or pass `cast=True`. An integer
    tensor, or a complex one into a real adapter, never loads. The same holds
    for DoRA's `magnitude`; the base weights are never read from the file.

    **Arguments:**

    - `path_or_file`: a file name (without a suffix, `.eqx` is added) or a binary
        file object; or a peft adapter's directory.
    - `model`: the loraified model to load into; its `w` and other leaves are kept.
    - `format`: `"quax"`, `"peft"`, or `None` (the default): `"peft"` for a
        directory holding `adapter_config.json`, else `"quax"`.
    - `name_map`: for peft's layout, the peft module name of each of our layers
        (`layers.0`, the path of its weight dotted, without `.weight`), as for
        `save_adapter`: for models whose modules are named otherwise (say
        `model.layers.0.self_attn.q_proj`).
    - `fan_in_fan_out`: for peft's layout, whether `model`'s weights are stored
        `(in, out)`. By default `True` for a Flax NNX model (its kernels are
        `(in, out)`), and `False` for any other (`eqx.nn.Linear`'s `(out, in)`),
        whatever the layout of the torch model the adapter was made for (peft's
        tensors are the same): a config with `fan_in_fan_out=true` (GPT-2's
        `Conv1D`) then raises a `ValueError` asking for it, since a square
        weight would load either way.
    - `cast`: `True` to load tensors stored in a dtype that the model's adapter
        holds only rounded (say float32 into bfloat16), rounding them to it.
        By default such a file is refused (see above).

    A Flax NNX model is loaded into a copy (`nnx.clone`), its layers named as
    `save_adapter` names them.

    **Returns:**

    A copy of `model` with the loaded `a` and `b` (and `magnitude`).

    **Raises:**

    `ValueError` when a setting of `model` differs from the file's, naming the
    layer (by its path) and the setting, or when the file and `model` adapt
    different layers; when the file's dtype would be rounded (without `cast`);
    for peft's layout, when the config sets what quax-lora does not reproduce
    or the file holds tensors that would be left unread.
    [`quax_lora.CorruptAdapterError`][] (a `ValueError`) when a file is not as
    `save_adapter` or peft writes one (cut short or changed: a length beyond the
    file, a header that is not JSON, an array whose header does not fit its
    data, a config key of another type), naming the file and the field. Every
    length is checked against the file's size before it is read, and nothing in
    a file is unpickled or run.
    """
    nnx = nnx_of(model)
    if nnx is None:
        return _load_adapter(
            path_or_file,
            model,
            format=format,
            name_map=name_map,
            fan_in_fan_out=fan_in_fan_out,
            cast=cast,
            names=_peft_layers,
        )
    kinds = peft_kinds(model)
    loaded = _load_adapter(
        path_or_file,
        adapters_of(model),
        format=format,
        name_map=name_map,
        fan_in_fan_out=True if fan_in_fan_out is None else fan_in_fan_out,
        cast=cast,
        names=lambda adapters: [(k, v, kinds[k]) for k, v in adapters.items()],
    )
    return update_kernels(model, lambda path, _: loaded[layer_name(path)])


def _load_adapter(
    path_or_file: str | pathlib.Path | BinaryIO,
    model: PyTree,
    *,
    format: str | None,
    name_map: Mapping[str, str] | Callable[[str], str] | None,
    fan_in_fan_out: bool | None,
    cast: bool,
    names: Callable[[PyTree], list[tuple[str, LoraArray, str]]],
) -> PyTree:
    """`load_adapter` into `model` (a PyTree; an NNX model's state), whose
    peft module names `names(model)` gives."""
    if format is None:
        is_peft = (
            isinstance(path_or_file, str | pathlib.Path)
            and (pathlib.Path(path_or_file) / CONFIG_NAME).is_file()
        )
        format = "peft" if is_peft else "quax"
    if format == "peft":
        if not isinstance(path_or_file, str | pathlib.Path):
            raise ValueError(
                "quax_lora.load_adapter(format='peft') reads a directory: pass its "
                "path, not a file object."
            )
        named = names(model)
        leaves = read_peft(
            path_or_file,
            named,
            name_map=name_map,
            fan_in_fan_out=fan_in_fan_out,
            cast=cast,
        )
        new = {
            id(lora): fields for (_, lora, _), fields in zip(named, leaves, strict=True)
        }
        return jtu.tree_map(
            lambda x: x.replace(**new[id(x)]) if id(x) in new else x,
            model,
            is_leaf=is_lora,
        )
    if format != "quax":
        raise ValueError(
            f"quax_lora.load_adapter needs format='quax', 'peft' or None, got "
            f"{format!r}."
        )
    spec = adapter_filter(model)
    adapter, rest = eqx.partition(model, spec)
    with _open(path_or_file, "rb") as f:
        file = file_label(f)
        header, f = _read_header(f, file)
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
        loaded = _read_leaves(f, file, adapter, cast=cast, legacy=header is None)
    return eqx.combine(loaded, rest)


def _read_leaves(
    f: BinaryIO, file: str, adapter: PyTree, *, cast: bool, legacy: bool
) -> PyTree:
    """The leaves of `adapter` (`a`, `b` and `magnitude` of each `LoraArray`) as
    `eqx.tree_serialise_leaves` wrote them to `f` (named `file` in messages),
    each checked against the model's: its shape, and its dtype by the rules of
    peft's layout (one the model's adapter holds exactly loads, converted; one it
    would round loads only with `cast`; one not floating, or complex into a real
    adapter, never). A file with a header must hold every leaf (a
    `CorruptAdapterError` otherwise); a `legacy` file (no header recording its
    layers) may hold fewer, the adapters of fewer layers, and must end after
    them: more arrays would be the adapters of layers the model does not have.
    (A file with a header may be followed by other data, as
    `eqx.tree_serialise_leaves` allows.)"""
    leaves, treedef = jtu.tree_flatten_with_path(adapter)
    stored: list[tuple[str, str, Any, np.ndarray | None]] = []
    for path, like in leaves:
        layer, field = jtu.keystr(path[:-1]), jtu.keystr(path[-1:])[1:]
        value = _read_array(f, file, f"`{field}` of layer `{layer}`")
        if not legacy and (value is None or value.shape != like.shape):
            # The header's settings are the model's: the leaves must be theirs.
            raise corrupt(
                file,
                f"`{field}` of layer `{layer}`",
                "is missing: the file ends before it"
                if value is None
                else f"has shape {value.shape}, where the header's settings give "
                f"{tuple(like.shape)}",
            )
        stored.append((layer, field, like, value))
    problems: list[str] = []
    narrowed: dict[str, tuple[Any, list[tuple[str, Any]]]] = {}
    loaded = []  # each leaf, checked, in the model's adapter dtype
    if legacy and f.read(1):
        problems.append(
            "the file holds more arrays than the model's adapter (the `a`, `b` "
            f"and `magnitude` of its {len(list(_layers(adapter)))} layer(s))"
        )
    for layer, field, like, value in stored:
        if value is None:
            problems.append(f"layer `{layer}`: the file ends before its `{field}`")
        elif value.shape != like.shape:
            problems.append(
                f"layer `{layer}`: the file's `{field}` has shape {value.shape}, "
                f"where the model's has {tuple(like.shape)}"
            )
        elif (refused := refused_dtype(value.dtype, like.dtype)) is not None:
            problems.append(f"layer `{layer}`: the file's `{field}` {refused}")
        elif narrows(value.dtype, like.dtype) and not cast:
            narrowed.setdefault(f"layer `{layer}`", (like.dtype, []))[1].append(
                (field, value.dtype)
            )
        else:
            loaded.append(jnp.asarray(value, dtype=like.dtype))
    if problems:
        raise ValueError(
            "quax_lora.load_adapter: the file's adapter does not fit the model: "
            + summarise(problems)
            + ". Loraify the model as the adapter's was (the same layers, rank= "
            "and adapter_dtype=), then load it."
        )
    if narrowed:
        raise narrowing_error(narrowed)
    return jtu.tree_unflatten(treedef, loaded)
