"""Unmodified `jnp.linalg` code on a tridiagonal matrix, at O(n) cost.

1. The scaling of `jnp.linalg.solve(T, b)`: the same line of code that would build
   an O(n³) LU on a dense matrix runs in O(n) on a `TridiagonalMatrix`, up to
   n = 262,144 (a dense matrix that size would need 256 GiB).
2. A Gaussian process with the exponential (Ornstein-Uhlenbeck, Matérn-1/2) kernel
   on sorted inputs: its precision matrix K⁻¹ is tridiagonal, so the log marginal
   likelihood `-½ yᵀK⁻¹y - ½ log det K - n/2 log 2π`, written in plain `jnp`
   (`Q @ y`, `jnp.linalg.slogdet(Q)`), costs O(n) for 100,000 points; the
   lengthscale is chosen by maximising it over a grid, and the posterior mean at
   the inputs is one `jnp.linalg.solve`.

    python examples/structured_tridiagonal.py
"""

import time

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
from quax_structured import TridiagonalMatrix


def solve_scaling() -> dict[int, float]:
    """Seconds per `jnp.linalg.solve(T, b)` under `jit(quaxify(...))`, by size."""
    solve = jax.jit(quax.quaxify(jnp.linalg.solve))
    times = {}
    for n in (1024, 16384, 262144):
        k1, k2 = jr.split(jr.key(n))
        t = TridiagonalMatrix(
            -jnp.ones(n - 1), 2.5 + jr.uniform(k1, (n,)), -jnp.ones(n - 1)
        )
        b = jr.normal(k2, (n,))
        x = solve(t, b).block_until_ready()
        start = time.perf_counter()
        for _ in range(10):
            x = solve(t, b)
        x.block_until_ready()
        times[n] = (time.perf_counter() - start) / 10
        residual = jnp.max(jnp.abs(quax.quaxify(lambda t, x: t @ x)(t, x) - b))
        print(f"n = {n:>7,}: solve {times[n] * 1e3:7.3f} ms, residual {residual:.1e}")
    return times


def ou_precision(
    x: jax.Array, lengthscale: float, variance: float
) -> TridiagonalMatrix:
    """The inverse of the exponential-kernel covariance at sorted inputs `x`,
    `K[i, j] = variance * exp(-|x_i - x_j| / lengthscale)`: the process is Markov,
    so its precision is tridiagonal (closed form, O(n))."""
    a = jnp.exp(-jnp.diff(x) / lengthscale)  # correlation between neighbours
    r = -1 / jnp.expm1(-2 * jnp.diff(x) / lengthscale)  # 1 / (1 - a²), accurately
    main = jnp.concatenate([r[:1], jnp.zeros(len(x) - 2), r[-1:]])
    main = main.at[1:-1].set(r[:-1] + r[1:] - 1)
    return TridiagonalMatrix(-a * r / variance, main / variance, -a * r / variance)


def log_marginal_likelihood(q, y):
    """Plain `jnp`: the Gaussian log density of `y` with precision matrix `q`."""
    n = y.shape[0]
    _, logdet_q = jnp.linalg.slogdet(q)
    return -0.5 * y @ (q @ y) + 0.5 * logdet_q - 0.5 * n * jnp.log(2 * jnp.pi)


def gaussian_process(n: int = 100_000) -> dict[str, float]:
    # Float64: a precision matrix of closely spaced points has entries ~ 1 / gap,
    # and `yᵀQy` cancels them; float32 loses the likelihood's shape.
    k1, k2 = jr.split(jr.key(0))
    x = jnp.sort(jr.uniform(k1, (n,), jnp.float64, minval=0, maxval=1000))
    true_lengthscale = 3.0
    # Sample the process exactly with its Markov recursion (O(n)).
    a = jnp.exp(-jnp.diff(x) / true_lengthscale)
    scale = jnp.sqrt(-jnp.expm1(-2 * jnp.diff(x) / true_lengthscale))
    noise = jr.normal(k2, (n,), jnp.float64)

    def step(prev, inputs):
        ai, si, ei = inputs
        nxt = ai * prev + si * ei
        return nxt, nxt

    _, rest = jax.lax.scan(step, noise[0], (a, scale, noise[1:]))
    y = jnp.concatenate([noise[:1], rest])

    @jax.jit
    def lml(lengthscale):
        return quax.quaxify(log_marginal_likelihood)(
            ou_precision(x, lengthscale, 1.0), y
        )

    grid = np.geomspace(0.3, 30, 21)
    start = time.perf_counter()
    values = [float(lml(s)) for s in grid]
    elapsed = time.perf_counter() - start
    best = float(grid[int(np.argmax(values))])
    print(
        f"GP, n = {n:,}: log marginal likelihood at {len(grid)} lengthscales in "
        f"{elapsed:.2f} s; best lengthscale {best:.2f} (true {true_lengthscale})"
    )
    return {"best": best, "true": true_lengthscale, "seconds": elapsed}


def main() -> dict[str, str]:
    # float64 for these solves, restored afterwards: the tour runs the next stops in
    # this process, and float64 there would double their float weights.
    x64 = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        times = solve_scaling()
        gp = gaussian_process()
    finally:
        jax.config.update("jax_enable_x64", x64)
    return {
        "tridiagonal solve, n = 262,144": f"{times[262144] * 1e3:.2f} ms",
        "solve time ratio 262,144 / 16,384 (16x the size)": (
            f"{times[262144] / times[16384]:.1f}x"
        ),
        "GP lengthscale by marginal likelihood (100k points)": (
            f"{gp['best']:.2f} (true {gp['true']})"
        ),
    }


if __name__ == "__main__":
    main()
