"""The kernels (`quax_quant._kernels`): int4 packing, on plain arrays."""

import jax.numpy as jnp
import numpy as np
import quax.testing.strategies as qst
import quax_quant as qq
from hypothesis import given, settings, strategies as st


def test_int4_packing_literal():
    values = jnp.array([[-8, 7, 1, -1, 0]], jnp.int8)
    packed = qq.pack_int4(values)
    # byte i: element i in the low nibble, element i + 3 in the high nibble
    # (the last axis padded with a zero to 6).
    assert packed.dtype == jnp.int8 and packed.shape == (1, 3)
    expected = [(0x8 | 0xF << 4), (0x7 | 0x0 << 4), 0x1]
    np.testing.assert_array_equal(np.asarray(packed).view(np.uint8)[0], expected)
    np.testing.assert_array_equal(qq.unpack_int4(packed, 5), values)


@settings(max_examples=20, deadline=None)
@given(
    shape=qst.shapes(min_dims=1, max_dims=3, max_side=7),
    data=st.data(),
)
def test_int4_packing_round_trip(shape, data):
    """Every signed 4-bit integer, any last-axis length (odd ones padded): unpacking
    the packed bytes gives the integers back, and each byte holds element `i` in
    its low nibble and element `i + ceil(n / 2)` in its high one (NumPy bits)."""
    ints = np.asarray(
        data.draw(qst.arrays(shape, jnp.int32, min_value=-8, max_value=7)), np.int8
    )
    packed = np.asarray(qq.pack_int4(jnp.asarray(ints)))
    n = shape[-1]
    half = (n + 1) // 2
    assert packed.shape == (*shape[:-1], half) and packed.dtype == np.int8
    padded = np.concatenate([ints, np.zeros((*shape[:-1], 2 * half - n), np.int8)], -1)
    low = ((packed.view(np.uint8) & 0xF) ^ 8).astype(np.int16) - 8
    high = (((packed.view(np.uint8) >> 4) & 0xF) ^ 8).astype(np.int16) - 8
    np.testing.assert_array_equal(low, padded[..., :half])
    np.testing.assert_array_equal(high, padded[..., half:])
    np.testing.assert_array_equal(qq.unpack_int4(jnp.asarray(packed), n), ints)
