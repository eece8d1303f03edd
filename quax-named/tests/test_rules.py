"""Unmodified positional code on NamedArrays, against plain JAX on the same data
laid out by hand."""

import itertools
from collections import Counter

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_named as qn
from hypothesis import given, settings, strategies as st
from quax_named import NamedArray


SIZES = {"a": 2, "b": 3, "c": 4, "d": 5}


def named(names, key=0, dtype=jnp.float32):
    shape = tuple(SIZES[n] for n in names)
    return NamedArray(jr.normal(jr.PRNGKey(key), shape, dtype), tuple(names))


def laid_out(x, names):
    """`x.array` transposed to `names` (independent of quax_named: plain numpy)."""
    return np.transpose(np.asarray(x.array), [list(x.names).index(n) for n in names])


def close(got, want, names, rtol=1e-5, atol=1e-6):
    assert isinstance(got, NamedArray)
    assert Counter(got.names) == Counter(names)
    np.testing.assert_allclose(laid_out(got, names), want, rtol=rtol, atol=atol)


PERMS = st.permutations(["a", "b", "c"])


@settings(max_examples=10, deadline=None)
@given(PERMS, st.sampled_from(["add", "sub", "mul", "max", "where"]))
def test_elementwise_aligns_by_name_not_position(perm, op):
    x, y = named("abc", 1), named(perm, 2)
    fns = {
        "add": lambda x, y: x + y,
        "sub": lambda x, y: x - y,
        "mul": lambda x, y: x * y,
        "max": jnp.maximum,
        "where": lambda x, y: jnp.where(x > 0, x, y),
    }
    fn = fns[op]
    if x.array.shape != y.array.shape:
        with pytest.raises((TypeError, ValueError), match="ncompatible shapes"):
            quax.quaxify(fn)(x, y)  # JAX's own positional shape check comes first
        x, y = qn.align(x, y)
    got = quax.quaxify(fn)(x, y)
    want = fn(laid_out(x, "abc"), laid_out(y, "abc"))
    close(got, want, "abc")


def test_same_sizes_different_order_is_not_positional():
    x = NamedArray(jnp.arange(9.0).reshape(3, 3), ("foo", "bar"))
    y = NamedArray(jnp.arange(9.0).reshape(3, 3) * 10, ("bar", "foo"))
    got = quax.quaxify(jnp.add)(x, y)
    assert got.names == ("foo", "bar")
    np.testing.assert_allclose(got.array, x.array + y.array.T)


def test_broadcast_by_name():
    x, y = named("ab", 1), named("b", 2)
    got = quax.quaxify(lambda x, y: x * y)(x, y)
    close(got, laid_out(x, "ab") * laid_out(y, "b")[None, :], "ab")


@pytest.mark.parametrize(
    "fn",
    [jnp.exp, jnp.tanh, jax.nn.relu, jax.nn.gelu, jnp.abs, lambda x: x**2, jnp.sqrt],
)
def test_unary(fn):
    x = named("abc", 3)
    x = NamedArray(jnp.abs(x.array) + 0.1, x.axes)
    close(quax.quaxify(fn)(x), fn(x.array), "abc")


@pytest.mark.parametrize("axis", [0, 1, -1, (0, 2)])
@pytest.mark.parametrize("red", ["sum", "max", "min", "mean", "prod", "var"])
def test_positional_reductions_keep_names(axis, red):
    x = named("abc", 4)
    fn = getattr(jnp, red)
    got = quax.quaxify(lambda x: fn(x, axis=axis))(x)
    kept = [
        n
        for i, n in enumerate("abc")
        if i not in np.atleast_1d(np.arange(3)[list(np.atleast_1d(axis))])
    ]
    close(got, fn(x.array, axis=axis), "".join(kept), rtol=1e-4)


def test_full_reduction_is_plain_scalar():
    x = named("ab", 5)
    out = quax.quaxify(jnp.sum)(x)
    assert not isinstance(out, NamedArray)
    np.testing.assert_allclose(out, np.sum(np.asarray(x.array)), rtol=1e-5)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: jax.nn.softmax(x, axis=-1),
        lambda x: jnp.argmax(x, axis=1),
        lambda x: jnp.cumsum(x, axis=0),
        lambda x: (x - x.mean(-1, keepdims=True)) / jnp.std(x, -1, keepdims=True),
        lambda x: jax.nn.logsumexp(x, axis=0),
        lambda x: x.T,
        lambda x: jnp.expand_dims(x, 1) + 1.0,
        lambda x: x[1:, ::2],
        lambda x: x[0],
    ],
)
def test_positional_ops(fn):
    x = named("bc", 6)
    got = quax.quaxify(fn)(x)
    want = fn(x.array)
    assert isinstance(got, NamedArray)
    np.testing.assert_allclose(got.array, want, rtol=1e-5, atol=1e-6)


def test_positional_ops_names():
    x = named("bc", 6)
    assert quax.quaxify(lambda x: x.T)(x).names == ("c", "b")
    assert quax.quaxify(lambda x: jnp.argmax(x, axis=1))(x).names == ("b",)
    assert quax.quaxify(lambda x: x[0])(x).names == ("c",)
    sliced = quax.quaxify(lambda x: x[1:])(x)
    assert sliced.names == ("b", "c") and sliced.sizes == {"b": 2, "c": 4}


@settings(max_examples=12, deadline=None)
@given(st.permutations(["a", "b"]), st.permutations(["b", "c"]))
def test_matmul_by_name(p1, p2):
    x, w = named(p1, 7), named(p2, 8)
    x, w = qn.transpose(x, ["a", "b"]), qn.transpose(w, ["b", "c"])
    got = quax.quaxify(jnp.matmul)(x, w)
    close(got, laid_out(x, "ab") @ laid_out(w, "bc"), "ac")


def test_einsum_positional_code():
    x, y = named("abc", 9), named("acd", 10)
    got = quax.quaxify(lambda x, y: jnp.einsum("abc,acd->abd", x, y))(x, y)
    close(got, np.einsum("abc,acd->abd", x.array, y.array), "abd", rtol=1e-4)


def test_errors_name_the_axes():
    x = named("ab", 1)
    with pytest.raises(ValueError, match=r"unnamed array of shape \(2, 3\)"):
        quax.quaxify(jnp.add)(x, jnp.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError, match=r"Axis 'b' has size 3 .* size 1"):
        y = NamedArray(jnp.ones((2, 1)), ("a", "b"))
        quax.quaxify(jnp.add)(x, y)
    with pytest.raises(ValueError, match="more axes than the result's positional"):
        quax.quaxify(jnp.add)(
            NamedArray(jnp.ones(3), ("x",)), NamedArray(jnp.ones(3), ("y",))
        )
    with pytest.raises(ValueError, match=r"regroups axes \('a', 'b'\) into sizes"):
        quax.quaxify(lambda x: x.reshape(3, 2))(x)
    with pytest.raises(TypeError, match="Ambiguous contraction: axis 'a'"):
        quax.quaxify(lambda x, y: jnp.tensordot(x, y, axes=([1], [0])))(
            named("ab", 1), named("ba", 2)
        )
    with pytest.raises(TypeError, match=r"'b' is contracted .* and kept"):
        quax.quaxify(lambda x, y: jnp.broadcast_to(x, (3, 3)).T @ y)(
            named("b", 1), named("bc", 2)
        )
    with pytest.raises(TypeError, match=r"unnamed array of shape \(3, 4\)"):
        quax.quaxify(jnp.matmul)(x, jnp.ones((3, 4)))


def test_reshape_of_unit_axes_keeps_names():
    x = named("ab", 2)
    got = quax.quaxify(lambda x: jnp.reshape(x, (2, 1, 3)).squeeze(1))(x)
    assert got.names == ("a", "b")


def test_unmodified_equinox_layer():
    # eqx.nn.Linear with named weights on a named vector: names are checked.
    linear = eqx.nn.Linear(3, 4, key=jr.PRNGKey(0))
    named_linear = eqx.tree_at(
        lambda m: (m.weight, m.bias),
        linear,
        (NamedArray(linear.weight, ("out", "in")), NamedArray(linear.bias, ("out",))),
    )
    v = jr.normal(jr.PRNGKey(1), (3,))
    out = quax.quaxify(named_linear)(NamedArray(v, ("in",)))
    assert out.names == ("out",)
    np.testing.assert_allclose(out.array, linear(v), rtol=1e-6)
    with pytest.raises(TypeError, match="Cannot contract mismatched dimensions"):
        quax.quaxify(named_linear)(NamedArray(v, ("other",)))


def test_every_pair_of_orders_gives_the_same_result():
    # Results do not depend on the storage order of either operand.
    x0, y0 = named("abc", 1), named("bc", 2)
    ref = None
    for px, py in itertools.product(
        itertools.permutations("abc"), itertools.permutations("bc")
    ):
        x, y = qn.transpose(x0, list(px)), qn.transpose(y0, list(py))
        out = quax.quaxify(lambda x, y: jnp.exp(x) * y)(*qn.align(x, y))
        got = laid_out(out, "abc")
        if ref is None:
            ref = got
        np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_unmodified_equinox_mlp_with_named_weights():
    mlp = eqx.nn.MLP(4, 2, 8, 2, key=jr.PRNGKey(0))
    names = ["feature", "h1", "h2", "logit"]
    named_mlp = mlp
    for i, layer in enumerate(mlp.layers):
        named_mlp = eqx.tree_at(
            lambda m, i=i: (m.layers[i].weight, m.layers[i].bias),
            named_mlp,
            (
                NamedArray(layer.weight, (names[i + 1], names[i])),
                NamedArray(layer.bias, (names[i + 1],)),
            ),
        )
    x = jr.normal(jr.PRNGKey(1), (4,))
    out = quax.quaxify(named_mlp)(NamedArray(x, ("feature",)))
    assert out.names == ("logit",)
    np.testing.assert_allclose(out.array, mlp(x), rtol=1e-5, atol=1e-6)

    def loss(m):
        return jnp.sum(quax.quaxify(m)(NamedArray(x, ("feature",))).array ** 2)

    grads = eqx.filter_grad(loss)(named_mlp)
    want = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(mlp)
    assert grads.layers[1].weight.names == ("h2", "h1")
    np.testing.assert_allclose(
        grads.layers[1].weight.array, want.layers[1].weight, rtol=1e-5, atol=1e-6
    )


@settings(max_examples=10, deadline=None)
@given(PERMS, st.integers(0, 2), st.integers(0, 2))
def test_keepdims_broadcast_axes_at_any_position(perm, k1, k2):
    x = named(perm, 14)

    def fn(x):
        centred = x - jnp.max(x, axis=k1, keepdims=True)
        return centred * jnp.sum(x, axis=k2, keepdims=True)

    got = quax.quaxify(fn)(x)
    assert got.names == tuple(perm)
    np.testing.assert_allclose(got.array, fn(x.array), rtol=1e-5, atol=1e-5)


def test_two_slices_have_two_anonymous_axes_under_jit_too():
    """Each slice of an anonymous axis makes a new anonymous axis: their sum cannot
    align them, eagerly or under `jax.jit` (where quax replays what the first slice's
    rule staged, but never the axis object it made)."""
    v = NamedArray(jnp.arange(4.0), (qn.Axis(4),))
    head = lambda v: jax.lax.slice(v, (0,), (2,))
    f = quax.quaxify(lambda v: head(v) + head(v))
    for run in [f, jax.jit(f)]:
        with pytest.raises(ValueError, match="Cannot align the operands of `add`"):
            run(v)


def test_outer_product_of_an_axis_with_itself_is_refused():
    """`v[:, None] * v[None, :]` needs axis `b` twice; aligning by name gave the
    square of `v` broadcast, where positional code gives the outer product."""
    v = NamedArray(jnp.arange(4.0), ("b",))
    with pytest.raises(ValueError, match=r"`mul` would hold axis 'b' twice.*rename"):
        quax.quaxify(lambda v: v[:, None] * v[None, :])(v)
    # With two names, the outer product is by name.
    u = qn.rename(v, {"b": "b2"})
    got = quax.quaxify(lambda v, u: v[:, None] * u[None, :])(v, u)
    assert got.names == ("b", "b2")
    np.testing.assert_array_equal(got.array, np.outer(np.arange(4.0), np.arange(4.0)))


def test_a_constant_operand_is_one_value_by_its_bits():
    """An unnamed constant broadcasts like a scalar only if every entry has the same
    bits: `[0.0, -0.0, 0.0]` is not `0.0` everywhere (a product's sign shows it)."""
    x = NamedArray(jnp.array([1.0, 2.0, 3.0]), ("a",))
    with pytest.raises(ValueError, match=r"unnamed array of shape \(3,\)"):
        quax.quaxify(lambda x: x * jnp.array([-0.0, 0.0, 0.0]))(x)
    got = quax.quaxify(lambda x: x * jnp.full(3, -0.0))(x)
    np.testing.assert_array_equal(np.signbit(got.array), [True, True, True])
    got = quax.quaxify(lambda x: x + jnp.full(3, jnp.nan))(x)
    assert got.names == ("a",) and np.isnan(got.array).all()


NAN = np.array([[1.0, np.nan, -2.0], [np.inf, 0.5, -0.0]], np.float32)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: jnp.sum(x, axis=0),
        lambda x, y: jnp.max(x, axis=1),
        lambda x, y: jax.nn.softmax(x, axis=-1),
        lambda x, y: jnp.cumsum(x, axis=1),
        lambda x, y: jnp.exp(x) * 2.0 - x,
        lambda x, y: jnp.where(x > 0, x, 0.0),
        lambda x, y: jnp.maximum(x, 0.0),
        lambda x, y: x.T @ y,
    ],
)
def test_non_finite_entries_give_what_plain_jax_gives(fn):
    """NaN in, NaN out (and inf, -0.0): the rules add no arithmetic of their own."""
    x = NamedArray(jnp.asarray(NAN), ("a", "b"))
    y = NamedArray(jnp.asarray(NAN), ("a", "c"))
    got = quax.quaxify(fn)(x, y)
    want = fn(jnp.asarray(NAN), jnp.asarray(NAN))
    np.testing.assert_array_equal(got.array, want)  # NaN where plain JAX has NaN
    np.testing.assert_array_equal(np.signbit(got.array), np.signbit(want))


def test_contraction_errors_name_the_way_out():
    x, y = named("ab", 1), NamedArray(jnp.ones((3, 4)), ("d", "c"))
    with pytest.raises(TypeError, match=r"mismatched dimensions.*quax_named.rename"):
        quax.quaxify(jnp.matmul)(x, y)
    with pytest.raises(TypeError, match=r"mismatched dimensions.*quax_named.dot"):
        quax.quaxify(jnp.matmul)(x, y)
    with pytest.raises(ValueError, match="Give each axis its own name"):
        NamedArray(jnp.ones((2, 2)), ("a", "a"))
