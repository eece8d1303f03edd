"""Names to a mesh: partition specs from names, and a named MLP training step on 8
simulated CPU devices, data-parallel over `batch` and model-parallel over `hidden`."""

import pytest
import quax.testing
import quax_named as qn
from jax.sharding import PartitionSpec as P
from quax_named import Axis, NamedArray


def test_partition_spec_from_names():
    mapping = {"batch": "data", "hidden": "model"}
    assert qn.partition_spec(("batch", "feature"), mapping) == P("data", None)
    assert qn.partition_spec((Axis("hidden"), Axis(3)), mapping) == P("model", None)
    with qn.axis_mapping(mapping):
        assert qn.partition_spec(("feature", "hidden")) == P(None, "model")
    with pytest.raises(ValueError, match="already used by another axis"):
        qn.partition_spec(("batch", "seq"), {"batch": "data", "seq": "data"})
    import jax.numpy as jnp

    with pytest.raises(ValueError, match="needs a mesh"):
        qn.named_sharding(NamedArray(jnp.ones(2), ("batch",)))


PROGRAM = r"""
import jax, jax.numpy as jnp, jax.random as jr, numpy as np, quax
import quax_named as qn
from quax_named import NamedArray
from jax.sharding import PartitionSpec as P

from jax.sharding import AxisType
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
mapping = {"batch": "data", "hidden": "model"}

def loss_fn(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] - y) ** 2)

k = jr.split(jr.PRNGKey(0), 5)
params = {
    "w1": NamedArray(jr.normal(k[0], (16, 32)) / 4, ("feature", "hidden")),
    "b1": NamedArray(jnp.zeros(32), ("hidden",)),
    "w2": NamedArray(jr.normal(k[1], (32, 8)) / 4, ("hidden", "out")),
}
x = NamedArray(jr.normal(k[2], (64, 16)), ("batch", "feature"))
y = NamedArray(jr.normal(k[3], (64, 8)), ("batch", "out"))

def step(p, x, y):
    loss, g = jax.value_and_grad(quax.quaxify(loss_fn))(p, x, y)
    new = jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
    return loss, qn.shard(new)

norm = lambda spec, n: tuple(spec) + (None,) * (n - len(spec))
is_named = lambda a: isinstance(a, NamedArray)
plain = lambda t: jax.tree.map(lambda a: a.array, t, is_leaf=is_named)
ref_loss, ref_grads = jax.value_and_grad(loss_fn)(plain(params), x.array, y.array)
ref_new = jax.tree.map(lambda a, b: a - 0.1 * b, plain(params), ref_grads)

with qn.axis_mapping(mapping, mesh):
    params_s, x_s, y_s = qn.shard((params, x, y))
    assert norm(x_s.array.sharding.spec, 2) == ("data", None), x_s.array.sharding
    compiled = jax.jit(step).lower(params_s, x_s, y_s).compile()
    loss, new = compiled(params_s, x_s, y_s)

np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
for name in params:
    np.testing.assert_allclose(new[name].array, ref_new[name], rtol=1e-5, atol=1e-6)
    want = qn.partition_spec(params[name].axes, mapping)
    got = norm(new[name].array.sharding.spec, len(want))
    assert got == tuple(want), (name, got, want)
assert norm(new["w1"].array.sharding.spec, 2) == (None, "model")
assert norm(new["w2"].array.sharding.spec, 2) == ("model", None)
# The compiled program's output shardings are the ones the names ask for.
out_shardings = compiled.output_shardings[1]
for name in params:
    want = qn.partition_spec(params[name].axes, mapping)
    assert norm(out_shardings[name].array.spec, len(want)) == tuple(want)
print("ok", float(loss))
"""


def test_named_mlp_training_step_on_8_devices():
    out = quax.testing.run_on_simulated_devices(PROGRAM, n=8, timeout=300)
    assert out.strip().splitlines()[-1].startswith("ok")


def test_a_mapping_reaches_code_traced_before_it():
    """The active mapping is a setting of quax's recordings (and compiled eager
    programs): code traced outside `axis_mapping` is not replayed inside it, where
    its rules constrain their outputs, nor the reverse."""
    import jax
    import jax.numpy as jnp
    import quax
    from jax.sharding import AxisType

    mesh = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Auto,))
    x = NamedArray(jnp.ones((4, 3)), ("batch", "feature"))
    y = NamedArray(jnp.ones((4, 3)), ("batch", "feature"))
    fns = [lambda a, b: jnp.sin(a) + b, lambda a, b: jax.lax.add(a, b)]

    def constraints(fn) -> int:
        jaxpr = jax.make_jaxpr(lambda a, b: quax.quaxify(fn)(a, b))(x, y)
        return [e.primitive.name for e in jaxpr.eqns].count("sharding_constraint")

    for fn in fns:
        assert constraints(fn) == 0
        assert constraints(fn) == 0  # replayed
        with qn.axis_mapping({"batch": "data"}, mesh):
            assert constraints(fn) > 0
            assert constraints(fn) > 0
        assert constraints(fn) == 0


TARGETS = r"""
import jax, jax.numpy as jnp, quax
import quax_named as qn
from jax.sharding import AxisType
from quax_named import NamedArray

mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
x = NamedArray(jnp.ones((4, 3)), ("batch", "feature"))
y = NamedArray(jnp.ones((4, 3)), ("batch", "feature"))

def constraints(jaxpr):
    # The mesh axes of every sharding constraint, sub-programs included.
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "sharding_constraint":
            found.append(tuple(eqn.params["sharding"].spec)[0])
        for param in eqn.params.values():
            sub = getattr(param, "jaxpr", param)
            if hasattr(sub, "eqns"):
                found += constraints(sub)
    return found

# The same function objects, traced under each mapping in turn.
positional = jax.jit(quax.quaxify(lambda a, b: jnp.sum(jnp.sin(a) * b, axis=1)))
by_name = jax.jit(lambda a, b: qn.sum(a * b, "feature").array)
eager = quax.quaxify(lambda a, b: jnp.sin(a) + b)
for target in ["data", "model", "data"]:
    with qn.axis_mapping({"batch": target}, mesh):
        for fn in (positional, by_name):
            found = constraints(fn.trace(x, y).jaxpr.jaxpr)
            assert found and set(found) == {target}, (target, found)
            out = fn(x, y)
            out = out.array if isinstance(out, NamedArray) else out
            assert tuple(out.sharding.spec)[0] == target, (target, out.sharding)
        found = constraints(jax.make_jaxpr(eager)(x, y).jaxpr)
        assert found and set(found) == {target}, (target, found)
        for _ in range(3):  # eager: first call, then compiled programs
            out = eager(*qn.shard((x, y)))
            assert tuple(out.array.sharding.spec)[0] == target, out.array.sharding
print("ok")
"""


def test_each_mapping_constrains_to_its_own_mesh_axes():
    """`axis_mapping`'s targets are part of every cache key, JAX's own included: a
    jitted function traced under `{"batch": "data"}` and then called under
    `{"batch": "model"}` constrains to `model` (it kept `data`'s constraints)."""
    out = quax.testing.run_on_simulated_devices(TARGETS, n=4, timeout=300)
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ([("batch", "data")], "`mapping` of `axis_mapping` must be a mapping"),
        ({"": "data"}, "must be a non-empty string"),
        ({"batch": 3}, "maps axis 'batch' to 3: a mesh axis is a non-empty string"),
        ({"batch": ("data", "")}, "maps axis 'batch' to \\('data', ''\\)"),
    ],
)
def test_axis_mapping_checks_its_mapping(mapping, match):
    with pytest.raises(ValueError, match=match), qn.axis_mapping(mapping):
        pass
    with qn.axis_mapping({"batch": ["data", "model"]}):
        assert qn.partition_spec(("batch",)) == P(("data", "model"))
