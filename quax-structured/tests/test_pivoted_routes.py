"""`solve`, `det` and `slogdet` of `Toeplitz` (GKO), `LowRankPlusDiagonal` (the
better of its LU and Woodbury, NaN where neither is accurate) and `Banded` (the
pivoted band LU's determinant) are accurate on well-conditioned matrices with a
tiny leading minor, where an LU without pivoting loses digits silently: against
float64 numpy, error within `20 cond eps`."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import quax
import quax.testing
import quax_structured as qs
import scipy.linalg as sl
from hypothesis import assume, given, settings


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


def _check(matrices, b, *, slack: float = 20.0):
    """`solve` and `slogdet` of each matrix (compiled together) against float64
    numpy: relative solve error `<= slack cond eps`, log-determinant within
    `slack n cond eps`."""
    _compare(matrices, b, _compiled(matrices, b), slack=slack)


def _compare(matrices, b, outs, *, slack: float = 20.0):
    for m, (x, *slogdet) in zip(matrices, outs, strict=True):
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


def test_tiny_leading_minor_float64():
    with jax.enable_x64(True):
        makers = (_toeplitz, _low_rank_plus_diagonal, _banded)
        _check([make(jnp.float64) for make in makers], _B.astype(jnp.float64))


def _float32_cases(toeplitz, low_rank, banded):
    return [toeplitz, low_rank, banded, *_positive_definite()]


def test_tiny_leading_minor_float32_and_positive_definite():
    cases = _float32_cases(
        _toeplitz(jnp.float32),
        _low_rank_plus_diagonal(jnp.float32),
        _banded(jnp.float32),
    )
    _check(cases, _B)


def test_low_rank_plus_diagonal_neither_route_is_nan():
    # A zero diagonal entry (Woodbury divides by it) and a zero leading minor
    # (the LU without pivoting divides by it), yet regular: NaN, never a silently
    # inaccurate answer.
    d = jnp.array([0.0, 1, 2, 1])
    u = jnp.array([[1.0, 0], [0.5, 1], [1, 0.3], [0.2, 1]])
    v = jnp.array([[0.0, 1], [1, 0.2], [0.4, 1], [1, -0.5]])
    m = qs.LowRankPlusDiagonal(d, u, v)
    assert abs(np.linalg.det(_dense(m))) > 0.1
    cases = _float32_cases(_toeplitz(jnp.float32), m, _banded(jnp.float32))
    x, _, logdet = _compiled(cases, _B)[1]
    assert np.isnan(x).all() and np.isnan(logdet)


def test_toeplitz_zero_leading_minors_complex_and_batch():
    # A zero diagonal (every odd leading minor zero), a complex matrix, stacked.
    column = np.array([[0, 1, 0.5, 0.2, 0], [2, 1j, -1, 0.5, 1]], np.complex64)
    row = np.array([[0, 1, -0.3, 0.1, 1], [2, 1, 0.5j, 0.3, -1]], np.complex64)
    m = qs.Toeplitz(jnp.asarray(column), jnp.asarray(row))
    _check([m], _B + 1j)


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
            jnp.linalg.solve(toeplitz, b[:4]),  # GKO's elimination: 1
        )

    toeplitz = _toeplitz(jnp.float32)
    hlo = quax.testing.compiled_hlo(solves, _banded(jnp.float32), toeplitz, _B)
    assert hlo.count(" while(") == 3
    # Tagged positive definite: the Levinson recursion, in real arithmetic.
    toeplitz = _positive_definite()[0]
    hlo = quax.testing.compiled_hlo(jnp.linalg.solve, toeplitz, _B[:4])
    assert hlo.count(" while(") == 1 and "c64" not in hlo


@st.composite
def _systems(draw):
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
@given(_systems())
def test_non_dominant_matches_numpy(system):
    matrices, b = system
    assume(max(np.linalg.cond(_dense(m)) for m in matrices) < 1e4)
    _check(_float32_cases(*matrices), b)
