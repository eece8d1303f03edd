"""`quax.testing`'s conformance check on `QuantisedArray`: `quax.quaxify(fn)` against
`fn` on the dequantised arrays (a plain-JAX dequantisation written in the tests),
under eval, `jit`, both `vmap`s, `grad` and `jvp`, with hypothesis drawing the shapes,
the formats (int8, int4, NF4, both float8s; double-quantised scales), the bit widths,
the block layouts and the functions. The products here take the
weight-only path, which is exact with respect to the dequantised weight; the int8 x
int8 path adds the activations' rounding by design and is checked against its own
NumPy reference in `test_matmul.py`."""

import os

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax.testing
import quax.testing.strategies as qst
import quax_quant as qq
from hypothesis import given, settings, strategies as st
from jax import lax


# Examples per test: each runs every check of the kit (about six compilations).
# QUAX_HYPOTHESIS_SCALE (see scripts/hypothesis_sweep.sh) multiplies them.
SCALE = int(os.environ.get("QUAX_HYPOTHESIS_SCALE", "1"))
EXAMPLES = 10 * SCALE
# The structural operations draw 7 (two checks an example; at 10 they were the
# suite's slowest test, 39 s of its 463 s on 2 workers): at the fixed seed 0 their
# examples reach the same 6 of the 8 operations (all but "neg" and "reshape
# merging") and all four formats (int as 8 bits, not symmetric) as 10 did (8 and 7
# examples: the same; 6 leave "reshape splitting at groups" out).
STRUCTURAL_EXAMPLES = 7 * SCALE


@st.composite
def layouts(draw, shape, partial=False):
    """`quantise`'s layout arguments for an array of `shape`: per tensor, per
    channel along some axes, or groups (of a size dividing the axis; any size
    with `partial`, as NF4 takes) along one."""
    kinds = ["tensor"] + (["channel", "group"] if shape else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "tensor":
        return {}
    if kind == "channel":
        axes = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True))
        negative = draw(st.booleans())
        return {"axis": tuple(a - len(shape) if negative else a for a in axes)}
    axis = draw(st.integers(0, len(shape) - 1))
    d = shape[axis]
    size = draw(st.sampled_from([g for g in range(1, d + 1) if partial or d % g == 0]))
    return {"group_size": size, "group_axis": axis}


FORMATS = ("int", "nf4", "float8_e4m3fn", "float8_e5m2")


@st.composite
def quantised(draw, shape, formats=FORMATS):
    """A `QuantisedArray` of `shape` (weight-only products), quantised from drawn
    float entries in any layout: int8 or int4, symmetric or not; NF4 (4-bit code
    indices, packed); or float8 (either dtype); NF4 and int with the scales
    double-quantised or not."""
    fmt = draw(st.sampled_from([f for f in formats if shape or f != "nf4"]))
    x = draw(qst.arrays(shape, jnp.float32))
    layout = draw(layouts(shape, partial=fmt == "nf4"))
    if fmt == "nf4" and not layout:
        # NF4 has no per-tensor default (blocks of 64): one block per row.
        layout = {"group_size": shape[-1]}
    kwargs = {"format": fmt, "matmul": "weight_only", **layout}
    if fmt == "int":
        kwargs["bits"] = draw(st.sampled_from([8, 4] if shape else [8]))
        kwargs["symmetric"] = draw(st.booleans())
    if fmt in ("int", "nf4"):
        kwargs["double_quant"] = draw(st.booleans())
    return qq.quantise(x, **kwargs)


@pytest.mark.long_running
@settings(max_examples=EXAMPLES, deadline=None)
@given(problem=qst.dot_general_dimension_numbers(max_side=5), data=st.data())
def test_dot_general_matches_dense(problem, data, ref):
    """Any `dot_general` (batch, contracting and free axes in any order) with a
    quantised operand on either side and a float one on the other."""
    lhs_shape, rhs_shape, dims = problem
    quantised_lhs = data.draw(st.booleans())
    if quantised_lhs:
        lhs = data.draw(quantised(lhs_shape))
        rhs = data.draw(qst.arrays(rhs_shape, jnp.float32))
    else:
        lhs = data.draw(qst.arrays(lhs_shape, jnp.float32))
        rhs = data.draw(quantised(rhs_shape))
    quax.testing.assert_matches_dense(
        lambda a, b: lax.dot_general(a, b, dims),
        lhs,
        rhs,
        densify=ref.densify,
    )


STRUCTURAL = {
    "transpose": (lambda w: w.T, {}),
    "neg": (lambda w: -w, {}),
    "scalar mul": (lambda w: w * 2.5, {}),
    "slice along a per-channel axis": (lambda w: w[1:3], {"axis": 0}),
    "slice at group boundaries": (lambda w: w[:, 2:6], {"group_size": 2}),
    "reshape merging": (lambda w: w.reshape(-1), {"axis": 0}),
    "reshape splitting at groups": (
        lambda w: w.reshape(4, 4, 2),
        {"group_size": 2},
    ),
    "expand_dims": (lambda w: w[None], {"group_size": 4}),
}


@pytest.mark.long_running
@settings(max_examples=STRUCTURAL_EXAMPLES, deadline=None)
@given(
    case=st.sampled_from(sorted(STRUCTURAL)),
    fmt=st.sampled_from(FORMATS),
    bits=st.sampled_from([8, 4]),
    symmetric=st.booleans(),
    data=st.data(),
)
def test_structural_operations_match_dense(case, fmt, bits, symmetric, data, ref):
    """The structural operations keep the quantisation (the output is a
    `QuantisedArray`) and its values, and a product after them matches too, for
    every format (`bits` and `symmetric` are the int format's)."""
    op, layout = STRUCTURAL[case]
    kwargs = {"bits": bits, "symmetric": symmetric} if fmt == "int" else {}
    if fmt == "nf4" and not layout:
        kwargs["group_size"] = 8  # one block per row (the default is 64)
    w = qq.quantise(
        data.draw(qst.arrays((4, 8), jnp.float32)),
        format=fmt,
        matmul="weight_only",
        **kwargs,
        **layout,
    )
    quax.testing.assert_matches_dense(
        op, w, densify=ref.densify, out_types=qq.QuantisedArray
    )
    k = np.shape(op(np.zeros((4, 8))))[-1]
    x = data.draw(qst.arrays((3, k), jnp.float32))
    quax.testing.assert_matches_dense(
        lambda w, x: x @ jnp.reshape(op(w), (-1, x.shape[-1])).T,
        w,
        x,
        densify=ref.densify,
    )


@pytest.mark.long_running
@settings(max_examples=EXAMPLES, deadline=None)
@given(
    w=st.tuples(st.integers(1, 6), st.integers(1, 6)).flatmap(quantised),
    rows=st.integers(1, 5),
    bad=st.sampled_from([np.nan, np.inf, -np.inf, -0.0]),
    data=st.data(),
)
def test_nonfinite_activations_match_dense(w, rows, bad, data, ref):
    """NaN in, NaN out: activations holding a NaN, an infinity or -0.0 give what
    the dense product gives, entry by entry (values, jit and vmap)."""
    x = np.array(data.draw(qst.arrays((rows, w.shape[1]), jnp.float32)))
    index = data.draw(
        st.tuples(st.integers(0, rows - 1), st.integers(0, w.shape[1] - 1))
    )
    x[index] = bad
    # quax.testing's comparison subtracts infinities of the same sign before it
    # accepts them as equal, which NumPy warns about (and warnings are errors).
    with np.errstate(invalid="ignore"):
        quax.testing.assert_matches_dense(
            lambda w, x: x @ w.T,
            w,
            jnp.asarray(x),
            densify=ref.densify,
            grad=False,
            jvp=False,
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


def test_double_quantised_under_vmap(ref):
    """quax.testing's vmap checks on a double-quantised NF4 array: its stacked
    batch (codes, block scales and offset stacked leaf by leaf) is a
    `QuantisedScale` with a leading batch axis, each copy dequantised from its own
    block scales and offset."""
    w = qq.quantise(
        jr.normal(jr.PRNGKey(0), (4, 6)),
        format="nf4",
        group_size=2,
        double_quant=True,
        matmul="weight_only",
    )
    x = jr.normal(jr.PRNGKey(1), (6, 3))
    quax.testing.assert_matches_dense(lambda a, b: a @ b, w, x, densify=ref.densify)


def test_vmap_over_stacked_double_quantised_weights(ref):
    """Two different double-quantised NF4 weights stacked leaf by leaf (each with
    its own codes, block scales and offset): `jax.vmap` over the stack, outside
    and inside `quaxify`, and structural operations on the stack, against plain
    JAX on the NumPy dequantisation of each weight. 32 x 32 in groups of 2
    along rows: scales (32, 16), two blocks of 256 per weight."""
    ws = [
        qq.quantise(
            jr.normal(jr.PRNGKey(k), (32, 32)) * (1 + 3 * k) + k,
            format="nf4",
            group_size=2,
            double_quant=True,
            matmul="weight_only",
        )
        for k in range(2)
    ]
    s0, s1 = (w.scale for w in ws)
    # Double quantisation: `scale` holds a `QuantisedScale` (annotated `Array`).
    assert isinstance(s0, qq.QuantisedScale) and isinstance(s1, qq.QuantisedScale)
    assert not np.array_equal(s0.offset, s1.offset)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *ws)
    assert stacked.scale.block_scale.shape == (2, 2)
    dense = np.stack([ref.dequantise(w) for w in ws]).astype(np.float32)
    np.testing.assert_allclose(stacked.dequantise(), dense, rtol=1e-6, atol=1e-6)
    x = jr.normal(jr.PRNGKey(2), (2, 32, 3))
    want = jax.vmap(jnp.matmul)(jnp.asarray(dense), x)
    matmul = lambda w, x: w @ x
    for got in (
        jax.vmap(quax.quaxify(matmul))(stacked, x),
        jax.jit(quax.quaxify(jax.vmap(matmul)))(stacked, x),
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # A transpose inside the batch keeps the codes int8; so does a slice of the
    # batch axis (each element's block scales and offset go with it).
    transposed = quax.quaxify(jax.vmap(lambda w: w.T))(stacked)
    assert isinstance(transposed.scale, qq.QuantisedScale)
    np.testing.assert_allclose(
        ref.dequantise(transposed), dense.transpose(0, 2, 1), rtol=1e-6, atol=1e-6
    )
    second = quax.quaxify(lambda w: w[1:])(stacked)
    assert isinstance(second.scale, qq.QuantisedScale)
    assert second.scale.offset.shape == (1,)
    np.testing.assert_allclose(ref.dequantise(second), dense[1:], rtol=1e-6, atol=1e-6)
    # Rows 16:32 of each weight hold its second block of scales: int8 too.
    block = quax.quaxify(lambda w: w[:, 16:])(stacked)
    assert isinstance(block.scale, qq.QuantisedScale)
    assert block.scale.block_scale.shape == (2, 1)
    np.testing.assert_allclose(
        ref.dequantise(block), dense[:, 16:], rtol=1e-6, atol=1e-6
    )
    # Rows 1:3 start inside a block of scales: the float scales are sliced.
    rows = quax.quaxify(lambda w: w[:, 1:3])(stacked)
    np.testing.assert_allclose(
        ref.dequantise(rows), dense[:, 1:3], rtol=1e-6, atol=1e-6
    )
