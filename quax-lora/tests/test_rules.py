"""The structural rules, convolutions, and the refusal to materialise."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from lora_helpers import normal


@pytest.fixture
def lora(perturb):
    weight = normal(jr.PRNGKey(0), (2, 6, 5))
    return perturb(
        quax_lora.LoraArray(weight, rank=3, alpha=6.0, key=jr.PRNGKey(1)), jr.PRNGKey(2)
    )


def _check(fn, lora, x, tol=1e-5):
    out = quax.quaxify(fn)(lora, x)
    expected = fn(quax_lora.merge(lora), x)
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(
        np.asarray(out, np.float32),
        np.asarray(expected, np.float32),
        rtol=tol,
        atol=tol,
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda lr, x: jnp.swapaxes(lr, -1, -2) @ jnp.tanh(x @ jnp.ones((5, 6))).T,
        lambda lr, x: x @ jnp.transpose(lr, (0, 2, 1)),
        lambda lr, x: (-lr) @ x.T,
        lambda lr, x: (2.5 * lr) @ x.T,
        lambda lr, x: (lr * jnp.float32(-3.0)) @ x.T,
        lambda lr, x: jnp.flip(lr, (0, 1, 2)) @ x.T,
    ],
)
def test_structural(fn, lora):
    x = normal(jr.PRNGKey(3), (4, 5))
    with quax.track_materialisation() as report:
        _check(fn, lora, x)
    assert not report


def test_transpose_keeps_low_rank(lora):
    out = quax.quaxify(lambda lr: jnp.swapaxes(lr, -1, -2))(lora)
    assert isinstance(out, quax_lora.LoraArray)
    assert (
        out.shape == (2, 5, 6) and out.a.shape == (2, 5, 3) and out.b.shape == (2, 3, 6)
    )


def test_convert_element_type(lora):
    x = normal(jr.PRNGKey(3), (4, 5), jnp.bfloat16)
    fn = lambda lr, v: lr.astype(jnp.bfloat16) @ v.T
    _check(fn, lora, x, tol=5e-2)
    # The array (its `w`) converts; the adapter keeps the wider of its dtype and
    # the new one, so a float32 adapter stays float32 (mixed precision).
    out = quax.quaxify(lambda lr: lr.astype(jnp.float16))(lora)
    assert isinstance(out, quax_lora.LoraArray)
    assert out.dtype == out.w.dtype == jnp.float16
    assert out.a.dtype == out.b.dtype == jnp.float32
    np.testing.assert_array_equal(out.a, lora.a)


def test_refuses_to_materialise(lora):
    with pytest.raises(
        quax_lora.LoraMaterialisationError,
        match=r"primitive `sin`.*allow_materialise=True",
    ):
        quax.quaxify(jnp.sin)(lora)
    with pytest.raises(
        quax_lora.LoraMaterialisationError, match="convert_element_type"
    ):
        quax.quaxify(lambda lr: lr.astype(jnp.int32))(lora)


def test_allow_materialise(lora):
    allowed = quax_lora.LoraArray(
        lora.w, rank=3, allow_materialise=True, key=jr.PRNGKey(4)
    )
    allowed = eqx.tree_at(lambda lr: lr.b, allowed, lora.b)
    with quax.track_materialisation() as report:
        out = quax.quaxify(jnp.sin)(allowed)
    assert report.total == 1
    np.testing.assert_allclose(out, jnp.sin(quax_lora.merge(allowed)), rtol=1e-6)


@pytest.mark.parametrize(
    "conv_cls, x_shape, kwargs",
    [
        (eqx.nn.Conv1d, (3, 11), {"kernel_size": 3, "stride": 2, "padding": 1}),
        (
            eqx.nn.Conv2d,
            (3, 9, 8),
            {"kernel_size": (3, 2), "dilation": 2, "padding": "SAME"},
        ),
        (eqx.nn.ConvTranspose2d, (3, 7, 7), {"kernel_size": 3, "stride": 2}),
    ],
)
def test_conv(conv_cls, x_shape, kwargs, perturb):
    conv = conv_cls(3, 4, key=jr.PRNGKey(0), **kwargs)
    lora_conv = perturb(
        quax_lora.loraify(conv, rank=2, filter=conv_cls, key=jr.PRNGKey(1)),
        jr.PRNGKey(2),
    )
    assert lora_conv.weight.a.shape == (4, 2)
    assert lora_conv.weight.b.shape == (2, *conv.weight.shape[1:])
    x = normal(jr.PRNGKey(3), x_shape)
    with quax.track_materialisation() as report:
        out = quax.quaxify(lora_conv)(x)
    assert not report
    np.testing.assert_allclose(out, quax_lora.merge(lora_conv)(x), rtol=1e-4, atol=1e-4)


def test_grouped_conv_refuses(perturb):
    conv = eqx.nn.Conv1d(4, 4, 3, groups=2, key=jr.PRNGKey(0))
    lora_conv = quax_lora.loraify(conv, rank=2, filter=eqx.nn.Conv, key=jr.PRNGKey(1))
    with pytest.raises(
        quax_lora.LoraMaterialisationError, match="conv_general_dilated"
    ):
        quax.quaxify(lora_conv)(jnp.ones((4, 9)))
    allowed = quax_lora.loraify(
        conv, rank=2, filter=eqx.nn.Conv, allow_materialise=True, key=jr.PRNGKey(1)
    )
    allowed = perturb(allowed, jr.PRNGKey(2))
    np.testing.assert_allclose(
        quax.quaxify(allowed)(jnp.ones((4, 9))),
        quax_lora.merge(allowed)(jnp.ones((4, 9))),
        rtol=1e-5,
    )


def test_jit_inside_and_out(lora):
    x = normal(jr.PRNGKey(3), (5,))
    expected = quax_lora.merge(lora) @ x
    f = lambda lr, v: lr @ v
    np.testing.assert_allclose(jax.jit(quax.quaxify(f))(lora, x), expected, rtol=1e-5)
    np.testing.assert_allclose(quax.quaxify(jax.jit(f))(lora, x), expected, rtol=1e-5)
