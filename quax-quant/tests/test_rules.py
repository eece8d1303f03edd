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
    assert "s32[" not in hlo.as_text()
    x1 = jnp.ones((32,))
    hlo = jax.jit(quax.quaxify(lambda w, x: w @ x)).lower(w, x1).compile().as_text()
    assert "s32[" not in hlo
    xs = jnp.ones((16, 32))
    hlo = jax.jit(quax.quaxify(lambda w, x: x @ w.T)).lower(w, xs).compile().as_text()
    assert "s32[16,16]" in hlo
    # Under vmap the batch counts as rows.
    hlo = (
        jax.jit(jax.vmap(quax.quaxify(lambda w, x: w @ x), in_axes=(None, 0)))
        .lower(w, xs)
        .compile()
        .as_text()
    )
    assert "s32[" in hlo
    assert (
        qq.matmul_path(256, qq.quantise(jnp.ones((2, 2)), matmul="weight_only"))
        == "weight_only"
    )


def test_both_quantised_int32(ref):
    a = _weight(0, (6, 16), axis=0)
    b = _weight(1, (16, 5), axis=1, bits=4)
    out = jax.jit(quax.quaxify(lambda a, b: a @ b))(a, b)
    np.testing.assert_allclose(
        out, ref.dequantise(a) @ ref.dequantise(b), rtol=1e-5, atol=1e-5
    )
    hlo = jax.jit(quax.quaxify(lambda a, b: a @ b)).lower(a, b).compile().as_text()
    assert "s32[6,5]" in hlo
    grouped = _weight(2, (16, 5), group_size=4, group_axis=0)
    with pytest.raises(qq.MaterialisationError, match=r"dot_general.*int8 x int8"):
        quax.quaxify(lambda a, b: a @ b)(a, grouped)
    out = quax.quaxify(lambda a, b: a @ b)(
        a.enable_materialise(), grouped.enable_materialise()
    )
    np.testing.assert_allclose(
        out, ref.dequantise(a) @ ref.dequantise(grouped), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("symmetric", [True, False])
def test_conv(symmetric, matches_dense):
    conv = eqx.nn.Conv2d(3, 4, 3, padding=1, key=jr.PRNGKey(0))
    k = qq.quantise(conv.weight, axis=0, symmetric=symmetric)
    x = jr.normal(jr.PRNGKey(1), (3, 9, 9))
    matches_dense(
        lambda k, x: eqx.tree_at(lambda c: c.weight, conv, k)(x), k, x, atol=1e-4
    )
    grouped = qq.quantise(conv.weight, group_size=3)
    with pytest.raises(qq.MaterialisationError, match="conv_general_dilated"):
        quax.quaxify(lambda k, x: eqx.tree_at(lambda c: c.weight, conv, k)(x))(
            grouped, x
        )


def test_structural_operations_keep_quantisation(ref):
    w = _weight(0, (4, 6, 8), bits=4, group_size=2, symmetric=False)
    d = ref.dequantise(w)
    cases = [
        (lambda w: jnp.transpose(w, (2, 0, 1)), lambda d: np.transpose(d, (2, 0, 1))),
        (lambda w: w.reshape(24, 8), lambda d: d.reshape(24, 8)),
        (lambda w: w.reshape(4, 6, 4, 2), lambda d: d.reshape(4, 6, 4, 2)),
        (lambda w: w.reshape(4, 48), lambda d: d.reshape(4, 48)),
        (lambda w: w[1:3, :, 2:6], lambda d: d[1:3, :, 2:6]),
        (lambda w: w[2], lambda d: d[2]),
        (lambda w: w[None][0], lambda d: d),
        (lambda w: -w, lambda d: -d),
        (lambda w: w * 2.5, lambda d: d * 2.5),
        (lambda w: w.astype(jnp.bfloat16), lambda d: d),
        (lambda w: lax.dynamic_slice_in_dim(w, 1, 2, axis=0), lambda d: d[1:3]),
    ]
    # One compiled program for every case (op by op, each primitive would compile
    # on its own): the rules keep the quantisation at trace time either way.
    # `w[None]` broadcasts: materialising is only allowed to refuse there.
    outs = jax.jit(quax.quaxify(lambda w: [op(w) for op, _ in cases]))(w)
    for (op, expected), out in zip(cases, outs, strict=True):
        assert isinstance(out, qq.QuantisedArray), op
        np.testing.assert_allclose(
            np.asarray(out.dequantise(), np.float32),
            expected(d),
            rtol=1e-2 if out.dtype == jnp.bfloat16 else 1e-6,
            atol=1e-6,
        )


def test_refusals_name_the_primitive():
    w = _weight(0, (4, 8), group_size=4)
    for fn, prim in [
        (jnp.exp, "exp"),
        (lambda w: w + 1.0, "add"),
        (lambda w: jnp.transpose(w).reshape(32), "reshape"),
        (lambda w: w[:, 1:3], "slice"),
        (lambda w: w * jnp.ones((4, 8)), "mul"),
        (lambda w: w.astype(jnp.int32), "convert_element_type"),
    ]:
        with pytest.raises(
            qq.MaterialisationError,
            match=f"Refusing to materialise `QuantisedArray` for primitive `{prim}`",
        ):
            quax.quaxify(fn)(w)
    with pytest.raises(
        RuntimeError,
        match=r"Refusing to materialise `QuantisedArray` with "
        r"`allow_materialise=False`.*allow_materialise=True",
    ):
        w.materialise()
    assert isinstance(qq.MaterialisationError(), quax.MaterialisationError)
    out = quax.quaxify(jnp.exp)(w.enable_materialise())
    np.testing.assert_allclose(out, jnp.exp(w.dequantise()), rtol=1e-6)
    with pytest.raises(qq.MaterialisationError, match="not floating-point"):
        quax.quaxify(lambda w, x: w @ x)(w, jnp.ones((8,), jnp.int32))


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


@pytest.mark.parametrize(
    "kwargs",
    [
        {"axis": 0},
        {"bits": 4, "group_size": 4, "symmetric": False},
        {"axis": 1, "symmetric": False},
    ],
)
def test_conformance_kit_weight_only(kwargs):
    """quax.testing's check: values, jit, vmap over a stacked batch, grad and jvp
    with respect to the float leaves (scales, zero points, activations). The int8
    path adds the activations' rounding by design (bounded above)."""
    import quax.testing

    w = qq.quantise(jr.normal(jr.PRNGKey(0), (8, 12)), matmul="weight_only", **kwargs)
    x = jr.normal(jr.PRNGKey(1), (12,))
    quax.testing.assert_matches_dense(lambda w, x: w @ x, w, x, rtol=1e-4, atol=1e-4)
