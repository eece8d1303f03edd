"""Indices given in a narrow or unsigned integer dtype. In `int8`, the wrapped `-1`
of a dimension of size 200 is `199`, which overflows to `-57`; the padding index of
a dimension of size 130 overflows as well. These arrays were accepted and read as
other positions; they are now read as `int32` (constructors) or refused
(`index_dtype=` arguments). References are literals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import scipy.sparse
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO, CSR


matvec = quax.quaxify(lambda a, v: a @ v)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int16])
def test_negative_narrow_indices_count_from_the_end(dtype):
    # Row 0 holds 1.0 at column -1 (= 199) and 2.0 at column 3.
    a = BCOO(jnp.array([1.0, 2.0]), jnp.array([[0, -1], [0, 3]], dtype), (1, 200))
    v = jnp.arange(200.0)
    np.testing.assert_array_equal(matvec(a, v), [1.0 * 199 + 2.0 * 3])
    dense = np.zeros((1, 200), np.float32)
    dense[0, 199], dense[0, 3] = 1.0, 2.0
    np.testing.assert_array_equal(a.todense(), dense)
    assert a.indices.dtype == jnp.int32


def test_negative_narrow_indices_under_jit():
    build = jax.jit(lambda i: BCOO(jnp.array([1.0, 2.0]), i, (1, 200)).todense())
    out = build(jnp.array([[0, -1], [0, 3]], jnp.int8))
    np.testing.assert_array_equal(out[0, [3, 199]], [2.0, 1.0])


def test_unsigned_indices_in_a_dimension_larger_than_their_range():
    # uint8 holds 255 but not the padding index 300 of this dimension, nor the
    # positions a reshape computes.
    a = BCOO(jnp.array([1.0, 2.0]), jnp.array([[255], [3]], jnp.uint8), (300,))
    out = quax.quaxify(lambda a: (a * 2.0).reshape(3, 100))(a)
    expected = np.zeros(300, np.float32)
    expected[255], expected[3] = 2.0, 4.0
    np.testing.assert_array_equal(out.todense(), expected.reshape(3, 100))


def test_reshape_of_int16_indices_past_their_range():
    # 199 * 200 + 199 = 39999 does not fit in int16.
    a = BCOO(
        jnp.array([1.0, 2.0]), jnp.array([[199, 199], [0, 3]], jnp.int16), (200, 200)
    )
    flat = quax.quaxify(lambda a: a.reshape(-1))(a).todense()
    assert np.flatnonzero(np.asarray(flat)).tolist() == [3, 39999]
    np.testing.assert_array_equal(np.asarray(flat)[[3, 39999]], [2.0, 1.0])


def test_csr_narrow_column_indices_and_indptr():
    # Row 0: 1.0 at column -1 (= 199), 2.0 at column 0; row 1: 3.0 at column 2.
    c = CSR(
        jnp.array([1.0, 2.0, 3.0]),
        jnp.array([-1, 0, 2], jnp.int8),
        jnp.array([0, 2, 3], jnp.uint8),
        (2, 200),
    )
    v = jnp.arange(200.0)
    np.testing.assert_array_equal(matvec(c, v), [199.0, 6.0])
    assert c.indices.dtype == c.indptr.dtype == jnp.int32


def test_from_jax_with_int8_indices():
    x = jsparse.BCOO(
        (jnp.array([1.0, 2.0]), jnp.array([[-1], [3]], jnp.int8)), shape=(200,)
    )
    a = BCOO.from_jax(x)
    np.testing.assert_array_equal(a.todense()[jnp.array([3, 199])], [2.0, 1.0])


@pytest.mark.parametrize("index_dtype", [jnp.int8, jnp.int16, jnp.uint8, jnp.uint32])
def test_narrow_index_dtype_argument_refused(index_dtype):
    x = jnp.zeros(200).at[150].set(1.0)
    with pytest.raises(ValueError, match=r"index_dtype=jnp\.int32"):
        BCOO.fromdense(x, nse=1, index_dtype=index_dtype)
    with pytest.raises(ValueError, match=r"CSR\.fromdense|BCOO\.fromdense"):
        CSR.fromdense(x[None], nse=1, index_dtype=index_dtype)
    m = scipy.sparse.coo_array(np.asarray(x)[None])
    with pytest.raises(ValueError, match=r"BCOO\.from_scipy.*index_dtype=jnp\.int32"):
        BCOO.from_scipy(m, index_dtype=index_dtype)
    with pytest.raises(ValueError, match=r"CSR\.from_scipy.*index_dtype=jnp\.int32"):
        CSR.from_scipy(m, index_dtype=index_dtype)


def test_int32_index_dtype_argument_kept():
    x = jnp.zeros(200).at[150].set(1.0)
    a = BCOO.fromdense(x, nse=2, index_dtype=jnp.int32)
    assert a.indices.dtype == jnp.int32
    assert a.indices[:, 0].tolist() == [150, 200]
