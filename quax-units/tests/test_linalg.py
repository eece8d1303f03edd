"""Linear algebra on quantities against the same computation on the plain (SI) arrays,
and the units of every result."""

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
from hypothesis import given, settings
from jax import lax
from quax_units import Quantity, UnitError, Unitful, dimensionless, unit, ustrip


N = 4
_rng = np.random.default_rng(0)
_M = _rng.normal(size=(N, N)).astype(np.float32)
_EYE = np.eye(N, dtype=np.float32)
_GENERAL = _M + N * _EYE

# Well conditioned: symmetric positive definite, general, and lower triangular.
spd = Quantity(_M @ _M.T + N * _EYE, "m")
general = Quantity(_GENERAL, "kg")
lower = Quantity(np.tril(_M) + N * _EYE, "m")
rhs = Quantity(_rng.normal(size=N).astype(np.float32), "N")
rhs_matrix = Quantity(_rng.normal(size=(N, 2)).astype(np.float32), "N")
ratio = Quantity(_M @ _M.T + N * _EYE, "m / km")


_matmul = quax.quaxify(lambda p, q: p @ q)


def _bare(x):
    return x.array if isinstance(x, Unitful) else x


def _dims(x):
    return x.units if isinstance(x, Unitful) else dimensionless


def check(f, *args, units, rtol=1e-5, atol=1e-6):
    """`quaxify(f)` on quantities, eagerly and under `jit`, equals `f` on their SI
    arrays, and its outputs have `units` (one unit string per output)."""
    is_unitful = lambda x: isinstance(x, Unitful)
    want = jax.tree.leaves(f(*map(_bare, args)))
    for run in (quax.quaxify(f), jax.jit(quax.quaxify(f))):
        got = jax.tree.leaves(run(*args), is_leaf=is_unitful)
        expected = [units] if isinstance(units, str) else units
        assert [_dims(g) for g in got] == [unit(u).dimensions for u in expected]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(_bare(g), w, rtol=rtol, atol=atol)
    return quax.quaxify(f)(*args)


# Solves and inverses ------------------------------------------------------------------


@pytest.mark.parametrize("A", [spd, general])
def test_solve(A):
    x = check(jnp.linalg.solve, A, rhs, units=f"N / {A.unit}")
    # The solution solves the system, in the units of the right-hand side.
    back = _matmul(A, x)
    np.testing.assert_allclose(ustrip("N", back), ustrip("N", rhs), atol=1e-5)
    check(jnp.linalg.solve, A, rhs_matrix, units=f"N / {A.unit}")


def test_solve_plain_right_hand_side():
    check(jnp.linalg.solve, spd, rhs.array, units="1 / m")


@pytest.mark.parametrize("A", [spd, general])
def test_inv(A):
    inverse = check(jnp.linalg.inv, A, units=f"1 / {A.unit}")
    identity = _matmul(A, inverse)
    np.testing.assert_allclose(ustrip("", identity), _EYE, atol=1e-5)


# JAX 0.10 computes 2x2 and 3x3 determinants as products of entries; 0.11 as an LU
# with a "safe" pivot (`where(pivot == 0, 1, pivot)`), which mixes a plain 1 with
# the matrix's units.
_PRODUCT_DETERMINANTS = jax.__version_info__ < (0, 11)


def test_det():
    # `jnp.linalg.det` of an n x n matrix has the units of the matrix to the n.
    check(jnp.linalg.det, ratio, units="")
    for n in (2, 3):
        A = Quantity(_GENERAL[:n, :n], "kg")
        if _PRODUCT_DETERMINANTS:
            check(jnp.linalg.det, A, units=f"kg{n}")
        else:
            with pytest.raises(UnitError, match=r"`select_n` needs operands"):
                quax.quaxify(jnp.linalg.det)(A)
    # JAX computes other sizes as `sign * exp(logabsdet)`, which needs the logarithm
    # of a dimensional quantity.
    for n in (1, N):
        A = Quantity(_GENERAL[:n, :n], "kg")
        with pytest.raises(UnitError, match=r"`log` needs a dimensionless operand"):
            quax.quaxify(jnp.linalg.det)(A)


def test_slogdet():
    check(jnp.linalg.slogdet, ratio, units=["", ""])
    # The logarithm of a dimensional determinant is undefined.
    with pytest.raises(UnitError, match=r"`log` needs a dimensionless operand"):
        quax.quaxify(jnp.linalg.slogdet)(spd)


def test_solve_triangular():
    solve = lambda a, b: jsl.solve_triangular(a, b, lower=True)
    check(solve, lower, rhs, units="N / m")
    check(solve, lower, rhs_matrix, units="N / m")
    transposed = lambda a, b: jsl.solve_triangular(a, b, lower=True, trans="T")
    check(transposed, lower, rhs, units="N / m")
    right = lambda a, b: lax.linalg.triangular_solve(a, b.T, lower=True)
    check(right, lower, rhs_matrix, units="N / m")


def test_lu_factor_and_solve():
    factor_solve = lambda a, b: jsl.lu_solve(jsl.lu_factor(a), b)
    check(factor_solve, general, rhs, units="N / kg")
    # The packed factorisation carries the units of `U`, the pivots none.
    check(jsl.lu_factor, general, units=["kg", ""])


def test_cho_factor_and_solve():
    factor_solve = lambda a, b: jsl.cho_solve(jsl.cho_factor(a), b)
    check(factor_solve, spd, rhs, units="N / m")


def test_custom_linear_solve_checks_solve_inverts_matvec():
    wrong = lambda A, b: lax.custom_linear_solve(lambda x: A @ x, b, lambda _, r: r)
    with pytest.raises(UnitError, match=r"`solve` gives `x` in \[kg m / s2\]"):
        quax.quaxify(wrong)(spd, rhs)
    right = lambda A, b: lax.custom_linear_solve(
        lambda x: A @ x, b, lambda _, r: jnp.linalg.solve(A, r)
    )
    check(right, spd, rhs, units="N / m")


def test_solve_derivatives():
    jvp = lambda A, b, db: jax.jvp(lambda b: jnp.linalg.solve(A, b), (b,), (db,))
    check(jvp, spd, rhs, rhs, units=["N / m", "N / m"])
    vjp = lambda A, b, ct: jax.vjp(lambda b: jnp.linalg.solve(A, b), b)[1](ct)
    check(vjp, spd, rhs, Quantity(rhs.array, "N / m"), units="N / m2")


_units = st.sampled_from(["m", "kg", "s", "N", "km / h", "J"])
_matrices = hnp.arrays(
    np.float32, (N, N), elements=st.floats(-1, 1, width=32, allow_subnormal=False)
).map(lambda m: m @ m.T + N * _EYE)  # symmetric positive definite: well conditioned
_vectors = hnp.arrays(
    np.float32, N, elements=st.floats(-10, 10, width=32, allow_subnormal=False)
)


@settings(max_examples=10, deadline=None)
@given(_matrices, _vectors, _units, _units)
def test_solve_and_inv_properties(A, b, ua, ub):
    A, b = Quantity(A, ua), Quantity(b, ub)
    ratio_unit = unit(ub) / unit(ua)
    x = jax.jit(quax.quaxify(jnp.linalg.solve))(A, b)
    assert x.units == ratio_unit.dimensions
    # Against NumPy's solver, a different float32 algorithm: a looser tolerance.
    np.testing.assert_allclose(
        x.array, np.linalg.solve(A.array, b.array), rtol=1e-4, atol=1e-5
    )
    inverse = jax.jit(quax.quaxify(jnp.linalg.inv))(A)
    assert inverse.units == unit(ua).dimensions ** -1
    y = _matmul(inverse, b)
    np.testing.assert_allclose(ustrip(ratio_unit, y), ustrip(ratio_unit, x), atol=1e-4)


# Factorisations -----------------------------------------------------------------------


def test_cholesky():
    L = check(jnp.linalg.cholesky, spd, units="m**(1/2)")
    back = quax.quaxify(lambda L: L @ L.T)(L)
    np.testing.assert_allclose(ustrip("m", back), ustrip("m", spd), rtol=1e-5)


def test_eigh():
    check(jnp.linalg.eigh, spd, units=["m", ""])
    check(jnp.linalg.eigvalsh, spd, units="m")


def test_eig():
    if jax.default_backend() == "tpu":
        pytest.skip("plain JAX has no TPU lowering of `eig` (nor of `eigvals`)")
    check(jnp.linalg.eig, general, units=["kg", ""])
    check(jnp.linalg.eigvals, general, units="kg")


def test_svd():
    check(jnp.linalg.svd, general, units=["", "kg", ""])
    check(lambda a: jnp.linalg.svd(a, compute_uv=False), general, units="kg")
    check(jnp.linalg.svdvals, general, units="kg")


def test_qr():
    q, r = check(jnp.linalg.qr, general, units=["", "kg"])
    back = _matmul(q, r)
    np.testing.assert_allclose(ustrip("kg", back), ustrip("kg", general), atol=1e-5)


# Functions built on them --------------------------------------------------------------


def test_pinv():
    check(jnp.linalg.pinv, general, units="1 / kg")
    check(lambda a: jnp.linalg.pinv(a, hermitian=True), spd, units="1 / m")


@pytest.mark.parametrize("order", [2, -2, "nuc", "fro", 1, np.inf])
def test_matrix_norms(order):
    check(lambda a: jnp.linalg.norm(a, ord=order), general, units="kg")


def test_matrix_rank_and_cond():
    check(jnp.linalg.matrix_rank, general, units="")
    check(jnp.linalg.cond, general, units="")


def test_matrix_power():
    check(lambda a: jnp.linalg.matrix_power(a, 3), general, units="kg3")
    check(lambda a: jnp.linalg.matrix_power(a, -2), general, units="1 / kg2")
