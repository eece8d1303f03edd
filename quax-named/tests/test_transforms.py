"""JAX's transforms and control flow on named arrays: `jax.jit`, `jax.grad`,
`lax.scan`, `lax.cond`, `lax.while_loop`, and `jax.vmap` in both orders.

`jax.vmap` over a `NamedArray` (outside `quax.quaxify`) would map its stored array by
position, leaving names that no longer match it: every quax_named function, and
quaxify, refuses it with an error that says so and points to `quax_named.nmap`.
`jax.vmap` inside `quax.quaxify` maps the array positional code sees (storage axis 0,
or the one `in_axes` gives), and the rules keep every name.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_named as qn
from quax_named import NamedArray


SIZES = {"a": 2, "b": 3, "c": 4, "d": 5}


def named(names, key=0, dtype=jnp.float32):
    shape = tuple(SIZES[n] for n in names)
    return NamedArray(jr.normal(jr.PRNGKey(key), shape, dtype), tuple(names))


def mlp_fn(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"]


def mlp_params(key=0):
    k1, k2 = jr.split(jr.PRNGKey(key))
    return {
        "w1": NamedArray(jr.normal(k1, (3, 4)) / 2, ("c_in", "hidden")),
        "b1": NamedArray(jnp.full((4,), 0.1), ("hidden",)),
        "w2": NamedArray(jr.normal(k2, (4, 2)) / 2, ("hidden", "out")),
    }


def plain(tree):
    return jax.tree.map(
        lambda x: x.array if isinstance(x, NamedArray) else x,
        tree,
        is_leaf=lambda x: isinstance(x, NamedArray),
    )


def test_jit_grad_vmap():
    params = mlp_params()
    x = NamedArray(jr.normal(jr.PRNGKey(3), (5, 3)), ("batch", "c_in"))
    loss = lambda p, x: jnp.mean(mlp_fn(p, x) ** 2)
    got = jax.jit(quax.quaxify(loss))(params, x)
    want = loss(plain(params), x.array)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    grads = jax.jit(jax.grad(quax.quaxify(loss)))(params, x)
    want_grads = jax.grad(loss)(plain(params), x.array)
    for k in params:
        assert grads[k].axes == params[k].axes
        np.testing.assert_allclose(grads[k].array, want_grads[k], rtol=1e-5, atol=1e-6)
    # vmap over a plain axis, naming the rest inside the vmapped function.
    xs = jr.normal(jr.PRNGKey(4), (6, 5, 3))
    f = quax.quaxify(mlp_fn)
    out = jax.vmap(lambda a: f(params, NamedArray(a, ("batch", "c_in"))).array)(xs)
    want = jax.vmap(lambda a: mlp_fn(plain(params), a))(xs)
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_scan_carry_keeps_names():
    x = named("ab", 11)

    def body(c, _):
        return c * 0.5 + 1.0, jnp.sum(c)

    out, ys = quax.quaxify(lambda x: jax.lax.scan(body, x, None, length=3))(x)
    assert isinstance(out, NamedArray) and out.names == ("a", "b")
    want, want_ys = jax.lax.scan(body, x.array, None, length=3)
    np.testing.assert_allclose(out.array, want, rtol=1e-6)
    np.testing.assert_allclose(ys, want_ys, rtol=1e-5)


def test_cond_keeps_names():
    x = named("ab", 12)
    f = quax.quaxify(
        lambda p, x: jax.lax.cond(p, lambda v: v + 1.0, lambda v: v * 2.0, x)
    )
    for p in (True, False):
        out = f(p, x)
        assert out.names == ("a", "b")
        np.testing.assert_allclose(out.array, x.array + 1.0 if p else x.array * 2.0)


def test_while_loop_keeps_names():
    x = named("ab", 13)

    def loop(x):
        return jax.lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0 + 1.0), (0, x)
        )

    n, out = quax.quaxify(loop)(x)
    assert int(n) == 3 and out.names == ("a", "b")
    np.testing.assert_allclose(out.array, loop(x.array)[1], rtol=1e-6)


X = np.arange(12.0, dtype=np.float32).reshape(3, 4)


W = np.arange(20.0, dtype=np.float32).reshape(4, 5) / 10


def x():
    return NamedArray(jnp.asarray(X), ("a", "b"))


def w():
    return NamedArray(jnp.asarray(W), ("b", "c"))


REFUSAL = (
    r"names 2 axes \('a', 'b'\) but its array has shape \(4,\).*`jax.vmap`.*"
    r"quax_named.nmap"
)


@pytest.mark.parametrize(
    "fn",
    [
        lambda v: qn.sum(v, "a"),  # was the sum over `b`, named `b`
        lambda v: qn.softmax(v, "b"),  # was "axis 1 is out of bounds"
        lambda v: qn.argmax(v, "b"),
        lambda v: qn.transpose(v, ("b", "a")),
        lambda v: qn.rename(v, {"a": "z"}),
        lambda v: v[{"b": 0}],
        lambda v: v + 1.0,
        lambda v: qn.nmap(jnp.sum, "b")(v),
        quax.quaxify(lambda v: v + 1.0),
        quax.quaxify(lambda v: jnp.sum(v, axis=0)),
    ],
)
def test_vmap_over_a_named_array_refuses_and_points_to_nmap(fn):
    with pytest.raises(ValueError, match=REFUSAL):
        jax.vmap(fn)(x())


def test_vmap_over_another_storage_axis_refuses_too():
    with pytest.raises(ValueError, match=r"array has shape \(3,\).*quax_named.nmap"):
        jax.vmap(lambda v: qn.sum(v, "a"), in_axes=1)(x())
    with pytest.raises(ValueError, match=r"array has shape \(3,\).*quax_named.nmap"):
        jax.vmap(quax.quaxify(lambda v: v * 2.0), in_axes=1)(x())


def test_what_the_refusal_points_to_gives_the_mapped_result():
    # nmap over `b`, vectorised over `a`: the row sums, named `a`.
    got = qn.nmap(jnp.sum, "b")(x())
    assert got.names == ("a",)
    np.testing.assert_array_equal(got.array, [6.0, 22.0, 38.0])
    # vmap over plain arrays, named inside.
    got = jax.vmap(lambda a: qn.sum(NamedArray(a, ("b",)), "b"))(jnp.asarray(X))
    np.testing.assert_array_equal(got, [6.0, 22.0, 38.0])


def test_vmap_over_unmapped_named_arguments_and_stacked_named_arrays():
    # `in_axes=None` leaves the named array whole.
    got = jax.vmap(lambda s, v: qn.sum(v * s, "a"), in_axes=(0, None))(
        jnp.array([1.0, 2.0]), x()
    )
    np.testing.assert_array_equal(got.array, [[12, 15, 18, 21], [24, 30, 36, 42]])
    # Named arrays stacked by `jax.vmap` (an ensemble) are mapped back whole.
    stacked = jax.vmap(lambda s: NamedArray(jnp.asarray(X) * s, ("a", "b")))(
        jnp.array([1.0, -1.0])
    )
    got = jax.vmap(lambda v: qn.sum(v, "b").array)(stacked)
    np.testing.assert_array_equal(got, [[6.0, 22.0, 38.0], [-6.0, -22.0, -38.0]])
    # Outside `jax.vmap`, the stack's names do not match its array: refused.
    with pytest.raises(ValueError, match=r"array has shape \(2, 3, 4\).*nmap"):
        qn.sum(stacked, "a")


PROGRAMS = {
    "sum": (lambda v, w: jnp.sum(v), ("a",)),
    "sum keepdims": (lambda v, w: jnp.sum(v, keepdims=True) * v, ("a", "b")),
    "softmax": (lambda v, w: jax.nn.softmax(v), ("a", "b")),
    "cumsum": (lambda v, w: jnp.cumsum(v), ("a", "b")),
    "matmul": (lambda v, w: v @ w, ("a", "c")),
    "elementwise": (lambda v, w: jnp.exp(v) - w[:, 0], ("a", "b")),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("jit", [False, True])
def test_vmap_inside_quaxify_maps_storage_axis_0_keeping_every_name(name, jit):
    fn, names = PROGRAMS[name]
    mapped = quax.quaxify(jax.vmap(fn, in_axes=(0, None)))
    got = (jax.jit(mapped) if jit else mapped)(x(), w())
    want = jax.vmap(fn, in_axes=(0, None))(jnp.asarray(X), jnp.asarray(W))
    assert isinstance(got, NamedArray) and got.names == names
    np.testing.assert_allclose(got.array, want, rtol=1e-6)


def test_vmap_inside_quaxify_over_another_axis():
    # `in_axes=1` maps `b`; `out_axes=0` puts it first, under its name.
    got = quax.quaxify(jax.vmap(jnp.cumsum, in_axes=1))(x())
    assert got.names == ("b", "a")
    np.testing.assert_array_equal(got.array, np.cumsum(X, axis=0).T)


def test_vmap_inside_quaxify_checks_names():
    # The per-example outer product of a named vector with itself needs its axis
    # twice: refused (not the square of the vector, broadcast).
    with pytest.raises(ValueError, match="would hold axis 'b' twice"):
        quax.quaxify(jax.vmap(lambda v: v[:, None] * v[None, :]))(x())
    # By-name functions see a plain tracer inside quaxify: the error says so.
    with pytest.raises(TypeError, match=r"needs a NamedArray, got .*Tracer.*nmap"):
        quax.quaxify(jax.vmap(lambda v: qn.sum(v, "b")))(x())
