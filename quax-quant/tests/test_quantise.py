import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
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


def test_per_tensor_literal():
    x = jnp.array([[1.0, -2.0], [0.5, 0.25]])
    q = qq.quantise(x)
    np.testing.assert_allclose(q.scale, [[2.0 / 127]])
    np.testing.assert_array_equal(q.values, [[64, -127], [32, 16]])
    assert q.shape == (2, 2) and q.dtype == jnp.float32 and q.zero_point is None


def test_asymmetric_literal():
    x = jnp.array([0.0, 1.0, 2.0, 3.0])
    q = qq.quantise(x, bits=4, symmetric=False)
    # range [0, 3] on 16 levels: scale 3 / 15, zero point -8
    np.testing.assert_allclose(q.scale, [0.2])
    np.testing.assert_allclose(q.zero_point, [-8.0])
    np.testing.assert_allclose(q.dequantise(), x, atol=1e-6)


layouts = st.sampled_from(
    [
        {},
        {"axis": 0},
        {"axis": 1},
        {"axis": (0, 1)},
        {"group_size": 4},
        {"group_size": 8},
        {"group_size": 4, "group_axis": 0},
    ]
)


@settings(max_examples=10, deadline=None)
@given(
    layout=layouts,
    bits=st.sampled_from([8, 4]),
    symmetric=st.booleans(),
    n=st.just(8),
    m=st.sampled_from([8, 24]),
    seed=st.integers(0, 2**16),
)
def test_error_bound(layout, bits, symmetric, n, m, seed, ref):
    x = jr.normal(jr.PRNGKey(seed), (n, m)) * 3
    q = qq.quantise(x, bits=bits, symmetric=symmetric, **layout)
    deq = ref.dequantise(q)
    np.testing.assert_allclose(q.dequantise(), deq, rtol=1e-6, atol=1e-6)
    # Rounding to the nearest level: at most half a step per element.
    step = ref.blocks(q.scale, q.shape)
    assert np.all(np.abs(deq - np.asarray(x)) <= step / 2 + 1e-5)
    ints = ref.integers(q)
    hi = 2 ** (bits - 1) - 1
    lo = -hi if symmetric else -(hi + 1)
    assert ints.min() >= lo and ints.max() <= hi
    # The block layout follows the arguments.
    if "group_size" in layout:
        axis = layout.get("group_axis", -1) % 2
        assert q.group_sizes[axis] == layout["group_size"]
        assert q.group_sizes[1 - axis] == 1
    # Smaller groups, smaller steps.
    assert q.nbytes == int(np.size(q.values)) + q.scale.size * 4 * (
        1 if symmetric else 2
    )


def test_group_size_shrinks_error():
    x = jr.normal(jr.PRNGKey(0), (32, 256)) * jnp.linspace(0.1, 10, 256)
    errors = [
        float(
            jnp.mean(jnp.square(qq.quantise(x, bits=4, group_size=g).dequantise() - x))
        )
        for g in (256, 64, 16)
    ]
    assert errors[0] > errors[1] > errors[2]
    e8 = float(jnp.mean(jnp.square(qq.quantise(x, group_size=16).dequantise() - x)))
    assert e8 < errors[2] / 64


def test_activation_calibration_clips_outliers():
    x = jr.normal(jr.PRNGKey(1), (4096,))
    x = x.at[0].set(200.0)  # one outlier
    err = {}
    for calibration in ("absmax", "percentile", "mse"):
        q = qq.quantise(x, calibration=calibration)
        err[calibration] = float(jnp.mean(jnp.square(q.dequantise() - x)[1:]))
    assert err["percentile"] < err["absmax"] / 10
    assert err["mse"] < err["absmax"] / 10
    q = qq.quantise(x, calibration="percentile", percentile=99.0)
    assert float(q.scale[0]) == pytest.approx(
        float(jnp.percentile(jnp.abs(x), 99.0)) / 127, rel=1e-5
    )


def test_odd_int4_and_bf16():
    x = jr.normal(jr.PRNGKey(2), (3, 5), jnp.bfloat16)
    q = qq.quantise(x, bits=4, axis=0)
    assert q.values.shape == (3, 3) and q.shape == (3, 5) and q.dtype == jnp.bfloat16
    assert q.dequantise().dtype == jnp.bfloat16
    step = np.asarray(q.scale, np.float32)
    err = np.abs(np.asarray(q.dequantise(), np.float32) - np.asarray(x, np.float32))
    assert np.all(err <= step / 2 + 0.02)


def test_straight_through_gradient():
    x = jr.normal(jr.PRNGKey(3), (4, 6))
    c = jr.normal(jr.PRNGKey(4), (4, 6))
    grad = jax.grad(
        lambda x: jnp.sum(c * qq.quantise(x, straight_through=True).dequantise())
    )(x)
    np.testing.assert_allclose(grad, c)


def test_errors():
    x = jnp.ones((4, 6))
    with pytest.raises(ValueError, match="bits=8 or 4"):
        qq.quantise(x, bits=3)
    with pytest.raises(ValueError, match="not both"):
        qq.quantise(x, axis=0, group_size=2)
    with pytest.raises(ValueError, match="must divide"):
        qq.quantise(x, group_size=4)
    with pytest.raises(ValueError, match="floating-point"):
        qq.quantise(jnp.ones((2,), jnp.int32))
    with pytest.raises(ValueError, match="calibration"):
        qq.quantise(x, calibration="minmax")
    with pytest.raises(ValueError, match="matmul"):
        qq.quantise(x, matmul="fast")
    # An error raised inside a differentiated trace leaves its tracers in the
    # traceback, which the leak checker reports instead of the error itself.
    with (
        jax.check_tracer_leaks(False),
        pytest.raises(ValueError, match="straight_through=True"),
    ):
        jax.grad(lambda x: qq.quantise(x).scale.sum())(x)
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
