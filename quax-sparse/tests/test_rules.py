"""Elementwise, arithmetic and structural rules against the dense computation (the
products: `test_dot_general.py`; the refusals: `test_materialisation.py`)."""

from functools import partial
from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from hypothesis import given, settings
from jax import lax
from jax.extend.core import Primitive
from quax_sparse import BCOO, SparseMaterialisationError, fromdense
from sparse_helpers import assert_close, check, random_sparse


def _duplicated(x: BCOO) -> BCOO:
    """`x` with every entry split in two halves stored at the same position."""
    return BCOO(
        jnp.concatenate([x.data / 2, x.data / 2], -1),
        jnp.concatenate([x.indices, x.indices], -2),
        x.shape,
    )


ELEMENTWISE = [
    jnp.sin,
    jnp.tanh,
    jnp.abs,
    lambda x: jnp.sqrt(jnp.abs(x)),
    lambda x: x**3,
    jnp.square,
    jnp.expm1,
    jnp.log1p,
    jnp.sign,
    lambda x: -x,
    lambda x: x.astype(jnp.int32),
    lambda x: x.astype(jnp.float16),
]


@pytest.mark.parametrize("fn", ELEMENTWISE)
def test_elementwise_with_zero_at_zero(fn):
    rng = np.random.default_rng(0)
    dense, x = random_sparse(rng, (5, 4), 0.4)
    dense = np.abs(dense) * 0.5  # in the domain of log1p
    x = BCOO(jnp.abs(x.data) * 0.5, x.indices, x.shape)
    # Duplicated entries: a nonlinear function must see their sum.
    out = check(fn, _duplicated(x), dense_args=(dense,))
    assert isinstance(out, BCOO)


def _through_lax(primitive: Primitive) -> tuple[Any, str]:
    """The `lax` function that binds `primitive`, and a dtype it takes."""
    if primitive is lax.reduce_precision_p:
        return partial(lax.reduce_precision, exponent_bits=5, mantissa_bits=2), "f32"
    if primitive.name in ("conj", "real", "imag"):
        return getattr(lax, primitive.name), "c64"
    if primitive is lax.population_count_p:
        return lax.population_count, "i32"
    return getattr(lax, primitive.name), "f32"


def test_every_zero_preserving_primitive_stays_sparse():
    rng = np.random.default_rng(7)
    dense, x = random_sparse(rng, (4, 5), 0.4)
    # In every domain (asin, atanh, sqrt, ...); the same map on both sides.
    scales = {
        "f32": (0.4, np.float32),
        "c64": (0.4 - 0.2j, np.complex64),
        "i32": (100, np.int32),
    }
    denses = {k: (np.abs(dense) * s).astype(t) for k, (s, t) in scales.items()}
    # Unique entries, so flagged: no merging (tested above) in this large program.
    xs = {
        k: BCOO(
            (jnp.abs(x.data) * s).astype(t), x.indices, x.shape, unique_indices=True
        )
        for k, (s, t) in scales.items()
    }
    calls = {p.name: _through_lax(p) for p in quax.ZERO_PRESERVING}

    def f(xs):
        return {name: fn(xs[k]) for name, (fn, k) in calls.items()}

    out = check(f, xs, dense_args=(denses,))
    assert sorted(out) == sorted(p.name for p in quax.ZERO_PRESERVING)
    for name, value in out.items():
        assert isinstance(value, BCOO), name


def test_elementwise_flags_stay_true():
    # Unique but not sorted: a nonlinear function keeps the entries in place.
    x = BCOO(
        jnp.array([1.0, 2.0, 3.0]),
        jnp.array([[2, 0], [0, 1], [1, 1]]),
        (3, 2),
        unique_indices=True,
    )
    out = quax.quaxify(jnp.sin)(x)
    assert out.unique_indices and not out.indices_sorted
    assert_close(out, np.sin([[0.0, 2.0], [0.0, 3.0], [1.0, 0.0]]))
    # Duplicates: merged (sorted, unique) first.
    out = quax.quaxify(jnp.sin)(_duplicated(x))
    assert out.unique_indices and out.indices_sorted
    assert_close(out, np.sin([[0.0, 2.0], [0.0, 3.0], [1.0, 0.0]]))


@settings(max_examples=4, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    n_batch=st.integers(0, 2),
    density=st.sampled_from([0.0, 0.4, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_arithmetic_and_reductions(shape, n_batch, density, seed):
    rng = np.random.default_rng(seed)
    n_batch = min(n_batch, len(shape))
    dx, x = random_sparse(rng, shape, density, n_batch=n_batch)
    dy, y = random_sparse(rng, shape, density)
    d = rng.normal(size=shape).astype(np.float32)
    axes = tuple(i for i in range(len(shape)) if rng.random() < 0.5)
    perm = tuple(rng.permutation(len(shape)))

    def f(x, y, d):
        return {
            "add": x + y,
            "sub": x - y,
            "add_dense": x + d,
            "dense_sub": d - x,
            "sub_dense": x - d,
            "mul": x * d,
            "rmul": 2.5 * x,
            "div": x / 4.0,
            "sum_axes": x.sum(axes),
            "sum_all": x.sum(),
            "transpose": jnp.transpose(x, perm),
        }

    out = check(f, x, y, d, dense_args=(dx, dy, d))
    for key in ("add", "sub", "mul", "rmul", "div", "transpose"):
        assert isinstance(out[key], BCOO), key


def test_axes_of_size_one_broadcast():
    # `lax` broadcasts an axis of size 1 against a longer one (`x * v` with `v` of
    # shape (5,) binds `mul` with a (1, 5) operand): read along the other axes only.
    rng = np.random.default_rng(8)
    dense, x = random_sparse(rng, (6, 5), 0.4)
    row = rng.normal(size=5).astype(np.float32)
    col = rng.normal(size=(6, 1)).astype(np.float32)

    def f(x, row, col):
        return {
            "mul_row": x * row,
            "rmul_col": col * x,
            "div_row": x / row,
            "mul_corner": x * col[:1, :1],
            "add_row": x + row,
            "row_sub": row - x,
            "sub_col": x - col,
        }

    out = check(f, x, row, col, dense_args=(dense, row, col))
    for key in ("mul_row", "rmul_col", "div_row", "mul_corner"):
        assert isinstance(out[key], BCOO), key
    # A sparse operand is never stretched: refused, naming the primitive.
    _, one_row = random_sparse(rng, (1, 5), 0.6)
    refused = {
        "mul": lambda x, r: r * jnp.ones((6, 5)),
        "add": lambda x, r: x + r,
        "sub": lambda x, r: jnp.ones((6, 5)) - r,
    }
    for primitive, fn in refused.items():
        with pytest.raises(SparseMaterialisationError, match=f"`{primitive}`"):
            quax.quaxify(fn)(x, one_row)
    allowed = (x.enable_materialise(), one_row.enable_materialise())
    got = quax.quaxify(refused["add"])(*allowed)
    assert_close(got, dense + np.asarray(one_row.todense()))


def test_reduce_sum_is_dense_when_smaller():
    rng = np.random.default_rng(1)
    dense, x = random_sparse(rng, (4, 50), 0.5)
    rows = check(lambda x: x.sum(1), x, dense_args=(dense,))
    assert not isinstance(rows, BCOO)  # 4 sums from ~100 entries
    dense, x = random_sparse(rng, (40, 50), 0.01)
    rows = check(lambda x: x.sum(1), x, dense_args=(dense,))
    assert isinstance(rows, BCOO)  # 40 sums from ~20 entries


@settings(max_examples=4, deadline=None)
@given(
    shape=st.sampled_from([(4, 6), (2, 3, 4), (6,)]),
    n_batch=st.integers(0, 1),
    seed=st.integers(0, 2**16),
)
def test_structure(shape, n_batch, seed):
    rng = np.random.default_rng(seed)
    dense, x = random_sparse(rng, shape, 0.4, n_batch=n_batch)
    size = int(np.prod(shape))
    i = int(rng.integers(0, shape[0]))

    def f(x, i):
        return {
            "reshape": x.reshape(-1),
            "reshape2": x.reshape(2, size // 2),
            "expand": x[None],
            "newaxis": jnp.expand_dims(x, 1),
            "rows": x[1:3],
            "strided": x[::2],
            "row": x[i],
            "static_row": x[0],
            "rev": jnp.flip(x, 0),
            "squeeze": jnp.squeeze(x[None], 0),
        }

    out = check(f, x, i, dense_args=(dense, i))
    for key, value in out.items():
        # An element of a vector (`x[i]` of shape `(6,)`) is its dense scalar.
        scalar = len(shape) == 1 and key in ("row", "static_row")
        assert isinstance(value, jax.Array if scalar else BCOO), key


def test_concatenate_sparse_arrays():
    rng = np.random.default_rng(6)
    da, a = random_sparse(rng, (3, 4), 0.5, extra_nse=2)
    db, b = random_sparse(rng, (2, 3, 4), 0.5, n_batch=1)

    def f(a, b):
        return {
            "rows": jnp.concatenate([a, b[0], a], axis=0),
            "cols": jnp.concatenate([a, b[1]], axis=1),
            "batched": jnp.concatenate([b, a[None]], axis=0),
        }

    out = check(f, a, b, dense_args=(da, db))
    assert all(isinstance(v, BCOO) for v in out.values())
    with pytest.raises(SparseMaterialisationError, match="`concatenate`"):
        quax.quaxify(lambda a: jnp.concatenate([a, jnp.ones((1, 4))]))(a)


def test_broadcast_leading_batch_dimensions():
    rng = np.random.default_rng(2)
    dense, x = random_sparse(rng, (3, 4), 0.5)
    out = check(lambda x: jnp.broadcast_to(x, (2, 3, 4)), x, dense_args=(dense,))
    assert isinstance(out, BCOO) and out.n_batch == 1


def test_cond_and_loop_carries():
    rng = np.random.default_rng(9)
    dense, x = random_sparse(rng, (4, 5), 0.4)

    def branches(a, s):  # a sparse output of the same structure from both branches
        return lax.cond(s > 0, lambda: 2 * a, lambda: -a)

    for s in (1.0, -1.0):
        out = check(branches, x, s, dense_args=(dense, s))
        assert isinstance(out, BCOO)


def test_index_dtype_and_empty():
    x = fromdense(np.zeros((3, 3), np.float32), nse=0)
    assert x.nse == 0
    v = jnp.ones(3)
    assert_close(quax.quaxify(lambda a, v: a @ v)(x, v), np.zeros(3))
    assert_close(quax.quaxify(lambda a, b: a @ b)(x, x), np.zeros((3, 3)))
    assert_close(x.sum_duplicates(), np.zeros((3, 3)))


def test_lax_dot_general_preferred_element_type():
    rng = np.random.default_rng(5)
    dense, x = random_sparse(rng, (4, 3), 0.5)
    v = rng.normal(size=3).astype(np.float32)

    def f(a, v):
        return lax.dot_general(
            a, v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )

    out = check(f, x, v, dense_args=(dense, v))
    assert out.dtype == jnp.float32


def test_rule_outputs_keep_padding_at_the_size():
    # Padding moved by a rule stays padding when the entries are read again (by the
    # constructor, or by jax.experimental.sparse): reversing a padding index must
    # not make it -1 (the last position), nor concatenating it.
    x = BCOO(jnp.array([1.0, 9.0]), jnp.array([[0, 1], [2, 2]]), (2, 2))
    dense = np.array([[0.0, 1.0], [0.0, 0.0]])
    flip = quax.quaxify(lambda a: a[::-1, ::-1])(x)
    cat = quax.quaxify(lambda a: jnp.concatenate([a, a], axis=1))(x)
    for got, want in [
        (flip, dense[::-1, ::-1]),
        (cat, np.concatenate([dense, dense], 1)),
    ]:
        np.testing.assert_array_equal(
            BCOO(got.data, got.indices, got.shape).todense(), want
        )
        np.testing.assert_array_equal(got.to_jax().todense(), want)
