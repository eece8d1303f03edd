"""The value type `CSR`: construction and its checks (`indptr`, columns), the
conversions to and from `BCOO`, batches of matrices, and its operations as its
`BCOO` form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO, CSR, SparseMaterialisationError, fromdense
from sparse_helpers import assert_close, check, random_sparse


def test_csr_roundtrip():
    rng = np.random.default_rng(1)
    dense, x = random_sparse(rng, (7, 5), 0.3, extra_nse=2)

    @jax.jit
    def roundtrip(x):
        c = CSR.from_bcoo(x)
        b = c.to_bcoo()
        return c, c.todense(), b, b.todense(), CSR.fromdense(dense, nse=40).todense()

    c, c_dense, b, b_dense, from_dense = roundtrip(x)
    # Rows in order, columns within a row not: no promise of row-major order.
    assert c.indptr.shape == (8,) and not b.indices_sorted
    assert_close(c_dense, dense)
    assert_close(b_dense, dense)
    assert_close(from_dense, dense)
    with pytest.raises(ValueError, match="without batch dimensions"):
        CSR.from_bcoo(fromdense(np.ones((2, 2, 2)), nse=4, n_batch=1))
    with pytest.raises(ValueError, match="indptr"):
        CSR(jnp.zeros(2), jnp.zeros(2, jnp.int32), jnp.zeros(3, jnp.int32), (3, 3))
    with pytest.raises(SparseMaterialisationError, match="Refusing to materialise"):
        c.materialise()
    assert_close(jax.jit(lambda c: c.enable_materialise().materialise())(c), dense)


def test_batched_csr():
    rng = np.random.default_rng(2)
    dense, x = random_sparse(rng, (3, 4, 5), 0.4, n_batch=1)
    c = jax.vmap(CSR.from_bcoo)(x)  # a batch of matrices: leaves stacked
    assert c.shape == (3, 4, 5) and c.n_batch == 1 and c.indptr.shape == (3, 5)
    assert_close(c.todense(), dense)
    b = c.to_bcoo()
    assert b.n_batch == 1
    assert_close(b.todense(), dense)
    v = rng.normal(size=(3, 5)).astype(np.float32)
    out = jax.jit(quax.quaxify(lambda a, v: jnp.einsum("bij,bj->bi", jnp.sin(a), v)))(
        c, v
    )
    assert_close(out, np.einsum("bij,bj->bi", np.sin(dense), v))
    rebuilt = CSR(c.data, c.indices, c.indptr, (3, 4, 5))
    assert_close(rebuilt.todense(), dense)
    with pytest.raises(ValueError, match="indptr"):
        CSR(c.data, c.indices, c.indptr[:2], (3, 4, 5))
    with pytest.raises(ValueError, match="same shape"):
        CSR(c.data, c.indices, c.indptr, (2, 4, 5))
    with pytest.raises(ValueError, match="holds matrices"):
        CSR(c.data[0], c.indices[0], c.indptr[0], (5,))
    with pytest.raises(ValueError, match=r"scipy\.sparse holds matrices"):
        c.to_scipy()


def test_negative_csr_columns_count_from_the_end():
    c = CSR(jnp.array([1.0, 2.0]), jnp.array([-1, 0]), jnp.array([0, 1, 2]), (2, 3))
    np.testing.assert_array_equal(c.todense(), [[0, 0, 1.0], [2.0, 0, 0]])
    np.testing.assert_array_equal(
        quax.quaxify(lambda a, v: a @ v)(c, jnp.array([1.0, 10.0, 100.0])),
        [100.0, 2.0],
    )


def test_csr_columns_outside_the_matrix_refused():
    with pytest.raises(ValueError, match=r"`CSR` got `indices\[1\]` = 4"):
        CSR(jnp.ones(2), jnp.array([0, 4]), jnp.array([0, 1, 2]), (2, 3))


@pytest.mark.parametrize(
    ("indptr", "match"),
    [
        # The matrix: `m @ 1` gave [1, 0, 5] for [1, 2, 3] in one row each.
        ([0, 2, 1, 3], r"non-decreasing .* `indptr\[1\]` = 2 > `indptr\[2\]` = 1"),
        ([1, 1, 2, 3], r"start at 0 .* `indptr\[0\]` = 1"),
        ([0, 1, 2, 4], r"end at most at the number of stored entries \(nse = 3"),
        ([0, 1, 3], r"needs `indptr` of shape \(4,\)"),
    ],
)
def test_csr_indptr_refused(indptr, match):
    with pytest.raises(ValueError, match=match):
        CSR(
            jnp.array([1.0, 2.0, 3.0]),
            jnp.array([0, 1, 2]),
            jnp.array(indptr),
            (3, 3),
        )


def test_csr_indptr_refused_in_a_batch():
    indptr = jnp.array([[0, 1, 2], [0, 2, 1]])
    with pytest.raises(ValueError, match=r"`indptr\[1, 1\]` = 2 > `indptr\[1, 2\]`"):
        CSR(jnp.ones((2, 2)), jnp.zeros((2, 2), jnp.int32), indptr, (2, 2, 2))


def test_csr_integer_fields():
    with pytest.raises(ValueError, match="`CSR` indices must be integers"):
        CSR(jnp.ones(1), jnp.zeros(1), jnp.array([0, 1]), (1, 1))
    with pytest.raises(ValueError, match="`CSR` indptr must be integers"):
        CSR(jnp.ones(1), jnp.zeros(1, jnp.int32), jnp.array([0.0, 1.0]), (1, 1))


def test_csr_with_padding_after_the_last_row():
    # Entries from `indptr[-1]` on are padding (jax.experimental.sparse's BCSR pads
    # so): an `indptr` ending before `nse` is valid.
    c = CSR(
        jnp.array([1.0, 2.0, 9.0]), jnp.array([1, 0, 0]), jnp.array([0, 1, 2]), (2, 2)
    )
    np.testing.assert_array_equal(c.todense(), [[0, 1.0], [2.0, 0]])
    j = jsparse.BCSR.fromdense(jnp.array([[0, 1.0], [2.0, 0]]), nse=4)
    np.testing.assert_array_equal(
        CSR(j.data, j.indices, j.indptr, j.shape).todense(), [[0, 1.0], [2.0, 0]]
    )


def test_csr_refusal_and_ops():
    rng = np.random.default_rng(4)
    dense, x = random_sparse(rng, (5, 5), 0.4)
    c = CSR.from_bcoo(x)
    with pytest.raises(SparseMaterialisationError, match="`exp`"):
        quax.quaxify(jnp.exp)(c)
    out = check(lambda c, x: (jnp.sin(c) + 2 * x).T, c, x, dense_args=(dense, dense))
    assert isinstance(out, BCOO)
