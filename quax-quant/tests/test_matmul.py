"""Products with a float operand (`quax_quant._matmul`): the weight-only path is
`x @ w.dequantise()`, the int8 x int8 path that product with the activations
quantised per row."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq
from hypothesis import given, settings, strategies as st
from jax import lax


def _int8_reference(x, w, ref, w_is_lhs=False):
    """The int8 x int8 product from the stored leaves, in NumPy: `x` quantised per
    row (absmax / 127, rounding half to even as `jnp.round`), times the weight's
    integers and scales, minus the zero-point offset on the exact `x`."""
    x32 = np.asarray(x, np.float32)
    step = np.max(np.abs(x32), axis=1, keepdims=True) / np.float32(127)
    xq = np.clip(np.round(x32 / step), -127, 127).astype(np.float64)
    scale = ref.blocks(w.scale, w.shape)
    zero = 0 if w.zero_point is None else ref.blocks(w.zero_point, w.shape)
    ints = ref.integers(w).astype(np.float64)
    dense_q, offset = ints * scale, zero * scale
    if w_is_lhs:  # x @ w.T: w is (out, in)
        dense_q, offset = dense_q.T, offset.T
    return (xq * step) @ dense_q - np.asarray(x, np.float64) @ offset


def test_int8_path_grouped_output_axis_literal():
    """Scales grouped along the output axis, on the int8 path, from literals: a
    weight (out=4, in=2) in groups of two output rows (per input column, as every
    grouped layout is per index of the other axes); `x @ w.T`."""
    w = jnp.array([[1.0, 2.0], [4.0, 8.0], [3.0, 6.0], [12.0, 24.0]])
    q = qq.quantise(w, group_size=2, group_axis=0, matmul="int8")
    # Block absmax 4, 8 (rows 0-1) and 12, 24 (rows 2-3): every entry is a quarter
    # or all of its block's absmax, so its integer is 31.75 -> 32 or 127. (Not a
    # half: a TPU divides within an ulp, so 63.5 may round to 63 there.)
    ints = np.array([[32, 32], [127, 127], [32, 32], [127, 127]])
    block_absmax = np.array([[4.0, 8.0], [12.0, 24.0]])
    np.testing.assert_array_equal(q.values, ints)
    np.testing.assert_allclose(q.scale, block_absmax / 127, rtol=1e-6)
    x = jnp.array([[1.0, -1.0], [2.0, 0.5]])
    # Rows quantised by absmax 1 and 2: [127, -127] times 1 / 127, and [127, 32]
    # times 2 / 127; each integer product scaled by its weight block's scale (row j
    # of the weight is in block j // 2).
    expected = np.array(
        [
            [
                (32 * 4 - 32 * 8) / 127,
                (127 * 4 - 127 * 8) / 127,
                (32 * 12 - 32 * 24) / 127,
                (127 * 12 - 127 * 24) / 127,
            ],
            [
                2 * (127 * 32 * 4 + 32 * 32 * 8) / 127**2,
                2 * (127 * 127 * 4 + 32 * 127 * 8) / 127**2,
                2 * (127 * 32 * 12 + 32 * 32 * 24) / 127**2,
                2 * (127 * 127 * 12 + 32 * 127 * 24) / 127**2,
            ],
        ]
    )
    # Within the activations' rounding of the float product.
    np.testing.assert_allclose(expected, np.asarray(x) @ np.asarray(w).T, rtol=0.011)
    for rows in (1, 2):
        out = jax.jit(quax.quaxify(lambda x, w: x @ w.T))(x[:rows], q)
        np.testing.assert_allclose(out, expected[:rows], rtol=1e-6)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_path_grouped_output_axis(bits, symmetric, ref):
    """`quantise(w, group_size=4)` with `matmul="int8"`, scales grouped along the
    output axis in every orientation, at 1 and 6 rows, eagerly, jitted and under
    vmap: the int8 product computed from the stored leaves in NumPy, and within the
    activations' rounding of `x @ w.dequantise()`."""
    key = jr.PRNGKey(bits + 2 * symmetric)
    # (in=8, out=12) grouped along out (last axis): x @ w.
    w_in_out = qq.quantise(
        jr.normal(key, (8, 12)),
        bits=bits,
        symmetric=symmetric,
        group_size=4,
        matmul="int8",
    )
    # (out=12, in=8) grouped along out (axis 0): x @ w.T and w @ x.
    w_out_in = qq.quantise(
        jr.normal(key, (12, 8)),
        bits=bits,
        symmetric=symmetric,
        group_size=4,
        group_axis=0,
        matmul="int8",
    )
    cases = [
        (lambda x, w: x @ w, w_in_out, False),
        (lambda x, w: x @ w.T, w_out_in, True),
        (lambda x, w: (w @ x.T).T, w_out_in, True),
    ]
    for rows in (1, 6):
        x = jr.normal(jr.PRNGKey(rows), (rows, 8))
        for fn, w, transposed in cases:
            expected = _int8_reference(x, w, ref, w_is_lhs=transposed)
            dense = np.asarray(x, np.float64) @ (
                ref.dequantise(w).T if transposed else ref.dequantise(w)
            )
            step = np.max(np.abs(np.asarray(x)), axis=1, keepdims=True) / 127
            bound = step / 2 * np.abs(ref.dequantise(w)).sum(1 if transposed else 0)
            # Op by op (each primitive compiled on its own: once, at 6 rows),
            # jitted, and under vmap.
            eager = [quax.quaxify(fn)(x, w)] if rows == 6 and not transposed else []
            outs = [
                *eager,
                jax.jit(quax.quaxify(fn))(x, w),
                jax.jit(
                    jax.vmap(
                        quax.quaxify(lambda x, w, fn=fn: fn(x[None], w)[0]),
                        in_axes=(0, None),
                    )
                )(x, w),
            ]
            for out in outs:
                np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
                assert np.all(np.abs(np.asarray(out) - dense) <= bound + 1e-5)


def _weight(seed, shape, **kwargs):
    return qq.quantise(jr.normal(jr.PRNGKey(seed), shape), **kwargs)


layouts = st.sampled_from(
    [
        {},
        {"axis": 0},
        {"axis": 1},
        {"group_size": 4},
        {"group_size": 4, "group_axis": 0},
    ]
)


@settings(max_examples=8, deadline=None)
@given(
    layout=layouts,
    bits=st.sampled_from([8, 4]),
    symmetric=st.booleans(),
    w_left=st.booleans(),
    rows=st.sampled_from([1, 3, 8]),
    seed=st.integers(0, 2**16),
)
def test_weight_only_matches_dequantised(
    layout, bits, symmetric, w_left, rows, seed, matches_dense
):
    w = _weight(
        seed, (8, 12), bits=bits, symmetric=symmetric, matmul="weight_only", **layout
    )
    if w_left:
        x = jr.normal(jr.PRNGKey(seed + 1), (12, rows))
        matches_dense(lambda w, x: w @ x, w, x)
    else:
        x = jr.normal(jr.PRNGKey(seed + 1), (rows, 8))
        matches_dense(lambda x, w: x @ w, x, w)


@settings(max_examples=6, deadline=None)
@given(
    layout=layouts,
    bits=st.sampled_from([8, 4]),
    symmetric=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int8_path_error_bound(layout, bits, symmetric, seed, ref):
    """int8 x int8: the only error beyond the weight's is the activations' rounding,
    at most half a step (absmax / 127 per row) per element, times the weight's
    integers and scales: the zero-point offset (`-z * s`) is applied to the exact
    activations, so the bound weighs `|q * s|`, not `|(q - z) * s|`."""
    w = _weight(seed, (8, 12), bits=bits, symmetric=symmetric, matmul="int8", **layout)
    x = jr.normal(jr.PRNGKey(seed + 1), (5, 8))
    with quax.track_materialisation() as report:
        out = jax.jit(quax.quaxify(lambda x, w: x @ w))(x, w)
    assert not report
    deq = ref.dequantise(w)
    x64 = np.asarray(x, np.float64)
    step = np.max(np.abs(x64), axis=1, keepdims=True) / 127
    scaled = ref.integers(w) * ref.blocks(w.scale, w.shape)
    bound = (step / 2) * np.abs(scaled).sum(0) + 1e-4
    assert np.all(np.abs(np.asarray(out) - x64 @ deq) <= bound)


def test_batched_and_multi_axis_contractions(matches_dense):
    w = qq.quantise(
        jr.normal(jr.PRNGKey(0), (3, 8, 6)), axis=(0, 2), matmul="weight_only"
    )
    x = jr.normal(jr.PRNGKey(1), (3, 4, 8))
    dn = (((2,), (1,)), ((0,), (0,)))
    matches_dense(lambda x, w: lax.dot_general(x, w, dn), x, w)
    g = qq.quantise(
        jr.normal(jr.PRNGKey(2), (4, 6, 8)), group_size=2, matmul="weight_only"
    )
    x = jr.normal(jr.PRNGKey(3), (5, 4, 8))
    dn = (((1, 2), (0, 2)), ((), ()))
    matches_dense(lambda x, g: lax.dot_general(x, g, dn), x, g)
    a = qq.quantise(
        jr.normal(jr.PRNGKey(4), (4, 6, 8)),
        group_size=2,
        symmetric=False,
        matmul="int8",
    )
    with quax.track_materialisation() as report:
        out = quax.quaxify(lambda x, a: lax.dot_general(x, a, dn))(x, a)
    assert not report
    expected = jnp.einsum("bij,ikj->bk", x, a.dequantise())
    np.testing.assert_allclose(
        out, expected, atol=0.05 * float(jnp.max(jnp.abs(expected)))
    )


def test_results_do_not_change_with_batch_size():
    for path in ("weight_only", "int8"):
        for kwargs in ({"axis": 0}, {"bits": 4, "group_size": 8, "symmetric": False}):
            w = _weight(0, (16, 32), matmul=path, **kwargs)
            xs = jr.normal(jr.PRNGKey(1), (64, 32))
            f = jax.jit(quax.quaxify(lambda w, x: x @ w.T))
            full = f(w, xs)
            np.testing.assert_allclose(f(w, xs[:1]), full[:1], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(f(w, xs[:7]), full[:7], rtol=1e-6, atol=1e-6)
            per_row = jax.jit(
                jax.vmap(quax.quaxify(lambda w, x: w @ x), in_axes=(None, 0))
            )(w, xs)
            np.testing.assert_allclose(per_row, full, rtol=1e-5, atol=1e-5)


def test_auto_path_by_rows():
    w = _weight(0, (16, 32), axis=0)
    assert qq.matmul_path(1, w) == "weight_only"
    assert qq.matmul_path(qq.WEIGHT_ONLY_MAX_ROWS, w) == "int8"
    # Groups along the contraction: weight-only (blocked) at any number of rows.
    assert qq.matmul_path(256, w, contract=(1,)) == "int8"
    assert qq.matmul_path(256, w, contract=(0,)) == "weight_only"
    grouped = _weight(0, (16, 32), bits=4, group_size=8)
    xs = jnp.ones((16, 32))
    hlo = jax.jit(quax.quaxify(lambda w, x: x @ w.T)).lower(grouped, xs).compile()
    text = hlo.as_text()
    assert text is not None and "s32[" not in text
    x1 = jnp.ones((32,))
    hlo = jax.jit(quax.quaxify(lambda w, x: w @ x)).lower(w, x1).compile().as_text()
    assert hlo is not None
    assert "s32[" not in hlo
    xs = jnp.ones((16, 32))
    hlo = jax.jit(quax.quaxify(lambda w, x: x @ w.T)).lower(w, xs).compile().as_text()
    assert hlo is not None
    assert "s32[16,16]" in hlo
    # Under vmap the batch counts as rows.
    hlo = (
        jax.jit(jax.vmap(quax.quaxify(lambda w, x: w @ x), in_axes=(None, 0)))
        .lower(w, xs)
        .compile()
        .as_text()
    )
    assert hlo is not None
    assert "s32[" in hlo
    assert (
        qq.matmul_path(256, qq.quantise(jnp.ones((2, 2)), matmul="weight_only"))
        == "weight_only"
    )


def test_grad_jvp_and_control_flow():
    w = _weight(0, (8, 12), group_size=4, symmetric=False, matmul="int8")
    x = jr.normal(jr.PRNGKey(1), (12,))
    xs = jr.normal(jr.PRNGKey(1), (6, 12))
    d = w.dequantise()

    c = jr.normal(jr.PRNGKey(2), (8,))

    def loss(w, x):
        # Linear in the product, so the gradient does not see the forward's path.
        return jnp.sum(c * (w @ x))

    # Derivatives follow the weight-only product, on either path (each compiled
    # once: op by op, every primitive of the derivative would compile on its own).
    g = jax.jit(jax.grad(quax.quaxify(loss), argnums=1))(w, x)
    np.testing.assert_allclose(g, jax.grad(loss, argnums=1)(d, x), rtol=1e-5, atol=1e-5)
    gs = jax.jit(
        jax.grad(quax.quaxify(lambda w, x: jnp.sum(c * (x @ w.T))), argnums=1)
    )(w, xs)
    np.testing.assert_allclose(
        gs, jax.grad(lambda x: jnp.sum(c * (x @ d.T)))(xs), rtol=1e-4, atol=1e-4
    )
    gscale = jax.jit(
        jax.grad(lambda s: quax.quaxify(loss)(eqx.tree_at(lambda q: q.scale, w, s), x))
    )(w.scale)
    ref_scale = jax.grad(
        lambda s: loss(eqx.tree_at(lambda q: q.scale, w, s).dequantise(), x)
    )(w.scale)
    np.testing.assert_allclose(gscale, ref_scale, rtol=1e-4, atol=1e-5)
    _, t = jax.jit(
        lambda x: jax.jvp(lambda x: quax.quaxify(lambda w, x: w @ x)(w, x), (x,), (x,))
    )(x)
    np.testing.assert_allclose(t, d @ x, rtol=1e-5, atol=1e-5)

    def scanned(w, x):
        def body(h, _):
            return jnp.tanh(w @ jnp.concatenate([h, h[:4]])), None

        h, _ = lax.scan(body, x[:8], None, length=3)
        h = lax.cond(
            h[0] > 0, lambda h: w @ jnp.concatenate([h, h[:4]]), lambda h: -h, h
        )
        return lax.fori_loop(0, 2, lambda i, h: h * 0.5, h)

    ref_out = scanned(d, x)
    weight_only = w.__class__(
        w.values,
        w.scale,
        w.zero_point,
        None,
        bits=8,
        float_dtype=w.float_dtype,
        matmul="weight_only",
    )
    out = jax.jit(quax.quaxify(scanned))(weight_only, x)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)


def test_straight_through_training_step():
    """QAT: quantise in the forward pass; the gradient reaches the float weight as
    if the quantisation were the identity, computed with the quantised product."""
    w = jr.normal(jr.PRNGKey(0), (8, 12))
    x = jr.normal(jr.PRNGKey(1), (12,))

    def qat_loss(w):
        q = qq.quantise(w, axis=0, straight_through=True)
        return jnp.sum(jnp.sin(quax.quaxify(lambda q, x: q @ x)(q, x)))

    g = jax.jit(jax.grad(qat_loss))(w)
    deq = qq.quantise(w, axis=0).dequantise()
    expected = jnp.outer(jnp.cos(deq @ x), x)
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-5)
    for path in ("weight_only", "int8"):

        def linear_loss(w, path=path):
            q = qq.quantise(w, straight_through=True, matmul=path)
            return jnp.sum(quax.quaxify(lambda q, xs: xs @ q.T)(q, jnp.stack([x] * 5)))

        g = jax.grad(linear_loss)(w)
        np.testing.assert_allclose(
            g, jnp.outer(jnp.full((8,), 5.0), x), rtol=1e-5, atol=1e-5
        )


def test_vmap_over_stacked_quantised_weights(ref):
    ws = jr.normal(jr.PRNGKey(0), (3, 8, 12))
    qs = jax.jit(jax.vmap(lambda w: qq.quantise(w, bits=4, group_size=4)))(ws)
    assert qs.values.shape == (3, 8, 6) and qs.scale.shape == (3, 8, 3)
    xs = jr.normal(jr.PRNGKey(1), (3, 12))
    out = jax.jit(jax.vmap(quax.quaxify(lambda w, x: w @ x)))(qs, xs)
    for i in range(3):
        one = qq.QuantisedArray(
            qs.values[i], qs.scale[i], None, None, bits=4, float_dtype=np.float32
        )
        np.testing.assert_allclose(
            out[i], ref.dequantise(one) @ np.asarray(xs[i]), rtol=1e-5, atol=1e-5
        )


def test_weight_only_zero_point_entries_are_exact_zeros():
    """An asymmetric weight entry at its zero point dequantises to exactly 0, so an
    infinite activation times it is NaN, as in the dense product. The product used
    to dequantise as `q * s - z * s`, which XLA under jit fuses into one
    multiply-add whose unrounded `q * s` leaves a residue: -inf where dense is NaN
    (found by test_conformance.py)."""
    values = np.full((4, 6), -26, np.int8)
    values[1, :2] = [25, -128]
    values[3, 5] = 127
    w = qq.QuantisedArray(
        jnp.asarray(values),
        jnp.array([[0.01960784]]),
        jnp.array([[-26.0]]),
        None,
        bits=8,
        float_dtype=np.float32,
        matmul="weight_only",
    )
    # Dequantised from the literals: (q - z) * s, exactly 0 where q == z.
    dense = (values.astype(np.float32) + 26) * np.float32(0.01960784)
    for rows in (1, 5):
        x = np.zeros((rows, 6), np.float32)
        x[:, 0] = np.inf
        with np.errstate(invalid="ignore"):
            expected = x @ dense.T  # NaN where the row is 0, +inf for row 1
        f = quax.quaxify(lambda w, x: x @ w.T)
        for out in (f(w, jnp.asarray(x)), jax.jit(f)(w, jnp.asarray(x))):
            np.testing.assert_array_equal(out, expected)
