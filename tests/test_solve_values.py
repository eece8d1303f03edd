"""`jnp.linalg.solve(A, B)` and `cg` with a structured `A` and a quax value `B`.

Where the structure's rules do not apply `A` (or its solve) to `B`'s type, quax
solves on `B`'s dense array, and never densifies `A`; where `B` refuses to
materialise, a `JoinError` names both. Compared with dense solves of literal
matrices."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
import quax_structured as qs
from quax.zero import Zero


n = 6
lower = jnp.array([1.0, -0.5, 0.25, 0.5, -1.0])
main = jnp.array([4.0, 5.0, 3.0, 6.0, 4.5, 5.5])
upper = jnp.array([0.5, 1.0, -0.75, 0.2, 0.3])
T = qs.TridiagonalMatrix(lower, main, upper)
T_DENSE = jnp.diag(main) + jnp.diag(lower, -1) + jnp.diag(upper, 1)
k1 = jnp.array([[3.0, 1.0], [0.5, 2.0]])
k2 = jnp.array([[2.0, 0.0, 0.5], [0.25, 3.0, 0.0], [0.0, 1.0, 4.0]])
K = qs.Kronecker(k1, k2)
K_DENSE = jnp.kron(k1, k2)
MATRICES = {"tridiagonal": (T, T_DENSE), "kronecker": (K, K_DENSE)}

d = jnp.array([1.0, -2.0, 3.0, 0.5, 2.0, -1.0])
w = jnp.arange(18.0).reshape(n, 3) / 10
lora = quax_lora.LoraArray(w, rank=1, allow_materialise=True, key=jr.key(0))
lora_dense = w + lora.a @ lora.b


def _rhs():
    """Right-hand sides: a value (made afresh) and its dense array, independently."""
    return {
        "zero_vector": (Zero((n,), jnp.float32), jnp.zeros(n)),
        "zero_matrix": (Zero((n, 2), jnp.float32), jnp.zeros((n, 2))),
        "diagonal": (qs.Diagonal(d, allow_materialise=True), jnp.diag(d)),
        "tridiagonal": (
            qs.TridiagonalMatrix(lower, d, upper, allow_materialise=True),
            jnp.diag(d) + jnp.diag(lower, -1) + jnp.diag(upper, 1),
        ),
        "lora": (lora, lora_dense),
    }


@pytest.mark.parametrize(
    ("matrix", "rhs"),
    [
        ("tridiagonal", "zero_vector"),
        ("tridiagonal", "diagonal"),
        ("tridiagonal", "tridiagonal"),
        ("tridiagonal", "lora"),
        ("kronecker", "zero_matrix"),
        ("kronecker", "diagonal"),
    ],
)
def test_solve_with_a_value_right_hand_side(matrix, rhs):
    a, a_dense = MATRICES[matrix]
    b, b_dense = _rhs()[rhs]
    with quax.track_materialisation() as report:
        got = jax.jit(quax.quaxify(jnp.linalg.solve))(a, b)
    # Only the right-hand side may be densified, never the structure.
    assert {typ for _, typ in report.counts} <= {type(b).__name__}
    want = jnp.linalg.solve(a_dense, b_dense)
    if isinstance(b, Zero):
        # A zero right-hand side solves to a symbolic zero: nothing is densified.
        assert isinstance(got, Zero) and not report.counts
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        got = got.materialise()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cg_with_a_value_right_hand_side():
    # A symmetric positive definite tridiagonal matrix.
    s = qs.TridiagonalMatrix(upper, main, upper)
    s_dense = jnp.diag(main) + jnp.diag(upper, -1) + jnp.diag(upper, 1)
    cg = lambda a, b: jax.scipy.sparse.linalg.cg(lambda v: a @ v, b, tol=1e-6)[0]
    got = jax.jit(quax.quaxify(cg))(s, Zero((n,), jnp.float32))
    np.testing.assert_allclose(got, np.zeros(n))
    b = qs.Diagonal(d, allow_materialise=True)
    got = jax.jit(quax.quaxify(jax.vmap(cg, in_axes=(None, 1), out_axes=1)))(s, b)
    want = jnp.linalg.solve(s_dense, jnp.diag(d))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_right_hand_side_that_refuses_is_named():
    with pytest.raises(
        quax.JoinError,
        match=r"(?s)right-hand side of a custom_linear_solve .* is a Diagonal "
        r"float32\[6,6\], and the solve failed on it .*dot_general.*"
        r"TridiagonalMatrix, Diagonal.*Refusing to materialise `Diagonal`.*"
        r"Pass a plain right-hand side",
    ):
        quax.quaxify(jnp.linalg.solve)(T, qs.Diagonal(d))
