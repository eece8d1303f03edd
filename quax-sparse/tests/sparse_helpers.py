"""Shared helpers: a small literal matrix, random sparse arrays with an independent
dense twin, and a comparison of a quaxified function with the dense one."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
import quax
import quax.testing
from quax_sparse import BCOO, _cusolver


DENSE = np.array([[0.0, 1.5, 0.0, 0.0], [2.0, 0.0, 0.0, -1.0], [0.0, 0.0, 0.0, 3.0]])
"""A 3 x 4 matrix with four nonzeros, for the tests that need a small literal."""

needs_spsolve = pytest.mark.skipif(
    _cusolver._spsolve_backend() is None,
    reason=f'the `"cusolver"` route is this test\'s subject, and JAX has no `spsolve` '
    f"for the {jax.default_backend()} backend (`test_solve_tangents.py` checks that "
    "the route is refused there, naming the way out)",
)
"""For the tests of the `"cusolver"` route (`jax.experimental.sparse.linalg.spsolve`),
which JAX lowers for the CPU and CUDA GPUs only: skipped on a TPU or a ROCm GPU."""


def random_sparse(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    density: float,
    *,
    n_batch: int = 0,
    extra_nse: int = 1,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, BCOO]:
    """A dense NumPy array with about `density` nonzeros and a `BCOO` of the same
    entries, built from NumPy coordinates (not from `fromdense`), shuffled, with
    `extra_nse` padding entries (out of bounds, value 0)."""
    dense = np.where(rng.random(shape) < density, rng.normal(size=shape), 0)
    dense = dense.astype(dtype)
    batch, sparse = shape[:n_batch], shape[n_batch:]
    per_batch = dense.reshape((int(np.prod(batch, dtype=int)), *sparse))
    counts = [int(np.count_nonzero(b)) for b in per_batch]
    nse = max(counts, default=0) + extra_nse
    data = np.zeros((len(per_batch), nse), dtype)
    indices = np.zeros((len(per_batch), nse, len(sparse)), np.int32)
    indices[...] = np.asarray(sparse, np.int32)  # padding: out of bounds
    for b, block in enumerate(per_batch):
        coords = np.argwhere(block != 0)
        order = rng.permutation(len(coords))
        coords = coords[order]
        data[b, : len(coords)] = block[tuple(coords.T)]
        indices[b, : len(coords)] = coords
    data = data.reshape((*batch, nse))
    indices = indices.reshape((*batch, nse, len(sparse)))
    return dense, BCOO(jnp.asarray(data), jnp.asarray(indices), shape)


def assert_close(
    got: Any, want: Any, rtol: float | None = None, atol: float | None = None
) -> None:
    """`got` (a value is densified) against `want`, with the kit's tolerance for the
    less precise of their dtypes unless given."""
    if isinstance(got, quax.Value):
        got = got.enable_materialise().materialise()  # pyright: ignore
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = max(
        (quax.testing.tolerance(x.dtype) for x in (got, want)), key=lambda t: t["rtol"]
    )
    rtol = tol["rtol"] if rtol is None else rtol
    atol = tol["atol"] if atol is None else atol
    if jnp.issubdtype(want.dtype, jnp.inexact):  # bfloat16 and float16 too
        wide = (
            np.complex128
            if jnp.issubdtype(want.dtype, jnp.complexfloating)
            else np.float64
        )
        got, want = got.astype(wide), want.astype(wide)
    finite = np.abs(want[np.isfinite(want)])
    scale = max(1.0, float(np.max(finite, initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale)


def check(
    fn: Callable[..., Any],
    *args: Any,
    dense_args: tuple[Any, ...],
    eager: bool = False,
) -> Any:
    """`quax.quaxify(fn)(*args)` under `jit` (and eagerly if `eager`) against
    `fn(*dense_args)`, with nothing materialised. Returns the quaxified result."""
    want = fn(*dense_args)
    with quax.track_materialisation() as report:
        got = jax.jit(quax.quaxify(fn))(*args)
        if eager:
            got_eager = quax.quaxify(fn)(*args)
            jtu.tree_map(assert_close, got_eager, want, is_leaf=quax.is_value)
    assert not report, str(report)
    jtu.tree_map(assert_close, got, want, is_leaf=quax.is_value)
    return got
