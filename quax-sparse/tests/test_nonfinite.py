"""Non-finite numbers behave as in dense JAX: a NaN or an infinity in the stored
values reaches the result wherever the dense computation puts it (products, sums,
reductions, elementwise functions, Krylov solves), never a silent 0. The one
documented difference, shared with `jax.experimental.sparse` and scipy: a position
that is not stored is an exact zero, so a non-finite value that meets only unstored
positions (of a dense operand, or of the other factor of a sparse x sparse product)
stays out of the result."""

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as jspla
import numpy as np
import pytest
import quax
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO
from sparse_helpers import assert_close


# A 4 x 4 matrix whose stored values include NaN, +inf and -inf, and a position
# stored twice holding +inf and -inf (their sum is NaN).
ENTRIES = [
    ((0, 0), 2.0),
    ((0, 2), np.nan),
    ((1, 1), np.inf),
    ((2, 0), -1.0),
    ((2, 3), -np.inf),
    ((3, 3), np.inf),
    ((3, 3), -np.inf),
]


def _matrix() -> tuple[BCOO, np.ndarray]:
    """The `BCOO` of `ENTRIES` and its dense array, built independently in NumPy."""
    dense = np.zeros((4, 4), np.float32)
    with np.errstate(invalid="ignore"):  # inf + -inf
        for (i, j), value in ENTRIES:
            dense[i, j] += value
    coords = np.array([c for c, _ in ENTRIES], np.int32)
    data = np.array([v for _, v in ENTRIES], np.float32)
    return BCOO(data, coords, (4, 4)), dense


def test_dense_twin_holds_the_non_finite_values():
    a, dense = _matrix()
    assert np.isnan(dense[0, 2]) and np.isnan(dense[3, 3])
    np.testing.assert_array_equal(a.todense(), dense)


PROGRAMS = {
    "matvec": lambda a, v, y: a @ v,
    "vecmat": lambda a, v, y: v @ a,
    "matmat": lambda a, v, y: a @ y,
    "matvec_zero_vector": lambda a, v, y: a @ jnp.zeros_like(v),
    "sum": lambda a, v, y: a.sum(),
    "row_sums": lambda a, v, y: a.sum(axis=1),
    "column_sums": lambda a, v, y: a.sum(axis=0),
    "plus_dense": lambda a, v, y: a + y,
    "minus_dense": lambda a, v, y: y - a,
    "times_dense": lambda a, v, y: (a * y).sum(0),
    "divided_by_dense": lambda a, v, y: (a / y).sum(1),
    "elementwise": lambda a, v, y: (jnp.sin(a) + jnp.sqrt(jnp.abs(a))) @ v,
    "sparse_sum": lambda a, v, y: (a + a) @ v,
    "transpose": lambda a, v, y: a.T @ v,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_non_finite_values_reach_the_result_as_in_dense(name):
    fn = PROGRAMS[name]
    a, dense = _matrix()
    v = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    y = np.arange(1.0, 17.0, dtype=np.float32).reshape(4, 4)
    want = np.asarray(fn(jnp.asarray(dense), v, y))
    assert not np.all(np.isfinite(want))  # the case is non-trivial
    for got in (
        quax.quaxify(fn)(a, v, y),
        jax.jit(quax.quaxify(fn))(a, v, y),
    ):
        # NaN exactly where dense has NaN, +-inf where it has +-inf.
        assert_close(got, want)


def test_sparse_times_sparse_as_jax_experimental_sparse():
    # A NaN meeting a stored entry is NaN in the product; meeting an unstored zero
    # it is not (the documented difference), as in jax.experimental.sparse.
    a, _ = _matrix()
    product = jax.jit(quax.quaxify(lambda a, b: a @ b))(a, a).todense()
    j = jsparse.BCOO((a.data, a.indices), shape=a.shape)
    want = np.asarray((j @ j).todense())
    assert np.isnan(want[0, 0])  # a[0, 2] = nan times a[2, 0] = -1
    assert_close(product, want)


def _richardson(a, b):
    """A fixed number of Richardson iterations `x += (b - a x) / 4`: a solver whose
    dense run carries a NaN in `a` into `x`."""
    return jax.lax.fori_loop(0, 20, lambda _, x: x + (b - a @ x) / 4, jnp.zeros_like(b))


def _cg(a, b):
    """`jax.scipy.sparse.linalg.cg`, unmodified. (With a NaN in `a` its dense run
    stops at once, its residual test being false, and returns zeros; the sparse run
    must do the same.)"""
    return jspla.cg(lambda v: a @ v, b, maxiter=20)[0]


@pytest.mark.parametrize("solve", [_richardson, _cg])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_solves_with_a_non_finite_value_in_the_matrix(solve, bad):
    # A symmetric positive definite tridiagonal matrix with one stored value
    # replaced by NaN or inf: the sparse solve gives what the dense one gives.
    n = 8
    rows = np.concatenate([np.arange(n), np.arange(n - 1), np.arange(1, n)])
    cols = np.concatenate([np.arange(n), np.arange(1, n), np.arange(n - 1)])
    data = np.concatenate([np.full(n, 4.0), np.full(2 * (n - 1), -1.0)])
    data = data.astype(np.float32)
    data[3] = bad
    dense = np.zeros((n, n), np.float32)
    dense[rows, cols] = data
    a = BCOO(data, np.stack([rows, cols], -1).astype(np.int32), (n, n))
    b = np.linspace(1.0, 2.0, n, dtype=np.float32)
    want = np.asarray(jax.jit(solve)(jnp.asarray(dense), b))
    got = np.asarray(jax.jit(quax.quaxify(solve))(a, b))
    if solve is _richardson:
        assert np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert_close(got, want)


def test_unstored_positions_are_exact_zeros_as_in_jax_experimental_sparse():
    # The documented difference: `a @ v` with `v[j] = inf` is NaN in dense
    # arithmetic on every row (0 * inf), but only on the rows that store column `j`
    # here, as in jax.experimental.sparse and scipy.
    a = BCOO(np.array([1.0, 2.0], np.float32), np.array([[0, 0], [1, 0]]), (3, 2))
    v = np.array([1.0, np.inf], np.float32)
    got = quax.quaxify(lambda a, v: a @ v)(a, v)
    j = jsparse.BCOO((a.data, a.indices), shape=(3, 2))
    np.testing.assert_array_equal(got, j @ v)
    np.testing.assert_array_equal(got, [1.0, 2.0, 0.0])


def test_duplicates_meet_a_non_finite_dense_operand_once_each():
    # Documented (README, Limits): the products with a dense operand do not merge
    # duplicates, as in `jax.experimental.sparse`, so `2` and `-5` stored at (1, 1)
    # times `inf` give `inf - inf = nan` where the dense `-3 * inf` is `-inf`.
    # `sum_duplicates()` first gives dense JAX's answers.
    x = BCOO(jnp.array([2.0, -5.0, 1.0]), jnp.array([[1, 1], [1, 1], [0, 0]]), (2, 2))
    y = jnp.array([[3.0, 1.0], [1.0, np.inf]])
    v = jnp.array([1.0, np.inf])
    zero = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    dense = x.todense()
    for operand in (x, x.sum_duplicates()):
        merged = operand.unique_indices
        products = {
            "mul": (lambda a: a * y, dense * y),
            "div": (lambda a: a / zero, dense / zero),
            "matvec": (lambda a: a @ v, dense @ v),
        }
        for name, (f, want) in products.items():
            out = quax.quaxify(f)(operand)
            got = np.asarray(out.todense() if isinstance(out, BCOO) else out)
            got = got.reshape(-1)
            want = np.asarray(want).reshape(-1)
            # The duplicated position is the last element (row 1 of the matvec;
            # row 0 meets `inf` only where nothing is stored, an exact zero).
            assert np.isneginf(want[-1]), name
            if merged:
                assert np.isneginf(got[-1]), name
            else:
                assert np.isnan(got[-1]), name
