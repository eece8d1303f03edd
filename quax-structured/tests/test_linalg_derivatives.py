"""Derivatives of `jnp.linalg.slogdet` and `det` (custom-JVP functions) with respect
to the leaves of each structure, against the dense program built independently
from the same leaves (plain `jnp`)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy as jsp
import numpy as np
import pytest
import quax
import quax_structured as qs


N = 6
_k = jr.split(jr.key(7), 6)
_m = jr.normal(_k[0], (N, N)) / 2 + 3 * jnp.eye(N)


def _banded_dense(bands, p=2, q=1):
    out = jnp.zeros((N, N))
    for d in range(-p, q + 1):
        row = bands[d + p]
        out = out + jnp.diag(row[: N - d] if d >= 0 else row[-d:], k=d)
    return out


def _sym(a):
    return (a + a.T) / 2


# name: (structure from leaves, dense matrix from the same leaves, leaves)
CASES = {
    "tridiagonal": (
        qs.TridiagonalMatrix,
        lambda lo, m, up: jnp.diag(m) + jnp.diag(lo, -1) + jnp.diag(up, 1),
        (0.5 * jnp.ones(N - 1), 3.0 + jnp.arange(N), -0.3 * jnp.ones(N - 1)),
    ),
    "diagonal": (qs.Diagonal, jnp.diag, (1.0 + jnp.arange(N) / 2,)),
    "lower": (qs.LowerTriangular, jnp.tril, (_m,)),
    "upper": (qs.UpperTriangular, jnp.triu, (_m,)),
    "banded": (
        lambda b: qs.Banded(b, 2, 1),
        _banded_dense,
        (jr.normal(_k[1], (4, N)) / 3 + jnp.array([0, 0, 3.0, 0])[:, None],),
    ),
    "block_diagonal": (
        qs.BlockDiagonal,
        lambda b: jsp.linalg.block_diag(*b),
        (jr.normal(_k[2], (3, 2, 2)) / 3 + 2 * jnp.eye(2),),
    ),
    "kronecker": (
        qs.Kronecker,
        jnp.kron,
        (_m[:2, :2], _m[2:5, 2:5]),
    ),
    "kronecker_symmetric": (
        lambda a, b: qs.Kronecker(a, b, symmetric=True),
        lambda a, b: jnp.kron(_sym(a), _sym(b)),
        (_m[:2, :2], _m[2:5, 2:5]),
    ),
    "low_rank_plus_diagonal": (
        qs.LowRankPlusDiagonal,
        lambda d, u, v: jnp.diag(d) + u @ v.T,
        (1.0 + jnp.arange(N) / 3, jr.normal(_k[3], (N, 2)) / 2, _m[:, :2] / 3),
    ),
    "low_rank_plus_diagonal_symmetric": (
        qs.LowRankPlusDiagonal,
        lambda d, u: jnp.diag(d) + u @ u.T,
        (1.0 + jnp.arange(N) / 3, jr.normal(_k[4], (N, 2)) / 2),
    ),
}


def _slogdet_and_det(a, scale):
    """`log|det a| + det(a) / scale`: both custom-JVP functions in one program."""
    return jnp.linalg.slogdet(a)[1] + jnp.linalg.det(a) / scale


@pytest.mark.parametrize("name", CASES)
def test_gradient_matches_dense(name):
    make, dense, leaves = CASES[name]
    scale = float(jnp.linalg.det(dense(*leaves)))
    argnums = tuple(range(len(leaves)))
    got_value, got = jax.jit(
        jax.value_and_grad(
            lambda *x: quax.quaxify(_slogdet_and_det)(make(*x), scale), argnums
        )
    )(*leaves)
    want_value, want = jax.value_and_grad(
        lambda *x: _slogdet_and_det(dense(*x), scale), argnums
    )(*leaves)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-4)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=1e-4 * np.abs(w).max())


@pytest.mark.parametrize(
    "m",
    [
        qs.LowRankPlusDiagonal(1 + jnp.arange(64.0) / 64, jr.normal(_k[5], (64, 3))),
        qs.Kronecker(_m + 8 * jnp.eye(N), _m.T[:4, :4] + jnp.eye(4), symmetric=True),
    ],
    ids=["low_rank_plus_diagonal", "kronecker"],
)
def test_slogdet_holds_no_dense_matrix(m):
    """The matrix enters `slogdet` (a custom-JVP function) structured."""
    n = m.shape[-1]
    quax.testing.assert_hlo_lacks(jnp.linalg.slogdet, m, shapes=[(n, n)])
