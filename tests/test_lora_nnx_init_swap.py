"""quax-lora's base-changing initialisations and adapter swaps on Flax NNX
models: OLoRA and PiSSA on an `nnx.Linear` kernel `(in, out)` give peft's
factors of torch's `(out, in)` weight, and an `nnx.jit` step given another
adapter of the same rank runs the compiled program."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_lora
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.layers = nnx.List(
            [nnx.Linear(12, 20, rngs=rngs), nnx.Linear(20, 6, rngs=rngs)]
        )

    def __call__(self, x):
        return self.layers[1](jnp.tanh(self.layers[0](x)))


RANK, ALPHA = 3, 6.0
X = jr.normal(jr.key(5), (4, 12))


def test_olora_on_an_nnx_kernel_is_pefts_of_the_torch_weight():
    model = MLP(nnx.Rngs(0))
    kernel = np.asarray(model.layers[0].kernel.get_value(), np.float64)  # (in, out)
    lora = quax_lora.loraify(model, rank=RANK, alpha=ALPHA, init="olora", key=jr.key(1))
    got = lora.layers[0].kernel.get_value()
    # peft's OLoRA of torch's weight (out, in) = kernel^T: Q_r, R_r of its QR.
    q, r = np.linalg.qr(kernel.T)
    q, r = q[:, :RANK], r[:RANK]
    sign = np.sign(np.diag(r)) * np.sign(np.diag(np.asarray(got.a).T[:, :RANK]))
    # Our a is lora_A^T = R_r^T (in, rank), our b lora_B^T = Q_r^T (rank, out).
    np.testing.assert_allclose(np.asarray(got.a) * sign, r.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.b) * sign[:, None], q.T, atol=1e-5)
    scaling = ALPHA / RANK
    np.testing.assert_allclose(got.w, kernel - scaling * r.T @ q.T, atol=1e-5)
    np.testing.assert_allclose(quax.quaxify(lora)(X), model(X), rtol=1e-5, atol=1e-5)


def test_pissa_on_nnx_keeps_the_outputs():
    model = MLP(nnx.Rngs(0))
    lora = quax_lora.loraify(model, rank=RANK, alpha=ALPHA, init="pissa", key=jr.key(1))
    got = lora.layers[1].kernel.get_value()
    u, s, vh = np.linalg.svd(np.asarray(model.layers[1].kernel.get_value()).T)
    principal = (u[:, :RANK] * s[:RANK] @ vh[:RANK]).T  # in NNX's (in, out)
    np.testing.assert_allclose(
        ALPHA / RANK * np.asarray(got.a) @ np.asarray(got.b), principal, atol=1e-5
    )
    np.testing.assert_allclose(quax.quaxify(lora)(X), model(X), rtol=1e-5, atol=1e-5)


def _with_b(model, seed):
    model = nnx.clone(model)
    state = nnx.state(model, nnx.LoRAParam)
    for i, (path, variable) in enumerate(nnx.to_flat_state(state)):
        if path[-1] == "b":
            shape = variable.get_value().shape
            variable.set_value(jr.normal(jr.key(100 * seed + i), shape))
    nnx.update(model, state)
    return model


def test_nnx_jit_runs_the_compiled_step_for_another_adapter(tmp_path):
    traces = []

    @nnx.jit
    def step(model, x):
        traces.append(1)
        return quax.quaxify(model)(x)

    base = quax_lora.loraify(MLP(nnx.Rngs(0)), rank=RANK, alpha=ALPHA, key=jr.key(1))
    first, second = _with_b(base, 1), _with_b(base, 2)
    quax_lora.save_adapter(tmp_path, second, format="peft")
    loaded = quax_lora.load_adapter(tmp_path, first)
    outputs = [step(m, X) for m in (first, second, loaded)]
    assert len(traces) == 1
    np.testing.assert_allclose(outputs[0], quax.quaxify(first)(X), rtol=1e-5)
    np.testing.assert_allclose(outputs[1], quax.quaxify(second)(X), rtol=1e-5)
    np.testing.assert_allclose(outputs[2], outputs[1], rtol=1e-6)
    assert not np.allclose(outputs[0], outputs[1])
    # Swapping the state of one model in place (nnx.update) runs it too.
    nnx.update(first, nnx.state(second, nnx.LoRAParam))
    np.testing.assert_allclose(step(first, X), outputs[1], rtol=1e-6)
    assert len(traces) == 1
    jax.block_until_ready(outputs)
