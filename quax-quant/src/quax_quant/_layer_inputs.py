"""What one layer's inputs look like over calibration batches, gathered through the
model's own code: the statistics GPTQ and AWQ quantise from.

The chosen layer's weight is replaced by a `RecordingWeight`, a quax value whose
product is the float product and which also sends, through `jax.debug.callback`,
the Gram matrix `X^T X` of the inputs it contracts with (the features along the
weight's input axis, every other axis a row), their absolute sum per feature and
their number of rows. `layer_inputs` runs `apply(model, batch)` inside
`quax.quaxify` over the batches, compiled once, and sums these on the host in
float64. One layer at a time: the caller holds one `in x in` matrix.
"""

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import quax
from jax import lax
from jaxtyping import Array, ArrayLike, PyTree


__all__ = [
    "InputStatistics",
    "RecordingWeight",
    "layer_inputs",
    "map_layers",
    "paths_of",
    "progress_bar",
    "recorded_dot",
    "recorded_transpose",
]

# A calibration that runs longer than this many seconds shows a progress bar.
PROGRESS_DELAY = 3.0


@dataclasses.dataclass
class InputStatistics:
    """The sums over every row `x` (a vector of the layer's input features) that
    the layer met: `gram = sum x x^T` and `abs_sum = sum |x|` (float64), and
    `rows`, how many."""

    gram: np.ndarray
    abs_sum: np.ndarray
    rows: int = 0

    def add(self, gram: Any, abs_sum: Any, rows: Any) -> None:
        self.gram += np.asarray(gram, np.float64)
        self.abs_sum += np.asarray(abs_sum, np.float64)
        self.rows += int(rows)

    @property
    def hessian(self) -> np.ndarray:
        """GPTQ's `H = 2 X^T X` over the rows, divided by their number (a positive
        factor changes neither GPTQ's nor AWQ's result)."""
        return 2.0 * self.gram / max(self.rows, 1)

    @property
    def mean_abs(self) -> np.ndarray:
        """AWQ's activation magnitude: the mean of `|x|` per input feature."""
        return self.abs_sum / max(self.rows, 1)


class RecordingWeight(quax.ArrayValue):
    """A float weight whose products with a float operand record that operand's
    statistics (see the module docstring) through `record(gram, abs_sum, rows)`.
    A transpose keeps recording (`x @ w.T`); every other operation sees the
    float weight."""

    weight: Array
    axis: int = eqx.field(static=True)
    record: Callable[[Any, Any, Any], None] = eqx.field(static=True)

    aval_leaf: ClassVar[str] = "weight"

    def aval(self) -> jax.core.ShapedArray:
        return jax.typeof(self.weight)

    def materialise(self) -> Array:
        return self.weight


def recorded_dot(
    w: RecordingWeight, x: ArrayLike, w_is_lhs: bool, dn: Any, params: Any
) -> Array:
    (lc, rc), (lb, rb) = dn
    w_contract, x_contract = (lc, rc) if w_is_lhs else (rc, lc)
    w_batch = lb if w_is_lhs else rb
    if tuple(w_contract) != (w.axis,) or w_batch:
        raise ValueError(
            "quax_quant calibration: the weight being calibrated (shape "
            f"{w.shape}) met a `dot_general` that does not contract its input axis "
            f"{w.axis} alone (dimension numbers {dn}); GPTQ and AWQ need the "
            "layer's inputs as rows of features. Select only layers used as "
            "`weight @ x` (`filter=`/`where=`)."
        )
    x = jnp.asarray(x)
    rows = jnp.moveaxis(x, x_contract[0], -1).reshape(-1, x.shape[x_contract[0]])
    rows = rows.astype(jnp.promote_types(rows.dtype, jnp.float32))
    gram = lax.dot_general(
        rows, rows, (((0,), (0,)), ((), ())), precision=lax.Precision.HIGHEST
    )
    abs_sum = jnp.sum(jnp.abs(rows), axis=0)
    jax.debug.callback(w.record, gram, abs_sum, rows.shape[0])
    operands = (w.weight, x) if w_is_lhs else (x, w.weight)
    return lax.dot_general(*operands, dn, **params)


def recorded_transpose(
    operand: RecordingWeight, permutation: Sequence[int]
) -> RecordingWeight:
    """`operand` transposed, still recording: `x @ w.T` records as `w @ x` does
    (the input axis moves with the transpose)."""
    return RecordingWeight(
        lax.transpose(operand.weight, tuple(permutation)),
        list(permutation).index(operand.axis),
        operand.record,
    )


def paths_of(model: PyTree, nodes: Sequence[Any]) -> list[str]:
    """Where each of `nodes` (objects inside `model`) is, as
    `jax.tree_util.keystr` writes it (`.layers[1]`)."""
    wanted = {id(node) for node in nodes}
    found = {
        id(node): jtu.keystr(path)
        for path, node in jtu.tree_flatten_with_path(
            model, is_leaf=lambda x: id(x) in wanted
        )[0]
    }
    return [found.get(id(node), "<model>" if node is model else "?") for node in nodes]


def map_layers(
    fn: Callable[[int, Any], Any],
    model: PyTree,
    *,
    filter: type | tuple[type, ...] | Callable[[Any], bool],
    where: Callable[[PyTree], Any] | None,
) -> PyTree:
    """`quax.map_selected` with each selected layer's number (in the order the
    selection visits them, the model's pytree order) passed to `fn(k, layer)`."""
    count = itertools.count()
    return quax.map_selected(
        lambda layer: fn(next(count), layer), model, filter=filter, where=where
    )


@contextlib.contextmanager
def progress_bar(total: int, description: str, show: bool) -> Iterator[Any]:
    """A tqdm bar of `total` steps, shown once the work has run `PROGRESS_DELAY`
    seconds (tqdm is optional: without it, or with `show=False`, nothing is
    shown). Yields a callable that advances it by one step."""
    bar = None
    if show:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # tqdm is optional
            pass
        else:
            bar = tqdm(total=total, desc=description, delay=PROGRESS_DELAY)
    try:
        yield (lambda: None) if bar is None else (lambda: bar.update(1))
    finally:
        if bar is not None:
            bar.close()


def layer_inputs(
    model: PyTree,
    set_weight: Callable[[PyTree, Any], PyTree],
    weight: Array,
    axis: int,
    batches: Iterable[Any],
    run: Callable[[PyTree, Any], Any],
    step: Callable[[], None],
) -> InputStatistics:
    """The statistics of the inputs that `weight` (at `set_weight`'s place in
    `model`, input features along `axis`) meets when `run(model, batch)` runs on
    each batch inside `quax.quaxify`; `step()` after each batch."""
    features = weight.shape[axis]
    stats = InputStatistics(
        np.zeros((features, features), np.float64), np.zeros(features, np.float64)
    )

    def record(gram: Any, abs_sum: Any, rows: Any) -> None:
        stats.add(gram, abs_sum, rows)

    # `record` is a static field: a new program for each layer, never reused by
    # another calibration (whose `record` is another function).
    recording = set_weight(model, RecordingWeight(weight, axis, record))
    forward = eqx.filter_jit(quax.quaxify(run))
    for batch in batches:
        jax.block_until_ready(forward(recording, batch))
        step()
    jax.effects_barrier()
    return stats
