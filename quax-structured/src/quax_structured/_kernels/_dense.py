"""Dense and elementwise helpers on plain arrays: a triangular solve through a
unit diagonal, a diagonal placed in a matrix, `where`-style masking, the
failure test of a Cholesky factorisation, a branch's predicate decided once
for a `vmap` batch, and sums of several vectors in one reduction."""

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array


__all__ = [
    "dense_triangular_solve",
    "failed_factorisation",
    "for_the_batch",
    "keep_or_scale",
    "nan_where",
    "on_diagonal",
    "stacked_sums",
]


def dense_triangular_solve(
    a: Array, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
) -> Array:
    """`lax.linalg.triangular_solve(a, b, left_side=True, ...)` through a unit
    diagonal: the rows of `a` (and `b`) are scaled by `1 / diag(a)` first. On JAX
    0.10's CPU backend a non-unit triangular solve is about 1000x slower than a
    unit one (15 ms against 20 us for 32 x 32)."""
    kw = dict(left_side=True, lower=lower, transpose_a=transpose_a)
    if unit_diagonal:
        return lax.linalg.triangular_solve(a, b, unit_diagonal=True, **kw)
    d = jnp.diagonal(a, axis1=-2, axis2=-1)[..., :, None]
    scaled = a / d  # D⁻¹ A has a unit diagonal
    if transpose_a:
        # Aᵀ x = b  <=>  (D⁻¹A)ᵀ (D x) = b.
        return lax.linalg.triangular_solve(scaled, b, unit_diagonal=True, **kw) / d
    return lax.linalg.triangular_solve(scaled, b / d, unit_diagonal=True, **kw)


def on_diagonal(values: Array, k: int = 0) -> Array:
    """The `(*batch, m + |k|, m + |k|)` matrix holding `values` (shape `(*batch,
    m)`) on its `k`-th diagonal and zeros elsewhere. Written as a scatter, not as
    `values * eye`, so that a NaN or infinite entry stays where it is (a product
    with the identity's zeros would spread NaN along its row)."""
    m = values.shape[-1]
    n = m + abs(k)
    rows = jnp.arange(m) + max(-k, 0)
    out = jnp.zeros((*values.shape[:-1], n, n), values.dtype)
    return out.at[..., rows, rows + k].set(values)


def keep_or_scale(leaf: Array, y: Array, *, select: bool) -> Array:
    """`leaf * y`, or with `select`, `leaf` where `y` is nonzero and zero elsewhere
    (`jnp.where`'s semantics: a NaN in `leaf` where `y` is zero is dropped, as
    `jnp.where(mask, x, 0)` drops it)."""
    if select:
        return jnp.where(y != 0, leaf, jnp.zeros((), leaf.dtype))
    return leaf * y


def failed_factorisation(pivots: Array) -> Array:
    """Whether a Cholesky factorisation failed, per matrix of the batch: some pivot
    (an entry of the factor's diagonal, shape `(*batch, n)`) is not positive (NaN
    from the square root of a negative number, or zero), as LAPACK's `potrf`
    reports. Dense JAX then returns NaN for the whole lower triangle."""
    return jnp.any(~(jnp.real(pivots) > 0), axis=-1)


def nan_where(failed: Array, leaf: Array) -> Array:
    """`leaf` with every entry NaN where `failed` (shape: `leaf`'s leading axes)."""
    failed = failed.reshape(failed.shape + (1,) * (leaf.ndim - failed.ndim))
    return jnp.where(failed, jnp.full((), jnp.nan, leaf.dtype), leaf)


@jax.custom_batching.custom_vmap
def for_the_batch(accurate: Array) -> Array:
    """`accurate` (a boolean scalar) as it is; under `vmap`, whether it holds for
    every system of the batch, unbatched: the `lax.cond` it decides stays a
    branch (taken by every system or by none) rather than a select that runs
    both routes. A fallback branch keeps, per system, what the first route gave
    where it was accurate. It passes no derivative (a boolean), so `jax.grad` of
    `vmap` and `vmap` of `grad` see the plain branch.

    A custom JVP rule whose `lax.cond` takes tangents as operands needs it: JAX
    turns a `lax.cond` with a batched predicate into a select whose operands it
    wraps in `lax.stop_gradient`, which has no transpose rule (JAX issues #22011
    and #39219), so `jax.grad` of `vmap` over the rule fails with a
    `NotImplementedError` (unless a library imported beside it, such as lineax,
    registered one). Decided under `custom_vmap`, also where `vmap` batches a
    `jit` traced before (its jaxpr), the predicate is never batched."""
    return accurate


@for_the_batch.def_vmap
def _(axis_size: int, in_batched: list[bool], accurate: Array) -> tuple[Array, bool]:
    del axis_size
    return (jnp.all(accurate) if in_batched[0] else accurate), False


def stacked_sums(
    vectors: tuple[Array, ...], rows: tuple[Array, ...]
) -> tuple[Array, Array]:
    """The sums down the first axis of `vectors` (each of one shape, `(n,)` or
    `(n, k)`) and of `rows` (each of shape `(n,)`), as an array of shape
    `(len(vectors), *k)` and one of shape `(len(rows),)`, in one reduction:
    XLA's CPU backend runs each reduction as three calls (the operand, a
    partial `reduce-window`, the final `reduce`), so one for all of them is
    cheaper than one each. With `(n, k)` vectors the rows are broadcast beside
    them (their sums are read off the first column).

    Under `vmap` where the vectors are batched and the rows are not (a solve
    `vmap`ped over right-hand sides: the rows are the matrix's), the rows are
    summed once, apart, rather than broadcast to the batch inside the stacked
    reduction. No derivative flows through (`lax.stop_gradient`): the sums
    decide a check, a predicate."""
    vectors, rows = jax.tree.map(lax.stop_gradient, (tuple(vectors), tuple(rows)))
    return _stacked_sums(vectors, rows)


def _sums_in_one_reduction(
    vectors: tuple[Array, ...], rows: tuple[Array, ...]
) -> tuple[Array, Array]:
    """`stacked_sums` for one system (no batch)."""
    shape = vectors[0].shape
    columns = [r.reshape(r.shape + (1,) * (len(shape) - 1)) for r in rows]
    stacked = jnp.stack([*vectors, *(jnp.broadcast_to(c, shape) for c in columns)])
    sums = jnp.sum(stacked, axis=1)
    row_sums = sums[len(vectors) :].reshape(len(rows), *shape[1:])
    if len(shape) > 1:
        row_sums = row_sums[:, 0] if shape[1] else jnp.zeros((len(rows),), sums.dtype)
    return sums[: len(vectors)], row_sums


@jax.custom_batching.custom_vmap
def _stacked_sums(
    vectors: tuple[Array, ...], rows: tuple[Array, ...]
) -> tuple[Array, Array]:
    return _sums_in_one_reduction(vectors, rows)


@_stacked_sums.def_vmap
def _(
    axis_size: int,
    in_batched: tuple[tuple[bool, ...], tuple[bool, ...]],
    vectors: tuple[Array, ...],
    rows: tuple[Array, ...],
) -> tuple[tuple[Array, Array], tuple[bool, bool]]:
    vectors_batched, rows_batched = in_batched

    def batched(x: Array, is_batched: bool) -> Array:
        return x if is_batched else jnp.broadcast_to(x, (axis_size, *x.shape))

    vectors = tuple(map(batched, vectors, vectors_batched))
    if not any(rows_batched):
        # The vectors' sums batched, the rows' once: no broadcast of the rows.
        vector_sums = jax.vmap(lambda v: _sums_in_one_reduction(v, ())[0])(vectors)
        row_sums = jnp.sum(jnp.stack(rows), axis=1) if rows else jnp.zeros((0,))
        return (vector_sums, row_sums.astype(vector_sums.dtype)), (True, False)
    rows = tuple(map(batched, rows, rows_batched))
    return jax.vmap(_sums_in_one_reduction)(vectors, rows), (True, True)
