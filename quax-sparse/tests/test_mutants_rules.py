"""Sparse arrays: tests that kill mutants of `quax_sparse/_rules.py` which the other
test files let through (`scripts/mutation.sh sparse-rules`; docs/mutation.md lists
each surviving mutant of the sample run and the test that kills it). References are
NumPy on dense arrays written out as literals."""

import jax
import jax.numpy as jnp
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
