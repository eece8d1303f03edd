"""The parallel tridiagonal solve (cyclic reduction, the GPU and TPU path; issue
46, item 4), forced on the CPU with `quax_structured.tridiagonal_solver
("parallel")`: against NumPy's dense solve in float64 and against
`lax.linalg.tridiagonal_solve`, in float32, float64 and complex64; batches
(`vmap`, batch axes), `n` not a power of two and `n = 1, 2, 3`; gradients; the
check that sends a system it solves inaccurately to the sequential solve; and
the program each setting compiles to."""

import re

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_structured as qs
import scipy.linalg
from quax_structured._kernels import parallel_tridiagonal_solve
from quax_structured._kernels._tridiagonal import TOLERANCE, _cyclic_reduction


SIZES = [1, 2, 3, 5, 8, 100, 4097]


def _diagonals(n, dtype, seed=0, dominant=True, batch=()):
    rng = np.random.default_rng(seed)
    shape = (*batch, n)
    lower, upper = rng.standard_normal(shape), rng.standard_normal(shape)
    main = rng.standard_normal(shape)
    if dominant:
        main = np.sign(main) * (np.abs(lower) + np.abs(upper) + 0.5 + np.abs(main))
    if np.issubdtype(dtype, np.complexfloating):
        lower = lower + 0.5j * rng.standard_normal(shape)
        upper = upper - 0.5j * rng.standard_normal(shape)
    return lower, main, upper


def _matrix(lower, main, upper, dtype):
    """The `TridiagonalMatrix` of the diagonals (the off-diagonals' last entry
    dropped)."""
    return qs.TridiagonalMatrix(
        *(jnp.asarray(v, dtype) for v in (lower[..., :-1], main, upper[..., :-1]))
    )


def _lax(lower, main, upper, dtype):
    """The diagonals in `lax.linalg.tridiagonal_solve`'s convention (`dl[i] =
    A[i, i - 1]`, `du[i] = A[i, i + 1]`) for the matrix `_dense` writes out."""
    dl = np.concatenate([np.zeros_like(lower[..., :1]), lower[..., :-1]], axis=-1)
    return jnp.asarray(dl, dtype), jnp.asarray(main, dtype), jnp.asarray(upper, dtype)


def _dense(lower, main, upper):
    """The dense matrix in float64 (complex128), written out by NumPy."""
    n = main.shape[-1]
    out = np.zeros((*main.shape[:-1], n, n), np.result_type(lower, main, np.float64))
    i = np.arange(n)
    out[..., i, i] = main
    out[..., i[1:], i[:-1]] = lower[..., :-1]
    out[..., i[:-1], i[1:]] = upper[..., :-1]
    return out


def _banded_solve(lower, main, upper, b):
    """`x` of `A x = b` for the matrix `_dense` writes out, in float64
    (complex128), by SciPy's banded LU with partial pivoting (LAPACK's `gbsv`):
    as accurate as NumPy's dense solve on these diagonally dominant systems, in
    O(n) instead of O(n³) (NumPy's dense solve took seconds at n = 4,097)."""
    n = main.shape[-1]
    b = np.asarray(b)
    bands = np.zeros((3, n), np.result_type(lower, main, upper, b, np.float64))
    bands[0, 1:] = upper[:-1]
    bands[1] = main
    bands[2, :-1] = lower[:-1]
    return scipy.linalg.solve_banded((1, 1), bands, b.astype(bands.dtype))


def _rhs(shape, dtype, seed=1):
    rng = np.random.default_rng(seed)
    b = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        b = b + 1j * rng.standard_normal(shape)
    return jnp.asarray(b, dtype)


def _tolerance(dtype) -> float:
    """The relative and absolute tolerance of a comparison: `64 eps`."""
    return 64 * float(np.finfo(dtype).eps)


def _solve(t, b):
    return jnp.linalg.solve(t, b)


# float32 repeats float64's check (the same code, real arithmetic) at single
# precision's tolerance, which complex64 checks too, with conjugation besides: a sweep.
@pytest.mark.parametrize(
    "dtype",
    [pytest.param(np.float32, marks=pytest.mark.sweep), np.float64, np.complex64],
)
# Sizes 2, 8 and 100 repeat what 1, 3, 5 and 4,097 check (a trivial system, odd
# sizes, several levels of reduction): sweeps (`bash scripts/test.sh sweeps`).
@pytest.mark.parametrize(
    "n",
    [
        pytest.param(n, marks=pytest.mark.sweep) if n in (2, 8, 100) else n
        for n in SIZES
    ],
)
def test_parallel_solve_matches_dense_and_lax(dtype, n, x64):
    lower, main, upper = _diagonals(n, dtype)
    t = _matrix(lower, main, upper, dtype)
    b = _rhs((n, 3), dtype)
    with qs.tridiagonal_solver("parallel"):
        got = jax.jit(quax.quaxify(_solve))(t, b)
    with qs.tridiagonal_solver("sequential"):
        sequential = jax.jit(quax.quaxify(_solve))(t, b)
    want = _banded_solve(lower, main, upper, b)
    assert got.dtype == dtype
    np.testing.assert_allclose(
        got, want, rtol=_tolerance(dtype), atol=_tolerance(dtype)
    )
    np.testing.assert_allclose(
        got, sequential, rtol=_tolerance(dtype), atol=_tolerance(dtype)
    )
    # Cyclic reduction itself (not its check's fallback) gave the answer.
    dl, d, du = _lax(lower, main, upper, dtype)
    unchecked = jnp.swapaxes(
        _cyclic_reduction(dl, d, du, jnp.swapaxes(b, -1, -2)), -1, -2
    )
    np.testing.assert_allclose(
        unchecked, want, rtol=_tolerance(dtype), atol=_tolerance(dtype)
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_error_as_small_as_lapack(dtype, x64):
    """Dominant systems at n = 4,096: the normwise backward error of cyclic
    reduction (unchecked; computed in float64 from the leaves) below `eps`, as
    LAPACK's `gtsv` (the sequential path on the CPU), and on the `[-1, 2, -1]`
    Laplacian below `16 eps`."""
    eps = np.finfo(dtype).eps
    n = 4096
    systems = [_diagonals(n, dtype, seed=s) for s in range(3)]
    ones = np.ones(n)
    systems.append((-ones, 2 * ones, -ones))
    for k, (lower, main, upper) in enumerate(systems):
        b = _rhs((n, 1), dtype, seed=k)
        dl, d, du = _lax(lower, main, upper, dtype)
        # Cyclic reduction itself, unchecked.
        x = np.asarray(_cyclic_reduction(dl, d, du, b.T).T, np.float64)
        a = _dense(
            *(np.asarray(v, dtype).astype(np.float64) for v in (lower, main, upper))
        )
        b64 = np.asarray(b, np.float64)
        error = np.max(np.abs(b64 - a @ x)) / (
            np.max(np.abs(a).sum(1)) * np.max(np.abs(x)) + np.max(np.abs(b64))
        )
        assert error <= (16 if k == 3 else 1) * eps, (k, error / eps)


def test_batch_axes_vmap_and_vectors(x64):
    """A `TridiagonalMatrix` with batch axes, `jax.vmap` over systems and over
    right-hand sides, and a vector right-hand side."""
    dtype = np.float64
    lower, main, upper = _diagonals(37, dtype, batch=(4,))
    t = _matrix(lower, main, upper, dtype)
    b = _rhs((4, 37, 2), dtype)
    want = np.linalg.solve(_dense(lower, main, upper), np.asarray(b))
    with qs.tridiagonal_solver("parallel"):
        batched = jax.jit(quax.quaxify(_solve))(t, b)
        mapped = jax.jit(jax.vmap(quax.quaxify(_solve)))(t, b)
        vectors = jax.jit(
            jax.vmap(quax.quaxify(_solve), in_axes=(None, 1), out_axes=1)
        )(_matrix(lower[0], main[0], upper[0], dtype), b[0])
    for got in (batched, mapped):
        np.testing.assert_allclose(
            got, want, rtol=_tolerance(dtype), atol=_tolerance(dtype)
        )
    np.testing.assert_allclose(
        vectors, want[0], rtol=_tolerance(dtype), atol=_tolerance(dtype)
    )


def _loss(t, b):
    x = jnp.linalg.solve(t, b)
    return jnp.sum(x * jnp.cos(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)))


# Sizes 2 and 64 repeat what 1, 3 and 513 check: sweeps.
@pytest.mark.parametrize(
    "n",
    [
        1,
        pytest.param(2, marks=pytest.mark.sweep),
        3,
        pytest.param(64, marks=pytest.mark.sweep),
        513,
    ],
)
def test_gradients_as_the_sequential_solve(n, x64):
    """`jax.grad` w.r.t. the three diagonals and `b` (the reverse pass solves
    with `Tᵀ`), and `jax.jvp`, against the sequential path and dense JAX."""
    dtype = np.float64
    lower, main, upper = _diagonals(n, dtype, seed=3)
    t = _matrix(lower, main, upper, dtype)
    b = _rhs((n, 2), dtype, seed=4)
    grad = jax.jit(jax.grad(quax.quaxify(_loss), argnums=(0, 1)))
    with qs.tridiagonal_solver("parallel"):
        got_t, got_b = grad(t, b)
        tangent = jax.tree.map(jnp.ones_like, t)
        _, got_jvp = jax.jvp(quax.quaxify(_loss), (t, b), (tangent, b))
    with qs.tridiagonal_solver("sequential"):
        want_t, want_b = grad(t, b)
        _, want_jvp = jax.jvp(quax.quaxify(_loss), (t, b), (tangent, b))
    dense_b = jax.grad(_loss, argnums=1)(jnp.asarray(_dense(lower, main, upper)), b)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_b, dense_b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_jvp, want_jvp, rtol=1e-12, atol=1e-12)
    for g, w in zip(jax.tree.leaves(got_t), jax.tree.leaves(want_t), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("trans", [0, 1, 2])
def test_lu_solve_transposed_and_conjugated(trans, x64):
    dtype = np.complex128
    lower, main, upper = _diagonals(33, dtype, seed=5)
    t = _matrix(lower, main, upper, dtype)
    b = _rhs((33, 2), dtype, seed=6)
    a = _dense(lower, main, upper)
    op = [a, a.T, a.conj().T][trans]
    with qs.tridiagonal_solver("parallel"):
        got = quax.quaxify(lambda t, b: jsl.lu_solve(jsl.lu_factor(t), b, trans=trans))(
            t, b
        )
    np.testing.assert_allclose(got, np.linalg.solve(op, np.asarray(b)), rtol=1e-12)


@pytest.mark.parametrize("trans", [0, 1])
def test_gradient_through_lu_solve_transposes_the_parallel_solve(trans, x64):
    """`jax.grad` through `lu_solve` differentiates the parallel solve itself
    (`jnp.linalg.solve` wraps it in its own linear solve): its transposition is
    the solve with `Tᵀ` (with `T` for `trans=1`), against dense JAX."""
    lower, main, upper = _diagonals(40, np.float64, seed=10)
    t = _matrix(lower, main, upper, np.float64)
    b = _rhs((40, 2), np.float64, seed=11)

    def loss(t, b):
        x = jsl.lu_solve(jsl.lu_factor(t), b, trans=trans)
        return jnp.sum(x * jnp.cos(jnp.arange(x.size).reshape(x.shape)))

    with qs.tridiagonal_solver("parallel"):
        got_t, got_b = jax.jit(jax.grad(quax.quaxify(loss), argnums=(0, 1)))(t, b)
    a = jnp.asarray(_dense(lower, main, upper))
    want_a, want_b = jax.grad(loss, argnums=(0, 1))(a, b)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-11, atol=1e-12)
    for k, field in ((-1, "lower_diag"), (0, "main_diag"), (1, "upper_diag")):
        np.testing.assert_allclose(
            getattr(got_t, field), jnp.diagonal(want_a, k), rtol=1e-10, atol=1e-12
        )


def test_check_sends_a_pivoting_system_to_the_sequential_solve(x64):
    """A regular matrix whose diagonal is zero in places (every 2 x 2 block
    `[[0, 1], [1, 0]]` at the start, which only pivoting solves): cyclic
    reduction divides by zero; its check sends the batch to
    `lax.linalg.tridiagonal_solve` (LAPACK's pivoted `gtsv` here), whose answer
    is returned."""
    n = 64
    rng = np.random.default_rng(7)
    main = 4 + rng.uniform(size=n)
    main[:4] = 0
    lower, upper = np.ones(n), np.ones(n)
    t = _matrix(lower, main, upper, np.float64)
    b = _rhs((n, 1), np.float64)
    dl, d, du = (jnp.asarray(v) for v in (lower, main, upper))
    unchecked = jax.jit(
        lambda b: jnp.swapaxes(
            _cyclic_reduction(dl, d, du, jnp.swapaxes(b, -1, -2)), -1, -2
        )
    )(b)
    assert not np.all(np.isfinite(unchecked))
    with qs.tridiagonal_solver("parallel"):
        got = jax.jit(quax.quaxify(_solve))(t, b)
    want = np.linalg.solve(_dense(lower, main, upper), np.asarray(b))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(
        got, jax.lax.linalg.tridiagonal_solve(dl.at[0].set(0), d, du.at[-1].set(0), b)
    )


def test_check_sends_an_inaccurate_answer_to_the_sequential_solve(x64):
    """A random system without dominance on which cyclic reduction gives a
    finite answer of backward error 1,783 eps on an AVX-512 CPU, 843 eps on an
    AVX2 one (XLA sums in another order), far above the check's bound of
    `TOLERANCE * (⌈log₂ n⌉ + 1) = 44` eps (the sweep with pivoting: below one):
    the check returns the sequential solve's instead."""
    n = 1000
    rng = np.random.default_rng(0)
    lower, upper, main = (
        rng.standard_normal(n),
        rng.standard_normal(n),
        rng.standard_normal(n),
    )
    b = jnp.asarray(rng.standard_normal((n, 1)))
    a = _dense(lower, main, upper)
    eps = np.finfo(np.float64).eps

    def error(x):
        x = np.asarray(x)
        return np.max(np.abs(np.asarray(b) - a @ x)) / (
            np.max(np.abs(a).sum(1)) * np.max(np.abs(x)) + np.max(np.abs(b))
        )

    dl, d, du = _lax(lower, main, upper, np.float64)
    unchecked = _cyclic_reduction(dl, d, du, b.T).T
    bound = TOLERANCE * (int(np.ceil(np.log2(n))) + 1) * eps
    assert np.all(np.isfinite(unchecked)) and error(unchecked) > 10 * bound
    t = _matrix(lower, main, upper, np.float64)
    with qs.tridiagonal_solver("parallel"):
        got = jax.jit(quax.quaxify(_solve))(t, b)
    assert error(got) <= eps


def test_check_inside_a_batch_keeps_every_system_right(x64):
    """One system of a `vmap` batch fails the check: the whole batch is solved
    sequentially (the branch stays a branch), every answer right."""
    n = 16
    lower, main, upper = _diagonals(n, np.float64, batch=(3,), seed=8)
    main[1, :2] = 0
    t = _matrix(lower, main, upper, np.float64)
    b = _rhs((3, n, 1), np.float64)
    with qs.tridiagonal_solver("parallel"):
        got = jax.jit(jax.vmap(quax.quaxify(_solve)))(t, b)
    want = np.linalg.solve(_dense(lower, main, upper), np.asarray(b))
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


def test_kernel_takes_lax_convention():
    """`parallel_tridiagonal_solve` reads the diagonals as
    `lax.linalg.tridiagonal_solve` does: `dl[0]` and `du[n - 1]` ignored."""
    n = 6
    lower, main, upper = _diagonals(n, np.float32, seed=9)
    dl, d, du = (jnp.asarray(v, jnp.float32) for v in (lower, main, upper))
    b = _rhs((n, 1), np.float32)
    got = parallel_tridiagonal_solve(dl.at[0].set(7.0), d, du.at[-1].set(-3.0), b)
    want = jax.lax.linalg.tridiagonal_solve(dl.at[0].set(0), d, du.at[-1].set(0), b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_setting_retraces_and_picks_the_program():
    """`auto` on the CPU compiles LAPACK's `gtsv` alone, as `sequential` does;
    `parallel` compiles the cyclic reduction (the loop of its steps), with
    `gtsv` only in the fallback branch of its check; each setting traces the function
    again; a bad method is refused."""
    lower, main, upper = _diagonals(64, np.float32)
    t = _matrix(lower, main, upper, np.float32)
    b = _rhs((64, 1), np.float32)
    fn = jax.jit(quax.quaxify(_solve))
    auto = fn.lower(t, b).compile().as_text()
    with qs.tridiagonal_solver("parallel"):
        parallel = fn.lower(t, b).compile().as_text()
    with qs.tridiagonal_solver("sequential"):
        sequential = fn.lower(t, b).compile().as_text()
    assert auto is not None and parallel is not None and sequential is not None
    for text in (auto, sequential):
        assert text.count("gtsv") == 1
        assert "conditional" not in text and "while" not in text
    assert parallel.count("gtsv") == 1 and parallel.count("conditional") == 1
    assert "while" in parallel and "divide" in parallel  # the steps' loop
    with (
        pytest.raises(ValueError, match="'parallel'"),
        qs.tridiagonal_solver(
            "fast"  # pyright: ignore[reportArgumentType]
        ),
    ):
        pass


def test_lowers_for_tpu_without_gtsv():
    """Lowered for TPU (here, on the CPU), `auto` holds no LAPACK call: the
    parallel path, with JAX's sequential sweep in its fallback branch."""
    lower, main, upper = _diagonals(64, np.float32)
    t = _matrix(lower, main, upper, np.float32)
    b = _rhs((64, 1), np.float32)
    fn = jax.jit(quax.quaxify(_solve))
    tpu = jax.export.export(fn, platforms=["tpu"])(t, b).mlir_module()
    cpu = jax.export.export(fn, platforms=["cpu"])(t, b).mlir_module()
    calls = lambda text: set(re.findall(r"custom_call @(\w+)", text))
    assert not any("gtsv" in c for c in calls(tpu))
    assert any("gtsv" in c for c in calls(cpu))
    assert "stablehlo.while" in tpu  # the fallback's sweep
