"""`checked_or_fallback`: on the CPU backend, the fallback of
`LowRankPlusDiagonal`'s solve and determinant (the semiseparable LU, loops) runs
as its own compiled program through a host callback, so that the main program
holds no loop. Where the fallback is taken, its answers must equal the dense
ones and those of the fallback kept in the program (`in_graph_fallbacks`):
under `jit` and eagerly, under `vmap` in both orders with mixed batches, in
loop bodies, in float64, from several threads; its derivatives must be the
dense ones; and NaN stays NaN."""

import concurrent.futures
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from quax_structured import in_graph_fallbacks
from quax_structured._kernels import _fallback


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


def _close(got, want, dtype: Any = np.float32, scale=100.0):
    tol = quax.testing.tolerance(np.dtype(dtype))
    np.testing.assert_allclose(
        np.asarray(got, np.float64),
        np.asarray(want, np.float64),
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


def test_nan_where_both_routes_fail():
    """`d₀ = 0` (Woodbury divides by it) and `A₀₀ = 0` (the LU without pivoting
    fails at its first pivot), though `A` is invertible: NaN, never an
    inaccurate answer, through the host as in the program."""
    d = jnp.array([0.0, 1.0, 1.0, 2.0])
    u = jnp.array([[1.0, 0.0], [0.5, 1.0], [0.0, 1.0], [1.0, 0.5]])
    v = jnp.array([[0.0, 1.0], [1.0, 0.5], [0.3, 0.0], [0.0, 1.0]])
    m = qs.LowRankPlusDiagonal(d, u, v)
    assert np.linalg.cond(np.diag(d) + u @ v.T) < 100
    b = jnp.array([1.0, 2.0, -1.0, 0.5])
    assert np.all(np.isnan(_solve(m, b)))
    with in_graph_fallbacks():
        assert np.all(np.isnan(jax.jit(quax.quaxify(jnp.linalg.solve))(m, b)))


def test_compiled_cpu_program_holds_the_callback_not_the_loops():
    m, b = _benign(), jnp.asarray(_B, jnp.float32)
    for fn, args in ((jnp.linalg.solve, (m, b)), (jnp.linalg.slogdet, (m,))):
        ops = quax.testing.hlo_ops(quax.testing.compiled_hlo(fn, *args))
        assert "while" not in ops
        assert "custom-call" in ops
        hlo = quax.testing.compiled_hlo(fn, *args)
        assert re.search(r"custom_call_target=\"[a-z_]*callback", hlo), fn
        with in_graph_fallbacks():
            in_graph = quax.testing.compiled_hlo(fn, *args)
        assert "while" in quax.testing.hlo_ops(in_graph)
        assert not re.search(r"custom_call_target=\"[a-z_]*callback", in_graph)


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
    """The callback runs in another thread, which does not see the caller's
    `jax.enable_x64` block: the fallback must still compute in float64."""
    m, b = _tiny(jnp.float64), jnp.asarray(_B, jnp.float64)
    assert _fallback_taken(m, b)
    got = _solve(m, b)
    assert got.dtype == jnp.float64
    _close(got, np.linalg.solve(_dense(m), _B), np.float64)


def test_several_threads_at_once():
    matrices = [_tiny(), _indefinite(), _benign(), _tiny()]
    b = jnp.asarray(_B, jnp.float32)
    wants = [np.asarray(_solve(m, b)) for m in matrices]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = [
            pool.submit(lambda m: np.asarray(_solve(m, b)), m) for m in matrices * 3
        ]
        for run, want in zip(runs, wants * 3, strict=True):
            np.testing.assert_array_equal(run.result(), want)


def test_the_fallback_program_is_compiled_once():
    """The host's compiled fallback is keyed by the fallback and its operands'
    structure: another trace of the same solve compiles nothing new."""
    m, b = _tiny(), jnp.asarray(_B, jnp.float32)
    jax.jit(quax.quaxify(jnp.linalg.solve))(m, b)
    before = _fallback._compiled.cache_info()
    jax.jit(quax.quaxify(jnp.linalg.solve))(m, 2 * b)
    after = _fallback._compiled.cache_info()
    assert after.misses == before.misses and after.hits > before.hits


def test_export_with_the_fallback_in_the_program():
    """`jax.export` cannot lower a host callback for the CPU platform; inside
    `in_graph_fallbacks()` the exported program keeps the fallback, and runs
    it, also after the same `jit` was traced outside the block."""
    m, b = _tiny(), jnp.asarray(_B, jnp.float32)
    solve = jax.jit(lambda d, u, b: quax.quaxify(jnp.linalg.solve)(type(m)(d, u), b))
    want = solve(m.diag, m.u, b)
    with pytest.raises(NotImplementedError, match="host_callbacks"):
        jax.export.export(solve)(m.diag, m.u, b)
    with in_graph_fallbacks():
        exported = jax.export.export(solve)(m.diag, m.u, b)
    assert "callback" not in exported.mlir_module()
    _close(exported.call(m.diag, m.u, b), want, scale=1.0)
    # For another backend (lowered here without one), the fallback stays in the
    # program without the setting: only the CPU branch holds the callback.
    for_gpu = jax.export.export(solve, platforms=["cuda"])(m.diag, m.u, b)
    assert "callback" not in for_gpu.mlir_module()
    assert "while" in for_gpu.mlir_module()
