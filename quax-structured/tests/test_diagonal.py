"""`Diagonal @ X` and `X @ Diagonal` keep `X`'s structure (rows or columns scaled)
for tridiagonal, banded, triangular, block-diagonal and low-rank matrices, with
batch axes and gradients; the others (Kronecker, circulant) stay a lazy
`Product`. Against the dense computation (the kit) and literals."""

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax.testing
import quax_structured as qs


N, BATCH = 4, 2
K = jr.split(jr.key(3), 8)


def _batched():
    """One matrix of each batchable structure, with a batch axis of `BATCH`."""
    full = jr.normal(K[0], (BATCH, N, N))
    return (
        qs.Diagonal(1 + jr.uniform(K[1], (BATCH, N))),
        qs.TridiagonalMatrix(
            jr.normal(K[2], (BATCH, N - 1)),
            jr.normal(K[3], (BATCH, N)),
            jr.normal(K[4], (BATCH, N - 1)),
        ),
        qs.Banded(jr.normal(K[5], (BATCH, 4, N)), 1, 2),
        qs.LowerTriangular(full),
        qs.UpperTriangular(full),
        qs.BlockDiagonal(jr.normal(K[6], (BATCH, 2, 2, 2))),
    )


def _both_sides(d, *xs):
    return [p for x in xs for p in (d @ x, x @ d)]


def test_batched_structures_keep_their_structure():
    d, *xs = _batched()
    types: list[type | tuple[type, ...]] = [t for x in xs for t in (type(x), type(x))]
    # The batch axes are the matrices' own (the kit's vmap would add another).
    report = quax.testing.assert_matches_dense(
        _both_sides, d, *xs, eval=False, vmap=False, jvp=False, out_types=types
    )
    assert report.checks == {
        "eval": "skipped: eval=False",
        **dict.fromkeys(("jit", "grad"), "passed"),
    }


def test_low_rank_scales_a_factor():
    d = qs.Diagonal(jnp.arange(1.0, N + 1))
    u, v = jr.normal(K[0], (N, 2)), jr.normal(K[1], (N, 2))
    xs = (qs.LowRank(u), qs.LowRank(u, v), qs.LowRankPlusDiagonal(d.diag, u, v))
    types: list[type | tuple[type, ...]] = [t for x in xs for t in (type(x), type(x))]
    quax.testing.assert_matches_dense(
        _both_sides, d, *xs, eval=False, vmap=False, jvp=False, out_types=types
    )
    # The symmetric `LowRank(u)` scaled on one side is no longer symmetric.
    scaled = quax.quaxify(lambda d, x: d @ x)(d, xs[0])
    assert isinstance(scaled, qs.LowRank) and not scaled.symmetric


def test_literals():
    d = qs.Diagonal(jnp.array([1.0, 2.0, 3.0]))
    lower = qs.LowerTriangular(jnp.arange(1.0, 10.0).reshape(3, 3))
    low_rank = qs.LowRankPlusDiagonal(jnp.ones(3), jnp.array([[1.0], [0.0], [2.0]]))
    left, right, scaled = quax.quaxify(lambda d, a, b: (d @ a, a @ d, b @ d))(
        d, lower, low_rank
    )
    assert isinstance(left, qs.LowerTriangular)
    dense = lambda x: np.asarray(x.enable_materialise().materialise())
    np.testing.assert_array_equal(dense(left), [[1, 0, 0], [8, 10, 0], [21, 24, 27]])
    np.testing.assert_array_equal(dense(right), [[1, 0, 0], [4, 10, 0], [7, 16, 27]])
    # diag(1, 1, 1) + u uᵀ with u = (1, 0, 2), times diag(1, 2, 3).
    np.testing.assert_array_equal(dense(scaled), [[2, 0, 6], [0, 2, 0], [2, 0, 15]])


def test_without_a_closed_form_a_lazy_product():
    d = qs.Diagonal(jnp.arange(1.0, N + 1))
    kron = qs.Kronecker(jnp.eye(2) + 1, jnp.array([[2.0, 1.0], [0.0, 1.0]]))
    circulant = qs.Circulant(jnp.arange(1.0, N + 1))
    quax.testing.assert_matches_dense(
        _both_sides,
        d,
        kron,
        circulant,
        eval=False,
        vmap=False,
        grad=False,
        jvp=False,
        out_types=qs.Product,
    )


def test_no_dense_array_in_the_compiled_program():
    n = 64
    d = qs.Diagonal(jnp.arange(1.0, n + 1))
    t = qs.TridiagonalMatrix(jnp.ones(n - 1), jnp.arange(n * 1.0), jnp.ones(n - 1))
    low_rank = qs.LowRank(jnp.ones((n, 2)))
    fn = lambda d, t, r, b: ((d @ t) @ b, (t @ d) @ b, (d @ r @ d) @ b)
    quax.testing.assert_hlo_lacks(fn, d, t, low_rank, jnp.ones(n), shapes=[(n, n)])
