"""`shard_map` and `jit` with `NamedSharding` inside quaxify, on 8 simulated CPU
devices (in a subprocess, so the device count does not leak into other tests)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path


SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import quax
    from helpers import Dense, Refusing, Scaled, dense

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
    print("ok")
    """
)


def test_sharding_on_eight_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    script = SCRIPT.format(tests=str(Path(__file__).parent))
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("ok")
