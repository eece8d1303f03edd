"""Matrices that hold no entries (`n = 0`, or a batch of no matrices): every
operation gives dense JAX's answer on the empty array (`slogdet` `(1, 0)`, `det`
1, a solve and a product empty), computed on that array (it costs nothing),
where the structures' algorithms crashed (an FFT of length 0, a first row that
is not there, a modulo by a factor's size of 0, a `max` of no entries). Found by
the session-22 hunt: `Toeplitz`, `Circulant`, `Banded`, `Kronecker`,
`LowRankPlusDiagonal` and `BlockDiagonal` raised on some of these, `Diagonal`,
`LowRank` and `Circulant` on `pinv`."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_structured as qs


def _e(*shape):
    return jnp.zeros(shape, jnp.float32)


EMPTY = {
    "TridiagonalMatrix": lambda: qs.TridiagonalMatrix(_e(0), _e(0), _e(0)),
    "Diagonal": lambda: qs.Diagonal(_e(0)),
    "ScaledIdentity": lambda: qs.ScaledIdentity(jnp.float32(2), 0),
    "LowerTriangular": lambda: qs.LowerTriangular(_e(0, 0)),
    "UpperTriangular": lambda: qs.UpperTriangular(_e(0, 0)),
    "LowRank": lambda: qs.LowRank(_e(0, 2)),
    "LowRankPlusDiagonal": lambda: qs.LowRankPlusDiagonal(_e(0), _e(0, 2)),
    "Banded": lambda: qs.Banded(_e(3, 0), 1, 1),
    "BlockDiagonal": lambda: qs.BlockDiagonal(_e(0, 2, 2)),
    "Circulant": lambda: qs.Circulant(_e(0)),
    "Toeplitz": lambda: qs.Toeplitz(_e(0), _e(0)),
    "Kronecker": lambda: qs.Kronecker(_e(0, 0), jnp.eye(2)),
}

_B = _e(0, 3)

OPERATIONS = {
    "matmul": lambda m: m @ _B,
    "rmatmul": lambda m: _B.T @ m,
    "transpose_matmul": lambda m: m.T @ _B,
    "add": lambda m: m + m,
    "scale": lambda m: 2 * m,
    "solve": lambda m: jnp.linalg.solve(m, _B),
    "slogdet": jnp.linalg.slogdet,
    "det": jnp.linalg.det,
    "inv": jnp.linalg.inv,
    "pinv": jnp.linalg.pinv,
    "eigvalsh": jnp.linalg.eigvalsh,
    "cholesky": jnp.linalg.cholesky,
    "expm": jsl.expm,
    "trace": jnp.trace,
    "diagonal": jnp.diag,
}


def _dense(x):
    if isinstance(x, qs.StructuredMatrix):
        return x.enable_materialise().materialise()
    return x


def _assert_dense_answer(got, want):
    got = jax.tree.map(
        _dense, got, is_leaf=lambda x: isinstance(x, qs.StructuredMatrix)
    )
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert jnp.shape(g) == jnp.shape(w)
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("name", EMPTY)
def test_every_operation_on_an_empty_matrix_is_dense_jax(name, operation):
    """Under `jax.jit`, with `allow_materialise=False` (the default): no
    refusal, since forming an empty dense array costs nothing."""
    op = OPERATIONS[operation]
    got = jax.jit(quax.quaxify(op))(EMPTY[name]())
    _assert_dense_answer(got, op(jnp.zeros((0, 0), jnp.float32)))


@pytest.mark.parametrize("name", ["Toeplitz", "LowRankPlusDiagonal", "Kronecker"])
def test_eagerly_and_under_grad(name):
    """Eagerly, and `jax.grad` of `slogdet` and of a product with respect to the
    leaves: zero (no entry depends on them)."""
    m = EMPTY[name]()
    sign, logdet = quax.quaxify(jnp.linalg.slogdet)(m)
    assert sign == 1 and logdet == 0
    assert quax.quaxify(lambda m: m @ _B)(m).shape == (0, 3)

    def loss(m):
        return jnp.linalg.slogdet(m)[1] + jnp.sum(m @ _B)

    grads = jax.grad(quax.quaxify(loss))(m)
    for leaf in jax.tree.leaves(grads):
        np.testing.assert_array_equal(leaf, jnp.zeros_like(leaf))


def test_a_batch_of_no_matrices():
    """A batch axis of size 0 (the matrices themselves 4 x 4): `solve`,
    `slogdet` and a product give dense JAX's empty batches."""
    m = qs.Toeplitz(_e(0, 4), _e(0, 4))
    b = _e(0, 4)
    solve = jax.jit(quax.quaxify(lambda m, b: jnp.linalg.solve(m, b[..., None])))
    assert solve(m, b).shape == (0, 4, 1)
    sign, logdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))(m)
    assert sign.shape == logdet.shape == (0,)
    assert jax.jit(quax.quaxify(lambda m, b: m @ b[..., None]))(m, b).shape == (0, 4, 1)


def test_a_primitive_without_a_rule_refuses_as_for_any_matrix():
    """Only the rules compute an empty matrix densely: a primitive without a
    rule (`sin`) refuses for an empty matrix as for any other (the
    materialisation policy every guarded family shares), and computes with
    `.enable_materialise()`."""
    m = EMPTY["Toeplitz"]()
    with pytest.raises(
        qs.StructuredMaterialisationError, match="Refusing to materialise"
    ):
        jax.jit(quax.quaxify(jnp.sin))(m)
    assert jax.jit(quax.quaxify(jnp.sin))(m.enable_materialise()).shape == (0, 0)


def test_beside_another_familys_value():
    """An empty structure beside a value of another guarded family (a symbolic
    zero right-hand side): the rules' dense route, dense JAX's answer."""
    from quax.zero import Zero

    got = jax.jit(quax.quaxify(jnp.linalg.solve))(
        EMPTY["TridiagonalMatrix"](), Zero((0, 3), jnp.float32)
    )
    _assert_dense_answer(got, jnp.zeros((0, 3), jnp.float32))
