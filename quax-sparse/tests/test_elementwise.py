"""Day-one operations of `jax.experimental.sparse` users: sparse x sparse (the
intersection of the patterns), sparse + sparse (the union), `jnp.where(mask, a, 0)`
keeping the sparsity (a dense mask, or a sparse boolean one), and gathering rows
(`a[idx]`), against NumPy on the dense arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_sparse import BCOO, SparseMaterialisationError
from sparse_helpers import random_sparse


def _pair(seed: int = 0, shape: tuple[int, ...] = (5, 6)):
    rng = np.random.default_rng(seed)
    d1, a = random_sparse(rng, shape, 0.5)
    d2, b = random_sparse(rng, shape, 0.5)
    return d1, a, d2, b


@pytest.mark.parametrize("jit", [False, True])
def test_sparse_times_sparse_is_the_intersection(jit):
    d1, a, d2, b = _pair()
    f = quax.quaxify(lambda a, b: a * b)
    out = (jax.jit(f) if jit else f)(a, b)
    assert isinstance(out, BCOO) and out.unique_indices
    assert out.nse == min(a.nse, b.nse)  # the bound the README states
    np.testing.assert_array_equal(out.todense(), d1 * d2)


def test_intersection_with_duplicates_batches_and_bools():
    d1, a, d2, b = _pair(1, (2, 4, 5))
    # Each entry stored twice (halved): duplicates merge before multiplying.
    twice = BCOO(
        jnp.concatenate([a.data, a.data], -1) / 2,
        jnp.concatenate([a.indices, a.indices], -2),
        a.shape,
    )
    out = quax.quaxify(lambda a, b: a * b)(twice, b)
    np.testing.assert_allclose(out.todense(), d1 * d2, rtol=1e-6)
    m1, m2 = BCOO.fromdense(d1 != 0, nse=40), BCOO.fromdense(d2 != 0, nse=40)
    both = quax.quaxify(lambda x, y: x & y)(m1, m2)
    assert both.dtype == jnp.bool_
    np.testing.assert_array_equal(both.todense(), (d1 != 0) & (d2 != 0))


def test_intersection_gradients():
    d1, a, d2, b = _pair(2)

    def f(x, y):
        out = quax.quaxify(lambda a, b: a * b)(
            BCOO(x, a.indices, a.shape), BCOO(y, b.indices, b.shape)
        )
        return jnp.sum(out.todense() ** 2)

    gx, _ = jax.grad(f, argnums=(0, 1))(a.data, b.data)
    want_x = jax.grad(lambda x: jnp.sum((x * d2) ** 2))(jnp.asarray(d1))
    rows, cols = np.asarray(a.indices).T
    keep = rows < 5
    np.testing.assert_allclose(
        np.asarray(gx)[keep], np.asarray(want_x)[rows[keep], cols[keep]], rtol=1e-5
    )


def test_sparse_plus_sparse_is_the_union():
    d1, a, d2, b = _pair(3)
    out = jax.jit(quax.quaxify(lambda a, b: a - b))(a, b)
    assert out.nse == a.nse + b.nse  # the bound the README states
    np.testing.assert_allclose(out.todense(), d1 - d2, rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_where_keeps_the_sparsity(jit):
    d1, a, d2, _ = _pair(4)
    mask = d2 > 0
    nan = BCOO(a.data.at[0].set(jnp.nan), a.indices, a.shape)
    want_nan = np.asarray(nan.todense())
    for x, fn, want in [
        (a, lambda a, m: jnp.where(m, a, 0), np.where(mask, d1, 0)),
        (a, lambda a, m: jnp.where(m, 0.0, a), np.where(mask, 0, d1)),
        # A NaN the mask drops is dropped (a `where`, not a product).
        (nan, lambda a, m: jnp.where(m, a, 0), np.where(mask, want_nan, 0)),
    ]:
        f = quax.quaxify(fn)
        out = (jax.jit(f) if jit else f)(x, mask)
        assert isinstance(out, BCOO)
        np.testing.assert_array_equal(out.todense(), want)


def test_where_with_a_sparse_mask_picks_a_dense_array():
    d1, _, d2, _ = _pair(5)
    mask = BCOO.fromdense(d2 != 0, nse=25)
    out = jax.jit(quax.quaxify(lambda m, x: jnp.where(m, x, 0.0)))(mask, d1)
    assert isinstance(out, BCOO) and out.nse == mask.nse
    np.testing.assert_array_equal(out.todense(), np.where(d2 != 0, d1, 0))


def test_where_against_a_nonzero_is_refused():
    _, a, d2, _ = _pair(6)
    with pytest.raises(SparseMaterialisationError, match=r"`select_n`"):
        quax.quaxify(lambda a, m: jnp.where(m, a, 1.0))(a, d2 > 0)


@pytest.mark.parametrize("jit", [False, True])
def test_row_gather(jit):
    d1, a, _, _ = _pair(7, (6, 5))
    idx = np.array([4, 0, 0, 2, -1, 5])
    f = quax.quaxify(lambda a, i: a[i])
    out = (jax.jit(f) if jit else f)(a, idx)
    assert isinstance(out, BCOO) and out.shape == (6, 5)
    np.testing.assert_array_equal(out.todense(), d1[idx])
    per_row = np.count_nonzero(d1, axis=1)
    if not jit:  # the exact number of entries gathered
        assert out.nse == per_row[idx].sum()
    else:  # the bound: len(idx) * nse
        assert out.nse == len(idx) * a.nse
    g = jax.grad(
        lambda d: quax.quaxify(lambda a: a[idx].sum())(BCOO(d, a.indices, a.shape))
    )(a.data)
    rows = np.asarray(a.indices)[:, 0]
    counts = np.bincount(idx % 6, minlength=7)
    np.testing.assert_array_equal(g, counts[np.minimum(rows, 6)] * (rows < 6))
