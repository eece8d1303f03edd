"""LoRA: tests that kill mutants of `quax_lora/_rules.py` which the other test files
let through (`scripts/mutation.sh lora-rules`; docs/mutation.md lists each surviving
mutant of the sample run and the test that kills it). References are plain JAX on
the dense weight, formed by hand from the factors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from jax import lax
from lora_helpers import normal


def test_a_product_with_a_non_scalar_materialises_where_allowed() -> None:
    # `w * c` with `c` a vector is not a scaling of the factors: where allowed, it
    # is the dense `(w + s a b) * c`, eagerly and under `jit` (mutant: the fallback
    # called with its parameters replaced by `None`).
    w = normal(jr.PRNGKey(0), (2, 6, 5))
    lora = quax_lora.LoraArray(
        w, rank=3, alpha=6.0, allow_materialise=True, key=jr.PRNGKey(1)
    )
    b = 0.1 * normal(jr.PRNGKey(2), lora.b.shape)
    lora = eqx.tree_at(lambda x: x.b, lora, b)
    c = jnp.array([1.0, -2.0, 0.5, 3.0, -0.25], jnp.float32)
    dense = np.asarray(w) + (6.0 / 3) * np.einsum("...ir,...rj->...ij", lora.a, b)
    want = dense * np.asarray(c)
    for product in (lambda x, y: x * y, lambda x, y: y * x):
        f = quax.quaxify(product)
        for run in (f, jax.jit(f)):
            np.testing.assert_allclose(run(lora, c), want, rtol=1e-5)


# The second sample (seed 46).


def test_dropout_drops_the_input_of_a_convolution_adapter_only(perturb) -> None:
    # An adapted `eqx.nn.Conv2d` with a dropout key: the adapter's convolution takes
    # the input dropped (each element kept with probability 1/2, by
    # `jax.random.bernoulli` of the layer's key, and doubled), the base's takes it
    # whole (mutant `_lora_conv` 27: the key dropped, so nothing was).
    conv = eqx.nn.Conv2d(3, 5, 3, key=jr.key(0))
    model = perturb(
        quax_lora.loraify(
            conv, rank=2, alpha=4.0, dropout=0.5, filter=eqx.nn.Conv, key=jr.key(1)
        ),
        jr.key(2),
    )
    key = jr.key(7)
    dropped = quax_lora.with_dropout_key(model, key)
    lora = model.weight
    x = normal(jr.key(3), (3, 7, 7))
    keep = jr.bernoulli(jr.fold_in(key, 0), 0.5, (1, 3, 7, 7))
    x_dropped = jnp.where(keep, x[None] / 0.5, 0.0)
    delta = (4.0 / 2) * jnp.einsum("or,rihw->oihw", lora.a, lora.b)
    base = eqx.tree_at(lambda c: c.weight, model, lora.w)
    want = base(x) + lax.conv_general_dilated(x_dropped, delta, (1, 1), "VALID")[0]
    f = quax.quaxify(lambda m, x: m(x))
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(run(dropped, x), want, rtol=1e-5, atol=1e-5)
    plain = base(x) + lax.conv_general_dilated(x[None], delta, (1, 1), "VALID")[0]
    assert not np.allclose(want, plain, rtol=1e-3, atol=1e-3)


# The registered rules, a first sample (seed 48, `--decorated`).


def _kernel_lora() -> tuple[quax_lora.LoraArray, np.ndarray]:
    """A kernel whose rows span two axes (`row_ndim=2`), materialising allowed,
    with a non-zero `b`; and its dense weight formed by NumPy from the factors."""
    w = normal(jr.PRNGKey(3), (2, 3, 4))
    lora = quax_lora.LoraArray(
        w,
        rank=2,
        alpha=4.0,
        batch_ndim=0,
        row_ndim=2,
        allow_materialise=True,
        key=jr.PRNGKey(4),
    )
    b = 0.5 * normal(jr.PRNGKey(5), lora.b.shape)
    lora = eqx.tree_at(lambda x: x.b, lora, b)
    a = np.asarray(lora.a)
    dense = np.asarray(w) + (4.0 / 2) * np.einsum("ijr,rk->ijk", a, np.asarray(b))
    return lora, dense


def test_a_transpose_of_rows_of_two_axes_is_dense_where_allowed() -> None:
    # A transpose that is no `LoraArray` (rows of two axes permuted): where allowed,
    # the dense weight transposed, eagerly and under `jit` (mutant `transpose`'s
    # rule, line 431, 8: the fallback given `None` for its params).
    lora, dense = _kernel_lora()
    f = quax.quaxify(lambda x: jnp.transpose(x, (2, 0, 1)))
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(
            run(lora), np.transpose(dense, (2, 0, 1)), rtol=1e-5, atol=1e-6
        )


def test_a_conversion_to_integers_rounds_the_dense_weight_where_allowed() -> None:
    # Rounding does not distribute over `w + s a b`: `astype(int32)` converts the
    # dense weight, where allowed (mutant `convert_element_type`'s rule, line 506,
    # 15: the fallback given its dtype under another name).
    lora, dense = _kernel_lora()
    w = np.asarray(lora.w)
    lora = eqx.tree_at(lambda x: x.w, lora, jnp.asarray(10.0 * w))
    dense = dense + 9.0 * w
    f = quax.quaxify(lambda x: x.astype(jnp.int32))
    for run in (f, jax.jit(f)):
        out = run(lora)
        assert out.dtype == jnp.int32
        np.testing.assert_array_equal(out, dense.astype(np.int32))


# The registered rules, a second sample (seed 49, `--decorated`).


def _adapted(
    shape: tuple[int, ...], batch_ndim: int, allow: bool
) -> tuple[quax_lora.LoraArray, np.ndarray]:
    # A `LoraArray` whose rows are one axis, with `b` nonzero, and its dense weight
    # `w + s a b` formed by NumPy from the factors (`b`'s columns may span several
    # axes, each batch axis pairs `a`'s with `b`'s).
    w = normal(jr.PRNGKey(6), shape)
    lora = quax_lora.LoraArray(
        w,
        rank=2,
        alpha=4.0,
        batch_ndim=batch_ndim,
        allow_materialise=allow,
        key=jr.PRNGKey(7),
    )
    b = 0.5 * normal(jr.PRNGKey(8), lora.b.shape)
    lora = eqx.tree_at(lambda x: x.b, lora, b)
    a = np.asarray(lora.a).reshape(*shape[: batch_ndim + 1], 2)
    b = np.asarray(b).reshape(*shape[:batch_ndim], 2, -1)
    update = np.einsum("...ir,...rj->...ij", a, b).reshape(shape)
    return lora, np.asarray(w) + (4.0 / 2) * update


def test_a_stack_of_adapted_matrices_transposed_along_its_batch_axes() -> None:
    # Permuting the batch axes of a stack of matrices permutes the factors' batch
    # axes alike: a `LoraArray` still, whose dense weight is the dense one permuted
    # (mutant `transpose`'s rule, line 431, 43: `a` replaced by `None`).
    lora, dense = _adapted((2, 3, 4, 5), 2, allow=False)
    f = quax.quaxify(lambda x: jnp.transpose(x, (1, 0, 2, 3)))
    for run in (f, jax.jit(f)):
        out = run(lora)
        assert isinstance(out, quax_lora.LoraArray)
        np.testing.assert_allclose(
            quax_lora.merge(out), np.transpose(dense, (1, 0, 2, 3)), rtol=1e-5
        )


def test_a_kernel_transposed_along_its_input_axes_stays_adapted() -> None:
    # A kernel (`batch_ndim=0`, its columns two input axes): permuting the input
    # axes permutes `b`'s, a `LoraArray` still; moving the output axis is no
    # `LoraArray`, dense where allowed (mutants `transpose`'s rule, line 431, 72:
    # `sorted(None)`, a `TypeError`; and 76: `rest[1] == nb` for `rest[0] == nb`,
    # which made the first dense and the second a malformed `LoraArray`: `w`
    # transposed, `a` of shape (4, 2) and `b` of shape (3, 2, 5), silently).
    lora, dense = _adapted((4, 3, 5), 0, allow=True)
    for perm, adapted in (((0, 2, 1), True), ((1, 0, 2), False)):
        f = quax.quaxify(lambda x, perm=perm: jnp.transpose(x, perm))
        for run in (f, jax.jit(f)):
            out = run(lora)
            assert isinstance(out, quax_lora.LoraArray) == adapted
            if adapted:
                out = quax_lora.merge(out)
            np.testing.assert_allclose(
                out, np.transpose(dense, perm), rtol=1e-5, atol=1e-6
            )


# The registered rules against the whole suite (seed 51, `--suite --decorated`).


def test_slices_of_columns_are_dense_where_allowed_and_refused_otherwise() -> None:
    # A slice that does not take whole rows has no low-rank form: where allowed,
    # the dense weight sliced (static and dynamic slices, eagerly and under `jit`);
    # otherwise refused. Columns 1:3 of 4 (mutants: the static slice's sizes
    # `hi + lo`, which is 4 for them, taken as whole rows; the dynamic slice's
    # fallback given `slice_sizes` under another name).
    for allow in (True, False):
        lora, dense = _adapted((6, 4), 0, allow=allow)
        static = quax.quaxify(lambda x: x[:, 1:3])
        dynamic = quax.quaxify(lambda x: lax.dynamic_slice(x, (2, 1), (3, 2)))
        for f, want in ((static, dense[:, 1:3]), (dynamic, dense[2:5, 1:3])):
            for run in (f, jax.jit(f)):
                if allow:
                    np.testing.assert_allclose(run(lora), want, rtol=1e-5, atol=1e-6)
                else:
                    with pytest.raises(quax_lora.LoraMaterialisationError):
                        run(lora)


# LoRA's registered rules against the whole suite (seed 52, `--suite --decorated`).


def _rows(x: jax.Array) -> lax.GatherDimensionNumbers:
    del x
    return lax.GatherDimensionNumbers(
        offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,)
    )


def _rows_from(x: jax.Array) -> lax.GatherDimensionNumbers:
    del x
    return lax.GatherDimensionNumbers(
        offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0, 1)
    )


@pytest.mark.parametrize("fill", [5.0, None, 0.0, -jnp.inf])
@pytest.mark.parametrize(
    "mode",
    [lax.GatherScatterMode.FILL_OR_DROP, lax.GatherScatterMode.CLIP],
    ids=["fill", "clip"],
)
def test_gathered_rows_out_of_bounds_are_the_dense_gathers(mode, fill) -> None:
    # Rows gathered by index, some out of bounds: filled with `fill_value` (or
    # clamped) exactly as the dense weight's gather fills them, without
    # materialising the weight; by a row index alone and by a (row, column) start
    # (column 0 in bounds, 1 out). The rule used to fill the rows of `a` with the
    # same value, so that a filled row read `fill + s * fill * sum(b)` (a wrong
    # number with any fill but 0 and NaN); and it refused every (row, column)
    # start with a fill (mutant line 597, 10: those taken for a row index alone).
    lora, dense = _adapted((6, 4), 0, allow=False)
    b = np.asarray(lora.b).copy()
    b[0, 0] = np.inf  # a filled row must not read the adapter at all
    lora = eqx.tree_at(lambda x: x.b, lora, jnp.asarray(b))
    dense = np.asarray(lora.w) + 2.0 * np.asarray(lora.a) @ b
    cases = [
        (_rows, jnp.array([[1], [10], [-1], [5]])),
        (_rows_from, jnp.array([[1, 0], [10, 0], [2, 1], [5, 0]])),
    ]
    for numbers, indices in cases:

        def gather(x, numbers=numbers, indices=indices):
            return lax.gather(
                x,
                indices,
                numbers(x),
                slice_sizes=(1, 4),
                mode=mode,
                fill_value=fill,
            )

        want = np.asarray(gather(jnp.asarray(dense)))
        f = quax.quaxify(gather)
        for run in (f, jax.jit(f)):
            np.testing.assert_allclose(run(lora), want, rtol=1e-5, atol=1e-6)


def test_a_gather_of_columns_is_dense_where_allowed_and_refused_otherwise() -> None:
    # Columns gathered by index have no low-rank form: where allowed, the dense
    # weight's columns (eagerly and under `jit`); otherwise refused, naming the
    # primitive (mutant line 597, 31: the fallback asked for without its values).
    columns = jnp.array([3, 1])
    for allow in (True, False):
        lora, dense = _adapted((6, 4), 0, allow=allow)
        f = quax.quaxify(lambda x: x[:, columns])
        for run in (f, jax.jit(f)):
            if allow:
                np.testing.assert_allclose(
                    run(lora), dense[:, [3, 1]], rtol=1e-5, atol=1e-6
                )
            else:
                with pytest.raises(
                    quax_lora.LoraMaterialisationError, match="primitive `gather`"
                ):
                    run(lora)
