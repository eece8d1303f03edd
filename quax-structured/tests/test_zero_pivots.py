"""`det`/`slogdet` of the structures factored without pivoting (`Banded`,
`Toeplitz`, `LowRankPlusDiagonal`) where a pivot is exactly zero: NaN where a
pivot other than the last is (a zero leading minor: the pivots are not the
determinant, which may be nonzero), 0 / `-inf` where only the last is (singular),
numpy's values elsewhere. One compiled program per structure (the cases stacked,
under `vmap`)."""

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


# Each structure: a regular matrix with a zero leading minor (NaN), a matrix whose
# only zero pivot is the last (singular: 0 / -inf, or `None` where the structure
# has no such exact case), and a regular matrix without zero pivots (numpy's).
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
    # The zero leading minor: regular, yet no silent 0 / -inf.
    assert abs(want_det[0]) >= 1
    assert np.isnan(det[0]) and np.isnan(logdet[0])
    # The rest: numpy's values (the singular one exactly 0 / -inf).
    np.testing.assert_allclose(det[1:], want_det[1:], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(sign[1:], want_sign[1:])
    np.testing.assert_allclose(logdet[1:], want_logdet[1:], rtol=1e-5)
    if CASES[name][1] is not None:
        assert det[1] == 0 and sign[1] == 0 and logdet[1] == -np.inf


@pytest.mark.parametrize("name", CASES)
def test_det_gradient_at_zero_leading_minor(name):
    """At a regular matrix with a zero leading minor, `det`'s derivative is NaN
    (the factors cannot give it), not a silent zero."""
    matrix = CASES[name][0]
    got = jax.jit(jax.grad(quax.quaxify(jnp.linalg.det)))(matrix)
    leaves = [g for g in jax.tree.leaves(got) if jnp.issubdtype(g.dtype, jnp.inexact)]
    assert leaves and all(np.isnan(g).any() for g in leaves)
