"""The rules shared by every structured matrix: each calls the matrix's own
structured method, or falls back to `StructuredMatrix.default` (which refuses)
when the case has no structured algorithm."""

from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import quax
from jax import lax
from jax.extend.core import primitives as prims
from jaxtyping import ArrayLike

from ._base import MaterialisationError, StructuredMatrix
from ._diagonal import Diagonal, ScaledIdentity
from ._tridiagonal import TridiagonalMatrix


def _fallback(primitive: Any, values: list[Any], params: dict[str, Any]) -> Any:
    return quax.fallback_rule(primitive, values)(values, params)


# dot_general --------------------------------------------------------------------------


def _structured_product(
    s: StructuredMatrix, x: Any, s_is_lhs: bool, dimension_numbers: Any
) -> Any | None:
    """`dot_general` of a structured matrix `s` and a plain `x`, through `s.matmat`,
    or `None` when the dimension numbers are not a (batched) matrix product with
    the structured matrix's batch axes as the product's batch axes."""
    (lc, rc), (lb, rb) = dimension_numbers
    s_con, x_con, s_bat, x_bat = (lc, rc, lb, rb) if s_is_lhs else (rc, lc, rb, lb)
    nb = s.ndim - 2
    if tuple(s_bat) != tuple(range(nb)) or len(s_con) != 1 or s_con[0] < nb:
        return None
    op = s if s_con[0] == nb + 1 else s.transpose()
    if op is None:
        return None
    x = jnp.asarray(x)
    free = [i for i in range(x.ndim) if i not in (*x_bat, x_con[0])]
    xt = jnp.transpose(x, (*x_bat, x_con[0], *free))
    free_shape = tuple(x.shape[i] for i in free)
    xt = xt.reshape(*xt.shape[: nb + 1], int(np.prod(free_shape, dtype=int)))
    out = op.matmat(xt)
    if out is None:
        return None
    out = out.reshape(*xt.shape[: nb + 1], *free_shape)
    if not s_is_lhs:
        out = jnp.moveaxis(out, nb, -1)
    return out


def _result_dtype(s: Any, x: Any, preferred: Any) -> Any:
    return preferred if preferred is not None else jnp.result_type(s.dtype, x.dtype)


@quax.register(lax.dot_general_p)
def _(
    lhs: StructuredMatrix,
    rhs: ArrayLike,
    *,
    dimension_numbers: Any,
    preferred_element_type: Any = None,
    **params: Any,
) -> Any:
    out = _structured_product(lhs, rhs, True, dimension_numbers)
    if out is None:
        return _fallback(
            lax.dot_general_p,
            [lhs, rhs],
            dict(
                dimension_numbers=dimension_numbers,
                preferred_element_type=preferred_element_type,
                **params,
            ),
        )
    return out.astype(_result_dtype(lhs, jnp.asarray(rhs), preferred_element_type))


@quax.register(lax.dot_general_p)
def _(
    lhs: ArrayLike,
    rhs: StructuredMatrix,
    *,
    dimension_numbers: Any,
    preferred_element_type: Any = None,
    **params: Any,
) -> Any:
    out = _structured_product(rhs, lhs, False, dimension_numbers)
    if out is None:
        return _fallback(
            lax.dot_general_p,
            [lhs, rhs],
            dict(
                dimension_numbers=dimension_numbers,
                preferred_element_type=preferred_element_type,
                **params,
            ),
        )
    return out.astype(_result_dtype(rhs, jnp.asarray(lhs), preferred_element_type))


def _is_matrix_product(x: StructuredMatrix, y: StructuredMatrix, dn: Any) -> bool:
    nb = x.ndim - 2
    batch = tuple(range(nb))
    return y.ndim == x.ndim and tuple(map(tuple, dn)) == (
        ((nb + 1,), (nb,)),
        (batch, batch),
    )


@quax.register(lax.dot_general_p)
def _(
    lhs: StructuredMatrix,
    rhs: StructuredMatrix,
    *,
    dimension_numbers: Any,
    **params: Any,
) -> Any:
    out = None
    if _is_matrix_product(lhs, rhs, dimension_numbers):
        out = lhs.product(rhs)
        if out is None and isinstance(rhs, Diagonal):
            out = lhs.col_scaled(rhs.diag)
        if out is None and isinstance(rhs, ScaledIdentity) and jnp.ndim(rhs.scale) == 0:
            out = lhs.scaled(rhs.scale)
    if out is None:
        params = dict(dimension_numbers=dimension_numbers, **params)
        return _fallback(lax.dot_general_p, [lhs, rhs], params)
    return out


# Structure-keeping algebra ------------------------------------------------------------


@quax.register(lax.transpose_p)
def _(x: StructuredMatrix, *, permutation: Any) -> Any:
    nb = x.ndim - 2
    out = None
    if tuple(permutation) == (*range(nb), nb + 1, nb):
        out = x.transpose()
    elif tuple(permutation) == tuple(range(x.ndim)):
        out = x
    if out is None:
        return _fallback(lax.transpose_p, [x], dict(permutation=permutation))
    return out


def _scalar(y: Any) -> Any | None:
    """`y` as a 0-dimensional array if it holds one number, else `None`."""
    if np.size(y) != 1:
        return None
    return jnp.reshape(y, ())


def _scaled(primitive: Any, values: list[Any], x: StructuredMatrix, s: Any) -> Any:
    out = None if s is None else x.scaled(s.astype(x.dtype))
    return _fallback(primitive, values, {}) if out is None else out


@quax.register(lax.neg_p)
def _(x: StructuredMatrix) -> Any:
    return _scaled(lax.neg_p, [x], x, jnp.asarray(-1, x.dtype))


def _times_dense(x: StructuredMatrix, y: Any) -> Any | None:
    """`x * y` for a plain `y` of `x`'s full shape: with a structure when `x.masked`
    keeps one (a pattern of zeros times anything finite is that pattern), else
    the dense product read through `x.entries`, which costs what the dense `y`
    already does (O(n²)): this is the masked branch of `jnp.diagonal`."""
    if np.ndim(y) != x.ndim or np.broadcast_shapes(np.shape(y), x.shape) != x.shape:
        return None
    out = x.masked(jnp.broadcast_to(y, x.shape))
    if out is not None or x.ndim != 2:
        return out
    i, j = jnp.indices(x.shape)
    entries = x.entries(i, j)
    return None if entries is None else entries * y


def _mul(values: list[Any], x: StructuredMatrix, y: Any) -> Any:
    s = _scalar(y)
    if s is not None:
        return _scaled(lax.mul_p, values, x, s)
    out = _times_dense(x, y)
    return _fallback(lax.mul_p, values, {}) if out is None else out


@quax.register(lax.mul_p)
def _(x: StructuredMatrix, y: ArrayLike) -> Any:
    return _mul([x, y], x, y)


@quax.register(lax.mul_p)
def _(y: ArrayLike, x: StructuredMatrix) -> Any:
    return _mul([y, x], x, y)


@quax.register(lax.div_p)
def _(x: StructuredMatrix, y: ArrayLike) -> Any:
    s = _scalar(y)
    return _scaled(lax.div_p, [x, y], x, None if s is None else 1 / s)


def _same_leaves(x: StructuredMatrix, y: StructuredMatrix) -> bool:
    lx, tx = jtu.tree_flatten(x)
    ly, ty = jtu.tree_flatten(y)
    return tx == ty and all(a is b for a, b in zip(lx, ly, strict=True))


@quax.register(lax.add_p)
def _(x: StructuredMatrix, y: StructuredMatrix) -> Any:
    out = x.add(y)
    if out is None:
        out = y.add(x)
    if out is None and _same_leaves(x, y):
        # `K + K`, e.g. a symmetric matrix plus its transpose (`jnp.linalg.cholesky`
        # symmetrises its input).
        out = x.scaled(jnp.asarray(2, x.dtype))
    return _fallback(lax.add_p, [x, y], {}) if out is None else out


@quax.register(lax.sub_p)
def _(x: StructuredMatrix, y: StructuredMatrix) -> Any:
    neg = y.scaled(jnp.asarray(-1, y.dtype))
    out = None if neg is None else x.add(neg)
    if out is None and neg is not None:
        out = neg.add(x)
    return _fallback(lax.sub_p, [x, y], {}) if out is None else out


@quax.register(lax.convert_element_type_p)
def _(x: StructuredMatrix, *, new_dtype: Any, **params: Any) -> Any:
    out = None
    if new_dtype == x.dtype:
        out = x
    elif jnp.issubdtype(new_dtype, jnp.inexact):
        out = x.map_leaves(lambda leaf: leaf.astype(new_dtype))
    if out is None:
        params = dict(new_dtype=new_dtype, **params)
        return _fallback(lax.convert_element_type_p, [x], params)
    return out


@quax.register(lax.reduce_sum_p)
def _(x: StructuredMatrix, *, axes: Any, **params: Any) -> Any:
    """Row sums (`x @ 1`), column sums (`xᵀ @ 1`) or both, through products."""
    nb = x.ndim - 2
    axes = tuple(sorted(axes))
    op = {(nb,): x.transpose(), (nb + 1,): x, (nb, nb + 1): x}.get(axes)
    out = None
    if op is not None:
        ones = jnp.ones((*x.shape[:-1], 1), x.dtype)
        out = op.matmat(ones)
    if out is None:
        return _fallback(lax.reduce_sum_p, [x], dict(axes=axes, **params))
    out = out[..., 0]
    return jnp.sum(out, axis=-1) if len(axes) == 2 else out


def _is_zeros(x: Any) -> bool:
    """Whether the plain array `x` is known, at trace time, to hold only zeros (as
    the zeros `jnp.where`, `jnp.tril` and `lax.linalg.cholesky` select against)."""
    known = quax.known_constant(x, 2**62)
    return known is not None and bool(np.all(known == 0))


@quax.register(prims.select_n_p)
def _(which: ArrayLike, *cases: StructuredMatrix | ArrayLike) -> Any:
    """`where(mask, x, 0)` (`jnp.tril`, `jnp.trace`, the lower factor
    `lax.linalg.cholesky` returns): the structure's entries, masked."""
    out = None
    structured = [
        (i, c) for i, c in enumerate(cases) if isinstance(c, StructuredMatrix)
    ]
    if len(cases) == 2 and len(structured) == 1:
        ((i, x),) = structured
        if _is_zeros(cases[1 - i]):
            keep = jnp.asarray(which) if i == 1 else ~jnp.asarray(which)
            out = _times_dense(x, keep.astype(x.dtype))
    if out is None:
        return _fallback(prims.select_n_p, [which, *cases], {})
    return out


# Linear algebra -----------------------------------------------------------------------


def _identity_pivots(x: StructuredMatrix) -> Any:
    iota = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.broadcast_to(iota, (*x.shape[:-2], x.shape[-1]))


@quax.register(lax.linalg.lu_p)
def _(x: StructuredMatrix) -> Any:
    factors = x.lu()
    if factors is None:
        return _fallback(lax.linalg.lu_p, [x], {})
    if isinstance(factors, tuple):
        return list(factors)
    pivots = _identity_pivots(x)
    return [factors, pivots, pivots]


@quax.register(lax.linalg.triangular_solve_p)
def _(
    a: StructuredMatrix,
    b: ArrayLike,
    *,
    left_side: bool,
    lower: bool,
    transpose_a: bool,
    conjugate_a: bool,
    unit_diagonal: bool,
) -> Any:
    params = dict(
        left_side=left_side,
        lower=lower,
        transpose_a=transpose_a,
        conjugate_a=conjugate_a,
        unit_diagonal=unit_diagonal,
    )
    if conjugate_a and jnp.issubdtype(a.dtype, jnp.complexfloating):
        return _fallback(lax.linalg.triangular_solve_p, [a, b], params)
    b = jnp.asarray(b)
    if not left_side:
        # x op(A) = b  <=>  op(A)^T x^T = b^T.
        b = jnp.swapaxes(b, -1, -2)
        transpose_a = not transpose_a
    out = a.triangular_solve(
        b, lower=lower, transpose_a=transpose_a, unit_diagonal=unit_diagonal
    )
    if out is None:
        return _fallback(lax.linalg.triangular_solve_p, [a, b], params)
    return out if left_side else jnp.swapaxes(out, -1, -2)


@quax.register(lax.linalg.cholesky_p)
def _(x: StructuredMatrix, **params: Any) -> Any:
    out = x.cholesky()
    return _fallback(lax.linalg.cholesky_p, [x], params) if out is None else out


@quax.register(lax.linalg.eig_p)
def _(
    x: StructuredMatrix,
    *,
    compute_left_eigenvectors: bool,
    compute_right_eigenvectors: bool,
    **params: Any,
) -> Any:
    """`jnp.linalg.eigvals`: the eigenvalues alone, where the structure knows them."""
    out = None
    if not (compute_left_eigenvectors or compute_right_eigenvectors):
        out = x.eigenvalues()
    if out is None:
        params = dict(
            compute_left_eigenvectors=compute_left_eigenvectors,
            compute_right_eigenvectors=compute_right_eigenvectors,
            **params,
        )
        return _fallback(lax.linalg.eig_p, [x], params)
    return [out]


@quax.register(lax.linalg.eigh_p)
def _(x: StructuredMatrix, *, subset_by_index: Any = None, **params: Any) -> Any:
    """`jnp.linalg.eigh`/`eigvalsh`: through the structure's eigendecomposition."""
    out = None
    if subset_by_index is None or tuple(subset_by_index) == (0, x.shape[-1]):
        out = x.eigh()
    if out is None:
        params = dict(subset_by_index=subset_by_index, **params)
        if isinstance(x, TridiagonalMatrix) and not x.allow_materialise:
            raise MaterialisationError(
                "Refusing to materialise `TridiagonalMatrix` with "
                "`allow_materialise=False`: quax-structured has no eigenvector "
                "algorithm for primitive `eigh` on a tridiagonal matrix. For the "
                "eigenvalues of a symmetric one, call `jax.scipy.linalg."
                "eigh_tridiagonal(T.main_diag, T.lower_diag, eigvals_only=True)`; "
                "else pass `allow_materialise=True` to `TridiagonalMatrix` or call "
                "`.enable_materialise()` to allow the dense array."
            )
        return _fallback(lax.linalg.eigh_p, [x], params)
    values, vectors = out
    return [vectors, values]


def _diagonal_entry_set(
    x: StructuredMatrix, indices: Any, updates: Any, params: dict[str, Any]
) -> Any | None:
    """`x.at[i, i].set(v)` for one known diagonal entry (what the derivative of
    `jnp.linalg.det` does to an LU factor), through `x.with_diagonal_entry`."""
    dn = params["dimension_numbers"]
    if (
        x.ndim != 2
        or params.get("update_jaxpr") is not None
        or np.size(updates) != 1
        or dn.update_window_dims
        or tuple(dn.inserted_window_dims) != (0, 1)
        or tuple(dn.scatter_dims_to_operand_dims) != (0, 1)
        or dn.operand_batching_dims
    ):
        return None
    index = quax.known_constant(indices)
    n = x.shape[-1]
    if index is None or np.shape(index) != (2,) or index[0] != index[1]:
        return None
    i = int(index[0])
    if not 0 <= i < n:
        return None
    return x.with_diagonal_entry(i, jnp.reshape(updates, ()).astype(x.dtype))


@quax.register(prims.scatter_p)
def _(
    x: StructuredMatrix, indices: ArrayLike, updates: ArrayLike, **params: Any
) -> Any:
    out = _diagonal_entry_set(x, indices, updates, params)
    if out is None:
        return _fallback(prims.scatter_p, [x, indices, updates], params)
    return out


# Reading entries ----------------------------------------------------------------------


def _point_gather(
    x: StructuredMatrix,
    indices: Any,
    dimension_numbers: Any,
    slice_sizes: Any,
    mode: Any,
) -> Any | None:
    """Entries `x[..., i, j]` read by a gather of single elements over the two
    matrix axes (what `jnp.diagonal` and `a[i, j]` bind), through `x.entries`."""
    nb = x.ndim - 2
    dn = dimension_numbers
    if (
        nb != 0
        or tuple(slice_sizes) != (1, 1)
        or tuple(dn.collapsed_slice_dims) != (0, 1)
        or tuple(dn.start_index_map) != (0, 1)
        or dn.offset_dims
        or dn.operand_batching_dims
        or mode == lax.GatherScatterMode.FILL_OR_DROP
    ):
        return None
    # Clipped indices, as the `clip` and `promise_in_bounds` modes read them.
    indices = jnp.asarray(indices)
    return x.entries(indices[..., 0], indices[..., 1])


@quax.register(prims.gather_p)
def _(x: StructuredMatrix, indices: ArrayLike, **params: Any) -> Any:
    out = _point_gather(
        x,
        indices,
        params["dimension_numbers"],
        params["slice_sizes"],
        params["mode"],
    )
    if out is None:
        return _fallback(prims.gather_p, [x, indices], params)
    return out
