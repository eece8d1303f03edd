"""Tridiagonal solves: LAPACK's sequential, pivoted sweep (`gtsv`, through
`lax.linalg.tridiagonal_solve`) on the CPU, and parallel cyclic reduction on
accelerators, where a sweep over n rows costs n dependent steps (175 ms at n =
65,536 on a TPU v5e, issue 46) while the chip could do the work in
microseconds.

Parallel cyclic reduction (PCR; Hockney and Jesshope, "Parallel Computers 2",
1988): every row is first scaled to a unit diagonal; then, at distances `s = 1,
2, 4, ...`, each row `i` eliminates its couplings to rows `i - s` and `i + s` by
subtracting multiples of those rows, which leaves it coupled to rows `i ± 2s`
(a row with no such neighbour is coupled to none). After `⌈log₂ n⌉` steps every
row is decoupled and holds its unknown. Each step is a few elementwise
operations on shifted copies of the diagonals (contiguous slices: no strided
or gathered access, which TPUs lay out badly), one iteration of a loop, so
that the sequential depth is `⌈log₂ n⌉` and the work O(n log n) per
right-hand side. The right-hand sides are laid out with the n rows last
(`(..., k, n)`, or `(..., n)` for one), so that a single column is not padded
to TPU's 128 lanes.

PCR does not pivot. For a strictly diagonally dominant matrix its multipliers
stay below one and its normwise backward error `‖b - A x‖∞ / (‖A‖∞ ‖x‖∞ +
‖b‖∞)` stays below `eps` (0.77 eps at most over 20 random systems at n = 1,000
and 65,536, float32 and float64; LAPACK's pivoted `gtsv`: 0.26 eps at most);
for the weakly dominant, symmetric positive definite `[-1, 2, -1]` it reached
6.6 eps at n = 65,536 (`gtsv`: 0.54). Without dominance a row's diagonal can
become tiny on the way (PCR combines rows that pivoting would have swapped):
on random systems with standard normal diagonals its backward error was 490
to 860 eps (median; up to 3.1e5) at n = 65,536, where the sequential sweep
without pivoting (JAX's `lax.linalg.tridiagonal_solve` on TPU) stayed below
1.1 eps (`benchmarks/structured.py --tridiagonal-accuracy`). So each answer is
checked by that backward error (one product, O(n k)); where it is above
`TOLERANCE · (⌈log₂ n⌉ + 1) · eps` for some system of the `vmap` batch, the
whole batch is solved again by `lax.linalg.tridiagonal_solve` (a `lax.cond`
branch: LAPACK's pivoted `gtsv` on the CPU, cuSPARSE's `gtsv2` on GPU, JAX's
sweep without pivoting on TPU), whose answer is returned: never less accurate
than that solve by more than the tolerance, and as slow as it where the check
fails.

Derivatives are those of a linear solve (`lax.custom_linear_solve`): `dx =
A⁻¹ (db - dA x)`, and the transposed solve (reverse mode) is another
tridiagonal solve, with the transposed diagonals, as for
`lax.linalg.tridiagonal_solve`."""

import contextlib
import math
from collections.abc import Iterator
from typing import Literal

import jax.numpy as jnp
import quax
from jax import lax
from jaxtyping import Array

from ._dense import for_the_batch


__all__ = [
    "TOLERANCE",
    "parallel_tridiagonal_solve",
    "tridiagonal_product",
    "tridiagonal_solve",
    "tridiagonal_solver",
]


# The largest normwise backward error (relative to `eps`, per `⌈log₂ n⌉ + 1`
# steps) a parallel solve is returned with; above it the batch is solved
# sequentially. Diagonally dominant systems stay below 7 eps in all (see the
# module): 68 eps at n = 65,536 leaves them a margin of 10.
TOLERANCE = 4

Method = Literal["auto", "parallel", "sequential"]

# A `jax.jit`-cache-sensitive setting (quax's caches key on it too): a function
# traced under one method is traced again under another.
_method = quax.plugins.jit_context("auto")


@contextlib.contextmanager
def tridiagonal_solver(method: Method) -> Iterator[None]:
    """Choose how tridiagonal systems are solved while the block runs (also
    while a function is traced): `TridiagonalMatrix`'s `jnp.linalg.solve` and
    `lu_solve`, and their derivatives.

    - `"auto"` (the default): LAPACK's sequential, pivoted `gtsv` on the CPU
        (`lax.linalg.tridiagonal_solve`), parallel cyclic reduction on GPU and
        TPU (decided by the platform the program is compiled for).
    - `"parallel"`: parallel cyclic reduction on every platform (checked by
        its backward error, with `lax.linalg.tridiagonal_solve` where the check
        fails).
    - `"sequential"`: `lax.linalg.tridiagonal_solve` on every platform.

    ```python
    with quax_structured.tridiagonal_solver("parallel"):
        x = jax.jit(quax.quaxify(jnp.linalg.solve))(T, b)
    ```

    A function that `jax.jit` compiled under one method is traced again under
    another.

    **Arguments:**

    - `method`: `"auto"`, `"parallel"` or `"sequential"`.

    **Returns:**

    A context manager.
    """
    if method not in ("auto", "parallel", "sequential"):
        raise ValueError(
            "`tridiagonal_solver` takes `'auto'`, `'parallel'` or `'sequential'`; "
            f"got {method!r}."
        )
    with _method(method):
        yield


def _rows_last(b: Array) -> Array:
    """`b` of shape `(..., n, k)` with its rows last: `(..., n)` for one column,
    else `(..., k, n)` (TPU tiles the last two axes by 8 x 128: rows first, a
    single column would take 128 lanes)."""
    return b[..., 0] if b.shape[-1] == 1 else jnp.swapaxes(b, -1, -2)


def _rows_first(y: Array, b: Array) -> Array:
    """`y` (rows last, see `_rows_last`) in `b`'s shape `(..., n, k)`."""
    return y[..., None] if b.shape[-1] == 1 else jnp.swapaxes(y, -1, -2)


def _per_row(v: Array, y: Array) -> Array:
    """A diagonal (shape `(..., n)`) broadcast against `y` (rows last)."""
    return v if v.ndim == y.ndim else v[..., None, :]


def _shifted(v: Array, s: Array | int) -> tuple[Array, Array]:
    """`(v[..., i - s], v[..., i + s])` along the last axis, zero outside; `s`
    may be traced (`0 < s < n`: a step of the loop)."""
    n = v.shape[-1]
    zeros = jnp.zeros_like(v)
    before = jnp.concatenate([zeros, v], axis=-1)
    after = jnp.concatenate([v, zeros], axis=-1)
    left = lax.dynamic_slice_in_dim(before, n - s, n, axis=-1)
    right = lax.dynamic_slice_in_dim(after, s, n, axis=-1)
    return left, right


def _couplings(dl: Array, du: Array) -> tuple[Array, Array]:
    """`A[i, i - 1]` and `A[i, i + 1]`, zero outside the matrix (`dl[..., 0]` and
    `du[..., n - 1]` are not read)."""
    zero = jnp.zeros_like(dl[..., :1])
    return (
        jnp.concatenate([zero, dl[..., 1:]], axis=-1),
        jnp.concatenate([du[..., :-1], zero], axis=-1),
    )


def _product(lower: Array, main: Array, upper: Array, x: Array) -> Array:
    """`A x` for `x` with its rows last and the couplings of `_couplings`."""
    left, right = _shifted(x, 1)
    return (
        _per_row(main, x) * x + _per_row(lower, x) * left + _per_row(upper, x) * right
    )


def tridiagonal_product(dl: Array, d: Array, du: Array, x: Array) -> Array:
    """`A x` for the tridiagonal `A` of `lax.linalg.tridiagonal_solve`'s
    convention (`dl[..., i] = A[i, i - 1]`, `du[..., i] = A[i, i + 1]`, each of
    shape `(..., n)`; `dl[..., 0]` and `du[..., n - 1]` are not read) and `x` of
    shape `(..., n, k)`, O(n k)."""
    lower, upper = _couplings(dl, du)
    return _rows_first(_product(lower, d, upper, _rows_last(x)), x)


def _cyclic_reduction(dl: Array, d: Array, du: Array, y: Array) -> Array:
    """Parallel cyclic reduction, unchecked: `x` for right-hand sides `y` with
    their rows last (`(..., n)` or `(..., k, n)`) and diagonals of shape `(...,
    n)`, in `lax.linalg.tridiagonal_solve`'s convention.

    The steps run in a `lax.fori_loop` (the distance `2^step` traced), not
    unrolled: unrolled, XLA fused the steps' shifted reads into one another and
    recomputed each step's rows for every read, about 3 reads per step: 150 ms
    at n = 65,536 on the CPU against 4 ms with every step's rows stored."""
    n = d.shape[-1]
    lower, upper = _couplings(dl, du)
    # Rows scaled to a unit diagonal.
    a, c, y = lower / d, upper / d, y / _per_row(d, y)

    def step(k: Array, rows: tuple[Array, Array, Array]):
        a, c, y = rows
        s = jnp.left_shift(1, k)
        a_left, a_right = _shifted(a, s)
        c_left, c_right = _shifted(c, s)
        y_left, y_right = _shifted(y, s)
        # Row i minus a_i times row i - s and c_i times row i + s (each of unit
        # diagonal), then scaled back to a unit diagonal.
        inverse = 1 / (1 - a * c_left - c * a_right)
        y = (y - _per_row(a, y) * y_left - _per_row(c, y) * y_right) * _per_row(
            inverse, y
        )
        return -a * a_left * inverse, -c * c_right * inverse, y

    steps = math.ceil(math.log2(n)) if n > 1 else 0
    _, _, y = lax.fori_loop(0, steps, step, (a, c, y))
    return y


def _backward_error(dl: Array, d: Array, du: Array, x: Array, y: Array) -> Array:
    """The largest normwise backward error `‖y - A x‖∞ / (‖A‖∞ ‖x‖∞ + ‖y‖∞)`
    over the systems and columns (`x`, `y` with their rows last); `inf` where
    NaN."""
    lower, upper = _couplings(dl, du)
    norm = jnp.max(jnp.abs(lower) + jnp.abs(d) + jnp.abs(upper), axis=-1)
    residual = y - _product(lower, d, upper, x)
    size = lambda v: jnp.max(jnp.abs(v), axis=-1)
    norm = norm if x.ndim == d.ndim else norm[..., None]
    errors = size(residual) / (norm * size(x) + size(y))
    errors = jnp.where(jnp.isnan(errors), jnp.inf, errors)
    return jnp.max(errors) if errors.size else jnp.zeros((), errors.dtype)


def _checked(dl: Array, d: Array, du: Array, b: Array) -> Array:
    """The parallel solve of `b` (shape `(..., n, k)`), or, where its backward
    error is above `TOLERANCE` for some system of the (`vmap`) batch,
    `lax.linalg.tridiagonal_solve`'s for the whole batch."""
    n = d.shape[-1]
    y = _rows_last(b)
    x = _cyclic_reduction(dl, d, du, y)
    steps = math.ceil(math.log2(n)) + 1
    eps = jnp.finfo(x.dtype).eps
    accurate = _backward_error(dl, d, du, x, y) <= TOLERANCE * steps * eps
    return lax.cond(
        for_the_batch(accurate),
        lambda x, *_: _rows_first(x, b),
        lambda x, dl, d, du, b: _sequential(dl, d, du, b),
        x,
        dl,
        d,
        du,
        b,
    )


def _sequential(dl: Array, d: Array, du: Array, b: Array) -> Array:
    """`lax.linalg.tridiagonal_solve`, with the diagonals broadcast to `b`'s
    batch (it takes no broadcasting)."""
    batch = b.shape[:-2]
    dl, d, du = (jnp.broadcast_to(v, (*batch, v.shape[-1])) for v in (dl, d, du))
    return lax.linalg.tridiagonal_solve(dl, d, du, b)


def _transposed(dl: Array, du: Array) -> tuple[Array, Array]:
    """The lower and upper diagonals of `Aᵀ` (in the same convention)."""
    zero = jnp.zeros_like(dl[..., :1])
    return (
        jnp.concatenate([zero, du[..., :-1]], axis=-1),
        jnp.concatenate([dl[..., 1:], zero], axis=-1),
    )


def parallel_tridiagonal_solve(dl: Array, d: Array, du: Array, b: Array) -> Array:
    """Solve `A x = b` by parallel cyclic reduction (see the module), checked by
    its backward error, with `lax.linalg.tridiagonal_solve` where the check
    fails; derivatives of a linear solve.

    **Arguments:**

    - `dl`, `d`, `du`: the diagonals, as `lax.linalg.tridiagonal_solve` takes
        them (shape `(..., n)`; `dl[..., 0]` and `du[..., n - 1]` are not read).
    - `b`: the right-hand sides, shape `(..., n, k)`, of the diagonals' batch.

    **Returns:**

    `x`, of `b`'s shape.
    """
    if d.shape[-1] == 0:
        return b
    dl_t, du_t = _transposed(dl, du)
    return lax.custom_linear_solve(
        lambda x: tridiagonal_product(dl, d, du, x),
        b,
        solve=lambda _, b: _checked(dl, d, du, b),
        transpose_solve=lambda _, b: _checked(dl_t, d, du_t, b),
    )


def tridiagonal_solve(dl: Array, d: Array, du: Array, b: Array) -> Array:
    """Solve `A x = b` by the method `tridiagonal_solver` chose: on `"auto"`,
    `lax.linalg.tridiagonal_solve` where the program is compiled for the CPU,
    `parallel_tridiagonal_solve` elsewhere (`lax.platform_dependent`).

    **Arguments:**

    - `dl`, `d`, `du`, `b`: as for `lax.linalg.tridiagonal_solve` (the
        diagonals of `b`'s batch).

    **Returns:**

    `x`, of `b`'s shape.
    """
    method = _method.value
    if method == "sequential":
        return lax.linalg.tridiagonal_solve(dl, d, du, b)
    if method == "parallel":
        return parallel_tridiagonal_solve(dl, d, du, b)
    return lax.platform_dependent(
        dl,
        d,
        du,
        b,
        cpu=lax.linalg.tridiagonal_solve,
        default=parallel_tridiagonal_solve,
    )
