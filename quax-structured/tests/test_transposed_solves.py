"""Transposed solves on non-symmetric matrices of every structure with a
factorisation: `jax.scipy.linalg.lu_solve(lu_factor(M), b, trans=1)` (and
`trans=2`), and `jax.grad` of `jnp.linalg.solve(M, b)` (whose reverse pass
solves with `Mᵀ`), against plain JAX on the dense matrix. A symmetric matrix
would hide a transpose that is missing or applied twice; every matrix here has
`M != Mᵀ`."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_structured as qs


# Every test of this module runs in float64 (`x64`, in conftest.py).
pytestmark = pytest.mark.usefixtures("x64")


N = 6


def _rand(seed: int, *shape: int) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)


def _structures():
    """One well-conditioned matrix of each type that factors, non-symmetric
    (but the diagonal one)."""
    eye = jnp.eye(3)
    bands = _rand(4, 4, N).at[1].add(6.0)
    return [
        qs.TridiagonalMatrix(_rand(0, N - 1), 4 + _rand(1, N), _rand(2, N - 1) + 1),
        qs.Diagonal(2 + _rand(3, N)),
        qs.LowerTriangular(_rand(5, N, N) + 4 * jnp.eye(N)),
        qs.UpperTriangular(_rand(6, N, N) + 4 * jnp.eye(N)),
        qs.LowRankPlusDiagonal(
            3 + jnp.abs(_rand(7, N)), _rand(8, N, 2), _rand(9, N, 2)
        ),
        qs.Kronecker(_rand(10, 2, 2) + 3 * jnp.eye(2), _rand(11, 3, 3) + 3 * eye),
        qs.Banded(bands, 1, 2),
        qs.BlockDiagonal(_rand(12, 3, 2, 2) + 3 * jnp.eye(2)),
        # Diagonally dominant: regular.
        qs.Circulant(jnp.array([6.0, 1.0, -2.0, 0.5, 0.3, 1.5])),
        qs.Toeplitz(
            jnp.array([5.0, 1.0, -2.0, 0.5, 0.0, 1.5]),
            jnp.array([5.0, -1.0, 0.3, 2.0, 1.0, -0.5]),
        ),
    ]


# The module's matrices, built in float64.
with jax.enable_x64(True):
    STRUCTURES = _structures()
    IDS = [type(m).__name__ for m in STRUCTURES]


def _dense(m):
    return m.enable_materialise().dense()


def test_matrices_are_not_symmetric():
    for m in STRUCTURES:
        if isinstance(m, qs.Diagonal):
            continue
        d = np.asarray(_dense(m))
        assert not np.allclose(d, d.T), type(m).__name__


@pytest.mark.parametrize("m", STRUCTURES, ids=IDS)
@pytest.mark.parametrize("trans", [0, 1, 2])
def test_lu_solve_trans_matches_dense(m, trans):
    b = _rand(20, N, 2)

    def solve(m, b):
        return jsl.lu_solve(jsl.lu_factor(m), b, trans=trans)

    got = jax.jit(quax.quaxify(solve))(m, b)
    d = _dense(m)
    want = jnp.linalg.solve(d if trans == 0 else d.T, b)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("m", STRUCTURES, ids=IDS)
def test_grad_of_solve_matches_dense(m):
    """The gradient with respect to the right-hand side (`M⁻ᵀ w`) and to every
    float leaf of the structure, against `jax.grad` through the dense matrix."""
    b, w = _rand(21, N), _rand(22, N)

    def loss(m, b):
        return jnp.dot(jnp.linalg.solve(m, b), w)

    got_m, got_b = jax.jit(jax.grad(quax.quaxify(loss), argnums=(0, 1)))(m, b)
    want_m, want_b = jax.grad(lambda m, b: loss(_dense(m), b), argnums=(0, 1))(m, b)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got_b, jnp.linalg.solve(_dense(m).T, w), rtol=1e-9)
    for g, e in zip(jax.tree.leaves(got_m), jax.tree.leaves(want_m), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-8, atol=1e-10)
