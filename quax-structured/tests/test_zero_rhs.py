"""Solves with a symbolic-zero right-hand side (`quax.zero.Zero`): `jnp.linalg.solve`
and `solve_triangular` give a `Zero` of the right shape and dtype on every structure
with a solve, with nothing materialised; a `Zero` matrix refuses (singular)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy as jsp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from jax import lax
from quax.zero import Zero, ieee_strict


N = 4
K = jr.split(jr.key(5), 6)
DIAG = 2 + jr.uniform(K[0], (N,))
SQUARE = jr.normal(K[1], (N, N)) + 4 * jnp.eye(N)
SOLVERS = (
    qs.TridiagonalMatrix(jnp.ones(N - 1), 4 + DIAG, -jnp.ones(N - 1)),
    qs.Diagonal(DIAG),
    qs.ScaledIdentity(jnp.asarray(2.5), N),
    qs.LowerTriangular(SQUARE),
    qs.UpperTriangular(SQUARE),
    qs.Banded(jnp.ones((3, N)).at[1].add(DIAG), 1, 1),
    qs.BlockDiagonal(SQUARE.reshape(2, 2, 2, 2)[:, 0] + 3 * jnp.eye(2)),
    qs.Kronecker(jnp.eye(2) * 3 + 1, jnp.eye(2) * 2 + 0.5),
    qs.LowRankPlusDiagonal(DIAG, jr.normal(K[2], (N, 1))),
    qs.Circulant(jnp.array([5.0, 1.0, 0.0, 1.0])),
    qs.Toeplitz(jnp.array([5.0, 1.0, 0.5, 0.0]), jnp.array([5.0, 2.0, 0.0, 1.0])),
)


def _solves(*args):
    *matrices, b, bb = args
    return [
        [jnp.linalg.solve(x, b), jnp.linalg.solve(x, bb)]
        + [
            jsp.linalg.solve_triangular(x, b, lower=lower, trans=trans)
            for lower, trans in ((True, 0), (False, 1))
        ]
        for x in matrices
    ]


def test_zero_right_hand_side_gives_a_zero():
    zeros = Zero((N,), jnp.float32), Zero((N, 3), jnp.float32)
    with quax.track_materialisation() as report:
        got = jax.jit(quax.quaxify(_solves))(*SOLVERS, *zeros)
    assert not report, report
    # The dense solves' shapes and dtypes (their values: zeros, for nonsingular
    # matrices).
    dense = lambda *args: _solves(*quax.testing.densify(args))
    want = jax.eval_shape(dense, *SOLVERS, *zeros)
    assert jax.tree.structure(want) == jax.tree.structure(
        got, is_leaf=lambda x: isinstance(x, Zero)
    )
    for g, w in zip(
        jax.tree.leaves(got, is_leaf=lambda x: isinstance(x, Zero)),
        jax.tree.leaves(want),
        strict=True,
    ):
        assert isinstance(g, Zero) and (g.shape, g.dtype) == (w.shape, w.dtype)


def test_zero_right_hand_side_derivatives():
    # With respect to the matrix's leaves: zero, as the dense solve's.
    report = quax.testing.assert_matches_dense(
        jnp.linalg.solve,
        SOLVERS[0],
        Zero((N,), jnp.float32),
        eval=False,
        vmap=False,
        jvp=False,
        out_types=Zero,
    )
    assert report.checks["grad"] == "passed"


def test_batched_and_right_side():
    t = qs.TridiagonalMatrix(
        jnp.ones((2, N - 1)), 4 + jnp.ones((2, N)), jnp.ones((2, N - 1))
    )
    solve = quax.quaxify(jax.vmap(jnp.linalg.solve))
    out = solve(t, Zero((2, N), jnp.float32))
    assert isinstance(out, Zero) and out.shape == (2, N)
    # x op(A) = 0, A lower triangular, x of shape (3, N).
    solve_right = quax.quaxify(
        lambda a, b: lax.linalg.triangular_solve(a, b, left_side=False, lower=True)
    )
    out = solve_right(SOLVERS[3], Zero((3, N), jnp.float32))
    assert isinstance(out, Zero) and (out.shape, out.dtype) == ((3, N), jnp.float32)


def test_ieee_strict_solves_the_zero_as_an_array():
    # Inside ieee_strict a zero does not annihilate: a singular matrix gives nan,
    # as dense arithmetic does. (`lax.linalg.triangular_solve` directly: no inner
    # jit, whose traced body would be reused outside the strict block.)
    singular = jnp.ones((N, N)).at[1, 1].set(0.0)
    solve = quax.quaxify(
        lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=True)
    )
    b = Zero((N, 1), jnp.float32)
    with ieee_strict():
        got = solve(qs.LowerTriangular(singular), b)
        dense = lax.linalg.triangular_solve(
            jnp.tril(singular), jnp.zeros((N, 1)), left_side=True, lower=True
        )
        fine = solve(SOLVERS[3], b)
    assert not isinstance(got, Zero)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(dense))
    assert np.isnan(got).any()
    np.testing.assert_array_equal(fine, np.zeros((N, 1)))
    assert isinstance(solve(SOLVERS[3], b), Zero)


def test_zero_matrix_refuses():
    solve = quax.quaxify(lambda a, b: jsp.linalg.solve_triangular(a, b, lower=True))
    with pytest.raises(ValueError, match=r"`Zero` matrix .*singular"):
        solve(Zero((N, N), jnp.float32), SOLVERS[0])
