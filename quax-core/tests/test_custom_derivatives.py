"""`custom_jvp` and `custom_vjp` inside quaxify: the custom rule still applies."""

import functools as ft

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax

from .helpers import Refusing, Scaled, Wrapper, dense


x = jnp.array([-1.0, 0.0, 2.0, 3.0])


@jax.custom_vjp
def clip_gradient(v):
    return v


clip_gradient.defvjp(lambda v: (v, None), lambda _, g: (jnp.clip(g, -0.5, 0.5),))


@jax.custom_jvp
def straight_through(v):
    return jnp.round(v)


straight_through.defjvp(lambda p, t: (straight_through(p[0]), t[0]))


@ft.partial(jax.custom_jvp, nondiff_argnums=(0,))
def apply(fn, v):
    return fn(v)


apply.defjvp(lambda fn, p, t: (apply(fn, p[0]), 3 * t[0]))


@jax.custom_vjp
def sym(v, w):
    return v * w


def _sym_fwd(v, w):
    return sym(v.value, w.value), (w.perturbed, v.value)


def _sym_bwd(res, g):
    w_perturbed, v = res
    return 2 * g, (g * v if w_perturbed else None)


sym.defvjp(_sym_fwd, _sym_bwd, symbolic_zeros=True)

PROGRAMS = {
    "nn": lambda a: jax.nn.relu(a) + jax.nn.softplus(a) + jax.nn.silu(a),
    "custom_vjp": lambda a: clip_gradient(a * 3.0),
    "custom_jvp": lambda a: straight_through(a * 1.7),
    "nondiff_argnums": lambda a: apply(jnp.sin, a),
    "symbolic_zeros": lambda a: sym(a, jnp.ones(4)),
    "logsumexp": lambda a: jax.nn.logsumexp(a) * a,
}


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize("jit", [False, True])
def test_matches_dense(name, jit):
    f = PROGRAMS[name]
    loss = lambda a: jnp.sum(f(a) * jnp.arange(4.0))
    qloss = lambda a: jnp.sum(dense(quax.quaxify(f)(Refusing(a))) * jnp.arange(4.0))
    maybe_jit = jax.jit if jit else (lambda g: g)
    assert jnp.allclose(maybe_jit(qloss)(x), loss(x), atol=1e-5)
    expected = jax.grad(loss)(x)
    assert jnp.allclose(maybe_jit(jax.grad(qloss))(x), expected, atol=1e-5)
    assert jnp.allclose(
        dense(quax.quaxify(jax.grad(loss))(Refusing(x))), expected, atol=1e-5
    )
    xs = jnp.stack([x, x + 1])
    assert jnp.allclose(
        jax.vmap(jax.grad(qloss))(xs), jax.vmap(jax.grad(loss))(xs), atol=1e-5
    )


def test_body_keeps_structure():
    out = quax.quaxify(PROGRAMS["nn"])(Refusing(x))
    assert isinstance(out, Refusing)


def test_nonlinear_type_enters_dense():
    # `Scaled` is not linear in its leaves: the rule sees the dense array, and the
    # gradient (clipped by the rule) is still right.
    g = jax.grad(
        lambda a: jnp.sum(quax.quaxify(PROGRAMS["custom_vjp"])(Scaled(a, 2.0)))
    )(x)
    assert jnp.allclose(g, 3.0)


def test_refusing_nonlinear_type_says_what_to_do():
    class RefusingScaled(Scaled):
        def materialise(self):
            raise RuntimeError("no")

    with pytest.raises(TypeError, match="linear_in_leaves"):
        quax.quaxify(clip_gradient)(RefusingScaled(x, 2.0))


# The linearity contract: a type that says nothing counts as linear -------------------


def _unwrap(x):
    return jax.tree.map(
        lambda v: v.array if isinstance(v, Wrapper) else v,
        x,
        is_leaf=lambda v: isinstance(v, Wrapper),
    )


f3 = jnp.array([0.5, -1.25, 2.0])
i3 = jnp.array([12, 18, 7])
m3 = jnp.array([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]])

# Each a `custom_jvp` function of jax.numpy / jax.nn, with its inputs.
CUSTOM_JVP_FUNCTIONS = {
    "logaddexp": (jnp.logaddexp, (f3, f3[::-1])),
    "logaddexp2": (jnp.logaddexp2, (f3, f3[::-1])),
    "sinc": (jnp.sinc, (f3,)),
    "frexp": (jnp.frexp, (f3,)),
    "ldexp": (jnp.ldexp, (f3, jnp.array([1, 2, 3]))),
    "gcd": (jnp.gcd, (i3, jnp.array([8, 12, 21]))),
    "lcm": (jnp.lcm, (i3, jnp.array([8, 12, 21]))),
    "i0": (jnp.i0, (f3,)),
    "kaiser": (lambda beta: jnp.kaiser(5, beta), (jnp.array(2.5),)),
    "pinv": (jnp.linalg.pinv, (m3,)),
    "slogdet": (lambda m: tuple(jnp.linalg.slogdet(m)), (m3,)),
    "relu": (jax.nn.relu, (f3,)),
}


def test_values_count_as_linear_unless_they_say_otherwise():
    assert Wrapper.linear_in_leaves is True
    assert Scaled.linear_in_leaves is False


class AllowingWrapper(Wrapper):
    """A `Wrapper` that materialises (to its array)."""

    def materialise(self):
        return self.array


# `gcd` and `lcm` loop with `while_loop`, whose predicate JAX decides on as a plain
# array: their wrapper must materialise that one boolean (see test_control_flow).
_DECIDES = {"gcd", "lcm"}


@pytest.mark.parametrize("name", CUSTOM_JVP_FUNCTIONS)
def test_custom_jvp_functions_on_a_refusing_wrapper(name):
    fn, args = CUSTOM_JVP_FUNCTIONS[name]
    expected = fn(*args)
    wrapper = AllowingWrapper if name in _DECIDES else Wrapper
    out = quax.quaxify(fn)(*[wrapper(a) for a in args])
    assert all(
        isinstance(o, Wrapper) for o in jax.tree.leaves(out, is_leaf=quax.is_value)
    )
    got, want = jax.tree.leaves(_unwrap(out)), jax.tree.leaves(expected)
    for o, e in zip(got, want, strict=True):
        np.testing.assert_allclose(o, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["logaddexp", "sinc", "pinv", "relu"])
def test_custom_jvp_gradients_on_a_refusing_wrapper(name):
    fn, args = CUSTOM_JVP_FUNCTIONS[name]
    loss = lambda a: jnp.sum(fn(a, *args[1:]))
    qloss = lambda a: jnp.sum(_unwrap(quax.quaxify(fn)(Wrapper(a), *args[1:])))
    np.testing.assert_allclose(
        jax.grad(qloss)(args[0]), jax.grad(loss)(args[0]), rtol=1e-5, atol=1e-6
    )


def test_custom_vjp_on_a_refusing_wrapper():
    qloss = lambda a: jnp.sum(_unwrap(quax.quaxify(PROGRAMS["custom_vjp"])(Wrapper(a))))
    np.testing.assert_allclose(jax.grad(qloss)(x), jnp.full(4, 3 * 0.5))


@pytest.mark.parametrize("fn", [straight_through, clip_gradient, jax.nn.relu])
def test_refusing_nonlinear_type_keeps_the_refusal_contract(fn):
    # A type declaring `linear_in_leaves = False` meets the custom rule dense; its
    # refusal stays a RuntimeError with the type's own text, chained.
    class RefusingScaled(Scaled):
        def materialise(self):
            raise RuntimeError("Refusing to materialise RefusingScaled")

    with pytest.raises(RuntimeError, match="Refusing to materialise") as info:
        quax.quaxify(fn)(RefusingScaled(x, 2.0))
    assert "linear_in_leaves" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
