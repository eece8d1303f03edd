"""The compiled programs hold no dense `(n, n)` array."""

import jax.numpy as jnp
import jax.random as jr
import quax.testing
import quax_structured as qs


N = 300


def _tridiagonal():
    k = jr.split(jr.key(0), 4)
    lower, upper = jr.normal(k[0], (N - 1,)), jr.normal(k[1], (N - 1,))
    t = qs.TridiagonalMatrix(lower, 4 + jr.normal(k[2], (N,)), upper)
    return t, jr.normal(k[3], (N,))


def test_tridiagonal_solve_holds_no_dense_matrix():
    t, b = _tridiagonal()
    hlo = quax.testing.assert_hlo_lacks(jnp.linalg.solve, t, b, shapes=[(N, N)])
    assert "dot" not in quax.testing.hlo_ops(hlo)


def test_tridiagonal_products_and_slogdet_hold_no_dense_matrix():
    t, b = _tridiagonal()
    quax.testing.assert_hlo_lacks(
        lambda t, b: (t @ b, b @ t, jnp.linalg.slogdet(t)), t, b, shapes=[(N, N)]
    )


def test_low_rank_plus_diagonal_solve_holds_no_dense_matrix():
    k = jr.split(jr.key(1), 3)
    m = qs.LowRankPlusDiagonal(1 + jr.uniform(k[0], (N,)), jr.normal(k[1], (N, 4)))
    b = jr.normal(k[2], (N,))
    quax.testing.assert_hlo_lacks(jnp.linalg.solve, m, b, shapes=[(N, N)])


def test_kronecker_solve_holds_no_dense_matrix():
    k = jr.split(jr.key(2), 3)
    a, c = jr.normal(k[0], (15, 15)), jr.normal(k[1], (20, 20))
    m = qs.Kronecker(a + 15 * jnp.eye(15), c + 20 * jnp.eye(20))
    b = jr.normal(k[2], (N,))
    quax.testing.assert_hlo_lacks(jnp.linalg.solve, m, b, shapes=[(N, N)])
