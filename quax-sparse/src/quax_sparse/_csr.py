"""The value type `CSR`: a sparse matrix in compressed-sparse-row format."""

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import quax
from jaxtyping import Array, ArrayLike

from ._bcoo import BCOO, MaterialisationError


__all__ = ["CSR"]


class CSR(quax.ArrayValue):
    """A sparse matrix in compressed-sparse-row format (as scipy's `csr_array`).

    Row `i` stores the entries `indptr[i]:indptr[i + 1]`: values `data[...]` in the
    columns `indices[...]`. Entries from `indptr[-1]` on are padding.

    Inside [`quax.quaxify`][] a `CSR` behaves as the [`quax_sparse.BCOO`][] it
    converts to (an `O(nse)` row expansion, no sort): every primitive with a sparse
    rule for `BCOO` works, and gives what that rule gives (a `BCOO` where the result is
    sparse).

    **Fields:**

    - `data`: shape `(nse,)`.
    - `indices`: the column of each entry, shape `(nse,)`.
    - `indptr`: shape `(n_rows + 1,)`, non-decreasing, `indptr[0] = 0`.
    - `allow_materialise`: as for `BCOO`.
    """

    data: Array
    indices: Array
    indptr: Array
    _shape: tuple[int, int] = eqx.field(static=True)
    allow_materialise: bool = eqx.field(static=True)

    linear_in_leaves: ClassVar[bool] = True

    def __init__(
        self,
        data: ArrayLike,
        indices: ArrayLike,
        indptr: ArrayLike,
        shape: tuple[int, int],
        allow_materialise: bool = False,
    ):
        """**Arguments:**

        - `data`, `indices`, `indptr`: as above.
        - `shape`: `(n_rows, n_cols)`.
        - `allow_materialise`: whether an operation without a sparse rule may form the
            dense matrix.
        """
        self.data = jnp.asarray(data)
        self.indices = jnp.asarray(indices)
        self.indptr = jnp.asarray(indptr)
        self._shape = (int(shape[0]), int(shape[1]))
        self.allow_materialise = allow_materialise

    def __check_init__(self) -> None:
        if len(self._shape) != 2:
            raise ValueError(f"`CSR` holds matrices; got shape {self._shape}.")
        if self.data.ndim != 1 or self.indices.shape != self.data.shape:
            raise ValueError(
                "`CSR` needs `data` and `indices` of the same shape (nse,); got "
                f"{self.data.shape} and {self.indices.shape}."
            )
        if self.indptr.shape != (self._shape[0] + 1,):
            raise ValueError(
                f"`CSR` of shape {self._shape} needs `indptr` of shape "
                f"({self._shape[0] + 1},); got {self.indptr.shape}."
            )

    @property
    def nse(self) -> int:
        """The number of stored entries (padding included)."""
        return self.data.shape[0]

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self._shape, self.data.dtype)

    def to_bcoo(self) -> BCOO:
        """The same matrix as a `BCOO` (sorted indices; padding stays padding).

        **Returns:**

        A [`quax_sparse.BCOO`][] with `indices_sorted=True`.
        """
        n_rows = self._shape[0]
        position = jnp.arange(self.nse, dtype=self.indptr.dtype)
        rows = jnp.searchsorted(self.indptr, position, side="right") - 1
        rows = jnp.where(position < self.indptr[-1], rows, n_rows)
        indices = jnp.stack([rows.astype(self.indices.dtype), self.indices], axis=-1)
        return BCOO(
            self.data,
            indices,
            self._shape,
            self.allow_materialise,
            indices_sorted=True,
        )

    @classmethod
    def from_bcoo(cls, x: BCOO) -> "CSR":
        """Convert a `BCOO` matrix without batch dimensions (sorted by row first unless
        `x.indices_sorted`; padding moves to the end).

        **Returns:**

        A `CSR` with the same entries and `nse`.
        """
        if x.ndim != 2 or x.n_batch != 0:
            raise ValueError(
                "CSR.from_bcoo needs a BCOO matrix without batch dimensions; got "
                f"shape {x.shape} with n_batch={x.n_batch}."
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
        return cls(data, cols, indptr, (n_rows, n_cols), x.allow_materialise)

    @classmethod
    def fromdense(
        cls,
        x: ArrayLike,
        *,
        nse: int,
        index_dtype: Any = jnp.int32,
        allow_materialise: bool = False,
    ) -> "CSR":
        """The nonzeros of a dense matrix; see [`quax_sparse.BCOO.fromdense`][] (the
        first `nse` nonzeros in row-major order are kept)."""
        bcoo = BCOO.fromdense(
            x, nse=nse, index_dtype=index_dtype, allow_materialise=allow_materialise
        )
        return cls.from_bcoo(bcoo)

    @classmethod
    def from_scipy(
        cls, x: Any, *, index_dtype: Any = jnp.int32, allow_materialise: bool = False
    ) -> "CSR":
        """Convert a `scipy.sparse` matrix or array (needs scipy)."""
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
        arrays and scipy)."""
        import scipy.sparse

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

    def materialise(self) -> Array:
        if not self.allow_materialise:
            raise MaterialisationError(
                "Refusing to materialise sparse matrix with `allow_materialise=False` "
                f"(CSR of shape {self._shape}, nse {self.nse}). Pass "
                "allow_materialise=True to CSR (or call .enable_materialise()) to "
                "allow it, or call .todense() to densify explicitly."
            )
        return self.todense()

    def enable_materialise(self, allow_materialise: bool = True) -> "CSR":
        """A copy of this matrix with `allow_materialise` set as given."""
        return CSR(self.data, self.indices, self.indptr, self._shape, allow_materialise)

    @staticmethod
    def default(primitive: Any, values: Any, params: dict[str, Any]) -> Any:
        # Every operation on a CSR is the operation on its BCOO form.
        converted = [v.to_bcoo() if isinstance(v, CSR) else v for v in values]
        return quax.quaxify(primitive.bind)(*converted, **params)
