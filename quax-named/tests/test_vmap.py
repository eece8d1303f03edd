"""`jax.vmap` and `NamedArray`, in both orders.

`jax.vmap` over a `NamedArray` (outside `quax.quaxify`) would map its stored array by
position, leaving names that no longer match it: every quax_named function, and
quaxify, refuses it with an error that says so and points to `quax_named.nmap`.
`jax.vmap` inside `quax.quaxify` maps the array positional code sees (storage axis 0,
or the one `in_axes` gives), and the rules keep every name.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_named as qn
from quax_named import NamedArray


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
