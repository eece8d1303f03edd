"""The conformance kit (`quax.testing`) on BCOO: values, jit, vmap in both orders,
grad and jvp with respect to the stored values, against the densified function, on
chosen programs and on random ones (`quax.testing.strategies`); and the compiled
matvec holding no array of the matrix's shape."""

import jax.numpy as jnp
import numpy as np
import pytest
import quax.testing
import quax.testing.strategies as qst
from hypothesis import HealthCheck, given, settings, strategies as st
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


# The day-one rules and the direct solve, each in the kit (values, jit, vmap in
# both orders, grad and jvp with respect to every floating-point leaf, the stored
# values included) on random patterns: the intersection `a * b`, the union `a + b`
# and `a - b`, `where` against zeros, the row gather `a[idx]`, and
# `jnp.linalg.solve` (SuperLU on the host). Not `vmap` for the gather: the kit's
# `quaxify(vmap)` hands its rule a batched matrix, which it refuses (the row gather
# takes one matrix); the solve takes it, as a batch of matrices.
def _intersection(a, b):
    return a * b


def _union(a, b):
    return (a - 2.0 * b).sum(0)


def _where(a, mask):
    return jnp.where(mask, a, 0.0) @ jnp.arange(a.shape[1], dtype=a.dtype)


def _gather(a, idx):
    return jnp.tanh(a[idx])


def _solve(a, v):
    return jnp.linalg.solve(a, v)


RULES = {
    "intersection": _intersection,
    "union": _union,
    "where": _where,
    "gather": _gather,
    "solve": _solve,
}


def _sparse_of(dense):
    return BCOO.fromdense(dense, nse=int(np.count_nonzero(dense)) + 1)


@pytest.mark.parametrize("name", sorted(RULES))
# Each draw builds device arrays: on a TPU v5e (2026-12-07) the gather's first
# example's second draw took 35 s, the backend's first compiles, which hypothesis's
# check of input generation took for a slow strategy (`FailedHealthCheck`). The
# draws themselves are small.
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=qst.shapes(2, 2, 2, 5), data=qst.data())
def test_day_one_rules_and_solves_in_the_kit(name, shape, data):
    n = shape[0]
    if name == "solve":
        shape = (n, n)

    def draw(shape, dtype=jnp.float32):  # finite, in [-4, 4]
        return np.asarray(data.draw(qst.arrays(shape, dtype)))

    dense = np.where(draw(shape, jnp.bool_), draw(shape), 0).astype(np.float32)
    if name == "solve":  # well conditioned: diagonally dominant
        dense = dense + np.diag(np.abs(dense).sum(1) + 1).astype(np.float32)
    a = _sparse_of(dense)
    if name in ("intersection", "union"):
        second = _sparse_of(np.where(draw(shape, jnp.bool_), draw(shape), 0))
    elif name == "where":
        second = jnp.asarray(draw(shape, jnp.bool_))
    elif name == "gather":  # rows, repeated and in any order
        size = data.draw(st.integers(1, 6))
        second = jnp.asarray(draw((size,), jnp.int32) % n)
    else:
        second = jnp.asarray(draw((n,)))
    report = quax.testing.assert_matches_dense(
        RULES[name], a, second, vmap=name != "gather"
    )
    checks = report.checks.values()
    assert all(c == "passed" or c.startswith("skipped") for c in checks), str(report)
    assert any(c == "passed" for c in checks), str(report)
