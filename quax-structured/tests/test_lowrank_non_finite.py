"""Products of `LowRank` and `LowRankPlusDiagonal` whose factors or diagonal hold
an infinite or NaN entry: the infinite and NaN entries where dense JAX puts them
(the factored `U (Vᵀ x)` meets `inf * 0` and `inf - inf` other than where the
dense sum does), and, for finite factors times an `x` holding one, NaN wherever
dense JAX gives NaN. The branch that computes the dense rows is decided by the
matrix alone, so the product stays linear in `x` (`jax.linear_transpose`) and
its compiled program holds no `(n, n)` array."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


INF, NAN = jnp.inf, jnp.nan
V = jnp.linspace(-1.0, 2.0, 4)


def _matrices() -> dict[str, qs.StructuredMatrix]:
    """Each holds an infinite or NaN entry where the factored product and the
    dense one part ways (the first is the case hypothesis found: `U Uᵀ V` gave
    `[nan, nan, nan, inf]`, dense JAX `[nan, nan, nan, nan]`)."""
    u = jnp.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, INF]])
    cancelling = jnp.array([[1.0, -1.0], [2.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    return {
        "symmetric, inf in u": qs.LowRank(u),
        "inf in v": qs.LowRank(cancelling, jnp.ones((4, 2)).at[2, 0].set(-INF)),
        "nan in u": qs.LowRank(cancelling.at[1, 1].set(NAN), jnp.ones((4, 2))),
        "plus diagonal, inf in u": qs.LowRankPlusDiagonal(
            jnp.array([1.0, 0.0, 2.0, 3.0]), cancelling.at[0, 0].set(INF)
        ),
        "plus diagonal, inf in diag": qs.LowRankPlusDiagonal(
            jnp.array([1.0, -INF, 2.0, 3.0]), cancelling
        ),
    }


MATRICES = _matrices()


def _dense(m: qs.StructuredMatrix) -> jax.Array:
    return m.enable_materialise().dense()


def _products(m, x):
    """`M @ x`, `x @ M`, `M.T @ x` and the row and column sums."""
    return m @ x, x @ m, m.T @ x, jnp.sum(m, axis=0), jnp.sum(m, axis=1)


_structured = jax.jit(quax.quaxify(_products))
_reference = jax.jit(_products)


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_non_finite_entries_of_the_matrix_land_where_dense_puts_them(name):
    m = MATRICES[name]
    for structured in (quax.quaxify(_products), _structured):
        got = structured(m, V)
        want = _reference(_dense(m), V)
        for g, w in zip(got, want, strict=True):
            # NaN against NaN and inf against inf of the same sign are equal here.
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_the_hypothesis_case_by_hand():
    """`U Uᵀ` with `U = [[0, 0], [0, 0], [0, 0], [0, inf]]` holds `0 * inf = nan`
    off the diagonal of its last row and column, so every row of `U Uᵀ V` meets
    a NaN."""
    got = jax.jit(quax.quaxify(lambda m: m @ V))(MATRICES["symmetric, inf in u"])
    assert np.all(np.isnan(np.asarray(got)))


def test_a_batch_mixing_finite_and_non_finite_matrices():
    """Under `vmap` the branch is decided once for the batch; each matrix still
    gets its own dense answer, the finite one its plain product."""
    u = jnp.stack(
        [jnp.arange(8.0).reshape(4, 2) / 4, jnp.zeros((4, 2)).at[3, 1].set(INF)]
    )
    got = jax.jit(jax.vmap(lambda u: quax.quaxify(lambda m: m @ V)(qs.LowRank(u))))(u)
    want = jax.vmap(lambda u: (u @ u.T) @ V)(u)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


X_NON_FINITE = [
    jnp.array([INF, 0.0, 1.0, 2.0]),
    jnp.array([INF, -INF, 1.0, 0.0]),
    jnp.array([NAN, 1.0, 1.0, 1.0]),
    jnp.array([1.0, INF, INF, -2.0]),
]


@pytest.mark.parametrize("x", X_NON_FINITE, ids=range(len(X_NON_FINITE)))
def test_finite_factors_times_a_non_finite_vector_are_nan_wherever_dense_is(x):
    """The factored product (the matrix is finite, so the fast branch runs):
    NaN wherever dense JAX gives NaN, equal to it wherever it is not NaN
    itself (it may be NaN where dense JAX gives `±inf`, see `matmat`)."""
    cancelling = jnp.array([[1.0, -1.0], [2.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    matrices = [
        qs.LowRank(cancelling, jnp.array([[1.0, 1.0], [1.0, 0.0], [-1, 2], [3, 1]])),
        qs.LowRank(cancelling),
        qs.LowRankPlusDiagonal(jnp.array([0.0, 1.0, -3.0, 2.0]), cancelling),
    ]
    for m in matrices:
        got = np.asarray(jax.jit(quax.quaxify(lambda m, x: m @ x))(m, x))
        want = np.asarray(_dense(m) @ x)
        assert np.all(np.isnan(got[np.isnan(want)])), (got, want)
        mine = ~np.isnan(got)
        np.testing.assert_allclose(got[mine], want[mine], rtol=1e-6)


def test_the_product_stays_linear_in_x():
    """`jax.linear_transpose` of `M @ x` (what `lax.custom_linear_solve` does to
    its `matvec`, e.g. in `jax.scipy.sparse.linalg.gmres`) matches the dense
    transpose: the branch's predicate does not depend on `x`."""
    u = jnp.array([[1.0, -1.0], [2.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    v = jnp.array([[1.0, 1.0], [1.0, 0.0], [-1.0, 2.0], [3.0, 1.0]])
    for m in (qs.LowRank(u, v), qs.LowRankPlusDiagonal(jnp.arange(1.0, 5.0), u, v)):
        product = lambda x, m=m: quax.quaxify(lambda m, x: m @ x)(m, x)
        (got,) = jax.linear_transpose(product, V)(V)
        np.testing.assert_allclose(got, _dense(m).T @ V, rtol=1e-6)
        if isinstance(m, qs.LowRankPlusDiagonal):
            # Through a solver that transposes its `matvec` (`LowRank` is singular).
            b = _dense(m) @ V
            solved, _ = jax.scipy.sparse.linalg.gmres(product, b, tol=1e-7)
            np.testing.assert_allclose(solved, V, rtol=1e-4, atol=1e-4)


def test_the_compiled_product_holds_no_n_by_n_array():
    n = 64
    u = jnp.arange(n * 3.0).reshape(n, 3) / n
    m = qs.LowRankPlusDiagonal(jnp.ones(n), u, u[::-1])
    hlo = quax.testing.compiled_hlo(lambda m, x: m @ x, m, jnp.ones(n))
    assert re.search(rf"\[{n},{n}\]", hlo) is None
