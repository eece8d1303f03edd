"""The conformance kit (`quax.testing`) on BCOO: values, jit, vmap in both orders,
grad and jvp with respect to the stored values, against the densified function, on
chosen programs and on random ones (`quax.testing.strategies`); and the compiled
matvec holding no array of the matrix's shape."""

import jax.numpy as jnp
import numpy as np
import pytest
import quax.testing
import quax.testing.strategies as qst
from hypothesis import given, settings
from jax import lax
from quax_sparse import BCOO, CSR
from sparse_helpers import random_sparse


PROGRAMS = {
    "matvec": (lambda a, v: a @ v, (6, 5), 5, None),
    "sparse_sum": (lambda a, v: (2.0 * a - jnp.sin(a)).sum(0) + v, (6, 5), 5, None),
    "batched": (
        lambda a, v: lax.dot_general(a, v, (((2,), (1,)), ((0,), (0,)))),
        (3, 4, 5),
        (3, 5),
        1,
    ),
    "sparse_out": (lambda a, v: jnp.tanh(a * v).T, (6, 5), (6, 5), None),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_kit_against_dense(name):
    fn, shape, other, n_batch = PROGRAMS[name]
    rng = np.random.default_rng(0)
    _, a = random_sparse(rng, shape, 0.4, n_batch=n_batch or 0)
    v = jnp.asarray(rng.normal(size=other), jnp.float32)
    report = quax.testing.assert_matches_dense(fn, a, v)
    assert set(report.checks.values()) == {"passed"}, str(report)


@pytest.mark.parametrize("name", ["matvec", "sparse_out"])
def test_kit_against_dense_csr(name):
    # Duplicated columns within a row, out of order: nonlinear functions must see
    # their sum.
    fn, shape, other, _ = PROGRAMS[name]
    rng = np.random.default_rng(1)
    _, a = random_sparse(rng, shape, 0.4)
    doubled = BCOO(
        jnp.concatenate([a.data / 2, a.data / 2]),
        jnp.concatenate([a.indices, a.indices]),
        a.shape,
    )
    c = CSR.from_bcoo(doubled)
    v = jnp.asarray(rng.normal(size=other), jnp.float32)
    report = quax.testing.assert_matches_dense(fn, c, v)
    # A stacked batch of CSRs is a batched CSR, so both vmap orders ran.
    assert set(report.checks.values()) == {"passed"}, str(report)


def test_kit_hlo_check_on_the_matvec():
    n = 263  # no other array of the program has this size
    a = BCOO.fromdense(np.eye(n, dtype=np.float32), nse=n)
    quax.testing.assert_hlo_lacks(lambda a, v: a @ v, a, jnp.ones(n), shapes=[(n, n)])


# The operations of `quax.testing.strategies.programs` that keep a sparse operand
# sparse or make it dense by a rule (`square` is sparse * sparse: the intersection).
# Not `scan` (its carry `carry * 0.5 + row` grows its `nse` every step: a `JoinError`),
# nor `cond` (the kit's `quaxify(vmap)` check batches the predicate, and JAX turns
# the `cond` into a `select_n` of two sparse arrays, which has no sparse rule: the
# union of two patterns; `cond` itself is tested in test_rules.py and
# test_joins.py).
SPARSE_OPS = (
    "neg",
    "square",
    "scale",
    "sin",
    "tanh",
    "add_const",
    "matmul",
    "sum",
    "transpose",
    "reshape",
    "while_loop",
)


@settings(max_examples=6, deadline=None)
@given(
    program=qst.programs(in_shapes=qst.shapes(2, 2, 1, 5), ops=SPARSE_OPS, max_ops=3),
    data=qst.data(),
)
def test_random_programs_against_dense(program, data):
    values = np.asarray(data.draw(qst.arrays(program.in_shape, program.dtype)))
    keep = np.asarray(data.draw(qst.arrays(program.in_shape, jnp.bool_)), dtype=bool)
    dense = np.where(keep, values, 0)
    a = BCOO.fromdense(dense, nse=int(np.count_nonzero(dense)) + 1)  # one padding
    report = quax.testing.assert_matches_dense(program, a, grad=program.reverse_mode)
    checks = report.checks.values()
    assert all(c == "passed" or c.startswith("skipped") for c in checks), str(report)
