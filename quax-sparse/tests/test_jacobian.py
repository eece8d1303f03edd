"""Sparse Jacobians and Hessians by colouring (`quax_sparse.jacfwd`, `jacrev`,
`hessian`) against dense `jax.jacfwd`/`jax.hessian`, and a Newton solve that pairs
them with the direct solve."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_sparse
import scipy.sparse
from quax_sparse import BCOO, CSR


pytestmark = pytest.mark.usefixtures("x64")


def _stencil(m: int) -> BCOO:
    """The pattern of the 5-point stencil on an `m x m` grid."""
    # scipy leaves `offsets` unannotated: pyright takes its default's type, `int`.
    one = scipy.sparse.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(m, m))  # pyright: ignore[reportArgumentType]
    eye = scipy.sparse.eye(m)
    return BCOO.from_scipy(scipy.sparse.kron(one, eye) + scipy.sparse.kron(eye, one))


def _residual(m: int):
    """`-Δu + u³ - 1` on an `m x m` grid (zero boundary), matrix-free."""

    def f(u):
        g = u.reshape(m, m)
        p = jnp.pad(g, 1)
        lap = 4 * g - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]
        return (lap * (m + 1) ** 2 + g**3 - 1).reshape(-1)

    return f


def _dense_at(jac: np.ndarray, x: BCOO) -> np.ndarray:
    rows, cols = np.asarray(x.indices).T
    return np.asarray(jac)[rows, cols]


@pytest.mark.parametrize("mode", ["jacfwd", "jacrev"])
def test_jacobian_matches_dense(mode):
    m = 6
    f, pattern = _residual(m), _stencil(m)
    u = jnp.asarray(np.random.default_rng(0).normal(size=m * m))
    jac = getattr(quax_sparse, mode)(f, pattern)
    got = jax.jit(jac)(u)
    want = np.asarray(jax.jacfwd(f)(u))
    assert isinstance(got, BCOO) and got.unique_indices and got.indices_sorted
    np.testing.assert_allclose(got.todense(), want, rtol=1e-13, atol=1e-10)
    # 5 colours suffice for the 5-point stencil; greedy uses a few more at most.
    assert 5 <= jac.n_colours <= 8 < m * m


def test_nonsquare_jacobian_and_csr_pattern():
    n = 20

    def f(x):  # (n,) -> (n - 1,): differences and a product of neighbours
        return jnp.diff(x) + x[1:] * x[:-1]

    rows = np.arange(n - 1)
    dense_pattern = np.zeros((n - 1, n))
    dense_pattern[rows, rows] = dense_pattern[rows, rows + 1] = 1
    pattern = CSR.fromdense(dense_pattern, nse=2 * (n - 1))
    x = jnp.linspace(-1, 1, n)
    want = np.asarray(jax.jacfwd(f)(x))
    for mode in (quax_sparse.jacfwd, quax_sparse.jacrev):
        jac = mode(f, pattern)
        np.testing.assert_allclose(jac(x).todense(), want, rtol=1e-14)
        assert jac.n_colours == 2


def test_padding_and_duplicates_in_the_pattern_are_dropped():
    f = lambda x: x**2
    indices = np.array([[0, 0], [1, 1], [1, 1], [2, 2], [3, 3]], np.int32)
    pattern = BCOO(np.ones(5), indices, (3, 3))
    jac = quax_sparse.jacfwd(f, pattern)
    got = jac(jnp.array([1.0, 2.0, 3.0]))
    assert got.nse == 3
    np.testing.assert_allclose(got.todense(), np.diag([2.0, 4.0, 6.0]))
    assert jac.n_colours == 1


def test_hessian_matches_dense():
    n = 30

    def energy(x):
        return (
            jnp.sum(x[1:] * x[:-1]) + jnp.sum(x**4) + jnp.sum(jnp.sin(x[2:] * x[:-2]))
        )

    band = np.sum([np.eye(n, k=k) for k in range(-2, 3)], axis=0)
    pattern = BCOO.fromdense(band, nse=int(band.sum()))
    x = jnp.asarray(np.random.default_rng(1).normal(size=n))
    got = jax.jit(quax_sparse.hessian(energy, pattern))(x)
    np.testing.assert_allclose(got.todense(), jax.hessian(energy)(x), rtol=1e-12)


def test_colouring_is_valid():
    pattern = _stencil(9)
    p = np.asarray(pattern.todense()) != 0
    for by, conflict in [("columns", p.T @ p), ("rows", p @ p.T)]:
        c = quax_sparse.colour(pattern, by=by)
        same = c[:, None] == c[None, :]
        np.fill_diagonal(same, False)
        assert not np.any(same & conflict)


@pytest.mark.float64
def test_newton_solve_on_a_discretised_pde():
    # float64 is the subject: Newton's residual to 1e-9 and the dense iterates to
    # 1e-12 (skipped on a backend without float64, a TPU).
    m = 16
    f, pattern = _residual(m), _stencil(m)
    jac = quax_sparse.jacfwd(f, pattern)
    solve = quax.quaxify(jnp.linalg.solve)

    @jax.jit
    def step(u):
        return u + solve(jac(u), -f(u))

    @jax.jit
    def dense_step(u):
        return u + jnp.linalg.solve(jax.jacfwd(f)(u), -f(u))

    u = v = jnp.zeros(m * m)
    for _ in range(6):
        u, v = step(u), dense_step(v)
    assert float(jnp.linalg.norm(f(u))) < 1e-9
    np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-14)


def test_compiled_jacobian_holds_no_dense_matrix():
    m = 24
    n = m * m
    jac = quax_sparse.jacfwd(_residual(m), _stencil(m))
    hlo = jax.jit(jac).lower(jnp.zeros(n)).compile().as_text()
    assert hlo is not None
    assert not re.search(rf"\[{n},{n}\]", hlo)
    dense = jax.jit(jax.jacfwd(_residual(m))).lower(jnp.zeros(n)).compile().as_text()
    assert dense is not None
    assert re.search(rf"\[{n},{n}\]", dense)


def test_errors_name_the_argument():
    pattern = _stencil(3)
    with pytest.raises(ValueError, match=r"jacfwd.*pattern.*BCOO"):
        quax_sparse.jacfwd(jnp.sin, np.eye(9))  # pyright: ignore[reportArgumentType]  (the error tested)
    with pytest.raises(ValueError, match=r"argument must have shape \(9,\)"):
        quax_sparse.jacfwd(jnp.sin, pattern)(jnp.zeros(4))
    with pytest.raises(ValueError, match=r"must return shape \(9,\)"):
        quax_sparse.jacrev(lambda x: x[:3], pattern)(jnp.zeros(9))
    with pytest.raises(ValueError, match=r"concrete.*outside `jax.jit`"):
        jax.jit(lambda p: quax_sparse.jacfwd(jnp.sin, p))(pattern)
    with pytest.raises(ValueError, match=r"`by` must be"):
        quax_sparse.colour(pattern, by="diagonal")


@pytest.mark.parametrize("mode", ["jacfwd", "jacrev"])
@pytest.mark.parametrize("jit", [False, True])
def test_a_missed_nonzero_in_an_unread_slot_gives_nan(mode, jit):
    # A tridiagonal pattern for a residual that also couples u[0] to u[n - 1]: with
    # n = 6 the colours are [1, 2, 0, 1, 2, 0], and the missed entry (0, 5) lands in
    # a slot that no entry of the pattern reads. Before, it was dropped and the
    # result was the Jacobian without it (finite, wrong); now every value is NaN.
    n = 6

    def f(u):
        p = jnp.pad(u, 1)
        return (2 * u - p[:-2] - p[2:] + u**3).at[0].add(u[n - 1] ** 2)

    band = 2 * jnp.eye(n) - jnp.eye(n, k=1) - jnp.eye(n, k=-1)
    pattern = BCOO.fromdense(band, nse=3 * n - 2)
    jac = getattr(quax_sparse, mode)(f, pattern)
    assert jac.colours.tolist() == [1, 2, 0, 1, 2, 0]
    u = jnp.linspace(0.1, 1.0, n)
    got = (jax.jit(jac) if jit else jac)(u)
    assert np.isnan(np.asarray(got.data)).all()
    # The same residual with the coupling inside the pattern is exact.
    full = BCOO.fromdense(band.at[0, n - 1].set(1.0), nse=3 * n - 1)
    np.testing.assert_allclose(
        getattr(quax_sparse, mode)(f, full)(u).todense(),
        jax.jacfwd(f)(u),
        rtol=1e-12,
        atol=1e-12,
    )
