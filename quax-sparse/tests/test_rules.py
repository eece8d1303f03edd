"""Elementwise, arithmetic and structural rules against the dense computation, and
the refusals."""

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
from jax.experimental import sparse as jsparse
from jax.extend.core import Primitive
from quax_sparse import BCOO, CSR, MaterialisationError, fromdense
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
        with pytest.raises(MaterialisationError, match=f"`{primitive}`"):
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
        assert isinstance(value, BCOO), key


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
    with pytest.raises(MaterialisationError, match="`concatenate`"):
        quax.quaxify(lambda a: jnp.concatenate([a, jnp.ones((1, 4))]))(a)


def test_broadcast_leading_batch_dimensions():
    rng = np.random.default_rng(2)
    dense, x = random_sparse(rng, (3, 4), 0.5)
    out = check(lambda x: jnp.broadcast_to(x, (2, 3, 4)), x, dense_args=(dense,))
    assert isinstance(out, BCOO) and out.n_batch == 1


@pytest.mark.parametrize(
    ("fn", "primitive"),
    [
        (jnp.exp, "exp"),
        (jnp.cos, "cos"),
        (lambda x: x + 1.0, None),
        (lambda x: x**0, "integer_pow"),
        (lambda x: 1.0 / x, "div"),
        (lambda x: x * x, "mul"),
        (lambda x: jnp.max(x), "reduce_max"),
        (lambda x: jnp.cumsum(x, 0), "cumsum"),
        (lambda x: jnp.broadcast_to(x[:, :1], (4, 6)), "broadcast_in_dim"),
    ],
)
def test_refusals_name_the_primitive(fn, primitive):
    rng = np.random.default_rng(3)
    dense, x = random_sparse(rng, (4, 6), 0.3)
    if primitive is None:  # sparse + dense is dense, at the dense operand's cost
        assert_close(quax.quaxify(fn)(x), fn(dense))
        return
    with pytest.raises(
        MaterialisationError, match=f"Refusing to materialise.*`{primitive}`"
    ):
        quax.quaxify(fn)(x)
    with pytest.raises(RuntimeError, match="allow_materialise=True"):
        jax.jit(quax.quaxify(fn))(x)
    # Allowed: the dense computation.
    with quax.track_materialisation() as report:
        out = quax.quaxify(fn)(x.enable_materialise())
    assert report
    assert_close(out, fn(jnp.asarray(dense)))


def test_csr_refusal_and_ops():
    rng = np.random.default_rng(4)
    dense, x = random_sparse(rng, (5, 5), 0.4)
    c = CSR.from_bcoo(x)
    with pytest.raises(MaterialisationError, match="`exp`"):
        quax.quaxify(jnp.exp)(c)
    out = check(lambda c, x: (jnp.sin(c) + 2 * x).T, c, x, dense_args=(dense, dense))
    assert isinstance(out, BCOO)


def test_large_matrix_is_never_densified():
    n = 10**6  # a dense f32 matrix would need 4 TB
    idx = jnp.stack([jnp.arange(n), jnp.arange(n)], -1)
    x = BCOO(jnp.full(n, 2.0), idx, (n, n))
    v = jnp.ones(n)
    out = jax.jit(quax.quaxify(lambda a, v: jnp.tanh(2 * a).T @ v + a.sum(0)))(x, v)
    assert out.shape == (n,)
    np.testing.assert_allclose(out[:3], np.tanh(4.0) + 2.0, rtol=1e-6)
    with pytest.raises(
        MaterialisationError, match=r"`exp`.*shape \(1000000, 1000000\)"
    ):
        jax.eval_shape(quax.quaxify(jnp.exp), x)
    # Its row-major positions would overflow int32: `reshape` is refused.
    with pytest.raises(MaterialisationError, match="`reshape`"):
        jax.eval_shape(quax.quaxify(lambda a: a.reshape(-1)), x)


def test_cond_and_loop_carries():
    rng = np.random.default_rng(9)
    dense, x = random_sparse(rng, (4, 5), 0.4)

    def branches(a, s):  # a sparse output of the same structure from both branches
        return lax.cond(s > 0, lambda: 2 * a, lambda: -a)

    for s in (1.0, -1.0):
        out = check(branches, x, s, dense_args=(dense, s))
        assert isinstance(out, BCOO)
    # Outputs whose flags differ join, and a different `nse` is a `JoinError`:
    # see test_joins.py.


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


# Bool masks -------------------------------------------------------------------------

EYE = np.eye(3, dtype=bool)
# A bool mask with position (0, 0) stored twice: bool entries add up as JAX adds
# bools (logical or), so the dense mask is `[[T, F, F], [F, F, F], [F, F, T]]`.
MASK = np.array([[True, False, False], [False, False, False], [False, False, True]])


def _bool_masks() -> dict[str, tuple[BCOO, np.ndarray]]:
    twice = BCOO(
        jnp.array([True, True, True, False]),
        jnp.array([[0, 0], [0, 0], [2, 2], [1, 1]]),
        (3, 3),
    )
    return {
        "eye": (BCOO.fromdense(jnp.eye(3, dtype=bool), nse=3), EYE),
        "padded": (BCOO.fromdense(jnp.eye(3, dtype=bool), nse=5), EYE),
        "twice": (twice, MASK),
    }


@pytest.mark.parametrize("name", ["eye", "padded", "twice"])
def test_bool_mask_todense(name):
    m, want = _bool_masks()[name]
    assert m.dtype == jnp.bool_
    for got in (m.todense(), jax.jit(lambda m: m.todense())(m)):
        assert got.dtype == jnp.bool_
        np.testing.assert_array_equal(got, want)
    merged = m.sum_duplicates()
    assert merged.dtype == jnp.bool_
    np.testing.assert_array_equal(merged.todense(), want)


@pytest.mark.parametrize("name", ["eye", "padded", "twice"])
def test_bool_mask_operations_against_dense(name):
    m, want = _bool_masks()[name]
    v = np.array([1.0, 10.0, 100.0], np.float32)
    w = np.array([True, False, True])
    x = np.arange(9.0, dtype=np.float32).reshape(3, 3) + 1
    # Each reference is the same function on the dense bool mask, in plain JAX.
    for fn in [
        lambda a, v, w, x: a @ v,
        lambda a, v, w, x: a @ w,
        lambda a, v, w, x: a.astype(jnp.float32).sum(),
        lambda a, v, w, x: (a * x).sum(0),
        lambda a, v, w, x: a.sum(),
    ]:
        got = jax.jit(quax.quaxify(fn))(m, v, w, x)
        np.testing.assert_array_equal(got, fn(jnp.asarray(want), v, w, x))
    mul = jax.jit(quax.quaxify(lambda a, w: a * w))(m, w)
    assert isinstance(mul, BCOO) and mul.dtype == jnp.bool_
    np.testing.assert_array_equal(mul.todense(), want * w)
    as_float = jax.jit(quax.quaxify(lambda a: a.astype(jnp.float32)))(m)
    np.testing.assert_array_equal(as_float.todense(), want.astype(np.float32))


def test_bool_mask_matmul_as_jax_experimental_sparse():
    # jsparse stores a bool `fromdense` as int32 entries; its products agree.
    m, _ = _bool_masks()["padded"]
    j = jsparse.BCOO.fromdense(jnp.eye(3, dtype=bool), nse=5)
    v = jnp.array([1.0, 10.0, 100.0])
    np.testing.assert_array_equal(quax.quaxify(lambda a, v: a @ v)(m, v), j @ v)


def test_bool_mask_in_where():
    # `jnp.where(mask, x, 0)` with a sparse mask has no sparse rule yet: refused,
    # naming `select_n` and the way out; allowed, it is the dense `where`.
    m, want = _bool_masks()["twice"]
    x = np.arange(9.0, dtype=np.float32).reshape(3, 3) + 1
    where = quax.quaxify(lambda m, x: jnp.where(m, x, 0.0))
    with pytest.raises(MaterialisationError, match=r"select_n.*allow_materialise"):
        where(m, x)
    np.testing.assert_array_equal(
        where(m.enable_materialise(), x), np.where(want, x, 0.0)
    )


def test_broadcasting_a_sparse_operand_is_refused_with_the_way_out():
    # The published quax's own tests add a (2, 5, 1, 4) BCOO to a (3, 2, 5, 1, 4)
    # dense array and BCOO; quax-sparse refuses to stretch a sparse operand, and the
    # refusal says how to get the sum.
    rng = np.random.default_rng(0)
    dense, x = random_sparse(rng, (2, 5, 1, 4), 0.4, n_batch=1)
    dense3, x3 = random_sparse(rng, (3, 2, 5, 1, 4), 0.4, n_batch=2)
    y = rng.normal(size=(3, 2, 5, 1, 4)).astype(np.float32)
    add = quax.quaxify(lambda a, b: a + b)
    way_out = r"jnp\.broadcast_to\(x, \(3, 2, 5, 1, 4\)\)` keeps a sparse `x` sparse"
    for other in (y, x3):
        with pytest.raises(MaterialisationError, match=r"primitive `add`.*" + way_out):
            add(x, other)
        with pytest.raises(MaterialisationError, match=way_out):
            add(other, x)
    # The way out: broadcast explicitly (sparse, new leading axes), then add.
    add_broadcast = jax.jit(quax.quaxify(lambda a, b: jnp.broadcast_to(a, b.shape) + b))
    assert_close(add_broadcast(x, y), dense + y)
    both = add_broadcast(x, x3)
    assert isinstance(both, BCOO)
    assert_close(both, dense + dense3)
    # Or allow materialising: the dense sum.
    assert_close(add(x.enable_materialise(), y), dense + y)
    # Stretching an axis of size 1 in place is refused the same way, in `mul` too.
    _, row = random_sparse(rng, (1, 4), 0.5)
    stretched = r"`mul`.*shape \(1, 4\) to \(5, 4\)"
    with pytest.raises(MaterialisationError, match=stretched):
        quax.quaxify(lambda a, b: a * b)(row, np.ones((5, 4), np.float32))
