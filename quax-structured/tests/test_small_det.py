"""`det`/`slogdet` of 1 x 1, 2 x 2 and 3 x 3 structured matrices, which JAX
computes from entries (`slice`, `squeeze`) rather than through `lu`: read through
the structure's entries, checked against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs


def _f4(*values):
    return np.array(values, np.float32)


CASES = {
    # 1 x 1: no off-diagonal entries (`det` and `lu_factor` indexed the empty
    # off-diagonals and raised an IndexError before).
    "tridiagonal_1": qs.TridiagonalMatrix(
        np.zeros(0, "f4"), _f4(-3), np.zeros(0, "f4")
    ),
    "tridiagonal_2": qs.TridiagonalMatrix(_f4(2), _f4(1, 3), _f4(-1)),
    "tridiagonal_3": qs.TridiagonalMatrix(_f4(1, 2), _f4(2, 3, 1), _f4(-1, 4)),
    # [[0, 1], [1, 0]]: a zero leading minor (det -1); `solve` pivots.
    "toeplitz_2": qs.Toeplitz(_f4(0, 1), _f4(0, 1)),
    "banded_3": qs.Banded(np.array([[2, 1, 0], [1, 0, 3], [4, 1, 0]], "f4"), 1, 1),
    "circulant_3": qs.Circulant(_f4(1, 2, -1)),
    "low_rank_plus_diagonal_2": qs.LowRankPlusDiagonal(
        _f4(1, 2), np.array([[1, 2]], "f4").T
    ),
    "diagonal_3": qs.Diagonal(_f4(2, -1, 3)),
    "lower_triangular_2": qs.LowerTriangular(np.array([[2, 0], [5, -3]], "f4")),
}


def _dense(matrix):
    return np.asarray(matrix.enable_materialise().materialise(), np.float64)


def _det_slogdet_solve(m, b):
    return jnp.linalg.det(m), *jnp.linalg.slogdet(m), jnp.linalg.solve(m, b)


@pytest.mark.parametrize("name", CASES)
def test_small_det_slogdet_solve(name):
    matrix = CASES[name]
    dense = _dense(matrix)
    b = np.arange(1, dense.shape[-1] + 1, dtype=np.float32)
    det, sign, logdet, x = jax.jit(quax.quaxify(_det_slogdet_solve))(matrix, b)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    np.testing.assert_allclose(det, np.linalg.det(dense), rtol=1e-5, atol=1e-6)
    assert sign == want_sign
    np.testing.assert_allclose(logdet, want_logdet, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x, np.linalg.solve(dense, b), rtol=1e-5, atol=1e-5)


def test_small_det_batched_and_1x1():
    """A batch of 2 x 2 matrices (the slice keeps the batch axis), and `slogdet` of
    a 1 x 1 matrix (a `squeeze`)."""
    stack = qs.TridiagonalMatrix(
        _f4(2, 1)[:, None], _f4(1, 3, 0, 5).reshape(2, 2), _f4(-1, 4)[:, None]
    )
    fn = jax.jit(quax.quaxify(lambda m, d: (jnp.linalg.det(m), *jnp.linalg.slogdet(d))))
    det, sign, logdet = fn(stack, qs.Diagonal(_f4(-0.5)))
    np.testing.assert_allclose(det, np.linalg.det(_dense(stack)), rtol=1e-6)
    assert sign == -1
    np.testing.assert_allclose(logdet, np.log(0.5), rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_one_by_one_tridiagonal(jit):
    """Everything that reads a 1 x 1 tridiagonal matrix's entries or its LU: its
    entry, its diagonal, `det`/`slogdet`, and `lu_factor` (whose pivots had length
    0) with `lu_solve`, eagerly and under `jit`."""
    matrix = CASES["tridiagonal_1"]
    b = _f4(6)

    def fn(m, b):
        lu = jax.scipy.linalg.lu_factor(m)
        return (
            m[0, 0],
            jnp.diagonal(m),
            *_det_slogdet_solve(m, b),
            lu[1],
            (jax.scipy.linalg.lu_solve(lu, b)),
        )

    run = quax.quaxify(fn)
    entry, diagonal, det, sign, logdet, x, pivots, y = (jax.jit(run) if jit else run)(
        matrix, b
    )
    np.testing.assert_array_equal(entry, -3)
    np.testing.assert_array_equal(diagonal, [-3])
    np.testing.assert_array_equal(det, -3)
    assert sign == -1
    np.testing.assert_allclose(logdet, np.log(3), rtol=1e-6)
    np.testing.assert_array_equal(x, [-2])
    np.testing.assert_array_equal(pivots, [0])
    np.testing.assert_array_equal(y, [-2])


def test_small_det_gradient():
    """`jax.grad` of the 2 x 2 and 3 x 3 `det` with respect to the leaves: the
    cofactors, pulled back through the structure's dense form."""
    for matrix in (CASES["toeplitz_2"], CASES["tridiagonal_3"]):
        got = jax.jit(jax.grad(quax.quaxify(jnp.linalg.det)))(matrix)
        dense = _dense(matrix)
        cofactors = np.linalg.det(dense) * np.linalg.inv(dense).T
        want = jax.vjp(lambda m: m.enable_materialise().materialise(), matrix)[1](
            jnp.asarray(cofactors, jnp.float32)
        )[0]
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_large_slice_still_refused():
    """A slice holding more than `n` entries per matrix keeps the refusal."""
    matrix = CASES["tridiagonal_3"]
    with pytest.raises(
        qs.StructuredMaterialisationError, match=r"Refusing to materialise.*`slice`"
    ):
        quax.quaxify(lambda m: m[:2, :2])(matrix)
