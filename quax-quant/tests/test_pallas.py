"""The Pallas weight-only kernel (`quax_quant._pallas`), run in interpret mode on
the CPU against the XLA path it stands in for (`"fused"`, the product every
backend can compile) and against NumPy: every stored format (int8, int4 and NF4
packed two per byte, NF4 indices one per byte, both float8s), every scale layout
it takes (per tensor, per channel, groups of 64, 128 and 256 inputs, a group
spanning several steps), row counts below, at and above a tile (with padding);
where it does not apply, `plan` says so. The TPU compiles the same kernel
(`benchmarks/quant.py --tpu` times it there)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_quant as qq
from quax_quant import _pallas


N, K = 256, 512

LAYOUTS = {
    "int8 per channel": {"bits": 8, "axis": 0},
    "int8 per tensor": {"bits": 8},
    "int8 groups of 128": {"bits": 8, "group_size": 128},
    "int4 groups of 128": {"bits": 4, "group_size": 128},
    "int4 groups of 256": {"bits": 4, "group_size": 256},
    "int4 per channel": {"bits": 4, "axis": 0},
    "nf4 blocks of 64": {"format": "nf4", "block_size": 64},
    "nf4 blocks of 128, double quant": {
        "format": "nf4",
        "block_size": 128,
        "double_quant": True,
    },
    "float8 e4m3fn per channel": {"format": "float8_e4m3fn", "axis": 0},
    "float8 e5m2 groups of 64": {"format": "float8_e5m2", "group_size": 64},
}


def _weight(layout):
    w = jax.random.normal(jax.random.PRNGKey(0), (N, K)) / np.sqrt(K)
    return qq.quantise(w, matmul="weight_only", **LAYOUTS[layout]).plain()


def _run(q, x, tiles=None, dtype=jnp.float32):
    packed = q.bits == 4
    tiling = _pallas.plan(
        x.shape[0], N, K, q.format, packed, tuple(q.scale.shape), tiles
    )
    assert tiling is not None
    return _pallas.weight_only_matmul(
        x,
        q.values,
        q.scale,
        fmt=q.format,
        plan=tiling,
        dtype=dtype,
        out_dtype=jnp.float32,
        interpret=True,
    )


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("rows", [1, 8, 520])
def test_kernel_matches_numpy_and_the_xla_path(layout, rows, ref):
    """520 rows: tiles of 512 rows, the last one padded."""
    q = _weight(layout)
    x = jax.random.normal(jax.random.PRNGKey(rows), (rows, K))
    got = _run(q, x)
    want = np.asarray(x, np.float64) @ ref.dequantise(q).T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with qq.kernels(int8="fused", int4="fused", nf4="fused", float8="fused"):
        fused = jax.jit(quax.quaxify(lambda w, x: x @ w.T))(q, x)
    np.testing.assert_allclose(got, fused, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "tiles",
    [
        (8, 128, 128),  # groups of 128: one per step
        (8, 128, 256),  # two groups per step
        (8, 256, 128),
    ],
)
def test_other_tilings(tiles, ref):
    """Several tilings of the same product; with groups of 256 inputs and steps
    of 128 bytes, a group spans two steps (its scale block indexed by step // 2)."""
    for layout in ("int4 groups of 128", "int4 groups of 256", "int8 groups of 128"):
        q = _weight(layout)
        x = jax.random.normal(jax.random.PRNGKey(3), (8, K))
        want = np.asarray(x, np.float64) @ ref.dequantise(q).T
        np.testing.assert_allclose(_run(q, x, tiles), want, rtol=1e-4, atol=1e-4)


def test_bfloat16_activations(ref):
    """bfloat16 `x`: the levels are multiplied in bfloat16, summed in float32."""
    q = _weight("int4 groups of 128")
    x = jax.random.normal(jax.random.PRNGKey(4), (8, K)).astype(jnp.bfloat16)
    got = _run(q, x, dtype=jnp.bfloat16)
    want = np.asarray(x.astype(jnp.float32), np.float64) @ ref.dequantise(q).T
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_nf4_indices_one_per_byte(ref):
    """NF4 code indices unpacked (`bits=8`, as slicing an NF4 array along its packed
    axis leaves them): the kernel decodes int8 indices."""
    q = _weight("nf4 blocks of 64")
    unpacked = qq.QuantisedArray(
        q.integers(), q.scale, None, None, bits=8, float_dtype=q.dtype, format="nf4"
    )
    x = jax.random.normal(jax.random.PRNGKey(5), (4, K))
    want = np.asarray(x, np.float64) @ ref.dequantise(q).T
    np.testing.assert_allclose(_run(unpacked, x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("shape", "packed", "scale", "why"),
    [
        ((100, 512), False, (100, 1), "outputs off the 128 lanes"),
        ((256, 500), False, (256, 1), "inputs off the 128 lanes"),
        ((256, 512), False, (256, 16), "groups of 32 inputs"),
        ((256, 384), True, (256, 2), "groups of 192 straddling the packed halves"),
        ((256, 512), False, (2, 1), "a scale neither per tensor nor per channel"),
    ],
)
def test_plan_refuses_what_the_kernel_does_not_take(shape, packed, scale, why):
    n, k = shape
    assert _pallas.plan(8, n, k, "int", packed, scale) is None, why


def test_plan_tiles():
    plan = _pallas.plan(4096, 8192, 8192, "int", True, (8192, 64))
    assert plan == _pallas.Plan(tm=512, tn=512, tk=512, group=128)
    assert _pallas.plan(1, 8192, 8192, "int", False, (8192, 1)) == _pallas.Plan(
        tm=1, tn=512, tk=1024, group=0
    )
