"""`det`/`slogdet` of `Banded`, `Toeplitz` and `LowRankPlusDiagonal` where an LU
without pivoting meets an exactly zero pivot: their determinants come from
pivoted factorisations (or, for `LowRankPlusDiagonal`, the matrix determinant
lemma), so a zero leading minor of a regular matrix gives numpy's values (it gave
0 / `-inf`, then NaN, before), a singular matrix 0 / `-inf`. One compiled
program per structure (the cases stacked, under `vmap`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs


def _stack(*matrices):
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *matrices)


def _dense(matrix):
    return np.asarray(matrix.enable_materialise().materialise(), np.float64)


# Each structure: a regular matrix with a zero leading minor, a singular matrix
# (0 / -inf; `None` where the structure has no such exact case), and a regular
# matrix without zero pivots: numpy's values for all.
CASES = {
    "banded": (
        # [[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 2, 1], [0, 0, 0, 1]]: det -2.
        qs.Banded(np.array([[1, 1, 1, 0], [0, 0, 2, 1], [1, 1, 1, 0]], "f4"), 1, 1),
        qs.Banded(np.array([[0, 0, 0, 0], [2, 1, 3, 0], [1, 1, 1, 0]], "f4"), 1, 1),
        qs.Banded(np.array([[1, 1, 1, 0], [4, 4, 4, 4], [1, 1, 1, 0]], "f4"), 1, 1),
    ),
    "toeplitz": (
        # A zero diagonal, ones beside it: det 1.
        qs.Toeplitz(np.array([0, 1, 0, 0], "f4"), np.array([0, 1, 0, 0], "f4")),
        None,
        qs.Toeplitz(np.array([4, 1, 0.5, 0], "f4"), np.array([4, 2, 1, 0.5], "f4")),
    ),
    "low_rank_plus_diagonal": (
        # [[0, 1], [1, 2]] beside the identity: det -1.
        qs.LowRankPlusDiagonal(
            np.array([-1, 1, 1, 1], "f4"), np.array([[1, 1, 0, 0]], "f4").T
        ),
        qs.LowRankPlusDiagonal(
            np.array([1, 1, 1, -1], "f4"), np.array([[0, 0, 0, 1]], "f4").T
        ),
        qs.LowRankPlusDiagonal(
            np.array([2, 3, 2, 3], "f4"), np.array([[1, -1, 2, 0.5]], "f4").T
        ),
    ),
}


def _det_and_slogdet(m):
    return jnp.linalg.det(m), *jnp.linalg.slogdet(m)


@pytest.mark.parametrize("name", CASES)
def test_det_with_zero_pivots(name):
    cases = [m for m in CASES[name] if m is not None]
    det, sign, logdet = jax.jit(jax.vmap(quax.quaxify(_det_and_slogdet)))(
        _stack(*cases)
    )
    dense = np.stack([_dense(m) for m in cases])
    want_det = np.linalg.det(dense)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    # The zero leading minor: regular (no 0 / -inf), and numpy's values.
    assert abs(want_det[0]) >= 1
    np.testing.assert_allclose(det, want_det, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(sign, want_sign)
    np.testing.assert_allclose(logdet, want_logdet, rtol=1e-5, atol=1e-6)
    if CASES[name][1] is not None:
        assert det[1] == 0 and sign[1] == 0 and logdet[1] == -np.inf


@pytest.mark.parametrize("name", CASES)
def test_det_gradient_at_zero_leading_minor(name):
    """At a regular matrix with a zero leading minor, `det`'s derivative is the
    dense one (`Toeplitz`: its solver pivots), or NaN where it goes through
    factors without pivoting (`_determinant.py`), never a silent zero."""
    matrix = CASES[name][0]
    got = jax.jit(jax.grad(quax.quaxify(jnp.linalg.det)))(matrix)
    want = jax.grad(lambda m: jnp.linalg.det(m.enable_materialise().materialise()))(
        matrix
    )
    floats = lambda tree: [
        g for g in jax.tree.leaves(tree) if jnp.issubdtype(g.dtype, jnp.inexact)
    ]
    for g, w in zip(floats(got), floats(want), strict=True):
        if name == "toeplitz" or not np.isnan(g).any():
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
