"""Direct solves (SuperLU on the host): `jnp.linalg.solve`, `slogdet`, `det`,
`lu_factor`/`lu_solve`, `cho_factor`/`cho_solve` and `jax.scipy.linalg.solve` on
sparse matrices, under `jit` and `vmap`, with gradients with respect to the
right-hand side and the stored values, against NumPy and dense JAX in float64. The
solves run on both routes (the `route` fixture: SuperLU, and `spsolve` forced)."""

import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_sparse
from quax_sparse import (
    BCOO,
    CSR,
    PendingSolve,
    SparseLU,
    SparseMaterialisationError,
    _superlu,
)
from sparse_helpers import random_sparse


# float64 throughout: skipped on a backend with no native float64 (a TPU, whose
# compiler aborts the process on some complex128 programs here); the float32 solves
# whose tangents a TPU run checks are in `test_solve_tangents.py`.
pytestmark = [pytest.mark.usefixtures("x64"), pytest.mark.float64]


def _general(n: int = 12, seed: int = 0) -> tuple[np.ndarray, BCOO]:
    """A nonsymmetric, well-conditioned sparse matrix with padding, shuffled."""
    rng = np.random.default_rng(seed)
    dense, _ = random_sparse(rng, (n, n), 0.25, dtype=np.float64)
    dense = dense + 4 * np.eye(n)
    _, a = _bcoo_of(dense, rng)
    return dense, a


def _bcoo_of(dense: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, BCOO]:
    """`dense` as a BCOO from NumPy coordinates (shuffled, two padding entries)."""
    n = dense.shape[0]
    coords = rng.permutation(np.argwhere(dense != 0))
    data = np.concatenate([dense[tuple(coords.T)], [0.0, 0.0]])
    indices = np.concatenate([coords, [[n, n], [n, n]]]).astype(np.int32)
    return dense, BCOO(jnp.asarray(data), jnp.asarray(indices), (n, n))


def _spd(n: int = 16, seed: int = 1) -> tuple[np.ndarray, BCOO]:
    rng = np.random.default_rng(seed)
    m = np.where(rng.random((n, n)) < 0.15, rng.normal(size=(n, n)), 0)
    dense = m @ m.T + n * np.eye(n)
    return _bcoo_of(dense, rng)


def _at_pattern(grad: np.ndarray, a: BCOO) -> np.ndarray:
    """A dense gradient read at the stored entries (zero at padding)."""
    n = a.shape[0]
    rows, cols = np.asarray(a.indices).T
    keep = (rows < n) & (cols < n)
    grad = np.asarray(grad)
    out = np.zeros(a.nse, grad.dtype)
    out[keep] = grad[rows[keep], cols[keep]]
    return out


def _with_data(a: BCOO, data: jax.Array) -> BCOO:
    return BCOO(data, a.indices, a.shape)


@pytest.fixture(params=["superlu", "cusolver"])
def route(request):
    """The test on both solver routes (`quax_sparse.solver_route`): SuperLU on the
    host, and `jax.experimental.sparse.linalg.spsolve`, forced (on CPU, JAX runs
    it through `scipy.sparse.linalg.spsolve`). A test that takes a grid of the
    routes and other choices parametrises it itself (`_grid`)."""
    with quax_sparse.solver_route(request.param):
        yield request.param


def _grid(names, cases, in_ci, id_of: Callable[[object], str] = str):
    """`pytest.mark.parametrize` of `("route", *names)` over `cases` (tuples
    starting with the route; the route through the `route` fixture), with the
    ids the fixture gave (`route-...`, each choice's `id_of`); the cases not in
    `in_ci` are sweeps (`bash scripts/test.sh sweeps`)."""
    parametrize = pytest.mark.parametrize(
        ("route", *names),
        [
            pytest.param(
                *case,
                id="-".join(map(id_of, case)),
                marks=[] if case in in_ci else [pytest.mark.sweep],
            )
            for case in cases
        ],
        indirect=["route"],
    )
    return lambda test: pytest.mark.usefixtures("route")(parametrize(test))


# The routes times the right-hand sides times eager and `jit`: CI runs, on each
# route, a vector eagerly and a matrix under `jit` (the route is the rule's; eager
# or jitted, quax's dispatch, the same for both); the other four repeat them
# (`_grid`).
@_grid(
    ("rhs", "jit"),
    [
        (route, rhs, jit)
        for route in ("superlu", "cusolver")
        for rhs in ((), (3,))
        for jit in (False, True)
    ],
    in_ci={
        (route, rhs, jit)
        for route in ("superlu", "cusolver")
        for rhs, jit in (((), False), ((3,), True))
    },
    id_of=lambda x: f"rhs{len(x)}" if isinstance(x, tuple) else str(x),
)
def test_solve_matches_numpy(jit, rhs):
    dense, a = _general()
    b = np.random.default_rng(2).normal(size=(12, *rhs))
    f = quax.quaxify(jnp.linalg.solve)
    got = (jax.jit(f) if jit else f)(a, b)
    np.testing.assert_allclose(got, np.linalg.solve(dense, b), rtol=1e-12, atol=1e-12)


def test_solve_csr_and_float32():
    dense, a = _general()
    b = np.random.default_rng(3).normal(size=12)
    c = CSR.from_bcoo(a)
    got = jax.jit(quax.quaxify(jnp.linalg.solve))(c, b)
    np.testing.assert_allclose(got, np.linalg.solve(dense, b), rtol=1e-12)
    a32 = BCOO(a.data.astype(jnp.float32), a.indices, a.shape)
    got = jax.jit(quax.quaxify(jnp.linalg.solve))(a32, b.astype(np.float32))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, np.linalg.solve(dense, b), rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("route")
def test_solve_complex():
    rng = np.random.default_rng(4)
    dense, _ = _general()
    dense = dense + 1j * np.where(dense != 0, rng.normal(size=dense.shape), 0)
    _, a = _bcoo_of(dense, rng)
    b = rng.normal(size=12) + 1j * rng.normal(size=12)
    got = jax.jit(quax.quaxify(jnp.linalg.solve))(a, b)
    np.testing.assert_allclose(got, np.linalg.solve(dense, b), rtol=1e-12)
    for trans, op in [(1, dense.T), (2, dense.conj().T)]:
        f = lambda a, b, t=trans: jsl.lu_solve(jsl.lu_factor(a), b, trans=t)
        got = jax.jit(quax.quaxify(f))(a, b)
        np.testing.assert_allclose(got, np.linalg.solve(op, b), rtol=1e-12)


def _complex_general(seed: int = 4) -> tuple[np.ndarray, BCOO]:
    """A complex, non-Hermitian, well-conditioned sparse matrix (shuffled, padded)."""
    rng = np.random.default_rng(seed)
    dense, _ = _general()
    dense = dense + 1j * np.where(dense != 0, rng.normal(size=dense.shape), 0)
    assert not np.allclose(dense, dense.conj().T)
    return _bcoo_of(dense, rng)


def _complex_spd(seed: int = 1) -> tuple[np.ndarray, BCOO]:
    """A complex Hermitian positive definite sparse matrix, not real: `conj(A) !=
    A`, so `A⁻ᴴ = A⁻¹` but its transpose `conj(A)⁻¹` is another matrix."""
    rng = np.random.default_rng(seed)
    n = 16
    pattern = rng.random((n, n)) < 0.15
    m = np.where(pattern, rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n)), 0)
    dense = m @ m.conj().T + n * np.eye(n)
    assert not np.allclose(dense, dense.real)
    return _bcoo_of(dense, rng)


# The routes times the ways in: `lu_factor.solve` and `lu_solve` in `quaxify` run
# the same LU factor's `solve`, the second through the registered rule; CI runs
# every way on SuperLU and, on the other route (11 s of compiles a case),
# `cho_factor` and `lu_solve` in `quaxify` (the rule and the LU's transposed
# solve), so `lu_factor.solve` there is a sweep (`_grid`).
@_grid(
    ("how",),
    [
        (route, how)
        for route in ("superlu", "cusolver")
        for how in ("lu_factor.solve", "cho_factor.solve", "lu_solve in quaxify")
    ],
    in_ci={
        ("superlu", "lu_factor.solve"),
        ("superlu", "cho_factor.solve"),
        ("superlu", "lu_solve in quaxify"),
        ("cusolver", "cho_factor.solve"),
        ("cusolver", "lu_solve in quaxify"),
    },
)
def test_gradients_of_the_conjugate_transposed_solve(how):
    # `A⁻ᴴ b` (trans=2), differentiated with respect to `b` and the stored values
    # of a complex matrix: the transpose of the solve is `conj(A)⁻¹`, two
    # conjugations that a real matrix cannot check. Against dense JAX on `Aᴴ`.
    dense, a = _complex_spd() if how == "cho_factor.solve" else _complex_general()
    n = dense.shape[0]
    rng = np.random.default_rng(15)
    b = rng.normal(size=(n, 2)) + 1j * rng.normal(size=(n, 2))
    w = rng.normal(size=(n, 2)) + 1j * rng.normal(size=(n, 2))

    def solve(m, b):
        if how == "lu_solve in quaxify":
            f = lambda m, b: jsl.lu_solve(jsl.lu_factor(m), b, trans=2)
            return quax.quaxify(f)(m, b)
        factor = (
            quax_sparse.cho_factor
            if how == "cho_factor.solve"
            else (quax_sparse.lu_factor)
        )
        return factor(m).solve(b, trans=2)

    def loss(data, b):  # real, and not holomorphic in `x`: both parts matter
        x = solve(_with_data(a, data), b)
        return jnp.sum(jnp.real(x * w)) + jnp.sum(jnp.abs(x) ** 2)

    def dense_loss(m, b):
        x = jnp.linalg.solve(m.conj().T, b)
        return jnp.sum(jnp.real(x * w)) + jnp.sum(jnp.abs(x) ** 2)

    np.testing.assert_allclose(
        solve(a, b), np.linalg.solve(dense.conj().T, b), rtol=1e-12
    )
    g_data, g_b = jax.jit(jax.grad(loss, argnums=(0, 1)))(a.data, b)
    want_m, want_b = jax.grad(dense_loss, argnums=(0, 1))(jnp.asarray(dense), b)
    np.testing.assert_allclose(g_b, want_b, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(g_data, _at_pattern(want_m, a), rtol=1e-10, atol=1e-14)


@pytest.mark.usefixtures("route")
def test_vmap_over_right_hand_sides():
    dense, a = _general()
    bs = np.random.default_rng(5).normal(size=(4, 12))
    f = jax.jit(jax.vmap(quax.quaxify(jnp.linalg.solve), in_axes=(None, 0)))
    np.testing.assert_allclose(f(a, bs), np.linalg.solve(dense, bs.T).T, rtol=1e-12)


@pytest.mark.usefixtures("route")
def test_vmap_over_matrices():
    dense, a = _general()
    data = jnp.stack([a.data, 2 * a.data])
    b = np.random.default_rng(6).normal(size=12)

    def f(d):
        return quax.quaxify(jnp.linalg.solve)(_with_data(a, d), b)

    got = jax.jit(jax.vmap(f))(data)
    want = np.stack([np.linalg.solve(dense, b), np.linalg.solve(2 * dense, b)])
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.usefixtures("route")
def test_gradients_of_solve():
    dense, a = _general()
    b = np.random.default_rng(7).normal(size=12)
    w = np.random.default_rng(8).normal(size=12)

    def loss(data, b):
        return quax.quaxify(jnp.linalg.solve)(_with_data(a, data), b) @ w

    def dense_loss(m, b):
        return jnp.linalg.solve(m, b) @ w

    g_data, g_b = jax.jit(jax.grad(loss, argnums=(0, 1)))(a.data, b)
    want_m, want_b = jax.grad(dense_loss, argnums=(0, 1))(jnp.asarray(dense), b)
    np.testing.assert_allclose(g_data, _at_pattern(want_m, a), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(g_b, want_b, rtol=1e-10)
    # Forward mode too: a JVP along the stored values.
    t = np.random.default_rng(9).normal(size=a.nse)
    _, got = jax.jvp(lambda d: loss(d, b), (a.data,), (jnp.asarray(t),))
    assert got == pytest.approx(float(np.dot(_at_pattern(want_m, a), t)), rel=1e-10)


def test_slogdet_and_det_with_gradients():
    dense, a = _general()
    sign, logdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))(a)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    assert sign == want_sign and logdet == pytest.approx(want_logdet, rel=1e-12)
    det = jax.jit(quax.quaxify(lambda a: jnp.linalg.det(a / 4)))(a)
    assert det == pytest.approx(np.linalg.det(dense / 4), rel=1e-10)
    g = jax.grad(lambda d: quax.quaxify(jnp.linalg.slogdet)(_with_data(a, d))[1])
    want = jax.grad(lambda m: jnp.linalg.slogdet(m)[1])(jnp.asarray(dense))
    np.testing.assert_allclose(jax.jit(g)(a.data), _at_pattern(want, a), rtol=1e-10)
    g = jax.grad(lambda d: quax.quaxify(jnp.linalg.det)(_with_data(a, d / 4)))
    want = jax.grad(lambda m: jnp.linalg.det(m / 4))(jnp.asarray(dense))
    np.testing.assert_allclose(g(a.data), _at_pattern(want, a), rtol=1e-9)


def test_slogdet_negative_determinant_and_permutation_sign():
    # Rows swapped: SuperLU pivots, the determinant's sign comes from the pivots.
    dense, _ = _general()
    dense = dense[::-1]
    _, a = _bcoo_of(dense, np.random.default_rng(10))
    sign, logdet = quax.quaxify(jnp.linalg.slogdet)(a)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    assert sign == want_sign and logdet == pytest.approx(want_logdet, rel=1e-12)
    assert quax.quaxify(jnp.linalg.det)(a) == pytest.approx(np.linalg.det(dense))


def test_singular_matrix_gives_nan_and_zero_determinant():
    _, a = _general()
    data = jnp.where(a.indices[:, 0] == 3, 0.0, a.data)  # row 3 all zero
    s = _with_data(a, data)
    x = quax.quaxify(jnp.linalg.solve)(s, jnp.ones(12))
    assert np.all(np.isnan(x))
    sign, logdet = quax.quaxify(jnp.linalg.slogdet)(s)
    assert sign == 0 and logdet == -np.inf


@pytest.mark.filterwarnings("ignore::scipy.sparse.linalg.MatrixRankWarning")
# The routes times eager and `jit`: CI runs SuperLU eagerly and the other route
# under `jit` (the NaN is each route's rule; eager or jitted, quax's dispatch);
# the other route eagerly (27 s of compiles, each operation its own program) and
# SuperLU under `jit` repeat them (`_grid`).
@_grid(
    ("jit",),
    [(route, jit) for route in ("superlu", "cusolver") for jit in (False, True)],
    in_ci={("superlu", False), ("cusolver", True)},
)
def test_singular_solve_is_nan_where_dense_gives_infinities(jit):
    # Pinned (README, Limits): a singular sparse solve is NaN in every element,
    # whatever the route, `trans` or right-hand side, where dense JAX's LU divides
    # by its zero pivot and gives infinities (and NaN, and finite numbers) for the
    # same matrix.
    _, a = _general()
    singular = np.array(a.todense())
    singular[3] = 0.0  # row 3 all zero
    s = _with_data(a, jnp.where(a.indices[:, 0] == 3, 0.0, a.data))
    b = np.ones((12, 2))
    dense = np.asarray(jnp.linalg.solve(singular, b))
    assert np.isinf(dense).any() and not np.isnan(dense).all()
    maybe_jit = jax.jit if jit else (lambda f: f)
    outs = [
        maybe_jit(quax.quaxify(jnp.linalg.solve))(s, b),
        maybe_jit(lambda s, b: quax_sparse.lu_factor(s).solve(b, trans=1))(s, b),
        maybe_jit(quax.quaxify(lambda s, b: jsl.lu_solve(jsl.lu_factor(s), b)))(s, b),
    ]
    # A symmetric positive semi-definite one (row and column 3 of `_spd` zeroed),
    # by `cho_factor`/`cho_solve` (SuperLU's symmetric mode).
    _, p = _spd()
    keep = (p.indices[:, 0] != 3) & (p.indices[:, 1] != 3)
    semi = _with_data(p, jnp.where(keep, p.data, 0.0))
    chol = quax.quaxify(lambda s, b: jsl.cho_solve(jsl.cho_factor(s), b))
    outs += [
        maybe_jit(chol)(semi, np.ones((16, 2))),
        maybe_jit(lambda s: quax_sparse.cho_factor(s).solve(np.ones(16)))(semi),
    ]
    for out in outs:
        assert np.all(np.isnan(out))


@pytest.mark.usefixtures("route")
@pytest.mark.parametrize("lower", [True, False])
def test_cho_factor_and_cho_solve(lower):
    dense, a = _spd()
    b = np.random.default_rng(11).normal(size=16)

    def f(a, b):
        return jsl.cho_solve(jsl.cho_factor(a, lower=lower), b)

    np.testing.assert_allclose(
        jax.jit(quax.quaxify(f))(a, b), np.linalg.solve(dense, b), rtol=1e-12
    )
    np.testing.assert_allclose(
        quax.quaxify(f)(a, b), np.linalg.solve(dense, b), rtol=1e-12
    )


@pytest.mark.usefixtures("route")
def test_positive_definite_solve_with_gradients():
    dense, a = _spd()
    b = np.random.default_rng(12).normal(size=16)

    def loss(data, b):
        x = quax.quaxify(jsl.solve)(_with_data(a, data), b, assume_a="pos")
        return jnp.sum(x**2)

    def dense_loss(m, b):
        return jnp.sum(jsl.solve(m, b, assume_a="pos") ** 2)

    g_data, g_b = jax.jit(jax.grad(loss, argnums=(0, 1)))(a.data, b)
    want_m, want_b = jax.grad(dense_loss, argnums=(0, 1))(jnp.asarray(dense), b)
    np.testing.assert_allclose(g_data, _at_pattern(want_m, a), rtol=1e-10, atol=1e-16)
    np.testing.assert_allclose(g_b, want_b, rtol=1e-10)


def test_lu_factor_reused_by_repeated_solves(monkeypatch):
    dense, a = _general()
    bs = np.random.default_rng(13).normal(size=(3, 12))
    calls = []
    factorise = _superlu._factorise
    monkeypatch.setattr(
        _superlu, "_factorise", lambda *args: calls.append(1) or factorise(*args)
    )

    @jax.jit
    @quax.quaxify
    def solve_three(a, bs):
        lu_and_piv = jsl.lu_factor(a)
        return [jsl.lu_solve(lu_and_piv, b) for b in bs]

    got = solve_three(a, bs)
    np.testing.assert_allclose(np.stack(got), np.linalg.solve(dense, bs.T).T)
    assert len(calls) == 1  # one factorisation, three solves
    calls.clear()
    lu = quax_sparse.lu_factor(a)
    assert isinstance(lu, SparseLU)
    for trans, op in [(0, dense), (1, dense.T)]:
        np.testing.assert_allclose(
            lu.solve(bs[0], trans), np.linalg.solve(op, bs[0]), rtol=1e-12
        )
    assert len(calls) == 1  # the factor `lu_factor` computed, and nothing more


def test_factor_outside_quaxify_under_jit_and_grad():
    dense, a = _spd()
    b = np.random.default_rng(14).normal(size=(16, 2))

    def loss(data):
        return jnp.sum(quax_sparse.cho_factor(_with_data(a, data)).solve(b))

    want = jax.grad(lambda m: jnp.sum(jnp.linalg.solve(m, b)))(jnp.asarray(dense))
    np.testing.assert_allclose(
        jax.jit(jax.grad(loss))(a.data), _at_pattern(want, a), rtol=1e-10, atol=1e-16
    )
    c = CSR.from_bcoo(a)
    np.testing.assert_allclose(
        quax_sparse.lu_factor(c).solve(b), np.linalg.solve(dense, b), rtol=1e-12
    )


def test_evicted_factor_is_recomputed(monkeypatch):
    dense, a = _general()
    monkeypatch.setattr(_superlu, "CACHE_SIZE", 1)
    lu = quax_sparse.lu_factor(a)
    quax_sparse.lu_factor(BCOO.fromdense(np.eye(3), nse=3))  # evicts `lu`
    b = np.ones(12)
    np.testing.assert_allclose(lu.solve(b), np.linalg.solve(dense, b), rtol=1e-12)


def test_gradient_program_holds_no_dense_matrix():
    n = 64
    dense, a = _general(n)
    b = jnp.ones(n)

    def loss(data, b):
        x = quax.quaxify(jnp.linalg.solve)(_with_data(a, data), b)
        logdet = quax.quaxify(jnp.linalg.slogdet)(_with_data(a, data))[1]
        return jnp.sum(x) + logdet

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(a.data, b).compile().as_text()
    assert hlo is not None
    assert not re.search(rf"\[{n},{n}\]", hlo)
    dense_hlo = jax.jit(jax.grad(lambda m: jnp.sum(jnp.linalg.solve(m, b)))).lower(
        jnp.asarray(dense)
    )
    dense_text = dense_hlo.compile().as_text()
    assert dense_text is not None
    assert re.search(rf"\[{n},{n}\]", dense_text)


# Refusals ---------------------------------------------------------------------------


def test_stacked_sparse_and_integer_matrices_refuse_to_factor():
    # Three sparse dimensions (no batch ones): not a matrix, nor a batch of them.
    dense, a = _general()
    data = jnp.concatenate([a.data, a.data])
    indices = jnp.concatenate(
        [jnp.pad(a.indices, ((0, 0), (1, 0))), jnp.pad(a.indices, ((0, 0), (1, 0)))]
    )
    stacked = BCOO(data, indices.at[a.nse :, 0].set(1), (2, 12, 12))
    with pytest.raises(
        SparseMaterialisationError, match=r"`lu`.*3 sparse dimensions.*0"
    ):
        quax.quaxify(jnp.linalg.solve)(stacked, jnp.ones((2, 12, 1)))
    integer = BCOO(a.data.astype(jnp.int32), a.indices, a.shape)
    with pytest.raises(SparseMaterialisationError, match=r"`lu`.*int32.*astype"):
        quax.quaxify(jax.lax.linalg.lu)(integer)
    with pytest.raises(ValueError, match=r"lu_factor.*BCOO.*jax.scipy.linalg"):
        quax_sparse.lu_factor(jnp.asarray(dense))
    with pytest.raises(ValueError, match=r"cho_factor.*not square"):
        quax_sparse.cho_factor(BCOO.fromdense(np.ones((2, 3)), nse=6))


def test_one_triangular_solve_alone_is_refused():
    _, a = _general()

    def half(a, b):
        lu, _, _ = jax.lax.linalg.lu(a)
        return jax.lax.linalg.triangular_solve(lu, b, left_side=True, lower=True)

    # quaxify returns the value as it stands; nothing can use it.
    pending = quax.quaxify(half)(a, jnp.ones((12, 1)))
    assert isinstance(pending, PendingSolve)
    with pytest.raises(SparseMaterialisationError, match=r"PendingSolve.*second"):
        pending.materialise()
    with pytest.raises(
        SparseMaterialisationError, match=r"`mul`.*PendingSolve.*second"
    ):
        quax.quaxify(lambda a, b: 2 * half(a, b))(a, jnp.ones((12, 1)))

    def wrong_order(a, b):
        lu, _, _ = jax.lax.linalg.lu(a)
        kw = dict(left_side=True, transpose_a=False)
        y = jax.lax.linalg.triangular_solve(lu, b, lower=False, **kw)
        return jax.lax.linalg.triangular_solve(lu, y, lower=True, **kw)

    with pytest.raises(SparseMaterialisationError, match=r"triangular_solve.*order"):
        quax.quaxify(wrong_order)(a, jnp.ones((12, 1)))


def test_factor_refuses_other_operations_and_masks():
    _, a = _spd()
    with pytest.raises(SparseMaterialisationError, match=r"`exp`.*SparseLU.*cho_solve"):
        quax.quaxify(lambda a: jnp.exp(jax.lax.linalg.lu(a)[0]))(a)
    upper = np.triu(np.ones((16, 16), bool))

    def masked(a, mask, b):
        c = jax.lax.linalg.cholesky(a, symmetrize_input=False)
        return jsl.cho_solve((jnp.where(mask, c, 0), True), b)

    # A mask that is not the lower triangle: refused where it is read at trace
    # time, NaN where it is checked at run time (an argument under `jit`).
    with pytest.raises(SparseMaterialisationError, match=r"`select_n`.*another"):
        quax.quaxify(lambda a, b: masked(a, upper, b))(a, jnp.ones(16))
    x = jax.jit(quax.quaxify(masked))(a, upper, jnp.ones(16))
    assert np.all(np.isnan(x))
    lower = np.tril(np.ones((16, 16), bool))
    x = jax.jit(quax.quaxify(masked))(a, lower, jnp.ones(16))
    np.testing.assert_allclose(x, np.linalg.solve(np.asarray(a.todense()), np.ones(16)))
    with pytest.raises(SparseMaterialisationError, match=r"`transpose`.*SparseLU"):
        quax.quaxify(lambda a: jax.lax.linalg.lu(a)[0].T)(a)
    lu = quax_sparse.lu_factor(a)
    with pytest.raises(SparseMaterialisationError, match=r"SparseLU"):
        lu.enable_materialise().materialise()
    pending = PendingSolve(jnp.ones((16, 1)), lu, (True, False, False, True))
    with pytest.raises(SparseMaterialisationError, match=r"halfway"):
        quax.quaxify(jnp.sum)(pending)


def test_pivots_are_not_differentiable():
    _, a = _general()

    def f(data):
        lu, _, _ = quax.quaxify(jax.lax.linalg.lu)(_with_data(a, data))
        return jnp.sum(lu.diagonal())

    with pytest.raises(NotImplementedError, match=r"slogdet"):
        jax.grad(f)(a.data)


def test_large_matrices_check_their_masks_at_run_time():
    # n > 32: the masks `slogdet` and `cholesky` apply (n² elements, n x 2 indices)
    # are too large to read at trace time, and are checked in the program.
    n = 700
    t = 2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)  # det = n + 1
    a = BCOO.fromdense(t, nse=3 * n - 2)
    for f in (
        quax.quaxify(jnp.linalg.slogdet),
        jax.jit(quax.quaxify(jnp.linalg.slogdet)),
    ):
        sign, logdet = f(a)
        assert sign == 1 and logdet == pytest.approx(np.log(n + 1), rel=1e-12)
    b = np.random.default_rng(15).normal(size=n)
    pos = jax.jit(quax.quaxify(lambda a, b: jsl.solve(a, b, assume_a="pos")))
    np.testing.assert_allclose(pos(a, b), np.linalg.solve(t, b), rtol=1e-10)


# CI runs every size under `jit` (each size its own way through JAX's formulas:
# `slogdet` from the elements at 1 and 2, `det` at 2 and 3) and eagerly at 1;
# eagerly at 2 and 3 (6 and 10 s, each operation its own program) repeat the
# jitted sizes' rules through quax's eager dispatch, which size 1 checks: sweeps
# (`bash scripts/test.sh sweeps`).
@pytest.mark.parametrize(
    ("jit", "n"),
    [
        pytest.param(
            jit,
            n,
            id=f"{jit}-{n}",
            marks=[pytest.mark.sweep] if not jit and n > 1 else [],
        )
        for jit in (False, True)
        for n in (1, 2, 3)
    ],
)
def test_small_det_and_slogdet_with_duplicates(n: int, jit: bool) -> None:
    # JAX computes `slogdet` of a 1 x 1 or 2 x 2 matrix and `det` of a 2 x 2 or
    # 3 x 3 one from its elements (`a[0, 0] * a[1, 1] - ...`), not through `lu`:
    # an element of a sparse matrix is its dense scalar, so `log` of it runs (it was
    # refused: "Refusing to materialise `BCOO` for primitive `log`"). Every entry is
    # stored twice, shuffled, with padding, so the scalars are sums of entries.
    rng = np.random.default_rng(n)
    dense = rng.normal(size=(n, n)) + 3 * np.eye(n)
    dense[0, n - 1] = 0.0 if n > 1 else dense[0, 0]
    coords = np.argwhere(dense != 0)
    values = dense[tuple(coords.T)]
    order = rng.permutation(2 * len(coords))
    data = np.concatenate([0.25 * values, 0.75 * values, [5.0]])
    indices = np.concatenate([coords, coords, [[n, n]]])
    keep = np.concatenate([order, [2 * len(coords)]])
    a = BCOO(jnp.asarray(data[keep]), jnp.asarray(indices[keep]), (n, n))

    def run(f):
        g = quax.quaxify(f)
        return jax.jit(g)(a) if jit else g(a)

    sign, logdet = run(jnp.linalg.slogdet)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    np.testing.assert_allclose(sign, want_sign, rtol=1e-12)
    np.testing.assert_allclose(logdet, want_logdet, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(run(jnp.linalg.det), np.linalg.det(dense), rtol=1e-12)
    element = run(lambda m: m[n - 1, 0])
    assert isinstance(element, jax.Array)
    np.testing.assert_allclose(element, dense[n - 1, 0], rtol=1e-12)

    def loss(values: jax.Array) -> jax.Array:
        m = BCOO(values, a.indices, a.shape)
        return quax.quaxify(lambda m: jnp.linalg.slogdet(m)[1])(m)

    def dense_loss(values: jax.Array) -> jax.Array:
        rows, cols = np.asarray(a.indices).T
        ok = (rows < n) & (cols < n)
        m = jnp.zeros((n, n)).at[rows[ok], cols[ok]].add(values[ok])
        return jnp.linalg.slogdet(m)[1]

    np.testing.assert_allclose(
        jax.grad(loss)(a.data), jax.grad(dense_loss)(a.data), rtol=1e-10, atol=1e-12
    )
