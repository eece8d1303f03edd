"""Sharded weights on a mesh of 8 simulated CPU devices (in a subprocess, so that
the device count does not change the other tests)."""

import textwrap

import quax.testing


_SCRIPT = textwrap.dedent(
    """
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import jax.random as jr
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import quax
    import quax_lora

    assert len(jax.devices()) == 8
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    linear = eqx.nn.Linear(64, 32, key=jr.PRNGKey(0))
    lora = quax_lora.loraify(linear, rank=4, key=jr.PRNGKey(1))
    lora = eqx.tree_at(lambda lr: lr.weight.b, lora, jr.normal(jr.PRNGKey(2), (4, 64)))
    shard = lambda spec: NamedSharding(mesh, spec)
    lora = eqx.tree_at(
        lambda lr: (lr.weight.w, lr.weight.a, lr.weight.b),
        lora,
        (
            jax.device_put(lora.weight.w, shard(P("model", None))),
            jax.device_put(lora.weight.a, shard(P("model", None))),
            jax.device_put(lora.weight.b, shard(P(None, None))),
        ),
    )
    xs = jax.device_put(jr.normal(jr.PRNGKey(3), (16, 64)), shard(P("data", None)))
    f = jax.jit(quax.quaxify(lambda m, x: jax.vmap(m)(x)))
    with jax.set_mesh(mesh):
        out = f(lora, xs)
        expected = jax.vmap(quax_lora.merge(lora))(xs)
        total = quax.quaxify(lambda m: jax.vmap(m)(xs).sum())
        grads = jax.grad(total)(lora)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert len(out.sharding.device_set) == 8
    assert np.abs(np.asarray(grads.weight.b)).max() > 0
    print("ok")
    """
)


def test_sharded_weights():
    out = quax.testing.run_on_simulated_devices(_SCRIPT, n=8)
    assert out.strip().endswith("ok")
