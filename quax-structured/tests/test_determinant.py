"""The derivatives of `jnp.linalg.slogdet` and `det` at the structure's cost (the
structure's own algorithm, through `quax.Value.custom_jvp_rule`): no `(n, n)`
array in the compiled gradient, values against dense JAX (plain `jnp` on the
same leaves), and the tridiagonal continuant's derivative where the Thomas
pivots are not finite."""

import jax
import jax.numpy as jnp
import jax.scipy as jsp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


N = 512
_rng = np.random.default_rng(3)


def _normal(*shape, scale=1.0):
    return (scale * _rng.normal(size=shape)).astype(np.float32)


def _loss(m):
    """`log |det m| + det m`: both custom-JVP functions in one program."""
    return jnp.linalg.slogdet(m)[1] + jnp.linalg.det(m)


# name: (structure from leaves, leaves) at n = 512, each O(n) to O(n log n) (or
# O(n r), O(n b²)) in its primal.
STRUCTURES = {
    "tridiagonal": (
        qs.TridiagonalMatrix,
        (_normal(N - 1, scale=0.1), 1 + _normal(N, scale=0.01), _normal(N - 1)),
    ),
    "diagonal": (qs.Diagonal, (1 + _normal(N, scale=0.01),)),
    "scaled_identity": (lambda s: qs.ScaledIdentity(s, N), (np.float32(1.001),)),
    "banded": (
        lambda b: qs.Banded(b, 2, 1),
        (_normal(4, N, scale=0.1) + np.array([0, 0, 1, 0], "f4")[:, None],),
    ),
    "block_diagonal": (
        qs.BlockDiagonal,
        (_normal(N // 4, 4, 4, scale=0.1) + np.eye(4, dtype=np.float32),),
    ),
    "kronecker": (
        qs.Kronecker,
        (
            _normal(16, 16, scale=0.05) + np.eye(16, dtype=np.float32),
            _normal(32, 32, scale=0.05) + np.eye(32, dtype=np.float32),
        ),
    ),
    "low_rank_plus_diagonal": (
        qs.LowRankPlusDiagonal,
        (1 + _normal(N, scale=0.01), _normal(N, 3, scale=0.05)),
    ),
    "circulant": (
        qs.Circulant,
        (np.concatenate([[1.0], _normal(N - 1, scale=1e-3)]).astype(np.float32),),
    ),
}


@pytest.mark.parametrize("name", STRUCTURES)
def test_gradients_hold_no_dense_matrix(name):
    """`jax.grad` of `slogdet` and `det` with respect to the leaves compiles to a
    program without an `(n, n)` array (the custom rules' dense tangent)."""
    make, leaves = STRUCTURES[name]
    argnums = tuple(range(len(leaves)))
    grad = jax.grad(lambda *x: quax.quaxify(_loss)(make(*x)), argnums)
    quax.testing.assert_hlo_lacks(grad, *leaves, shapes=[(N, N)])


def test_tridiagonal_jvp_and_vjp_hold_no_dense_matrix():
    make, leaves = STRUCTURES["tridiagonal"]
    dets = quax.quaxify(lambda m: (jnp.linalg.det(m), *jnp.linalg.slogdet(m)))
    fn = lambda *x: dets(make(*x))

    def both(*x):
        _, tangents = jax.jvp(fn, x, x)
        _, pullback = jax.vjp(fn, *x)
        return tangents, pullback((1.0, 0.0, 1.0))

    quax.testing.assert_hlo_lacks(both, *leaves, shapes=[(N, N)])


def _tri(lo, m, up):
    return jnp.diag(m) + jnp.diag(lo, -1) + jnp.diag(up, 1)


# Tridiagonal cases (lower, main, upper) at n = 6: regular, with zero leading
# minors (a zero main diagonal: Thomas pivots 0, inf, ...; `[1, 1, 1, ...]` with
# unit off-diagonals: 1, 0, inf, ...), and (next test) singular.
_ones = np.ones(5, np.float32)
_TRIDIAGONAL = {
    "regular": (_normal(5, scale=0.3), 2 + _normal(6, scale=0.3), _normal(5)),
    "zero_main": (_ones, np.zeros(6, np.float32), -_ones),
    "zero_second_minor": (_ones, np.ones(6, np.float32), _ones),
}


@pytest.mark.parametrize("case", _TRIDIAGONAL)
def test_tridiagonal_gradients_match_dense(case):
    """Exact where the Thomas pivots are not (a zero leading minor), as dense
    JAX's pivoted LU is; one program for `det`, `slogdet`, `jvp` and `vjp`."""
    leaves = _TRIDIAGONAL[case]

    def derivatives(loss):
        def fn(*x):
            value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(*x)
            return value, grads, jax.jvp(loss, x, x)[1]

        return fn

    quaxified = quax.quaxify(_loss)
    got = jax.jit(derivatives(lambda *x: quaxified(qs.TridiagonalMatrix(*x))))(*leaves)
    want = jax.jit(derivatives(lambda *x: _loss(_tri(*x))))(*leaves)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_slogdet_derivative_at_singular_matrices_is_nan():
    """`log |det| = -inf` at a singular matrix: its derivative is NaN, as dense
    JAX's (`trace(solve(A, dA))`) is, in forward and reverse mode; `det`'s stays
    the cofactors (see `test_linalg_derivatives.py`)."""
    singular = (
        qs.TridiagonalMatrix(_ones[:3], np.array([2, 1.5, 2, 1], "f4"), _ones[:3]),
        qs.Diagonal(np.array([1, 0, 2, 3], "f4")),
        qs.BlockDiagonal(np.array([[[1, 2], [2, 4]], [[1, 0], [0, 1]]], "f4")),
    )
    logdet = quax.quaxify(lambda m: jnp.linalg.slogdet(m)[1])
    for m in singular:
        value, grad = jax.value_and_grad(logdet)(m)
        assert value == -np.inf
        assert all(np.isnan(g).all() for g in jax.tree.leaves(grad))
        assert np.isnan(jax.jvp(logdet, (m,), (m,))[1])


_a = _normal(3, 3) + 3 * np.eye(3, dtype="f4")
_b = _normal(2, 2) + np.eye(2, dtype="f4")
# (structure, dense matrix, leaves): the factors' and the blocks' own determinants.
_FACTORED = {
    "kronecker": (qs.Kronecker, jnp.kron, (_a, _b)),
    "block_diagonal": (
        qs.BlockDiagonal,
        lambda x: jsp.linalg.block_diag(*x),
        (_normal(2, 3, 3) + 3 * np.eye(3, dtype="f4"),),
    ),
}


@pytest.mark.parametrize("name", _FACTORED)
def test_factored_gradients_match_dense(name):
    """`Kronecker` and `BlockDiagonal` (`jnp.linalg.det` of each factor or
    block) against the dense program, one compiled program each."""
    make, dense, leaves = _FACTORED[name]
    argnums = tuple(range(len(leaves)))
    got = jax.jit(jax.grad(lambda *x: quax.quaxify(_loss)(make(*x)), argnums))
    want = jax.jit(jax.grad(lambda *x: _loss(dense(*x)), argnums))
    for g, w in zip(got(*leaves), want(*leaves), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
