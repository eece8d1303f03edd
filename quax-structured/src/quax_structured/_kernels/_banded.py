"""Banded Gaussian elimination with partial pivoting (as LAPACK's `gbsv`), on
the bands of a matrix stored by its diagonals."""

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array


__all__ = ["band_eliminate", "pivoted_band_pivots", "pivoted_band_solve", "shift"]


def shift(x: Array, s: int) -> Array:
    """`out[..., i] = x[..., i + s]` along the last axis, zero where out of range."""
    n = x.shape[-1]
    if s == 0:
        return x
    pad = [(0, 0)] * (x.ndim - 1)
    if s > 0:
        return jnp.pad(x[..., s:], [*pad, (0, min(s, n))])[..., :n]
    return jnp.pad(x[..., : max(n + s, 0)], [*pad, (min(-s, n), 0)])[..., -n:]


def band_eliminate(full: Array, b: Array, p: int, q: int):
    """Gaussian elimination with partial pivoting for one matrix given by its band
    rows `full[i, c] = A[i, i - p + c]` (shape `(n, p + q + 1)`), applied to `b`
    of shape `(n, k)`, as LAPACK's `gbtrf`. Step `k` holds the window `W[r, c] =
    A'[k + r, k + c]` (`r <= p`, `c <= p + q`) of the matrix being eliminated and
    the matching rows of the right-hand side: it swaps the row of largest
    magnitude in column `k` to the top, eliminates below it, and emits the top
    row (a row of `U`) and its right-hand side; row `k + p + 1` enters untouched
    (no earlier row reaches its columns). A zero pivot (the column is zero: a
    singular matrix) eliminates nothing.

    **Returns:**

    `(u, y, swaps)`: `U`'s rows (`u[k, c] = U[k, k + c]`, shape `(n, p + q +
    1)`), the eliminated right-hand side, and the number of row swaps."""
    n, width = full.shape
    w = p + q + 1  # the window's width: U's upper bandwidth grows to p + q
    rows = jnp.pad(full, [(0, p + 1), (0, w - width)])
    # Row r holds A[r, c] in the window's columns c = 0 ..: its band row shifted
    # left by p - r, zero past column q + r.
    c = jnp.arange(w)
    window0 = jnp.stack(
        [jnp.where(c <= q + r, jnp.roll(rows[r], r - p), 0) for r in range(p + 1)]
    )
    rhs = jnp.pad(b, [(0, p + 1), (0, 0)])

    def eliminate(carry, new):
        window, top = carry
        new_row, new_rhs = new
        i = jnp.argmax(jnp.abs(window[:, 0]))
        order = jnp.arange(p + 1).at[0].set(i).at[i].set(0)
        window, top = window[order], top[order]
        pivot = window[0, 0]
        ell = window[1:, 0] / jnp.where(pivot == 0, 1, pivot)
        below = window[1:, 1:] - ell[:, None] * window[0:1, 1:]
        below_rhs = top[1:] - ell[:, None] * top[0:1]
        zero = jnp.zeros((p, 1), window.dtype)
        nxt = jnp.concatenate([jnp.concatenate([below, zero], 1), new_row[None]], 0)
        out = (window[0], top[0], i != 0)
        return (nxt, jnp.concatenate([below_rhs, new_rhs[None]])), out

    carry0 = (window0, rhs[: p + 1])
    _, (u, y, swapped) = lax.scan(
        eliminate, carry0, (rows[p + 1 : p + 1 + n], rhs[p + 1 : p + 1 + n])
    )
    return u, y, jnp.sum(swapped)


def pivoted_band_solve(full: Array, b: Array, p: int, q: int) -> Array:
    """`A x = b` with partial pivoting for one matrix given by its band rows (see
    `band_eliminate`) and `b` of shape `(n, k)`: the elimination, then a back
    substitution with `U` (upper bandwidth `p + q`)."""
    u, y, _ = band_eliminate(full, b, p, q)

    def substitute(after, xs):
        # after[j - 1] holds the solution j rows below.
        u_row, y_row = xs
        x = (y_row - u_row[1:] @ after) / u_row[0]
        return jnp.concatenate([x[None], after])[: p + q], x

    after0 = jnp.zeros((p + q, b.shape[-1]), b.dtype)
    _, x = lax.scan(substitute, after0, (u, y), reverse=True)
    return x


def pivoted_band_pivots(full: Array, p: int, q: int) -> Array:
    """Numbers whose product is `det A` for one matrix given by its band rows:
    the pivots of the elimination with partial pivoting, the first one negated
    for an odd number of row swaps. Exactly 0 at a singular matrix."""
    u, _, swaps = band_eliminate(full, jnp.zeros((full.shape[0], 0), full.dtype), p, q)
    pivots = u[:, 0]
    return pivots.at[0].multiply(jnp.where(swaps % 2, -1, 1).astype(pivots.dtype))
