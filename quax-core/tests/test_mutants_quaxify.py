"""Tests written for mutants of `quax/_transform/_quaxify.py` that a sampled run of
`scripts/mutation.sh transform-quaxify` let through (see `docs/mutation.md`), each
failing with its mutant planted."""

import jax
import jax.numpy as jnp
import pytest
import quax
from quax.zero import Zero


def test_a_leafless_value_out_of_vmap_is_refused() -> None:
    """`jax.vmap` of a quaxified function returning a value without array leaves
    (a `Zero`) would keep the per-example shape: refused, saying where to put the
    vmap (mutant `_check_batchable` 6 never refused)."""
    f = quax.quaxify(lambda z, x: z * x)
    with pytest.raises(ValueError, match=r"returned a Zero float32\[3\], which has no"):
        jax.vmap(f, in_axes=(None, 0))(Zero((3,), jnp.float32), jnp.ones((2, 3)))
    # Inside quaxify, the rules see the batch: a Zero of the batched shape.
    out = quax.quaxify(jax.vmap(lambda z, x: z * x, in_axes=(None, 0)))(
        Zero((3,), jnp.float32), jnp.ones((2, 3))
    )
    assert isinstance(out, Zero) and out.shape == (2, 3)
