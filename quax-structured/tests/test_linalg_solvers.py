"""`Circulant` and `Toeplitz` through unmodified `jnp.linalg.solve`, `slogdet` and
`det` (FFT and Levinson), against the dense matrices built independently."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


_k = jr.split(jr.key(11), 4)


def _circulant_dense(column):
    n = column.shape[-1]
    return jnp.stack([jnp.roll(column, j, axis=-1) for j in range(n)], axis=-1)


def _toeplitz_dense(column, row):
    n = column.shape[-1]
    rows = [
        jnp.concatenate([column[..., i::-1], row[..., 1 : n - i]], axis=-1)
        for i in range(n)
    ]
    return jnp.stack(rows, axis=-2)


def _column(key, shape, sign=1.0):
    return (jr.normal(key, shape) / 2).at[..., 0].set(sign * 5.0)


# name: (structure from leaves, dense matrix from the same leaves, leaves)
CASES = {
    "circulant_even": (qs.Circulant, _circulant_dense, (_column(_k[0], (8,)),)),
    # A negative determinant (odd n: one real eigenvalue, the sum of the column).
    "circulant_odd": (qs.Circulant, _circulant_dense, (_column(_k[0], (7,), -1.0),)),
    "circulant_batch": (qs.Circulant, _circulant_dense, (_column(_k[1], (2, 6)),)),
    "toeplitz": (
        qs.Toeplitz,
        _toeplitz_dense,
        (_column(_k[2], (7,)), jr.normal(_k[3], (7,)) / 2),
    ),
    "toeplitz_batch": (
        qs.Toeplitz,
        _toeplitz_dense,
        (_column(_k[2], (2, 5)), jr.normal(_k[3], (2, 5)) / 2),
    ),
}


def _program(m, b):
    sign, logdet = jnp.linalg.slogdet(m)
    vector = jnp.linalg.solve(m, b[:, 0]) if m.ndim == 2 else sign
    return jnp.linalg.solve(m, b), vector, sign, logdet


@pytest.mark.parametrize("name", CASES)
def test_solve_and_slogdet_match_dense(name):
    make, dense, leaves = CASES[name]
    m = make(*leaves)
    b = jr.normal(jr.key(3), (*m.shape[:-1], 2))
    got = jax.jit(quax.quaxify(_program))(m, b)
    want = _program(dense(*leaves), b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["circulant_odd", "toeplitz"])
def test_gradients_and_det_match_dense(name):
    """`det` and the gradients of `solve` and `slogdet` with respect to the leaves."""
    make, dense, leaves = CASES[name]
    b = jr.normal(jr.key(4), (leaves[0].shape[-1],))
    scale = float(jnp.linalg.det(dense(*leaves)))

    def loss(m):
        return jnp.sum(jnp.linalg.solve(m, b)) + jnp.linalg.slogdet(m)[1]

    argnums = tuple(range(len(leaves)))
    got = jax.jit(jax.grad(lambda *x: quax.quaxify(loss)(make(*x)), argnums))(*leaves)
    want = jax.grad(lambda *x: loss(dense(*x)), argnums)(*leaves)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)
    got_det = quax.quaxify(jnp.linalg.det)(make(*leaves))
    np.testing.assert_allclose(got_det / scale, 1.0, rtol=1e-4)


@pytest.mark.parametrize("make", [qs.Circulant, lambda c: qs.Toeplitz(c, c)])
def test_solve_holds_no_dense_matrix(make):
    n = 96
    m = make(_column(jr.key(5), (n,)))
    b = jr.normal(jr.key(6), (n,))
    quax.testing.assert_hlo_lacks(
        lambda m, b: (jnp.linalg.solve(m, b), jnp.linalg.slogdet(m)),
        m,
        b,
        shapes=[(n, n)],
    )


def test_the_factor_refuses_to_materialise():
    """`lax.linalg.lu` of a circulant is no packed LU matrix: reading it densely is
    refused even where materialising is allowed."""
    column = _column(jr.key(7), (4,))
    lu, _, _ = quax.quaxify(jax.lax.linalg.lu)(qs.Circulant(column))
    assert isinstance(lu, qs.CirculantLU)
    with pytest.raises(qs.MaterialisationError, match="not a matrix of packed LU"):
        lu.enable_materialise().materialise()
    lu, _, _ = quax.quaxify(jax.lax.linalg.lu)(qs.Toeplitz(column, column))
    assert isinstance(lu, qs.ToeplitzLU)
    with pytest.raises(qs.MaterialisationError, match="ToeplitzLU"):
        lu.enable_materialise().materialise()
