"""Sums and products of structures without a closed form (`Sum`, `Product`), the
`positive_definite` tag, and batched entry reads (gathers), against plain JAX on
dense arrays built independently (`jnp.diag`, literals, `scipy.linalg`)."""

import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy as jsp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
import scipy.linalg


N = 6
K = jr.split(jr.key(7), 8)
LOWER = jr.normal(K[0], (N - 1,))
MAIN = 4 + jr.normal(K[1], (N,))
UPPER = jr.normal(K[2], (N - 1,))
COLUMN = jr.normal(K[3], (N,))
DIAG = 1 + jr.uniform(K[4], (N,))
U = jr.normal(K[5], (N, 2)) / 2
B = jr.normal(K[6], (N,))

T = qs.TridiagonalMatrix(LOWER, MAIN, UPPER)
C = qs.Circulant(COLUMN)
D = qs.Diagonal(DIAG)
# Independent dense references: numpy's diagonals and scipy's circulant.
T_DENSE = np.diag(MAIN) + np.diag(LOWER, -1) + np.diag(UPPER, 1)
C_DENSE = scipy.linalg.circulant(np.asarray(COLUMN))
D_DENSE = np.diag(DIAG)


def _close(got, want, tol=1e-4):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def test_sum_and_product_values():
    def fn(t, c, d, b):
        s, p = t + c, t @ c
        return [
            s @ b,
            b @ s,
            s.T @ b,
            (-s) @ b,
            (2.0 * s - s / 4.0) @ b,
            (s - c) @ b,
            p @ b,
            p.T @ b,
            (3.0 * p) @ b,
            (d @ s) @ b,
            (s @ d) @ b,
            (p @ c) @ b,
            (s @ p) @ b,
            jnp.sum(s, axis=0),
            jnp.diagonal(s),
            jnp.tril(s) @ b,
        ]

    got = jax.jit(quax.quaxify(fn))(T, C, D, B)
    s, p = T_DENSE + C_DENSE, T_DENSE @ C_DENSE
    want = [
        s @ B,
        B @ s,
        s.T @ B,
        -s @ B,
        1.75 * s @ B,
        T_DENSE @ B,
        p @ B,
        p.T @ B,
        3 * p @ B,
        D_DENSE @ s @ B,
        s @ D_DENSE @ B,
        p @ C_DENSE @ B,
        s @ p @ B,
        s.sum(0),
        np.diagonal(s),
        np.tril(s) @ B,
    ]
    _close(got, want)


def test_sum_and_product_gradients():
    # jax.grad with respect to the diagonals and the column, through both lazy
    # types, against the gradient of the same program on dense matrices built
    # from the leaves by hand.
    fn = lambda t, c: jnp.sum(((t + c) @ B + (t @ c).T @ B) ** 2)
    got = jax.jit(jax.grad(quax.quaxify(fn), argnums=(0, 1)))(T, C)

    def dense_fn(lower, main, upper, column):
        t = jnp.diag(main) + jnp.diag(lower, -1) + jnp.diag(upper, 1)
        c = column[(jnp.arange(N)[:, None] - jnp.arange(N)[None, :]) % N]
        return fn(t, c)

    want = jax.grad(dense_fn, argnums=(0, 1, 2, 3))(LOWER, MAIN, UPPER, COLUMN)
    t_grad, c_grad = got
    leaves = (t_grad.lower_diag, t_grad.main_diag, t_grad.upper_diag, c_grad.column)
    _close(leaves, want, 1e-3)


def test_structure_kept_where_a_closed_form_exists():
    add = quax.quaxify(lambda x, y: x + y)
    mul = quax.quaxify(lambda x, y: x @ y)
    assert isinstance(add(D, D), qs.Diagonal)
    assert isinstance(add(D, T), qs.TridiagonalMatrix)
    assert isinstance(mul(D, T), qs.TridiagonalMatrix)
    assert isinstance(mul(C, C), qs.Circulant)
    banded = qs.Banded(jnp.ones((3, N)), 1, 1)
    assert isinstance(add(banded, qs.Banded(jnp.ones((2, N)), 0, 1)), qs.Banded)
    # No closed form: lazy, flat, and a new term merges where it can.
    s = add(T, C)
    assert isinstance(s, qs.Sum) and [type(x) for x in s.terms] == [type(T), type(C)]
    s2 = quax.quaxify(lambda t, c, d: (t + c) + d)(T, C, D)
    assert [type(x) for x in s2.terms] == [qs.TridiagonalMatrix, qs.Circulant]
    p = quax.quaxify(lambda t, c: (t @ c) @ (c @ t))(T, C)
    assert [type(x) for x in p.factors] == [type(T), type(C), type(T)]
    low_rank = qs.LowRank(U)
    assert isinstance(add(T, low_rank), qs.Sum)
    assert isinstance(add(D, low_rank), qs.LowRankPlusDiagonal)


def test_property_tags():
    tp = qs.TridiagonalMatrix(UPPER, MAIN, UPPER, positive_definite=True)
    dp = qs.Diagonal(DIAG, positive_definite=True)
    q = quax.quaxify
    assert tp.symmetric and not T.symmetric
    assert q(lambda a, d: a + d)(tp, dp).positive_definite
    assert not q(lambda a, d: a + d)(tp, D).positive_definite
    assert q(lambda a: a.T)(tp).positive_definite
    assert q(lambda a: a.astype(jnp.complex64))(tp).positive_definite
    assert not q(lambda a: -a)(tp).positive_definite
    assert not q(lambda a: -2.0 * a)(tp).positive_definite
    # A traced scale's sign is unknown: the tag is dropped.
    assert not jax.jit(q(lambda a, s: s * a))(tp, 2.0).positive_definite
    s = q(lambda a, c: a + c)(tp, qs.Circulant(COLUMN, positive_definite=True))
    assert isinstance(s, qs.Sum) and s.positive_definite and s.symmetric
    # A product is not known to be symmetric.
    assert not q(lambda t: t.T @ t)(T).symmetric


def test_cholesky_of_tagged_banded_and_tridiagonal():
    n = 7
    # Bandwidth 2, symmetric positive definite: literal bands.
    sub1, sub2 = 0.5 * jnp.arange(1.0, n), 0.25 * jnp.ones(n - 2)
    main = 3.0 + jnp.arange(n, dtype=jnp.float32)
    dense = np.diag(main) + np.diag(sub1, -1) + np.diag(sub1, 1)
    dense = dense + np.diag(sub2, -2) + np.diag(sub2, 2)
    # Row-indexed: bands[d + 2, i] = A[i, i + d].
    front, back = (lambda x, k: jnp.pad(x, (k, 0))), (lambda x, k: jnp.pad(x, (0, k)))
    bands = jnp.stack(
        [front(sub2, 2), front(sub1, 1), main, back(sub1, 1), back(sub2, 2)]
    )
    banded = qs.Banded(bands, 2, 2, positive_definite=True)
    tri = qs.TridiagonalMatrix(sub1, main, sub1, positive_definite=True)
    b = jnp.arange(1.0, n + 1)

    def fn(m, b):
        g = jnp.linalg.cholesky(m)
        return g @ b, jsp.linalg.cho_solve((g, True), b)

    got = jax.jit(quax.quaxify(fn))(banded, b)
    want = np.linalg.cholesky(dense)
    _close(got, (want @ b, np.linalg.solve(dense, b)))
    factor = quax.quaxify(jnp.linalg.cholesky)(banded)
    assert isinstance(factor, qs.Banded) and factor.upper_bandwidth == 0
    tri_dense = np.diag(main) + np.diag(sub1, -1) + np.diag(sub1, 1)
    got = jax.jit(quax.quaxify(fn))(tri, b)
    _close(got, (np.linalg.cholesky(tri_dense) @ b, np.linalg.solve(tri_dense, b)))


def test_cg_on_a_sum():
    # Symmetric positive definite T + U Uᵀ has no closed form: cg through `S @ v`.
    t = qs.TridiagonalMatrix(UPPER, MAIN + 2, UPPER)
    dense = np.diag(MAIN + 2) + np.diag(UPPER, -1) + np.diag(UPPER, 1) + U @ U.T

    def fn(t, u, b):
        s = t + u
        return jsp.sparse.linalg.cg(lambda v: s @ v, b, tol=1e-6)[0]

    got = jax.jit(quax.quaxify(fn))(t, qs.LowRank(U), B)
    _close(got, np.linalg.solve(dense, B), 1e-3)


def test_lazy_refusals_name_the_way_out():
    s = quax.quaxify(lambda t, c: t + c)(T, C)
    p = quax.quaxify(lambda t, c: t @ c)(T, C)
    for m in (s, p):
        with pytest.raises(
            qs.StructuredMaterialisationError, match=r"primitive `lu`.*cg"
        ):
            quax.quaxify(jnp.linalg.solve)(m, B)
    # (`jnp.diagonal` reads by a masked product or by a gather: both refuse.)
    with pytest.raises(
        qs.StructuredMaterialisationError, match=r"`Product`.*`(mul|gather)`"
    ):
        quax.quaxify(jnp.diagonal)(p)
    with pytest.raises(
        qs.StructuredMaterialisationError, match=r"`Sum`.*`exp`.*enable_mat"
    ):
        quax.quaxify(jnp.exp)(s)
    np.testing.assert_allclose(
        quax.quaxify(jnp.exp)(s.enable_materialise()),
        np.exp(T_DENSE + C_DENSE),
        rtol=1e-5,
    )
    with pytest.raises(ValueError, match="at least two structured matrices"):
        qs.Sum((T,))
    with pytest.raises(ValueError, match="of one shape"):
        qs.Product((T, qs.Diagonal(jnp.ones(3))))


def test_lazy_types_hold_no_dense_matrix():
    n = 300
    t = qs.TridiagonalMatrix(jnp.ones(n - 1), 4 * jnp.ones(n), jnp.ones(n - 1))
    c, b = qs.Circulant(jnp.ones(n) / n), jnp.ones(n)
    quax.testing.assert_hlo_lacks(
        lambda t, c, b: ((t + c) @ b, (t @ c) @ b, (t @ c).T @ b),
        t,
        c,
        b,
        shapes=[(n, n)],
    )


def test_lineax_carries_the_tags():
    lx = pytest.importorskip("lineax", reason="lineax is an optional extra")
    tp = qs.TridiagonalMatrix(UPPER, MAIN, UPPER, positive_definite=True)
    op = qs.to_lineax(tp)
    assert lx.is_symmetric(op) and lx.is_positive_semidefinite(op)
    assert not lx.is_positive_semidefinite(qs.to_lineax(T))
    back = qs.from_lineax(op)
    assert isinstance(back, qs.TridiagonalMatrix) and back.positive_definite
    assert not qs.from_lineax(qs.to_lineax(T)).positive_definite
    # A tagged lazy sum solves with lineax's CG without further tags.
    s = quax.quaxify(lambda a, d: a + d)(tp, qs.LowRank(U, positive_definite=True))
    dense = np.diag(MAIN) + np.diag(UPPER, -1) + np.diag(UPPER, 1) + U @ U.T
    solver = lx.CG(rtol=1e-6, atol=1e-6)
    # lineax's `linear_solve` trips JAX's tracer-leak checker (an IndexError),
    # with or without quax: checked here without it.
    with jax.check_tracer_leaks(False):
        x = lx.linear_solve(qs.to_lineax(s), B, solver).value
    np.testing.assert_allclose(x, np.linalg.solve(dense, B), rtol=1e-3, atol=1e-3)


# Batched entry reads ------------------------------------------------------------------

BATCH = qs.TridiagonalMatrix(
    jnp.stack([LOWER, 2 * LOWER]),
    jnp.stack([MAIN, MAIN + 1]),
    jnp.stack([UPPER, UPPER]),
)
BATCH_DENSE = np.stack([T_DENSE, T_DENSE + np.diag(LOWER, -1) + np.eye(N)])
IDX = jnp.array([0, 3, 5])


def test_batched_gathers():
    def fn(x):
        return [
            jnp.diagonal(x, axis1=-2, axis2=-1),
            x[..., IDX, :],
            x[..., :, IDX],
            x[:, IDX, IDX[::-1]],
            jax.vmap(jnp.diagonal)(x),
            jax.vmap(jnp.trace)(x),
            jax.vmap(lambda m, i: m[i, i + 1])(x, jnp.array([1, 4])),
            jax.vmap(lambda m, i: m[i])(x, jnp.array([[1, 4], [2, 2]])),
        ]

    got = jax.jit(quax.quaxify(fn))(BATCH)
    x = BATCH_DENSE
    want = [
        np.stack([np.diag(m) for m in x]),
        x[:, [0, 3, 5], :],
        x[:, :, [0, 3, 5]],
        x[:, [0, 3, 5], [5, 3, 0]],
        np.stack([np.diag(m) for m in x]),
        np.trace(x, axis1=1, axis2=2),
        np.array([x[0, 1, 2], x[1, 4, 5]]),
        np.stack([x[0, [1, 4]], x[1, [2, 2]]]),
    ]
    _close(got, want, 1e-6)
    # Every structure's diagonals, batched, in one compiled program: a banded
    # matrix's is its band row `p`, a circulant's its column's first entry.
    bands = jr.normal(K[7], (2, 3, N))
    others = [
        qs.Banded(bands, 1, 1),
        qs.Circulant(jnp.stack([COLUMN, -COLUMN])),
        qs.Diagonal(jnp.stack([DIAG, 2 * DIAG])),
    ]
    diag = lambda ms: [jnp.diagonal(x, axis1=-2, axis2=-1) for x in ms]
    got = jax.jit(quax.quaxify(diag))(others)
    c0 = float(COLUMN[0])
    want = [bands[:, 1], np.array([[c0] * N, [-c0] * N]), np.stack([DIAG, 2 * DIAG])]
    _close(got, want, 1e-6)


def test_gathers_that_would_densify_refuse():
    with pytest.raises(qs.StructuredMaterialisationError, match=r"primitive `gather`"):
        # A whole row per batch element picked by index: not an entry read.
        quax.quaxify(lambda x: x[jnp.array([1, 0])])(BATCH)
