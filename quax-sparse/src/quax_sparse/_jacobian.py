"""Sparse Jacobians and Hessians by colouring: given the sparsity pattern of the
Jacobian (a `BCOO`), `jacfwd` computes it in `c` JVPs and `jacrev` in `c` VJPs,
where `c` is the number of colours of a greedy colouring of the pattern's columns
(rows), and returns it as a `BCOO` on that pattern. Never a dense `m x n` array:
the compressed Jacobian is `c x m` (`c x n`)."""

from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ._values import BCOO, CSR


__all__ = ["colour", "hessian", "jacfwd", "jacrev"]


def _pattern(pattern: Any, owner: str) -> tuple[np.ndarray, tuple[int, int]]:
    """The pattern's positions (unique, row-major, padding dropped), concrete."""
    if isinstance(pattern, CSR):
        pattern = pattern.to_bcoo()
    if (
        not isinstance(pattern, BCOO)
        or pattern.ndim != 2
        or pattern.n_batch != 0
        or pattern.n_dense != 0
    ):
        raise ValueError(
            f"`quax_sparse.{owner}` needs the Jacobian's sparsity pattern as a "
            "`BCOO` (or `CSR`) matrix of shape (outputs, inputs) without batch "
            f"or dense dimensions; got {type(pattern).__name__} of shape "
            f"{getattr(pattern, 'shape', None)}."
        )
    if isinstance(pattern.indices, jax.core.Tracer):
        raise ValueError(
            f"`quax_sparse.{owner}` colours the pattern once, on the host: its "
            "`indices` must be concrete (build the pattern outside `jax.jit`, and "
            "close over it)."
        )
    m, n = pattern.shape
    coords = np.asarray(pattern.indices).reshape(-1, 2).astype(np.int64)
    keep = (coords[:, 0] >= 0) & (coords[:, 0] < m)
    keep &= (coords[:, 1] >= 0) & (coords[:, 1] < n)
    # Unique positions in row-major order, by sorting one integer key per entry
    # (`np.unique(coords, axis=0)` sorts rows as structured records: 15 times
    # slower at a million entries).
    key = np.sort(coords[keep, 0] * n + coords[keep, 1])
    key = key[np.concatenate([[True], key[1:] != key[:-1]])] if key.size else key
    coords = np.stack([key // max(n, 1), key % max(n, 1)], axis=-1)
    return coords.astype(np.int32), (m, n)


def _greedy(conflicts: Any, size: int) -> np.ndarray:
    """A greedy colouring of the conflict graph (a SciPy sparse `size x size`
    matrix: `u` and `v` may not share a colour where it stores `(u, v)`), vertices
    taken by decreasing degree."""
    graph = conflicts.tocsr()
    ptr, neighbours = graph.indptr.tolist(), graph.indices.tolist()
    degree = np.diff(graph.indptr)
    order = np.argsort(-degree, kind="stable").tolist()
    colours = [-1] * size
    for v in order:
        used = {colours[u] for u in neighbours[ptr[v] : ptr[v + 1]] if u != v}
        c = 0
        while c in used:
            c += 1
        colours[v] = c
    return np.asarray(colours, np.int32)


def _colour(coords: np.ndarray, shape: tuple[int, int], axis: int) -> np.ndarray:
    import scipy.sparse

    m, n = shape
    ones = np.ones(coords.shape[0], np.int8)
    p = scipy.sparse.csr_array((ones, (coords[:, 0], coords[:, 1])), shape=(m, n))
    if axis == 1:  # columns sharing a row conflict
        return _greedy(p.T @ p, n)
    return _greedy(p @ p.T, m)  # rows sharing a column conflict


def colour(pattern: BCOO | CSR, *, by: str = "columns") -> np.ndarray:
    """A greedy colouring of a Jacobian's sparsity pattern: columns (`by="columns"`,
    for `jacfwd`) that share no row get the same colour, or rows
    (`by="rows"`, for `jacrev`) that share no column.

    **Arguments:**

    - `pattern`: the Jacobian's structure, a `BCOO` or `CSR` of shape
        `(outputs, inputs)` with concrete indices (values ignored).
    - `by`: `"columns"` or `"rows"`.

    **Returns:**

    A NumPy `int32` array, one colour (`0 .. c - 1`) per column (row).
    """
    if by not in ("columns", "rows"):
        raise ValueError(f"`by` must be 'columns' or 'rows'; got {by!r}.")
    coords, shape = _pattern(pattern, "colour")
    return _colour(coords, shape, 1 if by == "columns" else 0)


def _check_io(owner: str, x: Array, out: Any, shape: tuple[int, int]) -> None:
    m, n = shape
    if x.shape != (n,):
        raise ValueError(
            f"`quax_sparse.{owner}`: the pattern has shape {shape} (outputs, "
            f"inputs), so the function's argument must have shape ({n},); got "
            f"{x.shape}."
        )
    if jnp.shape(out) != (m,):
        raise ValueError(
            f"`quax_sparse.{owner}`: the pattern has shape {shape} (outputs, "
            f"inputs), so the function must return shape ({m},); it returned "
            f"{jnp.shape(out)}."
        )


def _result(data: Array, coords: np.ndarray, shape: tuple[int, int]) -> BCOO:
    return BCOO._from_entries(
        data,
        jnp.asarray(coords),
        shape,
        indices_sorted=True,
        unique_indices=True,
    )


def _sparse_jacobian(
    fun: Callable[[Array], Array], pattern: BCOO | CSR, owner: str, by_columns: bool
) -> Callable:
    """`jacfwd` (`by_columns`: one JVP per colour of the columns) or `jacrev` (one
    VJP per colour of the rows) of `fun` on `pattern`."""
    coords, shape = _pattern(pattern, owner)
    axis = 1 if by_columns else 0
    colours = _colour(coords, shape, axis)
    n_colours = int(colours.max(initial=-1)) + 1
    # Entry (i, j) is read from the product along the colour of column j (row i),
    # at output i (input j).
    which = colours[coords[:, axis]]
    at = coords[:, 1 - axis]
    seeds = colours[None, :] == np.arange(n_colours)[:, None]
    # The slots (colour, output) that no entry of the pattern reads: a nonzero of the
    # Jacobian outside the pattern that lands in one would be dropped, so any value
    # there is a missed entry, found at no extra cost (one that lands in a slot the
    # pattern reads is added into that entry, which no check this cheap can see).
    unread = np.ones((n_colours, shape[1 - axis]), bool)
    unread[which, at] = False

    def jacobian(x: Array) -> BCOO:
        x = jnp.asarray(x)
        if by_columns:
            _check_io(owner, x, jax.eval_shape(fun, x), shape)
            compressed = jax.vmap(lambda s: jax.jvp(fun, (x,), (s,))[1])(
                jnp.asarray(seeds, x.dtype)
            )
        else:
            out, pullback = jax.vjp(fun, x)
            _check_io(owner, x, out, shape)
            (compressed,) = jax.vmap(pullback)(jnp.asarray(seeds, out.dtype))
        data = compressed[which, at]
        if unread.any():
            missed = jnp.any(jnp.where(unread, compressed, 0) != 0)
            data = jnp.where(missed, jnp.nan, data)
        return _result(data, coords, shape)

    jacobian.colours = colours  # pyright: ignore[reportFunctionMemberAccess]
    jacobian.n_colours = n_colours  # pyright: ignore[reportFunctionMemberAccess]
    return jacobian


def jacfwd(fun: Callable[[Array], Array], pattern: BCOO | CSR) -> Callable:
    """The sparse Jacobian of `fun` by forward mode, in `c` JVPs (one per colour of
    the pattern's columns) rather than one per input.

    ```python
    jac = quax_sparse.jacfwd(residual, pattern)  # colours once, on the host
    J = jac(u)  # a BCOO on the pattern; works under jit
    du = quax.quaxify(jnp.linalg.solve)(J, -residual(u))
    ```

    **Arguments:**

    - `fun`: an unmodified JAX function from shape `(n,)` to shape `(m,)`.
    - `pattern`: the Jacobian's sparsity structure, a `BCOO` or `CSR` of shape
        `(m, n)` with concrete indices (values ignored; duplicates and padding
        dropped). **It must hold every entry that can be nonzero.** A nonzero
        outside it is either caught, when no entry of its row shares its column's
        colour (every value of the result is then NaN), or silently added into the
        entry of its row that does (a wrong finite value, which no cheap check can
        see): check a new pattern once against `jax.jacfwd` on a small instance.

    **Returns:**

    A function of `x` (shape `(n,)`) returning the Jacobian at `x` as a `BCOO` of
    shape `(m, n)` on the pattern (sorted, unique indices), dtype of `fun`'s output.
    The colouring is exposed as `.colours` and `.n_colours`.
    """
    return _sparse_jacobian(fun, pattern, "jacfwd", by_columns=True)


def jacrev(fun: Callable[[Array], Array], pattern: BCOO | CSR) -> Callable:
    """The sparse Jacobian of `fun` by reverse mode, in `c` VJPs (one per colour of
    the pattern's rows) rather than one per output. As [`quax_sparse.jacfwd`][]
    otherwise (same arguments and result; the colouring is of rows, and a nonzero
    outside the pattern is caught, every value NaN, when no entry of its column
    shares its row's colour, and otherwise silently added into the entry of its
    column that does)."""
    return _sparse_jacobian(fun, pattern, "jacrev", by_columns=False)


def hessian(fun: Callable[[Array], Array], pattern: BCOO | CSR) -> Callable:
    """The sparse Hessian of a scalar function, `jacfwd` of its gradient on the
    Hessian's pattern (forward over reverse, `c` Hessian-vector products).

    **Arguments:**

    - `fun`: an unmodified JAX function from shape `(n,)` to a scalar.
    - `pattern`: the Hessian's structure, `(n, n)`, as for
        [`quax_sparse.jacfwd`][].

    **Returns:**

    A function of `x` returning the Hessian as a `BCOO` on the pattern.
    """
    return jacfwd(jax.grad(fun), pattern)
