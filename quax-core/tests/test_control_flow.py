"""Control flow, nested jit, checkpoint, linear solves and callbacks inside quaxify.

Every program runs on a `Refusing` value (which raises if materialised), so passing
proves the body ran on the structured value; results and gradients are compared with
the same program on plain arrays, under `vmap` in both orders too.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import quax
from jax import lax


sys.path.insert(0, str(Path(__file__).parent))
from helpers import Dense, Refusing, dense


x = jnp.array([0.5, 1.0, 2.0, 3.0])

PROGRAMS = {
    "jit": lambda a: jax.jit(lambda b: jnp.sin(b) * 2)(a),
    "jit_inline": lambda a: jax.jit(lambda b: jnp.sin(b) * 2, inline=True)(a),
    "cond": lambda a: lax.cond(True, lambda b: b * 2, lambda b: b + 1, a),
    "cond_data": lambda a: lax.cond(jnp.sum(a) > 0, lambda b: b * 2, jnp.sin, a),
    "switch": lambda a: lax.switch(1, [lambda b: b * 2, lambda b: b + 1, jnp.cos], a),
    "while": lambda a: lax.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.5), (0, a)
    )[1],
    "fori": lambda a: lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) * 2, a),
    "scan": lambda a: lax.scan(lambda c, xi: (c * xi, c + xi), a, jnp.ones((3, 4)))[0],
    "scan_xs": lambda a: lax.scan(
        lambda c, xi: (c + 1.0, xi * 2), jnp.zeros(()), a.reshape(2, 2)
    )[1].reshape(4),
    "map": lambda a: lax.map(lambda r: r * 2, a),
    "associative_scan": lambda a: lax.associative_scan(jnp.add, a),
    "checkpoint": lambda a: jax.checkpoint(lambda b: jnp.sin(b) * b)(a),
    "checkpoint_policy": lambda a: jax.checkpoint(
        lambda b: jnp.sin(b) * b, policy=jax.checkpoint_policies.nothing_saveable
    )(a),
    "linear_solve": lambda a: lax.custom_linear_solve(
        lambda v: v * 2, a, lambda mv, b: b / 2, symmetric=True
    ),
    "custom_root": lambda a: lax.custom_root(
        lambda y: y * y - a,
        jnp.ones(4),
        lambda f, y0: jnp.sqrt(a),
        lambda g, y: y / (2 * jnp.sqrt(a)),
    ),
    "stop_gradient": lambda a: lax.stop_gradient(a) * a,
    "debug_print": lambda a: (jax.debug.print("{}", a), a * 2)[1],
    "debug_callback": lambda a: (jax.debug.callback(lambda v: None, a), a * 2)[1],
}
# Reverse mode is undefined for these in JAX itself.
NO_REVERSE = {"while"}
# The forward pass of `grad(switch)` returns residuals that are plain in one branch
# and a value in another: joining them needs materialising (see `test_join_*`).
JOINS_UNDER_GRAD = {"switch", "cond_data"}


def quaxed(f, wrap=Refusing):
    return lambda a: dense(quax.quaxify(f)(wrap(a)))


@pytest.mark.parametrize("name", PROGRAMS)
def test_forward(name):
    f = PROGRAMS[name]
    out = quax.quaxify(f)(Refusing(x))
    assert isinstance(out, Refusing)
    assert jnp.allclose(dense(out), f(x), atol=1e-5)
    assert jnp.allclose(jax.jit(quaxed(f))(x), f(x), atol=1e-5)


@pytest.mark.parametrize("name", PROGRAMS)
def test_vmap(name):
    f = PROGRAMS[name]
    xs = jnp.stack([x, x + 1])
    expected = jax.vmap(f)(xs)
    assert jnp.allclose(jax.vmap(quaxed(f))(xs), expected, atol=1e-5)
    assert jnp.allclose(
        dense(quax.quaxify(jax.vmap(f))(Refusing(xs))), expected, atol=1e-5
    )


@pytest.mark.parametrize("name", PROGRAMS)
def test_grad(name):
    f = PROGRAMS[name]
    loss = lambda a: jnp.sum(f(a) ** 2)
    if name in NO_REVERSE:
        expected = jax.jvp(loss, (x,), (jnp.ones(4),))[1]
        got = jax.jvp(lambda a: jnp.sum(quaxed(f)(a) ** 2), (x,), (jnp.ones(4),))[1]
        assert jnp.allclose(got, expected, rtol=1e-4)
        return
    expected = jax.grad(loss)(x)
    # grad of quaxify
    got = jax.grad(lambda a: jnp.sum(quaxed(f)(a) ** 2))(x)
    assert jnp.allclose(got, expected, rtol=1e-4)
    # quaxify of grad
    wrap = Dense if name in JOINS_UNDER_GRAD else Refusing
    got = dense(quax.quaxify(jax.grad(loss))(wrap(x)))
    assert jnp.allclose(got, expected, rtol=1e-4)


def test_join_refused_names_the_carry():
    # The carry starts plain and becomes a value: joining needs materialising.
    f = lambda a: lax.scan(lambda c, xi: (c + xi, xi), jnp.zeros(()), a)[0]
    with pytest.raises(quax.JoinError, match=r"carry 0 of a scan.*Refusing"):
        quax.quaxify(f)(Refusing(x))


def test_join_materialises_only_what_differs():
    f = lambda a, b: lax.scan(
        lambda c, xi: ((c[0] + xi, c[1] * 2), xi), (jnp.zeros(()), b), a
    )[0]
    with quax.track_materialisation() as report:
        c0, c1 = quax.quaxify(f)(Dense(x), Refusing(x))
    assert isinstance(c1, Refusing)  # the stable carry stays structured
    assert jnp.allclose(c0, jnp.sum(x)) and jnp.allclose(c1.array, x * 16)
    assert report.total > 0


def test_cond_branch_types_joined():
    f = lambda p, a: lax.cond(p, lambda b: b * 2, lambda b: jnp.zeros(4), a)
    out = quax.quaxify(f)(True, Dense(x))
    assert jnp.allclose(dense(out), x * 2)
    with pytest.raises(quax.JoinError, match="output 0 of a cond"):
        quax.quaxify(f)(True, Refusing(x))


def test_jit_keeps_name_and_donation():
    @jax.jit
    def inner(b):
        return b * 2

    g = jax.jit(
        lambda a: (
            quax.quaxify(lambda b: jax.jit(inner.__wrapped__, donate_argnums=0)(b))(
                Dense(a)
            ).array
        )
    )
    text = g.lower(x).as_text()
    assert "inner" in str(jax.make_jaxpr(quax.quaxify(inner))(Dense(x)))
    assert text


def test_jit_cache_hits():
    count = 0

    @jax.jit
    def inner(b):
        nonlocal count
        count += 1
        return jnp.sin(b)

    f = quax.quaxify(lambda a: inner(a))
    f(Refusing(x))
    f(Refusing(x))
    assert count == 1
