"""Whole-model helpers for what a `LoraArray` carries besides its adapter: many
adapters stacked in one array (`stack_adapters`, `select_adapter`,
`unstack_adapters`), and the key of LoRA dropout (`with_dropout_key`)."""

import itertools
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer
from jaxtyping import ArrayLike, PRNGKeyArray, PyTree

from ._value import LoraArray


__all__ = ["select_adapter", "stack_adapters", "unstack_adapters", "with_dropout_key"]


def _is_lora(x: Any) -> bool:
    return isinstance(x, LoraArray)


def _stack(loras: Sequence[LoraArray], path: str) -> LoraArray:
    first = loras[0]
    for i, x in enumerate(loras[1:], start=1):
        mismatched = [
            name
            for name, same in (
                ("shape", x.shape == first.shape),
                ("dtype", x.dtype == first.dtype),
                ("adapter dtype", x.adapter_dtype == first.adapter_dtype),
                ("rank", x.rank == first.rank),
                ("scaling", x.scaling == first.scaling),
                ("variant", x.variant == first.variant),
                ("batch_ndim", x.batch_ndim == first.batch_ndim),
                ("row_ndim", x.row_ndim == first.row_ndim),
                (
                    "init (the base weight each was made for)",
                    (x.init, x.init_settings) == (first.init, first.init_settings),
                ),
                ("stacked already", x.adapters is None and first.adapters is None),
            )
            if not same
        ]
        if mismatched:
            raise ValueError(
                f"quax_lora.stack_adapters: the adapter of layer `{path}` in model "
                f"{i} differs from model 0's in {', '.join(mismatched)}. Stack "
                "models loraified alike (the same layers, rank=, alpha= and "
                "variant=) from the same base model."
            )
    magnitude = (
        None if first.magnitude is None else jnp.stack([x.magnitude for x in loras])  # type: ignore[misc]
    )
    return first.replace(
        a=jnp.stack([x.a for x in loras]),
        b=jnp.stack([x.b for x in loras]),
        magnitude=magnitude,
        index=None,
        adapters=len(loras),
    )


def stack_adapters(models: Sequence[PyTree]) -> PyTree:
    """Stack the adapters of `k` fine-tuned copies of one model into one model whose
    every [`quax_lora.LoraArray`][] holds the `k` adapters (`a` of shape
    `(k, *batch, n, rank)`, `b` of `(k, *batch, rank, m)`) and the base weight
    once: multi-LoRA serving, one batch whose rows each use their own adapter.

    ```python
    multi = quax_lora.stack_adapters([tuned_0, tuned_1, tuned_2])

    def call(x, i):  # i: which adapter this row uses
        return quax.quaxify(quax_lora.select_adapter(multi, i))(x)

    y = jax.jit(jax.vmap(call))(xs, adapter_of_row)
    ```

    Every product then computes `w x + s a[i] (b[i] x)`: a gather of the factors
    of each row's adapter, never `k` dense weights.

    **Arguments:**

    - `models`: the fine-tuned models, each loraified alike (the same layers, rank,
        `alpha` and variant) from one base model; the base weights and every
        other leaf are taken from the first.

    **Returns:**

    The first model with stacked adapters. Call it through
    [`quax_lora.select_adapter`][].

    **Raises:**

    `ValueError` when the models adapt different layers or a layer's adapters
    differ in shape, rank, scaling or variant.
    """
    if not models:
        raise ValueError("quax_lora.stack_adapters needs at least one model.")
    flats = [jtu.tree_flatten_with_path(m, is_leaf=_is_lora) for m in models]
    treedef = flats[0][1]
    for i, (_, other) in enumerate(flats[1:], start=1):
        if other != treedef:
            raise ValueError(
                f"quax_lora.stack_adapters: model {i} does not have model 0's "
                "structure (other layers adapted, or another model). Stack models "
                "loraified alike from the same base model."
            )
    leaves = []
    for column in zip(*(flat for flat, _ in flats), strict=True):
        path, first = column[0]
        if isinstance(first, LoraArray):
            leaves.append(_stack([x for _, x in column], jtu.keystr(path)))
        else:
            leaves.append(first)
    return jtu.tree_unflatten(treedef, leaves)


def select_adapter(model: PyTree, index: ArrayLike) -> PyTree:
    """Select which of the stacked adapters (see [`quax_lora.stack_adapters`][])
    every `LoraArray` of `model` uses.

    **Arguments:**

    - `model`: a model with stacked adapters.
    - `index`: an integer in `[-k, k)`, of shape `()`; traced is fine, and
        inside `jax.vmap` one per row of the batch. A negative index counts from
        the end, as Python's and JAX's indexing do (`-1` is adapter `k - 1`). A
        concrete index (a Python or NumPy integer, a JAX array outside a
        transform) outside `[-k, k)` is refused. A traced one (under `jax.jit`
        or `jax.vmap`) cannot be checked before it runs: outside `[-k, k)`, it
        is clamped, as JAX's indexing clamps (`k + 3` runs adapter `k - 1`,
        `-k - 3` adapter 0); check it where it is made if it may be out of
        range.

    **Returns:**

    `model` with `index` set in every stacked `LoraArray` (others are unchanged).

    **Raises:**

    `ValueError` for an index that is not one integer, and for a concrete index
    outside `[-k, k)` for some stacked `LoraArray` of `model`.
    """
    given = index
    index = jnp.asarray(index)
    if index.shape != () or not jnp.issubdtype(index.dtype, jnp.integer):
        raise ValueError(
            f"quax_lora.select_adapter needs one integer index of shape (), got "
            f"shape {index.shape} and dtype {index.dtype}. For one adapter per row "
            "of a batch, call it inside jax.vmap with the rows' indices."
        )
    # One dtype for every index, and not weakly typed: a compiled step given the
    # model with index 3 (a Python integer, weakly typed int32) and then with
    # np.int64(5) would otherwise see two types, and compile twice.
    index = index.astype(jnp.int32)
    # An index that is no tracer is known now, also inside `jax.jit` (a Python
    # integer there), and is checked against every stack below.
    concrete = None if isinstance(given, Tracer) else int(np.asarray(given))

    def leaf(x: Any) -> Any:
        if isinstance(x, LoraArray) and x.adapters is not None:
            if concrete is not None and not -x.adapters <= concrete < x.adapters:
                raise ValueError(
                    f"quax_lora.select_adapter: index {concrete} is not in "
                    f"[-{x.adapters}, {x.adapters}) for a LoraArray of shape "
                    f"{x.shape} holding {x.adapters} adapters. Pass the index of "
                    "one of the stacked adapters (a negative one counts from the "
                    "end)."
                )
            return x.replace(index=index)
        return x

    return jtu.tree_map(leaf, model, is_leaf=_is_lora)


def unstack_adapters(model: PyTree, index: int) -> PyTree:
    """The model with adapter `index` of the stacked ones: its `LoraArray`s hold
    that adapter alone again (to merge, save or train it).

    **Arguments:**

    - `model`: a model with stacked adapters.
    - `index`: a Python integer in `[0, k)`.

    **Returns:**

    A copy of `model` with one adapter per `LoraArray`.
    """

    def leaf(x: Any) -> Any:
        if isinstance(x, LoraArray) and x.adapters is not None:
            if not 0 <= index < x.adapters:
                raise ValueError(
                    f"quax_lora.unstack_adapters: index {index} is not in "
                    f"[0, {x.adapters}) for a LoraArray holding {x.adapters} adapters."
                )
            return x.replace(index=jnp.asarray(index)).selected()
        return x

    return jtu.tree_map(leaf, model, is_leaf=_is_lora)


def with_dropout_key(model: PyTree, key: PRNGKeyArray | None) -> PyTree:
    """Set the key of LoRA dropout in every `LoraArray` of `model` made with
    `dropout > 0` (each layer gets its own, folded from `key`); `None` turns
    dropout off, as for inference.

    ```python
    def loss(params, x, y, key):
        model = quax_lora.with_dropout_key(eqx.combine(params, frozen), key)
        return quax.quaxify(loss_fn)(model, x, y)
    ```

    The key is part of the model: inside `jax.vmap` over a batch, pass one key
    per row (`jax.vmap` over `jax.random.split(key, batch)`) for independent
    masks, as with `eqx.nn.Dropout`.

    **Arguments:**

    - `model`: a loraified model.
    - `key`: a `jax.random` key, or `None`.

    **Returns:**

    A copy of `model` with the keys set.
    """
    counter = itertools.count()

    def leaf(x: Any) -> Any:
        if isinstance(x, LoraArray) and x.dropout > 0:
            layer_key = None if key is None else jr.fold_in(key, next(counter))
            return x.replace(dropout_key=layer_key)
        return x

    return jtu.tree_map(leaf, model, is_leaf=_is_lora)
