"""Hybrid dense dimensions (`n_dense > 0`) through the operations that change a
block: products that contract or batch dense dimensions (`a @ w` on the features,
`einsum('ijf,jf->if')`), sparse x sparse products whose right operand has blocks,
`reduce_max`/`reduce_min`/`reduce_prod` within the blocks and `max`/`min` against
zero (`jax.nn.relu`), against plain JAX on the dense array and, where it computes
the same thing, `jax.experimental.sparse`; what cannot keep blocks refuses, naming
`n_dense`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO, SparseMaterialisationError
from sparse_helpers import assert_close, check as check_jit


def check(fn, *args, dense_args, eager=False):
    """`check_jit` (under `jit`, nothing materialised), and eagerly if `eager`."""
    out = check_jit(fn, *args, dense_args=dense_args)
    if eager:
        assert_close(quax.quaxify(fn)(*args), fn(*dense_args))
    return out


def _blocks(seed=0, shape=(6, 5, 3), n_batch=0, n_dense=1, duplicates=False):
    """A dense array whose blocks (trailing `n_dense` axes) are all zero or stored
    (with zeros and negative values inside), and a `BCOO` of it with padding; with
    `duplicates`, every stored block is split into two entries that add up to it."""
    rng = np.random.default_rng(seed)
    lead = shape[: len(shape) - n_dense]
    stored = rng.random(lead) < 0.4
    values = rng.normal(size=shape) * (rng.random(shape) < 0.8)
    dense = np.where(stored.reshape(lead + (1,) * n_dense), values, 0)
    dense = dense.astype(np.float32)
    per_batch = stored.reshape((int(np.prod(lead[:n_batch], dtype=int)), -1))
    nse = int(per_batch.sum(axis=1).max()) + 1
    x = BCOO.fromdense(dense, nse=nse, n_batch=n_batch, n_dense=n_dense)
    if duplicates:
        part = rng.normal(size=x.data.shape).astype(np.float32)
        data = jnp.concatenate([x.data - part, part], axis=n_batch)
        indices = jnp.concatenate([x.indices, x.indices], axis=n_batch)
        x = BCOO(data, indices, x.shape)
    return dense, x


def _einsum(spec, sparse_first):
    """`einsum(spec)` of (sparse, dense) operands, the sparse one written first or
    second."""
    inputs, out = spec.split("->")
    s, d = inputs.split(",")
    if sparse_first:
        return lambda a, w: jnp.einsum(spec, a, w)
    return lambda a, w: jnp.einsum(f"{d},{s}->{out}", w, a)


# Products with a dense operand --------------------------------------------------------

# (spec, dense operand's shape, whether the product is sparse): sparse exactly when
# no batch or sparse dimension of the sparse operand is contracted or batched.
_PRODUCTS = [
    ("ijf,fg->ijg", (3, 4), True),  # a @ w: features transformed
    ("ijf,f->ij", (3,), True),  # a @ v: n_dense reduced to 0
    ("ijf,g->ijfg", (2,), True),  # outer product: a block axis more
    ("ijf,fg->fij", (3, 2), True),  # f batched: a batch dimension of the result
    ("ijf,jf->if", (5, 3), False),  # neighbour aggregation weighted per feature
    ("ijf,if->jf", (6, 3), False),
    ("ijf,jf->i", (5, 3), False),
    ("ijf,ijf->f", (6, 5, 3), False),
    ("ijf,fjg->igf", (3, 5, 2), False),
    ("ijf,jfg->ig", (5, 3, 2), False),
    ("ijf,j->if", (5,), False),  # contracting a sparse dimension only
]


@pytest.mark.parametrize(
    "sparse_first", [True, False], ids=["sparse_lhs", "sparse_rhs"]
)
@pytest.mark.parametrize(("spec", "other", "sparse"), _PRODUCTS, ids=lambda p: str(p))
def test_product_with_a_dense_operand(spec, other, sparse, sparse_first):
    dense, x = _blocks(1, duplicates=True)
    w = np.random.default_rng(2).normal(size=other).astype(np.float32)
    fn = _einsum(spec, sparse_first)
    out = check(fn, x, w, dense_args=(dense, w), eager=True)
    assert isinstance(out, BCOO) == sparse
    if sparse:  # on the pattern of `x`: as many entries, the blocks transformed
        assert out.nse == x.nse
        assert out.n_batch + out.n_sparse + out.n_dense == out.ndim


@pytest.mark.parametrize(
    ("spec", "other", "sparse"),
    [
        ("bijf,fg->bijg", (3, 4), True),
        ("bijf,bf->bij", (2, 3), False),
        ("bijf,bjf->bif", (2, 5, 3), False),
        ("bijf,jfg->big", (5, 3, 4), False),
    ],
    ids=str,
)
def test_product_of_a_batched_operand(spec, other, sparse):
    dense, x = _blocks(3, (2, 6, 5, 3), n_batch=1)
    w = np.random.default_rng(4).normal(size=other).astype(np.float32)
    for sparse_first in (True, False):
        fn = _einsum(spec, sparse_first)
        out = check(fn, x, w, dense_args=(dense, w), eager=True)
        assert isinstance(out, BCOO) == sparse


def test_feature_transform_matches_jax_experimental_sparse():
    # `jax.experimental.sparse` refuses `a @ w` over the dense dimension
    # ("contracting over dense dimensions"); on the same array with one stored
    # entry per element (`n_dense=0`) it computes the product, as a reference.
    dense, x = _blocks(5)
    w = np.random.default_rng(6).normal(size=(3, 4)).astype(np.float32)
    with pytest.raises(NotImplementedError, match="dense dimensions"):
        jsparse.bcoo_dot_general(
            x.to_jax(), jnp.asarray(w), dimension_numbers=(([2], [0]), ([], []))
        )
    flat = x.update_layout(n_dense=0).to_jax()
    want = jsparse.bcoo_dot_general(
        flat, jnp.asarray(w), dimension_numbers=(([2], [0]), ([], []))
    )
    got = jax.jit(quax.quaxify(lambda a, w: a @ w))(x, w)
    assert isinstance(got, BCOO) and got.n_dense == 1
    assert_close(got.todense(), want)
    assert_close(got.todense(), dense @ w)


def test_product_of_integer_blocks():
    _, x = _blocks(7)
    ints = BCOO(jnp.round(3 * x.data).astype(jnp.int32), x.indices, x.shape)
    dense = np.asarray(ints.todense())
    w = np.arange(6, dtype=np.int32).reshape(3, 2)
    out = check(lambda a, w: a @ w, ints, w, dense_args=(dense, w), eager=True)
    assert out.dtype == jnp.int32 and isinstance(out, BCOO)
    np.testing.assert_array_equal(np.asarray(out.todense()), dense @ w)


# Sparse x sparse ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec", ["ki,ijf->kjf", "ik,ijf->kjf", "ki,jif->kjf", "ik,jif->kjf"]
)
def test_sparse_matrix_times_sparse_blocks(spec):
    # An adjacency (scalar entries) times edge features (blocks): sparse, blocks kept.
    rng = np.random.default_rng(8)
    adjacency = (rng.random((6, 6)) < 0.4).astype(np.float32) * rng.normal(size=(6, 6))
    adjacency = adjacency.astype(np.float32)
    s = BCOO.fromdense(adjacency, nse=int((adjacency != 0).sum()) + 1)
    dense, x = _blocks(9, (6, 6, 3), duplicates=True)
    fn = lambda s, a: jnp.einsum(spec, s, a)
    out = check(fn, s, x, dense_args=(adjacency, dense), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 1


def test_sparse_times_sparse_with_blocks_on_the_left_refuses():
    dense, x = _blocks(10, (6, 6, 3))
    s = BCOO.fromdense(np.eye(6, dtype=np.float32), nse=6)
    # (`einsum("ijf,jk->ikf")` puts `s` first, then transposes: sparse.)
    out = check(
        lambda a, s: jnp.einsum("ijf,jk->ikf", a, s),
        x,
        s,
        dense_args=(dense, np.eye(6, dtype=np.float32)),
    )
    assert isinstance(out, BCOO) and out.n_dense == 1
    # Bound as written, the product's dense dimension sits between sparse ones.
    fn = lambda a, s: lax.dot_general(a, s, (([1], [0]), ([], [])))
    with pytest.raises(SparseMaterialisationError, match=r"n_dense=1.*y\.todense\(\)"):
        quax.quaxify(fn)(x, s)
    want = fn(dense, np.eye(6, dtype=np.float32))
    assert_close(quax.quaxify(fn)(x, s.todense()), want)  # the way out
    # Both with blocks, batched over them.
    both = lambda a: jnp.einsum("ijk,jlk->ilk", a, a.transpose(1, 0, 2))
    with pytest.raises(SparseMaterialisationError, match=r"n_dense=1.*y\.todense\(\)"):
        quax.quaxify(both)(x)
    assert_close(quax.quaxify(both)(x.enable_materialise()), both(dense))
    allowed = (x.enable_materialise(), s.enable_materialise())
    assert_close(quax.quaxify(fn)(*allowed), want)


# Reductions within the blocks, max/min against zero -----------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.max(2),
        lambda a: a.min(-1),
        lambda a: jnp.prod(a, 2),
        lambda a: jnp.max(a, (2, 3)),
        lambda a: jnp.min(a, 3),
    ],
    ids=["max", "min", "prod", "max_both", "min_last"],
)
@pytest.mark.parametrize("duplicates", [False, True], ids=["unique", "dup"])
def test_reduce_within_blocks(fn, duplicates):
    # (max and min of a block stored as two entries read the merged block.)
    dense, x = _blocks(11, (6, 5, 3, 2), n_dense=2, duplicates=duplicates)
    out = check(fn, x, dense_args=(dense,), eager=True)
    assert isinstance(out, BCOO) and out.nse == x.nse


@pytest.mark.parametrize(
    "fn", [lambda a: a.max(1), lambda a: a.min((0, 2))], ids=["sparse", "mixed"]
)
def test_reduce_over_sparse_dims_refuses(fn):
    dense, x = _blocks(12)
    with pytest.raises(SparseMaterialisationError, match=r"n_dense=1.*update_layout"):
        quax.quaxify(fn)(x)
    assert_close(quax.quaxify(fn)(x.enable_materialise()), fn(dense))


@pytest.mark.parametrize(
    "fn",
    [
        jax.nn.relu,
        lambda a: jnp.maximum(0.0, a),
        lambda a: jnp.minimum(a, 0),
        lambda a: jax.nn.relu(a) * 2 - jnp.minimum(a, 0.0),
    ],
    ids=["relu", "maximum", "minimum", "both"],
)
@pytest.mark.parametrize("n_dense", [0, 1])
def test_max_and_min_against_zero(fn, n_dense):
    # Duplicates merged first: relu of the sum, not the sum of relus.
    dense, x = _blocks(13, n_dense=n_dense, duplicates=True)
    out = check(fn, x, dense_args=(dense,), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == n_dense


def test_max_against_a_nonzero_refuses():
    dense, x = _blocks(14)
    with pytest.raises(SparseMaterialisationError, match=r"`max`.*n_dense=1"):
        quax.quaxify(lambda a: jnp.maximum(a, 1.0))(x)
    leaky = quax.quaxify(jax.nn.leaky_relu)  # `ge` against zero: no rule
    with pytest.raises(SparseMaterialisationError, match=r"`ge`.*n_dense=1"):
        leaky(x)
    assert_close(leaky(x.enable_materialise()), jax.nn.leaky_relu(dense))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a > 0,
        lambda a: jnp.greater(0.0, a),
        lambda a: a != 0,
        lambda a: jnp.where(a > 0, a, 0),
        lambda a: jnp.where(a < 0, jnp.sin(a), 0.0) * 2,
    ],
    ids=["gt", "zero_gt", "ne", "where_positive", "where_negative"],
)
@pytest.mark.parametrize("n_batch", [0, 1])
def test_comparisons_with_zero_are_sparse_masks(fn, n_batch):
    shape = (2, 6, 5, 3) if n_batch else (6, 5, 3)
    dense, x = _blocks(15, shape, n_batch=n_batch, duplicates=not n_batch)
    out = check(fn, x, dense_args=(dense,), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 1


@pytest.mark.parametrize("n_batch", [0, 1])
def test_where_with_a_sparse_mask_of_another_pattern(n_batch):
    # The entries both store where the mask holds; a NaN that it drops is dropped.
    shape = (2, 6, 5, 3) if n_batch else (6, 5, 3)
    d1, x = _blocks(16, shape, n_batch=n_batch)
    x = BCOO(x.data.at[..., :2, :].set(np.nan), x.indices, x.shape)
    d1 = np.asarray(x.todense())
    d2, y = _blocks(17, shape, n_batch=n_batch)
    mask = quax.quaxify(lambda a: a > 0)(y)
    assert isinstance(mask, BCOO) and mask.dtype == jnp.bool_
    fn = lambda m, a: jnp.where(m, a, 0)
    out = check(fn, mask, x, dense_args=(d2 > 0, d1), eager=True)
    assert isinstance(out, BCOO) and out.n_dense == 1 and out.n_batch == n_batch
