"""The kernels on plain arrays (`quax_sparse._kernels`), against literals and NumPy:
entries with their full positions, gathers and scatter-adds that drop padding,
merging duplicates, and the two products."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from quax_sparse._kernels import (
    dot_sparse_dense,
    dot_sparse_sparse,
    flat_entries,
    gather,
    scatter_add,
    sum_duplicates,
    valid_mask,
)


def test_flat_entries_puts_the_batch_coordinates_first():
    data = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    indices = jnp.array([[[0], [2]], [[1], [1]]])
    coords, values = flat_entries(data, indices)
    np.testing.assert_array_equal(coords, [[0, 0], [0, 2], [1, 1], [1, 1]])
    np.testing.assert_array_equal(values, [1.0, 2.0, 3.0, 4.0])
    coords, values = flat_entries(data[0], indices[0])
    np.testing.assert_array_equal(coords, [[0], [2]])


def test_gather_reads_zeros_at_padding():
    operand = jnp.arange(12.0).reshape(3, 4)
    rows = gather(operand, jnp.array([[2], [3], [0]]), (0,))  # row 3 is padding
    np.testing.assert_array_equal(rows, [[8, 9, 10, 11], [0, 0, 0, 0], [0, 1, 2, 3]])
    cols = gather(operand, jnp.array([[1], [-1]]), (1,))
    np.testing.assert_array_equal(cols, [[1, 5, 9], [0, 0, 0]])


def test_scatter_add_adds_duplicates_and_drops_padding():
    out = scatter_add(
        jnp.zeros((2, 3)),
        jnp.array([[0, 1], [0, 1], [1, 2], [2, 0]]),
        (0, 1),
        jnp.array([1.0, 2.0, 5.0, 7.0]),
    )
    np.testing.assert_array_equal(out, [[0, 3.0, 0], [0, 0, 5.0]])
    # Whole rows, and no indexed axis at all (a sum into the operand).
    rows = scatter_add(jnp.ones((2, 2)), jnp.array([[1], [1]]), (0,), jnp.ones((2, 2)))
    np.testing.assert_array_equal(rows, [[1, 1], [3, 3]])
    total = scatter_add(jnp.ones(2), jnp.zeros((3, 0), jnp.int32), (), jnp.ones((3, 2)))
    np.testing.assert_array_equal(total, [4, 4])


def test_scatter_add_of_bools_is_logical_or():
    out = scatter_add(
        jnp.zeros(3, bool),
        jnp.array([[0], [0], [2], [1]]),
        (0,),
        jnp.array([True, True, True, False]),
    )
    assert out.dtype == jnp.bool_
    np.testing.assert_array_equal(out, [True, False, True])


def test_valid_mask_is_the_bounds():
    indices = jnp.array([[0, 0], [1, 2], [2, 0], [0, 3], [-1, 0]])
    np.testing.assert_array_equal(
        valid_mask(indices, (2, 3)), [True, True, False, False, False]
    )


def test_sum_duplicates_merges_sorts_and_pads_last():
    data = jnp.array([1.0, 4.0, 2.0, 9.0, 5.0])
    indices = jnp.array([[1, 2], [0, 1], [1, 2], [2, 0], [0, 1]])  # (2, 0): padding
    out_data, out_indices = sum_duplicates(data, indices, (2, 3), 4, is_sorted=False)
    np.testing.assert_array_equal(out_indices, [[0, 1], [1, 2], [2, 3], [2, 3]])
    np.testing.assert_array_equal(out_data, [9.0, 3.0, 0, 0])
    # Fewer entries than positions: the first in row-major order stay.
    out_data, out_indices = sum_duplicates(data, indices, (2, 3), 1, is_sorted=False)
    np.testing.assert_array_equal(out_indices, [[0, 1]])
    np.testing.assert_array_equal(out_data, [9.0])


def test_sum_duplicates_batched_and_bool():
    data = jnp.array([[True, True, False], [False, True, True]])
    indices = jnp.array([[[1], [1], [0]], [[2], [0], [0]]])
    out_data, out_indices = sum_duplicates(data, indices, (3,), 3, is_sorted=False)
    assert out_data.dtype == jnp.bool_
    np.testing.assert_array_equal(out_indices[..., 0], [[0, 1, 3], [0, 2, 3]])
    np.testing.assert_array_equal(
        out_data, [[False, True, False], [True, False, False]]
    )


@pytest.mark.parametrize(
    ("dimension_numbers", "sparse_is_lhs", "dense_shape", "einsum"),
    [
        ((((1,), (0,)), ((), ())), True, (4, 2), "ij,jk->ik"),
        ((((0,), (1,)), ((), ())), True, (2, 3), "ij,ki->jk"),
        ((((1,), (0,)), ((), ())), False, (2, 3), "ki,ij->kj"),
    ],
)
def test_dot_sparse_dense_against_einsum(
    dimension_numbers, sparse_is_lhs, dense_shape, einsum
):
    # A 3 x 4 sparse matrix with a duplicate and a padding entry.
    data = jnp.array([1.0, 2.0, 3.0, 4.0, 9.0])
    indices = jnp.array([[0, 1], [2, 3], [0, 1], [1, 0], [3, 4]])
    dense = np.zeros((3, 4), np.float32)
    dense[0, 1], dense[2, 3], dense[1, 0] = 4.0, 2.0, 4.0
    d = np.arange(1.0, 1.0 + np.prod(dense_shape), dtype=np.float32)
    d = d.reshape(dense_shape)
    got = dot_sparse_dense(
        data,
        indices,
        (3, 4),
        d,
        dimension_numbers,
        sparse_is_lhs=sparse_is_lhs,
        out_dtype=jnp.float32,
        indices_sorted=False,
    )
    want = np.einsum(einsum, dense, d) if sparse_is_lhs else np.einsum(einsum, d, dense)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dot_sparse_sparse_one_entry_per_product():
    # a (2 x 3) and b (3 x 2), each with a padding entry.
    a_data, a_indices = jnp.array([1.0, 2.0, 5.0]), jnp.array([[0, 1], [1, 2], [2, 0]])
    b_data, b_indices = jnp.array([3.0, 4.0, 7.0]), jnp.array([[1, 0], [1, 1], [3, 0]])
    data, indices = dot_sparse_sparse(
        a_data,
        a_indices,
        b_data,
        b_indices,
        (2, 3, 2),
        jnp.float32,
        a_unique=True,
        b_unique=True,
    )
    assert data.shape == (2,)  # concrete indices: exactly the two products
    dense = np.zeros((2, 2), np.float32)
    np.add.at(dense, tuple(np.asarray(indices).T), np.asarray(data))
    np.testing.assert_array_equal(dense, [[3.0, 4.0], [0.0, 0.0]])
    # Traced indices: the static bound, the unused entries padding.
    data, indices = jax.jit(
        lambda ai, bi: dot_sparse_sparse(
            a_data, ai, b_data, bi, (2, 3, 2), jnp.float32, a_unique=True, b_unique=True
        )
    )(a_indices, b_indices)
    assert data.shape == (min(9, 3 * 2, 3 * 2),)
    np.testing.assert_array_equal(np.asarray(indices)[2:], [[2, 2]] * 4)
