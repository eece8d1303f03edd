"""`custom_jvp` and `custom_vjp` inside quaxify: the custom rule still applies."""

import functools as ft

import jax
import jax.numpy as jnp
import pytest
import quax

from .helpers import Refusing, Scaled, dense


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
