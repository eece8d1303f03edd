"""`NamedArray`'s own Python operators when the other operand is traced: a
`NamedArray` built inside a quaxified function meeting the traced argument (which
stands for a `NamedArray` only the rules see), both ways round, under `jit` and
`grad`, against plain JAX on the stored arrays laid out by name."""

import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_named as qn
from quax.testing import tolerance
from quax_named import NamedArray


# Stored as (b, a): the operators must match its entries with the traced (a, b)
# argument's by name, not by position (both axes have size 3).
C = np.arange(2.0, 11.0, dtype=np.float32).reshape(3, 3)
X = np.linspace(0.5, 2.0, 9, dtype=np.float32).reshape(3, 3)
# Equal entries somewhere, so that `==`, `<=`, ... are not constant.
X[0, 1] = C[1, 0]

ARITHMETIC = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.pow,
    operator.floordiv,
    operator.mod,
]
COMPARISONS = [operator.lt, operator.le, operator.gt, operator.ge, operator.eq]
COMPARISONS += [operator.ne]

# The results are float32: within 2e-6 of NumPy's on the CPU; a TPU's or GPU's float32
# `pow` is an approximation good to about 1e-5 there (`quax.testing.tolerance`).
TOLERANCE = (
    {"rtol": 2e-6, "atol": 2e-6}
    if jax.default_backend() == "cpu"
    else tolerance(np.float32)
)
BITWISE = [operator.and_, operator.or_, operator.xor]


def _built() -> NamedArray:
    return NamedArray(jnp.asarray(C), ("b", "a"))


def _by_name(out: NamedArray) -> np.ndarray:
    """`out`'s entries laid out as (a, b)."""
    assert isinstance(out, NamedArray), type(out)
    return np.asarray(qn.transpose(out, ("a", "b")).array)


def _check(got: NamedArray, want: np.ndarray) -> None:
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(_by_name(got), want)
    else:
        np.testing.assert_allclose(_by_name(got), want, **TOLERANCE)


@pytest.mark.parametrize("op", ARITHMETIC + COMPARISONS, ids=lambda op: op.__name__)
@pytest.mark.parametrize("built_first", [True, False], ids=["built_op_x", "x_op_built"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_operator_with_a_traced_named_array(op, built_first, jit):
    """Failed before ("Cannot align an unnamed array") where the built array came
    first, and `==`/`!=` gave the module comparison `False`."""

    def f(x):
        return op(_built(), x) if built_first else op(x, _built())

    fn = quax.quaxify(f)
    got = (jax.jit(fn) if jit else fn)(NamedArray(jnp.asarray(X), ("a", "b")))
    want = op(C.T, X) if built_first else op(X, C.T)
    _check(got, np.asarray(want))


@pytest.mark.parametrize("op", BITWISE, ids=lambda op: op.__name__)
@pytest.mark.parametrize("built_first", [True, False], ids=["built_op_x", "x_op_built"])
def test_bitwise_operator_with_a_traced_named_array(op, built_first):
    mask = C > 5.0
    other = X > 1.0

    def f(x):
        built = NamedArray(jnp.asarray(mask), ("b", "a"))
        return op(built, x) if built_first else op(x, built)

    got = jax.jit(quax.quaxify(f))(NamedArray(jnp.asarray(other), ("a", "b")))
    want = op(mask.T, other) if built_first else op(other, mask.T)
    _check(got, want)


@pytest.mark.parametrize(
    "op",
    [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow],
    ids=lambda op: op.__name__,
)
@pytest.mark.parametrize("built_first", [True, False], ids=["built_op_x", "x_op_built"])
def test_operator_gradients(op, built_first):
    """`jax.grad` around and inside `quax.quaxify`, against plain JAX's gradient."""

    def loss(x):
        return jnp.sum(op(_built(), x) if built_first else op(x, _built()))

    def plain(x):
        return jnp.sum(op(C.T, x) if built_first else op(x, C.T))

    want = np.asarray(jax.grad(plain)(jnp.asarray(X)))
    outside = jax.grad(lambda a: quax.quaxify(loss)(NamedArray(a, ("a", "b"))))(
        jnp.asarray(X)
    )
    np.testing.assert_allclose(outside, want, rtol=2e-6)
    inside = jax.jit(quax.quaxify(jax.grad(loss)))(
        NamedArray(jnp.asarray(X), ("a", "b"))
    )
    if isinstance(inside, NamedArray):
        _check(inside, want)
    else:
        # A constant cotangent (of `+`, `-`) carries no names: it is laid out as
        # the argument's array, (a, b).
        np.testing.assert_allclose(inside, want, rtol=2e-6)


def test_gradient_summing_two_named_cotangents():
    """`jax.grad` of `x * x` inside `quax.quaxify` adds two cotangents (`add_any`):
    refused before ("no rule ... `add_any`"), named after."""
    x = NamedArray(jnp.asarray(X), ("a", "b"))
    got = quax.quaxify(jax.grad(lambda x: jnp.sum(x * jnp.sin(x))))(x)
    want = np.sin(X) + X * np.cos(X)
    assert isinstance(got, NamedArray) and got.names == ("a", "b")
    np.testing.assert_allclose(got.array, want, rtol=2e-6)


def test_operator_with_a_traced_scalar_or_broadcast_operand():
    """A traced plain scalar (`jax.jit` outside quaxify) and a built vector meeting
    the traced argument's trailing axis by position and name."""
    scaled = jax.jit(lambda s: _built() * s)(jnp.float32(2.5))
    _check(scaled, C.T * 2.5)
    row = np.array([1.0, -2.0, 3.0], np.float32)
    got = jax.jit(quax.quaxify(lambda x: NamedArray(jnp.asarray(row), ("b",)) - x))(
        NamedArray(jnp.asarray(X), ("a", "b"))
    )
    _check(got, row[None, :] - X)


def test_operator_with_a_traced_unnamed_array_is_refused():
    with pytest.raises(ValueError, match=r"`mul` mixes a NamedArray with axes"):
        jax.jit(lambda s: _built() * s)(jnp.ones((3, 3)))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_matmul_with_a_traced_named_array(jit):
    """`@` both ways, contracting the matching axis, against the stored arrays."""
    w = np.arange(12.0, dtype=np.float32).reshape(3, 4)  # (b, c)
    v = np.arange(15.0, dtype=np.float32).reshape(5, 3)  # (d, a)

    def f(x):
        return (
            x @ NamedArray(jnp.asarray(w), ("b", "c")),
            NamedArray(jnp.asarray(v), ("d", "a")) @ x,
        )

    fn = quax.quaxify(f)
    right, left = (jax.jit(fn) if jit else fn)(NamedArray(jnp.asarray(X), ("a", "b")))
    assert right.names == ("a", "c") and left.names == ("d", "b")
    np.testing.assert_allclose(right.array, X @ w, rtol=2e-6)
    np.testing.assert_allclose(left.array, v @ X, rtol=2e-6)
    grad = jax.grad(
        lambda a: jnp.sum(quax.quaxify(f)(NamedArray(a, ("a", "b")))[0].array)
    )(jnp.asarray(X))
    np.testing.assert_allclose(grad, np.broadcast_to(w.sum(1), (3, 3)), rtol=2e-6)
    with pytest.raises(TypeError, match="Cannot contract mismatched dimensions"):
        quax.quaxify(lambda x: NamedArray(jnp.asarray(v), ("d", "e")) @ x)(
            NamedArray(jnp.asarray(X), ("a", "b"))
        )


def test_matmul_and_equality_outside_quaxify():
    """Outside positional code: `@` contracts as inside `quax.quaxify`, and `==` is
    elementwise, as for a JAX array (so a `NamedArray` is not hashable)."""
    x = NamedArray(jnp.asarray(X), ("a", "b"))
    w = NamedArray(jnp.arange(12.0).reshape(3, 4), ("b", "c"))
    out = x @ w
    assert out.names == ("a", "c")
    np.testing.assert_allclose(out.array, X @ np.arange(12.0).reshape(3, 4), rtol=2e-6)
    with pytest.raises(TypeError, match="Cannot contract mismatched dimensions"):
        _ = x @ x
    _check(x == _built(), X == C.T)
    _check(x != 1.0, X != 1.0)
    with pytest.raises(TypeError, match="unhashable"):
        hash(x)


def test_numpy_operands_defer_to_the_operators():
    """A NumPy array on the left made an object array of `NamedArray`s before."""
    x = NamedArray(jnp.asarray(X), ("a", "b"))
    _check(np.float32(2.0) * x, 2.0 * X)
    _check(np.ones((), np.float32) - x, 1.0 - X)
    with pytest.raises(ValueError, match="Cannot align an unnamed array of shape"):
        _ = np.ones((3, 3)) + x
    with pytest.raises(ValueError, match="Cannot align an unnamed array of shape"):
        _ = np.ones((3, 3)) == x
