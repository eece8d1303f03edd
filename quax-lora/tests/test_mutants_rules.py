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
