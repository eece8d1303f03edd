"""A rule may look at which leaves of its inputs are one object: quax-structured
gives the closed form `2 * K` for `K + K`, and a lazy `Sum` for two distinct
matrices. A compiled eager program traced for distinct inputs must never be
replayed for one matrix added to itself (issue 27, item 1)."""

import jax
import jax.numpy as jnp
import numpy as np
import quax
import quax_structured as qs


A = jnp.array([[2.0, 1.0], [1.0, 3.0]])
B = jnp.array([[4.0, 0.5], [0.5, 1.0]])


def test_sum_of_one_matrix_with_itself_after_distinct_matrices():
    k = qs.Kronecker(A, B, symmetric=True)
    k2 = qs.Kronecker(A + 0, B + 0, symmetric=True)
    dense = jnp.kron(A, B)
    add = quax.quaxify(lambda a, b: a + b)
    for _ in range(3):  # equation by equation, then compiled, then replayed
        assert type(add(k, k2)) is qs.Sum
    for _ in range(2):
        twice = add(k, k)
        assert type(twice) is qs.Kronecker
        np.testing.assert_allclose(twice.dense(), 2 * dense, rtol=1e-6)
        # The closed form factorises; a `Sum` would refuse.
        chol = quax.quaxify(jnp.linalg.cholesky)(twice)
        np.testing.assert_allclose(
            chol.dense() if isinstance(chol, qs.StructuredMatrix) else chol,
            jnp.linalg.cholesky(2 * dense),
            rtol=1e-5,
            atol=1e-6,
        )
        assert type(add(k, k2)) is qs.Sum
        np.testing.assert_allclose(add(k, k2).dense(), 2 * dense, rtol=1e-6)


def test_replay_keys_which_diagonals_are_shared():
    """Inside `jax.jit`, `T + T` and then `T + U`, with `U` sharing two of `T`'s
    three diagonals: one primitive, params, types and avals, bound twice on
    repeated tracers in different places. A replay of the first bind for the
    second would read `T`'s third diagonal for `U`'s."""
    lower = jnp.array([1.0, 2.0])
    main = jnp.array([4.0, 5.0, 6.0])
    upper = jnp.array([0.5, -1.0])
    other_upper = jnp.array([3.0, 7.0])

    def sums(lo, ma, up, up2):
        t = qs.TridiagonalMatrix(lo, ma, up)
        u = qs.TridiagonalMatrix(lo, ma, up2)
        add = quax.quaxify(lambda a, b: a + b)
        return add(t, t), add(t, u)

    twice, mixed = jax.jit(sums)(lower, main, upper, other_upper)

    def dense(lo, ma, up):
        return jnp.diag(lo, -1) + jnp.diag(ma) + jnp.diag(up, 1)

    t_dense = dense(lower, main, upper)
    np.testing.assert_allclose(twice.dense(), 2 * t_dense, rtol=1e-6)
    np.testing.assert_allclose(
        mixed.dense(), t_dense + dense(lower, main, other_upper), rtol=1e-6
    )
