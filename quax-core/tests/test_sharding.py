"""`shard_map` and `jit` with `NamedSharding` inside quaxify, on 8 simulated CPU
devices (in a subprocess, so the device count does not leak into other tests)."""

import os
import textwrap
from pathlib import Path

import jax
import jax.core
import jax.numpy as jnp
import quax
import quax.testing
from jax import lax

from .helpers import Dense, dense


SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import quax
    from tests.helpers import Dense, Refusing, Scaled, dense

    assert len(jax.devices()) == 8
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    w = jnp.arange(32.0).reshape(8, 4)
    ws = jax.device_put(w, NamedSharding(mesh, P("x")))

    def f(w):
        return jax.shard_map(lambda a: jnp.sin(a) * 2, mesh=mesh, in_specs=P("x"),
                             out_specs=P("x"), check_vma=False)(w)

    out = quax.quaxify(f)(Refusing(w))
    assert isinstance(out, Refusing) and jnp.allclose(out.array, f(w))
    out = jax.jit(quax.quaxify(f))(Refusing(ws))
    assert out.array.sharding.spec == P("x"), out.array.sharding
    assert jnp.allclose(quax.quaxify(f)(Scaled(w, 2.0)), f(2 * w))
    loss = lambda w: jnp.sum(dense(quax.quaxify(f)(Refusing(w))))
    assert jnp.allclose(jax.grad(loss)(w), jax.grad(lambda w: jnp.sum(f(w)))(w))
    assert jnp.allclose(jax.vmap(loss)(jnp.stack([w, w])), jnp.sum(f(w)))

    # jit with NamedSharding: the weights' sharding survives the structured value.
    g = jax.jit(quax.quaxify(lambda a, v: a @ v),
                in_shardings=(NamedSharding(mesh, P("x")), None))
    y = g(Refusing(ws), jnp.ones(4))
    assert y.array.sharding.spec == P("x"), y.array.sharding

    # A value whose leaves vary along different manual axes: each output leaf is
    # made to vary along its out spec's axes, as `shard_map` does to arrays, so that
    # the transpose sums the replicated leaf's cotangent.
    class Pair(quax.ArrayValue):
        a: jax.Array
        b: jax.Array

        def aval(self):
            return jax.core.ShapedArray(self.a.shape, self.a.dtype)

        def materialise(self):
            return self.a + self.b

    @quax.register(jax.lax.neg_p)
    def _(x: Pair):
        return Pair(jax.lax.pcast(-x.a, "x", to="varying"), x.b)

    neg = jax.shard_map(lambda p: -p, mesh=mesh, in_specs=P(), out_specs=P("x"))
    pair_loss = lambda a, b: (lambda o: jnp.sum(o.a) + jnp.sum(o.b**2))(
        quax.quaxify(neg)(Pair(a, b))
    )
    ref = jax.shard_map(
        lambda a, b: (-a, b), mesh=mesh, in_specs=P(), out_specs=P("x")
    )
    ref_loss = lambda a, b: (lambda o: jnp.sum(o[0]) + jnp.sum(o[1] ** 2))(ref(a, b))
    got = jax.grad(pair_loss, argnums=(0, 1))(w, w)
    expected = jax.grad(ref_loss, argnums=(0, 1))(w, w)
    assert all(jnp.allclose(g, e) for g, e in zip(got, expected)), (got, expected)
    print("ok")
    """
)


def test_sharding_on_eight_devices():
    # The subprocess imports the helpers as the package `tests` of quax-core.
    path = os.pathsep.join(
        [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    )
    out = quax.testing.run_on_simulated_devices(SCRIPT, n=8, env={"PYTHONPATH": path})
    assert out.strip().endswith("ok")


def test_pcast_varying_manual_axes():
    """Inside `shard_map`, a value's tracer varies along the manual axes its leaves
    vary along, so `pcast` and `shard_map`'s implicit output `pvary` see its type."""
    mesh = jax.make_mesh((1,), ("i",))
    x = jnp.arange(12.0).reshape(3, 4)

    def check(body, expected_vma):
        def inner(v):
            assert jax.typeof(v).mat.varying == frozenset(), jax.typeof(v)
            out = body(v)
            assert jax.typeof(out).mat.varying == expected_vma, jax.typeof(out)
            return out

        f = jax.shard_map(inner, mesh=mesh, in_specs=jax.P(), out_specs=jax.P("i"))
        out = quax.quaxify(f)(Dense(x))
        assert isinstance(out, Dense) and jnp.array_equal(out.array, f(x))
        assert isinstance(jax.jit(quax.quaxify(f))(Dense(x)), Dense)

    varying = lambda v: lax.pcast(v, "i", to="varying")
    check(varying, frozenset({"i"}))
    check(lambda v: varying(v) * 2 + 1, frozenset({"i"}))
    check(lambda v: jnp.sin(v), frozenset())  # `shard_map` adds the `pvary`
    check(jax.jit(varying), frozenset({"i"}))
    check(lambda v: lax.cond(True, varying, varying, v), frozenset({"i"}))
    # quaxify inside the `shard_map`, on a value built from a varying array.
    g = jax.shard_map(
        quax.quaxify(lambda a: dense(varying(Dense(a)))),
        mesh=mesh,
        in_specs=jax.P(),
        out_specs=jax.P("i"),
    )
    assert jnp.array_equal(g(x), x)
    # Gradients flow through the cast.
    loss = lambda a: jnp.sum(
        dense(
            quax.quaxify(
                jax.shard_map(
                    varying, mesh=mesh, in_specs=jax.P(), out_specs=jax.P("i")
                )
            )(Dense(a))
        )
        ** 2
    )
    assert jnp.allclose(jax.grad(loss)(x), 2 * x)
