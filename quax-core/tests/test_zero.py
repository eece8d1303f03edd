"""Symbolic zeros: each rule against the dense computation; outputs stay `Zero`s."""

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
import quax
import quax.zero
from hypothesis import given, settings
from jax import lax
from quax.zero import Zero


def _is_zero(x: Any) -> bool:
    return isinstance(x, Zero)


def _dense(tree: Any) -> Any:
    return jtu.tree_map(
        lambda v: v.materialise() if _is_zero(v) else v, tree, is_leaf=_is_zero
    )


def _assert_matches(out: Any, expected: Any) -> None:
    out_leaves, out_tree = jtu.tree_flatten(_dense(out))
    exp_leaves, exp_tree = jtu.tree_flatten(expected)
    assert out_tree == exp_tree
    for o, e in zip(out_leaves, exp_leaves, strict=True):
        assert jnp.shape(o) == jnp.shape(e)
        assert jnp.result_type(o) == jnp.result_type(e)
        np.testing.assert_allclose(np.asarray(o), np.asarray(e), rtol=1e-6)


def _check(fn: Callable[..., Any], *args: Any, zero: bool) -> Any:
    """`quaxify(fn)` on `args` equals `fn` on their dense versions; every output is
    a `Zero` when `zero`, none when not."""
    out = quax.quaxify(fn)(*args)
    _assert_matches(out, fn(*_dense(args)))
    flags = [_is_zero(o) for o in jtu.tree_leaves(out, is_leaf=_is_zero)]
    assert flags and all(f == zero for f in flags), flags
    return out


F32 = jnp.float32
x3 = jnp.array([1.0, -2.0, 3.0])
xp3 = jnp.array([1.0, 2.0, 3.0])  # one sign: a zero times it has one sign too
m23 = jnp.arange(6.0).reshape(2, 3)
z3 = Zero((3,), F32)
z23 = Zero((2, 3), F32)
z32 = Zero((3, 2), F32)

# (name, function, arguments, whether the result stays a Zero)
CASES: list[tuple[str, Callable[..., Any], tuple[Any, ...], bool]] = [
    ("add_zero_array", jnp.add, (z3, x3), False),
    ("add_array_zero", jnp.add, (x3, z3), False),
    ("add_zeros", jnp.add, (z3, z3), True),
    ("add_broadcast", jnp.add, (Zero((2, 3), F32), x3), False),
    ("add_promote", jnp.add, (Zero((3,), jnp.int32), x3), False),
    ("add_scalar_zero", jnp.add, (Zero((), F32), m23), False),
    ("add_int_zero_float", jnp.add, (jnp.arange(3), Zero((3,), F32)), False),
    ("sub_array_zero", jnp.subtract, (x3, z3), False),
    ("sub_zero_array", jnp.subtract, (z3, x3), False),
    ("sub_zeros", jnp.subtract, (z3, z3), True),
    # `0 * [1, -2, 3]` is `[0, -0, 0]`: signs that differ are computed densely.
    ("mul_zero_mixed_signs", jnp.multiply, (z3, x3), False),
    ("mul_zero_array", jnp.multiply, (z3, xp3), True),
    ("mul_zero_negative_array", jnp.multiply, (z3, -xp3), True),
    ("mul_array_zero", jnp.multiply, (m23, Zero((3,), F32)), True),
    ("mul_promote", jnp.multiply, (Zero((3,), jnp.int32), xp3), True),
    ("mul_zeros", jnp.multiply, (z3, z3), True),
    ("div_zero_array", jnp.divide, (z3, xp3), True),
    ("div_zero_mixed_signs", jnp.divide, (z3, x3), False),
    (
        "div_int_zero_known_nonzero",
        lambda z: lax.div(z, jnp.array([1, 2, 3])),
        (Zero((3,), jnp.int32),),
        True,
    ),
    (
        "div_int_zero_by_zero",
        lambda z, y: lax.div(z, y),
        (Zero((3,), jnp.int32), jnp.array([0, 1, 0])),
        False,
    ),
    ("div_array_zero", jnp.divide, (x3, z3), False),
    ("neg", jnp.negative, (z3,), True),
    (
        "abs_sin_tanh_sqrt",
        lambda z: jnp.sqrt(jnp.abs(jnp.tanh(jnp.sin(z)))),
        (z3,),
        True,
    ),
    ("exp_materialises", jnp.exp, (z3,), False),
    ("matmul_zero_left", jnp.matmul, (z23, jnp.ones((3, 4))), True),
    ("matmul_zero_right", jnp.matmul, (m23, z32), True),
    (
        "dot_general_batch",
        lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
        (Zero((2, 3, 4), F32), jnp.ones((2, 4, 5))),
        True,
    ),
    ("dot_int_float", jnp.dot, (Zero((3,), jnp.int32), x3), True),
    ("broadcast_to", lambda z: jnp.broadcast_to(z, (4, 3)), (z3,), True),
    ("broadcast_in_dim", lambda z: lax.broadcast_in_dim(z, (3, 2), (0,)), (z3,), True),
    ("reshape", lambda z: z.reshape(3, 2), (z23,), True),
    ("transpose", lambda z: z.T, (z23,), True),
    ("squeeze", jnp.squeeze, (Zero((1, 3, 1), F32),), True),
    ("expand_dims", lambda z: jnp.expand_dims(z, (0, 2)), (z3,), True),
    ("rev", lambda z: jnp.flip(z, 1), (z23,), True),
    ("slice", lambda z: z[:, 1:], (z23,), True),
    ("strided_slice", lambda z: lax.slice(z, (0, 0), (2, 3), (1, 2)), (z23,), True),
    (
        "dynamic_slice",
        lambda z, i: lax.dynamic_slice(z, (i, 0), (1, 2)),
        (z23, 1),
        True,
    ),
    (
        "dynamic_update_slice",
        lambda z, u: lax.dynamic_update_slice(z, u, (0, 1)),
        (z23, Zero((1, 2), F32)),
        True,
    ),
    (
        "dynamic_update_slice_dense",
        lambda z, u: lax.dynamic_update_slice(z, u, (0, 1)),
        (z23, jnp.ones((1, 2))),
        False,
    ),
    ("gather", lambda z: z[jnp.array([2, 0])], (z3,), True),
    ("gather_fill_nan", lambda z: z.at[jnp.array([5])].get(mode="fill"), (z3,), False),
    (
        "gather_fill_zero",
        lambda z: z.at[jnp.array([5])].get(mode="fill", fill_value=0),
        (z3,),
        True,
    ),
    (
        "scatter_add_zero_update",
        lambda x, u: x.at[jnp.array([0, 2])].add(u),
        (x3, Zero((2,), F32)),
        False,
    ),
    (
        "scatter_add_zeros",
        lambda x, u: x.at[jnp.array([0, 2])].add(u),
        (z3, Zero((2,), F32)),
        True,
    ),
    ("convert_element_type", lambda z: z.astype(jnp.int32), (z3,), True),
    ("convert_to_bool", lambda z: lax.convert_element_type(z, jnp.bool_), (z3,), True),
    ("bitcast", lambda z: lax.bitcast_convert_type(z, jnp.int32), (z3,), True),
    (
        "real_imag",
        lambda z: (jnp.real(z), jnp.imag(z), jnp.conj(z)),
        (Zero((3,), jnp.complex64),),
        True,
    ),
    ("complex", lax.complex, (z3, z3), True),
    ("sum", jnp.sum, (z23,), True),
    ("sum_axis", lambda z: jnp.sum(z, axis=0), (z23,), True),
    ("mean", jnp.mean, (z23,), True),
    (
        "max_min_prod",
        lambda z: (jnp.max(z, 1), jnp.min(z, 0), jnp.prod(z, 1)),
        (z23,),
        True,
    ),
    ("max_empty_axis", lambda z: lax.reduce_max(z, (1,)), (Zero((2, 0), F32),), False),
    ("prod_empty_axis", lambda z: jnp.prod(z, axis=1), (Zero((2, 0), F32),), False),
    ("argmax", lambda z: (jnp.argmax(z, 1), jnp.argmin(z, 0)), (z23,), True),
    (
        "any_all",
        lambda z: (jnp.any(z, 1), jnp.all(z, 1)),
        (Zero((2, 3), jnp.bool_),),
        True,
    ),
    ("cumsum", lambda z: (jnp.cumsum(z, 1), jnp.cumprod(z, 0)), (z23,), True),
    ("cummax", lambda z: (lax.cummax(z, 1), lax.cummin(z, 0)), (z23,), True),
    (
        "concatenate",
        lambda a, b: jnp.concatenate([a, b], 1),
        (z23, Zero((2, 1), F32)),
        True,
    ),
    (
        "concatenate_mixed",
        lambda a, b: jnp.concatenate([a, b], 1),
        (z23, jnp.ones((2, 1))),
        False,
    ),
    ("split", lambda z: jnp.split(z, [1, 2], axis=1), (z23,), True),
    ("stack", lambda a, b: jnp.stack([a, b], 1), (z23, z23), True),
    ("stack_mixed", lambda a, b: jnp.stack([a, b]), (z23, jnp.ones((2, 3))), False),
    ("unstack", lambda z: lax.unstack(z, axis=1), (z23,), True),
    ("select_n", lambda p, a, b: jnp.where(p, a, b), (x3 > 0, z3, z3), True),
    ("select_n_mixed", lambda p, a, b: jnp.where(p, a, b), (x3 > 0, z3, x3), False),
    ("integer_pow", lambda z: (z**2, z**3), (z3,), True),
    ("integer_pow_zero", lambda z: lax.integer_pow(z, 0), (z3,), False),
    ("square", jnp.square, (z3,), True),
    ("pad_zero", lambda z: lax.pad(z, jnp.float32(0), [(1, 2, 1)]), (z3,), True),
    ("pad_nonzero", lambda z: lax.pad(z, jnp.float32(1), [(1, 2, 1)]), (z3,), False),
    ("copy", jnp.copy, (z3,), True),
    ("stop_gradient", lax.stop_gradient, (z3,), True),
    ("max_zeros", jnp.maximum, (z3, z3), True),
    ("max_mixed", jnp.maximum, (z3, x3), False),
    (
        "and_or_xor",
        lambda z, b: (z & b, z | b, z ^ b),
        (Zero((3,), jnp.int32), jnp.array([1, 2, 3])),
        None,
    ),
    (
        "shift_zero",
        lambda z, b: (z << b, z >> b),
        (Zero((3,), jnp.int32), jnp.array([1, 2, 3])),
        True,
    ),
    (
        "add_jaxvals",
        lambda z, x: jax.grad(lambda t: jnp.sum(t * z + t * z))(x),
        (z3, x3),
        None,
    ),
]


@pytest.mark.parametrize("name,fn,args,zero", CASES, ids=[c[0] for c in CASES])
def test_rule(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], zero: bool | None
) -> None:
    del name
    if zero is None:  # several outputs, some symbolic and some not
        out = quax.quaxify(fn)(*args)
        _assert_matches(out, fn(*_dense(args)))
    else:
        _check(fn, *args, zero=zero)


def test_and_or_xor_outputs() -> None:
    z = Zero((3,), jnp.int32)
    b = jnp.array([1, 2, 3])
    a, o, x = quax.quaxify(lambda z, b: (z & b, z | b, z ^ b))(z, b)
    assert _is_zero(a)
    assert not _is_zero(o) and not _is_zero(x)


def test_add_returns_other_operand_unchanged() -> None:
    out = quax.quaxify(jnp.add)(z3, x3)
    assert out is x3 or bool(jnp.all(out == x3))
    with quax.track_materialisation() as report:
        quax.quaxify(lambda z, x: z * x + x - z)(z3, xp3)
    assert not report


def test_zero_basics() -> None:
    z = Zero([2, 3], "float32")
    assert z.shape == (2, 3) and z.dtype == jnp.float32 and z.ndim == 2 and z.size == 6
    assert z.aval() == jax.core.ShapedArray((2, 3), jnp.float32)
    np.testing.assert_array_equal(z.materialise(), np.zeros((2, 3), np.float32))
    assert jtu.tree_leaves(z) == []
    # 64-bit dtypes are canonicalised as JAX does, without a warning.
    assert Zero((1,), jnp.float64).dtype == jnp.dtype(
        jax.dtypes.canonicalize_dtype(jnp.float64)
    )
    assert quax.zero.Zero is Zero


def test_nested_value_add() -> None:
    # Adding a zero to another value returns that value, still structured.
    from .helpers import Dense

    d = Dense(x3)
    out = quax.quaxify(jnp.add)(z3, d)
    assert isinstance(out, Dense)
    out = quax.quaxify(jnp.subtract)(z3, d)
    assert isinstance(out, Dense)
    np.testing.assert_allclose(out.array, -x3)
    out = quax.quaxify(jnp.add)(Zero((2, 3), F32), d)
    assert isinstance(out, Dense) and out.shape == (2, 3)


# Transformations ----------------------------------------------------------------------


def test_jit() -> None:
    fn = jax.jit(quax.quaxify(lambda z, x: (z * x, z + x, jnp.sum(z @ m23.T))))
    prod, total, s = fn(z3, x3)
    assert _is_zero(prod) and _is_zero(s)
    np.testing.assert_allclose(total, x3)
    # quaxify outside jit: the jitted body keeps the zero symbolic.
    out = quax.quaxify(jax.jit(lambda z, x: z * x))(z3, xp3)
    assert _is_zero(out) and out.shape == (3,)
    # Traced by the outer jit, `x` is read as positive (its sign is not known).
    out = jax.jit(quax.quaxify(lambda z, x: z * x))(z3, x3)
    assert _is_zero(out) and not out.negative


def test_vmap() -> None:
    xs = jnp.arange(12.0).reshape(4, 3)
    out = jax.vmap(quax.quaxify(lambda z, x: z * x + x), in_axes=(None, 0))(z3, xs)
    np.testing.assert_allclose(out, xs)
    out = quax.quaxify(jax.vmap(lambda z, x: jnp.dot(z, x), in_axes=(None, 0)))(z3, xs)
    assert _is_zero(out) and out.shape == (4,)


def test_grad() -> None:
    def loss(x: jax.Array) -> jax.Array:
        y = quax.quaxify(lambda z, x: z * x + jnp.sin(x) + z @ x)(z3, x)
        return jnp.sum(y)

    np.testing.assert_allclose(jax.grad(loss)(x3), jnp.cos(x3), rtol=1e-6)
    # grad inside quaxify, differentiating with respect to a zero input.
    g = quax.quaxify(jax.grad(lambda z, x: jnp.sum(z * x + z)))(Zero((3,), F32), x3)
    np.testing.assert_allclose(_dense(g), x3 + 1)


def test_jvp_zero_tangent_stays_zero() -> None:
    # `cos(xp3 / 2)` is positive, so the tangent `cos(x) * 0` has one sign.
    fn = lambda x, z: jax.jvp(jnp.sin, (x,), (z,))
    _, t = quax.quaxify(fn)(xp3 / 2, z3)
    assert _is_zero(t)
    _, t = jax.jit(quax.quaxify(fn))(x3, z3)
    assert _is_zero(t)


# IEEE strictness ----------------------------------------------------------------------


def test_annihilates_nan_by_default() -> None:
    bad = jnp.array([jnp.nan, jnp.inf, 1.0])
    out = quax.quaxify(jnp.multiply)(z3, bad)
    assert _is_zero(out)
    assert _is_zero(quax.quaxify(jnp.dot)(z3, bad))


def test_ieee_strict() -> None:
    bad = jnp.array([jnp.nan, jnp.inf, 1.0])
    with quax.zero.ieee_strict():
        assert quax.zero.is_ieee_strict()
        out = quax.quaxify(jnp.multiply)(z3, bad)
        assert not _is_zero(out)
        np.testing.assert_array_equal(np.isnan(out), [True, True, False])
        assert bool(jnp.isnan(quax.quaxify(jnp.dot)(z3, bad)))
        # Known-finite and integer operands keep the zero symbolic.
        assert _is_zero(quax.quaxify(jnp.multiply)(z3, xp3))
        assert _is_zero(
            quax.quaxify(jnp.multiply)(Zero((3,), jnp.int32), jnp.arange(3))
        )
        # Traced operands could be anything.
        out = jax.jit(quax.quaxify(jnp.multiply))(z3, x3)
        assert not _is_zero(out)
        # Division by a possible zero is computed densely.
        assert not _is_zero(quax.quaxify(jnp.divide)(z3, jnp.array([0.0, 1.0, 2.0])))
        with quax.zero.ieee_strict(False):
            assert _is_zero(quax.quaxify(jnp.multiply)(z3, bad))
    assert not quax.zero.is_ieee_strict()


def test_ieee_strict_reaches_a_library_jit_traced_before() -> None:
    # A nested `jax.jit` is quaxified once per setting: the body traced outside the
    # block must not be reused inside it (nor the other way round).
    bad = jnp.array([jnp.nan, 1.0, 2.0])
    inner = jax.jit(lambda a, b: a * b)
    fn = lambda a, b: inner(a, b)
    for _ in range(2):
        assert _is_zero(quax.quaxify(fn)(z3, bad))
        with quax.zero.ieee_strict():
            out = quax.quaxify(fn)(z3, bad)
            assert not _is_zero(out)
            np.testing.assert_array_equal(np.isnan(out), [True, False, False])


# Property tests over shapes -----------------------------------------------------------

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
dtypes = st.sampled_from([jnp.float32, jnp.int32, jnp.complex64, jnp.bool_])


@settings(max_examples=12, deadline=None)
@given(shape=shapes, dtype=dtypes, data=st.data())
def test_add_mul_broadcast(
    shape: tuple[int, ...], dtype: Any, data: st.DataObject
) -> None:
    other_shape = data.draw(st.sampled_from([shape, (), shape[1:], (1, *shape)]))
    other = jnp.ones(other_shape, jnp.float32)
    z = Zero(shape, dtype)
    _check(jnp.multiply, z, other, zero=True)
    _check(jnp.add, other, z, zero=False)


@settings(max_examples=12, deadline=None)
@given(shape=shapes.filter(lambda s: len(s) > 0), data=st.data())
def test_reductions_and_shape_ops(shape: tuple[int, ...], data: st.DataObject) -> None:
    axis = data.draw(st.integers(0, len(shape) - 1))
    z = Zero(shape, jnp.float32)
    _check(lambda v: jnp.sum(v, axis=axis), z, zero=True)
    _check(lambda v: jnp.cumsum(v, axis=axis), z, zero=True)
    _check(lambda v: jnp.moveaxis(v, axis, 0).reshape(-1), z, zero=True)
    _check(lambda v: jnp.flip(jnp.expand_dims(v, axis), axis), z, zero=True)
    if shape[axis] > 0:
        _check(lambda v: jnp.max(v, axis=axis), z, zero=True)


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(0, 3), k=st.integers(0, 3), m=st.integers(0, 3), left=st.booleans()
)
def test_matmul_shapes(n: int, k: int, m: int, left: bool) -> None:
    a = jnp.ones((n, k))
    b = jnp.ones((k, m))
    args = (Zero((n, k), F32), b) if left else (a, Zero((k, m), F32))
    _check(jnp.matmul, *args, zero=True)


# Validation, and vmap outside quaxify -------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "dtype", "match"),
    [
        ((-1, 3), F32, r"non-negative, got -1 in \(-1, 3\)"),
        (3, F32, r"tuple of ints, got the int 3; write `\(3,\)`"),
        ((2.5,), F32, r"must be an int, got 2\.5"),
        (None, F32, r"tuple of ints, got None"),
        ((True, 2), F32, r"must be an int, got True"),
        ((2,), "not-a-dtype", r"`dtype` 'not-a-dtype' is not a dtype"),
        # Dtypes NumPy has and JAX has no arrays of (`object` was accepted).
        ((3,), object, r"`dtype` must be a boolean, .* got object, which JAX has no"),
        ((3,), str, r"`dtype` must be .* got <U0"),
        ((3,), np.datetime64, r"`dtype` must be .* got datetime64"),
        ((3,), "S3", r"`dtype` must be .* got \|S3"),
        ((), jax.random.key(0).dtype, r"`dtype` key<fry> is not a dtype"),
    ],
)
def test_nonsense_shapes_and_dtypes_are_refused(shape, dtype, match) -> None:
    with pytest.raises(ValueError, match=match):
        Zero(shape, dtype)


def test_shapes_of_numpy_ints_and_lists() -> None:
    assert Zero([np.int64(2), 3], F32).shape == (2, 3)
    assert Zero((), F32).shape == ()


def test_vmap_outside_quaxify_refuses_an_unbatchable_zero() -> None:
    # vmap cannot add a batch axis to a value without array leaves: without the
    # check this returned a Zero of shape (4,) for a batch of 3.
    x = jnp.ones((3, 4))
    with pytest.raises(ValueError, match=r"(?s)under `jax.vmap` returned a Zero.*"):
        jax.vmap(quax.quaxify(lambda a, b: a * b))(Zero((4,), F32), x)
    # The way out it names: vmap inside quaxify, where the rules see the batch.
    out = quax.quaxify(jax.vmap(lambda a, b: a * b, in_axes=(None, 0)))(
        Zero((4,), F32), x
    )
    assert _is_zero(out) and out.shape == (3, 4)
    # Values with array leaves are batched as usual.
    out = jax.vmap(quax.quaxify(lambda a, b: a + b))(Zero((4,), F32), x)
    np.testing.assert_allclose(out, x)
