"""The rules (`quax_quant._rules`): the product of two quantised operands, the
quantised convolution, the structural operations that keep the quantisation, and
the refusals of the rest. Products with a float operand: `test_matmul.py`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq
from jax import lax


def _weight(seed, shape, **kwargs):
    return qq.quantise(jr.normal(jr.PRNGKey(seed), shape), **kwargs)


def test_both_quantised_int32(ref):
    a = _weight(0, (6, 16), axis=0)
    b = _weight(1, (16, 5), axis=1, bits=4)
    out = jax.jit(quax.quaxify(lambda a, b: a @ b))(a, b)
    np.testing.assert_allclose(
        out, ref.dequantise(a) @ ref.dequantise(b), rtol=1e-5, atol=1e-5
    )
    hlo = jax.jit(quax.quaxify(lambda a, b: a @ b)).lower(a, b).compile().as_text()
    assert hlo is not None
    assert "s32[6,5]" in hlo
    grouped = _weight(2, (16, 5), group_size=4, group_axis=0)
    with pytest.raises(qq.QuantMaterialisationError, match=r"dot_general.*int8 x int8"):
        quax.quaxify(lambda a, b: a @ b)(a, grouped)
    out = quax.quaxify(lambda a, b: a @ b)(
        a.enable_materialise(), grouped.enable_materialise()
    )
    np.testing.assert_allclose(
        out, ref.dequantise(a) @ ref.dequantise(grouped), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("symmetric", [True, False])
def test_conv(symmetric, matches_dense):
    conv = eqx.nn.Conv2d(3, 4, 3, padding=1, key=jr.PRNGKey(0))
    k = qq.quantise(conv.weight, axis=0, symmetric=symmetric)
    x = jr.normal(jr.PRNGKey(1), (3, 9, 9))
    matches_dense(
        lambda k, x: eqx.tree_at(lambda c: c.weight, conv, k)(x), k, x, atol=1e-4
    )
    grouped = qq.quantise(conv.weight, group_size=3)
    with pytest.raises(qq.QuantMaterialisationError, match="conv_general_dilated"):
        quax.quaxify(lambda k, x: eqx.tree_at(lambda c: c.weight, conv, k)(x))(
            grouped, x
        )


def test_structural_operations_keep_quantisation(ref):
    w = _weight(0, (4, 6, 8), bits=4, group_size=2, symmetric=False)
    d = ref.dequantise(w)
    cases = [
        (lambda w: jnp.transpose(w, (2, 0, 1)), lambda d: np.transpose(d, (2, 0, 1))),
        (lambda w: w.reshape(24, 8), lambda d: d.reshape(24, 8)),
        (lambda w: w.reshape(4, 6, 4, 2), lambda d: d.reshape(4, 6, 4, 2)),
        (lambda w: w.reshape(4, 48), lambda d: d.reshape(4, 48)),
        (lambda w: w[1:3, :, 2:6], lambda d: d[1:3, :, 2:6]),
        (lambda w: w[2], lambda d: d[2]),
        (lambda w: w[None][0], lambda d: d),
        (lambda w: -w, lambda d: -d),
        (lambda w: w * 2.5, lambda d: d * 2.5),
        (lambda w: w.astype(jnp.bfloat16), lambda d: d),
        (lambda w: lax.dynamic_slice_in_dim(w, 1, 2, axis=0), lambda d: d[1:3]),
    ]
    # One compiled program for every case (op by op, each primitive would compile
    # on its own): the rules keep the quantisation at trace time either way.
    # `w[None]` broadcasts: materialising is only allowed to refuse there.
    outs = jax.jit(quax.quaxify(lambda w: [op(w) for op, _ in cases]))(w)
    for (op, expected), out in zip(cases, outs, strict=True):
        assert isinstance(out, qq.QuantisedArray), op
        np.testing.assert_allclose(
            np.asarray(out.dequantise(), np.float32),
            expected(d),
            rtol=1e-2 if out.dtype == jnp.bfloat16 else 1e-6,
            atol=1e-6,
        )


def test_refusals_name_the_primitive():
    w = _weight(0, (4, 8), group_size=4)
    for fn, prim in [
        (jnp.exp, "exp"),
        (lambda w: w + 1.0, "add"),
        (lambda w: jnp.transpose(w).reshape(32), "reshape"),
        (lambda w: w[:, 1:3], "slice"),
        (lambda w: w * jnp.ones((4, 8)), "mul"),
        (lambda w: w.astype(jnp.int32), "convert_element_type"),
    ]:
        with pytest.raises(
            qq.QuantMaterialisationError,
            match=f"Refusing to materialise `QuantisedArray` for primitive `{prim}`",
        ):
            quax.quaxify(fn)(w)
    with pytest.raises(
        RuntimeError,
        match=r"Refusing to materialise `QuantisedArray` with "
        r"`allow_materialise=False`.*allow_materialise=True",
    ):
        w.materialise()
    assert isinstance(qq.QuantMaterialisationError(), quax.MaterialisationError)
    out = quax.quaxify(jnp.exp)(w.enable_materialise())
    np.testing.assert_allclose(out, jnp.exp(w.dequantise()), rtol=1e-6)
    with pytest.raises(qq.QuantMaterialisationError, match="not floating-point"):
        quax.quaxify(lambda w, x: w @ x)(w, jnp.ones((8,), jnp.int32))
