"""Fixtures shared by the quax-structured tests."""

import jax
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


def _jit_matches_dense(fn, *args):
    """`jax.jit(quax.quaxify(fn))` against `fn` on the dense arrays: one compiled
    program per hypothesis example (the kit's eager `eval` check costs more)."""
    dense = [
        a.enable_materialise().materialise()
        if isinstance(a, qs.StructuredMatrix)
        else a
        for a in args
    ]
    got = jax.jit(quax.quaxify(fn))(*args)
    want = fn(*dense)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, **quax.testing.tolerance(w.dtype))


@pytest.fixture(scope="session")
def jit_matches_dense():
    """The function `jit_matches_dense(fn, *args)` (asserts; returns nothing)."""
    return _jit_matches_dense
