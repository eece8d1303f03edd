"""`alpha` given as a concrete JAX scalar (say read from a config array) was kept
as it was in a static field: building the array warned that a JAX array was set as
static (an error under the test settings) and `jax.jit` of a product failed
(`TracerBoolConversionError`) when comparing it (both seen before the fix). It is
stored as a Python float now. The reference is the dense `w + alpha / rank * a @ b`
in plain JAX."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
from quax_lora import LoraArray


W = jnp.linspace(-1.0, 1.0, 24).reshape(4, 6)
X = jnp.arange(6.0)


@pytest.mark.parametrize(
    "alpha", [jnp.float32(16.0), np.float32(16.0), 16, 16.0], ids=repr
)
def test_alpha_as_a_concrete_scalar_scales_the_update(alpha):
    lora = LoraArray(W, rank=2, alpha=alpha, key=jr.key(0))
    lora = eqx.tree_at(lambda m: m.b, lora, jnp.ones((2, 6)))
    want = (W + 16.0 / 2 * lora.a @ lora.b) @ X
    product = quax.quaxify(lambda w: w @ X)
    for run in (product, jax.jit(product), eqx.filter_jit(product)):
        np.testing.assert_allclose(run(lora), want, rtol=1e-5, atol=1e-5)
    assert type(lora.alpha) is float and lora.alpha == 16.0


def test_traced_alpha_is_refused_naming_it():
    build = jax.jit(lambda a: LoraArray(W, rank=2, alpha=a, key=jr.key(0)).a)
    with pytest.raises(ValueError, match="alpha"):
        build(16.0)
