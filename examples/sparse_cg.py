"""Conjugate gradients on a sparse 5-point Laplacian, with quax-sparse.

An unmodified `jax.scipy.sparse.linalg.cg` call runs on a `quax_sparse.BCOO` matrix
inside `quax.quaxify`: the matrix-vector products cost what the 1.3 million stored
entries cost, and the dense matrix (262,144 x 262,144, 275 GB) is never formed.

    python examples/sparse_cg.py
"""

import time

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as jspla
import numpy as np
import quax
import quax_sparse


def laplacian(m: int) -> quax_sparse.BCOO:
    """The 5-point Laplacian of an `m x m` grid with zero boundary values: 4 on the
    diagonal, -1 for each of the (up to) four neighbours."""
    grid = np.arange(m * m).reshape(m, m)
    rows, cols = [grid.ravel()], [grid.ravel()]
    for a, b in [(grid[1:], grid[:-1]), (grid[:, 1:], grid[:, :-1])]:
        rows += [a.ravel(), b.ravel()]
        cols += [b.ravel(), a.ravel()]
    r, c = np.concatenate(rows), np.concatenate(cols)
    values = np.where(r == c, 4.0, -1.0).astype(np.float32)
    return quax_sparse.BCOO(values, np.stack([r, c], -1).astype(np.int32), (m * m,) * 2)


@jax.jit
@quax.quaxify
def solve(a, b):
    # Plain JAX: `a` looks like a (n, n) array to this function.
    x, _ = jspla.cg(lambda v: a @ v, b, tol=1e-5, maxiter=5000)
    return x, jnp.linalg.norm(a @ x - b) / jnp.linalg.norm(b)


def main() -> dict[str, str]:
    m = 512
    a = laplacian(m)
    n = a.shape[0]
    print(f"5-point Laplacian of a {m} x {m} grid: {n:,} unknowns, {a.nse:,} entries")
    print(f"(the dense matrix would take {n * n * 4 / 1e9:,.0f} GB)")
    # A smooth right-hand side: a point source in the middle of the grid.
    b = jnp.zeros((m, m)).at[m // 2, m // 2].set(1.0).ravel()

    start = time.perf_counter()
    x, residual = jax.block_until_ready(solve(a, b))
    first = time.perf_counter() - start
    start = time.perf_counter()
    x, residual = jax.block_until_ready(solve(a, b))
    again = time.perf_counter() - start
    print(f"CG: relative residual {float(residual):.1e}")
    print(f"time: {first:.2f} s with compilation, {again:.2f} s compiled")

    try:
        quax.quaxify(jnp.exp)(a)
    except quax_sparse.SparseMaterialisationError as e:
        print(f"exp(a) is refused: {str(e)[:90]}...")
    return {
        "unknowns": f"{n:,}",
        "stored entries": f"{a.nse:,}",
        "relative residual": f"{float(residual):.1e}",
        "solve time (compiled)": f"{again:.2f} s",
        "peak value of solution": f"{float(x.max()):.4f}",
    }


if __name__ == "__main__":
    main()
