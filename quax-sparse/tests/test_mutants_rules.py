"""Sparse arrays: tests that kill mutants of `quax_sparse/_rules.py` which the other
test files let through (`scripts/mutation.sh sparse-rules`; docs/mutation.md lists
each surviving mutant of the sample run and the test that kills it). References are
NumPy on dense arrays written out as literals."""

import jax
import jax.numpy as jnp
import numpy as np
import quax
from quax_sparse import BCOO


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
