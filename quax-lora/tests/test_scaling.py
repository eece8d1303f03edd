"""LoRA against references computed independently of quax_lora: the dense weight is
written out as `w + s * a @ b` with a literal scale `s` (0.5, 3 and 1), never through
`scaling`, `delta()` or `merge()`, and convolutions use `alpha != rank`."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
import quax_lora
from lora_helpers import normal


# (alpha, rank, the scale alpha / rank written out)
SCALES = [(1.0, 2, 0.5), (6.0, 2, 3.0), (None, 2, 1.0)]
TOL: quax.testing.Tolerance = {"rtol": 1e-5, "atol": 1e-5}


def _factors(key: Any, n: int, m: int, rank: int) -> tuple[jax.Array, ...]:
    kw, ka, kb = jr.split(key, 3)
    return (
        normal(kw, (n, m)),
        normal(ka, (n, rank)),
        normal(kb, (rank, m)),
    )


def _lora(w: jax.Array, a: jax.Array, b: jax.Array, alpha: float | None) -> Any:
    lora = quax_lora.LoraArray(w, rank=a.shape[-1], alpha=alpha, key=jr.key(9))
    return eqx.tree_at(lambda lr: (lr.a, lr.b), lora, (a, b))


@pytest.mark.parametrize("alpha, rank, s", SCALES)
def test_products_against_literal_scale(alpha: Any, rank: int, s: float) -> None:
    w, a, b = _factors(jr.key(0), 6, 5, rank)
    lora = _lora(w, a, b, alpha)
    dense = w + s * (a @ b)
    x = normal(jr.key(1), (5,))
    xs = normal(jr.key(2), (3, 5))
    ys = normal(jr.key(3), (4, 6))
    np.testing.assert_allclose(
        quax.quaxify(lambda m, v: m @ v)(lora, x), dense @ x, **TOL
    )
    np.testing.assert_allclose(
        quax.quaxify(lambda m, v: v @ m.T)(lora, xs), xs @ dense.T, **TOL
    )
    np.testing.assert_allclose(
        quax.quaxify(lambda m, v: v @ m)(lora, ys), ys @ dense, **TOL
    )
    np.testing.assert_allclose(quax_lora.merge(lora), dense, **TOL)


@pytest.mark.parametrize("alpha, rank, s", SCALES)
def test_structural_rules_against_literal_scale(
    alpha: Any, rank: int, s: float
) -> None:
    w, a, b = _factors(jr.key(4), 6, 5, rank)
    lora = _lora(w, a, b, alpha)
    dense = w + s * (a @ b)
    x = normal(jr.key(5), (6,))
    cases = [
        (lambda m, v: m.T @ v, dense.T @ x),
        (lambda m, v: (-m).T @ v, -dense.T @ x),
        (lambda m, v: (0.25 * m).T @ v, 0.25 * dense.T @ x),
        (lambda m, v: jnp.flip(m, (0, 1)).T @ v[::-1], dense[::-1, ::-1].T @ x[::-1]),
    ]
    for fn, expected in cases:
        np.testing.assert_allclose(quax.quaxify(fn)(lora, x), expected, **TOL)


@pytest.mark.parametrize("alpha, rank, s", SCALES)
def test_gradients_against_literal_scale(alpha: Any, rank: int, s: float) -> None:
    w, a, b = _factors(jr.key(6), 4, 3, rank)
    x = normal(jr.key(7), (3,))

    def loss(lora: Any) -> jax.Array:
        return jnp.sum(jnp.tanh(quax.quaxify(lambda m, v: m @ v)(lora, x)))

    def reference(a_: jax.Array, b_: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh((w + s * (a_ @ b_)) @ x))

    grads = jax.grad(loss)(_lora(w, a, b, alpha))
    ga, gb = jax.grad(reference, argnums=(0, 1))(a, b)
    np.testing.assert_allclose(grads.a, ga, **TOL)
    np.testing.assert_allclose(grads.b, gb, **TOL)
    # `w` is frozen: its gradient is zero.
    np.testing.assert_array_equal(grads.w, jnp.zeros_like(w))


CONVS = [
    (eqx.nn.Conv1d, (3, 11), {"kernel_size": 3, "stride": 2, "padding": 1}),
    (eqx.nn.Conv2d, (3, 9, 8), {"kernel_size": (3, 2), "dilation": 2}),
    (eqx.nn.ConvTranspose2d, (3, 7, 7), {"kernel_size": 3, "stride": 2}),
]


@pytest.mark.parametrize("alpha, s", [(1.0, 0.5), (6.0, 3.0)])
@pytest.mark.parametrize("conv_cls, x_shape, kwargs", CONVS)
def test_conv_with_alpha_not_rank(
    conv_cls: Any, x_shape: Any, kwargs: Any, alpha: float, s: float
) -> None:
    rank = 2
    conv = conv_cls(3, 4, key=jr.key(0), **kwargs)
    lora_conv = quax_lora.loraify(
        conv, rank=rank, alpha=alpha, filter=conv_cls, key=jr.key(1)
    )
    kernel = conv.weight
    a = normal(jr.key(2), (kernel.shape[0], rank))
    b = normal(jr.key(3), (rank, *kernel.shape[1:]))
    lora_conv = eqx.tree_at(lambda c: (c.weight.a, c.weight.b), lora_conv, (a, b))
    # The adapted kernel, written out: out-channel mixing of a rank-`rank` kernel.
    dense_kernel = kernel + s * jnp.einsum("or,r...->o...", a, b)
    reference = eqx.tree_at(lambda c: c.weight, conv, dense_kernel)
    x = normal(jr.key(4), x_shape)
    with quax.track_materialisation() as report:
        out = quax.quaxify(lora_conv)(x)
    assert not report
    np.testing.assert_allclose(out, reference(x), rtol=1e-4, atol=1e-4)


def test_loraify_caps_the_rank_of_a_small_layer_keeping_the_scale() -> None:
    # The head maps 8 features to 1 output: rank 4 is more than it can use.
    mlp = eqx.nn.MLP(4, 1, 8, depth=1, activation=jnp.tanh, key=jr.key(0))
    model = quax_lora.loraify(mlp, rank=4, alpha=8.0, key=jr.key(1))
    hidden, head = model.layers
    assert hidden.weight.rank == 4 and head.weight.rank == 1
    b_hidden = normal(jr.key(2), (4, 4))
    b_head = normal(jr.key(3), (1, 8))
    model = eqx.tree_at(
        lambda m: (m.layers[0].weight.b, m.layers[1].weight.b),
        model,
        (b_hidden, b_head),
    )
    hidden, head = model.layers
    # Both layers use the scale alpha / rank = 8 / 4 = 2, written out.
    w1 = mlp.layers[0].weight + 2.0 * (hidden.weight.a @ b_hidden)
    w2 = mlp.layers[1].weight + 2.0 * (head.weight.a @ b_head)
    x = normal(jr.key(4), (4,))
    expected = w2 @ jnp.tanh(w1 @ x + mlp.layers[0].bias) + mlp.layers[1].bias
    np.testing.assert_allclose(quax.quaxify(model)(x), expected, **TOL)
