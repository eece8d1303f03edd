"""Construction, the published `TridiagonalMatrix` API, materialisation and its
refusals, and the dense arrays each type stands for (against literals)."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs


def test_published_tridiagonal_api():
    t = qs.TridiagonalMatrix(
        jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0, 5.0]), jnp.array([6.0, 7.0])
    )
    assert t.allow_materialise is False
    assert t.shape == (3, 3) and t.dtype == jnp.float32
    expected = np.array([[3.0, 6.0, 0.0], [1.0, 4.0, 7.0], [0.0, 2.0, 5.0]])
    np.testing.assert_array_equal(t.enable_materialise().materialise(), expected)
    allowed = qs.TridiagonalMatrix(t.lower_diag, t.main_diag, t.upper_diag, True)
    np.testing.assert_array_equal(allowed.materialise(), expected)


def test_published_checks():
    with pytest.raises(ValueError, match="inconsistent batch dimensions"):
        qs.TridiagonalMatrix(jnp.ones((2, 2)), jnp.ones(3), jnp.ones(2))
    with pytest.raises(ValueError, match="inconsistent diagonal lengths"):
        qs.TridiagonalMatrix(jnp.ones(3), jnp.ones(3), jnp.ones(2))
    with pytest.raises(ValueError, match="inconsistent dtypes"):
        qs.TridiagonalMatrix(
            jnp.ones(2, jnp.float16), jnp.ones(3), jnp.ones(2, jnp.float16)
        )


def test_refuses_to_materialise():
    t = qs.TridiagonalMatrix(jnp.ones(2), jnp.ones(3), jnp.ones(2))
    with pytest.raises(
        RuntimeError,
        match="Refusing to materialise `TridiagonalMatrix` with "
        "`allow_materialise=False`",
    ):
        t.materialise()
    with pytest.raises(
        qs.StructuredMaterialisationError, match=r"primitive `exp`.*enable_mat"
    ):
        quax.quaxify(jnp.exp)(t)
    # Allowed: the dense fallback runs.
    out = quax.quaxify(jnp.exp)(t.enable_materialise())
    np.testing.assert_allclose(out, np.exp(t.enable_materialise().materialise()))


@pytest.mark.parametrize(
    "matrix, expected",
    [
        (qs.Diagonal(jnp.array([1.0, 2.0])), [[1.0, 0.0], [0.0, 2.0]]),
        (qs.ScaledIdentity(jnp.array(3.0), 2), [[3.0, 0.0], [0.0, 3.0]]),
        (
            qs.LowerTriangular(jnp.array([[1.0, 9.0], [2.0, 3.0]])),
            [[1.0, 0.0], [2.0, 3.0]],
        ),
        (
            qs.UpperTriangular(jnp.array([[1.0, 9.0], [2.0, 3.0]])),
            [[1.0, 9.0], [0.0, 3.0]],
        ),
        (qs.LowRank(jnp.array([[1.0], [2.0]])), [[1.0, 2.0], [2.0, 4.0]]),
        (
            qs.LowRankPlusDiagonal(
                jnp.array([1.0, 1.0]),
                jnp.array([[1.0], [2.0]]),
                jnp.array([[3.0], [0.0]]),
            ),
            [[4.0, 0.0], [6.0, 1.0]],
        ),
        (
            qs.Kronecker(jnp.array([[1.0, 2.0], [0.0, 1.0]]), jnp.array([[2.0]])),
            [[2.0, 4.0], [0.0, 2.0]],
        ),
    ],
)
def test_dense_meaning(matrix, expected):
    with pytest.raises(
        qs.StructuredMaterialisationError, match="Refusing to materialise"
    ):
        matrix.materialise()
    np.testing.assert_array_equal(matrix.enable_materialise().materialise(), expected)
    assert matrix.shape == np.shape(expected)


def test_kronecker_checks():
    with pytest.raises(ValueError, match="square 2-dimensional factors"):
        qs.Kronecker(jnp.ones((2, 3)), jnp.ones((2, 2)))


def test_examples_aliases():
    from quax.examples import structured, structured_matrices

    assert structured_matrices.TridiagonalMatrix is qs.TridiagonalMatrix
    assert structured.TridiagonalMatrix is qs.TridiagonalMatrix


def test_lineax_round_trip():
    lx = pytest.importorskip("lineax", reason="lineax is an optional extra")
    import jax

    t = qs.TridiagonalMatrix(
        jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0, 5.0]), jnp.array([6.0, 7.0])
    )
    dense = [[3.0, 6.0, 0.0], [1.0, 4.0, 7.0], [0.0, 2.0, 5.0]]
    op = qs.to_lineax(t)
    assert isinstance(op, lx.TridiagonalLinearOperator)
    back = qs.from_lineax(op)
    assert isinstance(back, qs.TridiagonalMatrix)
    d = qs.from_lineax(lx.DiagonalLinearOperator(jnp.array([1.0, 2.0])))
    assert isinstance(d, qs.Diagonal)
    k = qs.Kronecker(jnp.array([[2.0, 1.0], [1.0, 2.0]]), jnp.eye(2), symmetric=True)
    kop = qs.to_lineax(k, tags=[lx.positive_semidefinite_tag])
    assert lx.is_symmetric(kop) and lx.is_positive_semidefinite(kop)
    v = jnp.array([1.0, 2.0, 3.0, 4.0])
    # The numbers in one compiled program (eager lineax costs a compilation per op).
    got = eqx.filter_jit(
        lambda op, back, kop, d: (
            op.as_matrix(),
            back.enable_materialise().materialise(),
            kop.mv(v),
            kop.as_matrix(),
            d.enable_materialise().materialise(),
        )
    )(op, back, kop, d)
    kd = np.kron([[2.0, 1.0], [1.0, 2.0]], np.eye(2))
    want = (dense, dense, kd @ np.asarray(v), kd, np.diag([1.0, 2.0]))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    with pytest.raises(TypeError, match="no structured matrix"):
        qs.from_lineax(
            lx.FunctionLinearOperator(
                lambda v: v, jax.ShapeDtypeStruct((2,), jnp.float32)
            )
        )
