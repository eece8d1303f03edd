"""What the compiled programs hold: the int8 x int8 path runs an integer dot and
never a float weight; the weight-only product at one row keeps the float weight
inside a fusion (XLA on CPU fuses the conversion into the product), and from two
rows on it is dequantised in blocks, forward and backward.

These are the `"blocked"` formulation's promises (`quax_quant.Kernels`), the default
on every backend but the TPU, whose defaults (`"reduce"`, `"pallas"`, `"fused"`)
have promises of their own; the tests take `"blocked"` on every backend, but the
one-row test on a TPU, which takes the TPU's defaults (its docstring says why)."""

import dataclasses
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
import quax_quant as qq


N, K = 96, 160


@pytest.fixture(autouse=True)
def blocked() -> Iterator[None]:
    with qq.kernels(int8="blocked", int4="blocked", nf4="blocked", float8="blocked"):
        yield


def _weight(**kwargs):
    return qq.quantise(jr.normal(jr.PRNGKey(0), (N, K)), axis=0, **kwargs)


def _entry_arrays(hlo: str) -> list[tuple[str, tuple[int, ...]]]:
    """The arrays the entry computation writes out (fusion outputs, dots, ...):
    what the program materialises, as opposed to intermediates inside fusions."""
    entry = hlo[hlo.index("ENTRY") :]
    entry = entry[: entry.index("\n}")]
    return [a for i in quax.testing.hlo_instructions(entry) for a in i.arrays]


def test_int8_path_has_integer_dot_and_no_float_weight():
    for bits in (8, 4):
        w = _weight(bits=bits, matmul="int8")
        x = jr.normal(jr.PRNGKey(1), (16, K))
        hlo = quax.testing.assert_hlo_lacks(
            lambda w, x: x @ w.T, w, x, shapes=[(N, K), (K, N)], dtypes=["f32"]
        )
        # XLA's TPU compiler gives every `dot` as a `convolution`.
        product = "convolution" if jax.default_backend() == "tpu" else "dot"
        dots = [i for i in quax.testing.hlo_instructions(hlo) if i.op == product]
        assert dots and all(i.arrays == (("s32", (16, N)),) for i in dots), dots


def test_weight_only_one_row_never_writes_the_float_weight():
    """One row under the formulations a user gets on each backend: `"blocked"`
    (the CPU's), whose conversion XLA on CPU fuses into the product; the TPU's own
    defaults (`DEFAULT_KERNELS["tpu"]`: `"reduce"` for int8, `"pallas"` for int4
    without zero points, and where the kernel does not apply, as for the
    asymmetric groups, `"reduce"` at one row), on every backend. On a TPU v5e
    (JAX 0.10.2) XLA wrote the converted weight out before a one-row product
    under `"blocked"` (f32[96,160], 2026-12-07), why it is not the TPU's default,
    and under `"fused"` for the asymmetric groups (2026-12-08), as XLA on CPU
    does (checked below), why the kernel's fallback at one row is `"reduce"`."""
    grouped = qq.quantise(
        jr.normal(jr.PRNGKey(0), (N, K)), bits=4, group_size=32, symmetric=False
    )
    x = jr.normal(jr.PRNGKey(1), (K,))
    tpu = dataclasses.asdict(qq.DEFAULT_KERNELS["tpu"])
    choices = [tpu] if jax.default_backend() == "tpu" else [{}, tpu]
    for choice in choices:
        for w in (_weight(matmul="weight_only"), _weight(bits=4), grouped):
            with qq.kernels(**choice):
                hlo = quax.testing.compiled_hlo(lambda w, x: w @ x, w, x)
            assert ("f32", (N, K)) not in _entry_arrays(hlo), (choice, w)
            assert "f32[96,160]" not in hlo.split("ENTRY")[1].split("\n}")[0]
            # That the check can fail: XLA on CPU converts the weight inside the
            # product's fusion under "blocked".
            if jax.default_backend() == "cpu" and not choice:
                assert ("f32", (N, K)) in [
                    a for i in quax.testing.hlo_instructions(hlo) for a in i.arrays
                ], "expected the conversion fused into the product"
    # And that it fails where the whole float weight is written: "fused" at one
    # row of the asymmetric groups (on a TPU v5e, and on the CPU).
    with qq.kernels(**{**tpu, "int4": "fused"}):
        hlo = quax.testing.compiled_hlo(lambda w, x: w @ x, grouped, x)
    assert ("f32", (N, K)) in _entry_arrays(hlo)


def _float_arrays(hlo: str) -> list[tuple[int, ...]]:
    return [
        shape
        for i in quax.testing.hlo_instructions(hlo)
        for dtype, shape in i.arrays
        if dtype == "f32"
    ]


def test_weight_only_batch_dequantises_in_blocks():
    """From 2 rows on the weight-only product dequantises one block of at most
    `BLOCK_ELEMENTS` elements at a time, forward and in the gradient with respect
    to the activations (the transposed product `g . w`); for integers, NF4 with
    double quantisation and float8 alike."""
    n, k = 1024, 512  # two blocks of 512 x 512
    assert n * k > qq.BLOCK_ELEMENTS
    dense = jr.normal(jr.PRNGKey(0), (n, k)) / math.sqrt(k)
    x = jr.normal(jr.PRNGKey(1), (16, k))
    for w in (
        qq.quantise(dense, axis=0, matmul="weight_only"),
        qq.quantise(dense, bits=4, group_size=64, symmetric=False),
        qq.quantise(dense, format="nf4", double_quant=True),
        qq.quantise(dense, format="float8_e4m3fn", axis=0),
    ):

        def grad_x(w, x):
            return jax.grad(lambda x: jnp.sum(jnp.sin(x @ w.T)))(x)

        for fn in (lambda w, x: x @ w.T, lambda w, x: w @ x.T, grad_x):
            hlo = quax.testing.assert_hlo_lacks(
                fn, w, x, shapes=[(n, k), (k, n)], dtypes=["f32"]
            )
            biggest = max(math.prod(s) for s in _float_arrays(hlo))
            assert biggest <= qq.BLOCK_ELEMENTS, biggest
        out = jax.jit(quax.quaxify(grad_x))(w, x)
        ref = grad_x(w.dequantise(), x)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_blocks_along_a_packed_axis_with_a_remainder():
    """Blocks along the axis int4 is packed along (unpacked block by block), and a
    last block shorter than the others."""
    k, n = 512, 768  # one block of 512 columns, then 256
    assert k * n > qq.BLOCK_ELEMENTS
    w = qq.quantise(
        jr.normal(jr.PRNGKey(0), (k, n)) / math.sqrt(k),
        bits=4,
        axis=1,
        matmul="weight_only",
    )
    x = jr.normal(jr.PRNGKey(1), (16, k))
    hlo = quax.testing.assert_hlo_lacks(
        lambda x, w: x @ w, x, w, shapes=[(k, n), (n, k)], dtypes=["f32"]
    )
    assert max(math.prod(s) for s in _float_arrays(hlo)) <= qq.BLOCK_ELEMENTS
    out = jax.jit(quax.quaxify(lambda x, w: x @ w))(x, w)
    np.testing.assert_allclose(out, x @ w.dequantise(), rtol=1e-4, atol=1e-4)


def test_act_order_product_never_forms_the_float_weight():
    """A GPTQ act-order (`desc_act`) int4 weight: the product gathers the
    activations' features by `input_order` (a gather of `x`, never of the weight)
    and multiplies the stored integers, so no float copy of the `(out, in)` weight
    (nor of its transpose) is ever formed: at one row it stays inside the product's
    fusion, from two rows on it is dequantised in blocks, forward and in the
    gradient with respect to the activations. Values against plain JAX on the
    dequantised weight, whose columns `dequantise` puts back in place."""
    n, k = 512, 1024  # (out, in): two blocks of 512 x 512
    assert n * k > qq.BLOCK_ELEMENTS
    dense = jr.normal(jr.PRNGKey(0), (n, k)) / math.sqrt(k)
    stored = qq.quantise(dense, bits=4, group_size=128, symmetric=False)
    # Stored column j is input feature order[j], as `from_gptq` lays act-order out.
    order = jr.permutation(jr.PRNGKey(2), k)
    w = dataclasses.replace(stored, input_order=order)
    assert qq.describe(w)["act_order"] is True
    reference = jnp.zeros((n, k)).at[:, order].set(stored.dequantise())
    np.testing.assert_allclose(w.dequantise(), reference, rtol=1e-6, atol=1e-6)
    forbidden = {"shapes": [(n, k), (k, n)], "dtypes": ["f32"]}

    row = jr.normal(jr.PRNGKey(1), (k,))
    hlo = quax.testing.compiled_hlo(lambda w, x: w @ x, w, row)
    assert ("f32", (n, k)) not in _entry_arrays(hlo)
    assert ("f32", (k, n)) not in _entry_arrays(hlo)
    np.testing.assert_allclose(
        jax.jit(quax.quaxify(lambda w, x: w @ x))(w, row),
        reference @ row,
        rtol=1e-4,
        atol=1e-4,
    )

    def batch(w, x):
        return jnp.einsum("bi,oi->bo", x, w)

    def grad_x(w, x):
        return jax.grad(lambda x: jnp.sum(jnp.sin(batch(w, x))))(x)

    x = jr.normal(jr.PRNGKey(3), (16, k))
    for fn in (batch, jax.vmap(lambda w, x: w @ x, in_axes=(None, 0)), grad_x):
        hlo = quax.testing.assert_hlo_lacks(fn, w, x, **forbidden)
        biggest = max(math.prod(s) for s in _float_arrays(hlo))
        assert biggest <= qq.BLOCK_ELEMENTS, biggest
        np.testing.assert_allclose(
            jax.jit(quax.quaxify(fn))(w, x), fn(reference, x), rtol=1e-4, atol=1e-4
        )
