"""LoRA against the dense `w + s * a @ b`, through the conformance kit `quax.testing`:
values, jit, vmap, grad and jvp, nothing materialised, and the dense update never
formed in the compiled program; for products and for convolution kernels."""

from typing import Any

import equinox as eqx
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing as qt
import quax.testing.strategies as qst
import quax_lora
from hypothesis import given, settings
from jax import lax
from lora_helpers import normal


def _lora(shape, *, rank=2, stop_gradient=True, key=0):
    # It refuses to materialise; the kit densifies the reference through
    # `enable_materialise()`.
    k1, k2, k3 = jr.split(jr.key(key), 3)
    lora = quax_lora.LoraArray(
        normal(k1, shape),
        rank=rank,
        alpha=2.0 * rank,
        stop_gradient=stop_gradient,
        key=k2,
    )
    # A fresh adapter has b = 0; give it a nonzero update.
    return eqx.tree_at(lambda y: y.b, lora, 0.3 * normal(k3, lora.b.shape))


@pytest.mark.parametrize("stop_gradient", [True, False])
def test_matmul(stop_gradient):
    w = _lora((6, 5), stop_gradient=stop_gradient)
    x = normal(jr.key(7), (3, 6))
    # jit and vmap do not depend on `stop_gradient`: checked once, with it on.
    report = qt.assert_matches_dense(
        lambda w, x: x @ w,
        w,
        x,
        out_types=jax.Array,
        jit=stop_gradient,
        vmap=stop_gradient,
    )
    assert set(report.checks.values()) == {"passed"}
    assert {"grad", "jvp"} <= set(report.checks)


def test_batched_transpose_and_scale():
    w = _lora((2, 6, 5), rank=3)
    x = normal(jr.key(8), (2, 6, 4))
    qt.assert_matches_dense(
        lambda w, x: ((2.5 * jnp.swapaxes(w, -1, -2)) @ x, (-w) @ x[..., :5, :]),
        w,
        x,
        out_types=jax.Array,
    )


def test_loraified_linear_model():
    mlp = eqx.nn.MLP(4, 3, 8, depth=1, key=jr.key(1))
    model = quax_lora.loraify(mlp, rank=2, key=jr.key(2))
    model = jax.tree.map(
        lambda x: (
            eqx.tree_at(lambda y: y.b, x, 0.1 * jnp.ones_like(x.b))
            if quax_lora.is_lora(x)
            else x
        ),
        model,
        is_leaf=quax_lora.is_lora,
    )
    # The products under jit, vmap and jvp are checked above: here the whole model
    # (products, bias adds, activation) and its gradient.
    qt.assert_matches_dense(
        lambda m, x: m(x), model, jnp.linspace(-1, 1, 4), vmap=False, jvp=False
    )


@settings(max_examples=10, deadline=None)
@given(
    qst.programs(
        in_shapes=qst.shapes(2, 2, 1, 5),
        ops=("neg", "scale", "transpose", "matmul"),
        max_ops=3,
    ),
    qst.data(),
)
def test_random_programs_match_dense(program, data):
    # Random programs of the operations a LoRA weight has rules for (its products
    # and structural rules), on random shapes, ranks, scalings and factors.
    n, m = program.in_shape
    rank = data.draw(st.integers(1, min(n, m)), label="rank")
    alpha = data.draw(st.sampled_from([None, 1.0, 6.0]), label="alpha")
    w, a, b = (data.draw(qst.arrays(s)) for s in [(n, m), (n, rank), (rank, m)])
    lora = quax_lora.LoraArray(w, rank=rank, alpha=alpha, key=jr.key(0))
    qt.assert_matches_dense(program, eqx.tree_at(lambda y: (y.a, y.b), lora, (a, b)))


def test_dense_update_never_formed():
    w = _lora((64, 48), rank=2)
    x = normal(jr.key(9), (4, 64))
    # `w` itself is an input of that shape: only computed arrays count.
    qt.assert_hlo_lacks(
        lambda w, x: x @ w, w, x, shapes=[(64, 48), (48, 64)], ignore_parameters=True
    )
    # The kit sees it where a function does densify (`sin` has no LoRA rule).
    with pytest.raises(AssertionError, match=r"array f32\[64, 48\]"):
        qt.assert_hlo_lacks(
            lambda w, x: x @ jnp.sin(w),
            w.enable_materialise(),
            x,
            shapes=[(64, 48)],
            ignore_parameters=True,
        )


# Convolutions: a LoRA kernel through the kit, and under `jax.vmap` over inputs
# (factored) and over kernels (refused, by name) ---------------------------------------


def _kernel() -> Any:
    kw, ka, kb = jr.split(jr.key(0), 3)
    # alpha 6, rank 2: the update is scaled by 3.
    lora = quax_lora.LoraArray(
        normal(kw, (4, 3, 3)), rank=2, alpha=6.0, batch_ndim=0, key=ka
    )
    return eqx.tree_at(lambda lr: lr.b, lora, normal(kb, lora.b.shape))


def _conv(kernel: Any, x: Any) -> Any:
    return lax.conv_general_dilated(x, kernel, (1,), "SAME")


def test_conv_conforms() -> None:
    x = normal(jr.key(1), (2, 3, 9))
    # The kit's vmap batches the kernel too (one kernel per batch element): see
    # the two tests below for vmap over the inputs, and over kernels.
    qt.assert_matches_dense(_conv, _kernel(), x, vmap=False)


def test_conv_vmap_over_inputs() -> None:
    kernel = _kernel()
    xs = normal(jr.key(1), (5, 2, 3, 9))
    dense = kernel.w + 3.0 * jnp.einsum("or,rik->oik", kernel.a, kernel.b)
    expected = jax.vmap(lambda v: _conv(dense, v))(xs)
    for fn in (
        jax.vmap(quax.quaxify(_conv), in_axes=(None, 0)),
        quax.quaxify(jax.vmap(_conv, in_axes=(None, 0))),
    ):
        np.testing.assert_allclose(fn(kernel, xs), expected, rtol=1e-4, atol=1e-4)


def test_conv_vmap_over_kernels_refuses() -> None:
    # JAX batches a convolution over kernels as one grouped convolution of the
    # reshaped kernels, which a LoRA kernel does not factor: refused, by name.
    kernels = jax.tree.map(lambda leaf: jnp.stack([leaf, leaf]), _kernel())
    x = normal(jr.key(1), (2, 3, 9))
    with pytest.raises(
        RuntimeError, match=r"Refusing to materialise `LoraArray`.*reshape"
    ):
        quax.quaxify(jax.vmap(_conv, in_axes=(0, None)))(kernels, x)
