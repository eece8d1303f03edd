"""Sparse arrays: tests that kill mutants of `quax_sparse/_rules.py` which the other
test files let through (`scripts/mutation.sh sparse-rules`; docs/mutation.md lists
each surviving mutant of the sample run and the test that kills it). References are
NumPy on dense arrays written out as literals."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
from quax_sparse import BCOO, SparseMaterialisationError


def test_where_of_a_sparse_mask_and_a_sparse_array_stays_sparse() -> None:
    # `jnp.where(mask, x, 0)` with both sparse and of one shape (what `relu`'s
    # derivative binds) keeps the entries both store where the mask holds, without
    # materialising (mutant: the shapes' test inverted, so that equal shapes fall
    # back and are refused).
    mask = BCOO(
        jnp.array([True, False, True]), jnp.array([[0, 0], [1, 2], [2, 1]]), (3, 3)
    )
    x = BCOO(
        jnp.array([1.5, -2.0, 4.0, 7.0], jnp.float32),
        jnp.array([[0, 0], [1, 2], [2, 1], [0, 2]]),
        (3, 3),
    )
    want = np.zeros((3, 3), np.float32)
    want[0, 0], want[2, 1] = 1.5, 4.0
    f = quax.quaxify(lambda m, a: jnp.where(m, a, 0.0))
    for run in (f, jax.jit(f)):
        out = run(mask, x)
        assert isinstance(out, BCOO)
        np.testing.assert_array_equal(out.todense(), want)


# The second sample (seed 46).


def _entries(**flags) -> BCOO:
    # Three unique entries of a 3 x 3 matrix, in order; `DENSE` is its dense array.
    return BCOO(
        jnp.array([1.5, -2.0, 4.0], jnp.float32),
        jnp.array([[0, 0], [1, 2], [2, 1]]),
        (3, 3),
        **flags,
    )


DENSE = np.array([[1.5, 0, 0], [0, 0, -2.0], [0, 4.0, 0]], np.float32)


def test_new_axes_and_squeezes_keep_the_entries_unique() -> None:
    # `x[None]`, `x[:, None]` and squeezing a new axis away keep the entries as they
    # are, and so their flags; what comes after then needs no merging of duplicates
    # (`a[:, None] > 0` sorts nothing). (Mutant `in_order` 12: every such result
    # marked as maybe holding duplicates, so `> 0` sorted and merged them.)
    x = _entries(unique_indices=True, indices_sorted=True)
    for fn, want in (
        (lambda a: a[None], DENSE[None]),
        (lambda a: a[:, None], DENSE[:, None]),
        (lambda a: a[None][0], DENSE),
    ):
        for run in (quax.quaxify(fn), jax.jit(quax.quaxify(fn))):
            out = run(x)
            assert isinstance(out, BCOO)
            assert out.unique_indices and out.indices_sorted
            np.testing.assert_array_equal(out.todense(), want)
    mask = quax.quaxify(lambda a: a[:, None] > 0)
    np.testing.assert_array_equal(mask(x).todense(), DENSE[:, None] > 0)
    assert "sort" not in str(jax.make_jaxpr(mask)(x))


def test_max_and_comparisons_against_a_nonzero_are_dense_where_allowed() -> None:
    # `max(x, 0)` and `x > 0` keep the pattern; against 1.0, or against a zero of
    # a larger shape, the result has no pattern: refused, or, where allowed,
    # computed densely (mutant `_against_zero` 19: that fallback called without
    # the primitive's parameters, a `TypeError`).
    x = _entries()
    relu = quax.quaxify(jax.nn.relu)
    out = relu(x)
    assert isinstance(out, BCOO)
    np.testing.assert_array_equal(out.todense(), np.maximum(DENSE, 0))
    cases = (
        (lambda a: jnp.maximum(a, 1.0), np.maximum(DENSE, 1.0)),
        (lambda a: a > 1.0, DENSE > 1.0),
        (
            lambda a: jnp.minimum(a, jnp.zeros((2, 3, 3))),
            np.broadcast_to(np.minimum(DENSE, 0), (2, 3, 3)),
        ),
    )
    for fn, want in cases:
        with pytest.raises(SparseMaterialisationError):
            quax.quaxify(fn)(x)
        f = quax.quaxify(fn)
        for run in (f, jax.jit(f)):
            got = run(x.enable_materialise())
            got = got.todense() if isinstance(got, BCOO) else got
            np.testing.assert_array_equal(got, want, strict=True)


# The registered rules, a first sample (seed 48, `--decorated`).


def _nonsymmetric() -> tuple[np.ndarray, BCOO]:
    dense = np.array([[4.0, 1.0, 0.0], [2.0, 3.0, 2.0], [1.0, 0.0, 5.0]])
    rows, cols = np.nonzero(dense)
    indices = np.stack([rows, cols], axis=-1).astype(np.int32)
    return dense, BCOO(jnp.asarray(dense[rows, cols]), jnp.asarray(indices), (3, 3))


@pytest.mark.float64
@pytest.mark.usefixtures("x64")
def test_the_identity_mask_times_a_factor_is_its_diagonal() -> None:
    # `eye * U` of a sparse LU factor (the branch `jnp.diagonal` takes for Pallas
    # kernels): a sparse diagonal, `U`'s, which for this matrix is dense JAX's
    # (4, 2.5, 5.2) (mutant of the `mul` rule, line 1374, 38: the diagonal's
    # coordinates stacked with `axis=None`, a `TypeError`).
    dense, a = _nonsymmetric()
    f = quax.quaxify(lambda a: jax.lax.mul(jnp.eye(3), jax.lax.linalg.lu(a)[0]))
    want = np.diag(np.diagonal(np.asarray(jax.lax.linalg.lu(jnp.asarray(dense))[0])))
    np.testing.assert_allclose(want, np.diag([4.0, 2.5, 5.2]), rtol=1e-12)
    for run in (f, jax.jit(f)):
        out = run(a)
        assert isinstance(out, BCOO)
        np.testing.assert_allclose(out.todense(), want, rtol=1e-12)


@pytest.mark.usefixtures("x64")
def test_a_cholesky_solve_of_a_vector() -> None:
    # `cho_solve` of a vector reshapes the right-hand side between its two
    # triangular solves (`b[:, None]`), which the pending solve applies to the
    # right-hand side it holds (mutant of the `broadcast_in_dim` rule, line 1538,
    # 15: the primitive's other params, `sharding`, left out of the bind).
    dense = np.array([[4.0, 1.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.5, 2.0]])
    rows, cols = np.nonzero(dense)
    indices = np.stack([rows, cols], axis=-1).astype(np.int32)
    a = BCOO(jnp.asarray(dense[rows, cols]), jnp.asarray(indices), (3, 3))
    b = np.array([1.0, -2.0, 0.5])
    f = quax.quaxify(lambda a, b: jsl.cho_solve(jsl.cho_factor(a, lower=True), b))
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(a, b), np.linalg.solve(dense, b), rtol=1e-12)


def test_a_float_conversion_keeps_duplicate_entries_apart() -> None:
    # Converting to a floating type is exact enough for each stored value: entries
    # at one position stay apart, each converted, not merged first (mutant of the
    # `convert_element_type` rule, line 338, 12: merged, a sort and a sum the
    # conversion does not need).
    x = BCOO(
        jnp.array([1.5, -2.0, 4.0, 0.25], jnp.float32),
        jnp.array([[0, 0], [1, 2], [0, 0], [2, 1]]),
        (3, 3),
    )
    want = np.zeros((3, 3), np.float16)
    want[0, 0], want[1, 2], want[2, 1] = 5.5, -2.0, 0.25
    f = quax.quaxify(lambda a: a.astype(jnp.float16))
    for run in (f, jax.jit(f)):
        out = run(x)
        assert isinstance(out, BCOO)
        np.testing.assert_array_equal(
            out.data, np.array([1.5, -2.0, 4.0, 0.25], np.float16)
        )
        np.testing.assert_array_equal(out.indices, x.indices)
        np.testing.assert_array_equal(out.todense(), want)


# The registered rules, a second sample (seed 49, `--decorated`).


def test_two_triangular_solves_out_of_order_say_which_order_is_one_solve() -> None:
    # `lax.linalg.lu` of a sparse matrix, then its upper solve before its lower
    # one: no solve with the matrix, refused at trace time with what was bound, in
    # what order, and what the two solves must be (mutant of the second solve's
    # rule, line 1459, 44: the message's case changed).
    a = BCOO.fromdense(
        np.array([[4.0, 1.0, 0.0], [0.0, 3.0, 2.0], [1.0, 0.0, 5.0]], np.float32)
    )

    def wrong_order(a, b):
        lu, _, _ = jax.lax.linalg.lu(a)
        y = jax.lax.linalg.triangular_solve(lu, b, left_side=True, lower=False)
        return jax.lax.linalg.triangular_solve(lu, y, left_side=True, lower=True)

    with pytest.raises(
        SparseMaterialisationError,
        match=r"^Refusing to materialise `SparseLU` for primitive `triangular_solve` "
        r"on input types \(SparseLU, PendingSolve\): two triangular solves with a "
        r"sparse factor are one solve with its matrix only in the order "
        r"`jax\.scipy\.linalg\.lu_solve` and `cho_solve` bind them, with the same "
        r"factor; got \(False, False, False, False\) then \(True, False, False, "
        r"False\) \(lower, transpose_a, conjugate_a, unit_diagonal\) on a `lu` "
        r"factor\. ",
    ):
        quax.quaxify(wrong_order)(a, jnp.ones((3, 1), jnp.float32))


def test_a_squeeze_drops_padding_entries_of_the_squeezed_dimension():
    """`jnp.squeeze` of a (1, 3) `BCOO` holding a padding entry (its index along the
    squeezed dimension is 1, out of bounds) with a nonzero value: the padding is
    dropped, as its dense array never held it (mutant of the `squeeze` rule, line
    1038, 35: index 1 taken as in bounds, which gave [0, 1, 5])."""
    x = BCOO(
        jnp.array([1.0, 5.0]), jnp.array([[0, 1], [1, 2]], jnp.int32), shape=(1, 3)
    )
    f = quax.quaxify(lambda a: jnp.squeeze(a, 0))
    for run in (f, jax.jit(f)):
        np.testing.assert_array_equal(run(x).todense(), [0.0, 1.0, 0.0])


def test_a_reshape_of_the_sparse_dimensions_keeps_the_batch():
    """A (2, 3, 4) `BCOO` with one batch dimension reshaped to (2, 12): a `BCOO`
    still, with its batch dimension (mutant of the `reshape` rule, line 1056, 30:
    the batch shape lost, so every reshape of a batched array was refused)."""
    dense = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    dense[0, 1] = 0.0
    x = BCOO.fromdense(jnp.asarray(dense), n_batch=1)
    f = quax.quaxify(lambda a: a.reshape(2, 12))
    for run in (f, jax.jit(f)):
        out = run(x)
        assert isinstance(out, BCOO) and out.n_batch == 1
        np.testing.assert_array_equal(out.todense(), dense.reshape(2, 12))


def test_a_rule_for_scalar_entries_refuses_blocks_naming_its_primitive():
    """`lax.linalg.lu` of a `BCOO` that stores blocks (`n_dense=1`): its rule
    handles scalar entries only, refused naming `lu` and the way out; allowed, the
    dense factorisation (mutant of `register`, 6: the refusal given `None` for its
    primitive)."""
    dense = np.array([[4.0, 1.0, 0.0], [1.0, 3.0, 0.0], [0.0, 0.0, 2.0]], np.float32)
    x = BCOO.fromdense(jnp.asarray(dense), n_dense=1)
    lu = quax.quaxify(jax.lax.linalg.lu)
    with pytest.raises(
        SparseMaterialisationError,
        match=r"for primitive `lu` on input types \(BCOO\): the BCOO of shape "
        r"\(3, 3\) stores blocks over its n_dense=1 trailing dense dimensions "
        r"\(block shape \(3,\)\), and quax-sparse's rule for `lu` on these types "
        r"handles scalar entries only \(n_dense=0\)\. Turn the dense dimensions into "
        r"sparse ones first",
    ):
        lu(x)
    for got, want in zip(
        lu(x.enable_materialise()), jax.lax.linalg.lu(jnp.asarray(dense)), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6)


# The registered rules against the whole suite (seed 51, `--suite --decorated`).


def test_reshaping_every_sparse_dimension_away_drops_the_padding() -> None:
    # A (1, 1) array reshaped to (), and a (1, 3) one of blocks (`n_dense=1`) to
    # (3,): no sparse dimension is left, so padding entries (index 1 along a
    # dimension of size 1) can only be held as zero values: the result is the sum
    # of the real entries (mutant, line 1056, 128: the padding mask built without
    # the data, a `TypeError`).
    scalar = BCOO(jnp.array([2.0, 5.0]), jnp.array([[0, 0], [1, 1]]), (1, 1))
    blocks = BCOO(
        jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.5, 0.25, 0.125]]),
        jnp.array([[0], [1], [0]]),
        (1, 3),
    )
    f = quax.quaxify(lambda a: jnp.reshape(a, ()))
    g = quax.quaxify(lambda a: jnp.reshape(a, (3,)))
    for run_f, run_g in ((f, g), (jax.jit(f), jax.jit(g))):
        np.testing.assert_array_equal(run_f(scalar), np.float32(2.0))
        out = run_g(blocks)
        if isinstance(out, BCOO):
            out = out.todense()
        np.testing.assert_array_equal(out, np.array([1.5, 2.25, 3.125], np.float32))


def test_a_concatenation_of_arrays_without_duplicates_keeps_the_promise() -> None:
    # Entries shifted apart along the joined axis stay apart: joining two arrays
    # that promise unique indices gives one that does (mutant, line 1213, 76: the
    # promise dropped); one without the promise gives none.
    a = BCOO(
        jnp.array([1.0, 2.0]), jnp.array([[0, 1], [1, 0]]), (2, 2), unique_indices=True
    )
    b = BCOO(jnp.array([3.0]), jnp.array([[1, 1]]), (2, 2), unique_indices=True)
    c = BCOO(jnp.array([3.0, 4.0]), jnp.array([[1, 1], [1, 1]]), (2, 2))
    f = quax.quaxify(lambda x, y: jnp.concatenate([x, y], axis=0))
    for run in (f, jax.jit(f)):
        out = run(a, b)
        assert out.unique_indices is True
        np.testing.assert_array_equal(
            out.todense(), np.array([[0, 1], [2, 0], [0, 0], [0, 3]], np.float32)
        )
        out = run(a, c)
        assert not out.unique_indices
        np.testing.assert_array_equal(
            out.todense(), np.array([[0, 1], [2, 0], [0, 0], [0, 7]], np.float32)
        )


# Sparse's registered rules against the whole suite (seed 52, `--suite --decorated`).


def test_a_product_of_two_sparse_operands_with_blocks_on_the_left_names_the_way_out():
    # Blocks are kept only as the right operand's free dense dimensions: with them
    # on the left the product is refused, and the message says why and both ways
    # out whole (mutant line 267, 35: the second way out's text changed).
    a = BCOO.fromdense(jnp.arange(12.0).reshape(3, 4), n_dense=1)
    b = BCOO.fromdense(jnp.eye(4))
    with pytest.raises(
        SparseMaterialisationError,
        match=r"a product of two sparse operands keeps blocks only as the right "
        r"operand's free dense dimensions, `\(n, k\) @ \(k, m, \*block\)`, where the "
        r"dense dimensions stay last\. Densify the other operand first "
        r"\(`y\.todense\(\)`: the product of a sparse array with blocks and a dense "
        r"one keeps the blocks\), or bind the product as "
        r"`\(n, k\) @ \(k, m, \*block\)`\. ",
    ):
        quax.quaxify(lambda a, b: a @ b)(a, b)
