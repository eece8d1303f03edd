"""The device route of the direct solves: JAX's cuSolver solver
(`jax.experimental.sparse.linalg.spsolve`, a sparse QR on the GPU; on CPU JAX runs
it through `scipy.sparse.linalg.spsolve` in a host callback), and the choice between
it and SciPy's SuperLU on the host (`_superlu`): `solver_route`.

`spsolve` takes one CSR matrix and one right-hand side per call, refactors the
matrix at every call and has no batching rule. `solve` here gives it what it can
take, on plain arrays: the entries of a `BCOO` matrix (padding, duplicates and any
order allowed) become a CSR matrix without padding or duplicates (cuSolver's
handling of those is not documented), the columns of the right-hand side are
solved one after another (`lax.map`), and a batch of systems (under `jax.vmap`) is
solved one member at a time (`jax.custom_batching.custom_vmap`). It is not
differentiable itself: `_values._factor.apply_inverse` wraps it, as it wraps the
host's solves, in `lax.custom_linear_solve`.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import quax
from jax import lax
from jaxtyping import Array

from ._kernels import sum_duplicates


__all__ = ["ROUTES", "current_route", "resolve_route", "solve", "solver_route"]

ROUTES = ("auto", "superlu", "cusolver")

# A `jax.jit`-cache-sensitive context (part of JAX's trace context, which quax's
# caches key on too): a function traced under one route is traced again under
# another rather than keeping the first one's solver. Made with quax's
# `jit_context`, which, unlike `jax.make_user_context`, changes no `jit`'s key when
# this family loads inside one.
_route = quax.plugins.jit_context("auto")


def _checked(route: Any) -> str:
    if route not in ROUTES:
        raise ValueError(
            f"The direct solver's `route` must be one of {ROUTES}; got {route!r}."
        )
    return route


@contextlib.contextmanager
def solver_route(route: str) -> Iterator[None]:
    """Choose the sparse direct solver that `jnp.linalg.solve`, `lu_factor`,
    `cho_factor` (and everything built on them) use on a sparse matrix while the
    block runs (also while it is traced).

    ```python
    with quax_sparse.solver_route("cusolver"):
        x = jax.jit(quax.quaxify(jnp.linalg.solve))(a, b)
    ```

    - `"auto"` (the default): `"cusolver"` where JAX's default backend is a CUDA
        GPU, else `"superlu"`.
    - `"superlu"`: SciPy's SuperLU on the host (`jax.pure_callback`): one
        factorisation per `lu`/`cholesky`, reused by every solve with it.
    - `"cusolver"`: `jax.experimental.sparse.linalg.spsolve` (cuSolver's sparse QR
        on a GPU; on CPU JAX runs it through `scipy.sparse.linalg.spsolve`): each
        solve factors the matrix again, once per right-hand side.

    A function that `jax.jit` compiled under one route is traced again under
    another.

    **Arguments:**

    - `route`: one of `"auto"`, `"superlu"`, `"cusolver"`.

    **Returns:**

    A context manager.
    """
    with _route(_checked(route)):
        yield


def current_route() -> str:
    """The route that `solver_route` set (`"auto"` outside any block)."""
    return _route.value


def _spsolve_backend() -> str | None:
    """JAX's default backend where JAX lowers `spsolve` there (the CPU, a CUDA
    GPU), else `None` (a TPU, a ROCm GPU)."""
    backend = jax.default_backend()
    if backend == "cpu":
        return backend
    if backend != "gpu":
        return None
    version = str(getattr(jax.devices()[0].client, "platform_version", ""))
    return None if "rocm" in version.lower() else backend


def resolve_route(route: str | None = None) -> str:
    """`"superlu"` or `"cusolver"`: `route` (the current `solver_route` when
    `None`), `"auto"` read from JAX's default backend (a CUDA GPU takes
    `"cusolver"`: JAX lowers `spsolve` for CUDA and CPU only). `"cusolver"` on a
    backend without `spsolve` (a TPU, a ROCm GPU) raises a `ValueError` saying so,
    at trace time, where JAX would fail at compile time without naming the
    route."""
    route = _checked(current_route() if route is None else route)
    backend = _spsolve_backend()
    if route == "auto":
        return "cusolver" if backend == "gpu" else "superlu"
    if route == "cusolver" and backend is None:
        raise ValueError(
            'quax-sparse\'s `"cusolver"` route solves with '
            "`jax.experimental.sparse.linalg.spsolve`, which JAX lowers for the CPU "
            f"and CUDA GPUs only, not for this {jax.default_backend()} backend. Use "
            '`quax_sparse.solver_route("superlu")` (SciPy\'s SuperLU on the host) '
            'or `"auto"`, which picks it here.'
        )
    return route


def _csr(data: Array, indices: Array, n: int) -> tuple[Array, Array, Array]:
    """The `n x n` matrix of the entries, as a CSR matrix of size `n + nse` with no
    padding and no duplicate positions: `[[A, 0], [Z, I]]`.

    The duplicates are merged first (sorted, padding last). Stored slot `k` then
    adds the identity's row `n + k`; a padding slot puts that `1` in its own place
    and an explicit zero at column 0 of the same row (`Z`), so that the number of
    entries, `2 nse`, is static and no position repeats. The system is block lower
    triangular: its first `n` unknowns solve `A x = b`.
    """
    nse = data.shape[0]
    data, indices = sum_duplicates(data, indices, (n, n), nse, is_sorted=False)
    valid = (indices[:, 0] < n) & (indices[:, 1] < n)
    extra = n + jnp.arange(nse, dtype=indices.dtype)
    one = jnp.ones((), data.dtype)
    rows = jnp.concatenate([jnp.where(valid, indices[:, 0], extra), extra])
    cols = jnp.concatenate(
        [jnp.where(valid, indices[:, 1], extra), jnp.where(valid, extra, 0)]
    )
    values = jnp.concatenate(
        [jnp.where(valid, data, one), jnp.where(valid, one, jnp.zeros_like(one))]
    )
    rows, cols, values = lax.sort((rows, cols, values), num_keys=2)
    bounds = jnp.arange(n + nse + 1, dtype=rows.dtype)
    indptr = jnp.searchsorted(rows, bounds, side="left").astype(indices.dtype)
    return values, cols, indptr


def _solve_one(data: Array, indices: Array, b: Array, trans: int) -> Array:
    """One system, `b` of shape `(n, k)`: `k` calls of `spsolve`."""
    # Imported here, when a solve takes this route, not with the family: it
    # imports `jax.experimental.sparse` and `scipy.sparse`, about 0.6 s of CPU,
    # which made up most of `import quax_sparse` (measured 2026-12-07: `import
    # quax` 2.7-2.9 s, `import quax_sparse` 3.4-3.6 s), paid at the first
    # quaxified call of a program that never solves on this route.
    from jax.experimental.sparse.linalg import spsolve

    n, k = b.shape
    if n == 0 or k == 0:
        return b
    if trans:
        indices = indices[:, ::-1]
    if trans == 2:
        data = jnp.conj(data)
    values, cols, indptr = _csr(data.astype(b.dtype), indices, n)
    rhs = jnp.concatenate([b, jnp.zeros((data.shape[0], k), b.dtype)])

    def column(c: Array) -> Array:
        # `tol=0`: cuSolver calls the matrix singular at an exactly zero pivot only
        # (its default, an absolute 1e-6, would call a well-conditioned matrix of
        # small entries singular); `apply_inverse`'s backward-error check judges
        # the result instead.
        return spsolve(values, cols, indptr, c, tol=0.0)[:n]

    return lax.map(column, rhs.T).T


def _batched(trans: int) -> Any:
    """`_solve_one` for one `trans`, under `jax.vmap` too: `spsolve` has no
    batching rule, so the members of a batch are solved in turn (`lax.map`)."""

    @jax.custom_batching.custom_vmap
    def run(data: Array, indices: Array, b: Array) -> Array:
        return _solve_one(data, indices, b, trans)

    @run.def_vmap
    def _(axis_size: int, in_batched: Any, *args: Array) -> Any:
        members = tuple(
            x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            for x, batched in zip(args, in_batched, strict=True)
        )
        return lax.map(lambda member: run(*member), members), True

    return run


_SOLVES = {trans: _batched(trans) for trans in (0, 1, 2)}


def solve(data: Array, indices: Array, b: Array, *, trans: int) -> Array:
    """`A⁻¹ b` (`trans=0`), `A⁻ᵀ b` (1) or `A⁻ᴴ b` (2) by
    `jax.experimental.sparse.linalg.spsolve`, for the `n x n` matrix `A` of the
    entries. Works under `jit` and `vmap`; not differentiable (see the module's
    docstring).

    **Arguments:**

    - `data`, `indices`: the entries of `A`, shapes `(nse,)` and `(nse, 2)`
        (padding, duplicates, any order; no gradient flows through them).
    - `b`: the right-hand sides, shape `(n, k)`, of the result's dtype.
    - `trans`: which system to solve.

    **Returns:**

    An array of `b`'s shape and dtype. What it holds where `A` is singular is
    cuSolver's (or SciPy's) business: `apply_inverse` checks the backward error.
    """
    return _SOLVES[trans](lax.stop_gradient(data), indices, b)
