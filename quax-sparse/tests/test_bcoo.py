"""The value types: construction, checks, conversions, `sum_duplicates`, refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import scipy.sparse
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO, CSR, MaterialisationError, fromdense
from sparse_helpers import assert_close, random_sparse


DENSE = np.array([[0.0, 1.5, 0.0, 0.0], [2.0, 0.0, 0.0, -1.0], [0.0, 0.0, 0.0, 3.0]])


def test_published_constructor_and_fields():
    data = jnp.array([1.0, 2.0])
    indices = jnp.array([[0, 1], [2, 3]])
    x = BCOO(data, indices, (3, 4))
    assert x.shape == (3, 4) and x.dtype == jnp.float32 and x.ndim == 2
    assert x.allow_materialise is False
    assert x.nse == 2 and x.n_batch == 0 and x.n_sparse == 2
    y = BCOO(data, indices, (3, 4), True)
    assert y.allow_materialise is True
    assert_close(x.todense(), [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 2]])
    assert x.enable_materialise().allow_materialise is True
    assert y.enable_materialise(False).allow_materialise is False


@pytest.mark.parametrize(
    ("data_shape", "indices_shape", "shape", "match"),
    [
        ((2, 3), (3, 3, 1), (2, 5), "Inconsistent batch sizes"),
        ((3,), (4, 2), (5, 5), "Inconsistent number of sparse entries"),
        ((3,), (3, 1), (5, 5), "Must specify a sparse index for all non-batch"),
        ((), (3, 1), (5,), "needs `data` of shape"),
    ],
)
def test_published_checks(data_shape, indices_shape, shape, match):
    with pytest.raises(ValueError, match=match):
        BCOO(jnp.zeros(data_shape), jnp.zeros(indices_shape, jnp.int32), shape)


def test_float_indices_refused():
    with pytest.raises(ValueError, match="indices must be integers"):
        BCOO(jnp.zeros(2), jnp.zeros((2, 1)), (3,))


def test_materialise_refuses_with_published_message():
    x = fromdense(DENSE, nse=4)
    with pytest.raises(RuntimeError, match="Refusing to materialise `BCOO`"):
        x.materialise()
    with pytest.raises(MaterialisationError, match="allow_materialise=True"):
        x.materialise()
    assert_close(x.enable_materialise().materialise(), DENSE)


@pytest.mark.parametrize("kind", ["BCOO", "CSR"])
def test_the_core_materialisation_policy(kind):
    # BCOO and CSR follow quax.GuardedValue: a refusal any family's `except` catches,
    # naming the type, the primitive, what densifying costs, and the way out. (A CSR
    # acts as its BCOO form, so the refusal is its BCOO form's.)
    x = (fromdense if kind == "BCOO" else CSR.fromdense)(DENSE, nse=4)
    assert isinstance(x, quax.GuardedValue)
    assert issubclass(MaterialisationError, quax.MaterialisationError)
    message = (
        r"Refusing to materialise `BCOO` for primitive `exp` on input types \(BCOO\)"
        r".*\(shape \(3, 4\), dtype float32\) would hold all 12 elements of this "
        r"sparse array, which stores 4 entries\. Pass `allow_materialise=True` to "
        r"`BCOO` or call `\.enable_materialise\(\)`.* Or call `\.todense\(\)`"
    )
    with pytest.raises(quax.MaterialisationError, match=message):
        quax.quaxify(jnp.exp)(x)
    with pytest.raises(MaterialisationError, match=f"Refusing to materialise `{kind}`"):
        x.materialise()
    allowed = x.enable_materialise(allow=True)
    assert allowed.allow_materialise and not x.allow_materialise
    assert_close(quax.quaxify(jnp.exp)(allowed), np.exp(DENSE))
    assert_close(allowed.materialise(), DENSE)
    assert not allowed.enable_materialise(allow=False).allow_materialise


def test_fromdense_roundtrip_sorted_and_padded():
    x = fromdense(DENSE, nse=6)
    assert x.indices_sorted and x.unique_indices
    np.testing.assert_array_equal(
        np.asarray(x.indices),
        [[0, 1], [1, 0], [1, 3], [2, 3], [3, 4], [3, 4]],  # padding: the shape
    )
    np.testing.assert_array_equal(np.asarray(x.data), [1.5, 2.0, -1.0, 3.0, 0, 0])
    assert_close(x.todense(), DENSE)


def test_fromdense_keeps_first_nse_in_row_major_order():
    # Four nonzeros, nse=2: the first two in row-major order stay, as in
    # jax.experimental.sparse.
    x = fromdense(DENSE, nse=2)
    want = np.zeros_like(DENSE)
    want[0, 1], want[1, 0] = 1.5, 2.0
    assert_close(x.todense(), want)
    assert_close(jsparse.BCOO.fromdense(DENSE, nse=2).todense(), want)


def test_fromdense_under_jit_and_batched():
    dense = np.stack([DENSE, -2 * DENSE, np.zeros_like(DENSE)])
    x = jax.jit(lambda d: BCOO.fromdense(d, nse=4, n_batch=1))(dense)
    assert x.data.shape == (3, 4) and x.indices.shape == (3, 4, 2)
    assert_close(x.todense(), dense)
    with pytest.raises(ValueError, match="n_batch"):
        BCOO.fromdense(DENSE, nse=2, n_batch=3)
    with pytest.raises(ValueError, match="nse"):
        BCOO.fromdense(DENSE, nse=-1)


def test_todense_adds_duplicates_and_drops_padding():
    x = BCOO(
        jnp.array([1.0, 2.0, 5.0, 7.0]),
        jnp.array([[0, 0], [0, 0], [1, 2], [2, 0]]),
        (2, 3),
    )
    assert_close(x.todense(), [[3.0, 0, 0], [0, 0, 5.0]])


def test_sum_duplicates():
    x = BCOO(
        jnp.array([1.0, 4.0, 2.0, 9.0, 5.0]),
        jnp.array([[1, 2], [0, 1], [1, 2], [2, 0], [0, 1]]),
        (2, 3),
    )
    y = x.sum_duplicates()
    assert y.indices_sorted and y.unique_indices and y.nse == 5
    np.testing.assert_array_equal(
        np.asarray(y.indices), [[0, 1], [1, 2], [2, 3], [2, 3], [2, 3]]
    )
    np.testing.assert_array_equal(np.asarray(y.data), [9.0, 3.0, 0, 0, 0])
    z = jax.jit(lambda x: x.sum_duplicates(nse=1))(x)
    assert z.nse == 1
    assert_close(z.todense(), [[0, 9.0, 0], [0, 0, 0]])


def test_sum_duplicates_batched():
    rng = np.random.default_rng(0)
    dense, x = random_sparse(rng, (3, 4, 5), 0.4, n_batch=1, extra_nse=3)
    doubled = BCOO(
        jnp.concatenate([x.data, x.data], -1),
        jnp.concatenate([x.indices, x.indices], -2),
        x.shape,
    )
    y = doubled.sum_duplicates()
    assert_close(y.todense(), 2 * dense)
    assert_close(y.sum_duplicates().todense(), 2 * dense)


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
    with pytest.raises(MaterialisationError, match="Refusing to materialise"):
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


def test_jax_experimental_sparse_roundtrip():
    j = jsparse.BCOO.fromdense(DENSE, nse=5)
    x = BCOO.from_jax(j)
    assert_close(x.todense(), DENSE)
    back = x.to_jax()
    assert isinstance(back, jsparse.BCOO)
    assert_close(back.todense(), DENSE)
    with pytest.raises(ValueError, match="n_dense=0"):
        BCOO.from_jax(jsparse.BCOO.fromdense(DENSE, n_dense=1))


def test_scipy_roundtrip():
    m = scipy.sparse.random_array((6, 9), density=0.3, random_state=0, dtype=np.float32)
    dense = m.toarray()
    x = BCOO.from_scipy(m)
    assert_close(x.todense(), dense)
    assert_close(x.to_scipy().toarray(), dense)
    padded = fromdense(dense, nse=30)
    assert_close(padded.to_scipy().toarray(), dense)
    c = CSR.from_scipy(m)
    assert_close(c.todense(), dense)
    assert_close(c.to_scipy().toarray(), dense)
    with pytest.raises(ValueError, match="matrices"):
        fromdense(np.ones(3), nse=3).to_scipy()


def test_is_quax_examples_sparse():
    assert quax.examples.sparse.BCOO is BCOO


# Index conventions: negative indices count from the end, `n` is padding -----------


def test_negative_indices_count_from_the_end():
    # As NumPy indexing and jax.experimental.sparse read them: -1 is the last row.
    data, indices = jnp.array([1.0, 2.0]), jnp.array([[0, -1], [1, 0]])
    want = np.array([[0.0, 1.0], [2.0, 0.0]])
    np.testing.assert_array_equal(
        jsparse.BCOO((data, indices), shape=(2, 2)).todense(), want
    )
    x = BCOO(data, indices, (2, 2))
    np.testing.assert_array_equal(np.asarray(x.indices), [[0, 1], [1, 0]])
    np.testing.assert_array_equal(x.todense(), want)
    np.testing.assert_array_equal(x.to_jax().todense(), want)
    np.testing.assert_array_equal(x.to_scipy().toarray(), want)
    matvec = quax.quaxify(lambda a, v: a @ v)
    np.testing.assert_array_equal(matvec(x, jnp.array([1.0, 10.0])), [10.0, 2.0])
    # Traced indices (built under jit) read the same.
    traced = jax.jit(lambda d, i: BCOO(d, i, (2, 2)).todense())(data, indices)
    np.testing.assert_array_equal(traced, want)
    sin_matvec = quax.quaxify(lambda a, v: jnp.sin(a) @ v)
    sin = jax.jit(lambda d, i, v: sin_matvec(BCOO(d, i, (2, 2)), v))
    np.testing.assert_allclose(
        sin(data, indices, jnp.array([1.0, 10.0])), [10 * np.sin(1.0), np.sin(2.0)]
    )
    # A batched BCOO: the index counts from the end of its own dimension.
    b = BCOO(jnp.array([[1.0], [2.0]]), jnp.array([[[-3]], [[-1]]]), (2, 3))
    np.testing.assert_array_equal(b.todense(), [[1.0, 0, 0], [0, 0, 2.0]])


def test_negative_csr_columns_count_from_the_end():
    c = CSR(jnp.array([1.0, 2.0]), jnp.array([-1, 0]), jnp.array([0, 1, 2]), (2, 3))
    np.testing.assert_array_equal(c.todense(), [[0, 0, 1.0], [2.0, 0, 0]])
    np.testing.assert_array_equal(
        quax.quaxify(lambda a, v: a @ v)(c, jnp.array([1.0, 10.0, 100.0])),
        [100.0, 2.0],
    )


@pytest.mark.parametrize(
    ("indices", "match"),
    [
        ([[0, 3], [1, 0]], r"`indices\[0, 1\]` = 3 for a dimension of size 2"),
        ([[0, 0], [-3, 0]], r"`indices\[1, 0\]` = -3 for a dimension of size 2"),
    ],
)
def test_indices_outside_the_dimension_refused(indices, match):
    with pytest.raises(ValueError, match=match):
        BCOO(jnp.ones(2), jnp.array(indices), (2, 2))


def test_csr_columns_outside_the_matrix_refused():
    with pytest.raises(ValueError, match=r"`CSR` got `indices\[1\]` = 4"):
        CSR(jnp.ones(2), jnp.array([0, 4]), jnp.array([0, 1, 2]), (2, 3))


def test_index_equal_to_the_size_is_padding():
    x = BCOO(jnp.array([1.0, 5.0, 7.0]), jnp.array([[0, 1], [2, 0], [1, 2]]), (2, 2))
    np.testing.assert_array_equal(x.todense(), [[0, 1.0], [0, 0]])
    np.testing.assert_array_equal(x.to_jax().todense(), [[0, 1.0], [0, 0]])
    np.testing.assert_array_equal(x.to_scipy().toarray(), [[0, 1.0], [0, 0]])


def _jsparse_matrices():
    """Matrices built by jax.experimental.sparse, each with its dense array."""
    padded = jsparse.BCOO.fromdense(DENSE, nse=8)
    batched = jsparse.BCOO.fromdense(np.stack([DENSE, -DENSE]), nse=6, n_batch=1)
    # Duplicates, negative indices, and entries jsparse ignores (outside [-n, n)).
    odd = jsparse.BCOO(
        (
            jnp.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
            jnp.array(
                [[0, -1], [1, 0], [0, 3], [-4, 0], [3, 1], [0, -1], [-3, -4], [0, 5]]
            ),
        ),
        shape=(3, 4),
    )
    summed = jsparse.bcoo_sum_duplicates(
        jsparse.BCOO(
            (jnp.array([1.0, 2.0, 3.0]), jnp.array([[1, 1], [0, 2], [1, 1]])),
            shape=(2, 3),
        ),
        nse=4,
    )
    return {"padded": padded, "batched": batched, "odd": odd, "summed": summed}


@pytest.mark.parametrize("name", ["padded", "batched", "odd", "summed"])
def test_from_jax_and_back_keep_every_jsparse_matrix(name):
    j = _jsparse_matrices()[name]
    want = np.asarray(j.todense())
    x = BCOO.from_jax(j)
    np.testing.assert_array_equal(x.todense(), want)
    np.testing.assert_array_equal(x.to_jax().todense(), want)
    np.testing.assert_array_equal(BCOO.from_jax(x.to_jax()).todense(), want)
    np.testing.assert_array_equal(
        jax.jit(lambda j: BCOO.from_jax(j).todense())(j), want
    )
    v = np.arange(1.0, 1.0 + j.shape[-1], dtype=np.float32)
    np.testing.assert_allclose(
        quax.quaxify(lambda a, v: a @ v)(x, v), want @ v, rtol=1e-6
    )
    # The rebuilt BCOO reads its own indices the same way.
    again = BCOO(x.data, x.indices, x.shape)
    np.testing.assert_array_equal(again.todense(), want)


def test_from_jax_keeps_the_flags_where_no_index_changes():
    j = jsparse.BCOO.fromdense(DENSE, nse=8)
    x = BCOO.from_jax(j)
    assert x.indices_sorted and x.unique_indices
    odd = BCOO.from_jax(_jsparse_matrices()["odd"])
    assert not odd.indices_sorted and not odd.unique_indices


# Constructor checks: shape, CSR's indptr --------------------------------------------


@pytest.mark.parametrize("shape", [(-3, 3), (2.5, 3), (True, 3), 3, ("a", 3)])
def test_shape_of_non_negative_integers(shape):
    with pytest.raises(ValueError, match="`BCOO` needs `shape`"):
        BCOO(jnp.ones(1), jnp.zeros((1, 2), jnp.int32), shape)
    with pytest.raises(ValueError, match="`CSR` needs `shape`"):
        CSR(jnp.ones(1), jnp.zeros(1, jnp.int32), jnp.array([0, 1, 1, 1]), shape)


def test_shape_accepts_numpy_integers():
    x = BCOO(jnp.ones(1), jnp.zeros((1, 2), jnp.int32), (np.int64(2), np.int32(3)))
    assert x.shape == (2, 3) and all(type(n) is int for n in x.shape)


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
