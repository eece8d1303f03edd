"""`LowRankPlusDiagonal`'s solve: Woodbury first, accepted by a one-reduction
backward-error check (`_accurate`), the semiseparable LU only where that says no.
The check must never accept an inaccurate answer: not where Woodbury cancels (a
tiny entry of `diag`), not under `vmap` (over right-hand sides or matrices),
and not where its unscaled sums of squares would underflow or overflow."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from quax_structured._values._lowrank import _TOLERANCE


_solve = jax.jit(quax.quaxify(jnp.linalg.solve))


def _cancelling(dtype=jnp.float32) -> qs.LowRankPlusDiagonal:
    """Well conditioned (cond ~ 20), but `d₀ = 1e-6`: Woodbury divides by it and
    cancels (`D⁻¹ b - D⁻¹ U K⁻¹ Vᵀ D⁻¹ b`, both terms ~ 1e6), losing about six
    digits in float32; the semiseparable LU's first pivot is `1 + 1e-6`."""
    d = jnp.array([1e-6, 1.0, 2.0, 1.5], dtype)
    u = jnp.array([[1.0, 0.2], [1.0, -0.5], [0.3, 1.0], [-0.4, 0.6]], dtype)
    return qs.LowRankPlusDiagonal(d, u)


def _benign(dtype=jnp.float32) -> qs.LowRankPlusDiagonal:
    d = jnp.array([2.0, 1.0, 3.0, 1.5], dtype)
    u = jnp.array([[0.5, 0.2], [1.0, -0.5], [0.3, 1.0], [-0.4, 0.6]], dtype)
    return qs.LowRankPlusDiagonal(d, u)


def _dense(m: qs.LowRankPlusDiagonal) -> np.ndarray:
    d, u = np.asarray(m.diag, np.float64), np.asarray(m.u, np.float64)
    v = u if m.v is None else np.asarray(m.v, np.float64)
    return np.diag(d) + u @ v.T


def _assert_accurate(m, b, x, slack: float = 20.0):
    """`x` solves `m x = b` to `slack · cond · eps` (float64 NumPy reference)."""
    dense = _dense(m)
    want = np.linalg.solve(dense, np.asarray(b, np.float64))
    eps = float(jnp.finfo(m.dtype).eps)
    error = np.linalg.norm(np.asarray(x, np.float64) - want) / np.linalg.norm(want)
    assert error <= slack * np.linalg.cond(dense) * eps, error


_B = jnp.array([1.0, -2.0, 0.5, 3.0])


def test_woodbury_cancels_yet_the_solve_is_accurate():
    m = _cancelling()
    # The case is meaningful: plain Woodbury is wrong in the third digit.
    plain = np.asarray(m._woodbury(_B), np.float64)
    want = np.linalg.solve(_dense(m), np.asarray(_B, np.float64))
    assert np.linalg.norm(plain - want) / np.linalg.norm(want) > 1e-3
    assert not m._accurate(m._woodbury(_B), _B)
    _assert_accurate(m, _B, _solve(m, _B))


def test_vmap_over_right_hand_sides_and_matrices():
    m = _cancelling()
    bs = jnp.stack([_B, 2 * _B[::-1], jnp.ones(4)])
    xs = jax.vmap(_solve, (None, 0))(m, bs)
    for b, x in zip(bs, xs, strict=True):
        _assert_accurate(m, b, x)
    # A matrix right-hand side (`jnp.linalg.solve` vmaps over its columns).
    xs = _solve(m, bs.T)
    for b, x in zip(bs, xs.T, strict=True):
        _assert_accurate(m, b, x)
    # A batch of matrices: one where Woodbury cancels, one where it does not.
    stacked = jax.tree.map(lambda *x: jnp.stack(x), _cancelling(), _benign())
    xs = jax.vmap(_solve)(stacked, bs[:2])
    for matrix, b, x in zip((_cancelling(), _benign()), bs[:2], xs, strict=True):
        _assert_accurate(matrix, b, x)


@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1.0, 1e15, 1e30])
def test_scaled_right_hand_sides(scale):
    """`_accurate` sums squares unscaled: far from 1 they underflow (b ~ 1e-30:
    `‖b‖²` below `n · tiny / eps²`) or overflow (b ~ 1e30), where it says no and
    the fallback decides with the rescaled `backward_error`; the answer is the
    same, scaled, never NaN."""
    m = _benign()
    b = _B * scale
    x = m._woodbury(b)
    accepted = bool(m._accurate(x, b))
    assert accepted == (scale in (1e-8, 1.0, 1e15))
    got = _solve(m, b)
    np.testing.assert_allclose(got / scale, _solve(m, _B), rtol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64, jnp.complex64])
def test_check_never_accepts_above_the_tolerance(dtype):
    """`_accurate` against `backward_error` (rescaled, the reference) on answers
    perturbed from the solution by 1e-16 to 1e-1: never yes above the
    tolerance, yes below it (the two compute the same sums in other orders:
    they may differ by rounding only, 1% apart at the tolerance)."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(dtype == jnp.float64):
        n, r = 12, 3
        d = rng.uniform(0.5, 2, n) * rng.choice([-1, 1], n)
        u, v = rng.normal(size=(2, n, r))
        if dtype == jnp.complex64:
            d, u = d + 1j * rng.uniform(0.5, 1, n), u + 1j * rng.normal(size=(n, r))
        m = qs.LowRankPlusDiagonal(
            *(jnp.asarray(x, dtype) for x in (d, u, v))  # pyright: ignore[reportArgumentType]
        )
        b = jnp.asarray(rng.normal(size=(n, 2)), dtype)
        x = m._woodbury(b)
        eps = float(jnp.finfo(dtype).eps)
        seen = set()
        for size in 10.0 ** np.arange(-16, 0):
            wrong = x + jnp.asarray(size * rng.normal(size=(n, 2)), dtype)
            error = float(m.backward_error(wrong, b))
            accepted = bool(m._accurate(wrong, b))
            if error > 1.01 * _TOLERANCE * eps:
                assert not accepted, (size, error)
            elif error < 0.99 * _TOLERANCE * eps:
                assert accepted, (size, error)
            seen.add(accepted)
        assert seen == {True, False}


@pytest.mark.parametrize("kind", [qs.LowerTriangular, qs.UpperTriangular])
def test_triangular_slogdet_reads_the_diagonal(kind):
    """`slogdet` and `det` of a triangular matrix read its diagonal, O(n): the
    compiled program forms no `(n, n)` array outside the `lax.cond` branch that
    reads other entries of the factors (never taken by `jnp.diagonal`)."""
    rng = np.random.default_rng(1)
    n = 300
    array = rng.normal(size=(n, n)).astype(np.float32)
    array[np.diag_indices(n)] = rng.uniform(0.9, 1.1, n) * rng.choice([-1, 1], n)
    m = kind(jnp.asarray(array))
    for fn in (jnp.linalg.slogdet, jnp.linalg.det):
        hlo = quax.testing.compiled_hlo(fn, m)
        entry = hlo[hlo.index("ENTRY") :]
        made = re.findall(rf"= f32\[{n},{n}\]\{{[0-9,]*\}} ([\w-]+)\(", entry)
        assert made == ["parameter"], (fn, made)
    sign, logdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))(m)
    # The determinant of a triangular matrix is the product of its diagonal (an
    # LU with pivoting of the dense matrix is no reference: a random triangular
    # matrix is exponentially ill-conditioned).
    diagonal = np.diag(array).astype(np.float64)
    assert sign == np.prod(np.sign(diagonal))
    np.testing.assert_allclose(logdet, np.sum(np.log(np.abs(diagonal))), atol=1e-4)
