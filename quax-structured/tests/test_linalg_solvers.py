"""`Circulant` and `Toeplitz` through unmodified `jnp.linalg.solve`, `slogdet` and
`det` (FFT and Levinson), against the dense matrices built independently (their
derivatives: in `test_linalg_derivatives.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


# numpy leaves: built without compiling anything.
_rng = np.random.default_rng(11)


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


def _normal(*shape):
    return (_rng.normal(size=shape) / 2).astype(np.float32)


def _column(*shape, sign=1.0):
    out = _normal(*shape)
    out[..., 0] = sign * 5.0
    return out


# name: (structure from leaves, dense matrix from the same leaves, leaves)
CASES = {
    # A negative determinant (odd n: one real eigenvalue, the sum of the column).
    "circulant_odd": (qs.Circulant, _circulant_dense, (_column(7, sign=-1.0),)),
    # Even n (two real eigenvalues), batched.
    "circulant_batch": (qs.Circulant, _circulant_dense, (_column(2, 6),)),
    "toeplitz": (
        qs.Toeplitz,
        _toeplitz_dense,
        (_column(7), _normal(7)),
    ),
    "toeplitz_batch": (
        qs.Toeplitz,
        _toeplitz_dense,
        (_column(2, 5), _normal(2, 5)),
    ),
}


def _program(m, b):
    sign, logdet = jnp.linalg.slogdet(m)
    vector = jnp.linalg.solve(m, b[:, 0]) if m.ndim == 2 else sign
    return jnp.linalg.solve(m, b), vector, sign, logdet


# A batch of `Toeplitz` matrices repeats the single one's route once per matrix
# (10 s of compiles), as the batches of test_toeplitz_checked_levinson.py and
# test_pivoting.py do: a sweep (`bash scripts/test.sh sweeps`).
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.sweep)
        if name == "toeplitz_batch"
        else name
        for name in CASES
    ],
)
def test_solve_and_slogdet_match_dense(name):
    make, dense, leaves = CASES[name]
    m = make(*leaves)
    b = _normal(*m.shape[:-1], 2)
    got = jax.jit(quax.quaxify(_program))(m, b)
    want = jax.jit(_program)(jax.jit(dense)(*leaves), b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _kac_murdock_szego(c):
    """`0.5^|i - j|`, positive definite and tagged so: solved by the Levinson
    recursion, O(n) memory (untagged, a `Toeplitz` solves by GKO, whose factors
    take O(n²): see the README)."""
    k = (0.5 ** np.arange(c.shape[-1])).astype(c.dtype)
    return qs.Toeplitz(k, k, positive_definite=True)


@pytest.mark.parametrize("make", [qs.Circulant, _kac_murdock_szego])
def test_solve_holds_no_dense_matrix(make):
    n = 96
    m = make(_column(n))
    b = _normal(n)
    quax.testing.assert_hlo_lacks(
        lambda m, b: (jnp.linalg.solve(m, b), jnp.linalg.slogdet(m)),
        m,
        b,
        shapes=[(n, n)],
    )


def test_the_factor_refuses_to_materialise():
    """`lax.linalg.lu` of a circulant is no packed LU matrix: reading it densely is
    refused even where materialising is allowed."""
    column = _column(4)
    lu, _, _ = quax.quaxify(jax.lax.linalg.lu)(qs.Circulant(column))
    # A `DeterminantLU` around the solver (see `test_linalg_derivatives.py`).
    assert isinstance(lu.factors, qs.CirculantLU)
    with pytest.raises(
        qs.StructuredMaterialisationError, match="not a matrix of packed LU"
    ):
        lu.enable_materialise().materialise()
    lu, _, _ = quax.quaxify(jax.lax.linalg.lu)(qs.Toeplitz(column, column))
    assert isinstance(lu.factors, qs.ToeplitzLU)
    with pytest.raises(qs.StructuredMaterialisationError, match="ToeplitzLU"):
        lu.enable_materialise().materialise()
