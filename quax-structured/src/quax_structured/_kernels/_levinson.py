"""The Levinson recursion: a Toeplitz solve without pivoting, O(n²) time and
O(n) memory."""

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array


__all__ = ["levinson"]


def levinson(column: Array, row: Array, b: Array) -> tuple[Array, Array]:
    """Solve `T x = b` for the Toeplitz `T` (first column `column`, first row
    `row`, both of shape `(n,)`) and `b` of shape `(n, k)`, by the Levinson
    recursion: O(n² (k + 1)) time, O(n k) memory.

    Like LU without pivoting, it needs every leading principal submatrix of `T`
    to be nonsingular (true for positive definite or diagonally dominant `T`),
    and it is not backward stable for indefinite matrices.

    **Returns:**

    `(x, pivots)`: the solution, and the pivots of `T`'s LU factorisation without
    pivoting (`pivots[m] = det T[:m+1, :m+1] / det T[:m, :m]`).
    """
    # NumPy leaves (indexed by traced positions in the loop below) as JAX arrays.
    column, row = jnp.asarray(column), jnp.asarray(row)
    n = column.shape[-1]
    index = jnp.arange(n)
    t0 = column[0]
    # Forward and backward vectors (T_m f = e_1, T_m g = e_m) and the solution of
    # the leading m x m system, left-aligned in length-n arrays.
    f = jnp.zeros(n, column.dtype).at[0].set(1 / t0)
    x = jnp.zeros(b.shape, jnp.result_type(column, b)).at[0].set(b[0] / t0)

    def step(carry, m):
        f, g, x = carry
        lower = column[jnp.clip(m - index, 0, n - 1)]  # T[m, i] for i < m
        upper = row[jnp.clip(index + 1, 0, n - 1)]  # T[0, i + 1]
        ef, eg = lower @ f, upper @ g
        shifted = jnp.roll(g, 1)
        denominator = 1 - ef * eg
        f, g = (f - ef * shifted) / denominator, (shifted - eg * f) / denominator
        x = x + jnp.outer(g, b[m] - lower @ x)
        return (f, g, x), g[m]

    (_, _, x), last = lax.scan(step, (f, f, x), jnp.arange(1, n))
    return x, jnp.concatenate([t0[None], 1 / last])
