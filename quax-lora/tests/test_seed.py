"""The seed example of the issue, exactly as a new user runs it."""

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora


def test_seed_example():
    import quax.examples.lora as lora

    key1, key2, key3 = jr.split(jr.PRNGKey(0), 3)
    linear = eqx.nn.Linear(10, 12, key=key1)
    vector = jr.normal(key2, (10,))

    def run(model, x):
        return model(x)

    lora_weight = lora.LoraArray(linear.weight, rank=2, key=key3)
    lora_linear = eqx.tree_at(lambda lr: lr.weight, linear, lora_weight)
    out = quax.quaxify(run)(lora_linear, vector)
    lora_linear = lora.loraify(linear, rank=2, key=key3)

    assert lora is quax_lora
    assert out.shape == (12,)
    # `b` starts at zero: the adapted layer computes what the original did.
    np.testing.assert_allclose(out, linear(vector), rtol=1e-6, atol=1e-6)
    assert isinstance(lora_linear.weight, lora.LoraArray)
    np.testing.assert_array_equal(lora_linear.weight.w, linear.weight)
    np.testing.assert_array_equal(lora_linear.weight.b, jnp.zeros((2, 10)))


def test_constructor_fields():
    weight = jnp.ones((3, 5, 4))
    lora = quax_lora.LoraArray(weight, rank=2, scale=0.5, alpha=4.0, key=jr.PRNGKey(1))
    assert lora.shape == (3, 5, 4)
    assert lora.dtype == jnp.float32
    assert lora.w.shape == (3, 5, 4)
    assert lora.a.shape == (3, 5, 2)
    assert lora.b.shape == (3, 2, 4)
    assert lora.rank == 2
    assert lora.scaling == 2.0
    assert lora.batch_ndim == 1
    np.testing.assert_allclose(jnp.std(lora.a), 0.5, rtol=0.5)


@pytest.mark.parametrize(
    "weight, rank, match",
    [
        (jnp.ones(3), 1, "at least 2 axes"),
        (jnp.ones((3, 3)), 0, "rank >= 1"),
        (jnp.ones((3, 3), int), 1, "floating-point"),
    ],
)
def test_constructor_errors(weight, rank, match):
    with pytest.raises(ValueError, match=match):
        quax_lora.LoraArray(weight, rank=rank, key=jr.PRNGKey(0))
