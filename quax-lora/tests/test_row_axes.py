"""`LoraArray(row_ndim=...)`: rows spanning several axes, as Flax NNX lays out a
convolution kernel `(*window, in, out)` (rows `(*window, in)`) and the output
projection of an attention `(heads, head_dim, out)` (rows `(heads, head_dim)`),
each against plain JAX on the dense weight `w + s a b` formed by hand."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from jax import lax
from lora_helpers import normal


HWIO = ("NHWC", "HWIO", "NHWC")


def _lora(weight, row_ndim, **kwargs):
    """A `LoraArray` of `weight` with rows of `row_ndim` axes and a random `b`."""
    lora = quax_lora.LoraArray(
        weight, rank=2, alpha=3.0, batch_ndim=0, row_ndim=row_ndim, key=jr.key(1)
    )
    b = 0.5 * normal(jr.key(2), lora.b.shape)
    return eqx.tree_at(lambda x: x.b, lora, b).replace(**kwargs)


def _dense(lora):
    """`w + s a b` by hand: `a`'s last axis (the rank) against `b`'s first."""
    return lora.w + lora.scaling * jnp.tensordot(lora.a, lora.b, axes=1)


def _shapes(jaxpr, names):
    return [
        tuple(v.aval.shape)
        for eqn in jaxpr.jaxpr.eqns
        if eqn.primitive.name in names
        for v in eqn.outvars
    ]


def test_factors_are_laid_out_by_row_axes():
    kernel = normal(jr.key(0), (3, 3, 4, 5))
    lora = quax_lora.LoraArray(kernel, rank=2, batch_ndim=0, row_ndim=3, key=jr.key(1))
    assert lora.a.shape == (3, 3, 4, 2) and lora.b.shape == (2, 5)
    assert (lora.batch_ndim, lora.row_ndim, lora.rank) == (0, 3, 2)
    lora = _lora(kernel, 3)
    np.testing.assert_allclose(
        lora.w + lora.delta(),
        kernel + lora.scaling * jnp.einsum("hwir,ro->hwio", lora.a, lora.b),
        rtol=1e-6,
    )


def test_conv_with_an_hwio_kernel_matches_plain_jax():
    kernel = normal(jr.key(0), (3, 3, 4, 5))
    x = normal(jr.key(3), (2, 8, 8, 4))
    lora = _lora(kernel, 3)

    def conv(x, k):
        return lax.conv_general_dilated(
            x, k, (2, 1), "SAME", rhs_dilation=(1, 2), dimension_numbers=HWIO
        )

    expected = conv(x, _dense(lora))
    assert not np.allclose(expected, conv(x, kernel), atol=1e-3)
    np.testing.assert_allclose(
        quax.quaxify(conv)(x, lora), expected, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        jax.jit(quax.quaxify(conv))(x, lora), expected, rtol=1e-5, atol=1e-5
    )

    # The gradient with respect to the factors, against the dense one's chain rule.
    def loss(a, b):
        return jnp.sum(jnp.sin(quax.quaxify(conv)(x, lora.replace(a=a, b=b))))

    def dense_loss(a, b):
        return jnp.sum(jnp.sin(conv(x, _dense(lora.replace(a=a, b=b)))))

    for got, want in zip(
        jax.grad(loss, (0, 1))(lora.a, lora.b),
        jax.grad(dense_loss, (0, 1))(lora.a, lora.b),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # Never the dense kernel: no product or sum of kernel shape is formed.
    jaxpr = jax.make_jaxpr(quax.quaxify(conv))(x, lora)
    assert (3, 3, 4, 5) not in _shapes(jaxpr, {"dot_general", "add"})


def test_dot_general_with_two_row_axes_matches_plain_jax():
    """An attention's output projection: `(heads, head_dim, out)` contracted over
    its first two axes."""
    kernel = normal(jr.key(0), (2, 3, 7))
    x = normal(jr.key(3), (4, 5, 2, 3))
    lora = _lora(kernel, 2)
    assert lora.a.shape == (2, 3, 2) and lora.b.shape == (2, 7)

    def project(x, k):
        return lax.dot_general(x, k, (((2, 3), (0, 1)), ((), ())))

    expected = jnp.einsum("bthd,hdo->bto", x, _dense(lora))
    np.testing.assert_allclose(
        quax.quaxify(project)(x, lora), expected, rtol=1e-5, atol=1e-5
    )
    # The kernel on the left: contract its output axis with x's last.
    y = normal(jr.key(4), (6, 7))
    np.testing.assert_allclose(
        quax.quaxify(lambda k, y: lax.dot_general(k, y, (((2,), (1,)), ((), ()))))(
            lora, y
        ),
        jnp.einsum("hdo,bo->hdb", _dense(lora), y),
        rtol=1e-5,
        atol=1e-5,
    )
    jaxpr = jax.make_jaxpr(quax.quaxify(project))(x, lora)
    assert (2, 3, 7) not in _shapes(jaxpr, {"dot_general", "add"})


def test_rev_flips_the_window_in_a():
    """`rev` of an NNX kernel's spatial axes (as a transposed convolution does)
    flips them in `a`, and an output axis in `b`."""
    lora = _lora(normal(jr.key(0), (3, 2, 4, 5)), 3)
    for dims in ((0, 1), (3,), (1, 3)):
        out = quax.quaxify(lambda k, dims=dims: lax.rev(k, dims))(lora)
        assert isinstance(out, quax_lora.LoraArray) and out.row_ndim == 3
        np.testing.assert_allclose(
            _dense(out), lax.rev(_dense(lora), dims), rtol=1e-6, atol=1e-6
        )


def test_structural_rules_needing_one_row_axis_refuse():
    lora = _lora(normal(jr.key(0), (3, 3, 4, 5)), 3)
    with pytest.raises(quax_lora.LoraMaterialisationError, match="transpose"):
        quax.quaxify(lambda k: jnp.transpose(k, (3, 2, 0, 1)))(lora)
    # A grouped convolution does not factor: it refuses, naming the primitive.
    x = normal(jr.key(3), (1, 6, 6, 8))
    grouped = _lora(normal(jr.key(0), (3, 3, 4, 6)), 3)
    with pytest.raises(
        quax_lora.LoraMaterialisationError, match="conv_general_dilated"
    ):
        quax.quaxify(
            lambda x, k: lax.conv_general_dilated(
                x, k, (1, 1), "SAME", dimension_numbers=HWIO, feature_group_count=2
            )
        )(x, grouped)
    # Allowed to materialise, it is the dense kernel's convolution.
    allowed = grouped.enable_materialise()
    got = quax.quaxify(
        lambda x, k: lax.conv_general_dilated(
            x, k, (1, 1), "SAME", dimension_numbers=HWIO, feature_group_count=2
        )
    )(x, allowed)
    want = lax.conv_general_dilated(
        x,
        _dense(grouped),
        (1, 1),
        "SAME",
        dimension_numbers=HWIO,
        feature_group_count=2,
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("row_ndim", [0, 4, True, 1.0])
def test_bad_row_ndim_is_refused(row_ndim):
    with pytest.raises(ValueError, match="row_ndim"):
        quax_lora.LoraArray(
            jnp.ones((3, 3, 4, 5)),
            rank=2,
            batch_ndim=0,
            row_ndim=row_ndim,
            key=jr.key(0),
        )


def test_dora_with_several_row_axes_is_refused():
    with pytest.raises(ValueError, match=r"variant='dora'.*row_ndim=1"):
        quax_lora.LoraArray(
            jnp.ones((3, 4, 5)),
            rank=2,
            batch_ndim=0,
            row_ndim=2,
            variant="dora",
            key=jr.key(0),
        )


def test_adapter_file_records_row_ndim(tmp_path):
    """Two arrays of one shape whose rows differ compute different products: an
    adapter saved from one is refused by the other, naming `row_ndim`."""
    weight = jnp.ones((4, 3, 5))
    rows2 = {"w": _lora(weight, 2)}
    quax_lora.save_adapter(tmp_path / "adapter", rows2)
    loaded = quax_lora.load_adapter(tmp_path / "adapter", {"w": _lora(weight, 2)})
    np.testing.assert_array_equal(loaded["w"].b, rows2["w"].b)
    rows1 = {"w": _lora(weight, 1)}
    with pytest.raises(ValueError, match="row_ndim=2"):
        quax_lora.load_adapter(tmp_path / "adapter", rows1)
