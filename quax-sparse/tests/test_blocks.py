"""Hybrid dense dimensions (`n_dense`: each stored entry is a dense block, as in
`jax.experimental.sparse`): construction, `todense`, the elementwise rules,
`transpose`, the structural operations (reshape, slices, `rev`, `squeeze`,
concatenation, new axes of size 1), products with a dense operand, sums and row
gathers, against `jax.experimental.sparse` and plain JAX on the dense array, under
`jit`, `vmap` and `grad`; the rules that cannot keep blocks refuse, naming `n_dense`
and the way out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from hypothesis import given, settings, strategies as st
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO, SparseMaterialisationError
from sparse_helpers import assert_close, check as check_jit


def check(fn, *args, dense_args, eager=False):
    """`check_jit` (under `jit`, nothing materialised), and eagerly if `eager`."""
    out = check_jit(fn, *args, dense_args=dense_args)
    if eager:
        assert_close(quax.quaxify(fn)(*args), fn(*dense_args))
    return out


def _blocks(seed=0, shape=(6, 5, 3), density=0.4, n_batch=0, n_dense=1):
    """A dense array whose blocks along the trailing `n_dense` axes are either
    all zero or stored (with some zeros inside), and its `BCOO` with padding."""
    rng = np.random.default_rng(seed)
    lead = shape[: len(shape) - n_dense]
    stored = rng.random(lead) < density
    values = rng.normal(size=shape) * (rng.random(shape) < 0.8)
    dense = np.where(stored.reshape(lead + (1,) * n_dense), values, 0)
    dense = dense.astype(np.float32)
    batch_size = int(np.prod(lead[:n_batch], dtype=int))
    per_batch = stored.reshape((batch_size, *lead[n_batch:]))
    nse = int(max(b.sum() for b in per_batch)) + 1
    return dense, BCOO.fromdense(dense, nse=nse, n_batch=n_batch, n_dense=n_dense)


# Construction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "n_batch", "n_dense"),
    [((6, 5, 3), 0, 1), ((6, 5, 2, 3), 0, 2), ((2, 6, 5, 3), 1, 1), ((6, 4), 0, 1)],
)
def test_fromdense_matches_jax_experimental_sparse(shape, n_batch, n_dense):
    dense, x = _blocks(1, shape, n_batch=n_batch, n_dense=n_dense)
    want = jsparse.BCOO.fromdense(
        jnp.asarray(dense), nse=x.nse, n_batch=n_batch, n_dense=n_dense
    )
    assert (x.n_batch, x.n_dense, x.n_sparse) == (
        want.n_batch,
        want.n_dense,
        want.n_sparse,
    )
    assert x.shape == shape and x.dense_shape == shape[len(shape) - n_dense :]
    np.testing.assert_array_equal(np.asarray(x.data), np.asarray(want.data))
    np.testing.assert_array_equal(np.asarray(x.indices), np.asarray(want.indices))
    assert_close(x.todense(), dense)
    jitted = jax.jit(
        lambda d: BCOO.fromdense(d, nse=x.nse, n_batch=n_batch, n_dense=n_dense)
    )(dense)
    assert jitted.n_dense == n_dense
    assert_close(jitted.todense(), dense)


@pytest.mark.parametrize(("n_batch", "n_dense"), [(1, 1), (2, 0), (0, 2)])
def test_fromdense_without_sparse_dimensions(n_batch, n_dense):
    # One position per batch element: stored once, whatever `nse`.
    x = np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3)
    for nse in (1, 3):
        y = BCOO.fromdense(x, nse=nse, n_batch=n_batch, n_dense=n_dense)
        assert y.n_sparse == 0 and y.nse == nse
        assert_close(y.todense(), x)
        want = jsparse.BCOO.fromdense(
            jnp.asarray(x), nse=nse, n_batch=n_batch, n_dense=n_dense
        )
        assert_close(want.todense(), x)


def test_from_data_and_indices():
    # Two feature vectors (blocks of 3) on a 4 x 4 graph, one entry stored twice
    # (they add up) and one padding entry.
    data = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [1.0, 1.0, 1.0], [9, 9, 9]])
    indices = jnp.asarray([[0, 1], [2, 3], [0, 1], [4, 4]], jnp.int32)
    x = BCOO(data, indices, (4, 4, 3))
    assert (x.n_batch, x.n_sparse, x.n_dense, x.nse) == (0, 2, 1, 4)
    want = np.zeros((4, 4, 3), np.float32)
    want[0, 1] = [2.0, 3.0, 4.0]
    want[2, 3] = [4.0, 5.0, 6.0]
    assert_close(x.todense(), want)
    assert_close(jsparse.BCOO((data, indices), shape=(4, 4, 3)).todense(), want)
    assert_close(x.sum_duplicates().todense(), want)
    assert x.sum_duplicates().data.shape == (4, 3)


def test_shape_must_end_with_the_blocks():
    with pytest.raises(ValueError, match=r"n_dense=1.*\(\*batch, \*sparse, \*dense\)"):
        BCOO(jnp.zeros((2, 3)), jnp.zeros((2, 2), jnp.int32), (4, 4, 5))
    with pytest.raises(ValueError, match=r"n_dense=2 must be in \[0, 1\]"):
        BCOO.fromdense(jnp.zeros((2, 3, 4)), nse=1, n_batch=2, n_dense=2)


@pytest.mark.parametrize("n_dense", [0, 1])
def test_update_layout(n_dense):
    dense, x = _blocks(2, (5, 4, 2, 3), n_dense=2)
    y = x.update_layout(n_dense=n_dense)
    assert y.n_dense == n_dense and y.nse == x.nse * (6 if n_dense == 0 else 2)
    assert_close(y.todense(), dense)
    assert_close(y.sum_duplicates().todense(), dense)
    want = jsparse.bcoo_update_layout(x.to_jax(), n_dense=n_dense)
    assert_close(want.todense(), dense)
    assert_close(BCOO.from_jax(x.to_jax()).todense(), dense)
    with pytest.raises(ValueError, match="n_dense must be in"):
        y.update_layout(n_dense=n_dense + 1)


# Elementwise --------------------------------------------------------------------------


def _with_duplicates():
    """A `(4, 3, 2)` array whose entry at (1, 2) is stored as two blocks."""
    data = jnp.asarray([[0.5, -1.0], [0.25, 2.0], [1.0, 0.0], [0.0, 0.0]])
    indices = jnp.asarray([[1, 2], [1, 2], [3, 0], [4, 3]], jnp.int32)
    x = BCOO(data, indices, (4, 3, 2))
    return np.asarray(x.todense()), x


@pytest.mark.parametrize(
    "fn",
    [
        jnp.sin,
        jnp.negative,
        lambda a: a**3,
        lambda a: jnp.abs(a) * 2.0,
        lambda a: a / 4.0,
        lambda a: a.astype(jnp.int32),
        lambda a: jnp.sqrt(jnp.abs(a)) + a,
    ],
    ids=["sin", "neg", "cube", "abs_scaled", "div", "to_int", "sqrt_plus"],
)
@pytest.mark.parametrize("make", [_blocks, _with_duplicates], ids=["fromdense", "dup"])
def test_elementwise(fn, make):
    dense, x = make()
    out = check(fn, x, dense_args=(dense,), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 1


@pytest.mark.parametrize("other_shape", [(6, 5, 3), (3,), (6, 1, 1), (5, 1)], ids=str)
def test_times_and_plus_a_dense_array(other_shape):
    dense, x = _blocks(3)
    other = np.random.default_rng(4).normal(size=other_shape).astype(np.float32)
    out = check(lambda a, b: a * b, x, other, dense_args=(dense, other), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 1
    check(lambda a, b: b * a, x, other, dense_args=(dense, other))
    check(lambda a, b: a + b, x, other, dense_args=(dense, other))
    check(lambda a, b: b - a, x, other, dense_args=(dense, other))


def test_sparse_plus_and_times_sparse():
    d1, x = _blocks(5)
    d2, y = _blocks(6)
    total = check(lambda a, b: a - 2 * b, x, y, dense_args=(d1, d2), eager=True)
    assert isinstance(total, BCOO) and total.n_dense == 1
    product = check(lambda a, b: a * b, x, y, dense_args=(d1, d2), eager=True)
    assert isinstance(product, BCOO) and product.n_dense == 1
    # One operand with blocks, the other with scalar entries: blocks are split.
    flat = y.update_layout(n_dense=0)
    check(lambda a, b: a + b, x, flat, dense_args=(d1, d2))
    check(lambda a, b: a * b, flat, x, dense_args=(d2, d1))


def test_where_keeps_the_blocks():
    dense, x = _blocks(7)
    mask = np.random.default_rng(8).random(dense.shape) < 0.5
    out = check(
        lambda a, m: jnp.where(m, a, 0), x, mask, dense_args=(dense, mask), eager=True
    )
    assert isinstance(out, BCOO) and out.n_dense == 1
    row_mask = mask[:, :1, :1]  # broadcast along the sparse and dense axes
    check(lambda a, m: jnp.where(m, 0, a), x, row_mask, dense_args=(dense, row_mask))


# Structure and products ---------------------------------------------------------------


def test_transpose_over_sparse_dims():
    dense, x = _blocks(9, (6, 5, 2, 3), n_dense=2)
    out = check(lambda a: a.transpose(1, 0, 3, 2), x, dense_args=(dense,), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 2
    batched, xb = _blocks(10, (2, 6, 5, 3), n_batch=1)
    check(lambda a: a.transpose(2, 1, 0, 3), xb, dense_args=(batched,))
    with pytest.raises(SparseMaterialisationError, match=r"n_dense=2.*update_layout"):
        quax.quaxify(lambda a: a.transpose(0, 2, 1, 3))(x)


@pytest.mark.parametrize(
    ("spec", "other_shape"),
    [
        ("ijk,i->jk", (6,)),
        ("ijk,j->ik", (5,)),
        ("ijk,jl->ikl", (5, 4)),
        ("ijk,li->ljk", (4, 6)),
        ("i,ijk->jk", (6,)),
        ("lj,ijk->lik", (4, 5)),
        ("bijk,bjl->bikl", (2, 5, 4)),
    ],
)
def test_product_contracting_a_sparse_dim(spec, other_shape):
    # The sparse operand (with blocks over `k`) on either side of the product.
    if spec.startswith("b"):  # a batch of sparse matrices with blocks
        dense, x = _blocks(12, (2, 6, 5, 3), n_batch=1)
    else:
        dense, x = _blocks(12)
    rng = np.random.default_rng(11)
    dense_other = rng.normal(size=other_shape).astype(np.float32)
    if "ijk" in spec.split(",")[0]:
        fn = lambda a, v: jnp.einsum(spec, a, v)
    else:
        fn = lambda a, v: jnp.einsum(spec, v, a)
    check(fn, x, dense_other, dense_args=(dense, dense_other), eager=True)
    if spec == "ijk,jl->ikl":  # the same product by jax.experimental.sparse
        want = jsparse.bcoo_dot_general(
            x.to_jax(), dense_other, dimension_numbers=(([1], [0]), ([], []))
        )
        assert_close(jax.jit(quax.quaxify(fn))(x, dense_other), want)


@pytest.mark.parametrize(
    "axes", [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)], ids=str
)
def test_sum(axes):
    dense, x = _blocks(14)
    check(lambda a: a.sum(axes), x, dense_args=(dense,), eager=True)
    batched, xb = _blocks(15, (2, 6, 5, 3), n_batch=1)
    check(lambda a: a.sum(axes), xb, dense_args=(batched,))


@pytest.mark.parametrize("mode", [None, "fill"])
def test_row_gather(mode):
    dense, x = _blocks(16)
    dense = jnp.asarray(dense)
    idx = jnp.asarray([5, 0, 0, 2, 9, -1])  # out of range: clamped, or zero rows

    def fn(a, i):
        return a.at[i].get(mode=mode, fill_value=0) if mode else a[i]

    out = check(fn, x, idx, dense_args=(dense, idx), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 1


# Transformations ----------------------------------------------------------------------


def test_vmap_over_a_dense_operand():
    dense, x = _blocks(17)
    vs = np.random.default_rng(18).normal(size=(4, 6)).astype(np.float32)
    fn = lambda a, v: jnp.einsum("ijk,i->jk", a, v)
    got = jax.jit(jax.vmap(quax.quaxify(fn), in_axes=(None, 0)))(x, vs)
    assert_close(got, jax.vmap(fn, in_axes=(None, 0))(dense, vs))


def test_vmap_over_the_leaves():
    d1, d2 = _blocks(19)[0], _blocks(20)[0]
    # The same nse, to stack: the larger count of stored blocks.
    nse = max(BCOO.fromdense(d, n_dense=1).nse for d in (d1, d2))
    x, y = (BCOO.fromdense(d, nse=nse, n_dense=1) for d in (d1, d2))
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), x, y)
    v = np.random.default_rng(21).normal(size=(6,)).astype(np.float32)
    fn = lambda a, v: jnp.sin(a).sum(0) + jnp.einsum("ijk,i->jk", a, v)
    got = jax.jit(jax.vmap(quax.quaxify(fn), in_axes=(0, None)))(stacked, v)
    want = jax.vmap(fn, in_axes=(0, None))(np.stack([d1, d2]), v)
    assert_close(got, want)


def test_grad_with_respect_to_the_blocks():
    _, x = _blocks(22)
    v = np.random.default_rng(23).normal(size=(5, 4)).astype(np.float32)

    def loss(a):
        return (jnp.einsum("ijk,jl->ikl", a, v) ** 2).sum() + jnp.sin(a).sum()

    got = jax.jit(jax.grad(lambda d: quax.quaxify(loss)(BCOO(d, x.indices, x.shape))))(
        x.data
    )
    assert got.shape == x.data.shape

    def reference(data):  # plain JAX on the dense array built from the blocks
        rows, cols = x.indices[:, 0], x.indices[:, 1]
        a = jnp.zeros(x.shape).at[rows, cols].add(data, mode="drop")
        return loss(a)

    # (`jax.experimental.sparse`'s own gradient of `bcoo_dot_general` with dense
    # dimensions fails in JAX 0.10: a transpose with a wrong permutation.)
    assert_close(got, jax.grad(reference)(x.data))


# Refusals -----------------------------------------------------------------------------


# Structural operations on the batch and sparse dimensions keep the blocks; on the
# dense dimensions they act on every block alike. With the `n_dense` of the result.
_STRUCTURAL = {
    "reshape": (lambda a: a.reshape(30, 3), 1),
    "reshape_split": (lambda a: a.reshape(2, 3, 5, 3), 1),
    "slice": (lambda a: a[1:5:2], 1),
    "slice_block": (lambda a: a[1:, ::2, 1:], 1),
    "index_block": (lambda a: a[:, :, 1], 0),
    "dynamic_slice": (lambda a: jax.lax.dynamic_slice(a, (2, 1, 1), (3, 2, 2)), 1),
    "concatenate": (lambda a: jnp.concatenate([a, 2 * a]), 1),
    "concatenate_1": (lambda a: jnp.concatenate([a, a[:, :2]], axis=1), 1),
    "rev": (lambda a: jnp.flip(a, 0), 1),
    "rev_block": (lambda a: jnp.flip(a, (1, 2)), 1),
    "new_axis": (lambda a: a[:, None], 1),
    "new_block_axis": (lambda a: a[:, :, None, :, None], 2),
    "squeeze": (lambda a: a[:, :1].squeeze(1), 1),
    "squeeze_block": (lambda a: a[:, :, :1].squeeze(2), 0),
}


@pytest.mark.parametrize("name", list(_STRUCTURAL))
def test_structure_keeps_the_blocks(name):
    fn, n_dense = _STRUCTURAL[name]
    dense, x = _blocks(24)
    out = check(fn, x, dense_args=(dense,), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == n_dense


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a[1:, 3:0:-2],
        lambda a: jnp.flip(a, (0, 2, 3)),
        lambda a: a.reshape(12, 5, 3),
        lambda a: a[:1].squeeze(0),
        lambda a: jnp.concatenate([a, a], axis=0),
    ],
    ids=["slice", "rev", "reshape", "squeeze", "concatenate"],
)
def test_structure_of_batched_blocks(fn):
    dense, x = _blocks(25, (2, 6, 5, 3), n_batch=1)
    out = check(fn, x, dense_args=(dense,), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 1


def test_structure_matches_jax_experimental_sparse():
    _, x = _blocks(26)
    j = x.to_jax()
    cases = [
        (
            lambda a: a[1:5, :, 1:3],
            jsparse.bcoo_slice(j, start_indices=(1, 0, 1), limit_indices=(5, 5, 3)),
        ),
        (lambda a: a.reshape(30, 3), jsparse.bcoo_reshape(j, new_sizes=(30, 3))),
        (
            lambda a: jnp.concatenate([a, a], axis=1),
            jsparse.bcoo_concatenate([j, j], dimension=1),
        ),
    ]
    for fn, want in cases:
        got = quax.quaxify(fn)(x)
        assert got.n_dense == want.n_dense == 1
        assert_close(got.todense(), want.todense())


@pytest.mark.long_running
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_random_windows_flips_and_reshapes_keep_the_blocks(data):
    sizes = st.integers(1, 5)
    shape = data.draw(st.tuples(sizes, sizes, st.integers(1, 4)), label="shape")
    dense, x = _blocks(data.draw(st.integers(0, 2**16), label="seed"), shape)
    window = []
    for size in shape:
        lo = data.draw(st.integers(0, size - 1))
        hi = data.draw(st.integers(lo + 1, size))
        window.append(slice(lo, hi, data.draw(st.integers(1, 2))))
    flips = data.draw(st.lists(st.integers(0, 2), unique=True), label="flips")

    def fn(a):
        a = jnp.flip(a[tuple(window)], flips)
        return a.reshape(-1, a.shape[-1])  # the two sparse dimensions merged

    out = check(fn, x, dense_args=(dense,), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 1


def test_concatenate_with_fewer_blocks_splits_them():
    d1, x = _blocks(27, (6, 5, 2, 3), n_dense=2)
    d2, y = _blocks(28, (6, 5, 2, 3), n_dense=1)
    fn = lambda a, b: jnp.concatenate([a, b])
    out = check(fn, x, y, dense_args=(d1, d2), eager=True)
    assert out.n_dense == 1


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.reshape(6, 15),
        lambda a: a.reshape(6, 5, 3, 1),
        lambda a: jnp.concatenate([a, a], axis=2),
        lambda a: jnp.broadcast_to(a[:, :, :1], (6, 5, 3)),
    ],
    ids=[
        "reshape_blocks",
        "new_block_axis_by_reshape",
        "concatenate_blocks",
        "stretch",
    ],
)
def test_rules_without_blocks_refuse_naming_n_dense(fn):
    dense, x = _blocks(24)
    with pytest.raises(SparseMaterialisationError, match=r"n_dense=1.*update_layout"):
        quax.quaxify(fn)(x)
    assert_close(quax.quaxify(fn)(x.enable_materialise()), fn(dense))
