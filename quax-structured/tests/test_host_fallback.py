"""`checked_or_fallback`: on the CPU backend, the fallback of
`LowRankPlusDiagonal`'s solve and determinant (the semiseparable LU, loops) runs
on the host, in NumPy, through one custom call, so that the main program holds
no loop and no host callback. Where the fallback is taken, its answers must
equal the dense ones and those of the fallback kept in the program
(`in_graph_fallbacks`): under `jit` and eagerly, under `vmap` in both orders
with mixed batches, in loop bodies, in float64, from many threads at once; its
derivatives must be the dense ones; and NaN stays NaN."""

import json
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
import pytest
import quax
import quax.testing
import quax_structured as qs
from quax_structured import in_graph_fallbacks
from quax_structured._kernels import (
    Fallback,
    _lowrank_host,
    checked_or_fallback,
    host_determinant_fallback,
    host_solve_fallback,
)
from quax_structured._values import _lowrank


_solve = jax.jit(quax.quaxify(jnp.linalg.solve))
_slogdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))

_U = np.array([[1.0, 0.2], [1.0, -0.5], [0.3, 1.0], [-0.4, 0.6], [0.2, 0.1]])
_B = np.array([1.0, -2.0, 0.5, 3.0, -1.0])


def _tiny(dtype=jnp.float32) -> qs.LowRankPlusDiagonal:
    """Well conditioned, but `d₀ = 1e-6`: Woodbury cancels (its check says no),
    the semiseparable LU is accurate."""
    d = jnp.array([1e-6, 1.0, 2.0, 1.5, 3.0], dtype)
    return qs.LowRankPlusDiagonal(d, jnp.asarray(_U, dtype))


def _indefinite(dtype=jnp.float32) -> qs.LowRankPlusDiagonal:
    """Negative entries of `diag`: the capacitance `I + Uᵀ D⁻¹ U` is not positive
    definite (its Cholesky factor fails, NaN), Woodbury with `K` pivoted and the
    LU are accurate."""
    d = jnp.array([-0.5, 1.0, -2.0, 1.5, 3.0], dtype)
    return qs.LowRankPlusDiagonal(d, jnp.asarray(_U, dtype))


def _benign(dtype=jnp.float32) -> qs.LowRankPlusDiagonal:
    d = jnp.array([2.0, 1.0, 3.0, 1.5, 2.5], dtype)
    return qs.LowRankPlusDiagonal(d, jnp.asarray(_U, dtype))


def _dense(m: qs.LowRankPlusDiagonal) -> np.ndarray:
    return np.diag(np.asarray(m.diag, np.float64)) + (
        np.asarray(m.u, np.float64) @ np.asarray(m.u, np.float64).T
    )


def _stack(*ms):
    return jax.tree.map(lambda *x: jnp.stack(x), *ms)


def _close(got, want, dtype: npt.DTypeLike = np.float32, scale=100.0):
    tol = quax.testing.tolerance(np.dtype(dtype))
    exact = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want) else float
    np.testing.assert_allclose(
        np.asarray(got, exact),
        np.asarray(want, exact),
        rtol=tol["rtol"] * scale,
        atol=tol["atol"] * scale,
    )


def _fallback_taken(m: qs.LowRankPlusDiagonal, b) -> bool:
    b = jnp.asarray(b, m.dtype)
    return not bool(m._woodbury_accurate(b, *m._woodbury_steps(b)))


@pytest.mark.parametrize("make", [_tiny, _indefinite])
def test_taken_fallback_matches_dense_and_the_in_graph_route(make):
    m, b = make(), jnp.asarray(_B, jnp.float32)
    assert _fallback_taken(m, b)  # the case is meaningful
    want = np.linalg.solve(_dense(m), _B)
    got = _solve(m, b)
    _close(got, want)
    # The same answer eagerly and with the fallback kept in the program (a
    # function traced afresh under the setting).
    _close(quax.quaxify(jnp.linalg.solve)(m, b), got, scale=1.0)
    with in_graph_fallbacks():
        in_graph = jax.jit(quax.quaxify(jnp.linalg.solve))(m, b)
    _close(in_graph, got, scale=1.0)
    # Several right-hand sides (a matrix `b`).
    bs = jnp.stack([b, -2 * b[::-1]], axis=1)
    _close(_solve(m, bs), np.linalg.solve(_dense(m), np.asarray(bs, np.float64)))
    # The determinant through its fallback.
    sign, logdet = _slogdet(m)
    want_sign, want_logdet = np.linalg.slogdet(_dense(m))
    assert sign == want_sign
    _close(logdet, want_logdet)


def test_a_zero_leading_pivot_nan_in_the_program_solved_on_the_host():
    """`d₀ = 0` (Woodbury divides by it) and `A₀₀ = 0` (the LU without pivoting
    fails at its first pivot), though `A` is invertible: NaN in the program,
    never an inaccurate answer; the host's LU pivots within its blocks of rows
    and answers accurately (its backward error checked as the program's)."""
    d = jnp.array([0.0, 1.0, 1.0, 2.0])
    u = jnp.array([[1.0, 0.0], [0.5, 1.0], [0.0, 1.0], [1.0, 0.5]])
    v = jnp.array([[0.0, 1.0], [1.0, 0.5], [0.3, 0.0], [0.0, 1.0]])
    m = qs.LowRankPlusDiagonal(d, u, v)
    dense = np.diag(d) + u @ v.T
    assert np.linalg.cond(dense) < 100
    b = jnp.array([1.0, 2.0, -1.0, 0.5])
    _close(_solve(m, b), np.linalg.solve(np.asarray(dense, np.float64), b))
    sign, logdet = _slogdet(m)
    want_sign, want_logdet = np.linalg.slogdet(np.asarray(dense, np.float64))
    assert sign == want_sign
    _close(logdet, want_logdet)
    with in_graph_fallbacks():
        assert np.all(np.isnan(jax.jit(quax.quaxify(jnp.linalg.solve))(m, b)))


def _block_singular() -> tuple[jax.Array, ...]:
    """`diag`, `u`, `v` and `b` (float32) of a regular matrix (n = 2 BLOCK,
    rank 2) whose first block of rows is singular and whose `d₀ = 0`."""
    block, rng = _lowrank_host.BLOCK, np.random.default_rng(0)
    n = 2 * block
    d = 1 + rng.random(n)
    d[0] = 0.0
    u = rng.standard_normal((n, 2))
    u[0] = [1.0, 0.0]
    v = rng.standard_normal((n, 2))
    v[:block, 0] = 0.0
    b = rng.standard_normal(n)
    return tuple(jnp.asarray(y, jnp.float32) for y in (d, u, v, b))


def test_nan_where_every_candidate_fails():
    """A regular matrix whose first block of `BLOCK` rows is singular (row 0
    of it is zero: `d₀ = 0` and `u₀` orthogonal to the block's rows of `V`) and
    whose `d₀ = 0` stops Woodbury: NaN through the host and in the program,
    never an inaccurate answer."""
    d, u, v, b = _block_singular()
    dense = np.diag(np.asarray(d, np.float64)) + np.asarray(u @ v.T, np.float64)
    assert np.linalg.cond(dense) < 1e5
    assert not np.any(dense[0, : _lowrank_host.BLOCK])
    m = qs.LowRankPlusDiagonal(d, u, v)
    assert np.all(np.isnan(_solve(m, b)))
    assert np.isnan(_slogdet(m)[1])
    with in_graph_fallbacks():
        assert np.all(np.isnan(jax.jit(quax.quaxify(jnp.linalg.solve))(m, b)))


_HOST_TARGET = r'custom_call_target="quax_structured_host_fallback"'


def test_compiled_cpu_program_holds_the_custom_call_not_the_loops():
    """One custom call to the host's NumPy fallback, no loop, and no host
    callback (`jax.pure_callback` would make JAX run the whole program
    synchronously)."""
    m, b = _benign(), jnp.asarray(_B, jnp.float32)
    for fn, args in ((jnp.linalg.solve, (m, b)), (jnp.linalg.slogdet, (m,))):
        hlo = quax.testing.compiled_hlo(fn, *args)
        assert "while" not in quax.testing.hlo_ops(hlo)
        assert len(re.findall(_HOST_TARGET, hlo)) == 1, fn
        assert "callback" not in hlo, fn
        with in_graph_fallbacks():
            in_graph = quax.testing.compiled_hlo(fn, *args)
        assert "while" in quax.testing.hlo_ops(in_graph)
        assert not re.search(_HOST_TARGET, in_graph)


def test_the_custom_call_names_its_fallback_and_operands():
    """The custom call's configuration is all the host reads besides the
    buffers: the fallback's qualified name and each operand's shape and dtype,
    nothing of this process (an identifier of an object here would point
    elsewhere in a program that JAX's persistent compilation cache reads back
    in another process)."""
    m = _benign()
    bs = jnp.asarray(np.stack([_B, -_B], axis=1), jnp.float32)
    hlo = quax.testing.compiled_hlo(jnp.linalg.solve, m, bs)
    config = re.search(_HOST_TARGET + r".*backend_config=(\{.*\})$", hlo, re.M)
    assert config is not None
    assert json.loads(config.group(1)) == {
        "fallback": "quax_structured._values._lowrank._solve_fallback",
        "leaves": [
            [[5, 2], "float32"],
            [[5], "float32"],
            [[5, 2], "float32"],
            [[5, 2], "float32"],
        ],
    }


def test_gradient_through_the_taken_fallback_is_the_dense_one():
    m, b = _tiny(), jnp.asarray(_B, jnp.float32)

    def loss(diag, u, solve, slogdet):
        a = qs.LowRankPlusDiagonal(diag, u)
        return jnp.sum(solve(a, b) ** 2) + slogdet(a)[1]

    structured = (quax.quaxify(jnp.linalg.solve), quax.quaxify(jnp.linalg.slogdet))
    dense = (
        lambda a, b: jnp.linalg.solve(a.enable_materialise().materialise(), b),
        lambda a: jnp.linalg.slogdet(a.enable_materialise().materialise()),
    )
    got = jax.jit(jax.grad(loss, (0, 1)), static_argnums=(2, 3))(
        m.diag, m.u, *structured
    )
    want = jax.jit(jax.grad(loss, (0, 1)), static_argnums=(2, 3))(m.diag, m.u, *dense)
    for g, w in zip(got, want, strict=True):
        _close(g, w, scale=1000.0)
    # Forward mode agrees with reverse mode.
    tangent = jnp.ones_like(m.diag)
    forward = jax.jit(
        lambda d: jax.jvp(lambda d: loss(d, m.u, *structured), (d,), (tangent,))[1]
    )(m.diag)
    _close(forward, jnp.dot(got[0], tangent), scale=1000.0)


def test_vmap_in_both_orders_with_mixed_batches():
    """One system of each batch takes the fallback: each system still gets its
    own answer (the host vmaps the fallback over the batch's leading axes)."""
    matrices = (_tiny(), _benign(), _indefinite())
    stacked = _stack(*matrices)
    bs = jnp.asarray(np.stack([_B, -_B[::-1], np.arange(5.0)]), jnp.float32)
    wants = [
        np.linalg.solve(_dense(a), np.asarray(b))
        for a, b in zip(matrices, bs, strict=True)
    ]
    solve = quax.quaxify(jnp.linalg.solve)
    _close(jax.jit(jax.vmap(solve))(stacked, bs), np.stack(wants))
    # Over right-hand sides of one matrix whose fallback is taken.
    m = _tiny()
    want = np.linalg.solve(_dense(m), np.asarray(bs, np.float64).T).T
    _close(jax.jit(quax.quaxify(jax.vmap(jnp.linalg.solve, (None, 0))))(m, bs), want)
    # Nested: two leading batch axes, the matrices over one, `b` over the other.
    nested = jax.jit(jax.vmap(jax.vmap(solve, (None, 0)), (0, None)))(stacked, bs)
    for i, a in enumerate(matrices):
        _close(nested[i], np.linalg.solve(_dense(a), np.asarray(bs, np.float64).T).T)
    # The determinants of a mixed batch.
    got = jax.jit(jax.vmap(quax.quaxify(jnp.linalg.slogdet)))(stacked)
    want_sign, want_logdet = zip(
        *(np.linalg.slogdet(_dense(a)) for a in matrices), strict=True
    )
    np.testing.assert_array_equal(got[0], want_sign)
    _close(got[1], want_logdet)


def test_inside_loop_and_branch_bodies():
    stacked = _stack(_tiny(), _benign(), _indefinite())
    b = jnp.asarray(_B, jnp.float32)
    solve = quax.quaxify(jnp.linalg.solve)
    wants = [
        np.linalg.solve(_dense(a), _B) for a in (_tiny(), _benign(), _indefinite())
    ]

    def scanned(stacked, b):
        return jax.lax.scan(lambda c, a: (c, solve(a, b)), 0, stacked)[1]

    _close(jax.jit(scanned)(stacked, b), np.stack(wants))

    def looped(m, b):
        return jax.lax.fori_loop(0, 2, lambda i, x: solve(m, x), b)

    m = _tiny()
    want = np.linalg.solve(_dense(m), np.linalg.solve(_dense(m), _B))
    _close(jax.jit(looped)(m, b), want, scale=1000.0)
    branched = jax.jit(lambda p, m, b: jax.lax.cond(p, solve, lambda m, b: b, m, b))
    _close(branched(True, m, b), wants[0])


def test_float64_in_a_thread_local_x64_block(x64):
    """The host's fallback runs in one of XLA's threads, which does not see the
    caller's `jax.enable_x64` block: it must still compute in float64 (the
    custom call's configuration names each operand's dtype)."""
    m, b = _tiny(jnp.float64), jnp.asarray(_B, jnp.float64)
    assert _fallback_taken(m, b)
    got = _solve(m, b)
    assert got.dtype == jnp.float64
    _close(got, np.linalg.solve(_dense(m), _B), np.float64)


def test_many_threads_taking_the_fallback_at_once():
    """Eight Python threads, each dispatching solves and determinants that take
    the fallback (and some that do not) without waiting between calls: every
    answer is the one a single thread gets, and none waits for another
    forever (the threads are daemons, joined with a timeout: a deadlock fails
    the test rather than hanging the run). The host's fallback ran as a
    compiled JAX program once, and two threads taking it at once deadlocked."""
    matrices = [_tiny(), _indefinite(), _benign(), _tiny()]
    b = jnp.asarray(_B, jnp.float32)
    wants = [(np.asarray(_solve(m, b)), np.asarray(_slogdet(m)[1])) for m in matrices]
    results: dict[int, list] = {}

    def run(worker: int) -> None:
        outs = [(_solve(m, b), _slogdet(m)[1]) for _ in range(10) for m in matrices]
        results[worker] = [(np.asarray(x), np.asarray(y)) for x, y in outs]

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "deadlocked"
    assert sorted(results) == list(range(8))
    for outs in results.values():
        for (x, y), (want_x, want_y) in zip(outs, wants * 10, strict=True):
            np.testing.assert_array_equal(x, want_x)
            np.testing.assert_array_equal(y, want_y)


def _complex(dtype=jnp.complex64) -> qs.LowRankPlusDiagonal:
    """Non-symmetric complex factors and a tiny entry of `diag`: Woodbury
    (its capacitance pivoted) cancels, the LU is accurate."""
    u = jnp.asarray(_U * (1 + 0.5j), dtype)
    v = jnp.asarray(_U[::-1] * (0.3 - 1j), dtype)
    d = jnp.array([1e-6, 1.0 + 1j, 2.0, 1.5, 3.0], dtype)
    return qs.LowRankPlusDiagonal(d, u, v)


@pytest.mark.parametrize("make", [_tiny, _indefinite, _benign, _complex])
@pytest.mark.parametrize("columns", [0, 2])
def test_the_host_twins_compute_the_in_graph_fallbacks(make, columns):
    """`host_solve_fallback` and `host_determinant_fallback`, called on NumPy
    arrays as the custom call calls them, against the JAX fallbacks they
    stand in for (`_solve_fallback`, `_determinant_fallback`) and dense."""
    m = make()
    b = jnp.asarray(_B, m.dtype)
    if columns:
        b = jnp.stack([b, -2 * b[::-1]], axis=1)
    b2 = b if columns else b[:, None]
    woodbury = m._woodbury(b)
    leaves = [np.asarray(y) for y in jax.tree.leaves((woodbury, m, b2))]
    got = host_solve_fallback(*leaves, tolerance=_lowrank._TOLERANCE)
    want = jax.jit(_lowrank._solve_fallback)(woodbury, m, b2)
    assert got.shape == want.shape and got.dtype == want.dtype
    _close(got, want, scale=10.0)
    dense = np.asarray(m.enable_materialise().materialise(), np.complex128)
    _close(got, np.linalg.solve(dense, np.asarray(b, np.complex128)), scale=100.0)

    lemma = m._determinant_factors()
    probe_solve = m._woodbury(_lowrank._probe(m))
    leaves = [np.asarray(y) for y in jax.tree.leaves((lemma, m, probe_solve))]
    got = host_determinant_fallback(*leaves, tolerance=_lowrank._TOLERANCE)
    want = jax.jit(_lowrank._determinant_fallback)(lemma, m, probe_solve)
    assert got.shape == want.shape and got.dtype == want.dtype
    _close(np.prod(got.astype(np.complex128)), np.linalg.det(dense), scale=100.0)
    _close(np.prod(got.astype(np.complex128)), np.prod(want), scale=10.0)


def test_the_host_twin_gives_nan_where_both_candidates_fail():
    """The same matrix as `test_nan_where_every_candidate_fails`, called as the
    custom call calls the twins: NaN of the answer's dtype, and no warning
    from LAPACK's zero pivot (an error under `-W error`)."""
    d, u, v, b = (np.asarray(y) for y in _block_singular())
    woodbury = np.full(d.shape, np.nan, np.float32)
    got = host_solve_fallback(woodbury, d, u, v, b[:, None], tolerance=1024)
    assert got.dtype == np.float32 and np.all(np.isnan(got))
    lemma = np.full(d.shape[0] + 2, np.nan, np.float32)
    got = host_determinant_fallback(lemma, d, u, v, woodbury, tolerance=1024)
    assert got.dtype == np.float32 and np.all(np.isnan(got))


def test_the_host_twin_gives_zero_for_an_exactly_singular_matrix():
    """`diag(1, 1, 1, -1) + e₄ e₄ᵀ` (singular; its capacitance `1 + 1 / -1` is
    exactly 0, where NumPy's solve raises): the determinant's factors multiply
    to 0 (a raised exception became NaN before), in both dtypes."""
    for dtype in (np.float32, np.float64):
        d = np.array([1, 1, 1, -1], dtype)
        u = np.array([[0], [0], [0], [1]], dtype)
        lemma = np.array([1, 1, 1, -1, np.nan], dtype)
        woodbury = np.full(4, np.nan, dtype)
        got = host_determinant_fallback(lemma, d, u, woodbury, tolerance=1024)
        assert got.dtype == dtype and np.all(np.isfinite(got))
        assert np.prod(got) == 0


def _failing_in_graph(fast: jax.Array, scale: jax.Array) -> jax.Array:
    return fast * scale


def _failing_on_host(fast: np.ndarray, scale: np.ndarray) -> np.ndarray:
    raise RuntimeError("a host fallback that fails")


_FAILING = Fallback(_failing_in_graph, _failing_on_host)


def test_a_host_fallback_that_raises_gives_nan():
    """A ctypes callback cannot raise into XLA: an exception on the host fills
    the answer with NaN (never an unwritten buffer), while the fallback kept in
    the program computes its answer."""
    fast, scale = jnp.arange(3.0), jnp.float32(2)

    def f(fast, scale):
        return checked_or_fallback(jnp.array(False), fast, _FAILING, scale)

    assert np.all(np.isnan(jax.jit(f)(fast, scale)))
    with in_graph_fallbacks():
        np.testing.assert_array_equal(jax.jit(f)(fast, scale), [0.0, 2.0, 4.0])
    with pytest.raises(ValueError, match="already registered"):
        Fallback(_failing_in_graph, _failing_on_host)


def test_export_with_the_fallback_in_the_program():
    """`jax.export` refuses the host's custom call (a target with no
    compatibility guarantee); inside `in_graph_fallbacks()` the exported
    program keeps the fallback, and runs it, also after the same `jit` was
    traced outside the block."""
    m, b = _tiny(), jnp.asarray(_B, jnp.float32)
    solve = jax.jit(lambda d, u, b: quax.quaxify(jnp.linalg.solve)(type(m)(d, u), b))
    want = solve(m.diag, m.u, b)
    with pytest.raises(ValueError, match="no compatibility guarantees"):
        jax.export.export(solve)(m.diag, m.u, b)
    with in_graph_fallbacks():
        exported = jax.export.export(solve)(m.diag, m.u, b)
    assert "quax_structured_host_fallback" not in exported.mlir_module()
    _close(exported.call(m.diag, m.u, b), want, scale=1.0)
    # For another backend (lowered here without one), the fallback stays in the
    # program without the setting: only the CPU branch holds the custom call.
    for_gpu = jax.export.export(solve, platforms=["cuda"])(m.diag, m.u, b)
    assert "quax_structured_host_fallback" not in for_gpu.mlir_module()
    assert "while" in for_gpu.mlir_module()
