"""Derivatives of `jnp.linalg.slogdet` and `det` (custom-JVP functions) with respect
to the leaves of each structure, against the dense program built independently
from the same leaves (plain `jnp`)."""

import jax
import jax.numpy as jnp
import jax.scipy as jsp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from jax.extend.core import primitives
from jax.interpreters import ad


# The leaves are numpy arrays: built without compiling anything (each eager `jnp`
# operation compiles once; jitted programs below compile once per test).
N = 4
_rng = np.random.default_rng(7)
_m = (_rng.normal(size=(N, N)) / 2 + 3 * np.eye(N)).astype(np.float32)


def _normal(*shape):
    return _rng.normal(size=shape).astype(np.float32)


def _banded_dense(bands, p=2, q=1):
    out = jnp.zeros((N, N))
    for d in range(-p, q + 1):
        row = bands[d + p]
        out = out + jnp.diag(row[: N - d] if d >= 0 else row[-d:], k=d)
    return out


def _circulant_dense(column):
    return jnp.stack([jnp.roll(column, j) for j in range(N)], axis=-1)


def _toeplitz_dense(column, row):
    i, j = np.indices((N, N))
    return jnp.where(i >= j, column[np.abs(i - j)], row[np.abs(i - j)])


def _sym(a):
    return (a + a.T) / 2


_column = np.concatenate([[4.0], _normal(N - 1) / 2]).astype(np.float32)

# name: (structure from leaves, dense matrix from the same leaves, leaves)
CASES = {
    "tridiagonal": (
        qs.TridiagonalMatrix,
        lambda lo, m, up: jnp.diag(m) + jnp.diag(lo, -1) + jnp.diag(up, 1),
        (np.full(N - 1, 0.5), 3.0 + np.arange(N), np.full(N - 1, -0.3)),
    ),
    "diagonal": (qs.Diagonal, jnp.diag, (1.0 + np.arange(N) / 2,)),
    "lower": (qs.LowerTriangular, jnp.tril, (_m,)),
    "upper": (qs.UpperTriangular, jnp.triu, (_m,)),
    "banded": (
        lambda b: qs.Banded(b, 2, 1),
        _banded_dense,
        (_normal(4, N) / 3 + np.array([0, 0, 3.0, 0])[:, None],),
    ),
    "block_diagonal": (
        qs.BlockDiagonal,
        lambda b: jsp.linalg.block_diag(*b),
        (_normal(2, 2, 2) / 3 + 2 * np.eye(2),),
    ),
    "kronecker": (qs.Kronecker, jnp.kron, (_m[:2, :2], _m[2:, 2:])),
    "kronecker_symmetric": (
        lambda a, b: qs.Kronecker(a, b, symmetric=True),
        lambda a, b: jnp.kron(_sym(a), _sym(b)),
        (_sym(_m[:2, :2]), _sym(_m[2:, 2:])),
    ),
    "low_rank_plus_diagonal": (
        qs.LowRankPlusDiagonal,
        lambda d, u, v: jnp.diag(d) + u @ v.T,
        (1.0 + np.arange(N) / 3, _normal(N, 2) / 2, _m[:, :2] / 3),
    ),
    "low_rank_plus_diagonal_symmetric": (
        qs.LowRankPlusDiagonal,
        lambda d, u: jnp.diag(d) + u @ u.T,
        (1.0 + np.arange(N) / 3, _normal(N, 2) / 2),
    ),
    "circulant": (qs.Circulant, _circulant_dense, (_column,)),
    "toeplitz": (qs.Toeplitz, _toeplitz_dense, (_column, _column[::-1] / 2)),
}

_b = np.arange(1.0, N + 1, dtype=np.float32)


def _loss(a, scale):
    """`log|det a| + det(a) / scale + sum(a⁻¹ b)`: two custom-JVP functions and a
    `custom_linear_solve` in one program (without `det` where `scale` is `None`)."""
    out = jnp.linalg.slogdet(a)[1] + jnp.sum(jnp.linalg.solve(a, _b))
    return out if scale is None else out + jnp.linalg.det(a) / scale


@pytest.mark.parametrize("name", CASES)
def test_gradient_matches_dense(name):
    make, dense, leaves = CASES[name]
    leaves = [np.asarray(x, np.float32) for x in leaves]
    # `det`'s derivative of the structures in `SINGULAR` is tested there (against
    # cofactors, which hold at any matrix).
    scale = None if name in SINGULAR else float(np.linalg.det(jax.jit(dense)(*leaves)))
    argnums = tuple(range(len(leaves)))
    # Under `jit`: one compiled program each (eager, each `jnp` function compiles).
    got_value, got = jax.jit(
        jax.value_and_grad(lambda *x: quax.quaxify(_loss)(make(*x), scale), argnums)
    )(*leaves)
    want_value, want = jax.jit(
        jax.value_and_grad(lambda *x: _loss(dense(*x), scale), argnums)
    )(*leaves)
    np.testing.assert_allclose(got_value, want_value, rtol=1e-4)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=1e-4 * np.abs(w).max())


# The structures whose solve or determinant decides a `lax.cond` on the matrix's
# numbers, but `Toeplitz` (in `test_toeplitz_checked_levinson.py`, with a batch
# that takes its fallback): every other one's program has no data-dependent
# branch, and all of them passed this test when it was written.
BRANCHING = ["low_rank_plus_diagonal", "low_rank_plus_diagonal_symmetric"]


# The symmetric variant repeats the check with a Cholesky factor: a sweep
# (`bash scripts/test.sh sweeps`).
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.sweep) if "symmetric" in name else name
        for name in BRANCHING
    ],
)
def test_gradient_of_vmap_matches_dense(name, monkeypatch):
    """`jax.grad` of `vmap` over two matrices of each structure: a `lax.cond` in a
    JVP rule that takes tangents must stay a branch under `vmap` (see
    `for_the_batch`): with a batched predicate JAX selects, wraps the tangents in
    `stop_gradient`, and cannot transpose it (`Toeplitz` failed so with
    quax-structured alone). lineax, which quax-units imports, registers a
    transpose for `stop_gradient`: taken away here, as JAX has it."""
    monkeypatch.delitem(
        ad.primitive_transposes, primitives.stop_gradient_p, raising=False
    )
    make, dense, leaves = CASES[name]
    stacked = [np.stack([x, 1.1 * x]).astype(np.float32) for x in leaves]
    scale = 7.0  # with `det`

    def summed(loss, matrix):
        def over_the_batch(*stacked):
            return jnp.sum(jax.vmap(lambda *x: loss(matrix(*x), scale))(*stacked))

        return jax.jit(jax.grad(over_the_batch, tuple(range(len(stacked)))))

    got = summed(quax.quaxify(_loss), make)(*stacked)
    want = summed(_loss, dense)(*stacked)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=1e-4 * np.abs(w).max())


def _cofactors(a):
    """The cofactor matrix `adj(a)ᵀ` (the derivative of `det`), in float64 numpy."""
    a = np.asarray(a, np.float64)
    n = a.shape[0]
    out = np.empty_like(a)
    for i in range(n):
        for j in range(n):
            minor = np.delete(np.delete(a, i, 0), j, 1)
            out[i, j] = (-1) ** (i + j) * np.linalg.det(minor)
    return out


_rank3 = np.array([[2, 1, 0, 1], [1, 3, 1, 0], [0, 1, 4, 1], [3, 4, 1, 1]], np.float32)
_one = np.array([[2.0]], np.float32)
_upper = np.array([[1, 2, 3, 1], [0, 2, 1, 1], [0, 0, 3, 1], [0, 0, 0, 0]], np.float32)
_ones = np.ones(N - 1, np.float32)


def _with_diagonal(a, d):
    a = np.array(a, np.float32)
    np.fill_diagonal(a, d)
    return a


_tri = lambda lo, m, up: jnp.diag(m) + jnp.diag(lo, -1) + jnp.diag(up, 1)
# Diagonals with the zero pivot first, in the middle, last, and two zero pivots.
_ZEROS = {
    "first": [0, 2, 3, 1],
    "middle": [2, 0, 3, 1],
    "last": [2, 3, 1, 0],
    "two": [0, 3, 0, 1],
}
# Tridiagonal main diagonals (unit off-diagonals) of singular matrices (rank
# n - 1): the pivots without pivoting are 0, inf, 1, 0 (the first zero); 1, 0,
# inf, 0 (the second); 2, 1.5, 1.67, 0 (the last).
_TRIDIAGONAL = {
    "first": [0, 2, 1, 1],
    "middle": [1, 1, 2, 0],
    "last": [2, 1.5, 2, 1],
}
_circulant = CASES["circulant"][1]
_block_diagonal = CASES["block_diagonal"][1]
_singular_block = np.array([[1, 2], [2, 4]], np.float32)
_regular_block = np.array([[2, 1], [0, 3]], np.float32)


def _stack(*cases):
    """Cases (tuples of leaves) stacked leaf by leaf, for one vmapped program."""
    return tuple(
        np.stack([np.asarray(x, np.float32) for x in leaf])
        for leaf in zip(*cases, strict=True)
    )


_decoupled = np.array([1, 0, 1], np.float32)

# Singular matrices, stacked (one compiled program each, vmapped over the cases),
# with whether each case has rank n - 2 (a zero derivative; else rank n - 1, the
# cofactors, not zero): the zero pivot first, in the middle, or last. The
# reference is numpy's cofactors, not dense JAX (which gives zeros for
# `diag(2, 0, 3, 1)` and for upper triangular matrices).
SINGULAR = {
    "tridiagonal": (
        qs.TridiagonalMatrix,
        _tri,
        _stack(
            *[(_ones, np.array(m, np.float32), _ones) for m in _TRIDIAGONAL.values()],
            # Two blocks, the second one singular (a zero pivot in the middle).
            (_decoupled, np.array([1, 0, 1, 1]), _decoupled),
        ),
        (False,) * 4,
    ),
    "scaled_identity_zero": (
        lambda s: qs.ScaledIdentity(s, N),
        lambda s: s * jnp.eye(N),
        _stack((0,)),
        (True,),
    ),
    "block_diagonal": (
        qs.BlockDiagonal,
        _block_diagonal,
        _stack(
            (np.stack([_singular_block, _regular_block]),),
            (np.stack([_singular_block, _singular_block]),),
        ),
        (False, True),
    ),
    # Eigenvalue 0 first, and at frequency 2 (in the middle).
    "circulant": (
        qs.Circulant,
        _circulant,
        _stack(([1, -1, 0, 0],), ([1, 1, 0, 0],)),
        (False, False),
    ),
    "kronecker_1x1_right": (qs.Kronecker, jnp.kron, _stack((_rank3, _one)), (False,)),
    "kronecker_1x1_left": (qs.Kronecker, jnp.kron, _stack((_one, _rank3)), (False,)),
    "kronecker_rank_2": (
        qs.Kronecker,
        jnp.kron,
        _stack((np.ones((2, 2)), _m[:2, :2])),
        (True,),
    ),
    "upper": (qs.UpperTriangular, jnp.triu, _stack((_upper,)), (False,)),
    "lower": (qs.LowerTriangular, jnp.tril, _stack((_upper.T,)), (False,)),
}


@pytest.mark.parametrize("name", SINGULAR)
def test_det_gradient_at_singular_matrices(name):
    """The derivative of `det` is the adjugate, not zero, at a matrix of rank n - 1
    (against numpy's cofactors, pulled back to the leaves by plain JAX)."""
    make, dense, stacked, rank_2 = SINGULAR[name]
    argnums = tuple(range(len(stacked)))
    det = quax.quaxify(jnp.linalg.det)
    got = jax.jit(jax.vmap(jax.grad(lambda *x: det(make(*x)), argnums)))(*stacked)
    for k, low_rank in enumerate(rank_2):
        a, pullback = jax.vjp(dense, *(x[k] for x in stacked))
        want = pullback(jnp.asarray(_cofactors(a), a.dtype))
        assert (max(np.abs(w).max() for w in want) > 0.5) != low_rank
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g[k], w, rtol=1e-4, atol=1e-4)


def _banded11(main):
    """A `Banded` matrix of bandwidths (1, 1), unit off-diagonals."""
    main = np.array(main, np.float32)
    return qs.Banded(np.stack([np.ones_like(main), main, np.ones_like(main)]), 1, 1)


# One compiled program per structure, over the four diagonals of `_ZEROS` (vmap);
# (structure, dense matrix, pullback of the cofactors to the leaf: numpy).
ZERO_PIVOTS = {
    "diagonal": (
        qs.Diagonal,
        np.diag,
        np.diag,
        np.array(list(_ZEROS.values()), np.float32),
    ),
    "lower": (
        qs.LowerTriangular,
        np.tril,
        np.tril,
        np.stack([_with_diagonal(_m.T, d) for d in _ZEROS.values()]),
    ),
    "upper": (
        qs.UpperTriangular,
        np.triu,
        np.triu,
        np.stack([_with_diagonal(_m, d) for d in _ZEROS.values()]),
    ),
}


@pytest.mark.parametrize("name", ZERO_PIVOTS)
def test_det_gradient_with_zero_pivots(name):
    """Diagonal and triangular matrices with the zero pivot first, in the middle,
    last (the cofactors, not zero), and two zero pivots (zero), against numpy."""
    make, dense, pullback, stacked = ZERO_PIVOTS[name]
    det = quax.quaxify(jnp.linalg.det)
    got = jax.jit(jax.vmap(jax.grad(lambda x: det(make(x)))))(stacked)
    for k, (leaf, g) in enumerate(zip(stacked, got, strict=True)):
        want = pullback(_cofactors(dense(leaf)))
        assert (np.abs(want).max() > 0.5) != (k == 3)  # "two": rank n - 2
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4)


# Structures without a division-free `det` (`determinant`): the derivative of the
# product of `lu`'s pivots, exact where only the last pivot is zero, NaN (never a
# silent zero) where another one is. Low rank plus diagonal: the derivative of
# the matrix determinant lemma (`det D · det K`) wherever Woodbury solves its
# probe system accurately, so exact also where its LU without pivoting has a
# zero first pivot (`low_rank_plus_diagonal_first`; before, the LU's pivots were
# computed beside the lemma's and their NaN derivative reached the gradient).
# `Banded` and `Toeplitz` pivot: exact at a
# zero pivot of the unpivoted LU (`banded_middle`: rank n - 1, the second one;
# `toeplitz_first`: regular, the first one). Their derivative at regular matrices
# is also in `test_gradient_matches_dense`.
THROUGH_FACTORS = {
    "banded_last": (_banded11([2, 1.5, 2, 1]), False),
    "banded_middle": (_banded11([1, 1, 2, 0]), False),
    "low_rank_plus_diagonal_first": (
        qs.LowRankPlusDiagonal(
            np.array([-1, 1, 2, 3], np.float32), np.array([[1], [2], [0.5], [1]])
        ),
        False,
    ),
    "toeplitz_first": (
        qs.Toeplitz(
            np.array([0, 1, 2, 3], np.float32), np.array([0, 1, 1, 1], np.float32)
        ),
        False,
    ),
}


@pytest.mark.parametrize("name", THROUGH_FACTORS)
def test_det_gradient_through_factors(name):
    matrix, nan = THROUGH_FACTORS[name]
    got = jax.jit(jax.grad(lambda m: quax.quaxify(jnp.linalg.det)(m)))(matrix)
    leaves = [g for g in jax.tree.leaves(got) if jnp.issubdtype(g.dtype, jnp.inexact)]
    if nan:
        assert any(np.isnan(g).any() for g in leaves)
        return
    dense = matrix.enable_materialise().materialise()
    want = jax.vjp(lambda m: m.enable_materialise().materialise(), matrix)[1](
        jnp.asarray(_cofactors(dense), dense.dtype)
    )[0]
    for g, w in zip(leaves, jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: qs.LowRankPlusDiagonal(
            1 + np.arange(64.0, dtype=np.float32) / 64, _normal(64, 3)
        ),
        # The tag needs symmetric factors (a factor that is not is refused).
        lambda: qs.Kronecker(
            _sym(_m) + 8 * np.eye(N, dtype=np.float32),
            _sym(_m) + np.eye(N, dtype=np.float32),
            symmetric=True,
        ),
    ],
    ids=["low_rank_plus_diagonal", "kronecker"],
)
def test_slogdet_holds_no_dense_matrix(make):
    """The matrix enters `slogdet` (a custom-JVP function) structured."""
    m = make()
    n = m.shape[-1]
    quax.testing.assert_hlo_lacks(jnp.linalg.slogdet, m, shapes=[(n, n)])


def test_tridiagonal_det_with_zero_leading_minors():
    """Regular tridiagonal matrices whose Thomas pivots hit an exact zero (a zero
    main diagonal: pivots 0, inf, 0, inf; `[1, 1, 1, 1]`: 1, 0, inf, 1): `det` and
    `slogdet` read a 2 x 2 block pivot there (numpy's values, not 0 and -inf), and
    `det`'s derivative is the cofactors (the continuant's derivative)."""
    mains = np.array([[0, 0, 0, 0], [1, 1, 1, 1], [2, 3, 4, 5]], np.float32)
    ones = np.ones((3, N - 1), np.float32)
    fn = jax.jit(quax.quaxify(lambda t: (jnp.linalg.det(t), *jnp.linalg.slogdet(t))))
    det, sign, logdet = fn(qs.TridiagonalMatrix(ones, mains, ones))
    dense = np.stack([_tri(o, m, o) for o, m in zip(ones, mains, strict=True)])
    np.testing.assert_allclose(det, np.linalg.det(dense), rtol=1e-5)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    np.testing.assert_array_equal(sign, want_sign)
    np.testing.assert_allclose(logdet, want_logdet, rtol=1e-5, atol=1e-6)
    grad = jax.jit(jax.grad(lambda m: quax.quaxify(jnp.linalg.det)(m)))
    matrix = qs.TridiagonalMatrix(ones[0], mains[0], ones[0])
    got = grad(matrix)
    want = jax.vjp(lambda m: m.enable_materialise().materialise(), matrix)[1](
        jnp.asarray(_cofactors(dense[0]), jnp.float32)
    )[0]
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)
