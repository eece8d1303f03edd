"""Unmodified `jnp.linalg.eigh`/`eigvalsh` on the structures with a fast symmetric
eigendecomposition, against the dense matrices built independently."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


_k = jr.split(jr.key(12), 4)
_a, _b = jr.normal(_k[0], (3, 3)), jr.normal(_k[1], (4, 4))


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
        qs.Kronecker(_a, _b, symmetric=True),
        jnp.kron(_sym(_a), _sym(_b)),
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
    d = jr.normal(_k[2], (2, 5))
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
    m = qs.Circulant(jr.normal(_k[3], (n,)))
    quax.testing.assert_hlo_lacks(jnp.linalg.eigvalsh, m, shapes=[(n, n)])


def test_refusals():
    t = qs.TridiagonalMatrix(jnp.ones(3), jnp.ones(4), jnp.ones(3))
    with pytest.raises(qs.MaterialisationError, match=r"`eigh`.*eigh_tridiagonal"):
        quax.quaxify(jnp.linalg.eigh)(t)
    # A Kronecker product not tagged symmetric: its symmetric part is no Kronecker
    # product.
    with pytest.raises(qs.MaterialisationError, match="Refusing to materialise"):
        quax.quaxify(jnp.linalg.eigh)(qs.Kronecker(_a, _b))
