"""quax-named composed with symbolic zeros and with LoRA, in real programs."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_lora
from quax.zero import Zero
from quax_named import NamedArray


def test_named_plus_symbolic_zero_keeps_names():
    x = NamedArray(jnp.arange(6.0).reshape(2, 3), ("batch", "feature"))
    out = quax.quaxify(lambda z, x: z + x * 2.0)(Zero((2, 3), jnp.float32), x)
    assert isinstance(out, NamedArray) and out.names == ("batch", "feature")
    np.testing.assert_array_equal(out.array, np.arange(6.0).reshape(2, 3) * 2.0)
    prod = quax.quaxify(lambda z, x: z * x)(Zero((2, 3), jnp.float32), x)
    assert isinstance(prod, Zero)


def test_named_lora_weight_contracts_by_name_without_forming_w_plus_ab():
    lora = quax_lora.LoraArray(
        jr.normal(jr.PRNGKey(0), (4, 3)), rank=2, key=jr.PRNGKey(1)
    )
    lora = eqx.tree_at(lambda m: m.b, lora, jr.normal(jr.PRNGKey(2), (2, 3)))
    w = NamedArray(lora, ("in", "out"))
    x = NamedArray(jr.normal(jr.PRNGKey(3), (5, 4)), ("batch", "in"))
    fn = quax.quaxify(lambda x, w: jax.nn.relu(x @ w))
    with quax.track_materialisation() as report:
        out = jax.jit(fn)(x, w)
    assert not report, str(report)
    assert out.names == ("batch", "out")
    dense = np.asarray(lora.w) + np.asarray(lora.a) @ np.asarray(lora.b)
    want = np.maximum(np.asarray(x.array) @ dense, 0.0)
    np.testing.assert_allclose(out.array, want, rtol=1e-5, atol=1e-5)
    # Gradient with respect to the LoRA factors, through the names.
    grads = jax.grad(lambda w: jnp.sum(fn(x, w).array))(w)
    assert isinstance(grads, NamedArray) and grads.names == ("in", "out")


def test_scan_over_named_inputs_with_a_named_lora_weight():
    # lax.scan slices the named inputs; the LoRA weight is a constant of the body
    # and contracts by name through the LoRA rule at every step.
    lora = quax_lora.LoraArray(
        jr.normal(jr.PRNGKey(0), (4, 4)) / 2, rank=2, key=jr.PRNGKey(1)
    )
    lora = eqx.tree_at(lambda m: m.b, lora, jr.normal(jr.PRNGKey(2), (2, 4)))
    w = NamedArray(lora, ("in", "hidden"))
    xs = NamedArray(jr.normal(jr.PRNGKey(3), (5, 3, 4)), ("seq", "batch", "in"))

    def rnn(w, xs):
        def cell(h, x):
            h = jnp.tanh(x @ w + h)
            return h, jnp.sum(h, axis=-1)

        return jax.lax.scan(cell, jnp.zeros((3, 4)), xs)

    with quax.track_materialisation() as report:
        h, ys = jax.jit(quax.quaxify(rnn))(w, xs)
    assert not report, str(report)
    assert h.names == ("batch", "hidden") and ys.names == ("seq", "batch")
    dense = np.asarray(lora.w) + np.asarray(lora.a) @ np.asarray(lora.b)
    want_h, want_ys = rnn(jnp.asarray(dense), xs.array)
    np.testing.assert_allclose(h.array, want_h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ys.array, want_ys, rtol=1e-5, atol=1e-5)
