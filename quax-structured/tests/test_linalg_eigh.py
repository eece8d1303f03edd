"""Unmodified `jnp.linalg.eigh`/`eigvalsh` on the structures with a fast symmetric
eigendecomposition (tridiagonal: the eigenvalues alone), against the dense matrices
built independently."""

import jax
import jax.numpy as jnp
import jax.scipy as jsp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


# numpy leaves: built without compiling anything.
_rng = np.random.default_rng(12)


def _normal(*shape):
    return _rng.normal(size=shape).astype(np.float32)


_a, _b, _blocks = _normal(3, 3), _normal(4, 4), _normal(2, 3, 3)


def _symmetric_circulant(column):
    """The symmetric part of the circulant with this first column (what
    `jnp.linalg.eigh` decomposes, as it symmetrises its input)."""
    n = column.shape[-1]
    c = jnp.stack([jnp.roll(column, j) for j in range(n)], axis=-1)
    return (c + c.T) / 2


def _sym(x):
    return (x + x.T) / 2


# name: (structure, its dense (symmetrised) matrix built independently)
CASES = {
    "diagonal": (qs.Diagonal(_a[0]), jnp.diag(_a[0])),
    "scaled_identity": (qs.ScaledIdentity(jnp.asarray(-1.5), 4), -1.5 * jnp.eye(4)),
    "circulant_even": (qs.Circulant(_b[0]), _symmetric_circulant(_b[0])),
    "circulant_odd": (qs.Circulant(_b[1, :3]), _symmetric_circulant(_b[1, :3])),
    "kronecker": (
        qs.Kronecker(_sym(_a), _sym(_b), symmetric=True),
        jnp.kron(_sym(_a), _sym(_b)),
    ),
    "block_diagonal": (
        qs.BlockDiagonal(_blocks),
        jsp.linalg.block_diag(*(_sym(b) for b in _blocks)),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_eigh_matches_dense(name):
    m, dense = CASES[name]
    values, vectors = jax.jit(quax.quaxify(jnp.linalg.eigh))(m)
    n = dense.shape[-1]
    np.testing.assert_allclose(values, jnp.linalg.eigvalsh(dense), atol=1e-5)
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(n), atol=1e-5)
    np.testing.assert_allclose(dense @ vectors, vectors * values, atol=1e-5)


def test_batched_diagonal_and_gradient():
    d = _normal(2, 5)
    values, vectors = quax.quaxify(jnp.linalg.eigh)(qs.Diagonal(d))
    np.testing.assert_allclose(values, jnp.sort(d, axis=-1))
    rebuilt = jnp.einsum("bik,bk,bjk->bij", vectors, values, vectors)
    np.testing.assert_allclose(rebuilt, jax.vmap(jnp.diag)(d), atol=1e-6)
    weights = jnp.arange(5.0)
    loss = lambda d: weights @ quax.quaxify(jnp.linalg.eigvalsh)(qs.Diagonal(d))
    dense_loss = lambda d: weights @ jnp.linalg.eigvalsh(jnp.diag(d))
    np.testing.assert_allclose(jax.grad(loss)(d[0]), jax.grad(dense_loss)(d[0]))


def test_circulant_eigvalsh_holds_no_dense_matrix():
    n = 128
    m = qs.Circulant(_normal(n))
    quax.testing.assert_hlo_lacks(jnp.linalg.eigvalsh, m, shapes=[(n, n)])


def test_tridiagonal_eigvalsh():
    """The eigenvalues by bisection, batched, against the dense symmetric part; no
    `(n, n)` array in the compiled program."""
    lower, main, upper = _normal(2, 5), _normal(2, 6), _normal(2, 5)
    t = qs.TridiagonalMatrix(lower, main, upper)
    got = jax.jit(quax.quaxify(jnp.linalg.eigvalsh))(t)
    for k in range(2):
        off = (lower[k] + upper[k]) / 2
        dense = np.diag(main[k]) + np.diag(off, -1) + np.diag(off, 1)
        np.testing.assert_allclose(got[k], np.linalg.eigvalsh(dense), atol=1e-5)
    quax.testing.assert_hlo_lacks(jnp.linalg.eigvalsh, t, shapes=[(6, 6), (2, 6, 6)])


# A zero (or, in float32, tiny) first off-diagonal, whose lone diagonal entry sits
# at a midpoint of the bisection: JAX's `eigh_tridiagonal` counted no eigenvalue
# below it there (its first Sturm pivot, perturbed by `(eps |off[0]|)^2 = 0`, gave
# `0 / 0`), and returned the least eigenvalue as `main[0]`: `[4, 4, 4, 5.68]` for
# `[2.32, 4, 4, 5.68]` (seen before the fix).
_SPLIT = [
    ([4.0, 4, 4, 4], [0.0, 1.5, 0.75]),
    ([4.0, 4, 4, 4], [1e-30, 1.0, 1.0]),
    ([4.0, 4, 4, 4], [0.0, 0.0, 1.0]),
    ([-2.0, -2, -2], [0.0, 3.0]),
    ([1e-20, 1e-20, 1e-20, 1e-20], [0.0, 1.5e-20, 0.75e-20]),
    ([4.0, 4, 4, 4], [1.0, 0.0, 1.0]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("main", "off"), _SPLIT)
def test_tridiagonal_eigvalsh_split_first_row(main, off, dtype):
    main, off = np.asarray(main, dtype), np.asarray(off, dtype)
    dense = np.diag(main) + np.diag(off, -1) + np.diag(off, 1)
    want = np.linalg.eigvalsh(dense.astype(np.float64))
    scale = np.abs(want).max()
    with jax.enable_x64(dtype == np.float64):
        t = qs.TridiagonalMatrix(off, main, off)
        eager = quax.quaxify(jnp.linalg.eigvalsh)(t)
        jitted = jax.jit(quax.quaxify(jnp.linalg.eigvalsh))(t)
        assert eager.dtype == dtype
    tolerance = 8 * np.finfo(dtype).eps * scale
    np.testing.assert_allclose(eager, want, rtol=0, atol=tolerance)
    np.testing.assert_allclose(jitted, want, rtol=0, atol=tolerance)


def test_tridiagonal_eigvalsh_split_first_row_batched():
    # One matrix of the batch split, the other not, under `jax.vmap` too.
    main = np.array([[4.0, 4, 4, 4], [1.0, 2, 3, 4]], np.float32)
    off = np.array([[0.0, 1.5, 0.75], [0.5, 0.5, 0.5]], np.float32)
    t = qs.TridiagonalMatrix(off, main, off)
    for got in (
        quax.quaxify(jnp.linalg.eigvalsh)(t),
        jax.vmap(quax.quaxify(jnp.linalg.eigvalsh))(t),
    ):
        for k in range(2):
            dense = np.diag(main[k]) + np.diag(off[k], -1) + np.diag(off[k], 1)
            np.testing.assert_allclose(got[k], np.linalg.eigvalsh(dense), atol=2e-6)


def test_refusals():
    ones = np.ones(3, np.float32)
    t = qs.TridiagonalMatrix(ones, np.arange(4, dtype=np.float32), ones)
    # The eigenvectors of a tridiagonal matrix: refused where used.
    with pytest.raises(
        qs.StructuredMaterialisationError,
        match=r"`dot_general`.*TridiagonalEigenvectors.*`jnp.linalg.eigvalsh`.*"
        "allow_materialise=True",
    ):
        quax.quaxify(lambda t: jnp.linalg.eigh(t)[1] @ jnp.ones(4))(t)
    # The eigenvalues' derivative needs them: refused when JAX differentiates
    # (inside `eigvalsh`'s `jit`, where JAX's leak check, on in these tests, would
    # replace any error raised there by its own).
    with (
        jax.check_tracer_leaks(False),
        pytest.raises(
            qs.StructuredMaterialisationError,
            match=r"differentiate.*`eigh`.*allow_materialise",
        ),
    ):
        jax.grad(
            lambda m: quax.quaxify(jnp.linalg.eigvalsh)(
                qs.TridiagonalMatrix(ones, m, ones)
            ).sum()
        )(np.arange(4, dtype=np.float32))
    # Allowed to materialise: the dense eigendecomposition.
    values = quax.quaxify(jnp.linalg.eigvalsh)(t.enable_materialise())
    np.testing.assert_allclose(values, np.linalg.eigvalsh(t.dense()), atol=1e-5)
    # No fast algorithm for banded or Toeplitz matrices.
    for m in [qs.Banded(np.ones((3, 4), np.float32), 1, 1), qs.Toeplitz(_b[0], _b[1])]:
        with pytest.raises(
            qs.StructuredMaterialisationError, match=r"`eigh`.*allow_materialise"
        ):
            quax.quaxify(jnp.linalg.eigvalsh)(m)
    # A Kronecker product not tagged symmetric: its symmetric part is no Kronecker
    # product.
    with pytest.raises(
        qs.StructuredMaterialisationError, match="Refusing to materialise"
    ):
        quax.quaxify(jnp.linalg.eigh)(qs.Kronecker(_a, _b))
