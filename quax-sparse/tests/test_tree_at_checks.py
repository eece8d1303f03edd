"""A `BCOO` or `CSR` rebuilt without its constructor (`eqx.tree_at`,
`jax.tree.map`) with leaves whose shapes or dtypes disagree is refused by
`quax.quaxify` before any rule reads it: a `data` of shape `(1,)` used to broadcast
over every entry, and a short `indptr` to drop a row, silently."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_sparse


M = np.array([[1.0, 0, 2, 0], [0, 3, 0, 0], [4, 0, 0, 5]], np.float32)
X = np.arange(1.0, 5.0, dtype=np.float32)
PROGRAMS = {
    "matmul": lambda v: v @ X,
    "sum": jnp.sum,
    "mul": lambda v: (v * 2.0).todense(),
    "todense": lambda v: v.todense(),
}


def _bcoo() -> quax_sparse.BCOO:
    return quax_sparse.BCOO.fromdense(M, nse=5)


def _csr() -> quax_sparse.CSR:
    return quax_sparse.CSR.fromdense(M, nse=5)


SWAPS = {
    "bcoo data (1,)": (_bcoo, lambda v: v.data, jnp.ones(1)),
    "bcoo data (nse + 1,)": (_bcoo, lambda v: v.data, jnp.ones(6)),
    "bcoo data (nse, 2)": (_bcoo, lambda v: v.data, jnp.ones((5, 2))),
    "bcoo indices float": (
        _bcoo,
        lambda v: v.indices,
        _bcoo().indices.astype(jnp.float32),
    ),
    "csr indptr short": (_csr, lambda v: v.indptr, _csr().indptr[:-1]),
    "csr indices short": (_csr, lambda v: v.indices, _csr().indices[:-1]),
    "csr data (1,)": (_csr, lambda v: v.data, jnp.ones(1)),
}


@pytest.mark.parametrize("swap", SWAPS, ids=list(SWAPS))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_inconsistent_leaves_are_refused(swap, jit) -> None:
    make, where, leaf = SWAPS[swap]
    bad = eqx.tree_at(where, make(), leaf)
    name = type(bad).__name__
    for program in PROGRAMS.values():
        f = quax.quaxify(program)
        f = jax.jit(f) if jit else f
        with pytest.raises(ValueError) as info:
            f(bad)
        message = str(info.value)
        assert f"`{name}` whose fields break its own checks" in message
        assert "constructor" in message


@pytest.mark.parametrize("make", [_bcoo, _csr], ids=["bcoo", "csr"])
def test_consistent_updates_and_stacks_still_run(make) -> None:
    # An optimiser's update of the stored values: shapes and dtypes kept.
    updated = jax.tree.map(
        lambda x: x * 3.0 if jnp.issubdtype(x.dtype, jnp.floating) else x, make()
    )
    for name, program in PROGRAMS.items():
        out = jax.jit(quax.quaxify(program))(updated)
        want = {"matmul": 3 * M @ X, "sum": 3 * M.sum(), "mul": 6 * M}.get(name, 3 * M)
        np.testing.assert_allclose(out, want, rtol=1e-6)
    # A stack of two (batch sizes from `data`), and `jax.vmap`'s view of one.
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), make(), updated)
    out = quax.quaxify(lambda v: v @ X)(stacked)
    np.testing.assert_allclose(out, np.stack([M @ X, 3 * M @ X]), rtol=1e-6)
    out = jax.vmap(quax.quaxify(lambda v: v @ X))(stacked)
    np.testing.assert_allclose(out, np.stack([M @ X, 3 * M @ X]), rtol=1e-6)
