"""Products with a float operand (`quax_quant._matmul`): the weight-only path is
`x @ w.dequantise()`, the int8 x int8 path that product with the activations
quantised per row."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq


def _int8_reference(x, w, ref, w_is_lhs=False):
    """The int8 x int8 product from the stored leaves, in NumPy: `x` quantised per
    row (absmax / 127, rounding half to even as `jnp.round`), times the weight's
    integers and scales, minus the zero-point offset on the exact `x`."""
    x32 = np.asarray(x, np.float32)
    step = np.max(np.abs(x32), axis=1, keepdims=True) / np.float32(127)
    xq = np.clip(np.round(x32 / step), -127, 127).astype(np.float64)
    scale = ref.blocks(w.scale, w.shape)
    zero = 0 if w.zero_point is None else ref.blocks(w.zero_point, w.shape)
    ints = ref.integers(w).astype(np.float64)
    dense_q, offset = ints * scale, zero * scale
    if w_is_lhs:  # x @ w.T: w is (out, in)
        dense_q, offset = dense_q.T, offset.T
    return (xq * step) @ dense_q - np.asarray(x, np.float64) @ offset


def test_int8_path_grouped_output_axis_literal():
    """Scales grouped along the output axis, on the int8 path, from literals: a
    weight (out=4, in=2) in groups of two output rows (per input column, as every
    grouped layout is per index of the other axes); `x @ w.T`."""
    w = jnp.array([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0], [6.0, 12.0]])
    q = qq.quantise(w, group_size=2, group_axis=0, matmul="int8")
    # Block absmax 2, 4 (rows 0-1) and 6, 12 (rows 2-3): every entry is half or
    # all of its block's absmax, so its integer is 63.5 -> 64 (half to even) or 127.
    ints = np.array([[64, 64], [127, 127], [64, 64], [127, 127]])
    block_scale = np.array([[2.0, 4.0], [6.0, 12.0]]) / 127
    np.testing.assert_array_equal(q.values, ints)
    np.testing.assert_allclose(q.scale, block_scale, rtol=1e-6)
    x = jnp.array([[1.0, -1.0], [2.0, 0.5]])
    # Rows quantised by absmax 1 and 2: [127, -127] times 1 / 127, and [127, 32]
    # times 2 / 127; each integer product scaled by its weight block's scale.
    expected = np.array(
        [
            [
                (64 * 2 - 64 * 4) / 127,
                (127 * 2 - 127 * 4) / 127,
                (64 * 6 - 64 * 12) / 127,
                (127 * 6 - 127 * 12) / 127,
            ],
            [
                2 * (127 * 64 * 2 + 32 * 64 * 4) / 127**2,
                2 * (127 * 127 * 2 + 32 * 127 * 4) / 127**2,
                2 * (127 * 64 * 6 + 32 * 64 * 12) / 127**2,
                2 * (127 * 127 * 6 + 32 * 127 * 12) / 127**2,
            ],
        ]
    )
    # Within the activations' rounding of the float product.
    np.testing.assert_allclose(expected, np.asarray(x) @ np.asarray(w).T, rtol=0.011)
    for rows in (1, 2):
        out = jax.jit(quax.quaxify(lambda x, w: x @ w.T))(x[:rows], q)
        np.testing.assert_allclose(out, expected[:rows], rtol=1e-6)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_path_grouped_output_axis(bits, symmetric, ref):
    """`quantise(w, group_size=4)` with `matmul="int8"`, scales grouped along the
    output axis in every orientation, at 1 and 6 rows, eagerly, jitted and under
    vmap: the int8 product computed from the stored leaves in NumPy, and within the
    activations' rounding of `x @ w.dequantise()`."""
    key = jr.PRNGKey(bits + 2 * symmetric)
    # (in=8, out=12) grouped along out (last axis): x @ w.
    w_in_out = qq.quantise(
        jr.normal(key, (8, 12)),
        bits=bits,
        symmetric=symmetric,
        group_size=4,
        matmul="int8",
    )
    # (out=12, in=8) grouped along out (axis 0): x @ w.T and w @ x.
    w_out_in = qq.quantise(
        jr.normal(key, (12, 8)),
        bits=bits,
        symmetric=symmetric,
        group_size=4,
        group_axis=0,
        matmul="int8",
    )
    cases = [
        (lambda x, w: x @ w, w_in_out, False),
        (lambda x, w: x @ w.T, w_out_in, True),
        (lambda x, w: (w @ x.T).T, w_out_in, True),
    ]
    for rows in (1, 6):
        x = jr.normal(jr.PRNGKey(rows), (rows, 8))
        for fn, w, transposed in cases:
            expected = _int8_reference(x, w, ref, w_is_lhs=transposed)
            dense = np.asarray(x, np.float64) @ (
                ref.dequantise(w).T if transposed else ref.dequantise(w)
            )
            step = np.max(np.abs(np.asarray(x)), axis=1, keepdims=True) / 127
            bound = step / 2 * np.abs(ref.dequantise(w)).sum(1 if transposed else 0)
            # Op by op (each primitive compiled on its own: once, at 6 rows),
            # jitted, and under vmap.
            eager = [quax.quaxify(fn)(x, w)] if rows == 6 and not transposed else []
            outs = [
                *eager,
                jax.jit(quax.quaxify(fn))(x, w),
                jax.jit(
                    jax.vmap(
                        quax.quaxify(lambda x, w, fn=fn: fn(x[None], w)[0]),
                        in_axes=(0, None),
                    )
                )(x, w),
            ]
            for out in outs:
                np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
                assert np.all(np.abs(np.asarray(out) - dense) <= bound + 1e-5)


def test_weight_only_zero_point_entries_are_exact_zeros():
    """An asymmetric weight entry at its zero point dequantises to exactly 0, so an
    infinite activation times it is NaN, as in the dense product. The product used
    to dequantise as `q * s - z * s`, which XLA under jit fuses into one
    multiply-add whose unrounded `q * s` leaves a residue: -inf where dense is NaN
    (found by test_conformance.py)."""
    values = np.full((4, 6), -26, np.int8)
    values[1, :2] = [25, -128]
    values[3, 5] = 127
    w = qq.QuantisedArray(
        jnp.asarray(values),
        jnp.array([[0.01960784]]),
        jnp.array([[-26.0]]),
        None,
        bits=8,
        float_dtype=np.float32,
        matmul="weight_only",
    )
    # Dequantised from the literals: (q - z) * s, exactly 0 where q == z.
    dense = (values.astype(np.float32) + 26) * np.float32(0.01960784)
    for rows in (1, 5):
        x = np.zeros((rows, 6), np.float32)
        x[:, 0] = np.inf
        with np.errstate(invalid="ignore"):
            expected = x @ dense.T  # NaN where the row is 0, +inf for row 1
        f = quax.quaxify(lambda w, x: x @ w.T)
        for out in (f(w, jnp.asarray(x)), jax.jit(f)(w, jnp.asarray(x))):
            np.testing.assert_array_equal(out, expected)
