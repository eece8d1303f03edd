"""`LowRankPlusDiagonal`'s solve: Woodbury first, accepted by a bound of its
backward error (`_woodbury_accurate`), the semiseparable LU only where that says no.
The check must never accept an inaccurate answer: not where Woodbury cancels (a
tiny entry of `diag`), not under `vmap` (over right-hand sides or matrices),
and not where its unscaled sums of squares would underflow or overflow."""

import contextlib
import functools as ft
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from quax_structured._kernels import stacked_sums
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

# The dtypes of the checks below: float32 repeats float64's check (the same code, real
# arithmetic) at single precision's tolerance, which complex64 checks too (its `eps`
# is float32's), with conjugation besides: a sweep (`bash scripts/test.sh sweeps`).
DTYPES = [
    pytest.param(jnp.float32, marks=pytest.mark.sweep),
    jnp.float64,
    jnp.complex64,
]


def test_woodbury_cancels_yet_the_solve_is_accurate():
    m = _cancelling()
    # The case is meaningful: plain Woodbury is wrong in the third digit.
    plain = np.asarray(m._woodbury(_B), np.float64)
    want = np.linalg.solve(_dense(m), np.asarray(_B, np.float64))
    assert np.linalg.norm(plain - want) / np.linalg.norm(want) > 1e-3
    assert not m._woodbury_accurate(_B, *m._woodbury_steps(_B))
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
    """`_woodbury_accurate` sums squares unscaled: far from 1 they underflow
    (b ~ 1e-30: `‖b‖²` is 0, the bound's `tiny` per square dominates) or
    overflow (b ~ 1e30), where it says no and the fallback decides with the
    rescaled `backward_error`; the answer is the same, scaled, never NaN."""
    m = _benign()
    b = _B * scale
    accepted = bool(m._woodbury_accurate(b, *m._woodbury_steps(b)))
    assert accepted == (scale in (1e-8, 1.0, 1e15))
    got = _solve(m, b)
    np.testing.assert_allclose(got / scale, _solve(m, _B), rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_check_never_accepts_above_the_tolerance(dtype, symmetric):
    """`_woodbury_accurate` (an upper bound of the backward error from the
    `r`-vector `z - Vᵀ x`) against `backward_error` (rescaled, the reference)
    on answers back-substituted from capacitance solutions `z` perturbed by
    1e-17 to 1e-1 of their size: never yes above the tolerance (1% for the
    reference's own rounding), yes below a tenth of it (the bound is up to
    about 3x the backward error here: `‖U‖_F` for `‖U y‖`, `√2`)."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(dtype == jnp.float64):
        n, r = 12, 3
        # Signs of either kind where `U Vᵀ` is not symmetric; where it is, a
        # positive `diag` (else the capacitance's Cholesky factor fails).
        signs = 1 if symmetric else rng.choice([-1, 1], n)
        d = rng.uniform(0.5, 2, n) * signs
        u, v = rng.normal(size=(2, n, r))
        if dtype == jnp.complex64:
            d, u = d + 1j * rng.uniform(0.5, 1, n), u + 1j * rng.normal(size=(n, r))
        cast = lambda x: None if x is None else jnp.asarray(x, dtype)
        m = qs.LowRankPlusDiagonal(cast(d), cast(u), None if symmetric else cast(v))  # pyright: ignore[reportArgumentType]
        b = jnp.asarray(rng.normal(size=(n, 2)), dtype)
        parts = m._woodbury_parts()
        _, z = m._woodbury_steps(b, parts)
        eps = float(jnp.finfo(dtype).eps)
        seen = set()
        for size in 10.0 ** np.arange(-17, 0, 0.5):
            noise = jnp.asarray(size * rng.normal(size=z.shape), dtype)
            wrong = z + noise * jnp.linalg.norm(z)
            x = m._back_substitute(b, wrong, parts[0])
            error = float(m.backward_error(x, b))
            accepted = bool(m._woodbury_accurate(b, x, wrong))
            if error > 1.01 * _TOLERANCE * eps:
                assert not accepted, (size, error)
            elif error < 0.1 * _TOLERANCE * eps:
                assert accepted, (size, error)
            seen.add(accepted)
        assert seen == {True, False}


@pytest.mark.parametrize("dtype", DTYPES)
def test_check_on_woodbury_where_it_fails(dtype):
    """Woodbury's own answers where it loses accuracy: an entry of `diag` from
    1e-1 down to 1e-12 against `U Vᵀ` (cancellation), and a capacitance made
    ill-conditioned by two nearly equal columns of `U`, symmetric and not.
    Wherever `_woodbury_accurate` says yes, the backward error is below the
    tolerance; it says yes on the mild cases and no on the worst ones."""
    rng = np.random.default_rng(7)
    with jax.enable_x64(dtype == jnp.float64):
        eps = float(jnp.finfo(dtype).eps)
        n, r = 16, 3
        u = rng.normal(size=(n, r))
        if dtype == jnp.complex64:
            u = u + 0.5j * rng.normal(size=(n, r))
        b = jnp.asarray(rng.normal(size=n), dtype)
        cases = []
        for tiny in 10.0 ** -np.arange(1, 13):
            d = rng.uniform(0.5, 2, n) * rng.choice([-1, 1], n)
            d[3] = tiny
            cases.append((d, u, None))
            cases.append((d, u, u[::-1] + 0.3))
        for gap in 10.0 ** -np.arange(1, 9):
            close = u.copy()
            close[:, 1] = close[:, 0] + gap * rng.normal(size=n)
            d = rng.uniform(1e-3, 1e-2, n)
            cases.append((d, close, None))
            cases.append((d, close, close + 0.1 * rng.normal(size=(n, r))))
        seen = set()
        for d, u_, v in cases:
            cast = lambda x: None if x is None else jnp.asarray(x, dtype)
            m = qs.LowRankPlusDiagonal(cast(d), cast(u_), cast(v))  # pyright: ignore[reportArgumentType]
            x, z = m._woodbury_steps(b)
            accepted = bool(m._woodbury_accurate(b, x, z))
            if accepted:
                assert float(m.backward_error(x, b)) <= _TOLERANCE * eps
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


# The capacitance solve (Cholesky where `K` is real symmetric) and the
# `jnp.linalg.solve` rule (issue 29, item 7) ------------------------------------


def _dense_solve(d, u, v, b):
    v = u if v is None else v
    return jnp.linalg.solve(jnp.diag(d) + u @ v.T, b)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_indefinite_capacitance_falls_back(dtype):
    """A symmetric matrix with negative `diag` entries: `K = I + Uᵀ D⁻¹ U` is
    not positive definite, its Cholesky factor is NaN and so is Woodbury with
    it; the check says no and the fallback (Woodbury with `K` pivoted, the
    semiseparable LU) gives the accurate answer."""
    with jax.enable_x64(dtype == jnp.float64):
        d = jnp.array([-0.1, 2.0, -3.0, 1.5, 2.5], dtype)
        u = jnp.array(
            [[1.0, 0.2], [0.5, -0.5], [0.3, 1.0], [-0.4, 0.6], [0.7, 0.1]], dtype
        )
        m = qs.LowRankPlusDiagonal(d, u)
        b = jnp.arange(1.0, 6.0, dtype=dtype)
        assert not np.all(np.linalg.eigvalsh(np.asarray(m._woodbury_parts()[1])) > 0)
        assert np.all(np.isnan(np.asarray(m._woodbury(b))))
        assert not m._woodbury_accurate(b, *m._woodbury_steps(b))
        _assert_accurate(m, b, _solve(m, b))
        _assert_accurate(m, b, _solve(m, jnp.stack([b, -b], axis=1))[:, 0])
        # The determinant lemma falls back the same way.
        sign, logdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))(m)
        want_sign, want_logdet = np.linalg.slogdet(_dense(m))
        assert sign == want_sign
        eps = float(jnp.finfo(dtype).eps)
        np.testing.assert_allclose(logdet, want_logdet, rtol=100 * eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_capacitance_solve_on_ill_conditioned_k(dtype, symmetric):
    """Woodbury's `r x r` solve (Cholesky for a real symmetric `K`, else
    `jnp.linalg.solve`) against `jnp.linalg.solve` on the same `K`, float64
    reference, where `K` is ill-conditioned (two nearly equal columns of `U`
    against tiny `diag` entries): both within `cond(K) · eps` of the truth."""
    rng = np.random.default_rng(3)
    with jax.enable_x64(dtype == jnp.float64):
        n, r = 40, 4
        u = rng.normal(size=(n, r))
        u[:, 1] = u[:, 0] + 1e-3 * rng.normal(size=n)
        d = rng.uniform(1e-3, 1e-2, n)
        v = None if symmetric else u + 0.1 * rng.normal(size=(n, r))
        if dtype == jnp.complex64:
            u = u + 0.1j * rng.normal(size=(n, r))
        cast = lambda x: None if x is None else jnp.asarray(x, dtype)
        m = qs.LowRankPlusDiagonal(cast(d), cast(u), cast(v))  # pyright: ignore[reportArgumentType]
        scaled, k, cholesky = m._woodbury_parts()
        assert (cholesky is not None) == (symmetric and dtype != jnp.complex64)
        c = jnp.asarray(rng.normal(size=r), dtype)
        exact = np.linalg.solve(np.asarray(k, np.complex128), np.asarray(c))
        cond = np.linalg.cond(np.asarray(k, np.complex128))
        assert cond > (1e4 if dtype == jnp.float64 else 1e2)
        eps = float(jnp.finfo(dtype).eps)
        # The capacitance solve is Woodbury's: `w - D⁻¹ U z` with `Vᵀ w = c`
        # for `w` = the first `r` unit vectors combination below.
        w = jnp.linalg.lstsq(m._v().T, c)[0]
        b = m.diag * w
        got = np.asarray((w - m._woodbury(b)), np.complex128)
        z = np.linalg.lstsq(np.asarray(scaled, np.complex128), got, rcond=None)[0]
        reference = np.asarray(jnp.linalg.solve(k, c), np.complex128)
        for answer in (z, reference):
            error = np.linalg.norm(answer - exact) / np.linalg.norm(exact)
            assert error <= 50 * cond * eps, error


@pytest.mark.float64
@pytest.mark.long_running
# The unsymmetric variant repeats the symmetric one's check with an LU factor of the
# capacitance: a sweep (`bash scripts/test.sh sweeps`).
@pytest.mark.parametrize(
    "symmetric", [True, pytest.param(False, marks=pytest.mark.sweep)]
)
def test_solve_rule_gradients_and_vmap(symmetric):
    """`jnp.linalg.solve` of a `LowRankPlusDiagonal` runs `pivoted_solve` (the
    registered rule): the value, `jax.grad` with respect to every leaf and `b`,
    `vmap` outside and inside `quaxify`, `grad` of `vmap` and `vmap` of `grad`,
    a matrix `b`: all against `jnp.linalg.solve` on the dense matrix."""
    rng = np.random.default_rng(4)
    with jax.enable_x64(True):
        n, r = 7, 2
        d = jnp.asarray(rng.uniform(0.5, 2, n))
        u = jnp.asarray(rng.normal(size=(n, r)))
        v = None if symmetric else jnp.asarray(rng.normal(size=(n, r)))
        b = jnp.asarray(rng.normal(size=n))
        bs = jnp.asarray(rng.normal(size=(3, n)))
        solve = quax.quaxify(jnp.linalg.solve)

        def ours(d, u, b):
            return solve(qs.LowRankPlusDiagonal(d, u, v), b)

        # The dense reference under `jax.jit`: one program for each way it is
        # called (each of its operations compiles on its own when run eagerly).
        @jax.jit
        def dense(d, u, b):
            return _dense_solve(d, u, v, b)

        close = ft.partial(np.testing.assert_allclose, rtol=1e-10, atol=1e-12)
        close(jax.jit(ours)(d, u, b), dense(d, u, b))
        close(jax.jit(ours)(d, u, bs.T), dense(d, u, bs.T))
        loss = lambda f: lambda d, u, b: jnp.sum(jnp.sin(f(d, u, b)))
        for argnum in range(3):
            close(
                jax.jit(jax.grad(loss(ours), argnum))(d, u, b),
                jax.grad(loss(dense), argnum)(d, u, b),
            )
        # The transforms of `ours` below run under `jax.jit` too, as those above:
        # one compiled program each, where run eagerly each of the rule's
        # operations compiled on its own. The rule, its `vmap`s and its
        # derivatives are traced the same way; the eager solve (the fallback's
        # route included) is compared with `jax.jit`'s in test_host_fallback.py.
        over_b = (None, None, 0)
        close(
            jax.jit(jax.vmap(ours, over_b))(d, u, bs),
            jax.vmap(dense, over_b)(d, u, bs),
        )
        inner = quax.quaxify(jax.vmap(jnp.linalg.solve, (None, 0)))
        close(
            jax.jit(inner)(qs.LowRankPlusDiagonal(d, u, v), bs),
            jax.vmap(dense, over_b)(d, u, bs),
        )
        ds, us = jnp.stack([d, 2 * d]), jnp.stack([u, -u])
        close(jax.jit(jax.vmap(ours))(ds, us, bs[:2]), jax.vmap(dense)(ds, us, bs[:2]))
        total = lambda f: lambda d, u, bs: jnp.sum(jax.vmap(f, over_b)(d, u, bs) ** 2)
        close(
            jax.jit(jax.grad(total(ours), 1))(d, u, bs),
            jax.grad(total(dense), 1)(d, u, bs),
        )
        per_b = jax.jit(jax.vmap(jax.grad(loss(ours), 0), over_b))(d, u, bs)
        close(per_b, jax.vmap(jax.grad(loss(dense), 0), over_b)(d, u, bs))


@pytest.mark.float64
def test_solve_rule_tridiagonal_and_banded():
    """The rule covers every matrix with `pivoted_solve`: a tridiagonal and a
    banded matrix with a zero leading pivot (an LU without pivoting fails),
    value and gradient against dense."""
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        n = 6
        lower, upper = (jnp.asarray(rng.normal(size=n - 1)) for _ in range(2))
        main = jnp.asarray(rng.normal(size=n)).at[0].set(0.0)
        b = jnp.asarray(rng.normal(size=n))
        solve = quax.quaxify(jnp.linalg.solve)
        tri = lambda main, b: solve(qs.TridiagonalMatrix(lower, main, upper), b)
        dense = lambda main, b: jnp.linalg.solve(
            jnp.diag(lower, -1) + jnp.diag(main) + jnp.diag(upper, 1), b
        )
        close = ft.partial(np.testing.assert_allclose, rtol=1e-10, atol=1e-12)
        close(jax.jit(tri)(main, b), dense(main, b))
        loss = lambda f: lambda m, b: jnp.sum(jnp.sin(f(m, b)))
        for argnum in range(2):
            close(
                jax.grad(loss(tri), argnum)(main, b),
                jax.grad(loss(dense), argnum)(main, b),
            )
        bands = jnp.asarray(rng.normal(size=(4, n))).at[1, 0].set(0.0)
        banded = qs.Banded(bands, 1, 2)
        close(jax.jit(solve)(banded, b), jnp.linalg.solve(banded.dense(), b))


def test_solve_compiles_to_cholesky_without_the_lu_plumbing():
    """The compiled `jnp.linalg.solve` of a symmetric `LowRankPlusDiagonal`:
    `potrf` for the capacitance outside the fallback branch, `getrf` only
    inside it (on the CPU backend not in the program at all: the fallback is a
    program of its own, see `tests/test_host_fallback.py`), and no gather (the
    identity permutation of `lu`)."""
    d = jnp.linspace(1.0, 2.0, 64)
    u = jnp.sin(jnp.arange(64.0 * 3).reshape(64, 3))
    args = (qs.LowRankPlusDiagonal(d, u), d)
    for in_graph in (False, True):
        with qs.in_graph_fallbacks() if in_graph else contextlib.nullcontext():
            hlo = quax.testing.compiled_hlo(jnp.linalg.solve, *args)
        entry = hlo[hlo.index("\nENTRY") :]
        entry = entry[: entry.index("\n}")]
        assert "potrf" in entry
        assert "getrf" not in entry and ("getrf" in hlo) == in_graph
        assert "gather" not in entry


def test_vmap_decides_the_branch_once_for_the_batch():
    """Under `vmap` (over right-hand sides or over matrices) the compiled solve
    keeps its `lax.cond` (one decision for the batch: Woodbury alone where
    every system passes its check), not a select running the LU every call;
    a batch where one system needs the fallback is accurate in every system."""
    bs = jnp.stack([_B, 2 * _B[::-1], jnp.ones(4)])
    solve = quax.quaxify(jnp.linalg.solve)
    pair = jax.tree.map(lambda x: jnp.stack([x, x]), _benign())
    for fn, args in (
        (jax.vmap(solve, (None, 0)), (_benign(), bs)),
        (jax.vmap(solve), (pair, bs[:2])),
    ):
        hlo = jax.jit(fn).lower(*args).compile().as_text()
        assert hlo is not None
        entry = hlo[hlo.index("\nENTRY") :]
        assert "conditional(" in entry[: entry.index("\n}")]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), _benign(), _cancelling())
    xs = jax.jit(jax.vmap(_solve))(stacked, bs[:2])
    for matrix, b, x in zip((_benign(), _cancelling()), bs[:2], xs, strict=True):
        _assert_accurate(matrix, b, x)
    xs = jax.jit(jax.vmap(_solve, (None, 0)))(_cancelling(), bs)
    for b, x in zip(bs, xs, strict=True):
        _assert_accurate(_cancelling(), b, x)


_slogdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_slogdet_rule_against_dense(dtype, symmetric):
    """`jnp.linalg.slogdet` of a `LowRankPlusDiagonal` (a registered rule, the
    lemma's `n + r` numbers read in one reduction): sign and log-determinant
    against NumPy's on the dense matrix, a negative determinant, the fallback
    (`_cancelling`), the positive definite tag, and `det` (the body, through
    `pivots`)."""
    with jax.enable_x64(dtype == jnp.float64):
        eps = float(jnp.finfo(dtype).eps)
        d = jnp.array([2.0, -1.0, 3.0, 1.5], dtype)
        u = jnp.array([[0.5, 0.2], [1.0, -0.5], [0.3, 1.0], [-0.4, 0.6]], dtype)
        v = None if symmetric else u[::-1] * 0.7
        cases = [qs.LowRankPlusDiagonal(d, u, v), _benign(dtype), _cancelling(dtype)]
        if dtype == jnp.complex64:
            cases.append(qs.LowRankPlusDiagonal(d * 1j, u * (1 + 0.5j), v))
        for m in cases:
            sign, logdet = _slogdet(m)
            want_sign, want_logdet = np.linalg.slogdet(
                np.asarray(m.enable_materialise().dense(), np.complex128)
            )
            np.testing.assert_allclose(sign, want_sign, rtol=100 * eps, atol=100 * eps)
            np.testing.assert_allclose(
                logdet, want_logdet, rtol=100 * eps, atol=100 * eps
            )
            det = jax.jit(quax.quaxify(jnp.linalg.det))(m)
            np.testing.assert_allclose(
                det, want_sign * np.exp(want_logdet), rtol=1e3 * eps
            )
        tagged = qs.LowRankPlusDiagonal(jnp.abs(d), u, positive_definite=True)
        sign, logdet = _slogdet(tagged)
        want_sign, want_logdet = np.linalg.slogdet(
            np.asarray(tagged.enable_materialise().dense())
        )
        np.testing.assert_allclose(sign, want_sign, rtol=100 * eps)
        np.testing.assert_allclose(logdet, want_logdet, rtol=100 * eps, atol=100 * eps)


@pytest.mark.float64
def test_slogdet_rule_zero_and_gradients():
    """A singular matrix (`V` picks the first row of `D⁻¹ U`, which is `-e₀`, so
    that `K = I + Vᵀ D⁻¹ U` has a zero row): sign 0 and `-inf`, as dense JAX
    (Woodbury fails, the fallback's pivoted lemma gives finite numbers with a
    zero product); `jax.grad` of the log-determinant with respect to `diag` and
    `U` against dense JAX's."""
    with jax.enable_x64(True):
        d = jnp.array([2.0, 1.0, 3.0, 1.5])
        u = jnp.array([[0.5, 0.2], [1.0, -0.5], [0.3, 1.0], [-0.4, 0.6]])
        v = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
        u0 = u.at[0].set(jnp.array([-2.0, 0.0]))
        m = qs.LowRankPlusDiagonal(d, u0, v)
        want_sign, want_logdet = np.linalg.slogdet(
            np.asarray(m.enable_materialise().dense())
        )
        assert want_sign == 0 and want_logdet == -np.inf
        sign, logdet = _slogdet(m)
        assert sign == 0 and logdet == -np.inf

        def ours(d, u):
            return quax.quaxify(lambda m: jnp.linalg.slogdet(m)[1])(
                qs.LowRankPlusDiagonal(d, u)
            )

        def dense(d, u):
            return jnp.linalg.slogdet(jnp.diag(d) + u @ u.T)[1]

        for got, want in zip(
            jax.jit(jax.grad(ours, (0, 1)))(d, u),
            jax.grad(dense, (0, 1))(d, u),
            strict=True,
        ):
            np.testing.assert_allclose(got, want, rtol=1e-10)


def test_slogdet_compiles_without_the_lu_plumbing():
    """The compiled `slogdet` of a symmetric `LowRankPlusDiagonal`: one
    conditional (the fallback) and no gather outside it; the body's `lu` read
    the pivots through a second conditional and a gather, and `jnp.diagonal` of
    the Cholesky factor is a gather too."""
    d = jnp.linspace(1.0, 2.0, 64)
    u = jnp.sin(jnp.arange(64.0 * 3).reshape(64, 3))
    hlo = quax.testing.compiled_hlo(jnp.linalg.slogdet, qs.LowRankPlusDiagonal(d, u))
    entry = hlo[hlo.index("\nENTRY") :]
    entry = entry[: entry.index("\n}")]
    assert entry.count("conditional(") == 1
    assert "gather" not in entry


@pytest.mark.parametrize("columns", [None, 3])
def test_stacked_sums_under_vmap_in_every_batching(columns):
    """The check's sums (`stacked_sums`): alone, and under `vmap` with the
    vectors batched and the rows not (a solve over right-hand sides: the rows
    are then summed once, apart), with both batched, and with the rows alone
    batched, the sums of plain NumPy."""
    rng = np.random.default_rng(0)
    shape = (5,) if columns is None else (5, columns)
    vectors = tuple(
        jnp.asarray(rng.normal(size=(4, *shape)), jnp.float32) for _ in range(3)
    )
    rows = tuple(jnp.asarray(rng.normal(size=(4, 5)), jnp.float32) for _ in range(2))

    def want(vs, rs):
        v = np.stack([np.sum(np.asarray(x, np.float64), axis=0) for x in vs])
        return v, np.array([np.sum(np.asarray(r, np.float64)) for r in rs])

    def check(got, vs, rs):
        for g, w in zip(got, want(vs, rs), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

    check(
        stacked_sums(tuple(v[0] for v in vectors), tuple(r[0] for r in rows)),
        [v[0] for v in vectors],
        [r[0] for r in rows],
    )
    both = jax.jit(jax.vmap(stacked_sums))(vectors, rows)
    unbatched_rows = jax.jit(jax.vmap(stacked_sums, in_axes=(0, None)))(
        vectors, tuple(r[0] for r in rows)
    )
    unbatched_vectors = jax.jit(jax.vmap(stacked_sums, in_axes=(None, 0)))(
        tuple(v[0] for v in vectors), rows
    )
    for i in range(4):
        check((both[0][i], both[1][i]), [v[i] for v in vectors], [r[i] for r in rows])
        check(
            (unbatched_rows[0][i], unbatched_rows[1][i]),
            [v[i] for v in vectors],
            [r[0] for r in rows],
        )
        check(
            (unbatched_vectors[0][i], unbatched_vectors[1][i]),
            [v[0] for v in vectors],
            [r[i] for r in rows],
        )
