"""GPTQ (Frantar et al., 2022): quantise each linear layer's weight column by
column, compensating each column's rounding error in the columns not yet
quantised through the inverse Hessian of the layer's squared output error.

`gptq` quantises the selected layers one after another, in the order the
selection visits them (the model's pytree order, which for Equinox modules is the
order of their fields); each layer's Hessian `H = 2 X^T X` is gathered from its
inputs over the calibration batches with every earlier layer already quantised,
as the paper does, so that later layers compensate what earlier ones lost.
`quantise_columns` is the algorithm on one weight, given `H`.
"""

import dataclasses
import functools as ft
import math
from collections.abc import Callable, Iterable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax
from jaxtyping import Array, PyTree

from ._checkpoint import gptq_array
from ._layer_inputs import layer_inputs, map_layers, paths_of, progress_bar
from ._nnx import nnx_of
from ._value import MATMUL_PATHS


__all__ = ["BLOCK_COLUMNS", "GPTQ_BITS", "gptq", "quantise_columns"]

# The columns quantised between two updates of the rest of the weight (the
# paper's lazy batches, "B = 128").
BLOCK_COLUMNS = 128

# The bit widths `gptq` and `awq` compute. The result is stored as int4 (two
# integers per byte) whatever the width: 2 and 3 bits keep 4 bits of memory.
GPTQ_BITS = (2, 3, 4)


def grid_params(x: Array, maxq: int, symmetric: bool) -> tuple[Array, Array]:
    """GPTQ's min-max grid of each row of `x` `(rows, k)`: `(scale, zero)`,
    each `(rows,)`, with `0 <= zero <= maxq` an integer (as floats). The range
    always holds 0; a row of zeros gets the range `[-1, 1]`."""
    xmin = jnp.minimum(jnp.min(x, axis=1), 0)
    xmax = jnp.maximum(jnp.max(x, axis=1), 0)
    if symmetric:
        xmax = jnp.maximum(-xmin, xmax)
        xmin = jnp.where(xmin < 0, -xmax, xmin)
    empty = (xmin == 0) & (xmax == 0)
    xmin = jnp.where(empty, -1, xmin)
    xmax = jnp.where(empty, 1, xmax)
    scale = (xmax - xmin) / maxq
    if symmetric:
        zero = jnp.full_like(scale, (maxq + 1) // 2)
    else:
        zero = jnp.round(-xmin / scale)
    return scale, zero


def block_columns(group_size: int) -> int:
    """The lazy-batch width for groups of `group_size` columns: 128 where the
    groups and the batches nest (one divides the other), else their greatest
    common divisor, so that every group starts at a batch's first column or lies
    inside one batch (see `quantise_columns`)."""
    if group_size % BLOCK_COLUMNS == 0 or BLOCK_COLUMNS % group_size == 0:
        return BLOCK_COLUMNS
    return math.gcd(group_size, BLOCK_COLUMNS)


@ft.partial(jax.jit, static_argnames=("maxq", "group_size", "block", "symmetric"))
def _columns(
    w: Array, u: Array, *, maxq: int, group_size: int, block: int, symmetric: bool
) -> tuple[Array, Array, Array]:
    """The column loop on `w` `(rows, n)` and the upper Cholesky factor `u` of
    `H^-1` `(n, n)`, `n` a multiple of `block` and of the groups. Returns the
    integers `(rows, n)` and each group's scale and zero `(rows, n / group_size)`."""
    rows, n = w.shape
    groups = n // group_size
    inside = group_size <= block  # groups start inside a batch, else at its start

    def fresh(x: Array) -> tuple[Array, Array]:
        return grid_params(x, maxq, symmetric)

    def batch(b: Array, carry: Any) -> Any:
        w, q, scales, zeros, scale, zero = carry
        i1 = b * block
        w1 = lax.dynamic_slice_in_dim(w, i1, block, axis=1)
        u1 = lax.dynamic_slice(u, (i1, i1), (block, block))
        if not inside:
            # A group starting here spans whole batches: all its columns have
            # every update of the earlier batches.
            scale, zero = lax.cond(
                i1 % group_size == 0,
                lambda: fresh(lax.dynamic_slice_in_dim(w, i1, group_size, axis=1)),
                lambda: (scale, zero),
            )
            scales = scales.at[:, i1 // group_size].set(scale)
            zeros = zeros.at[:, i1 // group_size].set(zero)

        def column(i: Array, carry: Any) -> Any:
            w1, q1, e1, scales, zeros, scale, zero = carry
            if inside:
                # A group starting inside this batch: its columns, with every
                # update of the columns quantised before it (in `w1`).
                scale, zero = lax.cond(
                    i % group_size == 0,
                    lambda: fresh(lax.dynamic_slice_in_dim(w1, i, group_size, axis=1)),
                    lambda: (scale, zero),
                )
                scales = scales.at[:, (i1 + i) // group_size].set(scale)
                zeros = zeros.at[:, (i1 + i) // group_size].set(zero)
            col = lax.dynamic_index_in_dim(w1, i, axis=1, keepdims=False)
            qc = jnp.clip(jnp.round(col / scale) + zero, 0, maxq)
            err = (col - scale * (qc - zero)) / u1[i, i]
            # u1 is upper triangular: the columns before i are not changed.
            w1 = w1 - err[:, None] * lax.dynamic_index_in_dim(u1, i, axis=0)
            q1 = lax.dynamic_update_index_in_dim(q1, qc, i, axis=1)
            e1 = lax.dynamic_update_index_in_dim(e1, err, i, axis=1)
            return w1, q1, e1, scales, zeros, scale, zero

        start = (w1, jnp.zeros_like(w1), jnp.zeros_like(w1), scales, zeros, scale, zero)
        _, q1, e1, scales, zeros, scale, zero = lax.fori_loop(0, block, column, start)
        q = lax.dynamic_update_slice_in_dim(q, q1, i1, axis=1)
        # The lazy update of every later column (u's rows i1..i2 are zero before
        # i1; the batch's own columns are changed too, and never read again).
        w = w - e1 @ lax.dynamic_slice_in_dim(u, i1, block, axis=0)
        return w, q, scales, zeros, scale, zero

    zero_rows = jnp.zeros(rows, w.dtype)
    start = (
        w,
        jnp.zeros_like(w),
        jnp.zeros((rows, groups), w.dtype),
        jnp.zeros((rows, groups), w.dtype),
        zero_rows,
        zero_rows,
    )
    _, q, scales, zeros, _, _ = lax.fori_loop(0, n // block, batch, start)
    return q, scales, zeros


def quantise_columns(
    weight: Array,
    hessian: np.ndarray,
    *,
    bits: int = 4,
    group_size: int | None = 128,
    act_order: bool = False,
    damp: float = 0.01,
    symmetric: bool = False,
) -> tuple[Array, Array, Array, np.ndarray | None]:
    """GPTQ on one weight `(out, in)` given the Hessian `(in, in)` of its layer's
    squared output error (`2 X^T X` over the calibration inputs).

    Input features whose Hessian diagonal is 0 (never nonzero in calibration) are
    dead: their weights are set to 0 and their diagonal to 1. With `act_order`,
    the columns are visited by decreasing Hessian diagonal (ties in index order).
    `damp * mean(diag H)` is added to the diagonal; the upper Cholesky factor `U`
    of `H^-1` gives, for column `i`, the error `(w_i - q_i) / U_ii` spread over
    the later columns as `err * U[i, i:]`, applied within a batch of
    `block_columns(group_size)` columns and then to the rest at once (the
    paper's lazy batches: the same result as one column at a time). Each group's
    grid (min-max per output row, `grid_params`) is fixed when the loop reaches
    its first column, from its columns as updated by then.

    **Arguments:**

    - `weight`: the float weight `(out, in)` (`eqx.nn.Linear`'s layout).
    - `hessian`: `(in, in)`, `2 X^T X` over the calibration rows `X` (any
        positive multiple gives the same result).
    - `bits`, `group_size`, `act_order`, `damp`, `symmetric`: as for
        [`quax_quant.gptq`][].

    **Returns:**

    `(q, scales, zeros, features)`: unsigned integers `(in, out)` in the input
    features' own order; scales and zero points `(groups, out)` (groups in the
    order the loop visits them); `features`, for act-order, the input features
    sorted by group (the stored order `from_gptq` keeps), else `None`.
    """
    dtype = jnp.promote_types(weight.dtype, jnp.float32)
    in_features = weight.shape[1]
    size = in_features if group_size is None else group_size
    h = np.array(hessian, np.float64)
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w = jnp.asarray(weight, dtype).at[:, np.flatnonzero(dead)].set(0)
    perm = np.argsort(-np.diag(h), kind="stable") if act_order else None
    if perm is not None:
        w = w[:, perm]
        h = h[np.ix_(perm, perm)]
    h[np.diag_indices_from(h)] += damp * np.mean(np.diag(h))
    block = block_columns(size)
    width = math.lcm(block, size)
    padded = -(-in_features // width) * width
    with jax.default_matmul_precision("highest"):
        u = _inverse_factor(jnp.asarray(h, dtype), padded)
        if not bool(jnp.all(jnp.isfinite(u))):
            raise ValueError(
                "gptq: the damped Hessian is not positive definite in "
                f"{jnp.dtype(dtype).name} (its Cholesky factor has non-finite "
                f"entries); raise `damp` (now {damp})."
            )
        w = jnp.pad(w, ((0, 0), (0, padded - in_features)))
        q, scales, zeros = _columns(
            w, u, maxq=2**bits - 1, group_size=size, block=block, symmetric=symmetric
        )
    q = q[:, :in_features]
    groups = in_features // size
    scales, zeros = scales[:, :groups], zeros[:, :groups]
    features = None
    if perm is not None:
        q = q[:, np.argsort(perm)]
        g_idx = np.empty(in_features, np.int64)
        g_idx[perm] = np.arange(in_features) // size
        if groups > 1:
            features = np.argsort(g_idx, kind="stable")
    return (
        q.T.astype(jnp.int32),
        scales.T.astype(weight.dtype),
        zeros.T.astype(jnp.int32),
        features,
    )


@ft.partial(jax.jit, static_argnames="padded")
def _inverse_factor(h: Array, padded: int) -> Array:
    """The upper Cholesky factor of `h^-1`, padded with the identity to
    `(padded, padded)` (padded columns are independent of the others)."""
    n = h.shape[0]
    eye = jnp.eye(n, dtype=h.dtype)
    inverse = jsl.cho_solve((jnp.linalg.cholesky(h), True), eye)
    u = jnp.linalg.cholesky(inverse).T
    return jnp.eye(padded, dtype=h.dtype).at[:n, :n].set(u)


def _check_bits(caller: str, bits: int, group_size: int | None) -> None:
    if bits not in GPTQ_BITS:
        raise ValueError(
            f"{caller}: bits must be one of {GPTQ_BITS} (stored as int4), got {bits}."
        )
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(
            f"{caller}: group_size must be a positive integer or None, got "
            f"{group_size!r}."
        )


def linear_layers(
    caller: str,
    model: PyTree,
    group_size: int | None,
    filter: Any,
    where: Callable[[PyTree], Any] | None,
) -> list[tuple[Any, str]]:
    """The selected layers with a floating-point 2-D `weight` `(out, in)`, and
    their paths; a `ValueError` for an NNX model, for none, and for a group size
    that does not divide a layer's inputs."""
    if nnx_of(model) is not None:
        raise ValueError(
            f"{caller}: Flax NNX models are not supported yet; quantise an "
            "Equinox model, or use `quantise_model` (round to nearest) on this one."
        )
    found: list[Any] = []

    def collect(k: int, layer: Any) -> Any:
        found.append(layer)
        return layer

    map_layers(collect, model, filter=filter, where=where)
    layers = []
    for layer, path in zip(found, paths_of(model, found), strict=True):
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, jax.Array | np.ndarray) or (
            not eqx.is_inexact_array(weight) or weight.ndim != 2
        ):
            raise ValueError(
                f"{caller}: the {type(layer).__name__} at {path} "
                "has no floating-point 2-D `weight` (out, in) to quantise."
            )
        if group_size is not None and weight.shape[1] % group_size:
            raise ValueError(
                f"{caller}: group_size={group_size} does not divide the "
                f"{weight.shape[1]} inputs of the {type(layer).__name__} at "
                f"{path}."
            )
        layers.append((layer, path))
    if not layers:
        raise ValueError(
            f"{caller} matched no layer (filter={filter!r}, where={where!r}): "
            "nothing to quantise."
        )
    return layers


def weight_setter(
    k: int, filter: Any, where: Callable[[PyTree], Any] | None
) -> Callable[[PyTree, Any], PyTree]:
    """`set(model, value)`: `model` with the `weight` of its `k`-th selected
    layer replaced by `value`."""

    def set_weight(model: PyTree, value: Any) -> PyTree:
        def replace(i: int, layer: Any) -> Any:
            if i != k:
                return layer
            return eqx.tree_at(lambda layer: layer.weight, layer, value)

        return map_layers(replace, model, filter=filter, where=where)

    return set_weight


def with_matmul(
    model: PyTree,
    arrays: list[tuple[Callable[[PyTree, Any], PyTree], Any]],
    matmul: str,
) -> PyTree:
    """`model` with each `(set_weight, array)` of `arrays` set again, its
    product path `matmul`."""
    for set_weight, array in arrays:
        model = set_weight(model, dataclasses.replace(array, matmul=matmul))
    return model


def calibration_run(
    apply: Callable[[PyTree, Any], Any] | None, batches: Iterable[Any], caller: str
) -> tuple[Callable[[PyTree, Any], Any], list[Any]]:
    """The model runner (`model(batch)` by default) and the batches as a list
    (each layer runs them again), refusing none."""
    batches = list(batches)
    if not batches:
        raise ValueError(f"{caller}: `batches` is empty; pass at least one input.")
    return (apply if apply is not None else (lambda m, b: m(b))), batches


def gptq(
    model: PyTree,
    batches: Iterable[Any],
    *,
    bits: int = 4,
    group_size: int | None = 128,
    act_order: bool = False,
    damp: float = 0.01,
    symmetric: bool = False,
    apply: Callable[[PyTree, Any], Any] | None = None,
    filter: Any = eqx.nn.Linear,
    where: Callable[[PyTree], Any] | None = None,
    matmul: str = "auto",
    progress: bool = True,
) -> PyTree:
    """Quantise the linear layers of `model` with GPTQ (Frantar et al., 2022), from
    calibration inputs.

    ```python
    qmodel = quax_quant.gptq(
        model, batches, bits=4, group_size=128, apply=lambda m, x: jax.vmap(m)(x)
    )
    y = quax.quaxify(lambda m, x: jax.vmap(m)(x))(qmodel, x)
    ```

    The layers are quantised one after another, in the order the selection
    visits them (the model's pytree order: an Equinox module's fields in the
    order they are declared). For each, `apply(model, batch)` runs over every
    batch inside [`quax.quaxify`][], with the earlier layers already quantised
    and this layer's weight recording the Gram matrix of its inputs: the
    model's own code, unchanged. Then the weight is quantised column by column
    with the error-compensating update from the Cholesky factor of `H^-1`, in
    batches of 128 columns (the documentation's page "Calibrated quantisation"
    gives the algorithm, its cost and where it differs from AutoGPTQ). Each
    layer's Hessian `(in, in)` is the only one held; the
    float weights are the model's own (no float copy of the model is made).

    **Arguments:**

    - `model`: an Equinox model.
    - `batches`: an iterable of inputs (made a list: every layer runs them).
    - `bits`: 4, 3 or 2. Stored as int4 whatever the width.
    - `group_size`: one scale and zero point per output feature and group of this
        many consecutive inputs (in the order the loop visits them: with
        `act_order`, by decreasing Hessian diagonal); `None` for one per output
        feature. It must divide every selected layer's inputs.
    - `act_order`: visit the input features by decreasing Hessian diagonal
        (GPTQ's `desc_act`), with groups cut along that order (not AutoGPTQ's
        `static_groups`): the result keeps the features' order
        (`QuantisedArray.input_order`) as `from_gptq` does for such checkpoints.
    - `damp`: `damp * mean(diag H)` is added to the Hessian's diagonal.
    - `symmetric`: GPTQ's `sym`: zero points fixed at the middle of the range.
    - `apply`: `apply(model, batch)` runs the model; by default `model(batch)`.
        For an Equinox model of one example, `lambda m, x: jax.vmap(m)(x)`.
    - `filter`, `where`: which layers, as for [`quax_quant.quantise_model`][];
        by default every `eqx.nn.Linear`. Each selected layer's `weight` must be
        used in products contracting its inputs (`weight @ x`).
    - `matmul`: the product path of the result (see [`quax_quant.quantise`][]).
    - `progress`: show a progress bar (tqdm, if installed) when calibration runs
        longer than a few seconds.

    **Returns:**

    A copy of `model` whose selected layers' weights are asymmetric int4
    [`quax_quant.QuantisedArray`][]s, exactly as [`quax_quant.from_gptq`][]
    reads such a layer; [`quax_quant.to_gptq`][] writes them in GPTQ's packed
    layout (with `format="gptq_v2"` where a zero point is 0).

    **Raises:**

    `ValueError` for an empty `batches`, a layer no batch reached, a
    `group_size` that does not divide a layer's inputs, `bits` outside 2-4, a
    Hessian that damping does not make positive definite, and a Flax NNX model
    (not supported yet).
    """
    _check_bits("gptq", bits, group_size)
    if matmul not in MATMUL_PATHS:
        raise ValueError(f"gptq: matmul must be one of {MATMUL_PATHS}, got {matmul!r}.")
    layers = linear_layers("gptq", model, group_size, filter, where)
    run, batches = calibration_run(apply, batches, "gptq")
    current, arrays = model, []
    with progress_bar(len(layers) * len(batches), "gptq", progress) as step:
        for k, (layer, path) in enumerate(layers):
            set_weight = weight_setter(k, filter, where)
            stats = layer_inputs(
                current, set_weight, layer.weight, 1, batches, run, step
            )
            if not stats.rows:
                raise ValueError(
                    f"gptq: the {type(layer).__name__} at {path} met no input in any "
                    "batch: check that `apply` runs it, or leave it out (`where=`)."
                )
            q, scales, zeros, features = quantise_columns(
                layer.weight,
                stats.hessian,
                bits=bits,
                group_size=group_size,
                act_order=act_order,
                damp=damp,
                symmetric=symmetric,
            )
            # Exact products while the later layers calibrate.
            array = gptq_array(q, zeros, scales, features, matmul="weight_only")
            current = set_weight(current, array)
            arrays.append((set_weight, array))
    return with_matmul(current, arrays, matmul)
