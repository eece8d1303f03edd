"""Quantised arrays: tests that kill mutants of `quax_quant/_rules.py` which the other
test files let through (`scripts/mutation.sh quant-rules`; docs/mutation.md lists
each surviving mutant of the sample run and the test that kills it). References are
NumPy on the dequantised arrays (the `ref` fixture unpacks the leaves itself)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_quant as qq


def test_a_4_bit_array_sliced_to_an_odd_last_axis(ref) -> None:
    # Four-bit codes are packed two to a byte along the last axis; slicing a
    # (2, 4, 6) array to (2, 4, 5) leaves one code in the last byte of each row, so
    # the result is marked odd (mutants: never marked; marked by the parity of
    # axis 1, which is even here, instead of the last).
    w = qq.quantise(jr.normal(jr.PRNGKey(0), (2, 4, 6)), bits=4)
    x = np.asarray(jr.normal(jr.PRNGKey(1), (5, 3)), np.float32)
    want = ref.dequantise(w)[:, :, :5]
    f = quax.quaxify(lambda a: a[:, :, :5])
    for run in (f, jax.jit(f)):
        out = run(w)
        assert isinstance(out, qq.QuantisedArray)
        assert out.shape == (2, 4, 5)
        np.testing.assert_allclose(ref.dequantise(out), want, rtol=1e-6)
    product = jax.jit(quax.quaxify(lambda a, b: a[:, :, :5] @ b))(w, x)
    np.testing.assert_allclose(product, want @ x, rtol=1e-5, atol=1e-5)


def test_scaling_keeps_the_dtype_of_the_scales(ref) -> None:
    # `w * 2.0` scales the scales in their own dtype: a float16 array stays float16
    # (mutant: the factor cast to the default float dtype, which widens them).
    w = qq.quantise(jr.normal(jr.PRNGKey(2), (4, 6)).astype(jnp.float16))
    assert w.scale.dtype == jnp.float16
    f = quax.quaxify(lambda a: a * 2.0)
    for run in (f, jax.jit(f)):
        out = run(w)
        assert isinstance(out, qq.QuantisedArray)
        assert out.scale.dtype == jnp.float16 and out.dtype == jnp.float16
        np.testing.assert_allclose(ref.dequantise(out), 2.0 * ref.dequantise(w))


def test_a_product_with_integers_dequantises_where_allowed(ref) -> None:
    # An integer operand has no quantised product: where allowed, the array is
    # dequantised and multiplied densely, on either side (mutant: the dense product
    # bound with its dimension numbers under another name).
    w = qq.quantise(jr.normal(jr.PRNGKey(3), (4, 6))).enable_materialise()
    x = np.arange(18, dtype=np.int32).reshape(6, 3) - 9
    dense = ref.dequantise(w)
    f = quax.quaxify(lambda a, b: a @ b)
    g = quax.quaxify(lambda a, b: b.T @ a.T)
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(w, x), dense @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g(w, x), (dense @ x).T, rtol=1e-5, atol=1e-5)
