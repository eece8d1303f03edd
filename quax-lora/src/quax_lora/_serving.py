"""Serving many adapters without recompiling: the serving form of a model (its
scaling folded into `a`, no dropout), which makes adapters of one rank and dtype
share a compiled program whatever their `alpha`; adapters of different ranks in
one batch, padded with zeros to one rank (`stack_mixed_ranks`) or to a few
power-of-two buckets (`bucket_by_rank`, `serve_by_bucket`).

A compiled step (`jax.jit`, `eqx.filter_jit`, `nnx.jit`) is keyed by the
structure of its arguments: the shapes and dtypes of the arrays and the static
fields. A `LoraArray`'s static fields are `alpha`, `variant`, `dropout`,
`stop_gradient`, `allow_materialise`, `row_ndim`, `adapters`, `init` and
`init_settings`: an adapter that differs from the last one only in `a` and `b`
(say loaded by `load_adapter`, which checks that every setting agrees) runs the
compiled program; one of another `alpha` or dropout compiles again. The serving
form sets them alike for every adapter of a rank."""

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import ArrayLike, PyTree

from ._value import LoraArray
from ._variants import stack_adapters


__all__ = [
    "AdapterBuckets",
    "bucket_by_rank",
    "for_serving",
    "serve_by_bucket",
    "stack_mixed_ranks",
]


def _is_lora(x: Any) -> bool:
    return isinstance(x, LoraArray)


def _served(x: LoraArray) -> LoraArray:
    if x.adapters is not None:
        raise ValueError(
            f"quax_lora.for_serving: the LoraArray of shape {x.shape} stacks "
            f"{x.adapters} adapters; bring each model to its serving form before "
            "stacking them."
        )
    dtype = jnp.promote_types(x.adapter_dtype, jnp.float32)
    return x.replace(
        a=(x.a.astype(dtype) * x.scaling).astype(x.adapter_dtype),
        alpha=None,
        variant="dora" if x.variant == "dora" else "lora",
        dropout=0.0,
        dropout_key=None,
    )


def for_serving(model: PyTree) -> PyTree:
    """The model with the static settings of every [`quax_lora.LoraArray`][] that
    do not change its outputs at inference set alike, so that any two adapters
    of the same rank, dtype, layers and base share one compiled program:

    - the scaling `s` (`alpha / rank`, `alpha / sqrt(rank)` for rsLoRA) folded
        into `a` (`a <- s a`, rounded once to the adapter's dtype) and `alpha`
        set to `None` (a scaling of 1); rsLoRA becomes plain LoRA, which it then
        computes;
    - LoRA dropout off (`dropout=0`, no key): it drops nothing at inference.

    ```python
    step = jax.jit(lambda model, x: quax.quaxify(model)(x))
    step(quax_lora.for_serving(tuned_a), x)  # compiles
    step(quax_lora.for_serving(tuned_b), x)  # another alpha: runs the same program
    ```

    **Arguments:**

    - `model`: a loraified model (Equinox PyTree), one adapter per `LoraArray`.

    **Returns:**

    The model in its serving form: the same outputs (up to the rounding of
    `s a`), for inference. (Train the model as it was: `a` now carries `s`.)
    """
    return jtu.tree_map(
        lambda x: _served(x) if isinstance(x, LoraArray) else x,
        model,
        is_leaf=_is_lora,
    )


def _padded(x: LoraArray, rank: int) -> LoraArray:
    """`x` (in serving form) with `rank - x.rank` zero columns of `a` and rows of
    `b`: the same update `a b`."""
    extra = rank - x.rank
    a_pad = [(0, 0)] * (x.a.ndim - 1) + [(0, extra)]
    b_pad = [(0, 0)] * x.b.ndim
    b_pad[x.batch_ndim] = (0, extra)
    return x.replace(a=jnp.pad(x.a, a_pad), b=jnp.pad(x.b, b_pad))


def _layer_ranks(model: PyTree) -> list[int]:
    return [x.rank for x in jtu.tree_leaves(model, is_leaf=_is_lora) if _is_lora(x)]


def stack_mixed_ranks(models: Sequence[PyTree], *, rank: int | None = None) -> PyTree:
    """Stack the adapters of `models` (as [`quax_lora.stack_adapters`][] does),
    whatever their ranks and `alpha`s: each is brought to its serving form
    ([`quax_lora.for_serving`][], its scaling folded into `a`) and padded with
    zeros to `rank` (zero columns of `a`, zero rows of `b`: the same update).
    Rows then select their adapter with [`quax_lora.select_adapter`][], in one
    compiled program, each row costing what an adapter of rank `rank` costs.

    **Arguments:**

    - `models`: models loraified alike (the same layers and variant) from one
        base model, of any ranks and `alpha`s.
    - `rank`: the rank to pad every layer to: at least the largest. By default
        each layer's largest.

    **Returns:**

    The first model with the stacked, padded adapters (`alpha=None`).

    **Raises:**

    `ValueError` when a layer's rank exceeds `rank`, or as `stack_adapters`
    raises.
    """
    if not models:
        raise ValueError("quax_lora.stack_mixed_ranks needs at least one model.")
    flats = [jtu.tree_flatten(for_serving(m), is_leaf=_is_lora) for m in models]
    treedef = flats[0][1]
    if any(other != treedef for _, other in flats[1:]):
        raise ValueError(
            "quax_lora.stack_mixed_ranks: the models do not share model 0's "
            "structure (other layers adapted, or another model). Stack models "
            "loraified alike from the same base model."
        )
    layers = [i for i, x in enumerate(flats[0][0]) if _is_lora(x)]
    if not layers:
        raise ValueError("quax_lora.stack_mixed_ranks: the models have no LoraArray.")
    largest = {i: max(leaves[i].rank for leaves, _ in flats) for i in layers}
    if rank is not None and max(largest.values()) > rank:
        raise ValueError(
            f"quax_lora.stack_mixed_ranks(rank={rank}): a layer has rank "
            f"{max(largest.values())}, above it; pass rank >= "
            f"{max(largest.values())}."
        )
    padded = [
        jtu.tree_unflatten(
            treedef,
            [
                _padded(x, largest[i] if rank is None else rank) if i in largest else x
                for i, x in enumerate(leaves)
            ],
        )
        for leaves, _ in flats
    ]
    return stack_adapters(padded)


@dataclasses.dataclass(frozen=True)
class AdapterBuckets:
    """Adapters grouped by rank, each group stacked and padded to one rank (see
    [`quax_lora.bucket_by_rank`][]).

    **Fields:**

    - `ranks`: the rank of each bucket, increasing.
    - `models`: the stacked model of each bucket (padded to its rank).
    - `bucket`: for each adapter (in the order given), its bucket's position.
    - `index`: for each adapter, its position in its bucket's stack.
    """

    ranks: tuple[int, ...]
    models: tuple[PyTree, ...]
    bucket: np.ndarray
    index: np.ndarray


def bucket_by_rank(
    models: Sequence[PyTree], *, buckets: Sequence[int] | None = None
) -> AdapterBuckets:
    """Group the adapters of `models` by rank: each adapter goes to the smallest
    bucket rank at least its own (the largest rank of its layers), and each
    bucket is stacked with [`quax_lora.stack_mixed_ranks`][] at its rank. A
    batch is then served with [`quax_lora.serve_by_bucket`][]: each bucket's
    rows through its stack, so a row costs its bucket's rank, not the largest.

    **Arguments:**

    - `models`: models loraified alike from one base model, of any ranks.
    - `buckets`: the bucket ranks; by default the powers of two from the
        smallest rank's to the largest's (ranks 4 to 64: 4, 8, 16, 32, 64).

    **Returns:**

    An [`quax_lora.AdapterBuckets`][] (empty buckets left out).
    """
    if not models:
        raise ValueError("quax_lora.bucket_by_rank needs at least one model.")
    ranks = [max(_layer_ranks(m)) for m in models]
    if buckets is None:
        low, high = math.ceil(math.log2(min(ranks))), math.ceil(math.log2(max(ranks)))
        buckets = [2**p for p in range(low, high + 1)]
    buckets = sorted(set(buckets))
    if max(ranks) > buckets[-1]:
        raise ValueError(
            f"quax_lora.bucket_by_rank: an adapter has rank {max(ranks)}, above the "
            f"largest bucket {buckets[-1]}; add a bucket of at least that rank."
        )
    chosen = [next(b for b in buckets if b >= r) for r in ranks]
    used = sorted(set(chosen))
    bucket = np.array([used.index(c) for c in chosen])
    index = np.zeros(len(models), int)
    stacks = []
    for rank in used:
        members = [j for j, c in enumerate(chosen) if c == rank]
        index[members] = np.arange(len(members))
        stacks.append(stack_mixed_ranks([models[j] for j in members], rank=rank))
    return AdapterBuckets(tuple(used), tuple(stacks), bucket, index)


def serve_by_bucket(
    call: Callable[[PyTree, Any, Any], Any],
    buckets: AdapterBuckets,
    xs: ArrayLike,
    adapter: ArrayLike | Sequence[int],
) -> jax.Array:
    """Run a batch whose rows use different adapters, one bucket at a time: the
    rows of each bucket (chosen here, on the host, from `adapter`) through that
    bucket's stack, their number padded up to a power of two (repeating the
    last row) so that `call` compiles once per bucket and power of two, not per
    batch.

    ```python
    @jax.jit
    def call(model, xs, index):  # one row per index
        return jax.vmap(lambda x, i: quax.quaxify(
            quax_lora.select_adapter(model, i))(x))(xs, index)

    buckets = quax_lora.bucket_by_rank(tuned_models)
    ys = quax_lora.serve_by_bucket(call, buckets, xs, adapter_of_row)
    ```

    **Arguments:**

    - `call`: `call(model, xs, index)`, the rows `xs` through `model` with the
        stacked adapter `index[r]` for row `r` (compiled, as above).
    - `buckets`: from [`quax_lora.bucket_by_rank`][].
    - `xs`: the batch, rows along the first axis.
    - `adapter`: each row's adapter (a concrete integer array, the position of
        its model in `bucket_by_rank`'s `models`).

    **Returns:**

    The outputs of the rows, in their order.
    """
    adapter = np.asarray(adapter)
    if adapter.ndim != 1 or adapter.shape[0] != np.shape(xs)[0]:
        raise ValueError(
            f"quax_lora.serve_by_bucket needs one adapter per row: {np.shape(xs)[0]} "
            f"rows and adapters of shape {adapter.shape}."
        )
    if adapter.size and not (
        adapter.min() >= 0 and adapter.max() < len(buckets.bucket)
    ):
        raise ValueError(
            f"quax_lora.serve_by_bucket: adapters {adapter.min()}..{adapter.max()} "
            f"given, and the buckets hold {len(buckets.bucket)}."
        )
    row_bucket = buckets.bucket[adapter]
    parts, order = [], []
    for position, model in enumerate(buckets.models):
        rows = np.nonzero(row_bucket == position)[0]
        if rows.size == 0:
            continue
        size = 1 << (int(rows.size) - 1).bit_length()
        padded = np.concatenate([rows, np.full(size - rows.size, rows[-1])])
        out = call(model, jnp.asarray(xs)[padded], buckets.index[adapter[padded]])
        parts.append(out[: rows.size])
        order.append(rows)
    inverse = np.argsort(np.concatenate(order))
    return jnp.concatenate(parts)[inverse]
