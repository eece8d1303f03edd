"""Many adapters in one batch: a `LoraArray` stacking `k` adapters, each row of a
batch using its own (`index`), computes `w x + s a[k_i] (b[k_i] x)` with gathers of
the factors, in unmodified model code under `jit` and `vmap`; checked against the
same sum in plain JAX, and in the compiled program (no `k` dense weights)."""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
import quax_lora
from lora_helpers import normal


MLP = eqx.nn.MLP(16, 8, 32, depth=1, key=jr.key(0))
K, BATCH = 3, 10


def _tuned(perturb, i, **kwargs):
    model = quax_lora.loraify(MLP, rank=2, alpha=4.0, key=jr.key(1), **kwargs)
    return perturb(model, jr.key(10 + i))


def _call(model, x, i):
    return quax.quaxify(quax_lora.select_adapter(model, i))(x)


def _reference(models, x, i):
    """Row `x` through model `i`'s layers in plain JAX, each weight summed as
    `w + 2 a b` (scaling 4 / 2)."""
    layers = models[i].layers
    for j, layer in enumerate(layers):
        lora = layer.weight
        x = lora.w @ x + 2.0 * lora.a @ (lora.b @ x) + layer.bias
        if j < len(layers) - 1:
            x = jnp.maximum(x, 0.0)
    return x


def test_each_row_uses_its_adapter(perturb):
    models = [_tuned(perturb, i) for i in range(K)]
    multi = quax_lora.stack_adapters(models)
    assert multi.layers[0].weight.adapters == K
    assert multi.layers[0].weight.a.shape == (K, 32, 2)
    xs = normal(jr.key(2), (BATCH, 16))
    index = jnp.array([0, 2, 1, 1, 0, 2, 2, 0, 1, 0])
    out = eqx.filter_jit(jax.vmap(_call, in_axes=(None, 0, 0)))(multi, xs, index)
    want = np.stack(
        [_reference(models, x, int(i)) for x, i in zip(xs, index, strict=True)]
    )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # One row, one adapter, outside vmap.
    np.testing.assert_allclose(_call(multi, xs[1], 2), want[1], rtol=1e-5, atol=1e-5)
    # Taken out again: the model it came from.
    one = quax_lora.unstack_adapters(multi, 1)
    np.testing.assert_allclose(
        quax.quaxify(one)(xs[0]), quax.quaxify(models[1])(xs[0]), rtol=1e-6
    )
    # Its gradients reach only the rows' adapters.
    grads = eqx.filter_grad(
        lambda m: jnp.sum(jax.vmap(_call, in_axes=(None, 0, 0))(m, xs, index) ** 2)
    )(multi)
    assert np.all(np.abs(np.asarray(grads.layers[0].weight.b)).sum(axis=(1, 2)) > 0)


def test_no_dense_weights_in_the_compiled_program(perturb):
    multi = quax_lora.stack_adapters([_tuned(perturb, i) for i in range(K)])
    xs = jnp.ones((BATCH, 16))
    index = jnp.zeros((BATCH,), jnp.int32)
    call = eqx.filter_jit(jax.vmap(_call, in_axes=(None, 0, 0)))
    hlo = call.lower(multi, xs, index).compile().compiled.as_text()
    assert hlo is not None
    # The base weights are parameters of the dense shapes; no instruction computes
    # an array of those shapes, nor a stack of them (a TPU's prefetches and retilings
    # of a parameter only move its data).
    dense = [(32, 16), (8, 32)]
    stacked = [(k, n, m) for k in (K, BATCH) for n, m in dense]
    quax.testing.assert_hlo_lacks(
        hlo, shapes=dense + stacked, dtypes=["f32"], ignore_parameters=True
    )


def test_unselected_refuses_and_mismatched_stacks(perturb):
    multi = quax_lora.stack_adapters([_tuned(perturb, i) for i in range(2)])
    with pytest.raises(ValueError, match="select_adapter"):
        quax.quaxify(multi)(jnp.ones(16))
    other = quax_lora.loraify(MLP, rank=2, alpha=8.0, key=jr.key(1))
    with pytest.raises(ValueError, match="scaling"):
        quax_lora.stack_adapters([_tuned(perturb, 0), other])
    with pytest.raises(ValueError, match="one integer index"):
        quax_lora.select_adapter(multi, jnp.array([0, 1]))


def test_stacked_adapters_save_and_merge(perturb):
    models = [_tuned(perturb, i) for i in range(2)]
    multi = quax_lora.stack_adapters(models)
    f = io.BytesIO()
    quax_lora.save_adapter(f, multi)
    f.seek(0)
    loaded = quax_lora.load_adapter(f, multi)
    np.testing.assert_array_equal(loaded.layers[0].weight.a, multi.layers[0].weight.a)
    single = quax_lora.loraify(MLP, rank=2, alpha=4.0, key=jr.key(1))
    f.seek(0)
    with pytest.raises(ValueError, match="adapters"):
        quax_lora.load_adapter(f, single)
    merged = quax_lora.merge(quax_lora.select_adapter(multi, 1))
    np.testing.assert_allclose(
        merged(jnp.ones(16)), quax.quaxify(models[1])(jnp.ones(16)), rtol=1e-5
    )


def _dora_reference(models, x, i):
    """Row `x` through DoRA model `i`'s layers in plain JAX: each weight
    `m * v / ||v||` per row, with `v = w + 2 a b` (scaling 4 / 2)."""
    layers = models[i].layers
    for j, layer in enumerate(layers):
        lora = layer.weight
        v = lora.w + 2.0 * lora.a @ lora.b
        weight = lora.magnitude[:, None] * v / jnp.linalg.norm(v, axis=1)[:, None]
        x = weight @ x + layer.bias
        if j < len(layers) - 1:
            x = jnp.maximum(x, 0.0)
    return x


def test_dora_rows_use_their_adapters_magnitude(perturb):
    """Stacked DoRA adapters whose magnitudes differ: each row is scaled by its
    own adapter's magnitude, not adapter 0's."""

    def tuned(i):
        model = _tuned(perturb, i, variant="dora")
        return jax.tree.map(
            lambda x: (
                x.replace(magnitude=x.magnitude * (1.0 + 0.5 * i))
                if isinstance(x, quax_lora.LoraArray)
                else x
            ),
            model,
            is_leaf=quax_lora.is_lora,
        )

    models = [tuned(i) for i in range(K)]
    multi = quax_lora.stack_adapters(models)
    xs = normal(jr.key(3), (BATCH, 16))
    for i in range(1, K):
        want = _dora_reference(models, xs[0], i)
        np.testing.assert_allclose(_call(multi, xs[0], i), want, rtol=1e-5, atol=1e-5)
        alone = quax.quaxify(models[i])(xs[0])
        np.testing.assert_allclose(_call(multi, xs[0], i), alone, rtol=1e-5, atol=1e-6)
    index = jnp.array([1, 2, 0, 2, 1, 1, 0, 2, 2, 1])
    out = eqx.filter_jit(jax.vmap(_call, in_axes=(None, 0, 0)))(multi, xs, index)
    want = np.stack(
        [_dora_reference(models, x, int(i)) for x, i in zip(xs, index, strict=True)]
    )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_concrete_index_out_of_range_refuses(perturb):
    multi = quax_lora.stack_adapters([_tuned(perturb, i) for i in range(K)])
    for bad in (K, K + 5, -K - 1, np.int32(K), np.int64(-K - 2), jnp.array(K)):
        with pytest.raises(ValueError, match=rf"index -?\d+ is not in \[-{K}, {K}\)"):
            quax_lora.select_adapter(multi, bad)
    # A Python integer inside jit is still known, and refused.
    with pytest.raises(ValueError, match=rf"is not in \[-{K}, {K}\)"):
        jax.jit(lambda x: _call(multi, x, K))(jnp.ones(16))
    x = normal(jr.key(4), (16,))
    alone = [quax.quaxify(quax_lora.unstack_adapters(multi, j))(x) for j in range(K)]
    # Every index in range runs its adapter; a negative one counts from the end,
    # eagerly and under jit alike.
    traced = jax.jit(lambda i: _call(multi, x, i))
    for i, j in ((0, 0), (K - 1, K - 1), (np.int16(1), 1), (-1, K - 1), (-K, 0)):
        np.testing.assert_allclose(_call(multi, x, i), alone[j], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(traced(i), alone[j], rtol=1e-6, atol=1e-6)
    # A traced index outside [-K, K) cannot be checked: clamped, as documented.
    np.testing.assert_allclose(traced(K + 3), alone[K - 1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(traced(-K - 3), alone[0], rtol=1e-6, atol=1e-6)
