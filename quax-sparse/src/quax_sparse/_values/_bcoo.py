"""The value type `BCOO`: a sparse array in batch-coordinate format."""

import functools
import math
import operator
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import quax
from jax.extend.core import Primitive
from jaxtyping import Array, ArrayLike

from .._kernels import flat_entries, gather, scatter_add, sum_duplicates
from .._superlu import inverse_at


__all__ = ["BCOO", "SparseMaterialisationError", "SparseValue"]


class SparseMaterialisationError(quax.MaterialisationError):
    """A sparse array (`BCOO`, `CSR`) with `allow_materialise=False` met an operation
    that has no sparse rule and would need its dense array. A
    [`quax.MaterialisationError`][] (so a `RuntimeError`): the message starts with
    "Refusing to materialise", names the type, the primitive and the input types,
    and says the way out."""


def refusal_reason(aval: jax.core.ShapedArray, stored: int) -> str:
    """Why a sparse array refuses to densify, for [`quax.GuardedValue`][]'s
    message: what the dense array would hold against what is stored.

    **Arguments:**

    - `aval`: the array's shape and dtype.
    - `stored`: how many entries it stores (padding included).

    **Returns:**

    A sentence without a final full stop.
    """
    return (
        f"its dense array (shape {tuple(aval.shape)}, dtype {aval.dtype}) would hold "
        f"all {math.prod(aval.shape)} elements of this sparse array, which stores "
        f"{stored} entries"
    )


EXPLICIT_WAY_OUT = (
    " Or call `.todense()` to densify it explicitly (an explicit request is always "
    "allowed)."
)


def checked_shape(owner: str, shape: Any) -> tuple[int, ...]:
    """`shape` as a tuple of Python integers, or a `ValueError` naming `owner`'s
    `shape` field and the offending dimension.

    **Arguments:**

    - `owner`: the type being constructed, for the message.
    - `shape`: a sequence of non-negative integers (NumPy integers included; not
        floats, not bools).

    **Returns:**

    The shape as a tuple of `int`.
    """
    try:
        sizes = list(shape)
    except TypeError:
        raise ValueError(
            f"`{owner}` needs `shape` to be a sequence of non-negative integers; got "
            f"{shape!r}."
        ) from None
    out = []
    for d, size in enumerate(sizes):
        try:
            if isinstance(size, (bool, np.bool_)):
                raise TypeError
            value = operator.index(size)
        except TypeError:
            raise ValueError(
                f"`{owner}` needs `shape` to be a sequence of non-negative integers; "
                f"dimension {d} of {tuple(sizes)!r} is {size!r}."
            ) from None
        if value < 0:
            raise ValueError(
                f"`{owner}` needs `shape` to be a sequence of non-negative integers; "
                f"dimension {d} of {tuple(sizes)!r} is negative."
            )
        out.append(value)
    return tuple(out)


def check_integers(owner: str, name: str, array: Array) -> None:
    """A `ValueError` naming `owner`'s field `name` unless `array` holds integers
    (read from its dtype: a tracer passes or fails as its value would)."""
    if not jnp.issubdtype(array.dtype, jnp.integer):
        raise ValueError(f"`{owner}` {name} must be integers, got dtype {array.dtype}.")


def unchecked(cls: type, fields: dict[str, Any]) -> Any:
    """An instance of `cls` with `fields` set as given, its `__init__` and checks
    skipped: for a value the family computed itself (a rule's output, a
    conversion), consistent by construction, on which the checks of user input
    would wrap traced indices again or copy concrete ones to the host."""
    out = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(out, name, value)
    return out


def signed_indices(indices: Array) -> Array:
    """`indices` in the dtype the family computes indices in: a signed integer of at
    least 32 bits. Narrower or unsigned indices (`int8`, `uint16`, ...) are read as
    `int32` (`int64` for 64-bit ones when JAX's 64-bit mode is on): in their own
    dtype, a negative index wrapped to `i + n`, the padding index `n`, or a position
    a rule computes (a `reshape` flattening a `200 x 200` array) would overflow and
    name another position.

    **Arguments:**

    - `indices`: an integer array.

    **Returns:**

    `indices`, converted where its dtype is narrower than 32 bits or unsigned.
    """
    dtype = np.dtype(indices.dtype)
    if np.issubdtype(dtype, np.signedinteger) and dtype.itemsize >= 4:
        return indices
    wide = jax.dtypes.canonicalize_dtype(np.int64 if dtype.itemsize == 8 else np.int32)
    return indices.astype(wide)


def checked_index_dtype(owner: str, index_dtype: Any) -> Any:
    """`index_dtype` if it is a signed integer dtype of at least 32 bits, else a
    `ValueError` naming the argument and the way out.

    **Arguments:**

    - `owner`: the constructor, for the message (`"BCOO.fromdense"`).
    - `index_dtype`: the dtype the user asked the indices to be stored in.

    **Returns:**

    `index_dtype` as a NumPy dtype.
    """
    dtype = np.dtype(index_dtype)
    if not (np.issubdtype(dtype, np.signedinteger) and dtype.itemsize >= 4):
        raise ValueError(
            f"`{owner}` got `index_dtype={dtype}`; quax-sparse stores indices as "
            "`int32` or `int64`, since in a narrower or unsigned dtype the padding "
            "index `n` and the positions rules compute overflow and name other "
            "positions. Pass `index_dtype=jnp.int32` (the default)."
        )
    return dtype


def wrapped_indices(owner: str, indices: Array, sizes: Sequence[int] | int) -> Array:
    """`indices` read as NumPy indexing (and `jax.experimental.sparse`) reads them,
    with the family's padding convention: along a dimension of size `n`, `-n <= i <
    0` is position `i + n` (stored so), `0 <= i < n` is position `i`, and `i = n`
    marks padding.

    **Arguments:**

    - `owner`: the type being constructed, for the message.
    - `indices`: an integer array whose last axis runs over the dimensions of
        `sizes` (or any integer array, when `sizes` is one size).
    - `sizes`: the size of each indexed dimension (or one size for all).

    **Returns:**

    `indices` with negative entries wrapped, in a signed dtype of at least 32 bits
    (`signed_indices`). Concrete indices outside `[-n, n]` raise a `ValueError`
    naming the field `indices` and the position; traced ones cannot be checked,
    and there wrapping leaves them out of bounds: padding.
    """
    bound = np.asarray(sizes, dtype=np.int64)
    if isinstance(indices, jax.core.Tracer):
        indices = signed_indices(indices)
        return jnp.where(indices < 0, indices + bound.astype(indices.dtype), indices)
    value = np.asarray(indices)
    full = np.broadcast_to(bound, value.shape)
    bad = (value < -full) | (value > full)
    if bad.any():
        position = tuple(int(p) for p in np.argwhere(bad)[0])
        n = int(full[position])
        raise ValueError(
            f"`{owner}` got `indices[{', '.join(map(str, position))}]` = "
            f"{int(value[position])} for a dimension of size {n}: an index must lie "
            f"in [-{n}, {n}] (`-{n} <= i < 0` counts from the end, as in NumPy and "
            f"jax.experimental.sparse; `i = {n}` marks padding)."
        )
    indices = signed_indices(indices)
    negative = value < 0
    if not negative.any():
        return indices
    return jnp.asarray(np.where(negative, value + full, value).astype(indices.dtype))


def checked_promises(
    indices: Array,
    sizes: Sequence[int],
    *,
    indices_sorted: bool,
    unique_indices: bool,
) -> None:
    """Check the promises a user makes about concrete `indices` (rules trust them:
    a sort or a merge of duplicates is skipped, so a false one gives wrong numbers,
    `(x ** 2)` summing the squares of two entries at one position instead of
    squaring their sum). Traced indices (under `jit`) cannot be checked.

    **Arguments:**

    - `indices`: the wrapped indices, shape `(*batch, nse, n_sparse)`.
    - `sizes`: the sizes of the sparse dimensions (an index equal to one marks
        padding).
    - `indices_sorted`: the promise that each batch element's indices are in
        row-major (lexicographic) order, padding included as stored.
    - `unique_indices`: the promise that no position (padding aside) is stored
        twice in one batch element.

    **Returns:**

    Nothing; a `ValueError` naming the flag and the first entry breaking it.
    """
    if not (indices_sorted or unique_indices) or isinstance(indices, jax.core.Tracer):
        return
    value = np.asarray(indices)
    *batch, nse, n_sparse = value.shape
    if nse < 2:
        return
    if n_sparse == 0:
        # Every entry of a batch element is at its one position, `()`.
        if unique_indices:
            raise ValueError(
                f"`BCOO` got `unique_indices=True`, but its indices have no sparse "
                f"dimension, so its {nse} entries per batch element are all at one "
                "position: merge them (`.sum_duplicates()`) or leave "
                "`unique_indices` False."
            )
        return
    flat = value.reshape(-1, nse, n_sparse)
    # Per batch element, adjacent entries compared lexicographically: the sign of
    # their first differing coordinate (0 where equal).
    step = np.diff(flat, axis=1)
    first = np.argmax(step != 0, axis=-1)[..., None]
    sign = np.sign(np.take_along_axis(step, first, axis=-1))[..., 0]
    where = lambda b, k: ", ".join(map(str, (*np.unravel_index(b, batch), k)))
    if indices_sorted and np.any(sign < 0):
        b, k = np.argwhere(sign < 0)[0]
        raise ValueError(
            f"`BCOO` got `indices_sorted=True`, but `indices[{where(b, k + 1)}]` = "
            f"{tuple(flat[b, k + 1].tolist())} comes after `indices[{where(b, k)}]` "
            f"= {tuple(flat[b, k].tolist())} in row-major order: sort the entries "
            "(`.sum_duplicates()` sorts and merges them) or leave `indices_sorted` "
            "False."
        )
    if not unique_indices:
        return
    order = np.lexsort(flat.transpose(2, 0, 1)[::-1], axis=-1)
    ordered = np.take_along_axis(flat, order[..., None], axis=1)
    valid = np.all(ordered < np.asarray(sizes, np.int64), axis=-1)
    twice = np.all(ordered[:, 1:] == ordered[:, :-1], axis=-1) & valid[:, 1:]
    if np.any(twice):
        b, k = np.argwhere(twice)[0]
        first, second = sorted((order[b, k], order[b, k + 1]))
        raise ValueError(
            f"`BCOO` got `unique_indices=True`, but `indices[{where(b, first)}]` "
            f"and `indices[{where(b, second)}]` are both "
            f"{tuple(ordered[b, k].tolist())}: merge them "
            "(`.sum_duplicates()`) or leave `unique_indices` False."
        )


def _stored_positions(x: Array, n_dense: int) -> Array:
    """Which positions of `x` a `fromdense` stores, shape `x.shape[:x.ndim -
    n_dense]`: those where `x` (any element of the block, with dense dimensions) is
    nonzero. NaN is nonzero."""
    stored = x != 0
    if n_dense:
        stored = jnp.any(stored, axis=tuple(range(x.ndim - n_dense, x.ndim)))
    return stored


def checked_nse(
    owner: str,
    x: Array,
    nse: int | None,
    n_batch: int,
    n_dense: int,
    *,
    argument: str = "nse",
) -> int:
    """The number of entries a `fromdense` stores per batch element: `nse`, checked
    against the nonzeros of a concrete `x` (none may be dropped), or their largest
    count per batch element when `nse` is `None`.

    **Arguments:**

    - `owner`: the constructor, for the message (`"BCOO.fromdense"`).
    - `x`: the dense array (concrete, or a tracer under `jit`).
    - `nse`: the number of entries asked for, or `None`.
    - `n_batch`, `n_dense`: the layout of `x` (checked by the caller).
    - `argument`: the name of `owner`'s argument `nse` (`"nblocks"`), for the
        messages.

    **Returns:**

    `nse`, or the count. A `ValueError` where a concrete `x` has more nonzeros in a
    batch element than `nse`, giving the count and the way out; or where `nse` is
    `None` and `x` is traced (its count is not known while tracing).
    """
    if nse is not None and nse < 0:
        raise ValueError(f"`{owner}` got {argument}={nse}; it must be >= 0.")
    if isinstance(x, jax.core.Tracer):
        if nse is None:
            raise ValueError(
                f"`{owner}` needs `{argument}` where `x` is traced (under `jit`, "
                "`vmap` or `grad`): the number of nonzeros is not known while "
                f"tracing, and `{argument}` fixes the number of stored entries. Pass "
                f"`{argument}=` at least the largest number of nonzeros `x` can "
                f"have; beyond `{argument}` the nonzeros are dropped, as in "
                "jax.experimental.sparse."
            )
        return nse
    stored = _stored_positions(x, n_dense)
    batch = stored.shape[:n_batch]
    counts = np.asarray(jnp.sum(stored, axis=tuple(range(n_batch, stored.ndim))))
    count = int(np.max(counts, initial=0))
    if nse is None:
        return count
    if count > nse:
        where = ""
        if batch:
            element = tuple(int(i) for i in np.unravel_index(np.argmax(counts), batch))
            where = f" in batch element {element}"
        what = "nonzero blocks" if n_dense else "nonzeros"
        raise ValueError(
            f"`{owner}` got {argument}={nse}, but `x` has {count} {what}{where}: "
            f"{count - nse} of them would be dropped. Pass `{argument}=None` to "
            f"store every nonzero, or `{argument} >= {count}` (more than the count "
            "leaves padding)."
        )
    return nse


def jsparse_indices(indices: Array, sparse_shape: Sequence[int]) -> Array:
    """`indices` as `jax.experimental.sparse` reads them, in the family's form:
    negative indices in `[-n, 0)` wrapped to `i + n`, and every entry that
    `jax.experimental.sparse` ignores (an index outside `[-n, n)` in any dimension)
    moved to the padding position, `n` in every dimension (in a signed dtype of at
    least 32 bits, `signed_indices`)."""
    indices = signed_indices(indices)
    bound = jnp.asarray(np.asarray(sparse_shape, dtype=np.int64), indices.dtype)
    wrapped = jnp.where(indices < 0, indices + bound, indices)
    inside = jnp.all((wrapped >= 0) & (wrapped < bound), axis=-1, keepdims=True)
    return jnp.where(inside, wrapped, bound)


def _determinant_jvp(
    name: str, fun: Any, primals: Sequence[Any], tangents: Sequence[Any]
) -> tuple[list[Any], list[Any]]:
    """The JVP of `jnp.linalg.slogdet` (JAX's `_slogdet_lu`) or `det` (`_det`) of a
    sparse matrix: `d log |det A| = trace(A⁻¹ dA) = Σ_k dA_k (A⁻¹)[col_k, row_k]`
    over the stored entries, with the entries of `A⁻¹` at the transposed pattern
    computed on the host (`inverse_at`). Linear in the tangent's stored
    values, so reverse mode gives one value per stored entry; never a dense
    `n x n` array. NaN at a singular matrix."""
    (a,), (dot,) = primals, tangents
    outs = list(fun(a))
    at = inverse_at(a.data, a.indices, a.shape[-1])
    trace = jnp.sum(at * dot.data.astype(at.dtype), axis=-1)
    if name == "_det":
        (det,) = outs
        return outs, [(det * trace).astype(det.dtype)]
    sign, logdet = outs
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        sign_dot = (trace - jnp.real(trace).astype(trace.dtype)) * sign
        return outs, [sign_dot.astype(sign.dtype), jnp.real(trace).astype(logdet.dtype)]
    return outs, [jnp.zeros_like(sign), trace.astype(logdet.dtype)]


def determinant_jvp_rule(name: str, fun: Any, values: Sequence[Any]) -> Any:
    """The JVP rule `BCOO.custom_jvp_rule` (and `CSR`'s) gives for `slogdet` and
    `det` of a square sparse matrix or a batch of them (what the `lu` rule
    factors), else
    `None`. Decided from types and static fields only; the rule receives `BCOO`s."""
    if name not in ("_slogdet_lu", "_det") or len(values) != 1:
        return None
    # A `BCOO` or a `CSR` (which this module cannot import): read duck-typed.
    a = values[0]
    shape: list[int] = list(getattr(a, "shape", ()))
    n_batch = getattr(a, "n_batch", None)
    if n_batch is None or len(shape) != n_batch + 2 or shape[-2] != shape[-1]:
        return None
    if getattr(a, "n_dense", 0) != 0:  # blocks: the `lu` rule refuses them
        return None
    dtype: Any = getattr(a, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
        return None
    return functools.partial(_determinant_jvp, name, fun)


class SparseValue(quax.GuardedValue):
    """What the family's sparse arrays (`BCOO`, `CSR`, `BlockSparse`) share: stored
    values `data` at positions `indices`, the shape given to the constructor
    (`_shape`), an array linear in `data`, the family's refusal
    (`SparseMaterialisationError`), and `.todense()` named as a way out of it."""

    data: Array
    indices: Array
    _shape: tuple[int, ...] = eqx.field(static=True)

    linear_in_leaves: ClassVar[bool] = True
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        SparseMaterialisationError
    )

    def way_out(self, primitive: Primitive | None = None) -> str:
        return super().way_out(primitive) + EXPLICIT_WAY_OUT


class BCOO(SparseValue):
    """A sparse array in batch-coordinate format, as in the published quax.

    `shape = (*batch, *sparse, *dense)`: `data` has shape `(*batch, nse, *dense)`
    and `indices` has shape `(*batch, nse, n_sparse)`, where `nse` is the number of
    stored elements and `n_sparse = len(sparse)`. Entry `k` of each batch element
    stores the block `data[..., k, ...]` (of shape `dense`; a scalar when there are
    no dense dimensions, `n_dense = 0`) at the sparse position `indices[..., k, :]`:
    hybrid dense dimensions, as in `jax.experimental.sparse` (graph node features,
    one dense feature vector per stored node). Entries at the same position add up
    (duplicates are allowed). Indices are read as NumPy indexing and
    `jax.experimental.sparse` read them: along a dimension of size `n`, `-n <= i < 0`
    counts from the end (the constructor stores it wrapped, `i + n`), and an entry
    with an index `i = n` is padding, ignored (what
    [`quax_sparse.BCOO.fromdense`][] writes when `x` has fewer nonzeros than `nse`).

    Inside [`quax.quaxify`][], products, sums and elementwise functions with
    `f(0) = 0` cost what the stored entries cost; every other operation raises a
    [`quax_sparse.SparseMaterialisationError`][] naming the primitive, unless the array
    allows materialising: the core's materialisation policy
    ([`quax.GuardedValue`][]), with `enable_materialise(allow=True)`.

    **Fields:**

    - `data`, `indices`: as above.
    - `n_sparse`: the number of sparse dimensions (static; the last axis of
        `indices` when the array is built). Recorded because `_shape` cannot say
        it once `jax.vmap` has removed batch axes from the leaves: `indices`
        rebuilt with fewer columns (`eqx.tree_at`) would otherwise read the array
        as one of fewer dimensions.
    - `n_dense`: the number of trailing dense dimensions (static; read from the
        shapes of `data` and `indices` when the array is built).
    - `_shape`: the shape given to `__init__`. The `shape` property takes the batch
        sizes from `data` (so that `jax.vmap` over a `BCOO`'s leaves works) and the
        sparse sizes from `_shape`.
    - `allow_materialise`: whether an operation without a sparse rule may densify.
    - `indices_sorted`, `unique_indices`: what is known of the entries (each batch
        element's positions in row-major order; no position twice). Static hints:
        rules use them to skip sorting, and set them on what they return.
    """

    n_sparse: int = eqx.field(static=True)
    n_dense: int = eqx.field(static=True)
    indices_sorted: bool = eqx.field(static=True)
    unique_indices: bool = eqx.field(static=True)

    def __init__(
        self,
        data: ArrayLike,
        indices: ArrayLike,
        shape: tuple[int, ...],
        allow_materialise: bool = False,
        *,
        indices_sorted: bool = False,
        unique_indices: bool = False,
    ):
        """**Arguments:**

        - `data`: the stored values, shape `(*batch, nse)`, or `(*batch, nse,
            *dense)` for blocks: the number of dense dimensions is what `data` has
            beyond `indices`' `(*batch, nse)`, as in `jax.experimental.sparse`.
        - `indices`: their positions, an integer array of shape
            `(*batch, nse, n_sparse)`. Along a sparse dimension of size `n`, an
            index `i` with `0 <= i < n` is that position, one with `-n <= i < 0`
            is position `i + n` (counted from the end, as NumPy indexing and
            `jax.experimental.sparse` read it; stored wrapped), and `i = n` marks
            the entry as padding (ignored). Concrete indices outside `[-n, n]` are
            refused; traced ones there are padding. Indices narrower than 32 bits
            or unsigned are read as `int32` (in `int8`, the wrapped `-1` of a
            dimension of size 200 would overflow).
        - `shape`: the shape of the array, `(*batch, *sparse, *dense)`:
            non-negative integers.
        - `allow_materialise`: whether an operation without a sparse rule may form the
            dense array (`False`, the default, raises an error naming it).
        - `indices_sorted`, `unique_indices`: promise that the positions are in
            row-major order / that no position is stored twice (default: no promise).
        """
        self.data = jnp.asarray(data)
        indices = jnp.asarray(indices)
        self._shape = checked_shape("BCOO", shape)
        self.n_dense = max(self.data.ndim - indices.ndim + 1, 0)
        self._check_layout(indices)
        self.n_sparse = indices.shape[-1]
        n_batch = indices.ndim - 2
        self.indices = wrapped_indices(
            "BCOO",
            indices,
            self._shape[n_batch : len(self._shape) - self.n_dense],
        )
        self.allow_materialise = allow_materialise
        self.indices_sorted = indices_sorted
        self.unique_indices = unique_indices
        checked_promises(
            self.indices,
            self._shape[n_batch : len(self._shape) - self.n_dense],
            indices_sorted=indices_sorted,
            unique_indices=unique_indices,
        )

    def __check_init__(self) -> None:
        """The shapes of `data` and `indices` against each other and the static
        fields, with the batch sizes taken from `data` as `shape` takes them (so a
        `jax.vmap` view or a stack of `BCOO`s passes): run after `__init__`, and by
        `quax.quaxify` on an array rebuilt without it (`eqx.tree_at`,
        `jax.tree.map`), whose rules would otherwise broadcast `data` against
        `indices`, or read `indices` with fewer columns as an array of fewer
        sparse dimensions, silently. Reads shapes, dtypes and static fields
        only."""
        data, indices, n_dense = self.data, self.indices, self.n_dense
        n_batch = data.ndim - 1 - n_dense
        if n_batch < 0 or indices.ndim != n_batch + 2:
            raise ValueError(
                f"`BCOO` with n_dense={n_dense} needs `data` of shape (*batch, nse, "
                "*dense) and `indices` of shape (*batch, nse, n_sparse); got `data` "
                f"of shape {data.shape} and `indices` of shape {indices.shape}."
            )
        if tuple(indices.shape[: n_batch + 1]) != tuple(data.shape[: n_batch + 1]):
            raise ValueError(
                "`BCOO` needs `data` and `indices` with the same batch sizes and "
                f"number of entries (*batch, nse); got `data` of shape {data.shape} "
                f"and `indices` of shape {indices.shape}."
            )
        n_sparse = self.n_sparse
        if indices.shape[-1] != n_sparse:
            raise ValueError(
                f"`BCOO` of shape {self._shape} was built with n_sparse={n_sparse} "
                f"sparse dimensions, so its `indices` need shape (*batch, nse, "
                f"{n_sparse}), one column per sparse dimension; got `indices` of "
                f"shape {indices.shape}, whose {indices.shape[-1]} columns would read "
                f"it as an array of {indices.shape[-1]} sparse dimensions, another "
                "shape."
            )
        dense = tuple(data.shape[n_batch + 1 :])
        end = len(self._shape) - n_dense
        if end < n_sparse or tuple(self._shape[end:]) != dense:
            raise ValueError(
                f"`BCOO` of shape {self._shape} (n_dense={n_dense}) needs `indices` "
                f"with at most {end} sparse dimensions and `data` ending with the "
                f"dense dimensions {tuple(self._shape[end:])}; got `indices` of "
                f"shape {indices.shape} and `data` of shape {data.shape}."
            )
        check_integers("BCOO", "indices", indices)

    def _check_layout(self, indices: Array) -> None:
        """The published checks of `data`, `indices` and `shape` against each other."""
        if self.data.ndim < 1 or indices.ndim < 2:
            raise ValueError(
                "`BCOO` needs `data` of shape (*batch, nse, *dense) and `indices` of "
                f"shape (*batch, nse, n_sparse); got {self.data.shape} and "
                f"{indices.shape}."
            )
        n_batch = indices.ndim - 2
        *batch2, nse2, n_sparse = indices.shape
        batch1 = self.data.shape[: min(n_batch, self.data.ndim - 1)]
        batch3 = self._shape[: len(batch1)]
        batches = {tuple(batch1), tuple(batch2), tuple(batch3)}
        if len(batches) != 1:
            raise ValueError(f"Inconsistent batch sizes {batches} in `BCOO`.")
        if self.data.shape[n_batch] != nse2:
            raise ValueError("Inconsistent number of sparse entries in `BCOO`.")
        dense = self.data.shape[n_batch + 1 :]
        if len(self._shape) < n_batch + len(dense) or (
            dense and tuple(self._shape[len(self._shape) - len(dense) :]) != dense
        ):
            raise ValueError(
                f"`BCOO` got `data` of shape {self.data.shape}, whose trailing "
                f"{len(dense)} axes beyond (*batch, nse) are dense dimensions "
                f"(n_dense={len(dense)}), but `shape` {self._shape} does not end "
                f"with {dense}: give `shape` as (*batch, *sparse, *dense)."
            )
        if len(self._shape) - n_batch - len(dense) != n_sparse:
            raise ValueError(
                "Must specify a sparse index for all non-batch dimensions in `BCOO`."
            )
        check_integers("BCOO", "indices", indices)

    @classmethod
    def _from_entries(
        cls,
        data: Array,
        indices: Array,
        shape: tuple[int, ...],
        allow_materialise: bool = False,
        *,
        indices_sorted: bool = False,
        unique_indices: bool = False,
    ) -> "BCOO":
        """A `BCOO` of entries that the family computed itself (a rule's output, a
        conversion): the layout is consistent and the indices are already read
        (positions in `[0, n)`, padding at `n` where the family writes it, or out
        of bounds where a traced index put it), so the checks of user input are
        skipped (on every rule's output they would wrap traced indices again, or
        copy concrete ones to the host)."""
        fields = {
            "data": data,
            "indices": indices,
            "_shape": tuple(shape),
            "n_sparse": indices.shape[-1],
            "n_dense": max(data.ndim - indices.ndim + 1, 0),
            "allow_materialise": allow_materialise,
            "indices_sorted": indices_sorted,
            "unique_indices": unique_indices,
        }
        return unchecked(cls, fields)

    # Structure ---------------------------------------------------------------------

    @property
    def nse(self) -> int:
        """The number of stored entries per batch element."""
        return self.data.shape[self.n_batch]

    @property
    def n_batch(self) -> int:
        """The number of batch dimensions."""
        return self.data.ndim - 1 - self.n_dense

    @property
    def dense_shape(self) -> tuple[int, ...]:
        """The sizes of the dense dimensions (the shape of each stored block)."""
        return tuple(self.data.shape[self.n_batch + 1 :])

    def aval(self) -> jax.core.ShapedArray:
        # The batch sizes come from `data`, so that `jax.vmap` over the leaves (or
        # stacking them) gives the array with the batch axis removed (or added).
        n_sparse, n_dense = self.n_sparse, self.n_dense
        end = len(self._shape) - n_dense
        sparse_shape = self._shape[end - n_sparse : end]
        nb = self.n_batch
        return jax.core.ShapedArray(
            self.data.shape[:nb] + sparse_shape + self.data.shape[nb + 1 :],
            self.data.dtype,
        )

    # Materialising -----------------------------------------------------------------

    def dense(self) -> Array:
        return self.todense()

    def refusal_reason(self) -> str:
        reason = refusal_reason(self.aval(), self.data.size)
        if self.n_dense:
            reason += (
                f" ({math.prod(self.data.shape[: self.n_batch + 1])} blocks of shape "
                f"{self.dense_shape} over its n_dense={self.n_dense} trailing dense "
                "dimensions)"
            )
        return reason

    @classmethod
    def join(cls, value: quax.Value, other: quax.Value) -> "BCOO | None":
        """`value` with only the promises it shares with `other`: for a loop carry
        or `cond` output whose flags differ between iterations or branches (`sin(c)`
        promises sorted unique indices that `c` may lack). See
        [`quax.Value.join`][].

        **Arguments:**

        - `value`: a `BCOO`.
        - `other`: the other side (its leaves may be shapes only).

        **Returns:**

        A `BCOO` with `value`'s entries and the AND of both sides'
        `indices_sorted`, `unique_indices` and `allow_materialise`; `None` where
        `other` is not a `BCOO` of the same shape, `nse` and index layout (a
        different `nse` cannot join).
        """
        if not (isinstance(value, BCOO) and isinstance(other, BCOO)):
            return None
        # The shapes the leaves give (`shape`), not the `_shape` each side was built
        # with: a `BCOO` batched by `jax.vmap` over its leaves keeps the `_shape` of
        # one batch element, and a rule's output records the full one.
        if (value.shape, value.data.shape, value.indices.shape) != (
            other.shape,
            other.data.shape,
            other.indices.shape,
        ):
            return None
        return BCOO._from_entries(
            value.data,
            value.indices,
            value.shape,
            value.allow_materialise and other.allow_materialise,
            indices_sorted=value.indices_sorted and other.indices_sorted,
            unique_indices=value.unique_indices and other.unique_indices,
        )

    @staticmethod
    def custom_jvp_rule(name: str, fun: Any, values: Sequence[Any]) -> Any:
        """`jnp.linalg.slogdet` and `det` of a sparse matrix differentiate as
        `trace(A⁻¹ dA)` over the stored entries (see [`quax.Value.custom_jvp_rule`][]),
        not by JAX's rule, which solves with the whole `n x n` tangent."""
        if not all(isinstance(v, BCOO) for v in values):
            return None
        return determinant_jvp_rule(name, fun, values)

    def todense(self) -> Array:
        """The dense array (an explicit request: allowed whatever
        `allow_materialise` says). Duplicates add up; padding is dropped.

        **Returns:**

        A JAX array of shape `self.shape` and dtype `self.dtype`.
        """
        coords, values = flat_entries(self.data, self.indices)
        zeros = jnp.zeros(self.shape, self.data.dtype)
        dims = tuple(range(self.n_batch + self.n_sparse))
        return scatter_add(zeros, coords, dims, values)

    # Construction and conversion ------------------------------------------------------

    @classmethod
    def fromdense(
        cls,
        x: ArrayLike,
        *,
        nse: int | None = None,
        n_batch: int = 0,
        n_dense: int = 0,
        index_dtype: Any = jnp.int32,
        allow_materialise: bool = False,
    ) -> "BCOO":
        """The nonzeros of a dense array, as a `BCOO` with a static `nse`.

        The nonzeros of each batch element are stored in row-major order; when `x`
        has fewer than `nse`, the remaining entries are padding (value 0, index out
        of bounds). With `n_dense` trailing dense dimensions, an entry is a block of
        those dimensions, stored where any of its elements is nonzero.

        **Fewer entries than nonzeros.** When `x` is concrete (not traced), an `nse`
        below the number of nonzeros of some batch element is refused with a
        `ValueError` giving that number: nothing is dropped silently. Under `jit`
        (`x` a tracer) the number of nonzeros cannot be known while tracing, so, as
        in `jax.experimental.sparse`, **the first `nse` nonzeros in row-major order
        are kept and the others dropped**: give an `nse` at least the largest
        number of nonzeros the array can have there.

        **Arguments:**

        - `x`: the dense array.
        - `nse`: the number of entries to store per batch element, at least the
            number of nonzeros of each. `None` (the default, for a concrete `x`
            only): exactly the largest number of nonzeros of a batch element.
        - `n_batch`: how many leading axes of `x` are batch axes.
        - `n_dense`: how many trailing axes of `x` are dense (kept whole in each
            stored block, as `jax.experimental.sparse.BCOO.fromdense`'s
            `n_dense`).
        - `index_dtype`: the integer dtype of `indices`: `int32` or `int64` (a
            narrower or unsigned dtype is refused, see `BCOO`).
        - `allow_materialise`: passed to `BCOO`.

        **Returns:**

        A `BCOO` of `x`'s shape, with sorted unique indices.
        """
        return cls._fromdense(
            "BCOO.fromdense",
            x,
            nse=nse,
            n_batch=n_batch,
            n_dense=n_dense,
            index_dtype=index_dtype,
            allow_materialise=allow_materialise,
        )

    @classmethod
    def _fromdense(
        cls,
        owner: str,
        x: ArrayLike,
        *,
        nse: int | None,
        n_batch: int,
        n_dense: int,
        index_dtype: Any,
        allow_materialise: bool,
        argument: str = "nse",
    ) -> "BCOO":
        """`fromdense` for `owner` (`"BCOO.fromdense"`, `"CSR.fromdense"`, named in
        the errors, with its argument `nse` named `argument`): the nonzeros of each
        batch element of `x` in row-major order, then padding, `nse` of them
        (`checked_nse`: a concrete `x` keeps every nonzero)."""
        x = jnp.asarray(x)
        if not 0 <= n_batch <= x.ndim:
            raise ValueError(f"n_batch={n_batch} must be in [0, {x.ndim}].")
        if not 0 <= n_dense <= x.ndim - n_batch:
            raise ValueError(
                f"n_dense={n_dense} must be in [0, {x.ndim - n_batch}] (the axes of "
                f"x, shape {x.shape}, after its n_batch={n_batch} batch axes)."
            )
        index_dtype = checked_index_dtype(owner, index_dtype)
        size = checked_nse(owner, x, nse, n_batch, n_dense, argument=argument)
        sparse_shape = x.shape[n_batch : x.ndim - n_dense]
        n_sparse = len(sparse_shape)

        def one(y: Array) -> tuple[Array, Array]:
            if n_sparse == 0:
                # One position (no sparse dimensions): `y` in the first entry, the
                # others zeros (entries at one position add up).
                data = jnp.zeros((size, *y.shape), y.dtype)
                if size:
                    data = data.at[0].set(y)
                return data, jnp.zeros((size, 0), index_dtype)
            stored = _stored_positions(y, n_dense)
            idx = jnp.nonzero(stored, size=size, fill_value=sparse_shape)
            indices = jnp.stack(idx, axis=-1).astype(index_dtype)
            return gather(y, indices, tuple(range(n_sparse))), indices

        f = one
        for _ in range(n_batch):
            f = jax.vmap(f)
        data, indices = f(x)
        return cls._from_entries(
            data,
            indices,
            x.shape,
            allow_materialise,
            indices_sorted=True,
            unique_indices=True,
        )

    @classmethod
    def from_jax(cls, x: Any, *, allow_materialise: bool = False) -> "BCOO":
        """Convert a `jax.experimental.sparse.BCOO` (its dense dimensions, if any,
        stay dense dimensions).

        Its indices are read as `jax.experimental.sparse` reads them: negative ones
        (in `[-n, 0)`) count from the end and are stored wrapped, and an entry that
        it ignores (an index outside `[-n, n)`) becomes padding (index `n`). Index
        batch axes of size 1 are broadcast to the batch shape.

        **Returns:**

        A `quax_sparse.BCOO` with the same dense array, entries and padding. The
        flags `indices_sorted` and `unique_indices` are kept where no index changed
        (checked on concrete indices; under `jit`, where that cannot be checked,
        they are dropped).
        """
        batch = tuple(x.shape[: x.n_batch])
        data = jnp.broadcast_to(x.data, batch + x.data.shape[x.n_batch :])
        given = jnp.broadcast_to(x.indices, batch + x.indices.shape[x.n_batch :])
        sparse_end = len(x.shape) - x.n_dense
        indices = jsparse_indices(given, x.shape[x.n_batch : sparse_end])
        same = (
            not isinstance(given, jax.core.Tracer)
            and not isinstance(indices, jax.core.Tracer)
            and bool(np.array_equal(np.asarray(given), np.asarray(indices)))
        )
        return cls._from_entries(
            data,
            indices,
            tuple(x.shape),
            allow_materialise,
            indices_sorted=same and x.indices_sorted,
            unique_indices=same and x.unique_indices,
        )

    def to_jax(self) -> Any:
        """This array as a `jax.experimental.sparse.BCOO`: the same entries and
        flags, every padding entry at index `n` in every dimension (which
        `jax.experimental.sparse` ignores, as it does for `fromdense`'s padding).

        **Returns:**

        A `jax.experimental.sparse.BCOO` with the same dense array.
        """
        from jax.experimental import sparse

        return sparse.BCOO(
            (
                self.data,
                jsparse_indices(
                    self.indices,
                    self.shape[self.n_batch : self.n_batch + self.n_sparse],
                ),
            ),
            shape=self.shape,
            indices_sorted=self.indices_sorted,
            unique_indices=self.unique_indices,
        )

    @classmethod
    def from_scipy(
        cls, x: Any, *, index_dtype: Any = jnp.int32, allow_materialise: bool = False
    ) -> "BCOO":
        """Convert a `scipy.sparse` matrix or array (any format; 2 dimensions).

        Needs the optional dependency scipy (`pip install quax-sparse[scipy]`).

        **Returns:**

        A `BCOO` with the entries scipy stores (explicit zeros included).
        """
        index_dtype = checked_index_dtype("BCOO.from_scipy", index_dtype)
        coo = x.tocoo()
        indices = np.stack([coo.row, coo.col], axis=-1).astype(index_dtype)
        return cls(coo.data, indices, coo.shape, allow_materialise)

    def to_scipy(self) -> Any:
        """This matrix as a `scipy.sparse.coo_array` (padding dropped; duplicates
        kept, which scipy adds up). Needs concrete arrays (not under `jit`) and a
        matrix with no batch dimensions.

        **Returns:**

        A `scipy.sparse.coo_array`.
        """
        import scipy.sparse

        if len(self.shape) != 2 or self.n_dense:
            raise ValueError(
                f"scipy.sparse holds matrices; this BCOO has shape {self.shape} "
                f"with n_dense={self.n_dense} dense dimensions (convert blocks "
                "first: `x.update_layout(n_dense=0)`)."
            )
        coords, values = flat_entries(self.data, self.indices)
        coords = np.asarray(coords)
        values = np.asarray(values)
        keep = np.all(coords < np.asarray(self.shape), axis=1) & np.all(
            coords >= 0, axis=1
        )
        return scipy.sparse.coo_array(
            (values[keep], (coords[keep, 0], coords[keep, 1])), shape=self.shape
        )

    def sum_duplicates(self, nse: int | None = None) -> "BCOO":
        """Merge entries stored at the same position, sort them, and move padding to
        the end.

        **Arguments:**

        - `nse`: the number of entries of the result per batch element (default: the
            current `nse`, which always suffices). With a smaller `nse`, unique
            positions beyond the first `nse` in row-major order are dropped.

        **Returns:**

        A `BCOO` with `indices_sorted=True` and `unique_indices=True`.
        """
        data, indices = sum_duplicates(
            self.data,
            self.indices,
            self.shape[self.n_batch : self.n_batch + self.n_sparse],
            self.nse if nse is None else nse,
            is_sorted=self.indices_sorted,
        )
        return BCOO._from_entries(
            data,
            indices,
            self.shape,
            self.allow_materialise,
            indices_sorted=True,
            unique_indices=True,
        )

    def update_layout(self, *, n_dense: int) -> "BCOO":
        """The same array with fewer dense dimensions: the trailing
        `self.n_dense - n_dense` dense axes become sparse ones, each stored block
        split into one entry per element of those axes (as
        `jax.experimental.sparse.bcoo_update_layout` does; zeros inside a block
        stay stored). The way out for an operation that has no rule for blocks.

        **Arguments:**

        - `n_dense`: the number of dense dimensions to keep, from 0 to
            `self.n_dense`.

        **Returns:**

        A `BCOO` with the same dense array and `nse * prod(moved sizes)` entries
        per batch element; the flags are kept (a block's elements are stored in
        row-major order, right after one another).
        """
        if not 0 <= n_dense <= self.n_dense:
            raise ValueError(
                f"`update_layout` can turn dense dimensions into sparse ones: "
                f"n_dense must be in [0, {self.n_dense}]; got {n_dense}."
            )
        if n_dense == self.n_dense:
            return self
        nb, nse = self.n_batch, self.nse
        moved = self.dense_shape[: self.n_dense - n_dense]
        kept = self.dense_shape[len(moved) :]
        count = math.prod(moved)
        batch = self.data.shape[:nb]
        data = self.data.reshape((*batch, nse * count, *kept))
        grids = np.indices(moved).reshape(len(moved), -1).T  # row-major
        grids = jnp.asarray(grids, self.indices.dtype)
        # Padding entries keep padding indices (their block positions are inside).
        old = jnp.repeat(self.indices, count, axis=nb)
        new = jnp.tile(grids, (*([1] * nb), nse, 1))
        new = jnp.broadcast_to(new, (*batch, nse * count, len(moved)))
        return BCOO._from_entries(
            data,
            jnp.concatenate([old, new], axis=-1),
            self.shape,
            self.allow_materialise,
            indices_sorted=self.indices_sorted,
            unique_indices=self.unique_indices,
        )
