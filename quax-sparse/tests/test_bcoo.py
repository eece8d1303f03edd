"""The value type `BCOO`: construction and its checks, how indices are read
(negative ones, padding), `fromdense`, `todense`, `sum_duplicates`, and the
conversions to and from `jax.experimental.sparse` and scipy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import scipy.sparse
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO, CSR, fromdense
from sparse_helpers import DENSE, assert_close, random_sparse


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


@pytest.mark.parametrize("shape", [(-3, 3), (2.5, 3), (True, 3), 3, ("a", 3)])
def test_shape_of_non_negative_integers(shape):
    with pytest.raises(ValueError, match="`BCOO` needs `shape`"):
        BCOO(jnp.ones(1), jnp.zeros((1, 2), jnp.int32), shape)
    with pytest.raises(ValueError, match="`CSR` needs `shape`"):
        CSR(jnp.ones(1), jnp.zeros(1, jnp.int32), jnp.array([0, 1, 1, 1]), shape)


def test_shape_accepts_numpy_integers():
    x = BCOO(jnp.ones(1), jnp.zeros((1, 2), jnp.int32), (np.int64(2), np.int32(3)))
    assert x.shape == (2, 3) and all(type(n) is int for n in x.shape)


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


def test_index_equal_to_the_size_is_padding():
    x = BCOO(jnp.array([1.0, 5.0, 7.0]), jnp.array([[0, 1], [2, 0], [1, 2]]), (2, 2))
    np.testing.assert_array_equal(x.todense(), [[0, 1.0], [0, 0]])
    np.testing.assert_array_equal(x.to_jax().todense(), [[0, 1.0], [0, 0]])
    np.testing.assert_array_equal(x.to_scipy().toarray(), [[0, 1.0], [0, 0]])


_UNSORTED = [[2, 0], [0, 1], [1, 1], [0, 1], [2, 2]]  # (0, 1) twice, apart


@pytest.mark.parametrize(
    "data, indices, shape, flags, match",
    [
        (
            jnp.arange(5.0),
            _UNSORTED,
            (3, 3),
            {"indices_sorted": True},
            r"`indices_sorted=True`, but `indices\[1\]` = \(0, 1\) comes after "
            r"`indices\[0\]` = \(2, 0\)",
        ),
        (
            jnp.arange(5.0),
            _UNSORTED,
            (3, 3),
            {"unique_indices": True},
            r"`unique_indices=True`, but `indices\[1\]` and `indices\[3\]` are "
            r"both \(0, 1\)",
        ),
        (  # sorted, with a duplicate: only the sorted promise holds
            jnp.arange(3.0),
            [[0, 1], [0, 1], [1, 1]],
            (3, 3),
            {"indices_sorted": True, "unique_indices": True},
            r"`unique_indices=True`, but `indices\[0\]` and `indices\[1\]`",
        ),
        (  # a negative index is read (wrapped) before the check
            jnp.arange(2.0),
            [[2, 1], [-1, 1]],
            (3, 3),
            {"unique_indices": True},
            r"`indices\[0\]` and `indices\[1\]` are both \(2, 1\)",
        ),
        (  # per batch element: the second one is out of order
            jnp.ones((2, 2)),
            [[[0, 1], [1, 0]], [[1, 0], [0, 1]]],
            (2, 2, 2),
            {"indices_sorted": True},
            r"`indices\[1, 1\]` = \(0, 1\) comes after `indices\[1, 0\]`",
        ),
        (  # blocks: one sparse position stored twice
            jnp.ones((2, 4)),
            [[1], [1]],
            (3, 4),
            {"unique_indices": True},
            r"are both \(1,\)",
        ),
        (  # no sparse dimension: every entry at the one position
            jnp.ones((2, 2)),
            np.zeros((2, 2, 0), np.int32),
            (2,),
            {"unique_indices": True},
            "no sparse dimension, so its 2 entries",
        ),
    ],
)
def test_false_promises_refused(data, indices, shape, flags, match):
    """A flag promising what the concrete indices break is refused at construction:
    the rules trust it (a false `unique_indices` made `x ** 2` of entries 1 and 3
    at one position 1 + 9 = 10 instead of 16)."""
    with pytest.raises(ValueError, match=match):
        BCOO(data, jnp.asarray(indices), shape, **flags)


def test_true_promises_accepted_and_kept():
    """Promises that hold are kept: padding stored twice is no duplicate, a
    duplicate may be sorted; the rules that trust them agree with NumPy."""
    flags = {"indices_sorted": True, "unique_indices": True}
    padded = BCOO(
        jnp.array([1.0, 2.0, 3.0, 9.0, 9.0]),
        jnp.array([[0, 1], [1, -1], [2, 0], [3, 3], [3, 3]]),
        (3, 3),
        **flags,
    )
    assert padded.indices_sorted and padded.unique_indices
    expected = np.zeros((3, 3))
    expected[0, 1], expected[1, 2], expected[2, 0] = 1.0, 2.0, 3.0
    squared = quax.quaxify(lambda x: x**2)(padded)
    np.testing.assert_array_equal(squared.todense(), expected**2)
    twice = BCOO(
        jnp.array([1.0, 3.0, 2.0]),
        jnp.array([[0, 1], [0, 1], [1, 1]]),
        (3, 3),
        indices_sorted=True,
    )
    expected = np.zeros((3, 3))
    expected[0, 1], expected[1, 1] = 4.0, 2.0
    np.testing.assert_array_equal(
        quax.quaxify(lambda x: x**2)(twice).todense(), expected**2
    )
    # Traced indices cannot be checked: the flags are kept as given.
    traced = jax.jit(lambda d, i: BCOO(d, i, (3, 3), **flags).data)
    np.testing.assert_array_equal(traced(jnp.ones(5), jnp.array(_UNSORTED)), 1.0)
    rebuilt = fromdense(jnp.array([[0.0, 1.0], [2.0, 0.0]]), nse=4)
    again = BCOO(rebuilt.data, rebuilt.indices, rebuilt.shape, **flags)
    np.testing.assert_array_equal(again.todense(), [[0, 1.0], [2.0, 0]])


# fromdense, todense, sum_duplicates -----------------------------------------------


def test_fromdense_roundtrip_sorted_and_padded():
    x = fromdense(DENSE, nse=6)
    assert x.indices_sorted and x.unique_indices
    np.testing.assert_array_equal(
        np.asarray(x.indices),
        [[0, 1], [1, 0], [1, 3], [2, 3], [3, 4], [3, 4]],  # padding: the shape
    )
    np.testing.assert_array_equal(np.asarray(x.data), [1.5, 2.0, -1.0, 3.0, 0, 0])
    assert_close(x.todense(), DENSE)


# The matrix: five nonzeros; `A @ [1, 2, 3]` written out by hand.
FIVE = np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0], [4.0, 0.0, 5.0]], np.float32)
FIVE_TIMES_123 = np.array([1 + 2 * 3, 3 * 2, 4 + 5 * 3], np.float32)


@pytest.mark.parametrize("cls", [BCOO, CSR])
def test_fromdense_refuses_an_nse_that_would_drop_nonzeros(cls):
    # A concrete array with more nonzeros than `nse`: refused, with the count
    # (before, the first two were kept and `A @ v` gave [7, 0, 0]).
    with pytest.raises(ValueError, match=r"nse=2, but `x` has 5 nonzeros: 3 of them"):
        cls.fromdense(FIVE, nse=2)
    with pytest.raises(ValueError, match=r"`nse=None`.*`nse >= 5`"):
        cls.fromdense(jnp.asarray(FIVE), nse=4)
    matvec = quax.quaxify(lambda a, v: a @ v)
    v = jnp.array([1.0, 2.0, 3.0])
    # Every nonzero kept: `nse=None` (exactly the count) or any `nse >= 5`.
    exact = cls.fromdense(FIVE)
    assert exact.nse == 5
    assert_close(matvec(exact, v), FIVE_TIMES_123)
    assert_close(jax.jit(matvec)(cls.fromdense(FIVE, nse=5), v), FIVE_TIMES_123)
    assert_close(matvec(cls.fromdense(FIVE, nse=7), v), FIVE_TIMES_123)


@pytest.mark.parametrize("cls", [BCOO, CSR])
def test_fromdense_under_jit_keeps_the_first_nse_as_jax_experimental_sparse(cls):
    # Traced, the count cannot be known: the first `nse` nonzeros in row-major
    # order are kept (documented), as in jax.experimental.sparse.
    first_two = np.zeros_like(FIVE)
    first_two[0] = FIVE[0]
    got = jax.jit(lambda x: cls.fromdense(x, nse=2).todense())(FIVE)
    assert_close(got, first_two)
    assert_close(jsparse.BCOO.fromdense(jnp.asarray(FIVE), nse=2).todense(), first_two)
    # `nse=None` needs the count: refused under jit, saying to pass `nse`.
    with pytest.raises(ValueError, match="needs `nse` where `x` is traced"):
        jax.jit(lambda x: cls.fromdense(x).todense())(FIVE)


def test_fromdense_counts_per_batch_element_and_per_block():
    # Batches: the largest count of a batch element decides, and is named.
    stacked = np.stack([np.eye(3, dtype=np.float32), FIVE])
    with pytest.raises(ValueError, match=r"has 5 nonzeros in batch element \(1,\)"):
        BCOO.fromdense(stacked, nse=3, n_batch=1)
    x = BCOO.fromdense(stacked, n_batch=1)
    assert x.nse == 5
    assert_close(x.todense(), stacked)
    # Blocks (n_dense=1): a row of FIVE is one block, all three are nonzero.
    with pytest.raises(ValueError, match="has 3 nonzero blocks"):
        BCOO.fromdense(FIVE, nse=2, n_dense=1)
    assert BCOO.fromdense(FIVE, n_dense=1).nse == 3
    # A NaN is a nonzero (dense JAX keeps it), and an all-zero array stores nothing.
    nan = np.array([[0.0, np.nan], [0.0, 0.0]], np.float32)
    with pytest.raises(ValueError, match="has 1 nonzeros"):
        BCOO.fromdense(nan, nse=0)
    assert np.isnan(BCOO.fromdense(nan).todense()[0, 1])
    assert BCOO.fromdense(np.zeros((2, 3))).nse == 0


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


# Conversions ----------------------------------------------------------------------


def test_jax_experimental_sparse_roundtrip():
    j = jsparse.BCOO.fromdense(jnp.asarray(DENSE), nse=5)
    x = BCOO.from_jax(j)
    assert_close(x.todense(), DENSE)
    back = x.to_jax()
    assert isinstance(back, jsparse.BCOO)
    assert_close(back.todense(), DENSE)
    blocks = BCOO.from_jax(jsparse.BCOO.fromdense(jnp.asarray(DENSE), n_dense=1))
    assert blocks.n_dense == 1 and blocks.dense_shape == (4,)
    assert_close(blocks.todense(), DENSE)
    assert blocks.to_jax().n_dense == 1


def _jsparse_matrices():
    """Matrices built by jax.experimental.sparse, each with its dense array."""
    padded = jsparse.BCOO.fromdense(jnp.asarray(DENSE), nse=8)
    batched = jsparse.BCOO.fromdense(
        jnp.asarray(np.stack([DENSE, -DENSE])), nse=6, n_batch=1
    )
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
    j = jsparse.BCOO.fromdense(jnp.asarray(DENSE), nse=8)
    x = BCOO.from_jax(j)
    assert x.indices_sorted and x.unique_indices
    odd = BCOO.from_jax(_jsparse_matrices()["odd"])
    assert not odd.indices_sorted and not odd.unique_indices


def test_scipy_roundtrip():
    m = scipy.sparse.random_array((6, 9), density=0.3, rng=0, dtype=np.float32)
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
