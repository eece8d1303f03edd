"""The value type `CSR`: a sparse matrix in compressed-sparse-row format."""

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import quax
from jaxtyping import Array, ArrayLike

from ._bcoo import (
    BCOO,
    SparseValue,
    check_integers,
    checked_index_dtype,
    checked_shape,
    determinant_jvp_rule,
    refusal_reason,
    signed_indices,
    unchecked,
    wrapped_indices,
)


__all__ = ["CSR"]


class CSR(SparseValue):
    """A sparse matrix in compressed-sparse-row format (as scipy's `csr_array`), or a
    batch of them.

    Row `i` stores the entries `indptr[i]:indptr[i + 1]`: values `data[...]` in the
    columns `indices[...]` (in any order within the row; a column stored twice adds
    up). Entries from `indptr[-1]` on are padding. A batch of matrices (shape
    `(*batch, n_rows, n_cols)`) has leading batch axes on all three arrays, one
    matrix each; as for `BCOO`, the batch sizes come from `data`, so that `jax.vmap`
    over the leaves (or stacking them) works.

    Inside [`quax.quaxify`][] a `CSR` behaves as the [`quax_sparse.BCOO`][] it
    converts to (an `O(nse)` row expansion, no sort): every primitive with a sparse
    rule for `BCOO` works, and gives what that rule gives (a `BCOO` where the result is
    sparse); the others refuse as for `BCOO`. It follows the core's materialisation
    policy ([`quax.GuardedValue`][]), with its own `default`: the conversion.

    **Fields:**

    - `data`: shape `(*batch, nse)`.
    - `indices`: the column of each entry, shape `(*batch, nse)`.
    - `indptr`: shape `(*batch, n_rows + 1)`, non-decreasing, `indptr[..., 0] = 0`,
        `indptr[..., -1] <= nse` (the entries from there on are padding), integers.
        Concrete values are checked at construction.
    - `_shape`: the shape given to `__init__` (the `shape` property takes the batch
        sizes from `data`).
    - `allow_materialise`: as for `BCOO`.
    """

    indptr: Array

    def __init__(
        self,
        data: ArrayLike,
        indices: ArrayLike,
        indptr: ArrayLike,
        shape: tuple[int, ...],
        allow_materialise: bool = False,
    ):
        """**Arguments:**

        - `data`, `indices`, `indptr`: as above. A column index `i` in `[-n_cols,
            0)` counts from the end (stored wrapped, `i + n_cols`), and
            `i = n_cols` marks padding, as for [`quax_sparse.BCOO`][]; concrete
            column indices outside `[-n_cols, n_cols]` are refused. `indices`
            and `indptr` narrower than 32 bits or unsigned are read as `int32`,
            as for `BCOO`.
        - `shape`: `(*batch, n_rows, n_cols)`, non-negative integers.
        - `allow_materialise`: whether an operation without a sparse rule may form the
            dense matrix.
        """
        self.data = jnp.asarray(data)
        indices = jnp.asarray(indices)
        self.indptr = jnp.asarray(indptr)
        self._shape = checked_shape("CSR", shape)
        self._check_layout(indices)
        self._check_indptr()
        self.indptr = signed_indices(self.indptr)
        self.indices = wrapped_indices("CSR", indices, self._shape[-1])
        self.allow_materialise = allow_materialise

    def __check_init__(self) -> None:
        """The shapes and dtypes of `data`, `indices` and `indptr` against `shape`,
        with the batch sizes taken from `data` as `shape` takes them (so a
        `jax.vmap` view or a stack of `CSR`s passes): run after `__init__`, and by
        `quax.quaxify` on a matrix rebuilt without it (`eqx.tree_at`,
        `jax.tree.map`), whose rules would otherwise read a short `indptr` as
        fewer rows silently. Reads shapes, dtypes and static fields only."""
        self._check_layout(self.indices, self.data.shape[:-1])

    def _check_layout(
        self, indices: Array, batch: tuple[int, ...] | None = None
    ) -> None:
        """The shapes of `data`, `indices` and `indptr` against `shape`, with the
        batch sizes `batch` (by default the leading sizes of `shape`)."""
        if len(self._shape) < 2:
            raise ValueError(
                f"`CSR` holds matrices (shape (*batch, n_rows, n_cols)); got shape "
                f"{self._shape}."
            )
        n_rows = self._shape[-2]
        if batch is None:
            batch = self._shape[:-2]
        if self.data.shape[:-1] != batch or indices.shape != self.data.shape:
            raise ValueError(
                f"`CSR` of shape {self._shape} needs `data` and `indices` of the same "
                f"shape {(*batch, 'nse')}; got {self.data.shape} and "
                f"{indices.shape}."
            )
        if self.indptr.shape != (*batch, n_rows + 1):
            raise ValueError(
                f"`CSR` of shape {self._shape} needs `indptr` of shape "
                f"{(*batch, n_rows + 1)}; got {self.indptr.shape}."
            )
        check_integers("CSR", "indices", indices)
        check_integers("CSR", "indptr", self.indptr)

    def _check_indptr(self) -> None:
        """Concrete `indptr` values: each matrix's `indptr` starts at 0, never
        decreases, and ends at most at `nse` (the entries from `indptr[-1]` on are
        padding). Traced values (under `jit`) cannot be checked."""
        if isinstance(self.indptr, jax.core.Tracer):
            return
        indptr = np.asarray(self.indptr)

        def where(position: tuple[int, ...]) -> str:
            return ", ".join(map(str, position))

        start = indptr[..., 0]
        if np.any(start != 0):
            position = (*np.argwhere(start != 0)[0], 0)
            raise ValueError(
                f"`CSR` needs `indptr` to start at 0 (row 0 starts at entry 0); got "
                f"`indptr[{where(position)}]` = {int(indptr[position])}."
            )
        steps = np.diff(indptr, axis=-1)
        if np.any(steps < 0):
            *batch, row = np.argwhere(steps < 0)[0]
            before, after = (*batch, row), (*batch, row + 1)
            raise ValueError(
                "`CSR` needs `indptr` to be non-decreasing (row `i` holds the entries "
                f"`indptr[i]:indptr[i + 1]`); got `indptr[{where(before)}]` = "
                f"{int(indptr[before])} > `indptr[{where(after)}]` = "
                f"{int(indptr[after])}."
            )
        end = indptr[..., -1]
        if np.any(end > self.nse):
            position = (*np.argwhere(end > self.nse)[0], indptr.shape[-1] - 1)
            raise ValueError(
                f"`CSR` needs `indptr` to end at most at the number of stored entries "
                f"(nse = {self.nse}; the entries from `indptr[-1]` on are padding); "
                f"got `indptr[{where(position)}]` = {int(indptr[position])}."
            )

    @classmethod
    def _from_entries(
        cls,
        data: Array,
        indices: Array,
        indptr: Array,
        shape: tuple[int, ...],
        allow_materialise: bool = False,
    ) -> "CSR":
        """A `CSR` that the family computed itself (a conversion): consistent and
        in range by construction, so the checks of user input are skipped (see
        `BCOO._from_entries`)."""
        fields = {
            "data": data,
            "indices": indices,
            "indptr": indptr,
            "_shape": tuple(shape),
            "allow_materialise": allow_materialise,
        }
        return unchecked(cls, fields)

    @property
    def nse(self) -> int:
        """The number of stored entries per matrix (padding included)."""
        return self.data.shape[-1]

    @property
    def n_batch(self) -> int:
        """The number of batch dimensions."""
        return self.data.ndim - 1

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(
            self.data.shape[:-1] + self._shape[-2:], self.data.dtype
        )

    @classmethod
    def join(cls, value: quax.Value, other: quax.Value) -> BCOO | None:
        """A `CSR` loop carry or `cond` output where the other side is a `BCOO` (what
        the body's rules give): `value` as a `BCOO` (`to_bcoo`), joined with `other`
        as `BCOO.join` does; `None` for anything else. See [`quax.Value.join`][]."""
        if not (isinstance(value, CSR) and isinstance(other, BCOO)):
            return None
        return BCOO.join(value.to_bcoo(), other)

    def to_bcoo(self) -> BCOO:
        """The same matrix as a `BCOO` (rows in order; padding stays padding).

        **Returns:**

        A [`quax_sparse.BCOO`][] with `n_batch` batch dimensions. It does not
        promise `indices_sorted` (the columns within a row may be in any order).
        """
        n_rows, n_cols = self._shape[-2:]

        def stored(indptr: Array) -> Array:
            position = jnp.arange(self.nse, dtype=indptr.dtype)
            return position < indptr[-1]

        def rows(indptr: Array) -> Array:
            position = jnp.arange(self.nse, dtype=indptr.dtype)
            return jnp.searchsorted(indptr, position, side="right") - 1

        for _ in range(self.n_batch):
            rows, stored = jax.vmap(rows), jax.vmap(stored)
        # Padding (the entries from `indptr[-1]` on) at index (n_rows, n_cols).
        keep = stored(self.indptr)
        row = jnp.where(keep, rows(self.indptr), n_rows).astype(self.indices.dtype)
        column = jnp.where(keep, self.indices, n_cols)
        indices = jnp.stack([row, column], axis=-1)
        return BCOO._from_entries(
            self.data, indices, self.shape, self.allow_materialise
        )

    @classmethod
    def from_bcoo(cls, x: BCOO) -> "CSR":
        """Convert a `BCOO` matrix without batch dimensions (sorted by row first unless
        `x.indices_sorted`; padding moves to the end).

        **Returns:**

        A `CSR` with the same entries and `nse`.
        """
        if x.ndim != 2 or x.n_batch != 0 or x.n_dense != 0:
            raise ValueError(
                "CSR.from_bcoo needs a BCOO matrix without batch dimensions and "
                "without dense dimensions (for a batch, `jax.vmap(CSR.from_bcoo)` "
                "over the leaves; for blocks, `x.update_layout(n_dense=0)` first); "
                "got shape "
                f"{x.shape} with n_batch={x.n_batch}, n_dense={x.n_dense}."
            )
        n_rows, n_cols = x.shape
        rows, cols = x.indices[:, 0], x.indices[:, 1]
        valid = (rows >= 0) & (rows < n_rows) & (cols >= 0) & (cols < n_cols)
        rows = jnp.where(valid, rows, n_rows)
        data, cols = x.data, cols
        if not x.indices_sorted:
            order = jnp.argsort(rows, stable=True)
            rows, cols, data = rows[order], cols[order], data[order]
        data = jnp.where(rows < n_rows, data, 0)
        bounds = jnp.arange(n_rows + 1, dtype=rows.dtype)
        indptr = jnp.searchsorted(rows, bounds, side="left").astype(x.indices.dtype)
        return cls._from_entries(
            data, cols, indptr, (n_rows, n_cols), x.allow_materialise
        )

    @classmethod
    def fromdense(
        cls,
        x: ArrayLike,
        *,
        nse: int | None = None,
        index_dtype: Any = jnp.int32,
        allow_materialise: bool = False,
    ) -> "CSR":
        """The nonzeros of a dense matrix, in row-major order, then padding.

        As [`quax_sparse.BCOO.fromdense`][]: for a concrete `x`, an `nse` below its
        number of nonzeros is refused with a `ValueError` giving the count (`nse=None`
        stores exactly the nonzeros); under `jit` (`x` a tracer), where the count
        cannot be known, the first `nse` nonzeros in row-major order are kept and the
        others dropped, as in `jax.experimental.sparse`.

        **Arguments:**

        - `x`: the dense matrix.
        - `nse`: the number of entries to store (at least the number of nonzeros),
            or `None` for a concrete `x`: exactly its nonzeros.
        - `index_dtype`: `int32` or `int64`, for `indices` and `indptr`.
        - `allow_materialise`: passed to `CSR`.

        **Returns:**

        A `CSR` of `x`'s shape.
        """
        if jnp.ndim(x) != 2:
            raise ValueError(
                f"`CSR.fromdense` takes a matrix; got `x` of shape {jnp.shape(x)}."
            )
        bcoo = BCOO._fromdense(
            "CSR.fromdense",
            x,
            nse=nse,
            n_batch=0,
            n_dense=0,
            index_dtype=index_dtype,
            allow_materialise=allow_materialise,
        )
        return cls.from_bcoo(bcoo)

    @classmethod
    def from_scipy(
        cls, x: Any, *, index_dtype: Any = jnp.int32, allow_materialise: bool = False
    ) -> "CSR":
        """Convert a `scipy.sparse` matrix or array (needs scipy)."""
        index_dtype = checked_index_dtype("CSR.from_scipy", index_dtype)
        csr = x.tocsr()
        return cls(
            csr.data,
            np.asarray(csr.indices, index_dtype),
            np.asarray(csr.indptr, index_dtype),
            csr.shape,
            allow_materialise,
        )

    def to_scipy(self) -> Any:
        """This matrix as a `scipy.sparse.csr_array` (padding dropped; needs concrete
        arrays, no batch dimensions, and scipy)."""
        import scipy.sparse

        if self.n_batch:
            raise ValueError(
                f"scipy.sparse holds matrices; this CSR has shape {self.shape}: "
                "convert each matrix of the batch on its own."
            )
        end = int(self.indptr[-1])
        return scipy.sparse.csr_array(
            (
                np.asarray(self.data)[:end],
                np.asarray(self.indices)[:end],
                np.asarray(self.indptr),
            ),
            shape=self._shape,
        )

    def todense(self) -> Array:
        """The dense matrix (an explicit request, always allowed)."""
        return self.to_bcoo().todense()

    def dense(self) -> Array:
        return self.todense()

    def refusal_reason(self) -> str:
        return refusal_reason(self.aval(), self.data.size)

    @staticmethod
    def custom_jvp_rule(name: str, fun: Any, values: Any) -> Any:
        """`slogdet` and `det` of a `CSR` differentiate as those of its `BCOO` form
        (see `BCOO.custom_jvp_rule`)."""
        if not all(isinstance(v, CSR) for v in values):
            return None
        rule = determinant_jvp_rule(name, fun, values)
        if rule is None:
            return None

        def on_bcoo(primals: Any, tangents: Any) -> Any:
            # The rule reads the tangent's `data` only: a `CSR`'s entries are its
            # `BCOO` form's, in the same order.
            convert = lambda v: v.to_bcoo() if isinstance(v, CSR) else v
            return rule([convert(p) for p in primals], tangents)

        return on_bcoo

    @staticmethod
    def default(primitive: Any, values: Any, params: dict[str, Any]) -> Any:
        # Every operation on a CSR is the operation on its BCOO form.
        converted = [v.to_bcoo() if isinstance(v, CSR) else v for v in values]
        return quax.quaxify(primitive.bind)(*converted, **params)
