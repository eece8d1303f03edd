"""Empty arrays (an axis of length 0) in every format: `quantise` gives an empty
`QuantisedArray`, and dequantising it, its products (each path, either side,
eagerly and under `jit`) and its structural operations give what dense JAX gives
on the empty float array. Before, shapes `(2, 0)` and `(0, 4)` raised
`ZeroDivisionError` or NumPy's "zero-size array to reduction operation"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_quant as qq


SHAPES = [(2, 0), (0, 4)]

# Each format and layout of issue 45, with the product paths it has.
FORMATS = {
    "nf4": ({"format": "nf4"}, ("weight_only",)),
    "nf4 double quant": ({"format": "nf4", "double_quant": True}, ("weight_only",)),
    "int8 per channel": ({"bits": 8, "axis": 0}, ("weight_only", "int8")),
    "int8 asymmetric": (
        {"bits": 8, "axis": 0, "symmetric": False},
        ("weight_only", "int8"),
    ),
    "int4 groups": ({"bits": 4, "group_size": 2}, ("weight_only", "int8")),
    "float8 e4m3fn": (
        {"format": "float8_e4m3fn", "axis": 0},
        ("weight_only", "float8"),
    ),
    "float8 e5m2": ({"format": "float8_e5m2"}, ("weight_only", "float8")),
}
CASES = [(name, shape) for name in FORMATS for shape in SHAPES]


def _quantised(name, shape, **extra):
    kwargs, _ = FORMATS[name]
    return qq.quantise(jnp.zeros(shape, jnp.float32), **kwargs, **extra)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_quantise_and_dequantise(name, shape):
    q = _quantised(name, shape)
    assert isinstance(q, qq.QuantisedArray)
    assert q.shape == shape and q.dtype == jnp.float32
    deq = q.dequantise()
    assert deq.shape == shape and deq.dtype == jnp.float32
    # Under `jit` (a traced empty array) too.
    traced = jax.jit(lambda x: _quantised(name, shape).dequantise() + x)(
        jnp.zeros(shape)
    )
    assert traced.shape == shape
    assert q.nbytes >= 0


@pytest.mark.parametrize(("name", "shape"), CASES)
# The formulations times the rows. CI runs every formulation at one row, and
# "blocked" (`_canonical_product`, the default) at 8 rows too: one row and more
# take other code there, in the weight-only product and the int8 (float8) path,
# and "auto" takes the int8 path at 8 rows. The other rows repeat these (`bash
# scripts/test.sh sweeps` runs them): above `REDUCE_MAX_ROWS` (1) rows "reduce"
# is the "fused" formulation (`_weight_only_product`), which reads no row count;
# "pallas" on an empty weight is "fused" too (`_pallas_product` returns `None`
# before any kernel, at any row count, which one row checks); and the int8 and
# float8 paths do not read the formulation, so "blocked" at 8 rows runs theirs.
@pytest.mark.parametrize(
    ("kernel", "rows"),
    [
        pytest.param(kernel, rows, marks=pytest.mark.sweep)
        if rows == 8 and kernel != "blocked"
        else (kernel, rows)
        for kernel in ("blocked", "fused", "reduce", "pallas")
        for rows in (1, 8)
    ],
)
def test_products_give_what_dense_gives(name, shape, rows, kernel):
    """`x @ w.T` and `w @ x.T` on every path the format has, in every formulation
    of the weight-only product (`quax_quant.kernels`), eagerly and under `jit`,
    against the same products on the dense empty array."""
    dense = jnp.zeros(shape, jnp.float32)
    x = jnp.arange(rows * shape[1], dtype=jnp.float32).reshape(rows, shape[1])
    fields = ("int8", "int4", "nf4", "float8")
    with qq.kernels(**{field: kernel for field in fields}):
        for path in ("auto", *FORMATS[name][1]):
            q = _quantised(name, shape, matmul=path)
            for fn in (lambda w, x: x @ w.T, lambda w, x: w @ x.T):
                want = fn(dense, x)
                for run in (quax.quaxify(fn), jax.jit(quax.quaxify(fn))):
                    got = run(q, x)
                    assert got.shape == want.shape and got.dtype == want.dtype
                    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_gradient_with_respect_to_the_activations(name, shape):
    dense = jnp.zeros(shape, jnp.float32)
    q = _quantised(name, shape)
    x = jnp.ones((3, shape[1]), jnp.float32)
    loss = lambda w, x: jnp.sum((x @ w.T) ** 2) + jnp.sum(x)
    want = jax.grad(loss, argnums=1)(dense, x)
    got = jax.jit(quax.quaxify(jax.grad(loss, argnums=1)))(q, x)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", SHAPES)
def test_quantised_times_quantised(shape):
    """Two empty int8 arrays: the int8 x int8 product is the empty (or zero)
    product."""
    a = _quantised("int8 per channel", shape)
    b = _quantised("int8 per channel", shape)
    fn = lambda a, b: a @ b.T
    want = fn(jnp.zeros(shape), jnp.zeros(shape))
    for run in (quax.quaxify(fn), jax.jit(quax.quaxify(fn))):
        got = run(a, b)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_structural_operations(name, shape):
    """Transposes, reshapes and slices of an empty array stay quantised and
    empty, with the shapes dense JAX gives."""
    q = _quantised(name, shape)
    dense = jnp.zeros(shape)
    for fn in (
        lambda w: w.T,
        lambda w: w.reshape(-1),
        lambda w: w[None],
        lambda w: w[:1],
        lambda w: -w,
    ):
        got = quax.quaxify(fn)(q)
        assert isinstance(got, qq.QuantisedArray)
        assert got.shape == fn(dense).shape
        np.testing.assert_array_equal(got.dequantise(), fn(dense))


def test_an_empty_slice_of_a_full_array():
    """`w[:, 3:3]` of a grouped array: one block of nothing."""
    w = qq.quantise(jnp.arange(12.0).reshape(2, 6), bits=4, group_size=3)
    got = quax.quaxify(lambda w: w[:, 3:3])(w)
    assert isinstance(got, qq.QuantisedArray) and got.shape == (2, 0)
    x = jnp.ones((1, 0))
    np.testing.assert_array_equal(
        quax.quaxify(lambda w, x: x @ w.T)(got, x), jnp.zeros((1, 2))
    )


def test_the_constructor_names_the_empty_axis_layout():
    """An empty axis has one block: the constructor refuses a scale of length 0
    there, saying so."""
    with pytest.raises(ValueError, match="1 along an empty axis"):
        qq.QuantisedArray(
            jnp.zeros((0, 4), jnp.int8),
            jnp.ones((0, 1)),
            None,
            None,
            bits=8,
            float_dtype=jnp.float32,
        )
