"""float8 formats (`float8_e4m3fn`, `float8_e5m2`, JAX's dtypes): quantisation
against literals and a NumPy reference (ml_dtypes' casts), the weight-only and
float8 x float8 products, saturation and NaN behaviour, and every error path."""

import jax
import jax.numpy as jnp
import jax.random as jr
import ml_dtypes
import numpy as np
import pytest
import quax
import quax_quant as qq
from jax import lax


E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
TOP = {E4M3: 448.0, E5M2: 57344.0}


def test_literal_e4m3fn():
    # Per tensor: absmax 448 gives scale 1; 1.0625 is a tie between 1 and 1.125
    # (rounds to even: 1), -3.3 lies between -3.25 and -3.5.
    q = qq.quantise(jnp.array([448.0, 1.0625, -3.3, 0.0]), format=E4M3)
    assert q.values.dtype == jnp.float8_e4m3fn and q.bits == 8 and q.format == E4M3
    np.testing.assert_array_equal(q.scale, [1.0])
    np.testing.assert_array_equal(q.dequantise(), [448.0, 1.0, -3.25, 0.0])
    # Per channel: each row's absmax maps to 448.
    w = jnp.array([[896.0, -2.0, 1.0], [-4.48, 0.5, 0.0]])
    q = qq.quantise(w, format=E4M3, axis=0)
    np.testing.assert_allclose(q.scale, [[2.0], [0.01]], rtol=1e-7)
    np.testing.assert_allclose(
        q.values.astype(jnp.float32), [[448.0, -1.0, 0.5], [-448.0, 48.0, 0.0]]
    )


def _np_float8(w, fmt, axis):
    w = np.asarray(w, np.float32)
    absmax = np.abs(w).max(axis=axis, keepdims=True)
    scale = np.where(absmax > 0, absmax / np.float32(TOP[fmt]), 1).astype(np.float32)
    values = np.clip(w / scale, -TOP[fmt], TOP[fmt]).astype(getattr(ml_dtypes, fmt))
    return values, scale


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_matches_numpy_reference(fmt, axis):
    w = jr.normal(jr.PRNGKey(0), (16, 24)) * 3
    q = qq.quantise(w, format=fmt, axis=axis)
    values, scale = _np_float8(w, fmt, tuple(a for a in (0, 1) if a != axis))
    np.testing.assert_array_equal(np.asarray(q.values), values)
    np.testing.assert_allclose(q.scale, scale, rtol=1e-6)
    np.testing.assert_allclose(
        q.dequantise(), values.astype(np.float32) * scale, rtol=1e-6
    )
    # e4m3 keeps 3 mantissa bits, e5m2 2: relative error of each entry at most
    # 2^-4 or 2^-3 (of the entries above the subnormal range).
    big = np.abs(np.asarray(w)) > 1e-2 * np.abs(np.asarray(w)).max()
    rel = (
        np.abs(np.asarray(q.dequantise()) - np.asarray(w))[big]
        / np.abs(np.asarray(w))[big]
    )
    assert rel.max() <= (2.0**-4 if fmt == E4M3 else 2.0**-3) + 1e-6


def test_saturation_never_gives_nan():
    """The scaled absmax can round just past the largest float8 number, and a cast
    beyond it is NaN (e4m3fn) or infinite (e5m2): `quantise` clips first."""
    assert np.isnan(np.float32(500.0).astype(ml_dtypes.float8_e4m3fn))
    w = jr.normal(jr.PRNGKey(1), (64, 64)) * 1e30
    for fmt in (E4M3, E5M2):
        q = qq.quantise(w, format=fmt, axis=0)
        v = np.asarray(q.values).astype(np.float32)
        assert np.isfinite(v).all() and np.abs(v).max() == TOP[fmt]
        assert np.isfinite(q.dequantise()).all()


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("rows", [1, 8])
def test_weight_only_products_match_dense(fmt, rows, matches_dense):
    w = jr.normal(jr.PRNGKey(2), (12, 32))
    x = jr.normal(jr.PRNGKey(3), (rows, 32))
    q = qq.quantise(w, format=fmt, axis=0)
    assert qq.matmul_path(rows, q, (1,)) == "weight_only"
    matches_dense(lambda w, x: x @ w.T, q, x)
    matches_dense(lambda w, x: w.T[:16].T @ x.T[:16], q, x)
    dense = np.asarray(q.dequantise())
    grad = jax.grad(lambda x: jnp.sum(quax.quaxify(lambda w, x: x @ w.T)(q, x) ** 2))
    np.testing.assert_allclose(grad(x), 2 * (x @ dense.T) @ dense, rtol=1e-4, atol=1e-4)


def _np_float8_product(x, q, fmt):
    """float8 x float8 in NumPy: the activations per row as float8 (absmax to the
    largest number), the product of the float8 numbers in float64, both scales."""
    x = np.asarray(x, np.float32)
    sx = np.abs(x).max(1, keepdims=True) / np.float32(TOP[fmt])
    xq = np.clip(x / sx, -TOP[fmt], TOP[fmt]).astype(getattr(ml_dtypes, fmt))
    wq = np.asarray(q.values).astype(np.float64)
    s = (
        np.asarray(q.scale, np.float64).reshape(1, -1)
        if q.scale.size > 1
        else float(q.scale.reshape(()))
    )
    return (xq.astype(np.float64) @ wq.T) * sx * s


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("axis", [None, 0])
def test_float8_times_float8(fmt, axis):
    w = jr.normal(jr.PRNGKey(4), (24, 64))
    x = jr.normal(jr.PRNGKey(5), (6, 64))
    q = qq.quantise(w, format=fmt, axis=axis, matmul="float8")
    out = jax.jit(quax.quaxify(lambda w, x: x @ w.T))(q, x)
    np.testing.assert_allclose(out, _np_float8_product(x, q, fmt), rtol=1e-5, atol=1e-5)
    # Against float32: the activations' float8 rounding added.
    exact = np.asarray(x) @ np.asarray(w).T
    rel = np.linalg.norm(out - exact) / np.linalg.norm(exact)
    assert rel < (0.05 if fmt == E4M3 else 0.1)


def test_nonfinite():
    w = jnp.ones((4, 8)).at[2, 3].set(jnp.inf)
    with pytest.raises(ValueError, match="non-finite"):
        qq.quantise(w, format=E4M3, axis=0)
    q = jax.jit(lambda w: qq.quantise(w, format=E4M3, axis=0))(w)
    deq = np.asarray(q.dequantise())
    assert np.isnan(deq[2]).all() and (deq[[0, 1, 3]] == 1).all()
    # A NaN activation row on the float8 x float8 path is a NaN row.
    q = qq.quantise(jnp.ones((4, 8)), format=E4M3, matmul="float8")
    x = jnp.ones((5, 8)).at[1, 0].set(jnp.nan)
    out = np.asarray(quax.quaxify(lambda w, x: x @ w.T)(q, x))
    assert np.isnan(out[1]).all() and np.allclose(out[[0, 2, 3, 4]], 8)


def test_convolution_with_a_float8_kernel(matches_dense):
    kernel = jr.normal(jr.PRNGKey(6), (4, 3, 3))
    q = qq.quantise(kernel, format=E4M3, axis=0)
    x = jr.normal(jr.PRNGKey(7), (2, 3, 10))
    matches_dense(
        lambda x, k: lax.conv_general_dilated(x, k, (1,), "SAME"), x, q, rtol=1e-4
    )


def test_errors():
    w = jnp.ones((4, 8))
    with pytest.raises(ValueError, match="stores 8-bit values, got bits=4"):
        qq.quantise(w, format=E4M3, bits=4)
    with pytest.raises(ValueError, match="matmul must be one of"):
        qq.quantise(w, format=E4M3, matmul="int8")
    with pytest.raises(ValueError, match="matmul must be one of"):
        qq.quantise(w, matmul="float8")
    q = qq.quantise(w, format=E5M2)
    with pytest.raises(ValueError, match="must be float8_e4m3fn numbers"):
        qq.QuantisedArray(
            q.values,
            q.scale,
            None,
            None,
            bits=8,
            float_dtype=jnp.float32,
            format=E4M3,
        )
    with pytest.raises(ValueError, match="must be float8_e5m2 numbers"):
        qq.QuantisedArray(
            q.values.astype(jnp.int8),
            q.scale,
            None,
            None,
            bits=8,
            float_dtype=jnp.float32,
            format=E5M2,
        )
    with pytest.raises(ValueError, match="float8 numbers, not integers"):
        q.integers()
    # Two float8 operands: the int8 x int8 rule refuses, naming the primitive.
    with pytest.raises(
        qq.QuantMaterialisationError, match=r"dot_general.*format .int."
    ):
        quax.quaxify(lambda a, b: a @ b.T)(q, q)
