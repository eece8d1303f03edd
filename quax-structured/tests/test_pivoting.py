"""`jnp.linalg.solve` on a `TridiagonalMatrix` pivots: accurate on well-conditioned
matrices whose leading pivots are tiny (where an LU without pivoting, the Thomas
algorithm, loses every digit), against float64 numpy."""

import functools as ft

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_structured as qs
from hypothesis import assume, given, settings


EPS32 = float(np.finfo(np.float32).eps)


def _tiny_pivot():
    """`[[1e-8, 1], [1, 1]]` (condition number ~2.6): the Thomas algorithm's
    multiplier is 1e8, and `solve(T, [1, 2])` came out `[0, 1]` instead of
    `[1, 1]`."""
    return qs.TridiagonalMatrix(
        jnp.array([1.0]), jnp.array([1e-8, 1.0]), jnp.array([1.0])
    )


def _numpy(t: qs.TridiagonalMatrix) -> np.ndarray:
    """The dense matrix in float64, built from the diagonals (not by quax)."""
    lower, main, upper = (
        np.asarray(v, np.float64) for v in (t.lower_diag, t.main_diag, t.upper_diag)
    )
    n = main.shape[-1]
    out = np.zeros((*main.shape[:-1], n, n))
    i = np.arange(n)
    out[..., i, i] = main
    out[..., i[1:], i[:-1]] = lower
    out[..., i[:-1], i[1:]] = upper
    return out


_solve = jax.jit(quax.quaxify(jnp.linalg.solve))


@ft.partial(jax.jit, static_argnames="trans")
@quax.quaxify
def _lu_solve(t, b, trans):
    return jsl.lu_solve(jsl.lu_factor(t), b, trans=trans)


def test_tiny_leading_pivot_vector_and_matrix():
    t = _tiny_pivot()
    b = jnp.array([1.0, 2.0])
    expected = np.linalg.solve(_numpy(t), np.asarray(b, np.float64))
    np.testing.assert_allclose(expected, [1.0, 1.0], rtol=1e-7)
    np.testing.assert_allclose(quax.quaxify(jnp.linalg.solve)(t, b), expected, 1e-6)
    np.testing.assert_allclose(_solve(t, b), expected, rtol=1e-6)
    np.testing.assert_allclose(quax.quaxify(jsl.solve)(t, b), expected, rtol=1e-6)
    rhs = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    expected = np.linalg.solve(_numpy(t), np.asarray(rhs, np.float64))
    np.testing.assert_allclose(_solve(t, rhs), expected, rtol=1e-6)


def test_tiny_leading_pivot_transposed_lu_solve():
    # Not symmetric, so the transposed solve differs.
    t = qs.TridiagonalMatrix(
        jnp.array([2.0, 1.0]), jnp.array([1e-8, 1.0, 3.0]), jnp.array([1.0, -1.0])
    )
    b = jnp.array([1.0, 2.0, 3.0])
    dense = _numpy(t)
    for trans, a in ((0, dense), (1, dense.T)):
        expected = np.linalg.solve(a, np.asarray(b, np.float64))
        np.testing.assert_allclose(_lu_solve(t, b, trans), expected, rtol=1e-6)


def test_tiny_leading_pivot_batch_and_vmap():
    main = jnp.array([[1e-8, 1.0, 2.0], [1e-7, -1.0, 1.0]])
    t = qs.TridiagonalMatrix(jnp.ones((2, 2)), main, jnp.array([[1.0, 2.0]] * 2))
    b = jnp.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    expected = np.linalg.solve(_numpy(t), np.asarray(b, np.float64)[..., None])
    np.testing.assert_allclose(_solve(t, b[..., None]), expected, rtol=1e-5)
    out = jax.jit(jax.vmap(quax.quaxify(jnp.linalg.solve)))(t, b)
    np.testing.assert_allclose(out, expected[..., 0], rtol=1e-5)


@st.composite
def _systems(draw):
    """A random tridiagonal matrix whose main diagonal is small against its
    off-diagonals (far from diagonally dominant: unpivoted LU meets tiny and
    large pivots), with a vector or matrix right-hand side."""
    n = draw(st.sampled_from([2, 5]))  # few shapes: each compiles
    k = draw(st.sampled_from([None, 2]))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([1e-6, 1e-2, 0.3]))
    rng = np.random.default_rng(seed)
    t = qs.TridiagonalMatrix(
        jnp.asarray(rng.normal(size=n - 1), jnp.float32),
        jnp.asarray(scale * rng.normal(size=n), jnp.float32),
        jnp.asarray(rng.normal(size=n - 1), jnp.float32),
    )
    b = rng.normal(size=(n,) if k is None else (n, k))
    return t, jnp.asarray(b, jnp.float32)


@settings(max_examples=20, deadline=None)
@given(_systems())
def test_non_dominant_solves_match_numpy(system):
    t, b = system
    dense = _numpy(t)
    cond = np.linalg.cond(dense)
    assume(cond < 1e4)
    for trans, a in ((0, dense), (1, dense.T)):
        expected = np.linalg.solve(a, np.asarray(b, np.float64))
        out = np.asarray(_lu_solve(t, b, trans), np.float64)
        error = np.linalg.norm(out - expected) / np.linalg.norm(expected)
        assert error <= 20 * cond * EPS32, (trans, error, cond)


def _loss(a, b):
    return jnp.sum(jnp.sin(jnp.linalg.solve(a, b)))


def test_grad_with_tiny_leading_pivot_matches_dense():
    # Well-conditioned (cond ~ 10), not diagonally dominant, leading pivot 1e-6:
    # the transposed solve of the derivative must pivot too.
    t = qs.TridiagonalMatrix(
        jnp.array([1.0, 0.5, -1.0]),
        jnp.array([1e-6, 0.1, -0.2, 1.0]),
        jnp.array([1.0, -1.0, 0.7]),
    )
    b = jnp.array([[1.0, -2.0], [0.5, 1.0], [2.0, 0.0], [-1.0, 1.0]])
    assert np.linalg.cond(_numpy(t)) < 50
    grad_t, grad_b = jax.jit(jax.grad(quax.quaxify(_loss), argnums=(0, 1)))(t, b)
    dense_t, dense_b = jax.grad(_loss, argnums=(0, 1))(
        jnp.asarray(_numpy(t), jnp.float32), b
    )
    assert isinstance(grad_t, qs.TridiagonalMatrix)
    np.testing.assert_allclose(grad_b, dense_b, rtol=1e-5, atol=1e-5)
    for k, diag in ((-1, grad_t.lower_diag), (0, grad_t.main_diag)):
        np.testing.assert_allclose(diag, jnp.diagonal(dense_t, k), 1e-5, 1e-5)
    np.testing.assert_allclose(grad_t.upper_diag, jnp.diagonal(dense_t, 1), 1e-5, 1e-5)


def test_slogdet_with_tiny_leading_pivot_unchanged():
    sign, logdet = quax.quaxify(jnp.linalg.slogdet)(_tiny_pivot())
    expected = np.linalg.slogdet(_numpy(_tiny_pivot()))
    np.testing.assert_allclose(sign, expected[0])
    np.testing.assert_allclose(logdet, expected[1], atol=1e-6)


def test_lone_triangular_solve_with_the_factors_refuses():
    # The first triangular solve with the factors does the whole pivoted solve:
    # alone, it is not `L⁻¹ b`, so any use of it refuses rather than be wrong.
    t, b = _tiny_pivot(), jnp.array([1.0, 2.0])

    def lower_only(t, b):
        lu, _ = jsl.lu_factor(t)
        return jsl.solve_triangular(lu, b, lower=True, unit_diagonal=True)

    def lower_twice(t, b):
        lu, _ = jsl.lu_factor(t)
        x = jsl.solve_triangular(lu, b, lower=True, unit_diagonal=True)
        return jsl.solve_triangular(lu, x, lower=True, unit_diagonal=True)

    for fn in (lower_only, lower_twice):
        with pytest.raises(RuntimeError, match="Refusing to materialise `HalfSolved`"):
            quax.quaxify(fn)(t, b)


def _banded_numpy(a: qs.Banded) -> np.ndarray:
    """The dense matrix in float64 from the bands (`A[i, i + d] = bands[d + p, i]`)."""
    bands = np.asarray(a.bands, np.float64)
    p, q, n = a.lower_bandwidth, a.upper_bandwidth, bands.shape[-1]
    out = np.zeros((*bands.shape[:-2], n, n))
    for d in range(-p, q + 1):
        i = np.arange(max(0, -d), min(n, n - d))
        out[..., i, i + d] = bands[..., d + p, i]
    return out


@st.composite
def _banded_systems(draw):
    """A batch of two random 5 x 5 banded matrices with a small main diagonal (not
    diagonally dominant), bandwidths up to 2 (few shapes: each compiles), and a
    right-hand side of two columns."""
    p, q = draw(st.sampled_from([(2, 1), (1, 2)]))
    n, batch = 5, (2,)
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    bands = rng.normal(size=(*batch, p + q + 1, n))
    bands[..., p, :] *= draw(st.sampled_from([1e-6, 1e-2, 0.3]))
    b = rng.normal(size=(*batch, n, 2))
    return qs.Banded(jnp.asarray(bands, jnp.float32), p, q), jnp.asarray(b, jnp.float32)


@settings(max_examples=15, deadline=None)
@given(_banded_systems())
def test_banded_non_dominant_solves_match_numpy(system):
    a, b = system
    dense = _banded_numpy(a)
    cond = np.linalg.cond(dense).max()
    assume(cond < 1e4)
    for trans, m in ((0, dense), (1, np.swapaxes(dense, -1, -2))):
        expected = np.linalg.solve(m, np.asarray(b, np.float64))
        out = np.asarray(_lu_solve(a, b, trans), np.float64)
        error = np.linalg.norm(out - expected) / np.linalg.norm(expected)
        assert error <= 20 * cond * EPS32, (trans, error, cond)


def test_banded_tiny_leading_pivot_and_grad():
    # Bandwidths (2, 1), leading pivot 1e-7, condition number ~ 20: without
    # pivoting the solve lost every digit.
    bands = jnp.array(
        [
            [0.0, 0.0, 1.0, -0.5, 0.3],
            [0.0, 1.0, 0.5, 1.0, -1.0],
            [1e-7, 0.2, -0.1, 0.3, 1.0],
            [1.0, -1.0, 0.6, 0.8, 0.0],
        ]
    )
    a = qs.Banded(bands, 2, 1)
    b = jnp.array([[1.0, 0.0], [2.0, 1.0], [0.0, -1.0], [1.0, 1.0], [-2.0, 0.5]])
    dense = _banded_numpy(a)
    assert np.linalg.cond(dense) < 100
    expected = np.linalg.solve(dense, np.asarray(b, np.float64))
    np.testing.assert_allclose(_solve(a, b), expected, rtol=1e-5, atol=1e-5)
    grad_a, grad_b = jax.jit(jax.grad(quax.quaxify(_loss), argnums=(0, 1)))(a, b)
    dense_a, dense_b = jax.grad(_loss, argnums=(0, 1))(jnp.asarray(dense, b.dtype), b)
    assert isinstance(grad_a, qs.Banded)
    np.testing.assert_allclose(grad_b, dense_b, rtol=1e-4, atol=1e-5)
    for d in range(-2, 2):
        n = dense.shape[-1]
        band = grad_a.bands[d + 2, max(0, -d) : min(n, n - d)]
        np.testing.assert_allclose(band, jnp.diagonal(dense_a, d), 1e-4, 1e-5)
