"""`BlockSparse`, a matrix of dense blocks: construction and its checks, `fromdense`,
`todense`, `to_bcoo`; its products with dense operands in every layout its rule
covers (either side, either matrix dimension contracted, batches paired or free),
the transpose, the linear functions and scaling; the refusals; and the conformance
kit (values, `jit`, `vmap` in both orders, `grad`, `jvp`), a CG solve, a loop, and
the compiled matvec holding no dense matrix. References are NumPy in float64, on
matrices assembled block by block in the test."""

from typing import Any

import equinox as eqx
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as jspla
import numpy as np
import pytest
import quax
import quax.testing
from hypothesis import given, settings
from jax import lax
from quax_sparse import BCOO, BlockSparse, SparseMaterialisationError
from sparse_helpers import assert_close


def assemble(data: Any, indices: Any, shape: tuple[int, ...]) -> Any:
    """The dense matrix (or batch) of blocks, written out with NumPy loops: each
    block added at its place, padding (an index at the grid's size) skipped."""
    data, indices = np.asarray(data), np.asarray(indices)
    *batch, n_rows, n_cols = shape
    br, bc = data.shape[-2:]
    out = np.zeros(shape, np.result_type(data.dtype, np.float64))
    for b in np.ndindex(*batch):
        for block, (r, c) in zip(data[b], indices[b], strict=True):
            if r < n_rows // br and c < n_cols // bc:
                out[b][r * br : (r + 1) * br, c * bc : (c + 1) * bc] += block
    return out


def random_blocks(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    block_shape: tuple[int, int],
    density: float,
    *,
    padding: int = 1,
    dtype: Any = np.float32,
) -> tuple[Any, BlockSparse]:
    """A `BlockSparse` of random blocks at random block positions (shuffled, one
    position stored twice when there is room, `padding` padding blocks), and its
    dense twin from `assemble`."""
    *batch, n_rows, n_cols = shape
    br, bc = block_shape
    grid = (n_rows // br, n_cols // bc)
    count = max(1, int(density * grid[0] * grid[1]))
    nblocks = count + 1 + padding
    data = rng.normal(size=(*batch, nblocks, br, bc))
    if np.issubdtype(dtype, np.complexfloating):
        data = data + 1j * rng.normal(size=data.shape)
    data = data.astype(dtype)
    indices = np.empty((*batch, nblocks, 2), np.int32)
    for b in np.ndindex(*batch):
        flat = rng.choice(grid[0] * grid[1], size=count, replace=False)
        positions = np.stack(np.divmod(flat, grid[1]), axis=-1)
        twice = positions[:1]  # stored again: blocks at one position add up
        pad = np.broadcast_to(np.asarray(grid), (padding, 2))
        indices[b] = np.concatenate([positions, twice, pad])
    a = BlockSparse(jnp.asarray(data), jnp.asarray(indices), shape)
    return assemble(data, indices, shape), a


def _matmul(a, v):
    return a @ v


# Construction -------------------------------------------------------------------------


def test_fields_todense_and_to_bcoo():
    data = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3) + 1
    indices = np.array([[1, 0], [0, 1]], np.int32)
    a = BlockSparse(data, indices, (4, 6))
    assert a.shape == (4, 6) and a.dtype == jnp.float32 and a.ndim == 2
    assert a.block_shape == (2, 3) and a.grid == (2, 2) and a.nblocks == 2
    assert a.n_batch == 0 and a.allow_materialise is False
    want = np.zeros((4, 6))
    want[2:4, 0:3] = data[0]
    want[0:2, 3:6] = data[1]
    np.testing.assert_array_equal(a.todense(), want)
    b = a.to_bcoo()
    assert isinstance(b, BCOO) and b.nse == 12
    np.testing.assert_array_equal(b.todense(), want)
    with pytest.raises(SparseMaterialisationError, match="Refusing to materialise"):
        a.materialise()
    np.testing.assert_array_equal(a.enable_materialise().materialise(), want)


def test_padding_and_blocks_at_one_position():
    data = np.ones((3, 2, 2), np.float32)
    # Block (0, 0) twice (they add up), and a padding block at the grid's size.
    a = BlockSparse(data, np.array([[0, 0], [0, 0], [2, 0]]), (4, 4))
    want = np.zeros((4, 4))
    want[:2, :2] = 2.0
    np.testing.assert_array_equal(a.todense(), want)
    v = np.arange(4.0, dtype=np.float32)
    assert_close(quax.quaxify(_matmul)(a, v), want @ v)
    assert_close(a.to_bcoo().todense(), want)
    # A block is padding when either of its indices is at the grid's size: skipped
    # whole by every product, NaN data included.
    data = np.concatenate([data, np.full((2, 2, 2), np.nan, np.float32)])
    padded = BlockSparse(
        data, np.array([[0, 0], [0, 0], [2, 0], [0, 2], [1, 2]]), (4, 4)
    )
    np.testing.assert_array_equal(padded.todense(), want)
    for fn in (_matmul, lambda a, v: v @ a, lambda a, v: (a * v).T @ v):
        got = jax.jit(quax.quaxify(fn))(padded, v)
        assert_close(got, fn(want, v))
    assert not np.isnan(np.asarray(padded.to_bcoo().todense())).any()


@pytest.mark.parametrize(
    "data, indices, shape, match",
    [
        (np.ones((2, 2)), np.zeros((2, 2), int), (4, 4), "data` of shape"),
        (np.ones((2, 2, 2)), np.zeros((3, 2), int), (4, 4), "indices` of shape"),
        (np.ones((2, 2, 2)), np.zeros((2, 3), int), (4, 4), "indices` of shape"),
        (np.ones((2, 2, 2)), np.zeros((2, 2), int), (4,), "holds matrices"),
        (np.ones((2, 2, 3)), np.zeros((2, 2), int), (4, 4), "divides"),
        (np.ones((2, 0, 2)), np.zeros((2, 2), int), (0, 4), "positive shape"),
        (np.ones((2, 2, 2)), np.zeros((2, 2), float), (4, 4), "must be integers"),
        (np.ones((2, 2, 2)), np.zeros((2, 2), int), (4, -4), "non-negative"),
        (np.ones((2, 2, 2)), [[0, 0], [0, 3]], (4, 4), r"block column must lie in"),
        (np.ones((2, 2, 2)), [[0, 0], [-1, 0]], (4, 4), r"block row must lie in"),
        (np.ones((3, 2, 2, 2)), np.zeros((2, 2, 2), int), (3, 4, 4), "indices` of"),
    ],
)
def test_constructor_refuses(data, indices, shape, match):
    with pytest.raises(ValueError, match=match):
        BlockSparse(data, jnp.asarray(indices), shape)


def test_traced_out_of_range_indices_are_padding():
    @jax.jit
    def dense(indices):
        return BlockSparse(jnp.ones((2, 2, 2)), indices, (4, 4)).todense()

    want = np.zeros((4, 4))
    want[:2, :2] = 1.0
    np.testing.assert_array_equal(dense(jnp.array([[0, 0], [7, -1]])), want)


def test_rebuilt_without_its_constructor_is_checked():
    a = BlockSparse(np.ones((2, 2, 2)), np.zeros((2, 2), np.int32), (4, 4))
    bad = eqx.tree_at(lambda a: a.indices, a, jnp.zeros((3, 2), jnp.int32))
    with pytest.raises(ValueError, match="BlockSparse"):
        quax.quaxify(_matmul)(bad, jnp.ones(4))


@pytest.mark.parametrize("block_shape", [1, 2, (2, 4), (4, 2), 8])
@pytest.mark.parametrize("n_batch", [0, 1])
def test_fromdense_against_the_blocks(block_shape, n_batch):
    rng = np.random.default_rng(3)
    br, bc = (block_shape,) * 2 if isinstance(block_shape, int) else block_shape
    keep = np.kron(rng.random((2, 8 // br, 8 // bc)) < 0.4, np.ones((br, bc)))
    dense = (keep * rng.normal(size=(2, 8, 8))).astype(np.float32)
    dense = dense if n_batch else dense[0]
    a = BlockSparse.fromdense(dense, block_shape=block_shape, n_batch=n_batch)
    assert a.block_shape == (br, bc)
    counts = keep.reshape(2, 8 // br, br, 8 // bc, bc).any(axis=(2, 4)).sum((1, 2))
    assert a.nblocks == (counts.max() if n_batch else counts[0])
    np.testing.assert_array_equal(a.todense(), dense)
    np.testing.assert_array_equal(assemble(a.data, a.indices, a.shape), dense)
    # More room: padding; traced: `nblocks` needed, and honoured.
    roomy = BlockSparse.fromdense(
        dense, block_shape=block_shape, nblocks=a.nblocks + 3, n_batch=n_batch
    )
    np.testing.assert_array_equal(roomy.todense(), dense)
    traced = jax.jit(
        lambda x: BlockSparse.fromdense(
            x, block_shape=block_shape, nblocks=a.nblocks, n_batch=n_batch
        ).todense()
    )
    np.testing.assert_array_equal(traced(dense), dense)


def test_fromdense_refuses_a_count_that_would_drop_blocks():
    dense = np.kron(np.eye(3), np.ones((2, 2))).astype(np.float32)
    with pytest.raises(ValueError, match=r"nblocks=2, but `x` has 3 nonzero blocks"):
        BlockSparse.fromdense(dense, block_shape=2, nblocks=2)
    with pytest.raises(ValueError, match="needs `nblocks` where `x` is traced"):
        jax.jit(lambda x: BlockSparse.fromdense(x, block_shape=2).data)(dense)
    with pytest.raises(ValueError, match="divide"):
        BlockSparse.fromdense(dense, block_shape=4)
    with pytest.raises(ValueError, match="block_shape"):
        BlockSparse.fromdense(dense, block_shape=0)
    with pytest.raises(ValueError, match="n_batch"):
        BlockSparse.fromdense(dense, block_shape=2, n_batch=1)


# Products -----------------------------------------------------------------------------


PRODUCTS = {
    "a @ v": (lambda a, x: a @ x, (12,)),
    "a @ V": (lambda a, x: a @ x, (12, 5)),
    "v @ a": (lambda a, x: x @ a, (8,)),
    "V @ a": (lambda a, x: x @ a, (3, 8)),
    "a.T @ v": (lambda a, x: a.T @ x, (8,)),
    "a.T @ V": (lambda a, x: a.T @ x, (8, 2)),
    "V @ a.T": (lambda a, x: x @ a.T, (4, 12)),
    "einsum ij,kjl": (lambda a, x: jnp.einsum("ij,kjl->kil", a, x), (2, 12, 3)),
    "einsum ij,kil": (lambda a, x: jnp.einsum("ij,kil->jlk", a, x), (2, 8, 3)),
}


@pytest.mark.parametrize("name", sorted(PRODUCTS))
@pytest.mark.parametrize("block_shape", [(2, 3), (4, 4), (1, 1)])
def test_products_against_numpy(name, block_shape):
    fn, other = PRODUCTS[name]
    rng = np.random.default_rng(5)
    dense, a = random_blocks(rng, (8, 12), block_shape, 0.4)
    x = rng.normal(size=other).astype(np.float32)
    got = jax.jit(quax.quaxify(fn))(a, x)
    assert_close(got, fn(dense, x.astype(np.float64)))


BATCHED = {
    # (fn, the dense operand's shape) for a batch of 3 matrices 8 x 12.
    "paired": (lambda a, x: jnp.einsum("bij,bj->bi", a, x), (3, 12)),
    "paired, rows": (lambda a, x: jnp.einsum("bij,bi->bj", a, x), (3, 8)),
    "free": (lambda a, x: a @ x, (12, 2)),
    "free, left": (lambda a, x: x @ a, (4, 8)),
    "free, left, rows": (lambda a, x: jnp.einsum("bij,kj->kbi", a, x), (5, 12)),
    "paired, left": (lambda a, x: jnp.einsum("kbi,bij->bkj", x, a), (2, 3, 8)),
}


@pytest.mark.parametrize("name", sorted(BATCHED))
def test_batched_products_against_numpy(name):
    fn, other = BATCHED[name]
    rng = np.random.default_rng(6)
    dense, a = random_blocks(rng, (3, 8, 12), (4, 3), 0.3)
    assert a.n_batch == 1
    x = rng.normal(size=other).astype(np.float32)
    assert_close(jax.jit(quax.quaxify(fn))(a, x), fn(dense, x.astype(np.float64)))


@settings(max_examples=10, deadline=None)
@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 4),
    block_shape=st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3])),
    density=st.sampled_from([0.0, 0.3, 1.0]),
    k=st.integers(0, 3),
    dtype=st.sampled_from([np.float32, np.complex64, np.int32]),
    left=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_layouts_against_numpy(
    rows, cols, block_shape, density, k, dtype, left, seed
):
    rng = np.random.default_rng(seed)
    shape = (rows * block_shape[0], cols * block_shape[1])
    dense, a = random_blocks(rng, shape, block_shape, density, dtype=np.float32)
    if dtype != np.float32:
        a = BlockSparse(jnp.asarray(np.asarray(a.data).astype(dtype)), a.indices, shape)
        dense = assemble(np.asarray(a.data), np.asarray(a.indices), shape)
    if left:
        x = (rng.normal(size=(k, shape[0])) * 3).astype(dtype)
        fn = lambda a, x: x @ a
    else:
        x = (rng.normal(size=(shape[1], k)) * 3).astype(dtype)
        fn = _matmul
    got = jax.jit(quax.quaxify(fn))(a, x)
    assert got.dtype == jnp.result_type(a.dtype, x.dtype)  # as dense JAX's
    assert_close(got, fn(dense, x))


def test_bool_blocks_multiply_as_dense_bools():
    mask = np.kron(np.array([[1, 0], [1, 1]], bool), np.ones((2, 2), bool))
    mask[0, 1] = False  # a zero inside a stored block
    a = BlockSparse.fromdense(mask, block_shape=2)
    v = np.array([True, False, True, True])
    got = jax.jit(quax.quaxify(_matmul))(a, v)
    np.testing.assert_array_equal(got, jnp.asarray(mask) @ jnp.asarray(v))
    assert got.dtype == jnp.bool_


def test_precision_reaches_the_block_products():
    rng = np.random.default_rng(7)
    dense, a = random_blocks(rng, (16, 16), (8, 8), 0.5)
    v = rng.normal(size=16).astype(np.float32)
    f = lambda a, v: jnp.matmul(a, v, precision=lax.Precision.HIGHEST)
    jaxpr = str(jax.make_jaxpr(quax.quaxify(f))(a, v))
    assert "precision=(Precision.HIGHEST, Precision.HIGHEST)" in jaxpr
    assert_close(jax.jit(quax.quaxify(f))(a, v), dense @ v, rtol=1e-6)


# Transpose, linear functions, scaling -------------------------------------------------


def test_transpose_negation_conversion_and_scaling_keep_blocks():
    rng = np.random.default_rng(8)
    dense, a = random_blocks(rng, (6, 8), (3, 2), 0.5, dtype=np.complex64)
    row, col = rng.normal(size=(6, 1)), rng.normal(size=(1, 8))
    full = rng.normal(size=(6, 8)) + 2.0
    programs = {
        "T": (lambda a: a.T, dense.T),
        "neg": (lambda a: -a, -dense),
        "conj": (lambda a: jnp.conj(a), dense.conj()),
        "real": (lambda a: jnp.real(a), dense.real),
        "imag": (lambda a: jnp.imag(a), dense.imag),
        "astype": (lambda a: jnp.real(a).astype(jnp.float16), dense.real),
        "2 * a": (lambda a: 2.0 * a, 2 * dense),
        "a / 4": (lambda a: a / 4.0, dense / 4),
        "a * row": (lambda a: a * row.astype(np.float32), dense * row),
        "col * a": (lambda a: col.astype(np.float32) * a, col * dense),
        "a / full": (lambda a: a / full.astype(np.float32), dense / full),
    }
    for name, (fn, want) in programs.items():
        with quax.track_materialisation() as report:
            out = jax.jit(quax.quaxify(fn))(a)
        assert not report, (name, str(report))
        assert isinstance(out, BlockSparse), name
        assert_close(out.todense(), want)


def test_batched_transpose_and_scaling():
    rng = np.random.default_rng(9)
    dense, a = random_blocks(rng, (2, 3, 4, 6), (2, 3), 0.5)
    assert a.n_batch == 2
    per_batch = rng.normal(size=(2, 1, 1, 6)).astype(np.float32)
    programs = {
        "batch axes swapped": (
            lambda a: jnp.transpose(a, (1, 0, 3, 2)),
            dense.transpose(1, 0, 3, 2),
        ),
        "scaled per batch": (lambda a: a * per_batch, dense * per_batch),
    }
    for name, (fn, want) in programs.items():
        out = jax.jit(quax.quaxify(fn))(a)
        assert isinstance(out, BlockSparse), name
        assert_close(out.todense(), want)


# Refusals -----------------------------------------------------------------------------


def test_refusals_name_the_primitive_and_the_way_out():
    rng = np.random.default_rng(10)
    _, a = random_blocks(rng, (4, 6), (2, 3), 0.5)
    _, b = random_blocks(rng, (4, 6), (2, 3), 0.5)
    row = BlockSparse(np.ones((1, 1, 3)), np.array([[0, 1]]), (1, 6))
    cases = {
        "exp": (jnp.exp, (a,), "`exp`"),
        "block @ block": (lambda a, b: a @ b.T, (a, b), "`dot_general`"),
        "block @ bcoo": (lambda a, b: a @ b.T, (a, b.to_bcoo()), "`dot_general`"),
        "both dims": (
            lambda a, x: jnp.einsum("ij,ij->", a, x),
            (a, jnp.ones(a.shape)),
            "contracts 2 dimensions",
        ),
        "sum": (lambda a: a.sum(), (a,), "`reduce_sum`"),
        "to int": (lambda a: a.astype(jnp.int32), (a,), "rounds each element"),
        "stretched": (
            lambda r: lax.mul(r, jnp.ones((4, 6), r.dtype)),
            (row,),
            "would broadcast the BlockSparse of shape (1, 6) to (4, 6)",
        ),
        "add": (lambda a: a + 1.0, (a,), "`add`"),
    }
    for name, (fn, args, match) in cases.items():
        with pytest.raises(
            SparseMaterialisationError, match="Refusing to materialise"
        ) as e:
            jax.jit(quax.quaxify(fn))(*args)
        assert match in str(e.value), (name, str(e.value))
        assert "`.to_bcoo()`" in str(e.value), name


def test_batch_transposes_and_products_that_move_matrix_dimensions_refuse():
    rng = np.random.default_rng(11)
    _, a = random_blocks(rng, (2, 4, 6), (2, 3), 0.5)
    cases = {
        "matrix dim to the front": lambda a: jnp.transpose(a, (1, 0, 2)),
        "contract a batch dim": lambda a: jnp.einsum("bij,b->ij", a, jnp.ones(2)),
        "batch a matrix dim": lambda a: lax.dot_general(
            a, jnp.ones((4, 6)), (((2,), (1,)), ((1,), (0,)))
        ),
    }
    for name, fn in cases.items():
        with pytest.raises(SparseMaterialisationError, match="Refusing to materialise"):
            quax.quaxify(fn)(a)
            pytest.fail(f"{name} was not refused")
        # Allowed to materialise: the dense computation.
        got = quax.quaxify(fn)(a.enable_materialise())
        assert_close(got, fn(a.todense()))


def test_allowed_to_materialise_computes_densely():
    rng = np.random.default_rng(12)
    dense, a = random_blocks(rng, (4, 6), (2, 3), 0.5)
    got = jax.jit(quax.quaxify(lambda a: jnp.exp(a).sum(0)))(a.enable_materialise())
    assert_close(got, np.exp(dense).sum(0))


# Non-finite numbers -------------------------------------------------------------------


def test_nonfinite_numbers():
    # A NaN stored in a block reaches the result as in dense JAX. A NaN in the
    # dense operand meets every element of the blocks in its column block: the
    # zeros stored inside a block too (`0 * nan`), the zeros outside none.
    data = np.zeros((1, 2, 2), np.float32)
    data[0, 0, 0] = np.nan
    a = BlockSparse(data, np.array([[0, 0]]), (4, 4))
    got = quax.quaxify(_matmul)(a, jnp.ones(4))
    np.testing.assert_array_equal(np.isnan(got), [True, False, False, False])
    b = BlockSparse(np.ones((1, 2, 2), np.float32), np.array([[1, 0]]), (4, 4))
    v = jnp.array([np.nan, 1.0, 1.0, 1.0])
    got = quax.quaxify(_matmul)(b, v)
    np.testing.assert_array_equal(np.isnan(got), [False, False, True, True])
    # Dense JAX: NaN everywhere (0 * nan in every row).
    assert np.isnan(b.todense() @ v).all()


# The conformance kit, solvers and loops -----------------------------------------------


KIT = {
    "matvec": (lambda a, x: a @ x, (12,), (8, 12)),
    "vecmat": (lambda a, x: x @ a, (8,), (8, 12)),
    "matmat, transposed": (
        lambda a, x: (2.0 * a.T) @ x - a.T @ (x / 2),
        (8, 3),
        (8, 12),
    ),
    "batched": (lambda a, x: jnp.einsum("bij,bj->bi", a, x), (2, 12), (2, 8, 12)),
    "batched, free": (lambda a, x: a @ x, (12,), (2, 8, 12)),
    "scaled": (lambda a, x: (a * x[:, None]).T @ x, (8,), (8, 12)),
    "block out": (lambda a, x: (-a * x[:8, None]).T, (12,), (8, 12)),
}


@pytest.mark.parametrize("name", sorted(KIT))
def test_kit_against_dense(name):
    fn, other, shape = KIT[name]
    rng = np.random.default_rng(13)
    _, a = random_blocks(rng, shape, (4, 3), 0.4)
    x = jnp.asarray(rng.normal(size=other), jnp.float32)
    report = quax.testing.assert_matches_dense(fn, a, x)
    assert set(report.checks.values()) == {"passed"}, str(report)


@pytest.mark.long_running
@settings(max_examples=6, deadline=None)
@given(
    rows=st.integers(1, 3),
    cols=st.integers(1, 3),
    block_shape=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4])),
    density=st.sampled_from([0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_kit_on_random_layouts(rows, cols, block_shape, density, seed):
    rng = np.random.default_rng(seed)
    shape = (rows * block_shape[0], cols * block_shape[1])
    _, a = random_blocks(rng, shape, block_shape, density)
    x = jnp.asarray(rng.normal(size=shape[1]), jnp.float32)
    report = quax.testing.assert_matches_dense(lambda a, x: a.T @ (a @ x), a, x)
    assert set(report.checks.values()) == {"passed"}, str(report)


def test_cg_and_gradients_with_respect_to_the_blocks():
    # A symmetric positive definite block matrix: CG on it, against NumPy's
    # solve, and the gradient of a loss with respect to the blocks, against the
    # gradient with respect to the dense matrix read block by block.
    rng = np.random.default_rng(14)
    _, a = random_blocks(rng, (16, 16), (4, 4), 0.3, padding=0)
    dense = assemble(a.data, a.indices, a.shape)
    spd = BlockSparse(
        jnp.concatenate([a.data, jnp.swapaxes(a.data, 1, 2)]),
        jnp.concatenate([a.indices, a.indices[:, ::-1]]),
        a.shape,
    )
    shift = 2 * np.abs(dense + dense.T).sum(1).max() + 1.0
    want_matrix = dense + dense.T + shift * np.eye(16)
    b = rng.normal(size=16).astype(np.float32)

    def solve(m, b):
        return jspla.cg(lambda v: m @ v + shift * v, b, tol=1e-7)[0]

    got = jax.jit(quax.quaxify(solve))(spd, b)
    assert_close(got, np.linalg.solve(want_matrix, b), rtol=1e-4, atol=1e-6)

    w = rng.normal(size=16).astype(np.float32)

    def loss(data):
        m = BlockSparse(data, a.indices, a.shape)
        return quax.quaxify(lambda m, w: jnp.sum(jnp.tanh(m @ w) * w))(m, w)

    grad = jax.jit(jax.grad(loss))(a.data)
    assert grad.shape == a.data.shape
    g_dense = jax.grad(lambda m: jnp.sum(jnp.tanh(m @ w) * w))(jnp.asarray(dense))
    want = np.stack(
        [
            np.asarray(g_dense)[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4]
            for r, c in np.asarray(a.indices)
        ]
    )
    assert_close(grad, want)


def test_loops_and_vmap_over_right_hand_sides():
    rng = np.random.default_rng(15)
    dense, a = random_blocks(rng, (12, 12), (3, 3), 0.4)
    v = rng.normal(size=12).astype(np.float32)

    def power(a, v):  # a fori_loop and a scan of products
        v = lax.fori_loop(0, 3, lambda _, v: a @ v / 8.0, v)
        return lax.scan(lambda c, _: (a.T @ c / 8.0, c.sum()), v, None, length=2)

    got = jax.jit(quax.quaxify(power))(a, v)
    want = power(dense, v.astype(np.float64))
    jax.tree.map(assert_close, got, want)
    vs = rng.normal(size=(4, 12)).astype(np.float32)
    mapped = jax.vmap(quax.quaxify(_matmul), in_axes=(None, 0))(a, vs)
    assert_close(mapped, vs @ dense.T)


def test_compiled_matvec_holds_no_dense_matrix():
    n = 264  # no other array of the program has this size
    a = BlockSparse.fromdense(np.eye(n, dtype=np.float32), block_shape=8)
    assert a.nblocks == n // 8
    quax.testing.assert_hlo_lacks(_matmul, a, jnp.ones(n), shapes=[(n, n)])
