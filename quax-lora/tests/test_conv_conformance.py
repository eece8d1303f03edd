"""A LoRA convolution kernel through the conformance kit, and under `jax.vmap`
over inputs (factored) and over kernels (refused, by name)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
import quax_lora
from jax import lax


def _kernel() -> Any:
    kw, ka, kb = jr.split(jr.key(0), 3)
    # alpha 6, rank 2: the update is scaled by 3.
    lora = quax_lora.LoraArray(
        jr.normal(kw, (4, 3, 3)), rank=2, alpha=6.0, batch_ndim=0, key=ka
    )
    return eqx.tree_at(lambda lr: lr.b, lora, jr.normal(kb, lora.b.shape))


def _conv(kernel: Any, x: Any) -> Any:
    return lax.conv_general_dilated(x, kernel, (1,), "SAME")


def test_conv_conforms() -> None:
    x = jr.normal(jr.key(1), (2, 3, 9))
    # The kit's vmap batches the kernel too (one kernel per batch element): see
    # the two tests below for vmap over the inputs, and over kernels.
    quax.testing.assert_matches_dense(_conv, _kernel(), x, vmap=False)


def test_conv_vmap_over_inputs() -> None:
    kernel = _kernel()
    xs = jr.normal(jr.key(1), (5, 2, 3, 9))
    dense = kernel.w + 3.0 * jnp.einsum("or,rik->oik", kernel.a, kernel.b)
    expected = jax.vmap(lambda v: _conv(dense, v))(xs)
    for fn in (
        jax.vmap(quax.quaxify(_conv), in_axes=(None, 0)),
        quax.quaxify(jax.vmap(_conv, in_axes=(None, 0))),
    ):
        np.testing.assert_allclose(fn(kernel, xs), expected, rtol=1e-4, atol=1e-4)


def test_conv_vmap_over_kernels_refuses() -> None:
    # JAX batches a convolution over kernels as one grouped convolution of the
    # reshaped kernels, which a LoRA kernel does not factor: refused, by name.
    kernels = jax.tree.map(lambda leaf: jnp.stack([leaf, leaf]), _kernel())
    x = jr.normal(jr.key(1), (2, 3, 9))
    with pytest.raises(
        RuntimeError, match=r"Refusing to materialise `LoraArray`.*reshape"
    ):
        quax.quaxify(jax.vmap(_conv, in_axes=(0, None)))(kernels, x)
