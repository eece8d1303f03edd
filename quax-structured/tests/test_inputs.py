"""What the constructors accept, and non-finite entries: a malformed input is
refused where it is built, naming the field; a structure built from NumPy
arrays computes as one built from JAX arrays; and a NaN or infinity in the data
lands where dense JAX puts it (in `dense()`, in `jnp.tril`'s selection and in the
Cholesky factor of a matrix that is not positive definite)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: qs.LowerTriangular(jnp.ones((2, 3))), "array"),
        (lambda: qs.UpperTriangular(jnp.ones(3)), "array"),
        (lambda: qs.LowRankPlusDiagonal(jnp.ones(3), jnp.ones((4, 2))), "u"),
        (
            lambda: qs.LowRankPlusDiagonal(
                jnp.ones(3), jnp.ones((3, 2)), jnp.ones((3, 1))
            ),
            "v",
        ),
        (lambda: qs.LowRankPlusDiagonal(jnp.ones((2, 3)), jnp.ones((3, 2))), "diag"),
        (lambda: qs.LowRank(jnp.ones((4, 2)), jnp.ones((4, 3))), "v"),
        (lambda: qs.LowRank(jnp.ones(4)), "u"),
        (lambda: qs.Diagonal(jnp.array(2.0)), "diag"),
        (lambda: qs.ScaledIdentity(jnp.array(2.0), -1), "n"),
        (lambda: qs.ScaledIdentity(jnp.array(2.0), 2.5), "n"),
        (lambda: qs.Circulant(jnp.array(1.0)), "column"),
        (lambda: qs.Banded(jnp.ones((2, 4)), -1, 2), "lower_bandwidth"),
        (lambda: qs.Banded(jnp.ones((2, 4)), 2, -1), "upper_bandwidth"),
        (lambda: qs.Banded(jnp.ones((3, 4)), 1, 0), "bands"),
    ],
)
def test_constructors_refuse_malformed_input(build, field):
    """Each refusal is a `ValueError` at construction that names the field."""
    with pytest.raises(ValueError, match=f"`{field}"):
        build()


def test_negative_bandwidth_message_is_coherent():
    """The refusal names the bad bandwidth alone (not a `bands` shape computed
    from it, which contradicted itself: "(*batch, -1 + 2 + 1, n)")."""
    with pytest.raises(ValueError) as info:
        qs.Banded(jnp.ones((2, 4)), -1, 2)
    message = str(info.value)
    assert "non-negative" in message and "-1 + 2" not in message


def test_rank_mismatch_message_says_what_to_do():
    with pytest.raises(ValueError, match=r"\(4, 2\).*\(4, 3\).*Pad"):
        qs.LowRank(jnp.ones((4, 2)), jnp.ones((4, 3)))


def _pattern(m):
    """Where `m` can be nonzero: its dense array with every leaf set to one."""
    ones = jax.tree.map(jnp.ones_like, m)
    return np.asarray(ones.enable_materialise().dense()) != 0


def _not_positive_definite():
    """One matrix of each type with a Cholesky factorisation, symmetric and not
    positive definite (a negative leading minor at the second step)."""
    t = qs.TridiagonalMatrix(
        jnp.array([3.0, 3.0, 1.0]), jnp.ones(4), jnp.array([3.0, 3.0, 1.0])
    )
    bands = jnp.array([[0.0, 3.0, 3.0, 1.0], [1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 1.0, 0]])
    return [
        t,
        qs.Diagonal(jnp.array([1.0, -2.0, 3.0, 4.0])),
        qs.ScaledIdentity(jnp.array(-2.0), 3),
        qs.Banded(jnp.roll(bands, 0), 1, 1),
        qs.BlockDiagonal(
            jnp.array([[[2.0, 0.0], [0.0, 2.0]], [[1.0, 3.0], [3.0, 1.0]]])
        ),
        qs.LowRankPlusDiagonal(jnp.array([1.0, -5.0, 1.0, 1.0]), jnp.ones((4, 1))),
        qs.Kronecker(
            jnp.array([[1.0, 3.0], [3.0, 1.0]]), jnp.eye(2) * 2, symmetric=True
        ),
    ]


@pytest.mark.parametrize("m", _not_positive_definite(), ids=lambda m: type(m).__name__)
def test_cholesky_of_not_positive_definite_is_nan_as_dense(m):
    """Dense JAX's factor of a matrix that is not positive definite is NaN on
    its whole lower triangle and zero above. Ours: NaN on every entry of that
    lower triangle the structure stores (its pattern), zero everywhere else; no
    NaN above the diagonal, no finite pivot left standing."""
    dense = np.asarray(jnp.linalg.cholesky(m.enable_materialise().dense()))
    assert np.isnan(np.diag(dense)).all()
    out = quax.quaxify(jnp.linalg.cholesky)(m)
    if isinstance(out, qs.StructuredMatrix):
        out = out.enable_materialise().dense()
    got = np.asarray(out)
    expected_nan = np.isnan(dense) & np.tril(_pattern(m))
    np.testing.assert_array_equal(np.isnan(got), expected_nan)
    np.testing.assert_array_equal(got[~expected_nan], 0)


def test_cholesky_of_negated_low_rank_plus_diagonal():
    """`-L` (and `L - 3 L`) of a positive definite `D + U Uᵀ`: `jnp.linalg.cholesky`
    symmetrises its input into `M + Mᵀ`, a `LowRankPlusDiagonal` of stacked
    factors, and factors it: NaN as dense JAX (not a refusal naming a `Sum`);
    `2 L` gives dense JAX's factor."""
    low = qs.LowRankPlusDiagonal(
        jnp.array([2.0, 3.0, 1.0]), jnp.array([[1.0], [0.5], [-1.0]])
    )
    dense = low.enable_materialise().dense()
    for fn, want in [
        (lambda m: -m, -dense),
        (lambda m: m - 3 * m, -2 * dense),
        (lambda m: 2 * m, 2 * dense),
    ]:
        got = jax.jit(quax.quaxify(lambda m, fn=fn: jnp.linalg.cholesky(fn(m))))(low)
        np.testing.assert_allclose(got, jnp.linalg.cholesky(want), rtol=1e-5)


def test_cholesky_refusal_names_the_terms():
    """A non-symmetric `Kronecker` reaches `cholesky` as `K + Kᵀ`, a `Sum`: the
    refusal names the `Kronecker`s and the symmetrisation, and the way out."""
    k = qs.Kronecker(jnp.array([[2.0, 1.0], [0.0, 2.0]]), jnp.eye(2))
    with pytest.raises(
        qs.StructuredMaterialisationError, match=r"`Kronecker`, `Kronecker`.*sym"
    ):
        quax.quaxify(jnp.linalg.cholesky)(k)


def _with_nan(m):
    """`m` with its first leaf's middle entry NaN (inside the matrix)."""
    leaves, treedef = jax.tree.flatten(m)
    flat = jnp.asarray(leaves[0]).reshape(-1)
    leaves[0] = flat.at[flat.size // 2].set(jnp.nan).reshape(jnp.shape(leaves[0]))
    return jax.tree.unflatten(treedef, leaves)


@pytest.mark.parametrize(
    "m",
    [
        qs.TridiagonalMatrix(jnp.ones(3), 2 * jnp.ones(4), 3 * jnp.ones(3)),
        qs.Diagonal(jnp.arange(1.0, 5.0)),
        qs.Banded(jnp.ones((3, 4)), 1, 1),
        qs.BlockDiagonal(jnp.ones((2, 2, 2))),
        qs.LowRankPlusDiagonal(jnp.ones(4), jnp.zeros((4, 1))),
        qs.Circulant(jnp.arange(1.0, 5.0)),
    ],
    ids=lambda m: type(m).__name__,
)
def test_nan_stays_where_it_is_in_dense(m):
    """A NaN leaf entry is NaN at its own positions of `dense()` only (a product
    with the identity spread it along its row)."""
    bad = _with_nan(m)
    got = np.asarray(bad.enable_materialise().dense())
    clean = np.asarray(m.enable_materialise().dense())
    changed = np.isnan(got)
    assert changed.any()
    np.testing.assert_array_equal(got[~changed], clean[~changed])
    # Exactly the entries that read the NaN leaf entry: with it set to 7.
    leaves, treedef = jax.tree.flatten(bad)
    leaves[0] = jnp.where(jnp.isnan(leaves[0]), 7.0, leaves[0])
    seven = np.asarray(jax.tree.unflatten(treedef, leaves).enable_materialise().dense())
    np.testing.assert_array_equal(changed, seven != clean)


def test_tril_drops_nan_above_the_diagonal():
    """`jnp.tril` is `where(mask, M, 0)`: a NaN above the diagonal is dropped,
    as dense JAX drops it (not multiplied by zero into NaN)."""
    t = qs.TridiagonalMatrix(jnp.ones(2), jnp.ones(3), jnp.array([jnp.nan, 2.0]))
    got = quax.quaxify(jnp.tril)(t)
    want = jnp.tril(t.enable_materialise().dense())
    np.testing.assert_array_equal(got.enable_materialise().dense(), want)
    assert not np.isnan(want).any()


def _from_numpy():
    """Every structure built from NumPy arrays (the constructors keep what they
    are given), each regular and well conditioned."""
    rng = np.random.default_rng(0)

    def normal(*shape):
        return rng.normal(size=shape).astype(np.float32)

    def positive(*shape):
        return rng.uniform(2, 3, size=shape).astype(np.float32)

    eye = np.eye(2, dtype=np.float32)
    return [
        qs.TridiagonalMatrix(normal(3), positive(4) + 3, normal(3)),
        qs.Diagonal(positive(4)),
        qs.ScaledIdentity(np.float32(2), 4),
        qs.LowerTriangular(np.tril(normal(4, 4)) + 4 * np.eye(4, dtype=np.float32)),
        qs.UpperTriangular(np.triu(normal(4, 4)) + 4 * np.eye(4, dtype=np.float32)),
        qs.LowRankPlusDiagonal(positive(4), normal(4, 2)),
        qs.LowRankPlusDiagonal(positive(4), normal(4, 2), normal(4, 2)),
        qs.Semiseparable(
            normal(4, 1), normal(4, 1), positive(4) + 3, normal(4, 1), normal(4, 1)
        ),
        qs.Kronecker(3 * eye + normal(2, 2) / 10, 2 * eye + normal(2, 2) / 10),
        qs.KroneckerPlusIdentity(3 * eye, 2 * eye, np.float32(0.5)),
        qs.Banded(positive(3, 4), 1, 1),
        qs.BlockDiagonal(np.stack([3 * eye + normal(2, 2) / 10] * 2)),
        qs.Circulant(np.array([4, 1, 0.5, 0.2], np.float32)),
        qs.Toeplitz(
            np.array([4, 1, 0.5, 0.2], np.float32),
            np.array([4, 2, 0.5, 0.1], np.float32),
        ),
    ]


def _products_and_solve(m, b):
    return m @ b, b @ m, m.T @ b, (m + m) @ b, jnp.linalg.solve(m, b)


@pytest.mark.parametrize("m", _from_numpy(), ids=lambda m: type(m).__name__)
def test_built_from_numpy_arrays_eagerly(m):
    """A structure whose fields are NumPy arrays: eager products, sums and
    solves give the dense answers (a `LowRankPlusDiagonal` crashed with a
    `TracerArrayConversionError` in its non-finite-safe product branch, which
    indexed its NumPy `diag` by a traced row), as does `jax.grad` through the
    product."""
    b = np.linspace(-1, 1, 4, dtype=np.float32)
    dense = jnp.asarray(m.enable_materialise().materialise())
    got = quax.quaxify(_products_and_solve)(m, b)
    want = _products_and_solve(dense, b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    grad = quax.quaxify(lambda m: jax.grad(lambda x: jnp.sum(m @ x))(b))(m)
    np.testing.assert_allclose(grad, jnp.sum(dense, axis=0), rtol=1e-4, atol=1e-5)
