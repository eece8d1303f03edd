"""Newton's method on a discretised nonlinear PDE, with quax-sparse.

The residual of `-Δu + u³ = 1` on the unit square (zero boundary values), on an
`m x m` grid, is written matrix-free in plain JAX. Each Newton step takes its
Jacobian by colouring (`quax_sparse.jacfwd`: as many JVPs as the 5-point stencil
needs colours, not one per unknown) as a `BCOO`, and solves with it by an unmodified
`jnp.linalg.solve`, which quax-sparse hands to SciPy's SuperLU. Neither the dense
Jacobian (262,144 x 262,144 at m = 512, 550 GB in float64) nor any dense matrix is
formed.

    python examples/sparse_newton.py [--m 512]

The tour (`examples/tour.py`) calls `main()`, on a 128 x 128 grid (16,384 unknowns),
which runs in seconds, and plots the solution and the Newton residuals to
`build/tour/sparse_newton.png`.
"""

import argparse
import pathlib
import time

import jax
import jax.numpy as jnp
import quax
import quax_sparse
import scipy.sparse


def residual_fn(m: int):
    """`-Δu + u³ - 1` at the interior points of an `m x m` grid (5-point stencil,
    spacing `1 / (m + 1)`), as a function of the flattened `u`."""
    h2 = float((m + 1) ** 2)

    def residual(u):
        g = u.reshape(m, m)
        p = jnp.pad(g, 1)
        lap = 4 * g - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]
        return (h2 * lap + g**3 - 1).reshape(-1)

    return residual


def stencil(m: int) -> quax_sparse.BCOO:
    """The pattern of the 5-point stencil on an `m x m` grid: a point and its four
    neighbours (the values are not used)."""
    eye = scipy.sparse.eye_array(m)
    line = scipy.sparse.eye_array(m, k=-1) + eye + scipy.sparse.eye_array(m, k=1)
    grid = scipy.sparse.kron(line, eye) + scipy.sparse.kron(eye, line)
    return quax_sparse.BCOO.from_scipy(grid)


def main(m: int = 128, out_dir: str | None = None) -> dict[str, str]:
    # float64 (the global flag, which JAX's host-callback thread also reads),
    # restored afterwards for the tour's next stops.
    x64 = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        return _solve(m, out_dir)
    finally:
        jax.config.update("jax_enable_x64", x64)


def _solve(m: int, out_dir: str | None) -> dict[str, str]:
    residual = residual_fn(m)
    n = m * m
    start = time.perf_counter()
    jacobian = quax_sparse.jacfwd(residual, stencil(m))
    colouring = time.perf_counter() - start
    print(
        f"{m} x {m} grid: {n:,} unknowns; the stencil's columns take "
        f"{jacobian.n_colours} colours ({colouring:.2f} s to colour, once)"
    )

    @jax.jit
    def step(u):
        r = residual(u)
        du = quax.quaxify(jnp.linalg.solve)(jacobian(u), -r)
        return u + du, jnp.linalg.norm(r)

    u = jnp.zeros(n)
    norms = []
    start = time.perf_counter()
    for k in range(8):
        u, norm = step(u)
        norms.append(float(norm))
        print(f"step {k}: |F(u)| = {float(norm):.3e}")
        if float(norm) < 1e-8:
            break
    final = float(jnp.linalg.norm(residual(u)))
    elapsed = time.perf_counter() - start
    print(
        f"|F(u)| = {final:.2e} after {k + 1} steps, {elapsed:.1f} s (with compilation)"
    )
    if out_dir is not None:
        path = pathlib.Path(out_dir) / "sparse_newton.png"
        _plot(u.reshape(m, m), [*norms, final], path)
    return {
        "unknowns": f"{n:,}",
        "residual": f"{final:.1e}",
        "seconds": f"{elapsed:.1f}",
    }


def _plot(u, norms, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    image = left.imshow(u, origin="lower", extent=(0, 1, 0, 1))
    fig.colorbar(image, ax=left)
    left.set_title("u, solving -Δu + u³ = 1")
    right.semilogy(norms, marker="o")
    right.set_xlabel("Newton step")
    right.set_ylabel("|F(u)|")
    right.set_title("residual (SuperLU solves)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--m", type=int, default=512, help="grid side")
    main(parser.parse_args().m)
