"""`QuantisedArray`: what its constructor accepts, and what it reports."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_quant as qq


def _array(values, scale=None, **kwargs):
    scale = jnp.ones((1,) * np.ndim(values)) if scale is None else scale
    kwargs = {"bits": 8, "float_dtype": np.float32, **kwargs}
    return qq.QuantisedArray(values, scale, None, None, **kwargs)


def test_values_must_be_integers():
    """Float values were accepted and then read two ways: as given by the
    weight-only product, truncated by the int8 one (10.0 at one row, 8.0 at 8)."""
    for values in (jnp.array([[1.5, 2.7]]), np.array([[2.0, 3.0]], np.float32)):
        with pytest.raises(
            ValueError, match="QuantisedArray's values must be integers"
        ):
            _array(values)
    with pytest.raises(ValueError, match="values must be integers, got bool"):
        _array(jnp.array([[True, False]]))
    # Traced values are checked too (the dtype is known under jit).
    with pytest.raises(ValueError, match="values must be integers, got float32"):
        jax.jit(_array)(jnp.ones((2, 2)))


def test_values_must_lie_in_the_bit_range():
    with pytest.raises(ValueError, match=r"values must lie in \[-128, 127\].*200"):
        _array(jnp.array([[1, 200]], jnp.int32))
    with pytest.raises(ValueError, match=r"\[-129, 3\]"):
        _array(np.array([[-129, 3]], np.int64))
    with pytest.raises(ValueError, match="values must be int8 for bits=4"):
        _array(jnp.array([[1, 2]], jnp.int32), bits=4)
    with pytest.raises(ValueError, match="values need an axis to pack along"):
        _array(jnp.array(3, jnp.int8), jnp.ones(()), bits=4)
    with pytest.raises(ValueError, match="odd and packed_axis describe bits=4"):
        _array(jnp.array([[1, 2]], jnp.int8), odd=True)


def test_wider_integer_storage_reads_as_int8():
    """int32 values in range are the same array as int8 ones: both products, at
    one row and at eight, give what the int8 storage gives."""
    ints = np.array([[10, -3, 7], [127, -128, 0]])
    scale = jnp.array([[0.5], [0.25]])
    x = jnp.asarray(np.arange(24, dtype=np.float32).reshape(8, 3) / 7)
    for path in ("weight_only", "int8"):
        wide = _array(jnp.asarray(ints, jnp.int32), scale, matmul=path)
        narrow = _array(jnp.asarray(ints, jnp.int8), scale, matmul=path)
        assert wide.integers().dtype == jnp.int8
        for rows in (1, 8):
            f = jax.jit(quax.quaxify(lambda x, w: x @ w.T))
            np.testing.assert_array_equal(f(x[:rows], wide), f(x[:rows], narrow))
        # The dequantised array from the literals.
        np.testing.assert_allclose(
            wide.dequantise(), ints * np.array([[0.5], [0.25]]), rtol=0, atol=0
        )


def test_nbytes_counts_every_storage_dtype_and_packing():
    ints = np.zeros((4, 6), np.int64)
    scale = jnp.ones((4, 1), jnp.float32)
    for dtype, itemsize in ((np.int8, 1), (np.int16, 2), (np.int32, 4)):
        q = _array(jnp.asarray(ints, dtype), scale)
        assert q.nbytes == 24 * itemsize + 4 * 4
    # int4, odd last axis: (4, 5) packs into (4, 3) bytes; bfloat16 scales in groups.
    packed = qq.pack_int4(jnp.zeros((4, 5), jnp.int8))
    q = qq.QuantisedArray(
        packed,
        jnp.ones((4, 1), jnp.bfloat16),
        jnp.zeros((4, 1), jnp.bfloat16),
        None,
        bits=4,
        float_dtype=jnp.bfloat16,
        odd=True,
    )
    assert q.shape == (4, 5) and q.nbytes == 12 + 4 * 2 + 4 * 2
    # memory_report reads nbytes: int32 storage saves nothing over float32.
    wide = _array(jnp.asarray(ints, jnp.int32), scale)
    report = qq.memory_report({"w": wide})
    assert report.quantised_bytes == 24 * 4 + 16 and report.float_bytes == 24 * 4


def test_leaves_are_checked():
    values = jnp.zeros((4, 6), jnp.int8)
    with pytest.raises(ValueError, match="scale must be floating-point, got int32"):
        _array(values, jnp.ones((4, 1), jnp.int32))
    with pytest.raises(ValueError, match="zero_point must be floating-point"):
        qq.QuantisedArray(
            values,
            jnp.ones((4, 1)),
            jnp.ones((4, 1), jnp.int32),
            None,
            bits=8,
            float_dtype=np.float32,
        )
    with pytest.raises(ValueError, match=r"master .* must have the array's shape"):
        qq.QuantisedArray(
            values,
            jnp.ones((4, 1)),
            None,
            jnp.ones((4, 5)),
            bits=8,
            float_dtype=np.float32,
        )


def test_scale_zero_point_and_float_dtype_are_checked():
    x = jnp.ones((4, 6))
    q = qq.quantise(x)
    with pytest.raises(ValueError, match="scale must have one axis per array axis"):
        qq.QuantisedArray(
            q.values, jnp.ones((3, 1)), None, None, bits=8, float_dtype=np.float32
        )
    with pytest.raises(ValueError, match="zero_point must have the scale's shape"):
        qq.QuantisedArray(
            q.values, q.scale, jnp.ones((4, 6)), None, bits=8, float_dtype=np.float32
        )
    with pytest.raises(ValueError, match="floating float_dtype"):
        qq.QuantisedArray(q.values, q.scale, None, None, bits=8, float_dtype=np.int8)
