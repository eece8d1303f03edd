"""The public int4 packing functions accepted inputs they then read wrongly:
`pack_int4` kept the low four bits of integers outside `[-8, 7]` (9 unpacked as
-7) and truncated floats (2.7 unpacked as 2); `unpack_int4(packed, n)` with an `n`
other than the packed length read other elements (byte `i` holds element `i +
ceil(n / 2)` in its high bits). They are refused now, naming the way out.
References are literals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax_quant as qq


@pytest.mark.parametrize("values", [[9, 0], [-9, 1], [0, 127]])
def test_integers_outside_four_bits_are_refused(values):
    with pytest.raises(ValueError, match=r"in \[-8, 7\].*jnp\.clip"):
        qq.pack_int4(jnp.asarray(values, jnp.int32))


def test_floats_are_refused():
    with pytest.raises(ValueError, match=r"packs integers; got float32.*round"):
        qq.pack_int4(jnp.array([2.7, -1.0]))


def test_in_range_integers_of_any_dtype_round_trip():
    for dtype in (jnp.int8, jnp.int32, jnp.uint8):
        values = jnp.asarray([7, 0, 3], dtype)
        np.testing.assert_array_equal(
            qq.unpack_int4(qq.pack_int4(values), 3), [7, 0, 3]
        )


def test_traced_integers_keep_their_low_bits():
    # Under `jit` the values cannot be checked, as documented.
    packed = jax.jit(qq.pack_int4)(jnp.array([9, 1], jnp.int32))
    np.testing.assert_array_equal(qq.unpack_int4(packed, 2), [-7, 1])


@pytest.mark.parametrize("n", [4, 7, 2])
def test_unpacking_another_length_is_refused(n):
    packed = qq.pack_int4(jnp.arange(6, dtype=jnp.int8) - 3)  # 3 bytes
    with pytest.raises(ValueError, match=r"n=.* for 3 bytes.*\(5 or 6\)"):
        qq.unpack_int4(packed, n)


def test_unpacking_the_packed_lengths():
    values = jnp.array([[-3, -2, -1, 0, 1, 2]], jnp.int8)
    packed = qq.pack_int4(values)
    np.testing.assert_array_equal(qq.unpack_int4(packed, 6), values)
    np.testing.assert_array_equal(
        qq.unpack_int4(qq.pack_int4(values[:, :5]), 5), values[:, :5]
    )


def test_unpacking_needs_the_packed_bytes():
    with pytest.raises(ValueError, match=r"int8 bytes"):
        qq.unpack_int4(jnp.zeros((2,), jnp.int32), 4)
    with pytest.raises(ValueError, match=r"n >= 0"):
        qq.unpack_int4(jnp.zeros((2,), jnp.int8), -1)
