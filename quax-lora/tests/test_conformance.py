"""LoRA against the dense `w + s * a @ b`, through the conformance kit `quax.testing`:
values, jit, vmap, grad and jvp, nothing materialised, and the dense update never
formed in the compiled program."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import pytest
import quax.testing as qt
import quax_lora


def _lora(shape, *, rank=2, stop_gradient=True, key=0):
    # It refuses to materialise; the kit densifies the reference through
    # `enable_materialise()`.
    k1, k2, k3 = jr.split(jr.key(key), 3)
    lora = quax_lora.LoraArray(
        jr.normal(k1, shape),
        rank=rank,
        alpha=2.0 * rank,
        stop_gradient=stop_gradient,
        key=k2,
    )
    # A fresh adapter has b = 0; give it a nonzero update.
    return eqx.tree_at(lambda y: y.b, lora, 0.3 * jr.normal(k3, lora.b.shape))


@pytest.mark.parametrize("stop_gradient", [True, False])
def test_matmul(stop_gradient):
    w = _lora((6, 5), stop_gradient=stop_gradient)
    x = jr.normal(jr.key(7), (3, 6))
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
    x = jr.normal(jr.key(8), (2, 6, 4))
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


def test_dense_update_never_formed():
    w = _lora((64, 48), rank=2)
    x = jr.normal(jr.key(9), (4, 64))
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
