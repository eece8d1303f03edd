"""Pivoting: `jnp.linalg.solve`, `det` and `slogdet` are accurate on
well-conditioned matrices whose leading pivots or minors are tiny, where an LU
without pivoting loses every digit silently, against float64 numpy.

- `TridiagonalMatrix` (LAPACK's `gtsv` through `lax.linalg.tridiagonal_solve`) and
    `Banded` (the pivoted band LU): solves, transposed solves, batches, `vmap`,
    gradients.
- `LowRankPlusDiagonal` (the better of its LU and Woodbury, NaN where neither is
    accurate), `Banded`'s determinant and a `Toeplitz` tagged positive definite
    (the Levinson recursion alone): error within `20 cond eps`.
- An untagged `Toeplitz` (the Levinson recursion, checked by its backward error;
    GKO where the check fails): the accuracy the documentation page states
    (`toeplitz_guarantee` in `conftest.py`)."""

import functools as ft

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
import scipy.linalg as sl
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


def _solve_and_slogdet(matrices, b):
    """`solve` and (untagged matrices) `slogdet` of each matrix, in one compiled
    program (tracing and compiling dominate these tests' time; `det` reads the
    same pivots as `slogdet`, see `test_zero_pivots.py`)."""
    out = []
    for m in matrices:
        x = jnp.linalg.solve(m, b[: m.shape[-1]].astype(m.dtype))
        out.append((x, *(() if m.positive_definite else jnp.linalg.slogdet(m))))
    return out


_compiled = jax.jit(quax.quaxify(_solve_and_slogdet))


def _dense(m) -> np.ndarray:
    """The dense matrix in float64, from the leaves (not by quax)."""
    if isinstance(m, qs.Toeplitz):
        column, row = (np.asarray(x) for x in (m.column, m.row))
        if column.ndim == 1:
            return sl.toeplitz(column, row)
        return np.stack([sl.toeplitz(c, r) for c, r in zip(column, row, strict=True)])
    if isinstance(m, qs.LowRankPlusDiagonal):
        u = np.asarray(m.u)
        v = u if m.v is None else np.asarray(m.v)
        return np.diag(np.asarray(m.diag)) + u @ v.T
    bands = np.asarray(m.bands)
    p, q, n = m.lower_bandwidth, m.upper_bandwidth, bands.shape[-1]
    out = np.zeros((*bands.shape[:-2], n, n), bands.dtype)
    for d in range(-p, q + 1):
        i = np.arange(max(0, -d), min(n, n - d))
        out[..., i, i + d] = bands[..., d + p, i]
    return out


def _check(matrices, b, toeplitz_guarantee, *, slack: float = 20.0):
    """`solve` and `slogdet` of each matrix (compiled together) against float64
    numpy: relative solve error `<= slack cond eps`, log-determinant within
    `slack n cond eps`; an untagged `Toeplitz`, the accuracy the documentation page
    states for it (`toeplitz_guarantee`, see `conftest.py`)."""
    outs = _compiled(matrices, b)
    _compare(matrices, b, outs, toeplitz_guarantee, slack=slack)


def _compare(matrices, b, outs, toeplitz_guarantee, *, slack: float = 20.0):
    for m, (x, *slogdet) in zip(matrices, outs, strict=True):
        if isinstance(m, qs.Toeplitz) and not m.positive_definite:
            # A backward error within the check's tolerance (`(16 + n / 4)
            # eps`) allows a forward error above `20 cond eps` (41.8 eps at cond
            # 1.46 for a Levinson answer of 13 eps, `test_toeplitz_guarantee.py`).
            rhs = b[: m.shape[-1]].astype(m.dtype)
            toeplitz_guarantee(m.column, m.row, rhs, x, slogdet)
            continue
        complex_ = jnp.issubdtype(m.dtype, jnp.complexfloating)
        dense = _dense(m).astype(np.complex128 if complex_ else np.float64)
        eps = float(np.finfo(m.dtype).eps)
        cond = np.linalg.cond(dense).max()
        rhs = np.asarray(b[: m.shape[-1]], dense.dtype)
        expected = np.linalg.solve(dense, rhs)
        error = np.linalg.norm(np.asarray(x) - expected) / np.linalg.norm(expected)
        assert error <= slack * cond * eps, (type(m).__name__, error, cond)
        if not slogdet:
            continue
        want_sign, want_logdet = np.linalg.slogdet(dense)
        bound = slack * dense.shape[-1] * cond * eps
        np.testing.assert_allclose(slogdet[0], want_sign, atol=bound)
        np.testing.assert_allclose(slogdet[1], want_logdet, atol=bound)


def _toeplitz(dtype, tiny=1e-9):
    """cond 12.8; the Levinson recursion's first pivot is `tiny`."""
    column = jnp.array([tiny, 1, 0.3, 0.2], dtype)
    return qs.Toeplitz(column, jnp.array([tiny, 1, 0.5, 0.1], dtype))


def _low_rank_plus_diagonal(dtype):
    """cond 5; the semiseparable LU's first pivot is `1e-9` (`1 - 1 + 1e-9`).
    Rank 1, stored with a zero second column (the shapes the other tests use)."""
    return qs.LowRankPlusDiagonal(
        jnp.array([1, 1, 2, 3], dtype),
        jnp.array([[1, 0], [1, 0], [0.5, 0], [0.2, 0]], dtype),
        jnp.array([[-1 + 1e-9, 0], [-1, 0], [0.3, 0], [0.7, 0]], dtype),
    )


def _banded(dtype, tiny=1e-9):
    """Bandwidths (2, 1), cond ~ 20, first pivot `tiny` without pivoting."""
    bands = [
        [0.0, 0.0, 1.0, -0.5, 0.3],
        [0.0, 1.0, 0.5, 1.0, -1.0],
        [tiny, 0.2, -0.1, 0.3, 1.0],
        [1.0, -1.0, 0.6, 0.8, 0.0],
    ]
    return qs.Banded(jnp.array(bands, dtype), 2, 1)


def _positive_definite():
    """A tagged Toeplitz (solved by the Levinson recursion) and a tagged
    `D + U Uᵀ` with little noise (Woodbury would cancel; solved by the LU)."""
    t = qs.Toeplitz(jnp.array([4.0, 1, 0.5, 0.2]), jnp.array([4.0, 1, 0.5, 0.2]))
    u = jnp.array([[1.0, 0.5], [-1, 2], [0.3, 1], [2, -0.7]])
    m = qs.LowRankPlusDiagonal(jnp.full(4, 1e-4), u)
    return [x.with_tags(positive_definite=True) for x in (t, m)]


_B = jnp.array([1.0, 2, 3, 4, 5])


@pytest.mark.float64
def test_tiny_leading_minor_float64(toeplitz_guarantee):
    with jax.enable_x64(True):
        makers = (_toeplitz, _low_rank_plus_diagonal, _banded)
        matrices = [make(jnp.float64) for make in makers]
        _check(matrices, _B.astype(jnp.float64), toeplitz_guarantee)


def _float32_cases(toeplitz, low_rank, banded):
    return [toeplitz, low_rank, banded, *_positive_definite()]


def test_tiny_leading_minor_float32_and_positive_definite(toeplitz_guarantee):
    cases = _float32_cases(
        _toeplitz(jnp.float32),
        _low_rank_plus_diagonal(jnp.float32),
        _banded(jnp.float32),
    )
    _check(cases, _B, toeplitz_guarantee)


def test_low_rank_plus_diagonal_where_neither_route_of_the_program_works():
    # A zero diagonal entry (Woodbury divides by it) and a zero leading minor
    # (the LU without pivoting divides by it), yet regular. With the fallback in
    # the program (GPU, TPU, `in_graph_fallbacks()`): NaN, never a silently
    # inaccurate answer. On the CPU backend the host's block LU pivots within
    # its blocks (`_kernels/_lowrank_host.py`): dense JAX's answer.
    d = jnp.array([0.0, 1, 2, 1])
    u = jnp.array([[1.0, 0], [0.5, 1], [1, 0.3], [0.2, 1]])
    v = jnp.array([[0.0, 1], [1, 0.2], [0.4, 1], [1, -0.5]])
    m = qs.LowRankPlusDiagonal(d, u, v)
    dense = np.asarray(_dense(m), np.float64)
    assert abs(np.linalg.det(dense)) > 0.1
    cases = _float32_cases(_toeplitz(jnp.float32), m, _banded(jnp.float32))
    x, _, logdet = _compiled(cases, _B)[1]
    b = np.asarray(_B[:4], np.float64)
    tol = quax.testing.tolerance(np.dtype(np.float32))
    np.testing.assert_allclose(
        x, np.linalg.solve(dense, b), rtol=10 * tol["rtol"], atol=10 * tol["atol"]
    )
    np.testing.assert_allclose(
        logdet,
        np.linalg.slogdet(dense)[1],
        rtol=10 * tol["rtol"],
        atol=10 * tol["atol"],
    )
    with qs.in_graph_fallbacks():
        x, _, logdet = _compiled(cases, _B)[1]
    assert np.isnan(x).all() and np.isnan(logdet)


def test_toeplitz_zero_leading_minors_complex_and_batch(toeplitz_guarantee):
    # A zero diagonal (every odd leading minor zero), a complex matrix, stacked.
    column = np.array([[0, 1, 0.5, 0.2, 0], [2, 1j, -1, 0.5, 1]], np.complex64)
    row = np.array([[0, 1, -0.3, 0.1, 1], [2, 1, 0.5j, 0.3, -1]], np.complex64)
    m = qs.Toeplitz(jnp.asarray(column), jnp.asarray(row))
    _check([m], _B + 1j, toeplitz_guarantee)


def test_toeplitz_transposed_solve_and_grad_match_dense():
    m, b = _toeplitz(jnp.float32, tiny=1e-6), jnp.array([1.0, -2, 0.5, 1])

    def loss(m, b):
        x = jax.scipy.linalg.lu_solve(jax.scipy.linalg.lu_factor(m), b, trans=1)
        return jnp.sum(jnp.sin(x))

    got = jax.jit(jax.grad(quax.quaxify(loss), argnums=(0, 1)))(m, b)
    column, row = m.column, m.row
    n = column.shape[-1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]

    def dense_loss(column, row, b):
        return loss(jnp.where(i >= j, column[i - j], row[j - i]), b)

    want = jax.grad(dense_loss, argnums=(0, 1, 2))(column, row, b)
    for g, w in zip(
        (got[0].column, got[0].row[1:], got[1]),
        (want[0], want[1][1:], want[2]),
        strict=True,
    ):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_compiled_solve_drops_the_unpivoted_factors():
    # `lu` computes the unpivoted factors (and the pivots) beside the pivoted
    # solve: under `jit`, XLA keeps only the loops of what the program uses.
    def solves(banded, toeplitz, b):
        return (
            jnp.linalg.solve(banded, b),  # eliminate, substitute: 2 loops
            # The Levinson recursion, and GKO's elimination in the `lax.cond`
            # branch its check takes where it fails: 2.
            jnp.linalg.solve(toeplitz, b[:4]),
        )

    toeplitz = _toeplitz(jnp.float32)
    hlo = quax.testing.compiled_hlo(solves, _banded(jnp.float32), toeplitz, _B)
    assert hlo.count(" while(") == 4 and " conditional(" in hlo
    # Tagged positive definite: the Levinson recursion, in real arithmetic.
    toeplitz = _positive_definite()[0]
    hlo = quax.testing.compiled_hlo(jnp.linalg.solve, toeplitz, _B[:4])
    assert hlo.count(" while(") == 1 and "c64" not in hlo


@st.composite
def _routed_systems(draw):
    """A random non-symmetric matrix of each kind with a small diagonal (far
    from diagonally dominant: an LU without pivoting meets tiny pivots), in the
    shapes of `test_tiny_leading_minor_float32_and_positive_definite` (whose
    compiled program serves)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-6, 1e-2, 0.3]))
    column, row = rng.normal(size=(2, 4))
    column[0] = row[0] = scale * column[0]
    toeplitz = qs.Toeplitz(*(jnp.asarray(x, jnp.float32) for x in (column, row)))
    u, v = rng.normal(size=(2, 4, 2))
    d = rng.choice([-1, 1], size=4) * rng.uniform(0.5, 2, size=4)
    d[0] = scale - u[0] @ v[0]  # the LU's first pivot
    low_rank = qs.LowRankPlusDiagonal(*(jnp.asarray(x, jnp.float32) for x in (d, u, v)))
    bands = rng.normal(size=(4, 5))
    bands[2] *= scale
    banded = qs.Banded(jnp.asarray(bands, jnp.float32), 2, 1)
    return [toeplitz, low_rank, banded], jnp.asarray(rng.normal(size=5), jnp.float32)


@settings(max_examples=8, deadline=None)
@given(_routed_systems())
def test_non_dominant_matches_numpy(toeplitz_guarantee, system):
    matrices, b = system
    assume(max(np.linalg.cond(_dense(m)) for m in matrices) < 1e4)
    _check(_float32_cases(*matrices), b, toeplitz_guarantee)


@pytest.mark.float64
@pytest.mark.parametrize("kind", ["symmetric", "general", "complex"])
def test_low_rank_plus_diagonal_norm_bound(kind):
    """The bound of `‖A‖₂` in the Woodbury route's backward-error check is
    `max |dᵢ| + ‖U‖_F ‖V‖_F` (against NumPy's) and bounds NumPy's `‖A‖₂`. It
    sets the scale of an acceptable residual (`_TOLERANCE · eps · bound · ‖x‖`):
    the backward error it reports is relative to the size of the factors."""
    rng = np.random.default_rng(5)
    n, r = 7, 3
    d, u, v = rng.normal(size=n), rng.normal(size=(n, r)), rng.normal(size=(n, r))
    if kind == "complex":
        d = d + 1j * rng.normal(size=n)
        u = u + 1j * rng.normal(size=(n, r))
        v = v + 1j * rng.normal(size=(n, r))
    with jax.enable_x64(True):
        m = qs.LowRankPlusDiagonal(
            jnp.asarray(d),
            jnp.asarray(u),
            None if kind == "symmetric" else jnp.asarray(v),
        )
        got = float(m._norm_bound())
    v = u if kind == "symmetric" else v
    want = np.max(np.abs(d)) + np.linalg.norm(u) * np.linalg.norm(v)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got >= np.linalg.norm(np.diag(d) + u @ v.T, 2)
