"""`dot_general` against the dense computation: every layout, sparse on either side,
sparse x sparse, gradients, and the compiled program holding no dense matrix."""

import equinox as eqx
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing.strategies as qst
from hypothesis import given, settings
from jax import lax
from quax_sparse import BCOO, CSR, SparseMaterialisationError, fromdense
from sparse_helpers import assert_close, check, random_sparse


@settings(max_examples=12, deadline=None)
@given(
    layout=qst.dot_general_dimension_numbers(),
    sparse_left=st.booleans(),
    density=st.sampled_from([0.0, 0.3, 1.0]),
    n_batch=st.integers(0, 2),
    dtype=qst.dtypes(("float", "low", "complex")),
    seed=st.integers(0, 2**16),
)
def test_any_layout_against_dense(layout, sparse_left, density, n_batch, dtype, seed):
    l_shape, r_shape, dims = layout
    rng = np.random.default_rng(seed)
    s_shape = l_shape if sparse_left else r_shape
    n_batch = min(n_batch, len(s_shape))
    dense_s, s = random_sparse(rng, s_shape, density, n_batch=n_batch, dtype=dtype)
    d = rng.normal(size=r_shape if sparse_left else l_shape).astype(dtype)

    def f(a, b):
        return lax.dot_general(a, b, dims)

    if sparse_left:
        check(f, s, d, dense_args=(dense_s, d), eager=seed % 4 == 0)
    else:
        check(f, d, s, dense_args=(d, dense_s))


@settings(max_examples=6, deadline=None)
@given(
    n=st.integers(1, 6),
    k=st.integers(1, 6),
    m=st.integers(1, 6),
    densities=st.tuples(*[st.sampled_from([0.0, 0.3, 1.0])] * 2),
    transposes=st.tuples(st.booleans(), st.booleans()),
    seed=st.integers(0, 2**16),
)
def test_sparse_times_sparse_is_sparse(n, k, m, densities, transposes, seed):
    rng = np.random.default_rng(seed)
    a_shape = (k, n) if transposes[0] else (n, k)
    b_shape = (m, k) if transposes[1] else (k, m)
    da, a = random_sparse(rng, a_shape, densities[0], extra_nse=2)
    db, b = random_sparse(rng, b_shape, densities[1], extra_nse=2)

    def f(a, b):
        a = a.T if transposes[0] else a
        b = b.T if transposes[1] else b
        return a @ b

    out = check(f, a, b, dense_args=(da, db))
    assert isinstance(out, BCOO)


def test_sparse_times_sparse_static_bound_under_jit():
    rng = np.random.default_rng(0)
    da, a = random_sparse(rng, (5, 6), 0.4)
    db, b = random_sparse(rng, (6, 4), 0.4)
    eager = quax.quaxify(jnp.matmul)(a, b)
    jitted = jax.jit(quax.quaxify(jnp.matmul))(a, b)
    # Eagerly the exact number of products; under jit the worst case nse(a) * nse(b).
    assert eager.nse == int(((da != 0).astype(int) @ (db != 0).astype(int)).sum())
    assert jitted.nse == a.nse * b.nse
    assert_close(jitted, da @ db)
    assert_close(jitted.sum_duplicates(), da @ db)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((3, 1), (1, 5)), ((5, 1), (1, 3)), ((1, 4), (4, 1)), ((4, 2), (2, 1))],
    ids=["outer 3x5", "outer 5x3", "inner 4", "into one column"],
)
@pytest.mark.parametrize("a_unique", [False, True])
@pytest.mark.parametrize("b_unique", [False, True])
def test_sparse_times_sparse_with_traced_indices_keeps_every_product(
    a_shape, b_shape, a_unique, b_unique
):
    # Under `jit` with traced indices the output's `nse` is a static bound on the
    # number of products, lowered by the promises of unique indices: the outer
    # product `(n, 1) @ (1, m)` has `n * m` products (more than either nse times
    # the contracted size), and `(1, n) @ (n, 1)` has `n` of them at one position
    # (more than the output's size). A bound too small would drop products.
    rng = np.random.default_rng(sum(a_shape) + 10 * sum(b_shape))
    da = rng.normal(size=a_shape).astype(np.float32)  # every entry stored
    db = rng.normal(size=b_shape).astype(np.float32)
    a_idx = np.argwhere(np.ones(a_shape)).astype(np.int32)
    b_idx = np.argwhere(np.ones(b_shape)).astype(np.int32)

    @jax.jit
    def product(a_data, a_idx, b_data, b_idx):
        a = BCOO(a_data, a_idx, a_shape, unique_indices=a_unique)
        b = BCOO(b_data, b_idx, b_shape, unique_indices=b_unique)
        out = quax.quaxify(jnp.matmul)(a, b)
        return out, out.todense()

    args = (da.ravel(), a_idx, db.ravel(), b_idx)
    out, got = product(*args)
    want = da.astype(np.float64) @ db.astype(np.float64)  # independent of quax
    assert_close(got, want)
    products = a_shape[0] * a_shape[1] * b_shape[1]
    assert out.nse >= products


def test_sparse_times_sparse_exact_count_with_eager_compilation():
    # Compiled eagerly, the indices are traced: the count asks `quax.known_constant`,
    # so that each call counts its own products, as equation by equation.
    b = BCOO(jnp.ones(2), jnp.array([[0, 0], [0, 1]]), (2, 2))
    product = quax.quaxify(jnp.matmul)
    previous = quax.set_eager_compilation(True)
    try:
        for indices, count, want in (
            ([[0, 0], [1, 0]], 4, [[1.0, 1.0], [1.0, 1.0]]),
            ([[0, 0], [1, 1]], 2, [[1.0, 1.0], [0.0, 0.0]]),
        ):
            out = product(BCOO(jnp.ones(2), jnp.array(indices), (2, 2)), b)
            assert out.nse == count
            assert_close(out, np.array(want, np.float32))
    finally:
        quax.set_eager_compilation(previous)


def test_sparse_sparse_other_layouts_refuse():
    a = fromdense(np.eye(3), nse=3)
    with pytest.raises(SparseMaterialisationError, match="dot_general"):
        quax.quaxify(lambda a, b: jnp.einsum("ij,kl->ijkl", a, b))(a, a)
    out = quax.quaxify(lambda a, b: jnp.einsum("ij,kl->ijkl", a, b))(
        a.enable_materialise(), a.enable_materialise()
    )
    assert_close(out, np.einsum("ij,kl->ijkl", np.eye(3), np.eye(3)))


def test_csr_products():
    rng = np.random.default_rng(2)
    dense, x = random_sparse(rng, (6, 5), 0.4)
    c = CSR.from_bcoo(x)
    v = rng.normal(size=(5, 3)).astype(np.float32)
    check(lambda a, v: a @ v, c, v, dense_args=(dense, v), eager=True)
    check(lambda a, v: v.T @ a.T, c, v, dense_args=(dense, v))
    check(lambda a, b: a @ b.T, c, x, dense_args=(dense, dense))
    check(lambda a, b: a.T @ b, x, c, dense_args=(dense, dense))


def test_grad_wrt_data_has_the_pattern_and_matches_finite_differences():
    rng = np.random.default_rng(3)
    dense, x = random_sparse(rng, (8, 6), 0.3)
    v = rng.normal(size=6).astype(np.float32)

    def loss(a, v):
        return jnp.sum(jnp.tanh(a @ v) ** 2)

    g = eqx.filter_grad(quax.quaxify(loss))(x, v)
    assert isinstance(g, BCOO) and g.data.shape == x.data.shape
    # Central finite differences on each stored value.
    eps = 1e-2
    steps = eps * jnp.eye(x.nse)

    @jax.jit
    @jax.vmap
    def at(data):
        return quax.quaxify(loss)(BCOO(data, x.indices, x.shape), v)

    fd = (at(x.data + steps) - at(x.data - steps)) / (2 * eps)
    np.testing.assert_allclose(g.data, fd, rtol=2e-2, atol=2e-3)
    # ...and the dense gradient at the stored positions.
    gd = jax.grad(loss)(jnp.asarray(dense), v)
    rows, cols = np.asarray(x.indices[:-1]).T  # the last entry is padding
    np.testing.assert_allclose(g.data[:-1], gd[rows, cols], rtol=1e-5, atol=1e-6)
    # ...and with respect to the dense operand.
    gv = jax.grad(quax.quaxify(loss), argnums=1)(x, v)
    np.testing.assert_allclose(
        gv, jax.grad(loss, argnums=1)(dense, v), rtol=1e-5, atol=1e-6
    )


def test_vmap_over_right_hand_sides_and_batch_dimensions():
    rng = np.random.default_rng(4)
    dense, x = random_sparse(rng, (7, 5), 0.4)
    vs = rng.normal(size=(3, 5)).astype(np.float32)
    out = jax.vmap(quax.quaxify(lambda a, v: a @ v), in_axes=(None, 0))(x, vs)
    assert_close(out, vs @ dense.T)
    out = quax.quaxify(jax.vmap(lambda a, v: a @ v, in_axes=(None, 0)))(x, vs)
    assert_close(out, vs @ dense.T)
    dense_b, xb = random_sparse(rng, (3, 7, 5), 0.4, n_batch=1)
    out = jax.vmap(quax.quaxify(lambda a, v: a @ v))(xb, vs)
    assert_close(out, np.einsum("bij,bj->bi", dense_b, vs))
    out = quax.quaxify(lambda a, v: jnp.einsum("bij,bj->bi", a, v))(xb, vs)
    assert_close(out, np.einsum("bij,bj->bi", dense_b, vs))


def test_scan_and_while_loop_bodies():
    rng = np.random.default_rng(5)
    dense, x = random_sparse(rng, (6, 6), 0.4)
    dense = dense / 4
    x = BCOO(x.data / 4, x.indices, x.shape)
    v = rng.normal(size=6).astype(np.float32)

    def scanned(a, v):
        return lax.scan(lambda c, _: (a @ c, None), v, length=5)[0]

    def looped(a, v):
        return lax.fori_loop(0, 5, lambda i, c: jnp.tanh(a @ c), v)

    check(scanned, x, v, dense_args=(dense, v))
    check(looped, x, v, dense_args=(dense, v))


def test_compiled_matvec_holds_no_dense_matrix():
    n = 257  # a size no other array of the program has
    x = fromdense(np.eye(n, dtype=np.float32), nse=n)
    v = jnp.ones(n)
    hlo = jax.jit(quax.quaxify(lambda a, v: a @ v)).lower(x, v).compile().as_text()
    assert hlo is not None
    assert f"[{n},{n}]" not in hlo
    dense_hlo = jax.jit(lambda a, v: a @ v).lower(np.eye(n), v).compile().as_text()
    assert dense_hlo is not None
    assert f"[{n},{n}]" in dense_hlo  # the check can see a dense matrix


def test_grad_and_jvp_inside_quaxify():
    # The transposed products (cotangent @ a, a.T @ ...) go through the rules too.
    rng = np.random.default_rng(6)
    dense, x = random_sparse(rng, (6, 5), 0.4)
    v = rng.normal(size=5).astype(np.float32)

    def f(a, v):
        return jnp.sum(jnp.tanh(a @ v) ** 2) + jnp.sum(a.T @ (a @ v))

    check(jax.grad(f, argnums=1), x, v, dense_args=(dense, v))

    def directional(a, v):
        return jax.jvp(lambda v: f(a, v), (v,), (jnp.ones_like(v),))[1]

    check(directional, x, v, dense_args=(dense, v))
