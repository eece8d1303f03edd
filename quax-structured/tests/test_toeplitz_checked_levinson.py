"""`Toeplitz`'s `jnp.linalg.solve`, `slogdet` and `det` run the Levinson recursion,
checked by its backward error, and GKO (partial pivoting) only where that check
fails: a well-conditioned matrix gets the Levinson recursion's own answer and
pivots, and a matrix with a zero or tiny leading minor (where the recursion
divides by it) still gets dense's values and derivatives, with respect to `b` and
to the column and row, batched and under `vmap` in both orders."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
import scipy.linalg as sl
from jax import lax
from jax.extend.core import primitives
from jax.interpreters import ad
from quax_structured._kernels import levinson
from quax_structured._kernels._gko import gko


# Three 4 x 4 matrices, stacked: a zero diagonal (every odd leading minor zero,
# like [[0, 1], [1, 0]]; the Levinson recursion divides by 0), a leading minor of
# 1e-6 (it loses every digit in float32, six in float64), and a diagonally
# dominant one (it is accurate). Each has a condition number below 30.
_COLUMNS = np.array([[0, 1, 0.5, 0.2], [1e-6, -0.7, 1.2, 0.4], [3, 1, 0.5, 0.2]])
_ROWS = np.array([[0, 1, -0.3, 0.1], [1e-6, 0.9, -0.5, 1.1], [3, -1, 0.4, 0.3]])
_IMAG_COLUMNS = np.array([0, 0.3, -0.2, 0.1])
_IMAG_ROWS = np.array([0, -0.4, 0.1, 0.2])
_B = np.array([[1, -2, 0.5, 1], [0.3, 1, -1, 2], [2, 0.1, 1, -0.5]])


def _leaves(dtype):
    column, row, b = _COLUMNS, _ROWS, _B
    if np.issubdtype(dtype, np.complexfloating):
        column, row = column + 1j * _IMAG_COLUMNS, row + 1j * _IMAG_ROWS
        b = b - 0.5j * b[:, ::-1]
    return tuple(jnp.asarray(x, dtype) for x in (column, row, b[..., None]))


def _dense(column, row):
    """The dense matrix, in plain JAX (not by quax)."""
    n = column.shape[-1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return jnp.where(i >= j, column[..., i - j], row[..., j - i])


def _outputs(matrix, b):
    """`solve` and `slogdet` (`det` reads the same pivots, see
    `test_zero_pivots.py`; the transposed solve runs the same route on `Tᵀ`, see
    `test_pivoting.py`)."""
    return jnp.linalg.solve(matrix, b), *jnp.linalg.slogdet(matrix)


def _loss(outputs) -> tuple[jax.Array, tuple]:
    x, _, logdet = outputs
    return jnp.real(jnp.sum(jnp.sin(x))) + jnp.sum(logdet), outputs


def _loss_of_toeplitz(matrix, b):
    return _loss(quax.quaxify(_outputs)(matrix, b))[0]


# One compiled program for the values and the derivatives (compiling dominates
# these tests' time).
_values_and_grads = jax.jit(
    jax.value_and_grad(
        lambda m, b: _loss(quax.quaxify(_outputs)(m, b)), (0, 1), has_aux=True
    )
)
_dense_grads = jax.grad(lambda c, r, b: _loss(_outputs(_dense(c, r), b))[0], (0, 1, 2))


def _by_leaf(grads):
    """`(d column, d row, d b)` from the derivative with respect to a `Toeplitz`
    and `b`."""
    return grads[0].column, grads[0].row, grads[1]


@pytest.mark.long_running
# CI runs complex64 (the one program of values and derivatives, with conjugation):
# float32 and float64 repeat it in real arithmetic, each at its own tolerance
# (float64's 30 s of compiles, float32's 20 s): sweeps (`bash scripts/test.sh
# sweeps`). The real route stays checked in CI: float64's values at these minors
# (a tiny leading minor, and the check's bound at float64) in test_pivoting.py's
# `test_tiny_leading_minor_float64`, float32's derivatives through the fallback by
# `test_vmap_both_orders_match_dense` below and test_pivoting.py's
# `test_toeplitz_transposed_solve_and_grad_match_dense`.
@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(np.float32, marks=pytest.mark.sweep),
        pytest.param(np.float64, marks=pytest.mark.sweep),
        np.complex64,
    ],
)
def test_zero_and_tiny_leading_minors_match_dense(dtype):
    with jax.enable_x64(dtype == np.float64):
        column, row, b = _leaves(dtype)
        wide = np.complex128 if np.issubdtype(dtype, np.complexfloating) else "f8"
        dense = np.stack(
            [
                sl.toeplitz(c, r)
                for c, r in zip(*map(np.asarray, (column, row)), strict=True)
            ]
        ).astype(wide)
        assert np.linalg.cond(dense).max() < 30
        assert abs(np.linalg.det(dense[0])) > 0.1
        (_, outputs), grads = _values_and_grads(qs.Toeplitz(column, row), b)
        x, sign, logdet = outputs
        rhs = np.asarray(b, wide)
        tol: quax.testing.Tolerance = (
            {"rtol": 3e-5, "atol": 3e-5}
            if dtype != np.float64
            else {"rtol": 1e-10, "atol": 0.0}
        )
        np.testing.assert_allclose(x, np.linalg.solve(dense, rhs), **tol)
        want_sign, want_logdet = np.linalg.slogdet(dense)
        np.testing.assert_allclose(sign, want_sign, **tol)
        np.testing.assert_allclose(logdet, want_logdet, **tol)

        # Derivatives with respect to the column, the row and `b`, against
        # `jax.grad` of the same program on the dense matrix.
        got, want = _by_leaf(grads), _dense_grads(column, row, b)
        tol = (
            {"rtol": 1e-4, "atol": 1e-4}
            if dtype != np.float64
            else {"rtol": 1e-9, "atol": 0.0}
        )
        for g, w in zip(got, want, strict=True):
            assert np.all(np.isfinite(g))
            np.testing.assert_allclose(g, w, **tol)


def _vmap_of_grad(matrix, b):
    return jax.vmap(jax.grad(_loss_of_toeplitz, (0, 1)))(matrix, b)


def _grad_of_vmap(matrix, b):
    return jax.grad(lambda *a: jnp.sum(jax.vmap(_loss_of_toeplitz)(*a)), (0, 1))(
        matrix, b
    )


@pytest.mark.long_running
# `grad` of `vmap` repeats the check of `vmap` of `grad` in the other order: a sweep.
@pytest.mark.parametrize(
    "order",
    [
        pytest.param(_vmap_of_grad, id="vmap-of-grad"),
        pytest.param(_grad_of_vmap, id="grad-of-vmap", marks=pytest.mark.sweep),
    ],
)
def test_vmap_both_orders_match_dense(order, monkeypatch):
    # Under `vmap` over matrices the routes' `lax.cond`s are decided once for
    # the batch, which mixes matrices where the Levinson recursion fails with one
    # where it is accurate: the fallback runs, and each matrix's derivative
    # follows its own route; the Levinson recursion's NaN at the zero leading
    # minor must not reach the derivative through a zero cotangent.
    #
    # `jax.grad` of `vmap` failed (NotImplementedError) while the predicates were
    # batched: JAX turns such a `lax.cond` into a select whose operands it wraps
    # in `stop_gradient`, the tangents in the JVP rules' `lax.cond`s too, and
    # `stop_gradient` has no transpose rule (JAX issues #22011, #39219). lineax
    # registers one when imported (quax-units imports it), which hid the failure
    # wherever quax-units was installed: the test takes it away, as JAX has it.
    monkeypatch.delitem(
        ad.primitive_transposes,
        primitives.stop_gradient_p,
        raising=False,
    )
    column, row, b = _leaves(np.float32)
    matrix = qs.Toeplitz(column, row)
    wants = _dense_grads(column, row, b)
    got = jax.jit(order)(matrix, b)
    for g, w in zip(_by_leaf(got), wants, strict=True):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_accurate_levinson_is_the_answer():
    # A well-conditioned non-symmetric matrix: the solve and the pivots are the
    # Levinson recursion's own (GKO's differ: this failed when every untagged
    # matrix ran GKO). The pivots bit for bit; the solve within 8 ulps, as two
    # programs computing one recursion may round apart where XLA compiles them
    # apart (4 ulps, 9 of the 64 entries, with scripts/test.sh's XLA flags on
    # one machine, 2026-12-07; 0 with XLA's defaults), where GKO's solve is
    # some hundreds of ulps from the recursion's (checked below) and its pivots
    # are others.
    n = 64
    k = np.arange(n)
    column = jnp.asarray(np.cos(0.7 * k) / (1 + k), jnp.float32).at[0].set(4)
    row = jnp.asarray(np.sin(1.3 * k) / (1 + k), jnp.float32)
    b = jnp.asarray(np.cos(0.37 * k), jnp.float32)

    def ours(matrix, b):
        return jnp.linalg.solve(matrix, b), jnp.diagonal(lax.linalg.lu(matrix)[0])

    x, pivots = jax.jit(quax.quaxify(ours))(qs.Toeplitz(column, row), b)
    want_x, want_pivots = jax.jit(levinson)(column, row, b[:, None])
    np.testing.assert_array_max_ulp(x, want_x[:, 0], maxulp=8)
    np.testing.assert_array_equal(pivots, want_pivots)
    gko_x, gko_pivots = jax.jit(gko)(column, row, b[:, None])
    with pytest.raises(AssertionError):
        np.testing.assert_array_max_ulp(gko_x[:, 0], want_x[:, 0], maxulp=64)
    assert not np.array_equal(gko_pivots, want_pivots)


def test_neither_route_accurate_is_nan():
    # A NaN entry: the Levinson recursion and GKO both fail the check, and the
    # answer is NaN (never a number the check did not pass).
    column = jnp.array([2.0, 1, jnp.nan, 0.2])
    row = jnp.array([2.0, -1, 0.4, 0.3])
    x, _, logdet = jax.jit(quax.quaxify(_outputs))(
        qs.Toeplitz(column, row), jnp.ones(4)
    )
    assert np.isnan(x).all() and np.isnan(logdet).all()
