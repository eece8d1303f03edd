"""Shared helper of quax-lora's tests: random test data drawn by NumPy."""

from typing import Any

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np


def normal(key: Any, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """Standard normal numbers of `shape` and `dtype`, as `jax.random.normal(key,
    shape, dtype)` gives (other numbers, as random), drawn by NumPy from a seed read
    off `key`. `jax.random.normal` compiles a program (threefry) per shape and
    dtype, about a second each at LLVM's full optimisation, which this suite is
    compiled with (scripts/test.sh): most of some tests' time went there. The
    values under test (`LoraArray`'s own initialisation of `a` from its key) still
    come from `jax.random`.

    **Arguments:**

    - `key`: a `jax.random` key (typed, or a raw `uint32` one), or a NumPy seed
        (an integer or a sequence of them).
    - `shape`: the shape of the result.
    - `dtype`: its dtype (`float32` by default; `bfloat16` too).

    **Returns:**

    A JAX array.
    """
    if isinstance(key, jax.Array):
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jr.key_data(key)
        key = np.asarray(key).ravel().tolist()
    draw = np.random.default_rng(key).standard_normal(shape)
    return jnp.asarray(draw.astype(dtype))
