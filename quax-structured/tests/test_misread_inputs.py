"""Inputs that structured constructors accepted and then read wrongly.

`Kronecker(A, B, triangle="lower")` promises triangular factors: triangular solves
read each factor's lower triangle alone and products the whole factor, so with
factors that are not triangular, `solve_triangular` solved `kron(tril A, tril B)`
(0.075 away from SciPy's answer on the matrix `@` multiplies by). A false promise on
concrete factors is refused now, naming the entry; promises that hold, up to
rounding, are kept, and traced factors (which cannot be checked) are read as
before. The same for `symmetric=True` (every factor read as `(A + Aᵀ) / 2`, so a
factor that is not symmetric was silently another matrix) and
`positive_definite=True` (a Cholesky factorisation reads one triangle). And a
`Banded` matrix whose bandwidths exceed its size is accepted and read right (its
`slogdet` raised a shape error). A `Kronecker` that `jax.vmap` returns (its factors
stacked) materialised as `jnp.kron` of the stacked factors, `(9, 4, 4)` for three
`4 x 4` matrices: it refuses now, and each element of the stack materialises right.
References: NumPy and SciPy on the literal matrices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs
import scipy.linalg


A = np.array([[2.0, 1.0], [0.5, 3.0]], np.float32)
B = np.array([[1.0, 0.5, 0.0], [0.2, 1.0, 0.0], [0.0, 0.3, 2.0]], np.float32)
V = np.arange(1.0, 7.0, dtype=np.float32)


@pytest.mark.parametrize("triangle", ["lower", "upper"])
def test_a_factor_outside_its_triangle_is_refused(triangle):
    with pytest.raises(ValueError, match=rf"promised {triangle}-triangular"):
        qs.Kronecker(A, B, triangle=triangle)
    keep = np.tril if triangle == "upper" else np.triu
    with pytest.raises(ValueError, match=r"`right\["):
        qs.Kronecker(np.diag(np.diag(A)), keep(B), triangle=triangle)


def test_a_kept_triangle_promise_gives_the_dense_answers():
    lower_a, lower_b = np.tril(A), np.tril(B)
    t = qs.Kronecker(lower_a, lower_b, triangle="lower")
    solve = quax.quaxify(
        lambda m, v: jax.scipy.linalg.solve_triangular(m, v, lower=True)
    )
    expected = scipy.linalg.solve_triangular(
        np.kron(lower_a, lower_b).astype(np.float64), V, lower=True
    )
    np.testing.assert_allclose(solve(t, V), expected, rtol=1e-5)
    np.testing.assert_allclose(
        quax.quaxify(lambda m, v: m @ v)(t, V),
        np.kron(lower_a, lower_b) @ V,
        rtol=1e-6,
    )


def test_rounding_and_non_finite_entries_keep_the_promise():
    # An entry above the diagonal within rounding of the largest passes, and a
    # NaN there is left to the computation (a NaN stays a NaN).
    a = np.tril(A).copy()
    a[0, 1] = 1e-8
    assert qs.Kronecker(a, np.tril(B), triangle="lower").triangle == "lower"
    a[0, 1] = np.nan
    k = qs.Kronecker(a, np.tril(B), triangle="lower")
    assert np.isnan(np.asarray(quax.quaxify(lambda m, v: m @ v)(k, V))).any()


def test_traced_factors_keep_the_promise_unchecked():
    # Under `jit` the factors cannot be checked: the tag stands, as documented.
    dense = jax.jit(lambda a: qs.Kronecker(a, B, triangle="lower").dense())
    with pytest.raises(ValueError, match=r"`right\[0, 1\]`"):
        dense(np.tril(A))  # `B`, a constant of the program, is concrete
    triangular = jax.jit(lambda a, b: qs.Kronecker(a, b, triangle="lower").dense())(
        A, B
    )
    np.testing.assert_allclose(triangular, np.kron(A, B), rtol=1e-6)


# `Kronecker(A, B, symmetric=True)` reads every factor as `(A + Aᵀ) / 2`: with `A` not
# symmetric it was silently `kron(sym A, sym B)`, not the `kron(A, B)` given.


@pytest.mark.parametrize("tag", ["symmetric", "positive_definite"])
def test_a_factor_that_is_not_symmetric_is_refused(tag):
    # `A[0, 1]` = 1 against `A[1, 0]` = 0.5: |A - Aᵀ| is 0.5, 1/6 of its largest 3.
    s = (A + A.T) / 2
    with pytest.raises(
        ValueError,
        match=(
            rf"(?s)tagged `{tag}=True`, but `left` is not symmetric: `left\[0, 1\]` "
            r"= 1 and `left\[1, 0\]` = 0\.5 \(the largest \|A - A\.T\| is 0\.167 "
            rf"of its largest entry\)\. (Every product|A Cholesky).*\(A \+ A\.T\) / 2"
            rf".*drop `{tag}=True`"
        ),
    ):
        qs.Kronecker(A, s, **{tag: True})
    with pytest.raises(ValueError, match=r"`right` is not symmetric"):
        qs.Kronecker(s, B, **{tag: True})
    with pytest.raises(ValueError, match=r"`matrices\[2\]` is not symmetric"):
        qs.Kronecker(s, s, A, **{tag: True})
    with pytest.raises(ValueError, match=r"`left` is not symmetric"):
        qs.Kronecker(A, s, True)  # the published positional form


def test_a_complex_positive_definite_factor_must_be_hermitian():
    h = np.array([[2.0, 1j], [-1j, 3.0]], np.complex64)  # Hermitian, not symmetric
    k = qs.Kronecker(h, np.eye(2, dtype=np.complex64), positive_definite=True)
    np.testing.assert_allclose(k.dense(), np.kron(h, np.eye(2)), rtol=1e-6)
    symmetric = np.array([[2.0, 1j], [1j, 3.0]], np.complex64)  # not Hermitian
    with pytest.raises(ValueError, match=r"`left` is not Hermitian.*A\.conj\(\)\.T"):
        qs.Kronecker(symmetric, h, positive_definite=True)


def test_a_kept_symmetry_promise_gives_the_dense_answers():
    s, t = (A + A.T) / 2, (B + B.T) / 2
    k = qs.Kronecker(s, t, symmetric=True)
    dense = np.kron(s, t).astype(np.float64)
    np.testing.assert_allclose(k.dense(), dense, rtol=1e-6)
    np.testing.assert_allclose(
        quax.quaxify(lambda m, v: m @ v)(k, V), dense @ V, rtol=1e-5
    )
    solve = quax.quaxify(jnp.linalg.solve)
    np.testing.assert_allclose(solve(k, V), np.linalg.solve(dense, V), rtol=1e-4)
    # Rounding passes, and a NaN is left to the computation.
    r = s.copy()
    r[0, 1] += 1e-7
    assert qs.Kronecker(r, t, symmetric=True).symmetric
    r[0, 1] = np.nan
    k = qs.Kronecker(r, t, symmetric=True)
    assert np.isnan(np.asarray(quax.quaxify(lambda m, v: m @ v)(k, V))).any()


def test_traced_factors_are_read_symmetrised():
    # Under `jit` the factors cannot be checked: they are read as `(A + Aᵀ) / 2`
    # everywhere, as documented, so the matrix is kron of the symmetrised factors.
    dense = jax.jit(lambda a, b: qs.Kronecker(a, b, symmetric=True).dense())(A, B)
    expected = np.kron((A + A.T) / 2, (B + B.T) / 2)
    np.testing.assert_allclose(dense, expected, rtol=1e-6)
    with pytest.raises(ValueError, match=r"`right` is not symmetric"):
        jax.jit(lambda a: qs.Kronecker(a, B, symmetric=True).dense())(A)


def test_a_banded_matrix_with_bandwidths_beyond_its_size():
    # `Banded(bands, 7, 2)` of size 3 is accepted (the bands outside the matrix
    # are ignored); `slogdet` raised a shape error from `jnp.stack` inside its rule
    # (a mask of a band with no entry inside was empty). Reference: NumPy on the
    # matrix written out from the stored bands.
    bands = np.zeros((10, 3), np.float32)
    # Row i of band `d + 7` holds A[i, i + d]; entries whose column is outside
    # the matrix (the 9.0s) are ignored.
    bands[5] = [9.0, 9.0, 1.0]  # offset -2: A[2, 0] = 1.0
    bands[6] = [9.0, 2.0, 3.0]  # offset -1: A[1, 0] = 2.0, A[2, 1] = 3.0
    bands[7] = [4.0, 5.0, 6.0]  # the diagonal
    bands[8] = [0.25, 0.5, 9.0]  # offset 1: A[0, 1], A[1, 2]
    bands[0] = [7.0, 7.0, 7.0]  # offset -7: outside the matrix
    dense = np.array([[4.0, 0.25, 0.0], [2.0, 5.0, 0.5], [1.0, 3.0, 6.0]], np.float64)
    b = qs.Banded(jnp.asarray(bands), 7, 2)
    sign, logdet = quax.quaxify(jnp.linalg.slogdet)(b)
    expected_sign, expected_logdet = np.linalg.slogdet(dense)
    assert sign == expected_sign
    np.testing.assert_allclose(logdet, expected_logdet, rtol=1e-5)
    np.testing.assert_allclose(
        quax.quaxify(lambda m, v: m @ v)(b, V[:3]), dense @ V[:3], rtol=1e-6
    )


def test_a_stack_of_kroneckers_from_vmap_refuses_to_materialise():
    # `jax.vmap` of a quaxified function returns the `Kronecker` with each factor
    # stacked (3 x 2 x 2): `Kronecker` has no batch axes, so materialising it whole
    # is refused (it gave a (9, 4, 4) array), and each element is right.
    factors = jax.random.normal(jax.random.key(0), (3, 2, 2, 2))
    scaled = jax.vmap(
        lambda f: quax.quaxify(lambda k: 2.5 * k)(
            qs.Kronecker(f[0], f[1], allow_materialise=True)
        )
    )(factors)
    with pytest.raises(ValueError, match="has no batch axes"):
        scaled.materialise()
    for i in range(3):
        element = jax.tree.map(lambda leaf, i=i: leaf[i], scaled)
        np.testing.assert_allclose(
            element.materialise(),
            2.5 * np.kron(factors[i, 0], factors[i, 1]),
            rtol=1e-6,
        )
