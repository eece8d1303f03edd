"""A tour of quax and its families: the main job of this repository.

Run with `bash scripts/demo.sh` (it builds the environment first).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import quax


def section(title: str) -> None:
    print(f"\n== {title}")


def lora_tour() -> None:
    section("LoRA: fine-tune an Equinox model without touching its code")
    import quax.examples.lora as lora

    key1, key2, key3 = jr.split(jr.PRNGKey(0), 3)
    linear = eqx.nn.Linear(10, 12, key=key1)
    vector = jr.normal(key2, (10,))

    def run(model, x):
        return model(x)

    lora_weight = lora.LoraArray(linear.weight, rank=2, key=key3)
    lora_linear = eqx.tree_at(lambda lin: lin.weight, linear, lora_weight)
    out = quax.quaxify(run)(lora_linear, vector)
    print("LoRA linear output:", out.shape, "==", run(linear, vector).shape)

    mlp = eqx.nn.MLP(16, 4, width_size=32, depth=2, key=key1)
    lora_mlp = lora.loraify(mlp, rank=4, key=key3)
    x = jr.normal(key2, (16,))
    y = eqx.filter_jit(quax.quaxify(lambda m, v: m(v)))(lora_mlp, x)
    print("loraified MLP, jitted:", y)
    print("parameters:", lora.count_parameters(lora_mlp))
    merged = lora.merge(lora_mlp)
    print("merged model agrees:", bool(jnp.allclose(merged(x), y, atol=1e-5)))


def units_tour() -> None:
    section("Units: checked at trace time, free at run time")
    from quax_units import Quantity, UnitError, ustrip

    @jax.jit
    @quax.quaxify
    def kinetic_energy(m, v):
        return 0.5 * m * v**2

    e = kinetic_energy(Quantity(2.0, "kg"), Quantity(jnp.array([3.0, 4.0]), "km / s"))
    print("kinetic energy:", ustrip("kJ", e), "kJ")
    try:
        quax.quaxify(lambda a, b: a + b)(Quantity(1.0, "m"), Quantity(1.0, "s"))
    except UnitError as e:
        print("adding metres to seconds fails at trace time:", str(e).splitlines()[0])

    # An unchanged program that records a fall into a buffer of plain zeros: the
    # buffer takes the units written into it.
    def fall(height, g, dt):
        def step(i, state):
            h, v, record = state
            v = v - g * dt
            h = h + v * dt
            return h, v, record.at[i].set(h)

        return jax.lax.fori_loop(0, 4, step, (height, 0 * g * dt, jnp.zeros(4)))[2]

    heights = jax.jit(quax.quaxify(fall))(
        Quantity(10.0, "m"), Quantity(9.81, "m / s2"), Quantity(0.1, "s")
    )
    print("recorded heights:", ustrip("cm", heights), "cm")

    # diffrax, unchanged, with its defaults: a Quantity state, a Quantity out.
    import diffrax

    def decay(y0, rate):
        term = diffrax.ODETerm(lambda t, y, k: -k * y)
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 1.0, 0.1, y0, rate).ys

    y1 = jax.jit(quax.quaxify(decay))(Quantity(jnp.array([1.0, 2.0]), "mol / L"), 0.5)
    print("diffrax decay, y(1):", ustrip("mmol / L", y1), "mmol/L")


def zero_tour() -> None:
    section("Symbolic zeros: structure that costs nothing")
    from quax.zero import Zero

    z = Zero((3,), jnp.float32)
    out = quax.quaxify(lambda a, b: a * b + b)(z, jnp.arange(3.0))
    print("Zero * x + x ->", out)
    print(jax.make_jaxpr(quax.quaxify(lambda a, b: a * b))(z, jnp.arange(3.0)))


def introspection_tour() -> None:
    section("Introspection: installed families and materialisation reports")
    for family in quax.plugins.summarise():
        print(
            f"{family.name}: {family.distribution} {family.version}, "
            f"{family.num_rules} rules over {len(family.primitives)} primitives"
        )
    import quax.examples.lora as lora

    w = lora.LoraArray(
        jnp.ones((4, 4)), rank=1, allow_materialise=True, key=jr.PRNGKey(0)
    )
    report = quax.plugins.materialisations(lambda a: jnp.tanh(a) @ jnp.ones(4), w)
    print(report)


if __name__ == "__main__":
    lora_tour()
    units_tour()
    zero_tour()
    introspection_tour()
