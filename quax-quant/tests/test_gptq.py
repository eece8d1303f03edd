"""GPTQ / AWQ int4 checkpoints: a reference packer written here (NumPy, from the
layouts' definitions) writes a layer's `qweight`, `qzeros`, `scales` and `g_idx` to a
file; `from_gptq` reads them into a `QuantisedArray` whose products match the
dequantised reference computed in NumPy from the unpacked integers."""

import functools as ft

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq
from jax import lax


IN, OUT, GROUP = 64, 48, 16
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's GEMM packing order


def _pack(values, axis, order=tuple(range(8))):
    """Eight 4-bit values per int32 along `axis`: nibble `k` (bits 4k..4k+3) of
    entry `i` holds value `8 i + order[k]`."""
    v = np.moveaxis(np.asarray(values, np.uint32), axis, -1)
    v = v.reshape(*v.shape[:-1], -1, 8)
    packed = np.zeros(v.shape[:-1], np.uint32)
    for k in range(8):
        packed |= v[..., order[k]] << np.uint32(4 * k)
    return np.moveaxis(packed.view(np.int32), -1, axis)


def _layer(seed=0):
    """Unsigned integers `q` (IN, OUT), zero points `z` (groups, OUT) in [0, 15],
    float16 scales, and the NumPy dequantised `W` (IN, OUT) = s (q - z)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, (IN, OUT))
    z = rng.integers(0, 16, (IN // GROUP, OUT))
    s = rng.uniform(0.01, 0.1, (IN // GROUP, OUT)).astype(np.float16)
    g = np.arange(IN) // GROUP
    w = s[g].astype(np.float64) * (q - z[g])
    return q, z, s, g, w


def _write(path, fmt, q, z, s, g):
    """The reference packer: the layer's tensors in `fmt`'s layout, to a file."""
    if fmt == "awq":
        tensors = {
            "qweight": _pack(q, 1, AWQ_ORDER),
            "qzeros": _pack(z, 1, AWQ_ORDER),
            "scales": s,
        }
    else:
        stored = z - 1 if fmt == "gptq" else z  # AutoGPTQ stores zero - 1
        tensors = {
            "qweight": _pack(q, 0),
            "qzeros": _pack(stored & 0xF, 1),
            "scales": s,
            "g_idx": g.astype(np.int32),
        }
    np.savez(path, **{f"layers.0.proj.{k}": v for k, v in tensors.items()})


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2", "awq"])
def test_reads_the_packed_layout(fmt, tmp_path):
    q, z, s, g, w = _layer()
    if fmt == "gptq":
        z = np.maximum(z, 1)  # AutoGPTQ's stored `z - 1` cannot be -1
        w = s[g].astype(np.float64) * (q - z[g])
    _write(tmp_path / "layer.npz", fmt, q, z, s, g)
    tensors = np.load(tmp_path / "layer.npz")
    p = "layers.0.proj"
    arr = qq.from_gptq(
        tensors[f"{p}.qweight"],
        tensors[f"{p}.qzeros"],
        tensors[f"{p}.scales"],
        tensors.get(f"{p}.g_idx"),
        format=fmt,
        float_dtype=jnp.float32,
    )
    # Integers and scales, never a float weight: int4 bytes, one scale and zero
    # point per output feature and group.
    assert arr.shape == (OUT, IN) and arr.bits == 4 and arr.values.dtype == jnp.int8
    assert arr.values.shape == (OUT, IN // 2)
    assert arr.group_sizes == (1, GROUP) and arr.zero_point is not None
    assert arr.nbytes == OUT * IN // 2 + 2 * 4 * OUT * IN // GROUP
    np.testing.assert_allclose(arr.dequantise(), w.T, rtol=1e-6)
    # Groups along the contraction: the weight-only product (exact) at any rows.
    x = jr.normal(jr.PRNGKey(0), (5, IN))
    assert qq.matmul_path(5, arr, (1,)) == "weight_only"
    for rows in (x[:1], x):
        out = jax.jit(quax.quaxify(lambda w, x: x @ w.T))(arr, rows)
        np.testing.assert_allclose(
            out, np.asarray(rows, np.float64) @ w, rtol=1e-5, atol=1e-5
        )


def test_float16_by_default():
    q, z, s, g, _ = _layer(1)
    arr = qq.from_gptq(_pack(q, 0), _pack(z, 1), s, g, format="gptq_v2")
    assert arr.dtype == jnp.float16 and arr.scale.dtype == jnp.float16


def test_errors():
    q, z, s, g, _ = _layer(2)
    qweight, qzeros = _pack(q, 0), _pack(z, 1)
    with pytest.raises(ValueError, match="format must be one of"):
        qq.from_gptq(qweight, qzeros, s, g, format="exl2")
    with pytest.raises(ValueError, match="qweight must be a 2-D int32"):
        qq.from_gptq(qweight.astype(np.int64), qzeros, s, g)
    with pytest.raises(ValueError, match="qzeros must be a 2-D int32"):
        qq.from_gptq(qweight, qzeros.astype(np.uint32), s, g)
    with pytest.raises(ValueError, match="scales must be a 2-D float"):
        qq.from_gptq(qweight, qzeros, s.astype(np.int32), g)
    with pytest.raises(ValueError, match="scales have 48 output columns"):
        qq.from_gptq(qweight[:, :40], qzeros, s, g)
    with pytest.raises(ValueError, match=r"qzeros must have shape \(4, 6\)"):
        qq.from_gptq(qweight, qzeros[:, :5], s, g)
    with pytest.raises(ValueError, match="does not divide the 64 input"):
        qq.from_gptq(qweight, _pack(np.zeros((3, OUT), int), 1), s[:3], None)
    with pytest.raises(ValueError, match=r"g_idx must be an integer array of shape"):
        qq.from_gptq(qweight, qzeros, s, g[:10])
    # A g_idx whose groups do not each hold IN / G features is no GPTQ layout.
    with pytest.raises(ValueError, match="each group holding 16 features"):
        qq.from_gptq(qweight, qzeros, s, np.minimum(g, 2))
    with pytest.raises(ValueError, match=r"groups in \[0, 4\]"):
        qq.from_gptq(qweight, qzeros, s, np.where(g == 3, 4, g))


def _act_order_layer(seed=3):
    """A layer quantised with act-order (`desc_act=True`): GPTQ visits the input
    features in a permuted order `perm` and cuts groups along it, so
    `g_idx[perm[j]] = j // GROUP`; the NumPy dequantised `W` (IN, OUT)."""
    q, z, s, _, _ = _layer(seed)
    perm = np.random.default_rng(seed).permutation(IN)
    g = np.empty(IN, np.int64)
    g[perm] = np.arange(IN) // GROUP
    w = s[g].astype(np.float64) * (q - z[g])
    return q, z, s, g, w


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_act_order(fmt, tmp_path):
    q, z, s, g, w = _act_order_layer()
    if fmt == "gptq":
        z = np.maximum(z, 1)
        w = s[g].astype(np.float64) * (q - z[g])
    assert not np.all(np.diff(g) >= 0)  # the groups are not sorted
    _write(tmp_path / "layer.npz", fmt, q, z, s, g)
    tensors = np.load(tmp_path / "layer.npz")
    p = "layers.0.proj"
    arr = qq.from_gptq(
        *(tensors[f"{p}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")),
        format=fmt,
        float_dtype=jnp.float32,
    )
    assert arr.shape == (OUT, IN) and arr.values.dtype == jnp.int8
    assert arr.input_order is not None and arr.group_sizes == (1, GROUP)
    assert qq.describe(arr)["act_order"] is True
    np.testing.assert_allclose(arr.dequantise(), w.T, rtol=1e-6, atol=1e-6)
    x = jr.normal(jr.key(0), (5, IN))
    expected = np.asarray(x, np.float64) @ w  # (5, OUT)
    # As an eqx.nn.Linear computes it (weight @ x), and with the weight on the
    # right; under jit, both contracting the permuted inputs.
    matvec = jax.jit(jax.vmap(quax.quaxify(lambda w, x: w @ x), in_axes=(None, 0)))
    np.testing.assert_allclose(matvec(arr, x), expected, rtol=1e-5, atol=1e-5)
    rmat = quax.quaxify(lambda w, x: jnp.einsum("bi,oi->bo", x, w))
    np.testing.assert_allclose(rmat(arr, x), expected, rtol=1e-5, atol=1e-5)
    # The gradient with respect to the activations: w itself, by NumPy.
    grad = jax.grad(quax.quaxify(lambda x, w: jnp.sum(w @ x)))(x[0], arr)
    np.testing.assert_allclose(grad, w.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_act_order_refuses_moving_the_inputs():
    q, z, s, g, w = _act_order_layer()
    arr = qq.from_gptq(
        _pack(q, 0), _pack(z, 1), s, g.astype(np.int32), format="gptq_v2"
    )
    with pytest.raises(qq.QuantMaterialisationError, match=r"`transpose`.*input_order"):
        quax.quaxify(lambda w: w.T)(arr)
    with pytest.raises(qq.QuantMaterialisationError, match=r"`slice`.*input_order"):
        quax.quaxify(lambda w: w[:, :16])(arr)
    # A product batching over the inputs: out[i] = sum_o weight[o, i] x[i, o].
    x = jr.normal(jr.key(3), (IN, OUT))
    batched = ft.partial(
        lax.dot_general, dimension_numbers=(((0,), (1,)), ((1,), (0,)))
    )
    with pytest.raises(qq.QuantMaterialisationError, match="batches over that axis"):
        quax.quaxify(batched)(arr, x)
    # Where dequantising is allowed, the columns come back in place.
    allowed = arr.enable_materialise()
    np.testing.assert_allclose(
        quax.quaxify(lambda w: w.T)(allowed), w, rtol=1e-3, atol=1e-3
    )  # float16, the scales' dtype
    np.testing.assert_allclose(
        quax.quaxify(batched)(allowed, x),
        np.einsum("io,io->i", w, x),
        rtol=1e-2,
        atol=1e-2,
    )


def test_act_order_product_keeping_the_inputs_free():
    """`g @ weight` (the inputs a free axis: the gradient of `weight @ x` with
    respect to `x`) puts the output columns back in place, against NumPy on the
    dequantised weight; and the gradient of a batch through `eqx.nn.Linear`'s
    product. Before, both refused (the product does not contract that axis)."""
    q, z, s, g, w = _act_order_layer()
    arr = qq.from_gptq(
        _pack(q, 0), _pack(z, 1), s, g.astype(np.int32), format="gptq_v2"
    )
    g_out = jr.normal(jr.key(1), (3, OUT))
    np.testing.assert_allclose(
        jax.jit(quax.quaxify(lambda w, g: g @ w))(arr, g_out),
        np.asarray(g_out, np.float64) @ w.T,
        rtol=1e-5,
        atol=1e-5,
    )
    x = jr.normal(jr.key(2), (4, IN))

    def loss(x, w):
        return jnp.sum(jnp.sin(jax.vmap(lambda x: w @ x)(x)))

    grad = jax.jit(jax.grad(quax.quaxify(loss)))(x, arr)
    # d/dx sum(sin(x W)) = cos(x W) W^T, in NumPy.
    x64 = np.asarray(x, np.float64)
    np.testing.assert_allclose(grad, np.cos(x64 @ w) @ w.T, rtol=1e-4, atol=1e-4)
