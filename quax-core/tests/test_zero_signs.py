"""Signed symbolic zeros: every rule gives, bit for bit, the signs (and NaN positions)
that plain JAX gives on the dense signed zeros (`jnp.zeros(shape) * -1.` for `-0.`)."""

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.zero
from hypothesis import given, settings
from jax import lax
from quax.zero import Zero


def _lit(values: Any, dtype: Any, n: int | None = None) -> jax.Array:
    """A concrete array of `values` (repeated to length `n`) in `dtype`."""
    array = np.asarray(values, np.float64)
    if n is not None:
        array = np.resize(array, n)
    return jnp.asarray(array, dtype)


def _ravel(z: Any) -> Any:
    return jnp.reshape(z, (-1,))


def _int_like(dtype: Any) -> Any:
    return jnp.int32 if jnp.dtype(dtype).itemsize == 4 else jnp.int64


# (name, function of the zero `z`, a zero `o` of the other sign(s) and the dtype,
# flags): "real" for real dtypes only, "nan" where plain JAX gives a NaN or inf that a
# symbolic zero annihilates outside `ieee_strict()`.
Op = tuple[str, Callable[[Any, Any, Any], Any], frozenset[str]]
REAL = frozenset({"real"})
NAN = frozenset({"nan"})
ANY: frozenset[str] = frozenset()

OPS: list[Op] = [
    # Sign flips and products.
    ("neg", lambda z, o, d: -z, ANY),
    ("negative", lambda z, o, d: jnp.negative(z), ANY),
    ("mul_neg_literal", lambda z, o, d: z * -1.0, ANY),
    ("mul_pos_literal", lambda z, o, d: z * 2.5, ANY),
    ("mul_neg_array", lambda z, o, d: z * _lit(-2.0, d), ANY),
    ("mul_mixed", lambda z, o, d: _ravel(z) * _lit([-1, 2, -0.5], d, z.size), ANY),
    ("mul_zeros", lambda z, o, d: z * o, ANY),
    ("mul_self", lambda z, o, d: z * z, ANY),
    ("mul_inf", lambda z, o, d: z * _lit(-np.inf, d), NAN),
    ("mul_nan", lambda z, o, d: z * _lit(np.nan, d), NAN),
    ("neg_times_neg", lambda z, o, d: -(z * _lit(-3.0, d)), ANY),
    # Division: the sign of `1 / 0` is the zero's.
    ("recip", lambda z, o, d: 1 / z, ANY),
    ("recip_of_neg", lambda z, o, d: 1 / -z, ANY),
    ("recip_after_mul", lambda z, o, d: 1 / (z * -1.0), ANY),
    ("div_by_neg", lambda z, o, d: z / _lit(-3.0, d), ANY),
    ("div_by_mixed", lambda z, o, d: _ravel(z) / _lit([-1, 2], d, z.size), ANY),
    ("div_by_zero", lambda z, o, d: z / o, NAN),
    ("div_by_literal_zero", lambda z, o, d: z / _lit(-0.0, d), NAN),
    ("div_by_inf", lambda z, o, d: z / _lit(-np.inf, d), NAN),
    ("recip_of_product", lambda z, o, d: 1 / (z * _lit(-2.0, d)), ANY),
    # Sums and differences: `+0. + -0.` is `+0.`, `-0. + -0.` is `-0.`.
    ("add_zeros", lambda z, o, d: z + o, ANY),
    ("add_self", lambda z, o, d: z + z, ANY),
    ("sub_zeros", lambda z, o, d: z - o, ANY),
    ("sub_self", lambda z, o, d: z - z, ANY),
    ("add_neg_zero_literal", lambda z, o, d: z + _lit(-0.0, d), ANY),
    ("add_pos_zero_literal", lambda z, o, d: _lit(0.0, d) + z, ANY),
    ("sub_literal_zero", lambda z, o, d: z - _lit(0.0, d), ANY),
    ("literal_zero_sub", lambda z, o, d: _lit(-0.0, d) - z, ANY),
    ("add_array", lambda z, o, d: _lit([-0.0, 1, 0, -2], d, z.size) + _ravel(z), ANY),
    ("sub_array", lambda z, o, d: _lit([-0.0, 1, 0, -2], d, z.size) - _ravel(z), ANY),
    ("array_sub", lambda z, o, d: _ravel(z) - _lit([-0.0, 1, 0, -2], d, z.size), ANY),
    # Functions that read the sign.
    ("signbit", lambda z, o, d: jnp.signbit(z), REAL),
    ("copysign_from", lambda z, o, d: jnp.copysign(_lit(1.0, d), z), REAL),
    ("copysign_onto", lambda z, o, d: jnp.copysign(z, _lit(-1.0, d)), REAL),
    ("arctan2_neg_x", lambda z, o, d: jnp.arctan2(z, _lit(-1.0, d)), REAL),
    ("arctan2_zeros", lambda z, o, d: jnp.arctan2(z, o), REAL),
    ("arctan2_over", lambda z, o, d: jnp.arctan2(_lit(-1.0, d), z), REAL),
    ("angle", lambda z, o, d: jnp.angle(z), ANY),
    ("log", lambda z, o, d: jnp.log(z), ANY),
    ("exp", lambda z, o, d: jnp.exp(z), ANY),
    ("sqrt", lambda z, o, d: jnp.sqrt(z), ANY),
    ("cbrt", lambda z, o, d: jnp.cbrt(z), REAL),
    ("pow_half", lambda z, o, d: jnp.power(z, _lit(0.5, d)), REAL),
    ("pow_neg", lambda z, o, d: jnp.power(z, _lit(-1.0, d)), REAL),
    ("pow_three", lambda z, o, d: z**3, ANY),
    ("pow_two", lambda z, o, d: z**2, ANY),
    ("sign", lambda z, o, d: jnp.sign(z), ANY),
    ("abs", lambda z, o, d: jnp.abs(z), ANY),
    ("square", lambda z, o, d: jnp.square(z), ANY),
    ("conj", lambda z, o, d: jnp.conj(z), ANY),
    ("real", lambda z, o, d: jnp.real(z), ANY),
    ("imag", lambda z, o, d: jnp.imag(z), ANY),
    (
        "floor_ceil_round",
        lambda z, o, d: (jnp.floor(z), jnp.ceil(z), jnp.round(z)),
        REAL,
    ),
    ("odd_functions", lambda z, o, d: [f(z) for f in _ODD], ANY),
    ("erf", lambda z, o, d: (jax.scipy.special.erf(z), lax.erf_inv(z)), REAL),
    # Comparisons, minimum and maximum: `-0. == +0.`, and min/max order the signs.
    ("compare", lambda z, o, d: (z == o, z != o, z == 0.0), ANY),
    ("order", lambda z, o, d: (z < o, z <= o), REAL),
    ("min_max_zeros", lambda z, o, d: (jnp.minimum(z, o), jnp.maximum(z, o)), REAL),
    (
        "min_max_literal",
        lambda z, o, d: (jnp.minimum(z, 0.0), jnp.maximum(z, -0.0)),
        REAL,
    ),
    # Reductions and scans: the sum of `-0.`s starts from `+0.`, a product's sign
    # follows the parity of its terms.
    ("sum", lambda z, o, d: (jnp.sum(z), jnp.sum(z, axis=-1)), ANY),
    ("mean", lambda z, o, d: jnp.mean(z), ANY),
    ("prod", lambda z, o, d: (jnp.prod(z), jnp.prod(z, axis=-1)), ANY),
    ("prod_of_n", lambda z, o, d: [jnp.prod(_ravel(z)[:n]) for n in (1, 2, 3, 5)], ANY),
    ("sum_of_n", lambda z, o, d: [jnp.sum(_ravel(z)[:n]) for n in (0, 1, 2, 5)], ANY),
    (
        "dot_of_n",
        lambda z, o, d: [_ravel(z)[:n] @ _lit(-1, d, n) for n in (1, 2, 5)],
        ANY,
    ),
    ("cumsum_cumprod", lambda z, o, d: (jnp.cumsum(z, -1), jnp.cumprod(z, -1)), ANY),
    ("max_min", lambda z, o, d: (jnp.max(z), jnp.min(z, axis=-1)), REAL),
    ("cummax_cummin", lambda z, o, d: (lax.cummax(z, 0), lax.cummin(z, 0)), REAL),
    ("argmax", lambda z, o, d: (jnp.argmax(_ravel(z)), jnp.argmin(_ravel(z))), REAL),
    # Products with arrays: a contraction of several terms sums from `+0.`.
    ("dot_mixed", lambda z, o, d: _ravel(z) @ _lit([-1, 2, -3], d, z.size), ANY),
    ("dot_negative", lambda z, o, d: _ravel(z) @ _lit(-2, d, z.size), ANY),
    ("dot_zeros", lambda z, o, d: _ravel(z) @ _ravel(o), ANY),
    ("outer_mixed", lambda z, o, d: _ravel(z)[:, None] @ _lit([[-1, 2]], d), ANY),
    ("outer_negative", lambda z, o, d: _lit([[-1], [-2]], d) @ _ravel(z)[None], ANY),
    ("dot_inf", lambda z, o, d: _ravel(z) @ _lit([np.inf, 1], d, z.size), NAN),
    # Movers keep the sign; joins of different signs are dense.
    ("reshape_transpose", lambda z, o, d: (_ravel(z), z.T, jnp.flip(z)), ANY),
    (
        "slice_broadcast",
        lambda z, o, d: (_ravel(z)[1:], jnp.broadcast_to(z, (2, *z.shape))),
        ANY,
    ),
    (
        "concatenate",
        lambda z, o, d: (
            jnp.concatenate([_ravel(z), _ravel(o)]),
            jnp.concatenate([_ravel(z)] * 2),
        ),
        ANY,
    ),
    (
        "stack_where",
        lambda z, o, d: (
            jnp.stack([z, o]),
            jnp.where(True, z, o),
            jnp.where(_lit([1, 0], jnp.bool_, z.size), _ravel(z), _ravel(o)),
        ),
        ANY,
    ),
    # A zero predicate picks the first case everywhere: `o`, whose signs the last
    # case's (`-o`) never share.
    (
        "select_n_zero_predicate",
        lambda z, o, d: lax.select_n(jnp.real(z).astype(jnp.int32), o, z, -o),
        ANY,
    ),
    (
        "pad",
        lambda z, o, d: (
            lax.pad(_ravel(z), _lit(0.0, d), [(1, 1, 0)]),
            lax.pad(_ravel(z), _lit(-0.0, d), [(1, 0, 1)]),
        ),
        ANY,
    ),
    (
        "dynamic_update",
        lambda z, o, d: lax.dynamic_update_slice(_ravel(z), _ravel(o)[:1], (0,)),
        ANY,
    ),
    (
        "scatter_add",
        lambda z, o, d: (
            _ravel(o).at[0].add(_ravel(z)[0]),
            _lit([-0.0, 1], d, z.size).at[0].add(_ravel(z)[0]),
        ),
        ANY,
    ),
    (
        "scatter_sub",
        lambda z, o, d: (
            _ravel(o).at[0].subtract(_ravel(z)[0]),
            _lit([-0.0, 1], d, z.size).at[0].subtract(_ravel(z)[0]),
        ),
        ANY,
    ),
    # Conversions: `-0.` converts to `-0.` in another floating dtype, and to 0.
    (
        "astype",
        lambda z, o, d: (
            z.astype(jnp.float16),
            z.astype(jnp.int32),
            z.astype(jnp.bool_),
            z.astype(jnp.complex64),
        ),
        REAL,
    ),
    ("bitcast", lambda z, o, d: lax.bitcast_convert_type(z, _int_like(d)), REAL),
    ("reduce_precision", lambda z, o, d: lax.reduce_precision(z, 5, 10), REAL),
    ("complex", lambda z, o, d: (lax.complex(z, o), lax.complex(o, z)), REAL),
]

_ODD = [
    jnp.sin,
    jnp.tan,
    jnp.sinh,
    jnp.tanh,
    jnp.arcsin,
    jnp.arctan,
    jnp.arcsinh,
    jnp.arctanh,
    jnp.expm1,
    jnp.log1p,
]


def _dense(x: Any) -> Any:
    return x.materialise() if isinstance(x, Zero) else x


def _assert_same_bits(name: str, out: Any, expected: Any) -> None:
    """Same shape, dtype, NaN positions and values, and every sign bit equal."""
    out = np.asarray(_dense(out))
    expected = np.asarray(expected)
    assert out.shape == expected.shape, name
    assert out.dtype == expected.dtype, name
    out, expected = np.atleast_1d(out), np.atleast_1d(expected)
    complex_ = np.iscomplexobj(expected)
    for part in ("real", "imag") if complex_ else ("",):
        o = getattr(out, part) if part else out
        e = getattr(expected, part) if part else expected
        where = f"{name} {part}"
        np.testing.assert_array_equal(np.isnan(o), np.isnan(e), err_msg=where)
        keep = ~np.isnan(e) if np.issubdtype(e.dtype, np.inexact) else slice(None)
        np.testing.assert_array_equal(o[keep], e[keep], err_msg=where)
        if np.issubdtype(e.dtype, np.inexact):
            signs = np.signbit(o[keep]), np.signbit(e[keep])
            np.testing.assert_array_equal(*signs, err_msg=f"{where}: sign bits")


def _ops(dtype: Any, strict: bool) -> list[Op]:
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
    return [
        op
        for op in OPS
        if not (complex_ and "real" in op[2]) and (strict or "nan" not in op[2])
    ]


def _check_all(
    dtype: Any, shape: tuple[int, ...], signs: Any, other: Any, strict: bool
) -> None:
    """Every op on `Zero(shape, dtype, signs)` (next to a zero of signs `other`),
    through quaxify in one program, against the same op on the dense zeros."""
    z, o = Zero(shape, dtype, signs), Zero(shape, dtype, other)
    real_sign = z.negative[0] if isinstance(z.negative, tuple) else z.negative
    assert bool(jnp.all(jnp.signbit(jnp.real(z.materialise())) == real_sign))
    ops = _ops(z.dtype, strict)

    def program(z: Any, o: Any) -> list[Any]:
        return [fn(z, o, z.dtype) for _, fn, _ in ops]

    with quax.zero.ieee_strict(strict):
        outs = quax.quaxify(program)(z, o)
    expected = program(z.materialise(), o.materialise())
    for (name, _, _), out, exp in zip(ops, outs, expected, strict=True):
        leaves = jax.tree.leaves(out, is_leaf=lambda v: isinstance(v, Zero))
        for i, (a, b) in enumerate(zip(leaves, jax.tree.leaves(exp), strict=True)):
            _assert_same_bits(f"{name}[{i}] {z.dtype} {signs} {shape}", a, b)


_SIGNS = st.booleans()
_COMPLEX_SIGNS = st.tuples(st.booleans(), st.booleans())


def _check_signs(dtype: Any, strict: bool, negative: Any, other: Any) -> None:
    # One shape, so that the dense reference compiles its operations once per
    # dtype: (3, 4) reduces 3, 4 and 12 terms, and `prod_of_n`, `sum_of_n` and
    # `dot_of_n` take 0 to 5.
    with jax.enable_x64(dtype == jnp.float64):
        _check_all(dtype, (3, 4), negative, other, strict)


# float64 apart, marked: a TPU has no native float64, and XLA's emulation there
# cannot compile the bit operations of `signbit` (the `float64` marker skips it).
_DTYPES = [
    pytest.param([jnp.float32, jnp.complex64], id="single"),
    pytest.param([jnp.float64], id="double", marks=pytest.mark.float64),
]
# One dtype per test, alike.
_FLOAT_DTYPES = [
    pytest.param(np.float32, id="float32"),
    pytest.param(np.float64, id="float64", marks=pytest.mark.float64),
]


@pytest.mark.long_running
@pytest.mark.parametrize("dtypes", _DTYPES)
@settings(max_examples=3, deadline=None)
@given(strict=st.booleans(), data=st.data())
def test_every_rule_gives_the_dense_signs(
    dtypes: list[Any], strict: bool, data: Any
) -> None:
    dtype = data.draw(st.sampled_from(dtypes))
    signs = _COMPLEX_SIGNS if jnp.issubdtype(dtype, jnp.complexfloating) else _SIGNS
    _check_signs(dtype, strict, data.draw(signs), data.draw(signs))


@pytest.mark.parametrize(
    "dtype, strict, negative, other",
    [
        (jnp.float32, False, True, False),
        pytest.param(jnp.float64, True, False, True, marks=pytest.mark.float64),
        (jnp.complex64, False, (True, False), (False, True)),
    ],
)
def test_every_rule_gives_the_dense_signs_examples(
    dtype: Any, strict: bool, negative: Any, other: Any
) -> None:
    _check_signs(dtype, strict, negative, other)


def test_literals() -> None:
    neg = Zero((2,), jnp.float32, negative=True)
    pos = Zero((2,), jnp.float32)
    q = quax.quaxify
    assert neg.negative is True and not pos.negative
    np.testing.assert_array_equal(q(lambda z: 1 / z)(neg), [-np.inf, -np.inf])
    np.testing.assert_array_equal(q(lambda z: 1 / -z)(pos), [-np.inf, -np.inf])
    np.testing.assert_array_equal(q(lambda z: 1 / (z * -1.0))(pos), [-np.inf] * 2)
    np.testing.assert_array_equal(q(jnp.signbit)(neg), [True, True])
    np.testing.assert_allclose(q(lambda z: jnp.arctan2(z, -1.0))(neg), [-np.pi] * 2)
    # These stay symbolic, with the sign IEEE gives.
    for fn, sign in [
        (lambda z: -z, False),
        (lambda z: z * -2.0, False),
        (jnp.sqrt, True),
        (jnp.sin, True),
        (jnp.abs, False),
        (lambda z: jnp.minimum(z, Zero((2,), jnp.float32)), True),
        (lambda z: jnp.maximum(z, Zero((2,), jnp.float32)), False),
        (lambda z: z + Zero((2,), jnp.float32), False),
        (lambda z: z + z, True),
        (jnp.sum, False),  # XLA's sum starts from +0.
        (lambda z: jnp.prod(jnp.concatenate([z, z[:1]])), True),  # three terms
        (lambda z: jnp.prod(z), False),  # two terms
        (lambda z: z / -3.0, False),
    ]:
        out = q(fn)(neg)
        assert isinstance(out, Zero) and out.negative is sign, fn
    # Out-of-bounds reads give the fill value: of the zero's sign, still a zero. (Not
    # in the sweep: JAX's compiled gathers are cached by `fill_value`, and `0.0 ==
    # -0.0`, so a dense gather filling `-0.` may reuse one compiled for `+0.`.)
    out = q(lambda z: z.at[jnp.array([0, 9])].get(mode="fill", fill_value=-0.0))(neg)
    assert isinstance(out, Zero) and out.negative is True
    out = q(lambda z: z.at[jnp.array([0, 9])].get(mode="fill", fill_value=1.0))(neg)
    np.testing.assert_array_equal(out, [-0.0, 1.0])
    assert bool(jnp.signbit(out[0]))
    # A complex zero has a sign for each part.
    c = Zero((), jnp.complex64, negative=(True, False))
    assert c.negative == (True, False)
    out = q(jnp.conj)(c)
    assert isinstance(out, Zero) and out.negative == (True, True)
    m = c.materialise()
    assert bool(jnp.signbit(m.real)) and not bool(jnp.signbit(m.imag))
    # Dtypes NumPy does not know as floating (bfloat16) read their signs too.
    bf = Zero((2,), jnp.bfloat16, negative=True)
    out = q(jnp.sin)(bf)
    assert isinstance(out, Zero) and out.negative is True
    np.testing.assert_array_equal(q(lambda z: 1 / (-z * 2.0))(bf), [np.inf] * 2)
    x = jnp.array([-0.0, 1.0], jnp.bfloat16)
    out = q(lambda z, x: z + x)(Zero((2,), jnp.bfloat16), x)
    np.testing.assert_array_equal(jnp.signbit(out), [False, False])  # +0. + -0.
    # Integer and boolean zeros have no sign.
    out = q(lambda z: -z)(Zero((2,), jnp.int32))
    assert isinstance(out, Zero) and out.negative is False


def test_operands_known_only_at_run_time() -> None:
    # Traced by an outer jit, `x`'s sign is unknown: the zero annihilates it as a
    # positive finite number (documented), and `ieee_strict()` computes densely.
    neg = Zero((3,), jnp.float32, negative=True)
    x = jnp.array([-1.0, 2.0, -0.0])
    out = jax.jit(quax.quaxify(lambda z, x: z * x))(neg, x)
    assert isinstance(out, Zero) and out.negative is True
    with quax.zero.ieee_strict():
        out = jax.jit(quax.quaxify(lambda z, x: 1 / (z * x)))(neg, x)
    np.testing.assert_array_equal(out, 1 / (neg.materialise() * x))
    assert not isinstance(out, Zero)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (((2,), jnp.int32, True), r"int32 zero has no sign; pass `negative=False`"),
        (((2,), jnp.bool_, True), r"bool zero has no sign"),
        (((2,), jnp.float32, (True, False)), r"pair of signs .* complex dtype"),
        (((2,), jnp.complex64, "yes"), r"must be a bool .* got 'yes'"),
        (((2,), jnp.complex64, (True,)), r"must be a bool"),
    ],
)
def test_signs_a_dtype_cannot_hold_are_refused(args: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Zero(*args)


# A concrete operand holding a non-finite element (or, as a divisor, a zero) among
# elements of both signs: outside `ieee_strict()` the zero annihilates that element
# (reads it as a one of its sign), as it does when all elements agree. The signs
# differ, so the product is dense, and it was computed on the operand itself:
# `Zero * [-1, inf, 2]` gave `[-0, nan, 0]` and `Zero / [1, 0, -2]` gave `[0, nan,
# -0]`, where `Zero / [1, 0, 2]` gave the annihilated zero (seen before the fix).
_MIXED = [
    ("mul", lambda z, y: z * y, [-1.0, np.inf, 2.0]),
    ("mul_left", lambda z, y: y * z, [-1.0, np.nan, 2.0]),
    ("mul_neg_inf", lambda z, y: z * y, [1.0, -np.inf, -2.0]),
    ("div", lambda z, y: z / y, [1.0, 0.0, -2.0]),
    ("div_neg_zero", lambda z, y: z / y, [-1.0, -0.0, 2.0]),
    ("div_inf", lambda z, y: z / y, [1.0, np.inf, -2.0]),
]


def _unit_of_sign(y: np.ndarray, divisor: bool) -> np.ndarray:
    bad = ~np.isfinite(y) | ((y == 0) if divisor else False)
    return np.where(bad, np.copysign(1.0, y), y).astype(y.dtype)


@pytest.mark.parametrize("dtype", _FLOAT_DTYPES)
@pytest.mark.parametrize(("name", "fn", "y"), _MIXED)
def test_mixed_signs_with_annihilated_element(name, fn, y, dtype):
    y = np.asarray(y, dtype)
    divisor = name.startswith("div")
    with jax.enable_x64(dtype == np.float64):
        z = Zero((3,), dtype)
        dense_zero = z.materialise()
        run = quax.quaxify(fn)
        # Equation by equation, then the compiled eager program, and uncached.
        outs = [run(z, jnp.asarray(y)) for _ in range(3)]
        with quax.caching(False):
            outs.append(run(z, jnp.asarray(y)))
        annihilated = fn(dense_zero, jnp.asarray(_unit_of_sign(y, divisor)))
        for i, out in enumerate(outs):
            _assert_same_bits(f"{name} call {i}", out, annihilated)
        with quax.zero.ieee_strict():
            strict = run(z, jnp.asarray(y))
        _assert_same_bits(f"{name} strict", strict, fn(dense_zero, jnp.asarray(y)))


# `Zero / Zero` outside `ieee_strict()`: the zero divisor annihilates as a one of its
# sign, so the quotient's sign is the dividend's times the divisor's, as for
# `x / copysign(1, y)` on the dense zeros.
_SIGN_PAIRS = [(False, False), (False, True), (True, False), (True, True)]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("dtype", _FLOAT_DTYPES)
@pytest.mark.parametrize(("x_negative", "y_negative"), _SIGN_PAIRS)
def test_zero_over_zero_takes_the_divisors_sign(x_negative, y_negative, dtype, jit):
    with jax.enable_x64(dtype == np.float64):
        x = Zero((2,), dtype, x_negative)
        y = Zero((2,), dtype, y_negative)
        divide = quax.quaxify(lambda x, y: x / y)
        out = (jax.jit(divide) if jit else divide)(x, y)
        dense_x, dense_y = x.materialise(), y.materialise()
        expected = dense_x / jnp.copysign(jnp.ones_like(dense_y), dense_y)
        _assert_same_bits(f"{x_negative} / {y_negative}", out, expected)
        assert bool(jnp.signbit(expected[0])) is (x_negative != y_negative)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("x_signs", _SIGN_PAIRS)
@pytest.mark.parametrize("y_signs", _SIGN_PAIRS)
def test_complex_zero_over_zero_takes_the_divisors_signs(x_signs, y_signs, jit):
    x = Zero((2,), jnp.complex64, x_signs)
    y = Zero((2,), jnp.complex64, y_signs)
    divide = quax.quaxify(lambda x, y: x / y)
    out = (jax.jit(divide) if jit else divide)(x, y)
    # The divisor read as a one of its sign: its real part `copysign(1, re y)`, its
    # imaginary part `im y` (a signed zero), in plain JAX on the dense zeros.
    dense_x, dense_y = x.materialise(), y.materialise()
    real = jnp.copysign(jnp.ones_like(dense_y.real), dense_y.real)
    expected = dense_x / lax.complex(real, dense_y.imag)
    _assert_same_bits(f"{x_signs} / {y_signs}", out, expected)


def test_mixed_signs_keep_the_operands_dtype():
    # A weakly typed Python scalar or a float16 array: the dense product's dtype is
    # what plain JAX gives on the zeros.
    z = Zero((2,), jnp.float16)
    y = jnp.array([-1.0, jnp.inf], jnp.float16)
    out = quax.quaxify(lambda z, y: z * y)(z, y)
    assert out.dtype == jnp.float16
    _assert_same_bits(
        "float16", out, jnp.zeros(2, jnp.float16) * jnp.array([-1, 1], jnp.float16)
    )
    out = quax.quaxify(lambda z: z * np.inf)(z)
    assert out.dtype == jnp.float16


def test_mixed_signs_in_a_product_with_a_matrix():
    # `Zero @ y` with an infinite entry of `y` and columns of both signs: dense, the
    # infinite entry read as a one of its sign (`[-0, nan]` before the fix).
    y = np.array([[-1.0, np.inf], [-2.0, 3.0]], np.float32)
    ones = np.array([[-1.0, 1.0], [-2.0, 3.0]], np.float32)
    for negative in (False, True):
        z = Zero((2,), jnp.float32, negative)
        out = quax.quaxify(lambda z, y: z @ y)(z, jnp.asarray(y))
        _assert_same_bits(f"dot {negative}", out, z.materialise() @ jnp.asarray(ones))
