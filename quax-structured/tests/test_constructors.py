"""Constructors check what they can see (FAMILIES.md): a wrong input is a
`ValueError` naming the field and the shape it needs, not an error from deep
inside (`not enough values to unpack`, `AttributeError`); lists are accepted
where NumPy and lineax accept them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_structured import (
    BlockDiagonal,
    Circulant,
    Diagonal,
    ScaledIdentity,
    TridiagonalMatrix,
)


def _dense(m):
    return m.enable_materialise().materialise()


@pytest.mark.parametrize("field", ["lower_diag", "main_diag", "upper_diag"])
def test_tridiagonal_scalar_diagonal_names_the_field(field):
    """A scalar diagonal (lineax's `TridiagonalLinearOperator` refuses one too:
    the diagonals do not broadcast)."""
    args = dict(lower_diag=jnp.ones(2), main_diag=jnp.ones(3), upper_diag=jnp.ones(2))
    args[field] = jnp.asarray(1.0)
    with pytest.raises(ValueError, match=rf"`{field}` of shape \(\*batch, n"):
        TridiagonalMatrix(**args)


def test_tridiagonal_messages_give_the_shapes():
    with pytest.raises(ValueError, match=r"n - 1 = 2 .* got the shapes"):
        TridiagonalMatrix(jnp.ones(3), jnp.ones(3), jnp.ones(2))
    with pytest.raises(ValueError, match="same batch axes"):
        TridiagonalMatrix(jnp.ones((2, 2)), jnp.ones(3), jnp.ones(2))
    with pytest.raises(ValueError, match=r"float16, float32, float16.*astype"):
        TridiagonalMatrix(
            jnp.ones(2, jnp.float16), jnp.ones(3), jnp.ones(2, jnp.float16)
        )


def test_tridiagonal_accepts_lists():
    t = TridiagonalMatrix([1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0])
    want = np.array([[3.0, 6.0, 0.0], [1.0, 4.0, 7.0], [0.0, 2.0, 5.0]])
    np.testing.assert_array_equal(_dense(t), want)


def test_block_diagonal_accepts_a_list_of_blocks():
    blocks = [
        jnp.asarray([[1.0, 2.0], [3.0, 4.0]]),
        jnp.asarray([[5.0, 0.0], [0.0, 6.0]]),
    ]
    m = BlockDiagonal(blocks)
    np.testing.assert_array_equal(m.blocks, jnp.stack(blocks))
    np.testing.assert_array_equal(_dense(m), jax.scipy.linalg.block_diag(*blocks))
    v = jnp.arange(4.0)
    np.testing.assert_allclose(
        quax.quaxify(lambda m, v: m @ v)(m, v), jax.scipy.linalg.block_diag(*blocks) @ v
    )
    assert BlockDiagonal(tuple(blocks)).shape == (4, 4)


def test_block_diagonal_wrong_blocks_name_the_field():
    with pytest.raises(ValueError, match=r"`blocks` .* shapes \[\(2, 2\), \(3, 3\)\]"):
        BlockDiagonal([jnp.ones((2, 2)), jnp.ones((3, 3))])
    with pytest.raises(ValueError, match="at least one block"):
        BlockDiagonal([])
    with pytest.raises(ValueError, match=r"got shape \(2, 2\).*blocks\[None\]"):
        BlockDiagonal(jnp.ones((2, 2)))
    with pytest.raises(ValueError, match=r"got shape \(3, 2, 3\)"):
        BlockDiagonal(jnp.ones((3, 2, 3)))


def test_diagonal_circulant_and_scaled_identity_accept_lists():
    np.testing.assert_array_equal(_dense(Diagonal([1.0, 2.0])), np.diag([1.0, 2.0]))
    c = Circulant([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(
        _dense(c), [[1.0, 3.0, 2.0], [2.0, 1.0, 3.0], [3.0, 2.0, 1.0]]
    )
    s = ScaledIdentity([2.0, 3.0], 2)
    np.testing.assert_array_equal(_dense(s), [2.0 * np.eye(2), 3.0 * np.eye(2)])


def test_diagonal_and_circulant_scalars_name_the_field():
    with pytest.raises(ValueError, match="`diag` of shape"):
        Diagonal(1.0)
    with pytest.raises(ValueError, match="`column` of shape"):
        Circulant(jnp.asarray(1.0))


def test_kronecker_diagonal_flags_checked():
    """`Kronecker(..., diagonal=...)`: one flag per factor (one short was an
    `IndexError`), and a factor flagged diagonal must be its diagonal, a vector (a
    matrix was refused as a stack 'with batch axes', pointing at `jax.vmap`)."""
    from quax_structured import Kronecker

    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    with pytest.raises(ValueError, match=r"`diagonal` with 1 entries for 2 factors"):
        Kronecker(a, np.eye(2, dtype=np.float32), diagonal=[False])
    with pytest.raises(ValueError, match=r"`diagonal\[0\]=True`.*shape \(2, 2\)"):
        Kronecker(a, np.eye(2, dtype=np.float32), diagonal=[True, False])
    # Flags that fit: the diagonal factor as its vector.
    d = np.array([2.0, -1.0], np.float32)
    k = Kronecker(a, d, diagonal=[False, True])
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(
        quax.quaxify(lambda k, x: k @ x)(k, x), np.kron(a, np.diag(d)) @ x, rtol=1e-6
    )
