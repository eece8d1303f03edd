"""Quantised arrays: tests that kill mutants of `quax_quant/_rules.py` which the other
test files let through (`scripts/mutation.sh quant-rules`; docs/mutation.md lists
each surviving mutant of the sample run and the test that kills it). References are
NumPy on the dequantised arrays (the `ref` fixture unpacks the leaves itself)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq


def test_a_4_bit_array_sliced_to_an_odd_last_axis(ref) -> None:
    # Four-bit codes are packed two to a byte along the last axis; slicing a
    # (2, 4, 6) array to (2, 4, 5) leaves one code in the last byte of each row, so
    # the result is marked odd (mutants: never marked; marked by the parity of
    # axis 1, which is even here, instead of the last).
    w = qq.quantise(jr.normal(jr.PRNGKey(0), (2, 4, 6)), bits=4)
    x = np.asarray(jr.normal(jr.PRNGKey(1), (5, 3)), np.float32)
    want = ref.dequantise(w)[:, :, :5]
    f = quax.quaxify(lambda a: a[:, :, :5])
    for run in (f, jax.jit(f)):
        out = run(w)
        assert isinstance(out, qq.QuantisedArray)
        assert out.shape == (2, 4, 5)
        np.testing.assert_allclose(ref.dequantise(out), want, rtol=1e-6)
    product = jax.jit(quax.quaxify(lambda a, b: a[:, :, :5] @ b))(w, x)
    np.testing.assert_allclose(product, want @ x, rtol=1e-5, atol=1e-5)


def test_scaling_keeps_the_dtype_of_the_scales(ref) -> None:
    # `w * 2.0` scales the scales in their own dtype: a float16 array stays float16
    # (mutant: the factor cast to the default float dtype, which widens them).
    w = qq.quantise(jr.normal(jr.PRNGKey(2), (4, 6)).astype(jnp.float16))
    assert w.scale.dtype == jnp.float16
    f = quax.quaxify(lambda a: a * 2.0)
    for run in (f, jax.jit(f)):
        out = run(w)
        assert isinstance(out, qq.QuantisedArray)
        assert out.scale.dtype == jnp.float16 and out.dtype == jnp.float16
        np.testing.assert_allclose(ref.dequantise(out), 2.0 * ref.dequantise(w))


def test_a_product_with_integers_dequantises_where_allowed(ref) -> None:
    # An integer operand has no quantised product: where allowed, the array is
    # dequantised and multiplied densely, on either side (mutant: the dense product
    # bound with its dimension numbers under another name).
    w = qq.quantise(jr.normal(jr.PRNGKey(3), (4, 6))).enable_materialise()
    x = np.arange(18, dtype=np.int32).reshape(6, 3) - 9
    dense = ref.dequantise(w)
    f = quax.quaxify(lambda a, b: a @ b)
    g = quax.quaxify(lambda a, b: b.T @ a.T)
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(w, x), dense @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g(w, x), (dense @ x).T, rtol=1e-5, atol=1e-5)


# The second sample (seed 46).


def test_reshapes_that_keep_the_blocks_keep_the_quantisation(ref) -> None:
    # An axis kept whole keeps its blocks, NF4's shorter last one too: (4, 10) in
    # blocks of 4 (scales (4, 3)) reshaped to (2, 2, 10) or (4, 1, 10). Two axes
    # regrouped whole keep them where the groups stay whole: (4, 6) in groups of 3
    # (scales (4, 2)) to (2, 12) (scales (2, 4)). (Mutant `_reshape_blocks` 47: an
    # axis kept whole taken as a merge, which NF4's shorter block refuses; and of
    # two regrouped axes, the blocks of the first kept alone, a crash.)
    nf4 = qq.quantise(jr.normal(jr.PRNGKey(4), (4, 10)), format="nf4", block_size=4)
    grouped = qq.quantise(jr.normal(jr.PRNGKey(5), (4, 6)), group_size=3)
    assert nf4.scale.shape == (4, 3) and grouped.scale.shape == (4, 2)
    for w, new, scales in (
        (nf4, (2, 2, 10), (2, 2, 3)),
        (nf4, (4, 1, 10), (4, 1, 3)),
        (grouped, (2, 12), (2, 4)),
    ):
        f = quax.quaxify(lambda a, new=new: a.reshape(new))
        for run in (f, jax.jit(f)):
            out = run(w)
            assert isinstance(out, qq.QuantisedArray)
            assert out.shape == new and out.scale.shape == scales
            np.testing.assert_array_equal(
                ref.dequantise(out), ref.dequantise(w).reshape(new)
            )


@pytest.mark.parametrize(
    "take",
    [lambda a: a[1, 2], lambda a: a[1:2, 2:3].reshape(())],
    ids=["index", "reshape"],
)
def test_a_4_bit_array_to_a_scalar_is_refused_or_dequantised(ref, take) -> None:
    # A 4-bit array packs two codes to a byte along its last axis, and a scalar has
    # none: `w[1, 2]` (a squeeze of every axis) and a reshape to `()` are refused,
    # saying so, and where allowed give the dequantised entry. (Found with mutant
    # `_with` 12: both crashed with an `IndexError` while packing the scalar.)
    w = qq.quantise(jr.normal(jr.PRNGKey(6), (4, 6)), bits=4)
    f = quax.quaxify(take)
    for run in (f, jax.jit(f)):
        with pytest.raises(
            qq.QuantMaterialisationError,
            match=r"a 4-bit array packs its integers two to a byte along its last "
            r"axis, and a scalar has none",
        ):
            run(w)
        out = run(w.enable_materialise())
        assert not isinstance(out, qq.QuantisedArray)
        np.testing.assert_array_equal(out, ref.dequantise(w)[1, 2])


# The registered rules, a first sample (seed 48, `--decorated`).


@pytest.mark.parametrize("new", [(0, 2, 4), (2, 0, 8), (8, 0)])
def test_an_empty_quantised_array_reshaped_stays_quantised(ref, new) -> None:
    # An empty array (`w[:0]`) reshaped: its scales scale nothing, and one block of
    # them is kept (mutant of the reshape rule, line 387, 56: the scales read with
    # `reshape(None)`, a `TypeError`).
    w = qq.quantise(jr.normal(jr.PRNGKey(7), (4, 8)), axis=0)
    f = quax.quaxify(lambda a: a[:0].reshape(new))
    for run in (f, jax.jit(f)):
        out = run(w)
        assert isinstance(out, qq.QuantisedArray)
        assert out.shape == new
        assert ref.dequantise(out).shape == new


def test_a_broadcast_that_repeats_is_refused_or_dequantised(ref) -> None:
    # `jnp.broadcast_to(w, (3, 4, 8))` repeats the array, which its scales do not
    # stand for: refused, naming `broadcast_in_dim`, and where allowed the
    # dequantised array broadcast (mutant of the broadcast rule, line 424, 19: the
    # refusal given `None` for its primitive).
    w = qq.quantise(jr.normal(jr.PRNGKey(8), (4, 8)))
    f = quax.quaxify(lambda a: jnp.broadcast_to(a, (3, 4, 8)))
    for run in (f, jax.jit(f)):
        with pytest.raises(
            qq.QuantMaterialisationError,
            match=r"^Refusing to materialise `QuantisedArray` for primitive "
            r"`broadcast_in_dim` on input types \(QuantisedArray\): broadcasting "
            r"repeats the array",
        ):
            run(w)
        out = run(w.enable_materialise())
        assert not isinstance(out, qq.QuantisedArray)
        np.testing.assert_allclose(
            out, np.broadcast_to(ref.dequantise(w), (3, 4, 8)), rtol=1e-6
        )


# The registered rules, a second sample (seed 49, `--decorated`).


def test_a_product_of_two_quantised_arrays_keeps_the_preferred_dtype(ref) -> None:
    # The int8 x int8 product of two symmetric int8 arrays, asked for bfloat16 (as
    # `lax.dot_general(..., preferred_element_type=jnp.bfloat16)` gives of two
    # float32 arrays): the result is bfloat16, and the product of the dequantised
    # arrays within bfloat16's rounding (mutant of the int8 x int8 rule, line 151,
    # 44: the preferred dtype never read, so float32, which quax's check of a rule's
    # output against the primitive's refuses with a `TypeError`).
    a = qq.quantise(jr.normal(jr.PRNGKey(9), (5, 8)))
    b = qq.quantise(jr.normal(jr.PRNGKey(10), (8, 3)))
    dn = (((1,), (0,)), ((), ()))
    want = ref.dequantise(a).astype(np.float64) @ ref.dequantise(b).astype(np.float64)
    for dtype in (jnp.bfloat16, jnp.float16):
        f = quax.quaxify(
            lambda x, y, dtype=dtype: jax.lax.dot_general(
                x, y, dn, preferred_element_type=dtype
            )
        )
        for run in (f, jax.jit(f)):
            out = run(a, b)
            assert out.dtype == dtype
            np.testing.assert_allclose(
                np.asarray(out, np.float64), want, rtol=2e-2, atol=2e-2
            )


def test_refusals_of_broadcast_and_conversion_say_why(ref) -> None:
    # A broadcast that repeats the array, and a conversion to integers, are refused
    # saying why (mutant: the broadcast's reason changed); allowed, each gives the
    # dense result (mutant: the conversion's params misnamed for the fallback).
    w = qq.quantise(jr.normal(jr.PRNGKey(0), (4, 8)), bits=8)
    with pytest.raises(
        qq.QuantMaterialisationError,
        match=r"`broadcast_in_dim` on input types \(QuantisedArray\): broadcasting "
        r"repeats the array \(only new axes of size 1 keep the quantisation\), and ",
    ):
        quax.quaxify(lambda a: jnp.broadcast_to(a, (3, 4, 8)))(w)
    with pytest.raises(
        qq.QuantMaterialisationError,
        match=r"`convert_element_type` on input types \(QuantisedArray\): converting "
        r"to int32 rounds the dequantised values, and ",
    ):
        quax.quaxify(lambda a: a.astype(jnp.int32))(w)
    allowed = w.enable_materialise()
    dense = ref.dequantise(w)
    for run in (quax.quaxify, lambda f: jax.jit(quax.quaxify(f))):
        converted = run(lambda a: a.astype(jnp.int32))(allowed)
        assert converted.dtype == jnp.int32
        np.testing.assert_array_equal(converted, dense.astype(np.int32))
        repeated = run(lambda a: jnp.broadcast_to(a, (3, 4, 8)))(allowed)
        np.testing.assert_allclose(
            repeated, np.broadcast_to(dense, (3, 4, 8)), rtol=1e-6
        )


def test_a_calibrated_weight_on_the_left_keeps_the_products_params() -> None:
    # `w @ x` (as `eqx.nn.Linear` writes it) with a weight recording its inputs: the
    # product keeps its params, here a float32 result of bfloat16 operands, and the
    # inputs are recorded (mutant: the params dropped, giving bfloat16).
    from quax_quant._layer_inputs import RecordingWeight

    recorded = []
    weight = jr.normal(jr.PRNGKey(0), (3, 4)).astype(jnp.bfloat16)
    x = jr.normal(jr.PRNGKey(1), (4, 5)).astype(jnp.bfloat16)
    w = RecordingWeight(weight, 1, lambda gram, abs_sum, rows: recorded.append(rows))
    out = quax.quaxify(
        lambda w, x: jax.lax.dot_general(
            w, x, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
    )(w, x)
    jax.effects_barrier()
    assert out.dtype == jnp.float32
    want = np.asarray(weight, np.float32) @ np.asarray(x, np.float32)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    assert recorded == [5]


# The registered rules against the whole suite (seed 51, `--suite --decorated`).


def test_a_scalar_on_the_left_scales_and_a_vector_dequantises_where_allowed(
    ref,
) -> None:
    # `c * w` with `c` on the left: a float scalar scales the scales, a vector has
    # no quantised product: refused, and where allowed the dequantised product
    # (mutant, line 612, 4: the rule for `c * w` gave the fallback `None` for its
    # params; no test multiplied with the plain operand on the left).
    w = qq.quantise(jr.normal(jr.PRNGKey(20), (4, 6)))
    dense = ref.dequantise(w)
    c = np.linspace(-1.0, 2.0, 6, dtype=np.float32)
    f = quax.quaxify(lambda c, a: c * a)
    for run in (f, jax.jit(f)):
        out = run(jnp.float32(3.0), w)
        assert isinstance(out, qq.QuantisedArray)
        np.testing.assert_allclose(ref.dequantise(out), 3.0 * dense, rtol=1e-6)
        with pytest.raises(qq.QuantMaterialisationError, match=r"`mul`"):
            run(jnp.asarray(c), w)
        out = run(jnp.asarray(c), w.enable_materialise())
        np.testing.assert_allclose(out, c * dense, rtol=1e-6)


# Quant's registered rules against the whole suite (seed 52, `--suite --decorated`).


def _conv(x, k):
    return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME")


def test_a_kernel_scaled_along_its_input_channels_is_refused_or_dense() -> None:
    # A 1 x 1 kernel with one scale per input channel (2 of them) has no scale per
    # output feature: refused with the reason whole; where allowed, plain JAX's
    # convolution with the dequantised kernel (mutants line 198, 14: 2 scales
    # along an input axis taken for none; line 198, 48: the reason's text changed).
    w = jr.normal(jr.PRNGKey(3), (4, 2, 1, 1))
    x = jr.normal(jr.PRNGKey(4), (1, 2, 5, 5))
    k = qq.quantise(w, axis=1)
    assert k.scale.shape == (1, 2, 1, 1)
    f = quax.quaxify(_conv)
    with pytest.raises(
        qq.QuantMaterialisationError,
        match=r"`conv_general_dilated` on input types \(array, QuantisedArray\): "
        r"the quantised convolution needs a float input, a kernel with one scale "
        r"per output feature \(or per tensor\), no straight-through master, no "
        r"batch groups, and no zero point with feature groups, and dequantising",
    ):
        f(x, k)
    allowed = qq.quantise(w, axis=1, allow_materialise=True)
    want = _conv(x, allowed.dequantise())
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(x, allowed), want, rtol=1e-5, atol=1e-5)


def test_the_negation_of_a_straight_through_array_keeps_its_gradient() -> None:
    # `-q` of a straight-through array keeps its float master, negated: the
    # gradient of `sum((-q) @ x)` with respect to the weight is `-outer(1, x)`, as
    # if the quantisation were the identity (mutant line 585, 4: the master
    # dropped, and with it the gradient).
    w = jr.normal(jr.PRNGKey(0), (8, 12))
    x = jr.normal(jr.PRNGKey(1), (12,))

    def loss(w):
        q = qq.quantise(w, axis=0, straight_through=True)
        return jnp.sum(quax.quaxify(lambda q, x: (-q) @ x)(q, x))

    g = jax.grad(loss)(w)
    want = -np.outer(np.ones(8), np.asarray(x))
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


def test_an_act_order_array_is_refused_naming_the_primitive() -> None:
    # An act-order array (its last axis permuted, `input_order`) met by a rule that
    # would move or cut that axis is refused naming the primitive and the reason
    # (mutant `_not_act_order` 4: the refusal made for the primitive `None`).
    q = qq.quantise(jr.normal(jr.PRNGKey(0), (4, 8)), bits=4, group_size=4)
    order = jnp.array([3, 1, 2, 0, 7, 5, 6, 4])
    q = eqx.tree_at(lambda a: a.input_order, q, order, is_leaf=lambda v: v is None)
    with pytest.raises(
        qq.QuantMaterialisationError,
        match=r"for primitive `transpose` on input types \(QuantisedArray\): the "
        r"array holds its last axis permuted \(an act-order GPTQ layer",
    ):
        quax.quaxify(jnp.transpose)(q)


def test_the_transpose_of_a_4_bit_straight_through_array_keeps_its_gradient() -> None:
    # The transpose of a packed 4-bit straight-through array transposes its float
    # master with it: the gradient of `sum(q.T @ y)` with respect to the weight is
    # `outer(y, 1)`, as if the quantisation were the identity, and the product is
    # the dequantised weight's (mutant line 283, 48: the master transposed without
    # the permutation, a `TypeError`).
    w = jr.normal(jr.PRNGKey(0), (8, 12))
    y = jr.normal(jr.PRNGKey(1), (8,))

    def loss(w):
        q = qq.quantise(w, bits=4, group_size=4, straight_through=True)
        return jnp.sum(quax.quaxify(lambda q, y: q.T @ y)(q, y))

    g = jax.grad(loss)(w)
    np.testing.assert_allclose(
        g, np.outer(np.asarray(y), np.ones(12)), rtol=1e-5, atol=1e-5
    )
    deq = qq.quantise(w, bits=4, group_size=4).dequantise()
    np.testing.assert_allclose(loss(w), jnp.sum(deq.T @ y), rtol=1e-5, atol=1e-5)
