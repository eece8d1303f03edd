"""The choice of direct solver (`quax_sparse.solver_route`) and what is particular
to the cuSolver route (`jax.experimental.sparse.linalg.spsolve`), forced on CPU,
where JAX runs `spsolve` through `scipy.sparse.linalg.spsolve`: duplicates and
padding, float32, factor objects, `slogdet`, singular matrices and the backward-error
check, against NumPy and dense JAX in float64 (skipped where JAX has no `spsolve`: a
TPU, a ROCm GPU). The solves, `vmap` and gradients of
`test_direct.py` run on both routes too (its `route` fixture)."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_sparse
from quax_sparse import BCOO, CSR, _cusolver, _superlu
from sparse_helpers import needs_spsolve
from test_direct import _at_pattern, _general, _spd, _with_data


pytestmark = pytest.mark.usefixtures("x64")

solve = quax.quaxify(jnp.linalg.solve)


def _binds_spsolve(f, *args) -> bool:
    """Whether the program of `f` (its sub-programs printed with it) binds `spsolve`."""
    return "spsolve" in str(jax.make_jaxpr(f)(*args))


def test_auto_route_follows_the_default_backend(monkeypatch):
    assert quax_sparse.solver_route is _cusolver.solver_route
    assert _cusolver.current_route() == "auto"
    assert _cusolver.resolve_route() == "superlu"  # these tests run on CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    if "rocm" not in str(jax.devices()[0].client.platform_version).lower():
        assert _cusolver.resolve_route() == "cusolver"
    with quax_sparse.solver_route("superlu"):
        assert _cusolver.resolve_route() == "superlu"
    with (
        pytest.raises(ValueError, match=r"`route`.*'auto', 'superlu', 'cusolver'"),
        quax_sparse.solver_route("cholmod"),
    ):
        pass
    with pytest.raises(ValueError, match=r"`route`.*'lapack'"):
        quax_sparse.lu_factor(_general()[1], route="lapack")


@needs_spsolve
def test_the_route_decides_the_primitives_and_retraces_jit():
    dense, a = _general()
    b = np.ones(12)
    assert not _binds_spsolve(solve, a, b)
    with quax_sparse.solver_route("cusolver"):
        assert _binds_spsolve(solve, a, b)
    f = jax.jit(solve)
    calls = []
    host_factor = _superlu._host_factor

    def counting(*args, **kwargs):
        calls.append(1)
        return host_factor(*args, **kwargs)

    try:
        _superlu._host_factor = counting
        np.testing.assert_allclose(f(a, b), np.linalg.solve(dense, b), rtol=1e-12)
        assert len(calls) == 1
        with quax_sparse.solver_route("cusolver"):  # traced again: no SuperLU
            np.testing.assert_allclose(f(a, b), np.linalg.solve(dense, b), rtol=1e-12)
        assert len(calls) == 1
    finally:
        _superlu._host_factor = host_factor


# The right-hand sides times eager and `jit`: CI runs a vector eagerly and a
# matrix under `jit` (the route's rule is the same; eager or jitted, quax's
# dispatch); the other two repeat them: sweeps (`bash scripts/test.sh sweeps`).
@pytest.mark.parametrize(
    ("rhs", "jit"),
    [
        pytest.param(
            rhs,
            jit,
            id=f"rhs{i}-{jit}",
            marks=[] if (rhs == ()) != jit else [pytest.mark.sweep],
        )
        for i, rhs in enumerate([(), (3,)])
        for jit in (False, True)
    ],
)
@needs_spsolve
def test_cusolver_solve_matches_numpy(jit, rhs):
    # `_general` stores padding and shuffles the entries; add duplicates too.
    dense, a = _general()
    a = BCOO(
        jnp.concatenate([a.data, jnp.array([1.5, -0.5])]),
        jnp.concatenate([a.indices, jnp.array([[2, 2], [5, 2]], a.indices.dtype)]),
        a.shape,
    )
    dense = dense.copy()
    dense[2, 2] += 1.5
    dense[5, 2] -= 0.5
    b = np.random.default_rng(2).normal(size=(12, *rhs))
    with quax_sparse.solver_route("cusolver"):
        got = (jax.jit(solve) if jit else solve)(a, b)
        got_csr = jax.jit(solve)(CSR.from_bcoo(a), b)
    want = np.linalg.solve(dense, b)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_csr, want, rtol=1e-12, atol=1e-14)


@needs_spsolve
def test_cusolver_float32():
    dense, a = _general()
    b = np.random.default_rng(4).normal(size=12)
    a32 = BCOO(a.data.astype(jnp.float32), a.indices, a.shape)
    with quax_sparse.solver_route("cusolver"):
        got = jax.jit(solve)(a32, b.astype(np.float32))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, np.linalg.solve(dense, b), rtol=1e-5, atol=1e-6)


@needs_spsolve
def test_cusolver_factor_objects_cholesky_and_slogdet():
    dense, a = _spd()
    b = np.random.default_rng(11).normal(size=(16, 2))

    def loss(data):
        factor = quax_sparse.cho_factor(_with_data(a, data), route="cusolver")
        return jnp.sum(factor.solve(b))

    lu = quax_sparse.lu_factor(a, route="cusolver")
    assert lu.route == "cusolver"
    np.testing.assert_allclose(lu.solve(b), np.linalg.solve(dense, b), rtol=1e-12)
    want = jax.grad(lambda m: jnp.sum(jnp.linalg.solve(m, b)))(jnp.asarray(dense))
    np.testing.assert_allclose(
        jax.jit(jax.grad(loss))(a.data), _at_pattern(want, a), rtol=1e-10, atol=1e-16
    )
    with quax_sparse.solver_route("cusolver"):
        chol = jax.jit(quax.quaxify(lambda a, b: jsl.cho_solve(jsl.cho_factor(a), b)))
        np.testing.assert_allclose(chol(a, b), np.linalg.solve(dense, b), rtol=1e-12)
        # The determinant is read from SuperLU's factor on the host.
        sign, logdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))(a)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    assert sign == want_sign and logdet == pytest.approx(want_logdet, rel=1e-12)


@pytest.mark.filterwarnings("ignore::scipy.sparse.linalg.MatrixRankWarning")
@needs_spsolve
def test_cusolver_singular_matrix_gives_nan():
    _, a = _general()
    data = jnp.where(a.indices[:, 0] == 3, 0.0, a.data)  # row 3 all zero
    with quax_sparse.solver_route("cusolver"):
        x = solve(_with_data(a, data), jnp.ones(12))
    assert np.all(np.isnan(x))


@needs_spsolve
def test_backward_error_check_turns_a_wrong_solve_into_nan(monkeypatch):
    # A size no other test uses: quax's caches must not hold this program yet.
    _, a = _general(n=9)
    b = np.ones(9)
    wrong = lambda data, indices, b, *, trans: (
        1.001 * _cusolver._SOLVES[trans](data, indices, b)
    )
    from quax_sparse._values import _factor

    monkeypatch.setattr(_factor, "device_solve", wrong)
    with quax_sparse.solver_route("cusolver"):
        assert np.all(np.isnan(solve(a, b)))
        both = solve(a, jnp.stack([b, 2 * b], axis=1))  # checked per column
        assert np.all(np.isnan(both))
