"""Tests written for mutants of `quax_structured/_rules.py` that the sampled run of
`scripts/mutation.sh structured-rules` let through (see `docs/mutation.md`): each
against dense JAX, and each failing with its mutant planted."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs
import scipy.linalg
from jax import lax


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_a_non_finite_traced_noise_gives_nan_in_every_float_dtype(dtype):
    """`K + noise * jnp.eye(n)` with a traced infinite or NaN noise solves to NaN as
    dense JAX does, in single precision as in double (mutant `_constant_diagonal`
    15 tested the scale's dtype against NumPy's default float, float64, so a float32
    noise of inf kept the structure's exact zeros off the diagonal, and the solve
    came out a silent zero)."""
    with jax.enable_x64(dtype == jnp.float64):
        key_a, key_b, key_v = jax.random.split(jax.random.PRNGKey(0), 3)
        a = jax.random.normal(key_a, (3, 3), dtype)
        b = jax.random.normal(key_b, (2, 2), dtype)
        k = qs.Kronecker(
            a @ a.T + jnp.eye(3, dtype=dtype),
            b @ b.T + jnp.eye(2, dtype=dtype),
            symmetric=True,
        )
        v = jax.random.normal(key_v, (6,), dtype)

        def fn(k, s):
            c = k + s * jnp.eye(6, dtype=dtype)
            return jnp.linalg.solve(c, v), c @ v

        run = jax.jit(quax.quaxify(fn))
        dense = k.enable_materialise().dense()
        for s in (jnp.inf, -jnp.inf, jnp.nan):
            noise = jnp.asarray(s, dtype)
            for got, want in zip(run(k, noise), fn(dense, noise), strict=True):
                assert np.all(np.isnan(want))
                assert np.all(np.isnan(got)), (dtype, s, got)
        # A finite noise gives the dense values.
        tol = 1e-4 if dtype == jnp.float32 else 1e-10
        noise = jnp.asarray(0.5, dtype)
        for got, want in zip(run(k, noise), fn(dense, noise), strict=True):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_a_dense_noise_refusal_says_what_the_program_does_not_show():
    """`M + d` with `d` a dense matrix passed into `jax.jit` (which no rule can
    read as a scaled constant diagonal) is refused, saying what the program does
    not show and which structure to write instead (mutant `_refuse_dense` 29
    changed that sentence)."""
    m = qs.Diagonal(jnp.arange(1.0, 5.0))
    with pytest.raises(
        qs.StructuredMaterialisationError,
        match=re.escape(
            "and the program does not show that operand to be a scalar times a "
            "constant diagonal (as it shows `0.1 * jnp.eye(n)`"
        ),
    ) as refusal:
        jax.jit(quax.quaxify(lambda m, d: m + d))(m, 0.1 * jnp.eye(4))
    assert "`M + quax_structured.Diagonal(d)`" in str(refusal.value)


@pytest.mark.parametrize("x64", [False, True])
def test_lu_of_a_structure_without_pivoting_has_the_dense_pivot_dtypes(x64):
    """`lax.linalg.lu` of a structure whose LU needs no row exchanges gives the
    identity pivots and permutation in the dtypes dense JAX gives (int32, also
    with 64-bit types on, where mutant `_identity_pivots` 5's `arange` without a
    dtype gave int64)."""
    with jax.enable_x64(x64):
        m = qs.Diagonal(jnp.arange(1.0, 5.0))
        got = quax.quaxify(lax.linalg.lu)(m)
        want = lax.linalg.lu(jnp.diag(jnp.arange(1.0, 5.0)))
        for g, w in zip(got, want, strict=True):
            g = (
                g.enable_materialise().dense()
                if isinstance(g, qs.StructuredMatrix)
                else g
            )
            assert jnp.asarray(g).dtype == w.dtype
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _rows_structures():
    r = lambda seed, *shape: jax.random.normal(jax.random.PRNGKey(seed), shape)
    return {
        "Diagonal": qs.Diagonal(jnp.arange(1.0, 5.0)),
        "TridiagonalMatrix": qs.TridiagonalMatrix(r(1, 3), r(2, 4), r(3, 3)),
        "Toeplitz": qs.Toeplitz(r(5, 4), r(6, 4)),
        "LowRank": qs.LowRank(r(8, 4, 2)),
    }


@pytest.mark.parametrize(
    "name", ["Diagonal", "TridiagonalMatrix", "Toeplitz", "LowRank"]
)
@pytest.mark.parametrize("index", [-9, -5, -1, 0, 3, 7])
def test_clipped_rows_read_at_traced_indices_are_the_dense_ones(name, index):
    """`M.at[idx, :].get(mode="clip")` with traced indices (a gather read through
    the structure's entries) reads the rows dense JAX reads: an index below the
    first row (after `jax.numpy` adds `n` to a negative one) is clamped to it, one
    past the last to the last. (Written for mutant `_coordinates` 51, which leaves
    the gather's starts unclamped below: it does not fail with it, as these reads
    come out clamped either way; see `docs/mutation.md`.)"""
    m = _rows_structures()[name]
    read = lambda m, idx: m.at[idx, :].get(mode="clip")
    idx = jnp.array([index, 1])
    got = jax.jit(quax.quaxify(read))(m, idx)
    want = jax.jit(read)(m.enable_materialise().dense(), idx)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# The second sample (seed 46).


@pytest.mark.parametrize("rows", [3, 4])
def test_a_matrix_times_a_structure_on_the_right(rows):
    """`X @ T` and `X @ T.T` with `T` a structure on the right and `X` a matrix
    (not a vector, whose product with either operand order contracts axis 0 of
    both): against NumPy on the tridiagonal written out, also for a square `X`,
    under `jit` and batched by `vmap` over `X`. (Mutant `_structured_product` 4
    read every product as the structure's on the left: `X @ T` came out as
    `(T @ X).T`, silently for a square `X`, and a shape error otherwise.)"""
    lower = np.array([1.0, -2.0, 0.5], np.float32)
    main = np.array([4.0, 3.0, -1.0, 2.0], np.float32)
    upper = np.array([0.25, 5.0, -3.0], np.float32)
    t = qs.TridiagonalMatrix(jnp.asarray(lower), jnp.asarray(main), jnp.asarray(upper))
    dense = np.diag(main) + np.diag(lower, -1) + np.diag(upper, 1)
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) - 5.0
    for fn, want in (
        (lambda x, t: x @ t, x @ dense),
        (lambda x, t: x @ t.T, x @ dense.T),
    ):
        f = quax.quaxify(fn)
        for run in (f, jax.jit(f)):
            np.testing.assert_allclose(run(x, t), want, rtol=1e-6, atol=1e-5)
        batched = jax.vmap(f, in_axes=(0, None))(np.stack([x, 2 * x]), t)
        np.testing.assert_allclose(
            batched, np.stack([want, 2 * want]), rtol=1e-6, atol=1e-5
        )


# The registered rules, a first sample (seed 48, `--decorated`).


def _toeplitz() -> tuple[qs.Toeplitz, np.ndarray]:
    """A symmetric Toeplitz matrix, materialising allowed, and its dense array."""
    c = np.array([4.0, 1.0, 0.5], np.float32)
    dense = np.array([[4.0, 1.0, 0.5], [1.0, 4.0, 1.0], [0.5, 1.0, 4.0]], np.float32)
    return qs.Toeplitz(jnp.asarray(c), jnp.asarray(c)).enable_materialise(), dense


def test_a_product_of_two_structures_with_no_closed_form_is_dense_where_allowed():
    """`A.T @ D` written as one `dot_general` (contracting axis 0 of both), which is
    no matrix product of the pair: where allowed, the dense product (mutant of the
    `dot_general` rule, line 170, 11: the fallback given `None` for its
    primitive)."""
    t, dense = _toeplitz()
    d = qs.Diagonal(jnp.array([1.0, 2.0, 3.0], jnp.float32)).enable_materialise()
    f = quax.quaxify(lambda a, b: lax.dot_general(a, b, (((0,), (0,)), ((), ()))))
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(
            run(t, d), dense.T @ np.diag([1.0, 2.0, 3.0]), rtol=1e-6
        )


def test_eigh_of_a_structure_without_one_is_dense_where_allowed():
    """`jnp.linalg.eigh` of a Toeplitz matrix, which has no eigendecomposition of
    its own: where allowed, dense JAX's, against NumPy's eigenvalues (mutant of the
    `eigh` rule, line 600, 15: the fallback bound without the primitive's other
    params)."""
    t, dense = _toeplitz()
    f = quax.quaxify(jnp.linalg.eigh)
    for run in (f, jax.jit(f)):
        values, vectors = run(t)
        np.testing.assert_allclose(values, np.linalg.eigvalsh(dense), rtol=1e-5)
        np.testing.assert_allclose(
            vectors @ np.diag(values) @ vectors.T, dense, rtol=1e-5, atol=1e-5
        )


@pytest.mark.float64
def test_a_solve_whose_right_hand_side_promotes_keeps_its_precision():
    """`jnp.linalg.solve(T, b)` with `T` tridiagonal in float32 and `b` in float64:
    the result is float64, as dense JAX's, and as accurate (mutant of the `solve`
    rule, line 933, 20: the test of the promotion inverted, so that `b` was cast to
    float32 and solved in single precision, silently)."""
    with jax.enable_x64(True):
        t = qs.TridiagonalMatrix(
            jnp.array([1.0, 1.0], jnp.float32),
            jnp.array([4.0, 4.0, 4.0], jnp.float32),
            jnp.array([0.5, 0.5], jnp.float32),
        )
        dense = np.array([[4.0, 0.5, 0.0], [1.0, 4.0, 0.5], [0.0, 1.0, 4.0]])
        b = np.array([1.0, 2.0, 3.0]) / 3.0
        f = quax.quaxify(jnp.linalg.solve)
        for run in (f, jax.jit(f)):
            out = run(t, jnp.asarray(b))
            assert out.dtype == jnp.float64
            np.testing.assert_allclose(out, np.linalg.solve(dense, b), rtol=1e-14)


def test_the_conjugate_of_a_structure_conjugated_as_a_whole_is_dense_where_allowed():
    """`jnp.conj(S)` of a complex semiseparable matrix, which is not conjugated leaf
    by leaf: where allowed, the dense conjugate. With rank-one factors whose right
    ones are ones, `S[i, j]` is the left factor's `i`-th entry below (or above) the
    diagonal (mutant of the `conj` rule, line 225, 10: the fallback given `None`
    for its params)."""
    low = np.array([1.0 + 2.0j, -1.0j, 3.0], np.complex64)
    up = np.array([0.5j, 2.0 - 1.0j, -1.0 + 1.0j], np.complex64)
    main = np.array([4.0 + 1.0j, 5.0, 6.0 - 2.0j], np.complex64)
    ones = np.ones((3, 1), np.complex64)
    s = qs.Semiseparable(
        jnp.asarray(low[:, None]),
        jnp.asarray(ones),
        jnp.asarray(main),
        jnp.asarray(up[:, None]),
        jnp.asarray(ones),
    ).enable_materialise()
    rows = np.arange(3)[:, None] * np.ones(3, int)
    dense = np.where(rows > rows.T, low[:, None], up[:, None])
    dense[np.diag_indices(3)] = main
    f = quax.quaxify(jnp.conj)
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(s), np.conj(dense), rtol=1e-6)


# The registered rules, a second sample (seed 49, `--decorated`).


def _tridiagonal(lower, main, upper):
    """The dense matrices of a (stack of) tridiagonal matrices, by NumPy."""
    n = main.shape[-1]
    dense = np.zeros((*main.shape, n), main.dtype)
    i = np.arange(n)
    dense[..., i, i] = main
    dense[..., i[1:], i[:-1]] = lower
    dense[..., i[:-1], i[1:]] = upper
    return dense


def test_a_stack_of_structures_transposed_across_its_batch_axis():
    """`jnp.transpose(T, (1, 0, 2))` of a stack of two tridiagonal matrices moves a
    matrix axis first, which no structure stands for: where allowed, the dense
    stack transposed (mutant of the `transpose` rule, line 190, 20: the fallback
    called without its primitive, a `TypeError`)."""
    lower = np.array([[1.0, 2.0], [-1.0, 0.5]], np.float32)
    main = np.array([[4.0, 5.0, 6.0], [7.0, -8.0, 9.0]], np.float32)
    upper = np.array([[3.0, -2.0], [0.25, 1.5]], np.float32)
    t = qs.TridiagonalMatrix(
        jnp.asarray(lower), jnp.asarray(main), jnp.asarray(upper)
    ).enable_materialise()
    f = quax.quaxify(lambda x: jnp.transpose(x, (1, 0, 2)))
    for run in (f, jax.jit(f)):
        np.testing.assert_array_equal(
            run(t), np.transpose(_tridiagonal(lower, main, upper), (1, 0, 2))
        )


def _semiseparable(low, main, up):
    """A complex semiseparable matrix of rank-one factors whose right ones are
    ones, where allowed, and the plain-JAX function of its leaves giving its dense
    matrix: `S[i, j]` is `low[i]` below the diagonal and `up[i]` above it."""
    ones = jnp.ones((3, 1), low.dtype)
    s = qs.Semiseparable(low[:, None], ones, main, up[:, None], ones)
    rows = jnp.arange(3)[:, None] * jnp.ones(3, int)

    def dense(low, main, up):
        full = jnp.where(rows > rows.T, low[:, None], up[:, None])
        return full.at[jnp.diag_indices(3)].set(main)

    return s.enable_materialise(), dense


def test_the_cotangent_of_a_dense_conjugate_is_conjugated():
    """The vector-Jacobian product of `jnp.conj(S)` with `S` complex and
    semiseparable (the dense fallback's `conj`): the cotangent conjugated onto the
    leaves, as plain JAX gives for the dense matrix built from them (mutant of the
    `conj` rule, line 225, 15: the fallback's `input_dtype` `None`, so that JAX's
    transpose of `conj` took the real part of the cotangent)."""
    low = jnp.array([1.0 + 2.0j, -1.0j, 3.0], jnp.complex64)
    main = jnp.array([4.0 + 1.0j, 5.0, 6.0 - 2.0j], jnp.complex64)
    up = jnp.array([0.5j, 2.0 - 1.0j, -1.0 + 1.0j], jnp.complex64)
    ct = jnp.arange(9.0).reshape(3, 3) * (1.0 - 0.5j) + 1.0j
    _, dense = _semiseparable(low, main, up)

    def structured(low, main, up):
        s, _ = _semiseparable(low, main, up)
        return quax.quaxify(jnp.conj)(s)

    _, want = jax.vjp(lambda *leaves: jnp.conj(dense(*leaves)), low, main, up)
    for fn in (structured, jax.jit(structured)):
        _, got = jax.vjp(fn, low, main, up)
        for g, w in zip(got(ct), want(ct), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_a_triangular_solve_of_a_structure_without_one_is_dense_where_allowed():
    """`solve_triangular(L, b, lower=True, trans=1)` of a low-rank matrix `u vᵀ`,
    which has no triangular solve of its own: where allowed, the dense solve with
    the lower triangle transposed (mutant of the `triangular_solve` rule, line 507,
    14: the fallback's params without `transpose_a`, a `TypeError`)."""
    u = np.array([[1.0, 0.0], [2.0, 1.0], [0.0, -1.0]], np.float32)
    v = np.array([[1.0, 1.0], [0.0, 2.0], [3.0, 1.0]], np.float32)
    low_rank = qs.LowRank(jnp.asarray(u), jnp.asarray(v)).enable_materialise()
    b = np.array([[1.0, 2.0], [-1.0, 0.0], [3.0, 0.5]], np.float32)
    want = np.linalg.solve(np.tril(u @ v.T).T, b)
    f = quax.quaxify(
        lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True, trans=1)
    )
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(low_rank, jnp.asarray(b)), want, rtol=1e-5)


def test_eigh_of_a_low_rank_matrix_for_a_subset_is_refused_or_dense():
    """`lax.linalg.eigh(L, subset_by_index=(0, 2))` of a low-rank matrix, which the
    structure's eigendecomposition does not take: refused, naming `eigh`; where
    allowed, the dense `eigh`'s two eigenvalues, traced only (JAX's `eigh` takes
    no subset on CPU and GPU: a `NotImplementedError` when run) (mutant of the `eigh`
    rule, line 855, 1: the result `""` before the test, returned as the result and
    unpacked, a `ValueError`)."""
    u = jnp.array([[1.0, 0.0], [2.0, 1.0], [0.0, -1.0], [1.0, 3.0]], jnp.float32)
    low_rank = qs.LowRank(u)
    f = quax.quaxify(lambda a: lax.linalg.eigh(a, subset_by_index=(0, 2))[1])
    for run in (f, jax.jit(f)):
        with pytest.raises(
            qs.StructuredMaterialisationError,
            match=r"^Refusing to materialise `LowRank` for primitive `eigh`",
        ):
            run(low_rank)
    out = jax.eval_shape(f, low_rank.enable_materialise())
    assert (out.shape, out.dtype) == ((2,), jnp.float32)


def test_expm_of_a_structure_declared_upper_triangular_is_refused():
    """`jax.scipy.linalg.expm(T, upper_triangular=True)` of a tridiagonal matrix,
    which is not upper triangular: refused, saying why and what to do (mutant of
    the `expm` rule, line 880, 8: the message's case changed)."""
    t = qs.TridiagonalMatrix(
        jnp.array([1.0, 2.0]), jnp.array([0.5, 0.25, 1.0]), jnp.array([3.0, 4.0])
    )
    f = quax.quaxify(lambda a: jax.scipy.linalg.expm(a, upper_triangular=True))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "`jax.scipy.linalg.expm(M, upper_triangular=True)` declares `M` upper "
            "triangular, and a `TridiagonalMatrix` is not one: JAX's expm would "
            "then read only the upper triangle, which is not the exponential of "
            "the `TridiagonalMatrix`. Drop `upper_triangular=True` for the exact "
            "exponential through the structure."
        ),
    ):
        f(t)


def test_a_conjugate_keeps_the_structure_and_its_tags():
    """`jnp.conj` of a complex tridiagonal matrix is one, conjugated; of a positive
    definite diagonal, one still tagged so (mutant of the `conj` rule, line 225, 16:
    the tag read from `None`, which broke every conjugate with a structure)."""
    t = qs.TridiagonalMatrix(
        jnp.array([1.0 + 1j, 2.0]),
        jnp.array([0.5, 0.25j, 1.0]),
        jnp.array([3.0, 4 - 2j]),
    )
    f = quax.quaxify(jnp.conj)
    for run in (f, jax.jit(f)):
        out = run(t)
        assert isinstance(out, qs.TridiagonalMatrix)
        np.testing.assert_array_equal(
            out.enable_materialise().dense(), np.conj(t.enable_materialise().dense())
        )
        d = run(qs.Diagonal(jnp.array([1.0, 2.0]), positive_definite=True))
        assert isinstance(d, qs.Diagonal) and d.positive_definite


def test_a_selection_against_zeros_reads_no_entry_it_drops():
    """`jnp.where(mask, D, 0)` of a diagonal holding an infinity where the mask
    drops it: 0 there, as dense `jnp.where` gives, not `inf * 0` (mutant of the
    `select_n` rule, line 470, 27: a product with the mask in place of a
    selection)."""
    d = qs.Diagonal(jnp.array([jnp.inf, 2.0, 3.0]))
    mask = np.array([[False, True, False], [False, True, False], [False, False, True]])
    f = quax.quaxify(lambda m, a: jnp.where(m, a, 0.0))
    want = np.where(mask, np.diag([np.inf, 2.0, 3.0]), 0.0)
    for run in (f, jax.jit(f)):
        out = run(mask, d)
        assert isinstance(out, qs.Diagonal)
        np.testing.assert_array_equal(out.enable_materialise().dense(), want)


def test_eig_with_eigenvectors_of_a_structure_is_refused_or_dense():
    """`jnp.linalg.eig` (eigenvectors asked) of a diagonal matrix: refused naming
    `eig`; allowed, the dense result (mutant of the `eigvals` rule, line 578, 1: the
    answer for "no eigenvalues of the structure's own" was `""`, returned as the
    result). Plain JAX has no TPU lowering of `eig`."""
    if jax.default_backend() == "tpu":
        pytest.skip("plain JAX has no TPU lowering of `eig`")
    d = qs.Diagonal(jnp.array([3.0, 1.0, 2.0]))
    with pytest.raises(qs.StructuredMaterialisationError, match=r"primitive `eig`"):
        quax.quaxify(jnp.linalg.eig)(d)
    values, vectors = quax.quaxify(jnp.linalg.eig)(d.enable_materialise())
    np.testing.assert_allclose(np.sort(np.real(values)), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(np.abs(vectors), np.eye(3), atol=1e-6)


def test_expm_of_a_structure_without_one_names_what_it_computes():
    """`jax.scipy.linalg.expm` of a tridiagonal matrix, which has no exponential of
    its own: refused, naming the structures it has one for (mutant of the `expm`
    rule, line 880, 30: the Kronecker condition's case changed)."""
    t = qs.TridiagonalMatrix(
        jnp.array([1.0, 2.0]), jnp.array([0.5, 0.25, 1.0]), jnp.array([3.0, 4.0])
    )
    with pytest.raises(
        qs.StructuredMaterialisationError,
        match=r"Refusing to materialise `TridiagonalMatrix` for "
        r"`jax\.scipy\.linalg\.expm` \(a nested `jit` named `expm`\): "
        r"quax-structured computes the matrix exponential of .* \(a `Kronecker` when "
        r"it is symmetric or one factor is a constant multiple of the identity\), not "
        r"of a `TridiagonalMatrix`, and ",
    ):
        quax.quaxify(jax.scipy.linalg.expm)(t)


def test_a_batch_of_tridiagonal_matrices_solves_a_shared_right_hand_side():
    """`jnp.linalg.solve` of two tridiagonal matrices (a batch) with one right-hand
    side: JAX's body solves each, as NumPy does (mutant of the pivoted solve's
    entry, line 933, 8: a batch of matrices sent to the pivoted solve of one)."""
    t = qs.TridiagonalMatrix(
        jnp.array([[1.0, 2.0], [0.5, 1.0]]),
        jnp.array([[4.0, 5.0, 6.0], [3.0, 4.0, 5.0]]),
        jnp.array([[1.0, 1.5], [2.0, 0.25]]),
    )
    b = np.array([1.0, 2.0, 3.0], np.float32)
    dense = np.asarray(t.enable_materialise().dense(), np.float64)
    want = np.linalg.solve(dense, np.broadcast_to(b, (2, 3))[..., None])[..., 0]
    f = quax.quaxify(jnp.linalg.solve)
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(t, b), want, rtol=1e-5)


# The registered rules against the whole suite (seed 51, `--suite --decorated`).


def _assert_refused(f, name, primitive, *args):
    """`f` and `jax.jit(f)` of `args` refuse to materialise the structure `name` for
    `primitive`, naming both."""
    for run in (f, jax.jit(f)):
        with pytest.raises(
            qs.StructuredMaterialisationError,
            match=rf"^Refusing to materialise `{name}` for primitive `{primitive}`",
        ):
            run(*args)


def _low_rank(dtype) -> qs.LowRank:
    """A 3 x 3 low-rank matrix `u vᵀ` of `dtype`, which has no triangular solve of
    its own, materialising allowed."""
    u = np.array([[1.0, 0.0], [2.0, 1.0], [0.0, -1.0]])
    v = np.array([[1.0, 1.0], [0.0, 2.0], [3.0, 1.0]])
    if np.issubdtype(dtype, np.complexfloating):
        u, v = u * (1.0 + 0.5j), v - 1.0j
    return qs.LowRank(jnp.asarray(u, dtype), jnp.asarray(v, dtype)).enable_materialise()


def test_a_unit_triangular_solve_of_a_structure_without_one_is_dense_where_allowed():
    """`solve_triangular(L, b, lower=True, unit_diagonal=True)` of a low-rank
    matrix, which has no triangular solve of its own: where allowed, the dense
    solve with ones read on the diagonal, as SciPy's of the dense matrix (mutant of
    the `triangular_solve` rule, line 507, 11: the fallback's `unit_diagonal`
    `None`, so that the diagonal was read)."""
    low_rank = _low_rank(np.float32)
    dense = np.asarray(low_rank.dense(), np.float64)
    b = np.array([[1.0, 2.0], [-1.0, 0.0], [3.0, 0.5]], np.float32)
    want = scipy.linalg.solve_triangular(dense, b, lower=True, unit_diagonal=True)
    f = quax.quaxify(
        lambda a, b: jax.scipy.linalg.solve_triangular(
            a, b, lower=True, unit_diagonal=True
        )
    )
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(low_rank, b), want, rtol=1e-5, atol=1e-5)


def test_a_conjugated_triangular_solve_of_a_structure_without_one_is_dense():
    """`solve_triangular(L, b, lower=True, trans=2)` (`Lᴴ x = b`) of a complex
    low-rank matrix, which has no triangular solve of its own: where allowed, the
    dense solve with the lower triangle conjugated and transposed, as SciPy's of
    the dense matrix (mutant of the `triangular_solve` rule, line 507, 10: the
    fallback's `conjugate_a` `None`, so that `Lᵀ x = b` was solved)."""
    low_rank = _low_rank(np.complex64)
    dense = np.asarray(low_rank.dense(), np.complex128)
    b = np.array([[1.0, 2.0j], [-1.0, 0.0], [3.0 - 1.0j, 0.5]], np.complex64)
    want = scipy.linalg.solve_triangular(dense, b, lower=True, trans=2)
    f = quax.quaxify(
        lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True, trans=2)
    )
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(low_rank, b), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compute_uv", [False, True])
def test_an_svd_of_a_structure_for_a_subset_is_refused_or_dense(compute_uv):
    """`lax.linalg.svd(D, subset_by_index=(0, 2))` of a 3 x 3 diagonal matrix, which
    the structure's SVD does not take: refused, naming `svd`; where allowed, the
    dense `svd`'s two singular values (and vectors), traced only (JAX's `svd` takes
    no subset on CPU and GPU: a `NotImplementedError` when run), as plain JAX
    traces it on the dense matrix (mutant of the `svd` rule, line 816, 23: the
    fallback's `subset_by_index` `None`, so that all three came out)."""
    d = qs.Diagonal(jnp.array([3.0, 1.0, 2.0], jnp.float32))
    svd = lambda a: lax.linalg.svd(
        a, full_matrices=False, compute_uv=compute_uv, subset_by_index=(0, 2)
    )
    f = quax.quaxify(svd)
    _assert_refused(f, "Diagonal", "svd", d)
    got = jax.eval_shape(f, d.enable_materialise())
    want = jax.eval_shape(svd, d.enable_materialise().dense())
    assert jax.tree.map(lambda s: (s.shape, s.dtype), got) == jax.tree.map(
        lambda s: (s.shape, s.dtype), want
    )


# The same order's next 10 names (seed 51, names 11 to 20).


def test_a_sum_of_structures_of_two_shapes_is_refused_as_dense_jax_refuses_it():
    """`lax.add` of a 4 x 4 tridiagonal and a 3 x 3 diagonal matrix (no sum): refused
    naming `add`; where allowed, the `TypeError` plain JAX raises for the dense
    arrays (mutant of the `add` rule for two structures, line 290, 9: the fallback
    called without its primitive, a `TypeError` of Python's in place of both)."""
    t = qs.TridiagonalMatrix(jnp.ones(3), jnp.arange(1.0, 5.0), 2 * jnp.ones(3))
    d = qs.Diagonal(jnp.arange(1.0, 4.0))
    with pytest.raises(TypeError) as dense:
        lax.add(t.enable_materialise().dense(), d.enable_materialise().dense())
    f = quax.quaxify(lax.add)
    _assert_refused(f, "TridiagonalMatrix", "add", t, d)
    for run in (f, jax.jit(f)):
        with pytest.raises(TypeError, match=re.escape(str(dense.value))):
            run(t.enable_materialise(), d.enable_materialise())


def test_a_slice_of_more_than_n_entries_is_dense_where_allowed():
    """`D[1:3, 0:3]` and `D[0:4:2, 1:4]` of a 4 x 4 diagonal matrix read more than
    4 entries, which the structure's entries do not serve: where allowed, the dense
    slices, as NumPy's of the dense matrix (mutant of the `slice` rule, line 743,
    14: the fallback's `strides` misnamed, a `TypeError` where allowed)."""
    main = np.array([1.0, -2.0, 3.0, 4.0], np.float32)
    d = qs.Diagonal(jnp.asarray(main)).enable_materialise()
    f = quax.quaxify(lambda m: (m[1:3, 0:3], m[0:4:2, 1:4]))
    for run in (f, jax.jit(f)):
        got = run(d)
        want = (np.diag(main)[1:3, 0:3], np.diag(main)[0:4:2, 1:4])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_a_structure_divided_by_a_vector_is_refused_or_dense():
    """`D / y` with `y` a vector (no scalar: no structure-keeping scale): refused,
    naming `div`; where allowed, the dense quotient, as NumPy's of the dense matrix
    (mutant of the `div` rule, line 280, 4: the fallback given `None` for its
    operands)."""
    main = np.array([1.0, -2.0, 3.0, 4.0], np.float32)
    y = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    d = qs.Diagonal(jnp.asarray(main))
    f = quax.quaxify(lambda m, y: m / y)
    _assert_refused(f, "Diagonal", "div", d, y)
    for run in (f, jax.jit(f)):
        got = run(d.enable_materialise(), y)
        np.testing.assert_allclose(got, np.diag(main) / y, rtol=1e-6)
