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


# `indices` with another number of columns than the array was built with (its
# `n_sparse`). Before `n_sparse` was recorded, `_shape` could not say it (its batch
# part is stale once `jax.vmap` removes batch axes from the leaves), and a `BCOO`
# whose indices had one column fewer read as an array of one dimension fewer.
T = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4) * (
    np.arange(24).reshape(2, 3, 4) % 3 == 0
)
H = np.arange(24.0, dtype=np.float32).reshape(3, 4, 2) * (
    np.arange(12).reshape(3, 4, 1) % 3 == 0
)


def _columns(make, keep: int | None = None, extra: int = 0):
    """`make()` with `indices` cut to its first `keep` columns, or `extra` columns of
    zeros added, by `eqx.tree_at` (which skips the constructor)."""
    good = make()
    indices = good.indices if keep is None else good.indices[..., :keep]
    if extra:
        zeros = jnp.zeros((*indices.shape[:-1], extra), indices.dtype)
        indices = jnp.concatenate([indices, zeros], axis=-1)
    return eqx.tree_at(lambda v: v.indices, good, indices)


COLUMNS = {
    "matrix, one column": (_bcoo, 1, 0),
    "matrix, no column": (_bcoo, 0, 0),
    "3-d, two columns": (lambda: quax_sparse.BCOO.fromdense(T, nse=8), 2, 0),
    "batched, one column": (
        lambda: quax_sparse.BCOO.fromdense(T, nse=4, n_batch=1),
        1,
        0,
    ),
    "batched, one column more": (
        lambda: quax_sparse.BCOO.fromdense(T, nse=4, n_batch=1),
        None,
        1,
    ),
    "blocks, one column": (
        lambda: quax_sparse.BCOO.fromdense(H, nse=4, n_dense=1),
        1,
        0,
    ),
}


def _assert_columns_refused(n_sparse: int, got: int, f, *args) -> None:
    with pytest.raises(ValueError) as info:
        f(*args)
    message = str(info.value)
    assert "`BCOO` whose fields break its own checks" in message
    assert f"built with n_sparse={n_sparse} sparse dimensions" in message
    assert f"whose {got} columns" in message
    assert "constructor" in message and "eqx.tree_at" in message


@pytest.mark.parametrize("case", COLUMNS, ids=list(COLUMNS))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_indices_with_other_columns_are_refused(case, jit) -> None:
    make, keep, extra = COLUMNS[case]
    n_sparse = make().n_sparse
    bad = _columns(make, keep, extra)
    got = bad.indices.shape[-1]
    for program in (lambda v: v.todense(), jnp.sum, lambda v: (v * 2.0).todense()):
        f = quax.quaxify(program)
        f = jax.jit(f) if jit else f
        _assert_columns_refused(n_sparse, got, f, bad)


@pytest.mark.parametrize(
    "case",
    ["batched, one column", "batched, one column more"],
    ids=["fewer", "more"],
)
def test_indices_with_other_columns_are_refused_under_vmap(case) -> None:
    make, keep, extra = COLUMNS[case]
    bad = _columns(make, keep, extra)
    got = bad.indices.shape[-1]
    program = lambda v: v @ X
    # `jax.vmap` outside quaxify: each example is a view whose `_shape` still has
    # the batch axis; and inside it.
    for f in (
        jax.vmap(quax.quaxify(program)),
        quax.quaxify(jax.vmap(program)),
        jax.jit(jax.vmap(quax.quaxify(program))),
    ):
        _assert_columns_refused(2, got, f, bad)


def test_every_route_keeps_its_columns() -> None:
    # The constructor, `fromdense` (batch axes, blocks), a `jax.vmap`-built batch,
    # and the outputs of rules all record the columns their indices have, and pass.
    vmapped = jax.vmap(lambda m: quax_sparse.BCOO.fromdense(m, nse=4))(T)
    assert vmapped.n_sparse == 2 and vmapped._shape == (3, 4)
    cases = {
        "constructor": (
            quax_sparse.BCOO(
                jnp.array([1.0, 2.0]), jnp.array([[0, 1], [2, 3]]), (3, 4)
            ),
            np.array([[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 2]], np.float32),
        ),
        "fromdense": (_bcoo(), M),
        "batched": (quax_sparse.BCOO.fromdense(T, nse=4, n_batch=1), T),
        "vmap-built": (vmapped, T),
        "blocks": (quax_sparse.BCOO.fromdense(H, nse=4, n_dense=1), H),
        "3-d": (quax_sparse.BCOO.fromdense(T, nse=8), T),
    }
    for name, (value, dense) in cases.items():
        assert value.n_sparse == value.indices.shape[-1], name
        out = jax.jit(quax.quaxify(lambda v: (v * 2.0 + v).todense()))(value)
        np.testing.assert_allclose(out, 3 * dense, rtol=1e-6, err_msg=name)
        # A rule's output, boxed again by an outer quaxify.
        inner = quax.quaxify(lambda v: jnp.sin(v))(value)
        assert isinstance(inner, quax_sparse.BCOO), name
        assert inner.n_sparse == value.n_sparse, name
        out = quax.quaxify(lambda v: v.todense())(inner)
        np.testing.assert_allclose(out, np.sin(dense), rtol=1e-6, err_msg=name)
    out = jax.vmap(quax.quaxify(lambda v: v.todense()))(vmapped)
    np.testing.assert_allclose(out, T)
    out = quax.quaxify(jax.vmap(lambda v: v @ X))(cases["batched"][0])
    np.testing.assert_allclose(out, T @ X, rtol=1e-6)
