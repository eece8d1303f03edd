"""AWQ (Lin et al., 2023): activation-aware weight quantisation. Before rounding
to nearest, each linear layer's input features are scaled by `s`, searched from
the activations' magnitudes, and `1 / s` is folded into the operation that
produces those inputs, so that the float model computes the same function while
the features that carry large activations are rounded more finely.
"""

import functools as ft
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jaxtyping import Array, PyTree

from ._checkpoint import gptq_array
from ._gptq_algorithm import (
    _check_bits,
    calibration_run,
    linear_layers,
    weight_setter,
    with_matmul,
)
from ._layer_inputs import layer_inputs, map_layers, paths_of, progress_bar
from ._value import MATMUL_PATHS


__all__ = ["AWQ_GRID", "FOLD_TARGETS", "awq", "awq_quantise", "awq_scales"]

# The exponents tried for `s = mean|x| ** alpha`: 0, 1/20, ..., 19/20 (llm-awq's
# `n_grid = 20`).
AWQ_GRID = 20

# What `1 / s` can be folded into: the layer (or norm) whose outputs are the
# scaled layers' inputs.
FOLD_TARGETS = (eqx.nn.Linear, eqx.nn.LayerNorm, eqx.nn.RMSNorm)


def awq_quantise(w: Array, bits: int, group_size: int) -> tuple[Array, Array, Array]:
    """AWQ's round to nearest (llm-awq's `pseudo_quantize_tensor` with zero
    points): per output row and group of `group_size` inputs, the range
    `[min, max]` of the group in `2^bits - 1` steps (at least `1e-5`), the zero
    point `-round(min / scale)` clipped to the levels.

    **Arguments:**

    - `w`: a float weight `(out, in)`.
    - `bits`: 2 to 4.
    - `group_size`: the inputs per group; it must divide `in`.

    **Returns:**

    `(q, scale, zero)`: the unsigned integers `(out, in)` (as floats), the
    scales and zero points `(out, groups)`.
    """
    maxq = 2**bits - 1
    rows, cols = w.shape
    g = w.reshape(rows, cols // group_size, group_size)
    high, low = jnp.max(g, axis=2), jnp.min(g, axis=2)
    scale = jnp.maximum(high - low, 1e-5) / maxq
    zero = jnp.clip(-jnp.round(low / scale), 0, maxq)
    q = jnp.clip(jnp.round(g / scale[..., None]) + zero[..., None], 0, maxq)
    return q.reshape(rows, cols), scale, zero


def _dequantised(w: Array, bits: int, group_size: int) -> Array:
    q, scale, zero = awq_quantise(w, bits, group_size)
    rows, cols = w.shape
    groups = q.reshape(rows, cols // group_size, group_size)
    return ((groups - zero[..., None]) * scale[..., None]).reshape(rows, cols)


@ft.partial(jax.jit, static_argnames=("bits", "group_size", "grid"))
def _search(
    weights: tuple[Array, ...],
    hessian: Array,
    mean_abs: Array,
    *,
    bits: int,
    group_size: int,
    grid: int,
) -> tuple[Array, Array]:
    """Each exponent's scales and their loss `sum_r dW_r H dW_r^T` over the
    layers (`dW = Q(W diag(s)) diag(1/s) - W`)."""

    def loss_of(alpha: Array) -> tuple[Array, Array]:
        s = jnp.maximum(mean_abs**alpha, 1e-4)
        s = s / jnp.sqrt(jnp.max(s) * jnp.min(s))
        loss = jnp.zeros((), hessian.dtype)
        for w in weights:
            dw = _dequantised(w * s, bits, group_size) / s - w
            loss = loss + jnp.sum((dw @ hessian) * dw)
        return s, loss

    alphas = jnp.arange(grid, dtype=hessian.dtype) / grid
    return lax.map(loss_of, alphas)


def awq_scales(
    weights: Sequence[Array],
    hessian: np.ndarray,
    mean_abs: np.ndarray,
    *,
    bits: int = 4,
    group_size: int = 128,
    grid: int = AWQ_GRID,
) -> tuple[Array, float]:
    """AWQ's search for the input scales of layers sharing one input: for
    `alpha` in `0, 1/grid, ..., (grid - 1)/grid`, `s = max(mean|x| ** alpha,
    1e-4)` normalised by `sqrt(max(s) min(s))`; the one whose rounded weights
    `Q(W diag(s)) diag(1/s)` give the least squared output error over the
    calibration inputs (`tr(dW H dW^T)`, `H = 2 X^T X / rows`, summed over the
    layers), the first on ties (so `alpha = 0`, `s = 1`, round to nearest, when
    scaling does not help).

    **Arguments:**

    - `weights`: the float weights `(out_k, in)` of the layers reading the input.
    - `hessian`: `(in, in)`, `2 X^T X / rows` over the calibration rows.
    - `mean_abs`: `(in,)`, the mean of `|x|` per input feature.
    - `bits`, `group_size`: the rounding's, as for [`quax_quant.awq`][].
    - `grid`: how many exponents to try.

    **Returns:**

    `(s, alpha)`: the scales `(in,)` and the exponent chosen.
    """
    dtype = jnp.promote_types(weights[0].dtype, jnp.float32)
    with jax.default_matmul_precision("highest"):
        scales, losses = _search(
            tuple(jnp.asarray(w, dtype) for w in weights),
            jnp.asarray(hessian, dtype),
            jnp.asarray(mean_abs, dtype),
            bits=bits,
            group_size=group_size,
            grid=grid,
        )
    best = int(np.argmin(np.asarray(losses)))  # the first of equal losses
    return scales[best], best / grid


def _divided(node: Any, s: Array) -> Any:
    """A fold target with its outputs divided by `s` (a Linear's rows and bias,
    a norm's elementwise weight and bias)."""
    if isinstance(node, eqx.nn.Linear):
        node = eqx.tree_at(lambda n: n.weight, node, node.weight / s[:, None])
    elif node.weight is None:
        raise ValueError(
            f"awq: a {type(node).__name__} without an elementwise weight cannot take "
            "the inverse scales; fold into another operation or leave it out."
        )
    else:
        node = eqx.tree_at(lambda n: n.weight, node, node.weight / s)
    if getattr(node, "bias", None) is not None:
        node = eqx.tree_at(lambda n: n.bias, node, node.bias / s)
    return node


def _replaced(model: PyTree, replacements: dict[int, Any]) -> PyTree:
    """`model` with each node whose `id` is a key of `replacements` replaced."""
    return jtu.tree_map(
        lambda x: replacements.get(id(x), x),
        model,
        is_leaf=lambda x: id(x) in replacements,
    )


def _check_fold(
    model: PyTree,
    previous: Any,
    layers: Sequence[Any],
    s: Array,
    run: Callable[[PyTree, Any], Any],
    batch: Any,
    path: str,
) -> None:
    """Refuse a fold that changes the float model's outputs on `batch` (an
    operation between `previous` and the layers that `1 / s` does not pass
    through: GELU, SiLU, a residual sum)."""
    replacements = {id(layer): layer for layer in layers}
    for layer in layers:
        replacements[id(layer)] = eqx.tree_at(
            lambda n: n.weight, layer, layer.weight * s
        )
    replacements[id(previous)] = _divided(replacements.get(id(previous), previous), s)
    folded = _replaced(model, replacements)
    forward = eqx.filter_jit(run)
    # Full float32 products: a TPU's default (bfloat16 passes) would differ by
    # more than the tolerance between two equal functions.
    with jax.default_matmul_precision("highest"):
        want = jtu.tree_leaves(forward(model, batch))
        got = jtu.tree_leaves(forward(folded, batch))
    for a, b in zip(want, got, strict=True):
        if not eqx.is_inexact_array(a):
            continue
        tol = 1e-3 if jnp.dtype(a.dtype).itemsize >= 4 else 3e-2
        scale = float(jnp.linalg.norm(jnp.ravel(a))) or 1.0
        err = float(jnp.linalg.norm(jnp.ravel(b - a))) / scale
        if not err <= tol:
            raise ValueError(
                f"awq: folding 1/s into the {type(previous).__name__} at {path} "
                f"changes the model's float outputs (relative error {err:.3g}): "
                "its outputs are not the scaled layers' inputs up to an operation "
                "that commutes with a positive scale per feature (the identity, "
                "ReLU). Fold into the operation that produces those inputs."
            )


def awq(
    model: PyTree,
    batches: Iterable[Any],
    *,
    bits: int = 4,
    group_size: int = 128,
    apply: Callable[[PyTree, Any], Any] | None = None,
    fold: Callable[[PyTree], Sequence[tuple[Any, Any]]] | None = None,
    grid: int = AWQ_GRID,
    filter: Any = eqx.nn.Linear,
    where: Callable[[PyTree], Any] | None = None,
    matmul: str = "auto",
    progress: bool = True,
) -> PyTree:
    """Quantise the linear layers of `model` with AWQ (Lin et al., 2023): input
    scales searched from the activations, folded into the previous operation,
    then round to nearest in groups.

    ```python
    qmodel = quax_quant.awq(
        mlp, batches, apply=lambda m, x: jax.vmap(m)(x),
        fold=lambda m: [(m.layers[0], m.layers[1]), (m.layers[1], m.layers[2])],
    )
    ```

    `fold(model)` names where each scale goes: pairs `(previous, layers)`, where
    `layers` (a layer or a tuple of layers reading the same input, such as the
    query, key and value projections) read the outputs of `previous`, an
    `eqx.nn.Linear` (its rows and bias are divided by `s`), `eqx.nn.LayerNorm` or
    `eqx.nn.RMSNorm` (its weight and bias), with nothing between them but
    operations that commute with a positive scale per feature (the identity,
    ReLU). The float model then computes the same function: this is checked on
    the first batch, and a fold that changes the outputs (a GELU or a residual
    sum in between) raises. A selected layer in no pair keeps `s = 1` (round to
    nearest): the model's structure is not read from its code, so the pairs are
    yours to give, as llm-awq and AutoAWQ list them per architecture.

    For each pair, `apply(model, batch)` runs over every batch inside
    [`quax.quaxify`][] on the float model, the first layer recording its inputs'
    Gram matrix `X^T X` and mean absolute value per feature; then `s` is
    searched as [`quax_quant.awq_scales`][] describes. Every layer is then
    quantised by [`quax_quant.awq_quantise`][]'s round to nearest, one at a time
    (no float copy of the model: the folded float weight of one layer at a time,
    and one pair's for the check).

    **Arguments:**

    - `model`: an Equinox model.
    - `batches`: an iterable of inputs (made a list: every pair runs them).
    - `bits`: 4, 3 or 2 (stored as int4).
    - `group_size`: one scale and zero point per output feature and group of this
        many inputs; it must divide every selected layer's inputs.
    - `apply`: `apply(model, batch)` runs the model; by default `model(batch)`.
    - `fold`: the pairs `(previous, layers)` above, as a function of the model.
    - `grid`: how many exponents `alpha` to try (llm-awq's 20).
    - `filter`, `where`: which layers, as for [`quax_quant.quantise_model`][]; by
        default every `eqx.nn.Linear`.
    - `matmul`: the product path of the result (see [`quax_quant.quantise`][]).
    - `progress`: show a progress bar (tqdm, if installed) when calibration runs
        longer than a few seconds.

    **Returns:**

    A copy of `model` whose selected layers' weights are asymmetric int4
    [`quax_quant.QuantisedArray`][]s in the layout [`quax_quant.from_gptq`][]
    reads (export with [`quax_quant.to_gptq`][]`(w, format="awq")`), and whose
    fold targets hold `1 / s`.

    **Raises:**

    `ValueError` for an empty `batches`, a group size that does not divide a
    layer's inputs, a pair whose layers are not selected or whose `previous` is
    not a fold target or has another number of outputs, a layer in two pairs,
    a fold that changes the float outputs, and a Flax NNX model.
    """
    _check_bits("awq", bits, group_size)
    if matmul not in MATMUL_PATHS:
        raise ValueError(f"awq: matmul must be one of {MATMUL_PATHS}, got {matmul!r}.")
    layers = linear_layers("awq", model, group_size, filter, where)
    run, batches = calibration_run(apply, batches, "awq")
    index = {id(layer): k for k, (layer, _) in enumerate(layers)}
    pairs = []
    for previous, group in fold(model) if fold is not None else ():
        group = tuple(group) if isinstance(group, tuple | list) else (group,)
        path, *layer_paths = paths_of(model, [previous, *group])
        if not isinstance(previous, FOLD_TARGETS):
            raise ValueError(
                f"awq: the fold target at {path} is a {type(previous).__name__}; "
                f"1/s folds into {', '.join(t.__name__ for t in FOLD_TARGETS)}."
            )
        for layer, layer_path in zip(group, layer_paths, strict=True):
            if id(layer) not in index:
                raise ValueError(
                    f"awq: the layer paired with {path} (at "
                    f"{layer_path}) is not one of the selected layers."
                )
            outputs = np.shape(previous.weight)[0] if previous.weight is not None else 0
            if layer.weight.shape[1] != outputs:
                raise ValueError(
                    f"awq: the {type(previous).__name__} at {path} has {outputs} "
                    f"outputs, the layer at {layer_path} "
                    f"{layer.weight.shape[1]} inputs."
                )
        pairs.append((previous, group, path))
    owners = [index[id(layer)] for _, group, _ in pairs for layer in group]
    if len(owners) != len(set(owners)):
        raise ValueError("awq: a layer appears in two pairs of `fold`.")

    input_scale: dict[int, Array] = {}  # by layer number
    output_scale: dict[int, Array] = {}  # by id of the fold target
    with progress_bar(len(pairs) * len(batches), "awq", progress) as step:
        for previous, group, path in pairs:
            first = index[id(group[0])]
            stats = layer_inputs(
                model,
                weight_setter(first, filter, where),
                group[0].weight,
                1,
                batches,
                run,
                step,
            )
            if not stats.rows:
                raise ValueError(
                    f"awq: the layer at {layers[first][1]} met no input in any "
                    "batch: check that `apply` runs it."
                )
            s, _ = awq_scales(
                [layer.weight for layer in group],
                stats.hessian,
                stats.mean_abs,
                bits=bits,
                group_size=group_size,
                grid=grid,
            )
            _check_fold(model, previous, group, s, run, batches[0], path)
            for layer in group:
                input_scale[index[id(layer)]] = s
            output_scale[id(previous)] = s

    # Fold targets that are not quantised (norms, unselected layers) hold 1/s.
    current = _replaced(
        model,
        {
            id(previous): _divided(previous, output_scale[id(previous)])
            for previous, _, _ in pairs
            if id(previous) not in index
        },
    )
    arrays = []
    for k, (layer, _) in enumerate(layers):
        w = layer.weight
        if k in input_scale:
            w = w * input_scale[k].astype(w.dtype)
        if id(layer) in output_scale:
            s_out = output_scale[id(layer)].astype(w.dtype)
            w = w / s_out[:, None]
            if layer.bias is not None:
                current = _replace_bias(current, k, filter, where, layer.bias / s_out)
        q, scale, zero = awq_quantise(
            w.astype(jnp.promote_types(w.dtype, jnp.float32)), bits, group_size
        )
        array = gptq_array(
            q.T.astype(jnp.int32),
            zero.T.astype(jnp.int32),
            scale.T.astype(layer.weight.dtype),
            None,
        )
        arrays.append((weight_setter(k, filter, where), array))
    return with_matmul(current, arrays, matmul)


def _replace_bias(
    model: PyTree, k: int, filter: Any, where: Any, bias: Array
) -> PyTree:
    """`model` with the bias of its `k`-th selected layer replaced."""
    return map_layers(
        lambda i, layer: (
            eqx.tree_at(lambda n: n.bias, layer, bias) if i == k else layer
        ),
        model,
        filter=filter,
        where=where,
    )
