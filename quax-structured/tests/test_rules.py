"""Every structure against the dense computation (plain JAX on the dense array),
with `quax.testing.assert_matches_dense`: values, jit, vmap, grad, jvp, and nothing
materialised."""

import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy as jsp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from hypothesis import given, settings, strategies as st


def random_tridiagonal(key, n, batch=(), dtype=jnp.float32, dominant=True):
    k1, k2, k3 = jr.split(key, 3)
    lower = jr.normal(k1, (*batch, n - 1), dtype)
    upper = jr.normal(k2, (*batch, n - 1), dtype)
    main = jr.normal(k3, (*batch, n), dtype) + (4 if dominant else 0)
    return qs.TridiagonalMatrix(lower, main, upper)


def spd(key, n, dtype=jnp.float32):
    a = jr.normal(key, (n, n), dtype)
    return a @ a.T / n + jnp.eye(n, dtype=dtype)


N = 6


def _matrices():
    k = jr.split(jr.key(1), 8)
    d = 1 + jr.uniform(k[0], (N,))
    u = jr.normal(k[1], (N, 2)) / 2
    v = jr.normal(k[2], (N, 2)) / 2
    m = jr.normal(k[3], (N, N)) + 4 * jnp.eye(N)
    return {
        "tridiagonal": random_tridiagonal(k[4], N),
        "diagonal": qs.Diagonal(d),
        "scaled_identity": qs.ScaledIdentity(jnp.asarray(2.5), N),
        "lower": qs.LowerTriangular(m),
        "upper": qs.UpperTriangular(m),
        "low_rank": qs.LowRank(u, v),
        "low_rank_plus_diagonal": qs.LowRankPlusDiagonal(d, u, v),
        "kronecker": qs.Kronecker(spd(k[5], 2), spd(k[6], 3), symmetric=True),
    }


MATRICES = _matrices()
B = jr.normal(jr.key(2), (N,))
PRODUCTS = {
    "matvec": lambda x, b: x @ b,
    "vecmat": lambda x, b: b @ x,
    "matmat": lambda x, b: x @ jnp.stack([b, 2 * b], axis=1),
    "transpose": lambda x, b: x.T @ b,
    "neg": lambda x, b: (-x) @ b,
    "scalar": lambda x, b: (2.0 * x) @ b + (x / 4.0) @ b,
    "x + x": lambda x, b: (x + x) @ b,
    "row_sums": lambda x, b: jnp.sum(x, axis=1) + jnp.sum(x, axis=0),
    "diagonal": lambda x, b: jnp.diagonal(x),
}


# Under `jax.jit`: the kit's dense references (eval, each vmap copy) compile once
# instead of op by op; the quaxified eval runs the rules through the nested jit.
@jax.jit
def _all_products(x, b):
    return {k: f(x, b) for k, f in PRODUCTS.items() if k != "diagonal"}


# vmap and jvp run once per products' code path: `LowRank` shares
# `LowRankPlusDiagonal`'s `U (Vᵀ x)`, `UpperTriangular` `LowerTriangular`'s masked
# product (`_Triangular.matmat`); a Kronecker's shape is static metadata (no vmap).
VMAP = {"tridiagonal", "diagonal", "scaled_identity", "lower", "low_rank_plus_diagonal"}
JVP = VMAP | {"kronecker"}


@pytest.mark.parametrize("name", MATRICES)
def test_products(name):
    # Every program at once: the one conformance run per structure (jit, grad;
    # vmap and jvp as above; eval, op by op, costs seconds: its run is the entries'
    # below).
    quax.testing.assert_matches_dense(
        _all_products,
        MATRICES[name],
        B,
        eval=False,
        vmap=name in VMAP,
        jvp=name in JVP,
    )
    # Eval; unbatched here; batched entry reads (`jnp.diagonal` of a stack, under
    # `vmap`) are tested in test_composite.py.
    quax.testing.assert_matches_dense(
        PRODUCTS["diagonal"], MATRICES[name], B, jit=False, vmap=False, grad=False
    )


SOLVERS = ["tridiagonal", "diagonal", "scaled_identity", "lower", "upper"]
SOLVERS_NONLINEAR = ["low_rank_plus_diagonal", "kronecker"]


@pytest.mark.parametrize("name", SOLVERS + SOLVERS_NONLINEAR)
def test_solve(name):
    # Values under jit and the gradient (the transposed solve); vmap and jvp run
    # for the tridiagonal matrix (the structure the others' code paths share), the
    # op-by-op eval for the diagonal one.
    full = name == "tridiagonal"
    quax.testing.assert_matches_dense(
        jnp.linalg.solve,
        MATRICES[name],
        B,
        eval=name == "diagonal",
        vmap=full,
        jvp=full,
    )


@pytest.mark.parametrize("name", SOLVERS)
def test_slogdet_det(name):
    # The values; derivatives of slogdet/det are listed as missing in the README.
    fn = lambda x: (jnp.linalg.slogdet(x), jnp.linalg.det(x))
    quax.testing.assert_matches_dense(
        fn, MATRICES[name], eval=False, grad=False, jvp=False, vmap=False
    )
    # vmap over the quaxified function (each matrix's entries read unbatched).
    x = MATRICES[name]
    stacked = jax.tree.map(lambda leaf: jnp.stack([leaf, 2 * leaf]), x)
    got = jax.jit(jax.vmap(quax.quaxify(jnp.linalg.slogdet)))(stacked)
    want = jnp.linalg.slogdet(stacked.enable_materialise().materialise())
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tridiagonal", "lower", "upper", "diagonal"])
def test_solve_triangular(name):
    # Both triangles, with and without the transpose, in one compiled program;
    # vmap for the tridiagonal matrix (grad covers the derivative; the solves' jvp
    # runs in test_solve).
    def fn(x, b):
        return [
            jsp.linalg.solve_triangular(x, b, lower=lower, trans=trans)
            for lower in (True, False)
            for trans in (0, 1)
        ]

    full = name == "tridiagonal"
    quax.testing.assert_matches_dense(
        fn, MATRICES[name], B, eval=False, vmap=full, jvp=False
    )


@pytest.mark.parametrize("name", ["tridiagonal", "diagonal", "scaled_identity"])
def test_cholesky(name):
    x = MATRICES[name]
    if name == "tridiagonal":  # symmetric positive definite
        x = qs.TridiagonalMatrix(x.upper_diag, x.main_diag + 2, x.upper_diag)

    def fn(x, b):
        factor = jnp.linalg.cholesky(x)
        logdet = 2 * jnp.sum(jnp.log(jnp.diagonal(factor)))
        return logdet, jsp.linalg.cho_solve((factor, True), b), jnp.trace(x)

    quax.testing.assert_matches_dense(fn, x, B, eval=False, vmap=False, jvp=False)


def test_cg_on_symmetric_tridiagonal():
    t = MATRICES["tridiagonal"]
    t = qs.TridiagonalMatrix(t.upper_diag, t.main_diag, t.upper_diag)
    fn = lambda t, b: jsp.sparse.linalg.cg(lambda v: t @ v, b, tol=1e-6)[0]
    quax.testing.assert_matches_dense(
        fn, t, B, eval=False, vmap=False, jvp=False, rtol=1e-4, atol=1e-4
    )


def test_structure_kept():
    t, d = MATRICES["tridiagonal"], MATRICES["diagonal"]
    k = MATRICES["kronecker"]
    assert isinstance(quax.quaxify(lambda a, b: a + b)(d, d), qs.Diagonal)
    assert isinstance(quax.quaxify(lambda a, b: a + b)(d, t), qs.TridiagonalMatrix)
    assert isinstance(quax.quaxify(lambda a, b: a @ b)(d, t), qs.TridiagonalMatrix)
    assert isinstance(quax.quaxify(lambda a, b: a @ b)(t, d), qs.TridiagonalMatrix)
    assert isinstance(quax.quaxify(lambda a: a @ a)(k), qs.Kronecker)
    assert isinstance(quax.quaxify(lambda a: -a.T * 2)(t), qs.TridiagonalMatrix)
    out = quax.quaxify(lambda a, b: (a @ b) @ B)(d, t)
    np.testing.assert_allclose(
        out, d.diag * (t.enable_materialise().materialise() @ B), rtol=1e-5
    )
    kk = quax.quaxify(lambda a: a @ a)(k).enable_materialise().materialise()
    kd = k.enable_materialise().materialise()
    np.testing.assert_allclose(kk, kd @ kd, rtol=1e-5)


def _tridiagonal_program(t, b):
    return t @ b, jnp.linalg.solve(t, b), t.mT @ b


# Four layouts (each compiles once: sizes 2 and 5, unbatched and two batch axes,
# real and complex), random entries.
LAYOUTS = [
    (2, (), jnp.complex64),
    (5, (), jnp.float32),
    (2, (2, 3), jnp.float32),
    (5, (2, 3), jnp.complex64),
]


@settings(max_examples=10, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_tridiagonal_property(jit_matches_dense, layout, seed):
    n, batch, dtype = layout
    t = random_tridiagonal(jr.key(seed), n, batch, jnp.float32)
    if dtype == jnp.complex64:
        t = qs.TridiagonalMatrix(*(d * (1 + 0.5j) for d in t._diags()))
    b = jr.normal(jr.key(seed + 1), (*batch, n, 2)).astype(dtype)
    jit_matches_dense(_tridiagonal_program, t, b)


def test_vmap_over_batch_of_matrices():
    t = random_tridiagonal(jr.key(3), 5, (4,))
    b = jr.normal(jr.key(4), (4, 5))
    got = jax.jit(jax.vmap(quax.quaxify(jnp.linalg.solve)))(t, b)
    want = jnp.linalg.solve(t.enable_materialise().materialise(), b[..., None])[..., 0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
