"""Batched and complex use as dense code writes it (issue 29, item 5):
`quax.quaxify(jax.vmap(f))` over a batch of structures (the matrix-vector product
binds a `dot_general` whose free axes hold the batch), products of batched
structures, and `jnp.conj`, `M.conj().T`, `M.mT` keeping the structure. The
references are dense arrays built from the leaves with NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


pytestmark = pytest.mark.usefixtures("x64")

N, BATCH = 5, 3


def _rng(seed):
    return np.random.default_rng(seed)


def _tridiagonal(rng, batch, dtype):
    lo, main, up = (_draw(rng, (*batch, m), dtype) for m in (N - 1, N, N - 1))
    dense = np.zeros((*batch, N, N), dtype)
    i = np.arange(N)
    dense[..., i, i] = main
    dense[..., i[1:], i[:-1]] = lo
    dense[..., i[:-1], i[1:]] = up
    return qs.TridiagonalMatrix(lo, main, up), dense


def _diagonal(rng, batch, dtype):
    d = _draw(rng, (*batch, N), dtype)
    dense = np.zeros((*batch, N, N), dtype)
    dense[..., np.arange(N), np.arange(N)] = d
    return qs.Diagonal(d), dense


def _circulant(rng, batch, dtype):
    col = _draw(rng, (*batch, N), dtype)
    i, j = np.indices((N, N))
    return qs.Circulant(col), col[..., (i - j) % N]


def _toeplitz(rng, batch, dtype):
    col, row = _draw(rng, (*batch, N), dtype), _draw(rng, (*batch, N), dtype)
    i, j = np.indices((N, N))
    dense = np.where(i >= j, col[..., np.abs(i - j)], row[..., np.abs(j - i)])
    return qs.Toeplitz(col, row), dense


def _lower(rng, batch, dtype):
    a = _draw(rng, (*batch, N, N), dtype) + 3 * np.eye(N)
    return qs.LowerTriangular(a), np.tril(a)


def _block_diagonal(rng, batch, dtype):
    blocks = _draw(rng, (*batch, 2, 2, 2), dtype)
    dense = np.zeros((*batch, 4, 4), dtype)
    dense[..., :2, :2] = blocks[..., 0, :, :]
    dense[..., 2:, 2:] = blocks[..., 1, :, :]
    return qs.BlockDiagonal(blocks), dense


def _banded(rng, batch, dtype):
    bands = _draw(rng, (*batch, 3, N), dtype)
    dense = np.zeros((*batch, N, N), dtype)
    for d in (-1, 0, 1):
        for i in range(N):
            if 0 <= i + d < N:
                dense[..., i, i + d] = bands[..., d + 1, i]
    return qs.Banded(bands, 1, 1), dense


def _draw(rng, shape, dtype):
    out = rng.normal(size=shape)
    if np.issubdtype(dtype, np.complexfloating):
        out = out + 1j * rng.normal(size=shape)
    return (out + 2.0).astype(dtype)  # away from singular for the solves


BATCHED = [
    _tridiagonal,
    _diagonal,
    _circulant,
    _toeplitz,
    _lower,
    _block_diagonal,
    _banded,
]


def _close(got, want):
    np.testing.assert_allclose(got, want, **quax.testing.tolerance(np.float64))


def _matvec(a, v):
    return a @ v


def _solve(a, v):
    return jnp.linalg.solve(a, v)


def _logdet(a):
    return jnp.linalg.slogdet(a)[1]


def _square_times(a, v):
    return (a @ a) @ v


@pytest.mark.parametrize("make", BATCHED, ids=lambda f: f.__name__)
def test_quaxify_of_vmap_over_a_batch(make):
    """`quaxify(vmap(f, in_axes=(0, None)))`: products, solves and log-determinants
    of each matrix of the batch, as dense `vmap` gives them, under `jit`."""
    m, dense = make(_rng(0), (BATCH,), np.float64)
    v = _draw(_rng(1), (m.shape[-1],), np.float64)
    for fn in (_matvec, _solve, _square_times):
        got = jax.jit(quax.quaxify(jax.vmap(fn, in_axes=(0, None))))(m, v)
        _close(got, jax.vmap(fn, in_axes=(0, None))(dense, v))
    # The other order: `vmap` of the quaxified function.
    got = jax.vmap(quax.quaxify(_matvec), in_axes=(0, None))(m, v)
    _close(got, np.einsum("bij,j->bi", dense, v))
    got = jax.jit(quax.quaxify(jax.vmap(_logdet)))(m)
    _close(got, np.linalg.slogdet(dense)[1])


@pytest.mark.parametrize("make", [_tridiagonal, _circulant], ids=lambda f: f.__name__)
def test_vector_times_a_batch(make):
    """`v @ A` for each `A` of the batch (the batch is `dot_general`'s rhs free
    axis) and `A.mT @ v`."""
    m, dense = make(_rng(2), (BATCH,), np.float64)
    v = _draw(_rng(3), (N,), np.float64)
    left = lambda a, v: v @ a
    got = quax.quaxify(jax.vmap(left, in_axes=(0, None)))(m, v)
    _close(got, np.einsum("j,bjk->bk", v, dense))
    got = jax.jit(quax.quaxify(lambda a, v: a.mT @ v))(m, v)
    _close(got, np.einsum("bkj,k->bj", dense, v))


def test_products_of_batched_structures():
    """`A @ B` of two batches, and of a batch and one matrix (`in_axes=(0,
    None)`, the single matrix broadcast over the batch), then applied to a
    vector; `jax.grad` through the product matches dense."""
    t, t_dense = _tridiagonal(_rng(4), (BATCH,), np.float64)
    c, c_dense = _circulant(_rng(5), (BATCH,), np.float64)
    d, d_dense = _diagonal(_rng(6), (), np.float64)
    v = _draw(_rng(7), (N,), np.float64)

    both = jax.vmap(lambda a, b, v: (a @ b) @ v, in_axes=(0, 0, None))
    _close(quax.quaxify(both)(t, c, v), both(t_dense, c_dense, v))

    single = jax.vmap(lambda a, b, v: (a @ b) @ v, in_axes=(0, None, None))
    _close(jax.jit(quax.quaxify(single))(t, d, v), single(t_dense, d_dense, v))
    product = quax.quaxify(jax.vmap(lambda a, b: a @ b, in_axes=(0, None)))(t, d)
    assert isinstance(product, qs.TridiagonalMatrix)
    assert product.shape == (BATCH, N, N)

    def loss(main, c0):
        a = qs.TridiagonalMatrix(t.lower_diag, main, t.upper_diag)
        product = jax.vmap(lambda a, c0: (a @ c0) @ v, in_axes=(0, None))
        return jnp.sum(product(a, c0) ** 2)

    def dense_loss(main):
        i = np.arange(N)
        a = jnp.asarray(t_dense).at[:, i, i].set(main)
        return jnp.sum(jnp.einsum("bij,jk,k->bi", a, c_dense[0], v) ** 2)

    c0 = qs.Circulant(c.column[0])
    got = jax.grad(quax.quaxify(loss), argnums=0)(t.main_diag, c0)
    _close(got, jax.grad(dense_loss)(t.main_diag))


def test_product_with_the_batch_in_the_middle_refuses():
    """`vmap(lambda a, b: a @ b, in_axes=(None, 0))`: JAX lays the product out as
    `(n, batch, n)`, which no structure holds; it refuses, naming the primitive
    (`vmap` of the quaxified function is the way)."""
    d, _ = _diagonal(_rng(8), (), np.float64)
    t, t_dense = _tridiagonal(_rng(9), (BATCH,), np.float64)
    fn = jax.vmap(lambda a, b: a @ b, in_axes=(None, 0))
    with pytest.raises(qs.StructuredMaterialisationError, match="dot_general"):
        quax.quaxify(fn)(d, t)
    got = jax.vmap(quax.quaxify(lambda a, b: (a @ b) @ jnp.ones(N)), (None, 0))(d, t)
    _close(got, np.einsum("ij,bjk,k->bi", np.diag(d.diag), t_dense, np.ones(N)))


@pytest.mark.parametrize("make", BATCHED, ids=lambda f: f.__name__)
def test_conjugate_keeps_the_structure(make):
    """`jnp.conj(M)`, `M.conj().T @ v`, `M.mT @ v` and a solve by `conj(M)` on a
    complex batch, against NumPy's conjugate, under `jit`."""
    m, dense = make(_rng(10), (2,), np.complex128)
    v = _draw(_rng(11), (m.shape[-1],), np.complex128)
    conj = quax.quaxify(jnp.conj)(m)
    assert type(conj) is type(m)
    assert conj.shape == m.shape
    got = jax.jit(quax.quaxify(lambda a, v: jnp.conj(a) @ v))(m, v)
    _close(got, np.conj(dense) @ v)
    got = jax.jit(quax.quaxify(lambda a, v: a.conj().mT @ v))(m, v)
    _close(got, np.conj(dense).swapaxes(-1, -2) @ v)
    got = quax.quaxify(jax.vmap(lambda a, v: jnp.linalg.solve(a.conj(), v), (0, None)))(
        m, v
    )
    _close(got, np.linalg.solve(np.conj(dense), v[:, None])[..., 0])


def test_conjugate_of_single_matrices():
    """The structures without batch axes (`LowRank`, `LowRankPlusDiagonal`,
    `Kronecker`) and a lazy `Sum` conjugate leaf by leaf too."""
    rng = _rng(12)
    u, w = _draw(rng, (N, 2), np.complex128), _draw(rng, (N, 2), np.complex128)
    d = _draw(rng, (N,), np.complex128)
    a, b = _draw(rng, (2, 2), np.complex128), _draw(rng, (3, 3), np.complex128)
    t, t_dense = _tridiagonal(rng, (), np.complex128)
    c, c_dense = _circulant(rng, (), np.complex128)
    cases = [
        (qs.LowRank(u, w), u @ w.T),
        (qs.LowRankPlusDiagonal(d, u, w), np.diag(d) + u @ w.T),
        (qs.Kronecker(a, b), np.kron(a, b)),
        (quax.quaxify(lambda x, y: x + y)(t, c), t_dense + c_dense),
    ]
    for m, dense in cases:
        v = _draw(rng, (m.shape[-1],), np.complex128)
        conj = quax.quaxify(jnp.conj)(m)
        assert type(conj) is type(m)
        got = jax.jit(quax.quaxify(lambda a, v: a.conj().T @ v))(m, v)
        _close(got, np.conj(dense).T @ v)


def test_complex_kronecker_plus_identity_refuses():
    """A complex `Kronecker` plus `c I` stays a lazy `Sum` (no orthogonal
    eigendecomposition of a complex symmetric factor), and the constructor of
    `KroneckerPlusIdentity` refuses complex factors, naming the way out."""
    a = _draw(_rng(13), (2, 2), np.complex128)
    a = a + a.T  # the tag needs symmetric factors (complex symmetric here)
    k = qs.Kronecker(a, a, symmetric=True)
    out = quax.quaxify(lambda k: k + 0.5 * jnp.eye(4))(k)
    assert isinstance(out, qs.Sum)
    with pytest.raises(ValueError, match=r"needs real .* complex `left`.*gmres"):
        qs.KroneckerPlusIdentity(a, a.real, 0.5)


def test_a_stack_of_a_structure_without_batch_axes_refuses():
    """A stack of `LowRank`s or `Kronecker`s built past the constructor (by
    `jax.tree.map`) refuses with the way out (`jax.vmap` of the quaxified
    function), rather than being read as one matrix."""
    u = _draw(_rng(14), (2, N, 2), np.float64)
    stack = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), qs.LowRank(u[0]))
    fn = quax.quaxify(jax.vmap(lambda a, v: a @ v, in_axes=(0, None)))
    # Refused where quaxify boxes it, by `LowRank`'s own checks (which quaxify
    # re-runs on a value rebuilt past the constructor), with the same way out.
    with pytest.raises(ValueError, match=r"`LowRank`.*batch.*`jax\.vmap`"):
        fn(stack, jnp.ones(N))
    got = jax.vmap(quax.quaxify(lambda a, v: a @ v), in_axes=(0, None))(
        stack, jnp.ones(N)
    )
    _close(got, np.stack([u[0] @ u[0].T, 4 * u[0] @ u[0].T]) @ np.ones(N))
    a = _draw(_rng(15), (2, 2), np.float64)
    stack = jax.tree.map(lambda x: jnp.stack([x, x]), qs.Kronecker(a, a))
    with pytest.raises(ValueError, match="`Kronecker` has no batch axes"):
        fn(stack, jnp.ones(4))


def test_refusals_name_the_structured_noise():
    """Issue 29, item 4: `Kronecker + Diagonal` refuses, naming
    `KroneckerPlusIdentity`; a traced `noise * jnp.eye(n)` under `jit` (which
    refused before `quax.known_scaled_constant`) and the route the refusal names
    solve exactly (against NumPy)."""
    a = np.array([[2.0, 0.5], [0.5, 1.0]])
    k = qs.Kronecker(a, a, symmetric=True)
    b = np.ones(4)
    traced = jax.jit(quax.quaxify(lambda k, s: jnp.linalg.solve(k + s * jnp.eye(4), b)))
    _close(traced(k, 0.1), np.linalg.solve(np.kron(a, a) + 0.1 * np.eye(4), b))
    with pytest.raises(
        qs.StructuredMaterialisationError, match="KroneckerPlusIdentity"
    ):
        quax.quaxify(lambda k, d: jnp.linalg.solve(k + d, b))(k, qs.Diagonal(b))
    route = jax.jit(
        quax.quaxify(lambda k, s: jnp.linalg.solve(k + qs.ScaledIdentity(s, 4), b))
    )
    _close(route(k, 0.1), np.linalg.solve(np.kron(a, a) + 0.1 * np.eye(4), b))
