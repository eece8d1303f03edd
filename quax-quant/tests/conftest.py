"""Independent references for quax-quant's tests: dequantisation in NumPy from the
stored leaves (its own bit unpacking), the same in plain JAX (differentiable, for
`quax.testing.assert_matches_dense`'s `densify`), and a dense comparison helper."""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
import quax_quant as qq


def np_integers(q) -> np.ndarray:
    """The integers of a QuantisedArray, unpacked with NumPy bit operations."""
    v = np.asarray(q.values).astype(np.int16)
    if q.bits == 8:
        return v
    v = np.moveaxis(v, q.packed_axis, -1)
    low = ((v & 0xF) ^ 8) - 8
    high = (((v >> 4) & 0xF) ^ 8) - 8
    both = np.concatenate([low, high], axis=-1)
    return np.moveaxis(both[..., : q.shape[q.packed_axis]], -1, q.packed_axis)


def np_blocks(block: np.ndarray, shape) -> np.ndarray:
    """A per-block array repeated to `shape`: `n` blocks along an axis of length
    `d` hold `ceil(d / n)` consecutive entries each, the last one cut short where
    that does not divide `d` (NF4 in blocks that do not divide the axis)."""
    block = np.asarray(block, np.float64)
    for a, d in enumerate(shape):
        block = np.repeat(block, -(-d // block.shape[a]), axis=a)
        block = np.take(block, np.arange(d), axis=a)
    return block


def np_levels(q) -> np.ndarray:
    """The levels of a QuantisedArray in float64: the integers, the NF4 levels of
    the integers plus 8, or the float8 numbers (converted by NumPy / ml_dtypes)."""
    if q.format.startswith("float8"):
        return np.asarray(q.values).astype(np.float64)
    ints = np_integers(q)
    if q.format == "nf4":
        return np.asarray(qq.NF4_CODE, np.float64)[ints + 8]
    return ints.astype(np.float64)


def np_dequantise(q) -> np.ndarray:
    ints = np_levels(q)
    if q.zero_point is not None:
        ints = ints - np_blocks(q.zero_point, q.shape)
    out = ints * np_blocks(np.asarray(jnp_scale(q.scale)), q.shape)
    if q.input_order is not None:  # stored column j is column input_order[j]
        out[..., np.asarray(q.input_order)] = out.copy()
    return out


def jnp_dequantise(q):
    """The float array of a QuantisedArray in plain JAX, from its leaves, with the
    bit unpacking and block repetition written here (not the family's): a
    differentiable reference for `quax.testing.assert_matches_dense`."""
    v = jnp.asarray(q.values).astype(jnp.int32)
    if q.bits == 4:
        v = jnp.moveaxis(v, q.packed_axis, -1)
        low = ((v & 0xF) ^ 8) - 8
        high = (((v >> 4) & 0xF) ^ 8) - 8
        both = jnp.concatenate([low, high], axis=-1)
        v = jnp.moveaxis(both[..., : q.shape[q.packed_axis]], -1, q.packed_axis)

    def blocks(block):
        for a, d in enumerate(q.shape):
            block = jnp.repeat(block, -(-d // block.shape[a]), axis=a)
            block = jnp.take(block, jnp.arange(d), axis=a)
        return block

    if q.format.startswith("float8"):
        levels = jnp.asarray(q.values).astype(q.float_dtype)
    elif q.format == "nf4":
        code = jnp.asarray(qq.NF4_CODE, q.float_dtype)
        levels = code[v + 8]
    else:
        levels = v.astype(q.float_dtype)
    if q.zero_point is not None:
        levels = levels - blocks(q.zero_point)
    out = levels * blocks(jnp_scale(q.scale))
    if q.input_order is not None:  # stored column j is column input_order[j]
        out = out.at[..., q.input_order].set(out)
    return out


def jnp_scale(scale):
    """A scale as floats: a double-quantised one (`QuantisedScale`) from its int8
    codes, one float32 scale per block of `block_size` consecutive (row-major)
    codes, plus the offset, then transposed by its `permutation`; written here,
    not the family's. A stack of them (leading batch axes, the offset's shape)
    takes each stacked scale's own block scales and offset."""
    if not hasattr(scale, "codes"):
        return scale
    batch = jnp.shape(scale.offset)
    flat = jnp.reshape(scale.codes, (*batch, -1)).astype(jnp.float32)
    block = jnp.arange(flat.shape[-1]) // scale.block_size
    offset = jnp.reshape(scale.offset, (*batch, 1))
    out = flat * scale.block_scale[..., block] + offset
    out = out.reshape(scale.codes.shape).astype(scale.float_dtype)
    # A transposed one keeps its codes in place: transpose them here.
    return out if scale.permutation is None else jnp.transpose(out, scale.permutation)


# As one compiled program per layout and shape, kept across calls (its static
# fields held by `eqx.filter_jit`), also where the conformance kit's transforms
# trace it: op by op, its repeats, takes and bit operations compiled one program
# each for every new shape the property tests draw. With the kit's own densifying
# compiled too, `test_structural_operations_match_dense` took 23.7 s of CPU, against
# 31.2 to 31.8 s before either (one process, seed 0, the same machine and hour).
_jitted_dequantise = eqx.filter_jit(jnp_dequantise)


def densify(tree):
    """`tree` with every QuantisedArray replaced by `jnp_dequantise` of it (compiled:
    the same operations, the same values)."""
    return jax.tree.map(
        lambda x: _jitted_dequantise(x) if hasattr(x, "bits") else x,
        tree,
        is_leaf=lambda x: hasattr(x, "bits"),
    )


def assert_matches_dense(fn, *args, rtol=1e-5, atol=1e-5, jit=True):
    """`quax.quaxify(fn)(*args)` against `fn` on the dequantised arguments (NumPy
    reference), eagerly and under `jax.jit`; nothing may be materialised."""
    dense = [
        jnp.asarray(np_dequantise(a), a.dtype) if hasattr(a, "bits") else a
        for a in args
    ]
    expected = fn(*dense)
    runs: list[Callable[..., Any]] = [quax.quaxify(fn)]
    if jit:
        runs.append(jax.jit(quax.quaxify(fn)))
    for run in runs:
        with quax.track_materialisation() as report:
            out = run(*args)
        assert not report, str(report)
        assert out.shape == expected.shape and out.dtype == expected.dtype
        np.testing.assert_allclose(out, expected, rtol=rtol, atol=atol)
    return expected


@pytest.fixture(scope="session")
def matches_dense():
    return assert_matches_dense


class _Reference:
    integers = staticmethod(np_integers)
    blocks = staticmethod(np_blocks)
    dequantise = staticmethod(np_dequantise)
    jnp_dequantise = staticmethod(jnp_dequantise)
    densify = staticmethod(densify)


@pytest.fixture(scope="session")
def ref():
    return _Reference


@pytest.fixture
def transformer_block():
    """`Block(d, hidden, key)`: a small pre-norm transformer block of
    `eqx.nn.Linear` and `eqx.nn.LayerNorm` layers (one attention head, a GELU MLP)
    for the calibrated quantisers' tests."""
    return Block


class Block(eqx.Module):
    """A pre-norm transformer block: one attention head, a GELU MLP."""

    norm1: eqx.nn.LayerNorm
    q: eqx.nn.Linear
    k: eqx.nn.Linear
    v: eqx.nn.Linear
    o: eqx.nn.Linear
    norm2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __init__(self, d, hidden, key):
        keys = jr.split(key, 6)
        self.norm1, self.norm2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (eqx.nn.Linear(d, d, key=k) for k in keys[:4])
        self.fc1 = eqx.nn.Linear(d, hidden, key=keys[4])
        self.fc2 = eqx.nn.Linear(hidden, d, key=keys[5])

    def __call__(self, x):  # (tokens, d)
        h = jax.vmap(self.norm1)(x)
        q, k, v = (jax.vmap(f)(h) for f in (self.q, self.k, self.v))
        a = jax.nn.softmax(q @ k.T / math.sqrt(q.shape[-1]), axis=-1) @ v
        x = x + jax.vmap(self.o)(a)
        h = jax.vmap(self.norm2)(x)
        return x + jax.vmap(self.fc2)(jax.nn.gelu(jax.vmap(self.fc1)(h)))


@pytest.fixture
def x64():
    """float64 for one test. The global flag, not the thread-local
    `jax.enable_x64` context: JAX converts a host callback's arguments in its
    own thread, which that context does not reach (the Gram matrices the
    calibration sends to the host would arrive as float32)."""
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)
