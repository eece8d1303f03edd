"""End to end: fine-tune a small MLP with optax; only `a` and `b` change."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import quax
import quax_lora
from lora_helpers import normal


def test_finetune_mlp():
    kmodel, kdata, klora, ktarget = jr.split(jr.PRNGKey(0), 4)
    mlp = eqx.nn.MLP(4, 1, 32, depth=2, key=kmodel)
    # A synthetic task the base model does not solve: a random smooth function.
    target = eqx.nn.MLP(4, 1, 8, depth=1, activation=jnp.tanh, key=ktarget)
    xs = normal(kdata, (256, 4))
    ys = jax.vmap(target)(xs)

    model = quax_lora.loraify(mlp, rank=4, alpha=8.0, key=klora)
    params, frozen = eqx.partition(model, quax_lora.trainable_filter(model))
    optimiser = optax.adam(1e-2)
    opt_state = optimiser.init(params)

    @quax.quaxify
    def loss(model, xs, ys):
        return jnp.mean((jax.vmap(model)(xs) - ys) ** 2)

    @eqx.filter_jit
    def step(params, opt_state):
        value, grads = jax.value_and_grad(
            lambda p: loss(eqx.combine(p, frozen), xs, ys)
        )(params)
        updates, opt_state = optimiser.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    initial = float(loss(model, xs, ys))
    for _ in range(150):
        params, opt_state, _ = step(params, opt_state)
    tuned = eqx.combine(params, frozen)
    final = float(loss(tuned, xs, ys))
    assert final < 0.2 * initial

    loras = [
        x
        for x in jax.tree.leaves(tuned, is_leaf=quax_lora.is_lora)
        if quax_lora.is_lora(x)
    ]
    originals = [
        x
        for x in jax.tree.leaves(model, is_leaf=quax_lora.is_lora)
        if quax_lora.is_lora(x)
    ]
    for new, old in zip(loras, originals, strict=True):
        np.testing.assert_array_equal(new.w, old.w)  # the base weights never move
        assert not np.allclose(new.b, old.b) and not np.allclose(new.a, old.a)
    # Biases and everything else outside the adapter are unchanged too.
    rest = lambda m: eqx.filter(m, quax_lora.trainable_filter(m), inverse=True)
    for new, old in zip(
        jax.tree.leaves(rest(tuned)), jax.tree.leaves(rest(model)), strict=True
    ):
        if eqx.is_array(new):
            np.testing.assert_array_equal(new, old)
    # The merged model computes the same thing, without quax.
    merged = quax_lora.merge(tuned)
    np.testing.assert_allclose(
        jax.vmap(merged)(xs), jax.vmap(quax.quaxify(tuned))(xs), rtol=1e-4, atol=1e-5
    )
