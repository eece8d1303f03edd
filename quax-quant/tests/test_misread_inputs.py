"""The public int4 packing functions accepted inputs they then read wrongly:
`pack_int4` kept the low four bits of integers outside `[-8, 7]` (9 unpacked as
-7) and truncated floats (2.7 unpacked as 2); `unpack_int4(packed, n)` with an `n`
other than the packed length read other elements (byte `i` holds element `i +
ceil(n / 2)` in its high bits). They are refused now, naming the way out.
References are literals."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
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


# `act_scale`, the calibrated activation scale, divides the activations in the
# int8 x int8 product: 0 gave a product of zeros, a negative one flipped and
# saturated the activations, silently (seen before the check). Refused now.
W = jnp.linspace(-1.0, 1.0, 48).reshape(8, 6)
X = jnp.linspace(-2.0, 1.5, 24).reshape(3, 8)


@pytest.mark.parametrize("act", [0.0, -0.01, np.nan, np.inf])
def test_act_scale_not_positive_and_finite_is_refused(act):
    w = qq.quantise(W, bits=8, axis=1, matmul="int8")
    with pytest.raises(ValueError, match=r"act_scale .* must be a positive finite"):
        dataclasses.replace(w, act_scale=jnp.float32(act))


def test_act_scale_positive_is_read_as_the_activation_scale():
    w = qq.quantise(W, bits=8, axis=1, matmul="int8")
    act = float(jnp.max(jnp.abs(X))) / 127
    calibrated = dataclasses.replace(w, act_scale=jnp.float32(act))
    got = quax.quaxify(lambda w, x: x @ w)(calibrated, X)
    # NumPy: the activations as int8 at that scale, times the integers and scales.
    xq = np.clip(np.round(np.asarray(X, np.float64) / act), -127, 127)
    q = np.asarray(w.integers(), np.float64)
    want = (xq @ q) * act * np.asarray(w.scale, np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Within the int8 rounding of the dense product.
    np.testing.assert_allclose(got, X @ w.dequantise(), atol=0.05)


def test_act_scale_traced_is_not_checked():
    # Under `jit` the scale is a tracer: the check needs a concrete number.
    w = qq.quantise(W, bits=8, axis=1, matmul="int8")
    build = jax.jit(lambda a: dataclasses.replace(w, act_scale=a).act_scale)
    np.testing.assert_array_equal(build(jnp.float32(0.5)), 0.5)


@pytest.mark.parametrize("matmul", ["weight_only", "int8"])
def test_infinite_scale_block_gives_nan_where_dense_does(matmul):
    # A scale of inf (one that overflowed, in one channel): the dense
    # weight is +-inf there and NaN where the integer is 0, so the dense product's
    # column is NaN. The int8 path gave +-inf there (seen before the fix).
    w = qq.quantise(W, bits=8, axis=1, matmul=matmul)
    w = dataclasses.replace(w, scale=w.scale.at[0, 0].set(jnp.inf))
    dense = X @ w.dequantise()
    got = np.asarray(quax.quaxify(lambda w, x: x @ w)(w, X))
    assert np.isnan(dense[:, 0]).all()
    assert np.isnan(got[:, 0]).all()
    np.testing.assert_allclose(got[:, 1:], dense[:, 1:], rtol=0.05, atol=0.05)


# Unpacked NF4 code indices (`format="nf4"`, `bits=8`, one per byte, as products
# slice them): the levels read only the low four bits of `q + 8`, so an index
# outside `[-8, 7]` stood for another level (100 for the level of 4, -9 for that
# of 7), silently. They are refused now.


def _nf4_bytes(values):
    return qq.QuantisedArray(
        jnp.asarray(values, jnp.int8),
        jnp.full((1, 1), 2.0, jnp.float32),
        None,
        None,
        8,
        jnp.float32,
        format="nf4",
        allow_materialise=True,
    )


@pytest.mark.parametrize("values", [[[100, 4]], [[-9, 7]], [[0, 8]], [[-128, 0]]])
def test_nf4_indices_outside_four_bits_are_refused(values):
    with pytest.raises(ValueError, match=r"'nf4' with bits=8.*\[-8, 7\].*jnp\.clip"):
        _nf4_bytes(values)


def test_nf4_indices_refused_when_rebuilt_outside_quaxify():
    # `eqx.tree_at` / `jax.tree.map` rebuild without `__init__`: quaxify re-runs
    # the check before any rule reads the bytes.
    import equinox as eqx

    good = _nf4_bytes([[-8, 7]])
    bad = eqx.tree_at(lambda q: q.values, good, jnp.array([[100, 4]], jnp.int8))
    with pytest.raises(ValueError, match=r"'nf4' with bits=8"):
        quax.quaxify(lambda q, x: q @ x)(bad, jnp.ones(2))


def test_nf4_indices_in_range_read_as_their_levels():
    indices = np.arange(-8, 8).reshape(1, 16)
    q = _nf4_bytes(indices)
    want = 2.0 * np.asarray(qq.NF4_CODE, np.float32)[indices + 8]
    np.testing.assert_array_equal(q.dequantise(), want)
    x = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
    got = quax.quaxify(lambda q, x: q @ x)(q, x)
    np.testing.assert_allclose(got, want @ x, rtol=1e-6, atol=1e-6)


def test_nf4_indices_a_product_unpacks_pass():
    # `x @ w` transposes a packed NF4 weight unpacked: such an array, eagerly
    # with concrete bytes (checked), inside the product.
    w = qq.quantise(W, format="nf4", block_size=3)
    x = np.linspace(-1.0, 1.0, W.shape[0], dtype=np.float32)
    got = quax.quaxify(lambda w, x: x @ w)(w, x)
    want = x @ np.asarray(w.dequantise())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_nf4_indices_traced_are_not_checked():
    # Under `jit` the values are a tracer: the check needs concrete bytes.
    build = jax.jit(lambda v: _nf4_bytes(v).values)
    np.testing.assert_array_equal(build(jnp.array([[100, 4]], jnp.int8)), [[100, 4]])


# `dequantise()` and `integers()` outside `quax.quaxify` (the dense reference users
# compare with) re-run the checks too: before, a `bits=8` value whose int32 `values`
# an `eqx.tree_at` set to 300 dequantised as 44 times the scale, silently, and an
# `input_order` repeating a column put one column in two places.
def _rebuilt_cases():
    import equinox as eqx

    w8 = qq.quantise(W, bits=8, axis=1)
    wide = dataclasses.replace(w8, values=w8.values.astype(jnp.int32))
    ordered = dataclasses.replace(w8, input_order=jnp.arange(W.shape[1])[::-1])
    nf4 = _nf4_bytes([[-8, 7]])
    return {
        "values": (
            eqx.tree_at(lambda q: q.values, wide, jnp.full(wide.values.shape, 300)),
            r"values must lie in \[-128, 127\] for bits=8, got int32 values in "
            r"\[300, 300\]",
        ),
        "input_order": (
            eqx.tree_at(
                lambda q: q.input_order, ordered, jnp.zeros(W.shape[1], jnp.int32)
            ),
            r"input_order must be a permutation",
        ),
        "nf4": (
            eqx.tree_at(lambda q: q.values, nf4, jnp.array([[100, 4]], jnp.int8)),
            r"'nf4' with bits=8",
        ),
    }


@pytest.mark.parametrize("case", ["values", "input_order", "nf4"])
@pytest.mark.parametrize("method", ["dequantise", "integers"])
def test_rebuilt_value_refused_by_dequantise_and_integers(case, method):
    bad, message = _rebuilt_cases()[case]
    with pytest.raises(ValueError, match=rf"QuantisedArray\.{method}: .*{message}"):
        getattr(bad, method)()


def test_rebuilt_valid_value_dequantises_as_the_original():
    # An edit that keeps the checks (in-range values of a wider dtype) dequantises
    # to the original's floats, eagerly and under `jit` (where the traced values
    # cannot be read, so nothing is checked).
    import equinox as eqx

    w8 = qq.quantise(W, bits=8, axis=1)
    wide = eqx.tree_at(lambda q: q.values, w8, w8.values.astype(jnp.int16))
    want = np.asarray(w8.values, np.float32) * np.asarray(w8.scale)
    np.testing.assert_array_equal(wide.dequantise(), want)
    np.testing.assert_array_equal(jax.jit(lambda q: q.dequantise())(wide), want)
    np.testing.assert_array_equal(wide.integers(), w8.values)
