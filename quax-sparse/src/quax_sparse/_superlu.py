"""The sparse direct solver on the host: SciPy's SuperLU (`scipy.sparse.linalg.splu`)
behind `jax.pure_callback`, on plain arrays.

A factorisation is computed once by `factor` and kept on the host under an integer
handle (a small cache of the most recent ones, `CACHE_SIZE`); every solve receives
the handle and the matrix's entries, so a solve whose factor was evicted (or that
JAX ran without the factorisation's callback) factors the matrix again rather than
answering wrongly. Every function here accepts leading batch axes on its arrays
(what `vmap_method="expand_dims"` hands a callback) and broadcasts them.

CHOLMOD (scikit-sparse) is not used: it has no wheels on PyPI and needs a system
SuiteSparse to build, so symmetric positive definite matrices are factored by
SuperLU too, in its symmetric mode (a symmetric ordering, diagonal pivots first).
"""

import itertools
import threading
from collections import OrderedDict
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array


__all__ = ["CACHE_SIZE", "factor", "inverse_at", "solve"]

# How many factorisations the host keeps (the most recently used). A solve whose
# factor is gone factors again: a smaller cache costs time, never correctness.
CACHE_SIZE = 8

_cache: "OrderedDict[int, Any]" = OrderedDict()
_lock = threading.Lock()
_handles = itertools.count(1)

# A factorisation that SuperLU found exactly singular: solves give NaN, the pivots
# are zeros (so `slogdet` gives sign 0 and log |det| = -inf, as dense JAX does).
_SINGULAR = "singular"
# The factorisation of a 0 x 0 matrix (solves return their empty right-hand side).
_EMPTY = "empty"


def _matrix(data: np.ndarray, indices: np.ndarray, n: int) -> Any:
    """The `n x n` CSC matrix of the entries (padding dropped, duplicates added)."""
    import scipy.sparse

    rows, cols = indices[:, 0], indices[:, 1]
    keep = (rows >= 0) & (rows < n) & (cols >= 0) & (cols < n)
    dtype = np.result_type(data.dtype, np.float32)
    coo = scipy.sparse.coo_array(
        (data[keep].astype(dtype), (rows[keep], cols[keep])), shape=(n, n)
    )
    return coo.tocsc()


def _parity(perm: np.ndarray) -> int:
    """0 for an even permutation, 1 for an odd one (`n - cycles` transpositions)."""
    import scipy.sparse
    import scipy.sparse.csgraph

    n = perm.shape[0]
    if n == 0:
        return 0
    graph = scipy.sparse.coo_array(
        (np.ones(n, np.int8), (np.arange(n), perm)), shape=(n, n)
    )
    cycles, _ = scipy.sparse.csgraph.connected_components(graph, directed=False)
    return (n - cycles) % 2


def _factorise(data: np.ndarray, indices: np.ndarray, n: int, spd: bool) -> Any:
    """SuperLU's factorisation of one matrix, or `_SINGULAR`."""
    import scipy.sparse.linalg

    a = _matrix(data, indices, n)
    if n == 0:
        return _EMPTY
    options: dict[str, Any] = {}
    if spd:
        options = dict(
            permc_spec="MMD_AT_PLUS_A",
            diag_pivot_thresh=0.0,
            options=dict(SymmetricMode=True),
        )
    try:
        return scipy.sparse.linalg.splu(a, **options)
    except RuntimeError:  # "Factor is exactly singular"
        return _SINGULAR


def _pivots(lu: Any, n: int, dtype: Any) -> np.ndarray:
    """Numbers whose product is `det A`: `U`'s diagonal, the sign of both
    permutations folded into the first."""
    if isinstance(lu, str):
        return np.zeros(n, dtype) if lu == _SINGULAR else np.ones(n, dtype)
    pivots = lu.U.diagonal().astype(dtype)
    if (_parity(lu.perm_r) + _parity(lu.perm_c)) % 2:
        pivots[0] = -pivots[0]
    return pivots


def _remember(lu: Any) -> int:
    with _lock:
        handle = next(_handles) % (2**31 - 1)
        _cache[handle] = lu
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return handle


def _recall(
    handle: int, data: np.ndarray, indices: np.ndarray, n: int, spd: bool
) -> Any:
    with _lock:
        lu = _cache.get(handle)
        if lu is not None:
            _cache.move_to_end(handle)
            return lu
    return _factorise(data, indices, n, spd)


def _batch(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


def _host_factor(data: np.ndarray, indices: np.ndarray, *, n: int, spd: bool) -> Any:
    data, indices = np.asarray(data), np.asarray(indices)
    batch = _batch(data.shape[:-1], indices.shape[:-2])
    data = np.broadcast_to(data, (*batch, data.shape[-1]))
    indices = np.broadcast_to(indices, (*batch, *indices.shape[-2:]))
    handles = np.zeros(batch, np.int32)
    pivots = np.zeros((*batch, n), data.dtype)
    for b in np.ndindex(*batch):
        lu = _factorise(data[b], indices[b], n, spd)
        handles[b] = _remember(lu)
        pivots[b] = _pivots(lu, n, data.dtype)
    return handles, pivots


def factor(data: Array, indices: Array, n: int, *, spd: bool) -> tuple[Array, Array]:
    """Factor the `n x n` matrix of the entries on the host (SuperLU).

    **Arguments:**

    - `data`, `indices`: the entries, shapes `(nse,)` and `(nse, 2)` (no gradient
        flows through them).
    - `n`: the size of the matrix.
    - `spd`: whether the matrix is symmetric positive definite (SuperLU's
        symmetric mode: a symmetric fill-reducing ordering, diagonal pivots).

    **Returns:**

    `(handle, pivots)`: the factorisation's handle (an `int32` scalar) and `n`
    numbers whose product is `det A` (`U`'s diagonal, the sign of the row and
    column permutations folded into the first; zeros when SuperLU found the matrix
    exactly singular).
    """
    data = jax.lax.stop_gradient(data)
    out = (
        jax.ShapeDtypeStruct((), jnp.int32),
        jax.ShapeDtypeStruct((n,), data.dtype),
    )

    def host(data: np.ndarray, indices: np.ndarray) -> Any:
        return _host_factor(data, indices, n=n, spd=spd)

    return jax.pure_callback(host, out, data, indices, vmap_method="expand_dims")


_TRANS = {0: "N", 1: "T", 2: "H"}


def _host_solve(
    handle: np.ndarray,
    data: np.ndarray,
    indices: np.ndarray,
    b: np.ndarray,
    *,
    n: int,
    spd: bool,
    trans: int,
) -> np.ndarray:
    handle, data, indices, b = (np.asarray(x) for x in (handle, data, indices, b))
    batch = _batch(handle.shape, data.shape[:-1], indices.shape[:-2], b.shape[:-2])
    handle = np.broadcast_to(handle, batch)
    data = np.broadcast_to(data, (*batch, data.shape[-1]))
    indices = np.broadcast_to(indices, (*batch, *indices.shape[-2:]))
    b = np.broadcast_to(b, (*batch, *b.shape[-2:]))
    out = np.empty(b.shape, b.dtype)
    for i in np.ndindex(*batch):
        lu = _recall(int(handle[i]), data[i], indices[i], n, spd)
        if isinstance(lu, str):
            out[i] = b[i] if lu == _EMPTY else np.nan
        else:
            rhs = b[i].astype(np.result_type(b.dtype, lu.U.dtype))
            out[i] = lu.solve(rhs, trans=_TRANS[trans]).astype(b.dtype)
    return out


def solve(
    handle: Array,
    data: Array,
    indices: Array,
    b: Array,
    *,
    spd: bool,
    trans: int,
) -> Array:
    """`A⁻¹ b` (`trans=0`), `A⁻ᵀ b` (1) or `A⁻ᴴ b` (2) on the host with the
    factorisation `handle` (factored again from the entries if the host no longer
    holds it). Not differentiable: the rules wrap it in `lax.custom_linear_solve`.

    **Arguments:**

    - `handle`: from `factor`.
    - `data`, `indices`: the matrix's entries, as given to `factor`.
    - `b`: the right-hand sides, shape `(n, k)`, of the result's dtype.
    - `spd`: as given to `factor`.
    - `trans`: which system to solve.

    **Returns:**

    An array of `b`'s shape and dtype (NaN where the matrix is singular).
    """
    n = b.shape[0]
    data = jax.lax.stop_gradient(data)

    def host(*args: np.ndarray) -> np.ndarray:
        return _host_solve(*args, n=n, spd=spd, trans=trans)

    out = jax.ShapeDtypeStruct(b.shape, b.dtype)
    return jax.pure_callback(
        host, out, handle, data, indices, b, vmap_method="expand_dims"
    )


# How many columns of `A⁻¹` one host solve computes in `inverse_at`.
_BLOCK = 256


def _host_inverse_at(data: np.ndarray, indices: np.ndarray, *, n: int) -> np.ndarray:
    data, indices = np.asarray(data), np.asarray(indices)
    batch = _batch(data.shape[:-1], indices.shape[:-2])
    data = np.broadcast_to(data, (*batch, data.shape[-1]))
    indices = np.broadcast_to(indices, (*batch, *indices.shape[-2:]))
    out = np.zeros(data.shape, data.dtype)
    for b in np.ndindex(*batch):
        rows, cols = indices[b][:, 0], indices[b][:, 1]
        keep = (rows >= 0) & (rows < n) & (cols >= 0) & (cols < n)
        lu = _factorise(data[b], indices[b], n, spd=False)
        if isinstance(lu, str):
            out[b][keep] = np.nan if lu == _SINGULAR else 0
            continue
        # Entry k needs (A⁻¹)[col_k, row_k], read from column row_k of A⁻¹.
        needed = np.unique(rows[keep])
        for start in range(0, needed.shape[0], _BLOCK):
            block = needed[start : start + _BLOCK]
            unit = np.zeros((n, block.shape[0]), lu.U.dtype)
            unit[block, np.arange(block.shape[0])] = 1
            columns = lu.solve(unit)
            where = keep & np.isin(rows, block)
            slot = np.searchsorted(block, rows[where])
            out[b][where] = columns[cols[where], slot].astype(data.dtype)
    return out


def inverse_at(data: Array, indices: Array, n: int) -> Array:
    """`(A⁻¹)[col_k, row_k]` for every stored entry `k` of `A` (zero at padding):
    the derivative of `log |det A|` with respect to each stored value, since
    `d log |det A| = trace(A⁻¹ dA)`.

    Computed on the host from columns of `A⁻¹` (`_BLOCK` at a time, one SuperLU
    solve each block): `O(n_rows * nnz(L + U))` time, `O(n * _BLOCK + nse)`
    memory, never the dense inverse.

    **Arguments:**

    - `data`, `indices`: the entries of `A`, shapes `(nse,)`, `(nse, 2)` (no
        gradient flows through them).
    - `n`: the size of `A`.

    **Returns:**

    An array of `data`'s shape (NaN where `A` is singular).
    """
    data = jax.lax.stop_gradient(data)

    def host(data: np.ndarray, indices: np.ndarray) -> np.ndarray:
        return _host_inverse_at(data, indices, n=n)

    out = jax.ShapeDtypeStruct(data.shape, data.dtype)
    return jax.pure_callback(host, out, data, indices, vmap_method="expand_dims")
