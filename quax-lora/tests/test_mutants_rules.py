"""LoRA: tests that kill mutants of `quax_lora/_rules.py` which the other test files
let through (`scripts/mutation.sh lora-rules`; docs/mutation.md lists each surviving
mutant of the sample run and the test that kills it). References are plain JAX on
the dense weight, formed by hand from the factors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_lora
from jax import lax
from lora_helpers import normal


def test_a_product_with_a_non_scalar_materialises_where_allowed() -> None:
    # `w * c` with `c` a vector is not a scaling of the factors: where allowed, it
    # is the dense `(w + s a b) * c`, eagerly and under `jit` (mutant: the fallback
    # called with its parameters replaced by `None`).
    w = normal(jr.PRNGKey(0), (2, 6, 5))
    lora = quax_lora.LoraArray(
        w, rank=3, alpha=6.0, allow_materialise=True, key=jr.PRNGKey(1)
    )
    b = 0.1 * normal(jr.PRNGKey(2), lora.b.shape)
    lora = eqx.tree_at(lambda x: x.b, lora, b)
    c = jnp.array([1.0, -2.0, 0.5, 3.0, -0.25], jnp.float32)
    dense = np.asarray(w) + (6.0 / 3) * np.einsum("...ir,...rj->...ij", lora.a, b)
    want = dense * np.asarray(c)
    for product in (lambda x, y: x * y, lambda x, y: y * x):
        f = quax.quaxify(product)
        for run in (f, jax.jit(f)):
            np.testing.assert_allclose(run(lora, c), want, rtol=1e-5)


# The second sample (seed 46).


def test_dropout_drops_the_input_of_a_convolution_adapter_only(perturb) -> None:
    # An adapted `eqx.nn.Conv2d` with a dropout key: the adapter's convolution takes
    # the input dropped (each element kept with probability 1/2, by
    # `jax.random.bernoulli` of the layer's key, and doubled), the base's takes it
    # whole (mutant `_lora_conv` 27: the key dropped, so nothing was).
    conv = eqx.nn.Conv2d(3, 5, 3, key=jr.key(0))
    model = perturb(
        quax_lora.loraify(
            conv, rank=2, alpha=4.0, dropout=0.5, filter=eqx.nn.Conv, key=jr.key(1)
        ),
        jr.key(2),
    )
    key = jr.key(7)
    dropped = quax_lora.with_dropout_key(model, key)
    lora = model.weight
    x = normal(jr.key(3), (3, 7, 7))
    keep = jr.bernoulli(jr.fold_in(key, 0), 0.5, (1, 3, 7, 7))
    x_dropped = jnp.where(keep, x[None] / 0.5, 0.0)
    delta = (4.0 / 2) * jnp.einsum("or,rihw->oihw", lora.a, lora.b)
    base = eqx.tree_at(lambda c: c.weight, model, lora.w)
    want = base(x) + lax.conv_general_dilated(x_dropped, delta, (1, 1), "VALID")[0]
    f = quax.quaxify(lambda m, x: m(x))
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(dropped, x), want, rtol=1e-5, atol=1e-5)
    plain = base(x) + lax.conv_general_dilated(x[None], delta, (1, 1), "VALID")[0]
    assert not np.allclose(want, plain, rtol=1e-3, atol=1e-3)
