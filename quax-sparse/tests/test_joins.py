"""Loop carries and `cond` outputs whose `BCOO` flags differ join through
`BCOO.join` (the AND of the flags), against dense results; a different `nse` still
cannot join."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from quax_sparse import BCOO, CSR, fromdense
from sparse_helpers import assert_close, check, random_sparse


def _unflagged():
    # Shuffled entries with padding, no promises: `sin` merges duplicates and
    # promises sorted unique indices.
    return random_sparse(np.random.default_rng(3), (3, 3), 0.5)


@pytest.mark.parametrize(
    "loop",
    [
        lambda a: lax.fori_loop(0, 2, lambda i, c: jnp.sin(c), a),
        lambda a: lax.while_loop(
            lambda c: c[0] < 2, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, a)
        )[1],
        lambda a: lax.scan(lambda c, s: (jnp.sin(c) * s, None), a, jnp.ones(2))[0],
    ],
    ids=["fori", "while", "scan"],
)
def test_loop_carry_gains_flags(loop):
    dense, x = _unflagged()
    assert not (x.indices_sorted or x.unique_indices)
    out = check(loop, x, dense_args=(dense,))
    assert isinstance(out, BCOO) and out.nse == x.nse
    assert not (out.indices_sorted or out.unique_indices)


def test_loop_carry_loses_flags():
    # `c.T` keeps the entries unique but no longer in row-major order.
    dense = np.diag(np.arange(1.0, 5.0, dtype=np.float32)) + np.eye(4, k=1)
    x = fromdense(dense, nse=8)
    assert x.indices_sorted and x.unique_indices
    loop = lambda a: lax.fori_loop(0, 3, lambda i, c: c.T * 2.0, a)
    out = check(loop, x, dense_args=(dense,))
    assert isinstance(out, BCOO) and out.unique_indices and not out.indices_sorted


def test_cond_branches_with_different_flags():
    dense, x = _unflagged()
    f = lambda a, s: lax.cond(s > 0, jnp.sin, jnp.negative, a)
    for s in (1.0, -1.0):
        out = check(f, x, s, dense_args=(dense, s))
        assert isinstance(out, BCOO) and not out.unique_indices


def test_csr_carry_joins_as_the_bcoo_the_body_gives():
    dense, x = _unflagged()
    c = CSR.from_bcoo(x)
    loop = lambda a: lax.fori_loop(0, 2, lambda i, b: jnp.sin(b), a)
    out = check(loop, c, dense_args=(dense,))
    assert isinstance(out, BCOO) and out.nse == c.nse


def test_grad_through_a_joined_carry():
    _, x = _unflagged()
    loop = lambda a: lax.fori_loop(0, 2, lambda i, c: jnp.sin(c), a)

    def loss(data):
        a = BCOO(data, x.indices, x.shape)
        return quax.quaxify(lambda b: jnp.sum(loop(b).todense()))(a)

    def dense_loss(data):  # the same entries scattered by plain jnp
        rows, cols = x.indices[:, 0], x.indices[:, 1]
        dense = jnp.zeros(x.shape).at[rows, cols].add(data, mode="drop")
        return jnp.sum(loop(dense))

    assert_close(jax.jit(jax.grad(loss))(x.data), jax.grad(dense_loss)(x.data))


def test_a_different_nse_still_does_not_join():
    _, x = _unflagged()
    loop = lambda a: lax.fori_loop(0, 3, lambda i, c: c + a, a)
    with pytest.raises(quax.JoinError, match=r"loop carry `c`.*Refusing to mat"):
        quax.quaxify(loop)(x)


def test_carry_of_a_bcoo_batched_over_its_leaves():
    # Stacking the leaves of two BCOOs gives a batch whose `_shape` is one
    # element's, while the body's output records the batch's full shape: the
    # carry joins all the same (it was refused, materialising).
    rng = np.random.default_rng(3)
    dense, x = random_sparse(rng, (3, 4), 0.5)
    twice = BCOO(2 * x.data, x.indices, x.shape)
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), x, twice)
    assert stacked.shape == (2, 3, 4)

    def negate_three_times(a):
        def body(carry):
            i, c = carry
            return i + 1, -c

        return lax.while_loop(lambda carry: carry[0] < 3, body, (0, a))[1]

    fn = quax.quaxify(jax.vmap(negate_three_times))
    for got in (fn(stacked), jax.jit(fn)(stacked)):
        assert isinstance(got, BCOO)
        assert_close(got, -np.stack([dense, 2 * dense]))
