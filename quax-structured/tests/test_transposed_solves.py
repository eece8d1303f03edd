"""Transposed solves on non-symmetric matrices of every structure with a
factorisation: `jax.scipy.linalg.lu_solve(lu_factor(M), b, trans=1)` (and
`trans=2`), and `jax.grad` of `jnp.linalg.solve(M, b)` (whose reverse pass
solves with `Mᵀ`), against plain JAX on the dense matrix. A symmetric matrix
would hide a transpose that is missing or applied twice; every matrix here has
`M != Mᵀ`. The complex matrices (each real one plus an imaginary part) are not
Hermitian either, so a conjugation missing from `trans=2` (`Mᴴ x = b`) or
applied to `trans=1` shows."""

import functools as ft

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_structured as qs


# Every test of this module runs in float64 (`x64`, in conftest.py).
pytestmark = pytest.mark.usefixtures("x64")


N = 6


def _rand(seed: int, *shape: int) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)


def _structures():
    """One well-conditioned matrix of each type that factors, non-symmetric
    (but the diagonal one)."""
    eye = jnp.eye(3)
    bands = _rand(4, 4, N).at[1].add(6.0)
    return [
        qs.TridiagonalMatrix(_rand(0, N - 1), 4 + _rand(1, N), _rand(2, N - 1) + 1),
        qs.Diagonal(2 + _rand(3, N)),
        qs.LowerTriangular(_rand(5, N, N) + 4 * jnp.eye(N)),
        qs.UpperTriangular(_rand(6, N, N) + 4 * jnp.eye(N)),
        qs.LowRankPlusDiagonal(
            3 + jnp.abs(_rand(7, N)), _rand(8, N, 2), _rand(9, N, 2)
        ),
        qs.Kronecker(_rand(10, 2, 2) + 3 * jnp.eye(2), _rand(11, 3, 3) + 3 * eye),
        qs.Banded(bands, 1, 2),
        qs.BlockDiagonal(_rand(12, 3, 2, 2) + 3 * jnp.eye(2)),
        # Diagonally dominant: regular.
        qs.Circulant(jnp.array([6.0, 1.0, -2.0, 0.5, 0.3, 1.5])),
        qs.Toeplitz(
            jnp.array([5.0, 1.0, -2.0, 0.5, 0.0, 1.5]),
            jnp.array([5.0, -1.0, 0.3, 2.0, 1.0, -0.5]),
        ),
    ]


def _complex(m, seed):
    """`m` plus an imaginary part in every float leaf (scaled to keep each matrix
    regular): a complex matrix of the same structure that is not Hermitian."""
    leaves, treedef = jax.tree.flatten(m)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(
        treedef,
        [
            leaf + 0.2j * jax.random.normal(key, jnp.shape(leaf), jnp.float64)
            for leaf, key in zip(leaves, keys, strict=True)
        ],
    )


# The module's matrices (`_structures`, in this order), built in float64 when a test
# first asks (under `x64`): not at import, where a backend without native float64
# would compile float64 and complex128 arithmetic while pytest collects (on a TPU
# that took minutes, and complex128 aborted the process in its compiler).
# `ScaledIdentity` only complex (a real one is symmetric).
IDS = [
    "TridiagonalMatrix",
    "Diagonal",
    "LowerTriangular",
    "UpperTriangular",
    "LowRankPlusDiagonal",
    "Kronecker",
    "Banded",
    "BlockDiagonal",
    "Circulant",
    "Toeplitz",
]
COMPLEX_IDS = [*IDS, "ScaledIdentity"]


@ft.cache
def _real_structures() -> list:
    return _structures()


@ft.cache
def _complex_structures() -> list:
    return [
        *(_complex(m, 30 + i) for i, m in enumerate(_real_structures())),
        qs.ScaledIdentity(jnp.asarray(2.0 - 0.5j), N),
    ]


def test_the_ids_name_the_structures():
    assert [type(m).__name__ for m in _real_structures()] == IDS
    assert [type(m).__name__ for m in _complex_structures()] == COMPLEX_IDS


def _dense(m):
    return m.enable_materialise().dense()


def test_matrices_are_not_symmetric():
    for m in _real_structures():
        if isinstance(m, qs.Diagonal):
            continue
        d = np.asarray(_dense(m))
        assert not np.allclose(d, d.T), type(m).__name__


@pytest.mark.parametrize("index", range(len(IDS)), ids=IDS)
@pytest.mark.parametrize("trans", [0, 1, 2])
def test_lu_solve_trans_matches_dense(index, trans):
    m = _real_structures()[index]
    b = _rand(20, N, 2)

    def solve(m, b):
        return jsl.lu_solve(jsl.lu_factor(m), b, trans=trans)

    got = jax.jit(quax.quaxify(solve))(m, b)
    d = _dense(m)
    want = jnp.linalg.solve(d if trans == 0 else d.T, b)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("index", range(len(IDS)), ids=IDS)
def test_grad_of_solve_matches_dense(index):
    """The gradient with respect to the right-hand side (`M⁻ᵀ w`) and to every
    float leaf of the structure, against `jax.grad` through the dense matrix."""
    m = _real_structures()[index]
    b, w = _rand(21, N), _rand(22, N)

    def loss(m, b):
        return jnp.dot(jnp.linalg.solve(m, b), w)

    got_m, got_b = jax.jit(jax.grad(quax.quaxify(loss), argnums=(0, 1)))(m, b)
    want_m, want_b = jax.grad(lambda m, b: loss(_dense(m), b), argnums=(0, 1))(m, b)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got_b, jnp.linalg.solve(_dense(m).T, w), rtol=1e-9)
    for g, e in zip(jax.tree.leaves(got_m), jax.tree.leaves(want_m), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-8, atol=1e-10)


def test_complex_matrices_are_not_hermitian():
    for m in _complex_structures():
        d = np.asarray(_dense(m))
        assert not np.allclose(d, d.conj().T), type(m).__name__


@pytest.mark.parametrize("index", range(len(COMPLEX_IDS)), ids=COMPLEX_IDS)
@pytest.mark.parametrize("trans", [0, 1, 2])
def test_complex_lu_solve_trans_matches_dense(index, trans):
    """`trans=2` solves `Mᴴ x = b`, `trans=1` `Mᵀ x = b`: against JAX's dense
    `lu_solve` with the same `trans` and against NumPy."""
    m = _complex_structures()[index]
    b = _rand(23, N, 2) + 1j * _rand(24, N, 2)

    def solve(m, b):
        return jsl.lu_solve(jsl.lu_factor(m), b, trans=trans)

    d = _dense(m)
    want = solve(d, b)
    op = [d, d.T, d.conj().T][trans]
    np.testing.assert_allclose(want, np.linalg.solve(op, b), rtol=1e-9, atol=1e-11)
    for got in (quax.quaxify(solve)(m, b), jax.jit(quax.quaxify(solve))(m, b)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("index", range(len(COMPLEX_IDS)), ids=COMPLEX_IDS)
@pytest.mark.parametrize("trans", [1, 2])
def test_grad_of_complex_lu_solve_matches_dense(index, trans):
    """The gradient of a real loss of `lu_solve(..., trans)` with respect to the
    complex right-hand side and every leaf, against `jax.grad` through JAX's
    dense `lu_solve`."""
    m = _complex_structures()[index]
    b = _rand(25, N) + 1j * _rand(26, N)
    w = _rand(27, N) - 2j * _rand(28, N)

    def loss(m, b):
        x = jsl.lu_solve(jsl.lu_factor(m), b, trans=trans)
        return jnp.real(jnp.vdot(w, x)) + jnp.sum(jnp.abs(x) ** 2)

    got_m, got_b = jax.jit(jax.grad(quax.quaxify(loss), argnums=(0, 1)))(m, b)
    want_m, want_b = jax.grad(lambda m, b: loss(_dense(m), b), argnums=(0, 1))(m, b)
    np.testing.assert_allclose(got_b, want_b, rtol=1e-9, atol=1e-11)
    for g, e in zip(jax.tree.leaves(got_m), jax.tree.leaves(want_m), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("first", [False, True])
def test_pivoted_halves_of_mixed_conjugation_refuse(first):
    """A conjugated first half of a pivoted solve (`Tᴴ`) with a second half that
    is not (or the converse) is no solve `lu_solve` binds: it refuses, never the
    solution of the other system."""
    t = _complex_structures()[0]
    assert isinstance(t, qs.TridiagonalMatrix)
    b = _rand(29, N, 1) + 1j * _rand(30, N, 1)

    def halves(t, b):
        lu, _, _ = jax.lax.linalg.lu(t)
        solve = ft.partial(jax.lax.linalg.triangular_solve, lu, left_side=True)
        y = solve(b, lower=False, transpose_a=True, conjugate_a=first)
        return solve(
            y, lower=True, transpose_a=True, conjugate_a=not first, unit_diagonal=True
        )

    with pytest.raises(RuntimeError, match="Refusing to materialise `HalfSolved`"):
        quax.quaxify(halves)(t, b)
