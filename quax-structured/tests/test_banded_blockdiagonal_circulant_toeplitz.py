"""`Banded`, `BlockDiagonal`, `Circulant` and `Toeplitz` against the dense
computation (`quax.testing.assert_matches_dense`), their refusals, and the compiled
programs holding no dense `(n, n)` array."""

import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy as jsp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from hypothesis import given, settings, strategies as st


N = 6


def banded(key, n, p, q, batch=(), dtype=jnp.float32):
    bands = jr.normal(key, (*batch, p + q + 1, n), dtype)
    return qs.Banded(bands.at[..., p, :].add(2 + p + q), p, q)


def _matrices():
    k = jr.split(jr.key(7), 4)
    return {
        "banded": banded(k[0], N, 2, 1),
        "block_diagonal": qs.BlockDiagonal(jr.normal(k[1], (3, 2, 2)) + 3 * jnp.eye(2)),
        "circulant": qs.Circulant(jr.normal(k[2], (N,)).at[0].add(4.0)),
        "toeplitz": qs.Toeplitz(jr.normal(k[3], (N,)), jr.normal(k[0], (N,))),
    }


MATRICES = _matrices()
B = jr.normal(jr.key(8), (N,))


def _products(x, b):
    bb = jnp.stack([b, 2 * b], axis=1)
    return (
        x @ b,
        b @ x,
        x @ bb,
        x.T @ b,
        (-x) @ b + (2.0 * x) @ b,
        (x + x) @ b,
        jnp.sum(x, axis=0),
    )


# Under `jax.jit`: the kit's dense references compile once instead of op by op.
@jax.jit
def _matvecs(x, b):
    return x @ b, b @ x


@pytest.mark.parametrize("name", MATRICES)
def test_products(jit_matches_dense, name):
    # The one conformance run per structure (jit, vmap, grad; jvp is the same
    # autodiff of the same products as grad) on the products, then every program
    # in one compiled program (an eager run of either costs a compilation per small
    # op), and the entries eagerly (the eval check).
    quax.testing.assert_matches_dense(
        _matvecs, MATRICES[name], B, eval=False, jvp=False
    )
    jit_matches_dense(_products, MATRICES[name], B)
    quax.testing.assert_matches_dense(
        jnp.diagonal, MATRICES[name], vmap=False, grad=False, jvp=False, jit=False
    )


@pytest.mark.parametrize("name", ["banded", "block_diagonal"])
def test_solve_slogdet_solve_triangular(jit_matches_dense, name):
    def fn(x, b):
        tri = [
            jsp.linalg.solve_triangular(x, b, lower=lower, trans=trans)
            for lower in (True, False)
            for trans in (0, 1)
        ]
        return jnp.linalg.solve(x, b), jnp.linalg.slogdet(x), jnp.linalg.det(x), tri

    jit_matches_dense(fn, MATRICES[name], B)
    # The solve's derivative (its vmap: the batched property test; its jvp:
    # test_rules.py's tridiagonal solve, through the same `custom_linear_solve`).
    quax.testing.assert_matches_dense(
        jnp.linalg.solve, MATRICES[name], B, eval=False, vmap=False, jvp=False
    )


def test_block_diagonal_cholesky():
    x = MATRICES["block_diagonal"]
    x = qs.BlockDiagonal(x.blocks @ jnp.swapaxes(x.blocks, -1, -2))

    def fn(x, b):
        factor = jnp.linalg.cholesky(x)
        logdet = 2 * jnp.sum(jnp.log(jnp.diagonal(factor)))
        return logdet, jsp.linalg.cho_solve((factor, True), b)

    quax.testing.assert_matches_dense(fn, x, B, eval=False, vmap=False, jvp=False)


def test_circulant_eigvals():
    c = MATRICES["circulant"]
    got = quax.quaxify(jnp.linalg.eigvals)(c)
    # The DFT of the first column, in the DFT's order.
    np.testing.assert_allclose(got, np.fft.fft(np.asarray(c.column)), rtol=1e-5)
    dense = np.linalg.eigvals(np.asarray(c.enable_materialise().materialise()))
    np.testing.assert_allclose(
        np.sort_complex(np.asarray(got)), np.sort_complex(dense), rtol=1e-4, atol=1e-4
    )


def test_structure_kept():
    m = MATRICES
    extra = qs.Banded(jnp.ones((3, N)), 0, 2)
    args = (m["block_diagonal"], m["circulant"], m["toeplitz"], m["banded"], extra)
    d = qs.Diagonal(jnp.arange(1.0, N + 1))

    def fn(bd, c, t, a, extra, d):
        return [bd @ bd, c @ c, t + t.T, d @ a, a @ d, a + extra]

    # One compiled program each for the structured and the dense side.
    got = jax.jit(quax.quaxify(fn))(*args, d)
    kinds = [qs.BlockDiagonal, qs.Circulant, qs.Toeplitz, qs.Banded, qs.Banded]
    assert [type(x) for x in got] == [*kinds, qs.Banded]
    assert (got[-1].lower_bandwidth, got[-1].upper_bandwidth) == (2, 2)
    dense = lambda x: x.enable_materialise().materialise()
    want = jax.jit(lambda xs: fn(*(dense(x) for x in xs)))((*args, d))
    got = jax.jit(lambda xs: [dense(x) for x in xs])(got)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_dense_meaning():
    a = qs.Banded(jnp.array([[9.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 9.0]]), 1, 1)
    expected = [[3.0, 6.0, 0.0], [1.0, 4.0, 7.0], [0.0, 2.0, 5.0]]
    np.testing.assert_array_equal(a.enable_materialise().materialise(), expected)
    c = qs.Circulant(jnp.array([1.0, 2.0, 3.0]))
    expected = [[1.0, 3.0, 2.0], [2.0, 1.0, 3.0], [3.0, 2.0, 1.0]]
    np.testing.assert_array_equal(c.enable_materialise().materialise(), expected)
    t = qs.Toeplitz(jnp.array([1.0, 2.0, 3.0]), jnp.array([9.0, 4.0, 5.0]))
    expected = [[1.0, 4.0, 5.0], [2.0, 1.0, 4.0], [3.0, 2.0, 1.0]]
    np.testing.assert_array_equal(t.enable_materialise().materialise(), expected)
    bd = qs.BlockDiagonal(
        jnp.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
    )
    expected = [[1, 2, 0, 0], [3, 4, 0, 0], [0, 0, 5, 6], [0, 0, 7, 8]]
    np.testing.assert_array_equal(bd.enable_materialise().materialise(), expected)


def test_checks_and_refusals():
    with pytest.raises(ValueError, match=r"`Banded` needs `bands` of shape"):
        qs.Banded(jnp.ones((2, 4)), 1, 1)
    with pytest.raises(ValueError, match=r"`BlockDiagonal` needs `blocks`"):
        qs.BlockDiagonal(jnp.ones((2, 2, 3)))
    with pytest.raises(ValueError, match=r"`Toeplitz` needs `column` and `row`"):
        qs.Toeplitz(jnp.ones(3), jnp.ones(4))
    for x in MATRICES.values():
        kind = type(x).__name__
        with pytest.raises(
            qs.StructuredMaterialisationError, match=f"Refusing to materialise `{kind}`"
        ):
            x.materialise()
        with pytest.raises(
            qs.StructuredMaterialisationError,
            match=rf"`{kind}`.*primitive `exp`.*enable_mat",
        ):
            quax.quaxify(jnp.exp)(x)
    # Eigenvectors of a circulant have no structured rule.
    with pytest.raises(qs.StructuredMaterialisationError, match=r"primitive `eig`"):
        quax.quaxify(jnp.linalg.eig)(MATRICES["circulant"])


def _banded_program(x, b):
    return x @ b, jnp.linalg.solve(x, b), x.mT @ b


# Four layouts (each compiles once), random entries: bandwidths diagonal-only,
# lower-only, upper-only (wider than n) and both, unbatched and batched.
BANDED_LAYOUTS = [(5, 0, 0, (2,)), (5, 2, 0, ()), (2, 0, 2, (2,)), (5, 1, 2, ())]


@settings(max_examples=10, deadline=None)
@given(layout=st.sampled_from(BANDED_LAYOUTS), seed=st.integers(0, 2**16))
def test_banded_property(jit_matches_dense, layout, seed):
    n, p, q, batch = layout
    x = banded(jr.key(seed), n, p, q, batch)
    b = jr.normal(jr.key(seed + 1), (*batch, n, 2))
    jit_matches_dense(_banded_program, x, b)


def _fft_program(c, t, b):
    return c @ b, c.mT @ b, t @ b, t.mT @ b


# Odd and even FFT lengths and the 1 x 1 edge, unbatched and batched, real and
# complex: four layouts (each compiles once), random entries.
FFT_LAYOUTS = [
    (1, (), jnp.float32),
    (4, (2,), jnp.complex64),
    (5, (), jnp.complex64),
    (5, (2,), jnp.float32),
]


@settings(max_examples=10, deadline=None)
@given(layout=st.sampled_from(FFT_LAYOUTS), seed=st.integers(0, 2**16))
def test_fft_structures_property(jit_matches_dense, layout, seed):
    n, batch, dtype = layout
    k = jr.split(jr.key(seed), 4)
    col, row = (jr.normal(kk, (*batch, n)).astype(dtype) for kk in k[:2])
    b = jr.normal(k[2], (*batch, n, 2)).astype(dtype)
    jit_matches_dense(_fft_program, qs.Circulant(col), qs.Toeplitz(col, row), b)


M = 256


def test_compiled_programs_hold_no_dense_matrix():
    k = jr.split(jr.key(3), 5)
    b = jr.normal(k[0], (M,))
    x = banded(k[1], M, 2, 3)
    quax.testing.assert_hlo_lacks(
        lambda x, b: (x @ b, jnp.linalg.solve(x, b), jnp.linalg.slogdet(x)),
        x,
        b,
        shapes=[(M, M)],
    )
    bd = qs.BlockDiagonal(jr.normal(k[2], (32, 8, 8)) + 8 * jnp.eye(8))
    quax.testing.assert_hlo_lacks(
        lambda x, b: (x @ b, jnp.linalg.solve(x, b)), bd, b, shapes=[(M, M)]
    )


# The length of the FFT structures' check: a TPU's XLA lowers an FFT of length 256
# to a product by its (256, 256) DFT matrix, built in the program (78 instructions
# of that shape in this check at M; TPU v5e, JAX 0.10.2, 2026-12-08), where
# `jnp.fft.fft` of 1,024 to 16,384 numbers held no array over 16,384 elements: at
# this length a dense matrix in the program is the structure's, on every backend.
M_FFT = 1024


def test_compiled_fft_programs_hold_no_dense_matrix():
    """`Circulant` and `Toeplitz` products and eigenvalues go through FFTs of
    length `M_FFT` (and `2 M_FFT`), never an `(M_FFT, M_FFT)` array."""
    k = jr.split(jr.key(3), 3)
    b = jr.normal(k[0], (M_FFT,))
    c = qs.Circulant(jr.normal(k[1], (M_FFT,)))
    t = qs.Toeplitz(b, jr.normal(k[2], (M_FFT,)))
    quax.testing.assert_hlo_lacks(
        lambda c, t, b: (c @ b, t @ b, jnp.linalg.eigvals(c)),
        c,
        t,
        b,
        shapes=[(M_FFT, M_FFT)],
    )
