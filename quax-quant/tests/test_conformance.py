"""`quax.testing`'s conformance check on `QuantisedArray`: `quax.quaxify(fn)` against
`fn` on the dequantised arrays (a plain-JAX dequantisation written in the tests),
under eval, `jit`, both `vmap`s, `grad` and `jvp`, with hypothesis drawing the shapes,
the formats (int8, int4, NF4, both float8s; double-quantised scales), the bit widths,
the block layouts and the functions. The products here take the
weight-only path, which is exact with respect to the dequantised weight; the int8 x
int8 path adds the activations' rounding by design and is checked against its own
NumPy reference in `test_matmul.py`."""

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
EXAMPLES = 10


@st.composite
def layouts(draw, shape):
    """`quantise`'s layout arguments for an array of `shape`: per tensor, per
    channel along some axes, or groups (of a size dividing the axis) along one."""
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
    size = draw(st.sampled_from([g for g in range(1, d + 1) if d % g == 0]))
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
    layout = draw(layouts(shape))
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


def _double_quantised(*args):
    """Whether an argument holds double-quantised scales, whose stacked batch the
    vmap checks cannot run yet (see `test_double_quantised_under_vmap`)."""
    return any(isinstance(getattr(a, "scale", None), qq.QuantisedScale) for a in args)


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
        vmap=not _double_quantised(lhs, rhs),
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


@settings(max_examples=EXAMPLES, deadline=None)
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
            vmap=not _double_quantised(w),
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


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="quax.testing's vmap checks stack a double-quantised array with its int8 "
    "codes shared and its float32 block scales and offset batched; "
    "QuantisedScale.dequantise then broadcasts (batch, blocks, 256) against the "
    "batched offset (batch,) and raises (found by the NF4 conformance draw; not "
    "fixed yet, so the draws above skip the vmap checks for double-quantised arrays)",
)
def test_double_quantised_under_vmap(ref):
    w = qq.quantise(
        jr.normal(jr.PRNGKey(0), (4, 6)),
        format="nf4",
        group_size=2,
        double_quant=True,
        matmul="weight_only",
    )
    x = jr.normal(jr.PRNGKey(1), (6, 3))
    quax.testing.assert_matches_dense(lambda a, b: a @ b, w, x, densify=ref.densify)
