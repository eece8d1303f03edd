"""A traced noise added as Gaussian-process code writes it (issue 29, item 4):
`M + noise * jnp.eye(n)`, `noise * jnp.eye(n) + M`, `M - ...` and `... - M` with
`noise` a `jit` argument or a `grad` variable keep `M`'s structure (read with
`quax.known_scaled_constant`): a symmetric `Kronecker` plus it is a
`KroneckerPlusIdentity`, a `LowRank` a `LowRankPlusDiagonal`, a banded or block
structure its own. Each against plain JAX on the dense matrices, the gradients
with respect to the noise and the factors too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from quax.zero import ieee_strict


N = 6


def _rand(seed, *shape, dtype=jnp.float64):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, dtype)


def _dense(m):
    return m.enable_materialise().dense()


def _kronecker(dtype, na=3, nb=2, seed=0):
    a, b = _rand(seed, na, na, dtype=dtype), _rand(seed + 1, nb, nb, dtype=dtype)
    eye = lambda n: jnp.eye(n, dtype=dtype)
    return qs.Kronecker(a @ a.T + eye(na), b @ b.T + eye(nb), symmetric=True)


def _structures(dtype):
    """Each structure with a closed form for `+ noise I`, and the type it gives."""
    r = lambda seed, *shape: _rand(seed, *shape, dtype=dtype)
    return {
        "Kronecker": (_kronecker(dtype), qs.KroneckerPlusIdentity),
        "LowRank": (qs.LowRank(r(2, N, 2)), qs.LowRankPlusDiagonal),
        "LowRankPlusDiagonal": (
            qs.LowRankPlusDiagonal(3 + jnp.abs(r(3, N)), r(4, N, 2)),
            qs.LowRankPlusDiagonal,
        ),
        "Diagonal": (qs.Diagonal(2 + jnp.abs(r(5, N))), qs.Diagonal),
        "TridiagonalMatrix": (
            qs.TridiagonalMatrix(r(6, N - 1), 4 + r(7, N), r(8, N - 1)),
            qs.TridiagonalMatrix,
        ),
        "Banded": (qs.Banded(r(9, 3, N).at[1].add(4.0), 1, 1), qs.Banded),
        "BlockDiagonal": (
            qs.BlockDiagonal(r(10, 3, 2, 2) + 3 * jnp.eye(2, dtype=dtype)),
            qs.BlockDiagonal,
        ),
        "LowerTriangular": (
            qs.LowerTriangular(r(11, N, N) + 4 * jnp.eye(N, dtype=dtype)),
            qs.LowerTriangular,
        ),
    }


def _sums(m, s):
    """The four ways to write the noise, on a structure or a dense `m`."""
    eye = jnp.eye(m.shape[-1], dtype=m.dtype)
    return m + s * eye, s * eye + m, m - s * eye, s * eye - m


with jax.enable_x64(True):
    NAMES = sorted(_structures(jnp.float64))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("name", NAMES)
def test_traced_noise_keeps_the_structure(name, dtype):
    """Under `jit` with the noise an argument: `M ± noise * jnp.eye(n)` and
    `noise * jnp.eye(n) ± M` are each of the structure's closed form (no `Sum`, no
    refusal), with the dense values; and for the Gaussian-process structures a
    `solve` on `M + noise I` as dense JAX's."""
    with jax.enable_x64(dtype == jnp.float64):
        m, kind = _structures(dtype)[name]
        s = jnp.asarray(0.7, dtype)
        outs = jax.jit(quax.quaxify(_sums))(m, s)
        wants = _sums(_dense(m), s)
        tol = quax.testing.tolerance(dtype)
        for got, want in zip(outs, wants, strict=True):
            assert isinstance(got, kind), type(got)
            np.testing.assert_allclose(_dense(got), want, **tol)
        if name in ("Kronecker", "LowRank"):  # the Gaussian-process structures
            n = m.shape[-1]
            v = _rand(12, n, dtype=dtype)
            solve = lambda m, s: jnp.linalg.solve(m + s * jnp.eye(n, dtype=dtype), v)
            got = jax.jit(quax.quaxify(solve))(m, s)
            want = solve(_dense(m), s)
            np.testing.assert_allclose(got, want, rtol=100 * tol["rtol"])


@pytest.mark.float64
def test_a_scaled_constant_diagonal_is_a_diagonal():
    """`M + noise * jnp.diag(d)` with a constant `d` (not all equal) adds the
    diagonal `noise * d`; `M + noise * (2 * jnp.eye(n))` the scaled identity."""
    with jax.enable_x64(True):
        m, _ = _structures(jnp.float64)["TridiagonalMatrix"]
        d = np.arange(1.0, N + 1)

        def fn(m, s):
            return m + s * d * jnp.eye(N), m - s * (2 * jnp.eye(N))

        outs = jax.jit(quax.quaxify(fn))(m, 0.3)
        wants = fn(_dense(m), 0.3)
        for got, want in zip(outs, wants, strict=True):
            assert isinstance(got, qs.TridiagonalMatrix)
            np.testing.assert_allclose(_dense(got), want, rtol=1e-12)
        k = _kronecker(jnp.float64)
        out = jax.jit(quax.quaxify(lambda k, s: k + s * (2 * jnp.eye(6))))(k, 0.3)
        assert isinstance(out, qs.KroneckerPlusIdentity)
        np.testing.assert_allclose(_dense(out), _dense(k) + 0.6 * np.eye(6))


def _gp_loss(c, v):
    """The negative log marginal likelihood of a Gaussian process, up to a
    constant, as plain `jnp` writes it."""
    return v @ jnp.linalg.solve(c, v) + jnp.linalg.slogdet(c)[1]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_gp_gradient_with_respect_to_a_traced_noise(dtype):
    """`jax.grad` of the GP loss `K + noise * jnp.eye(n)` with respect to the
    factors and the noise (inside `jit`; in float64 also eager, outside `jit` and
    inside `quaxify`), against `jax.grad` through the dense matrix. Each way the
    sum is a `KroneckerPlusIdentity` (a `Kronecker` plus a dense array would
    refuse, and a lazy `Sum`'s `solve` too)."""
    with jax.enable_x64(dtype == jnp.float64):
        k = _kronecker(dtype, 3, 4, seed=20)
        n = k.shape[-1]
        v = _rand(22, n, dtype=dtype)
        s = jnp.asarray(0.3, dtype)

        def loss(k, s):
            return _gp_loss(k + s * jnp.eye(n, dtype=dtype), v)

        def dense_loss(left, right, s):
            sym = lambda a: (a + a.T) / 2
            c = jnp.kron(sym(left), sym(right)) + s * jnp.eye(n, dtype=dtype)
            return _gp_loss(c, v)

        want = jax.grad(dense_loss, argnums=(0, 1, 2))(k.left, k.right, s)
        grad = jax.grad(quax.quaxify(loss), argnums=(0, 1))
        rtol = 1e-9 if dtype == jnp.float64 else 2e-3
        runs = [jax.jit(grad)]
        if dtype == jnp.float64:  # also eager, and outside `jit`
            runs += [grad, jax.grad(jax.jit(quax.quaxify(loss)), (0, 1))]
        for run in runs:
            got_k, got_s = run(k, s)
            np.testing.assert_allclose(got_s, want[2], rtol=rtol)
            np.testing.assert_allclose(got_k.left, want[0], rtol=rtol, atol=rtol)
            np.testing.assert_allclose(got_k.right, want[1], rtol=rtol, atol=rtol)
        if dtype == jnp.float64:  # `jax.grad` inside `quaxify`, for the noise
            got_s = quax.quaxify(jax.grad(loss, argnums=1))(k, s)
            np.testing.assert_allclose(got_s, want[2], rtol=rtol)


@pytest.mark.float64
def test_low_rank_gradient_with_respect_to_a_traced_noise():
    """The GP loss of `U Uᵀ + noise * jnp.eye(n)` (a `LowRankPlusDiagonal`,
    solved by Woodbury): its gradient with respect to `U` and the noise under
    `jit`, against the dense matrix's."""
    with jax.enable_x64(True):
        u = _rand(30, N, 2)
        v = _rand(31, N)

        def loss(m, s):
            return _gp_loss(m + s * jnp.eye(N), v)

        got_m, got_s = jax.jit(jax.grad(quax.quaxify(loss), (0, 1)))(qs.LowRank(u), 0.5)
        dense = lambda u, s: loss(u @ u.T, s)
        want_u, want_s = jax.grad(dense, (0, 1))(u, 0.5)
        np.testing.assert_allclose(got_s, want_s, rtol=1e-9)
        np.testing.assert_allclose(got_m.u, want_u, rtol=1e-9, atol=1e-12)


@pytest.mark.float64
def test_gp_gradient_with_traced_eye_noise_holds_no_dense_matrix():
    """`jax.jit(jax.grad(...))` of the GP loss written `K + noise * jnp.eye(n)`
    (the eye a constant of the program, the noise a `grad` variable), at n =
    128: the optimised program holds no `(n, n)` array of any dtype (neither the
    eye nor its product with the noise: they are read, not computed)."""
    with jax.enable_x64(True):
        k = _kronecker(jnp.float64, 8, 16, seed=40)
        n = k.shape[-1]
        v = _rand(42, n)
        grad = jax.grad(
            quax.quaxify(lambda k, s: _gp_loss(k + s * jnp.eye(n), v)), argnums=(0, 1)
        )
        text = jax.jit(grad).lower(k, 0.3).compile().as_text()
        assert text is not None
        assert f"[{n},{n}]" not in text
        c = np.kron(np.asarray(k.left), np.asarray(k.right)) + 0.3 * np.eye(n)
        # d/ds (vᵀ C⁻¹ v + log det C) = -‖C⁻¹ v‖² + tr C⁻¹, by NumPy.
        x = np.linalg.solve(c, np.asarray(v))
        want = -x @ x + np.trace(np.linalg.inv(c))
        np.testing.assert_allclose(jax.jit(grad)(k, 0.3)[1], want, rtol=1e-9)


@pytest.mark.float64
def test_a_non_finite_traced_noise_gives_nan_as_dense():
    """An infinite or NaN traced noise: the solve and `slogdet` of `K + noise *
    jnp.eye(n)` are NaN, as dense JAX's are (the dense product puts NaN off the
    diagonal), never the zero that `K + inf I` would solve to."""
    with jax.enable_x64(True):
        k = _kronecker(jnp.float64)
        v = _rand(50, 6)

        def fn(k, s):
            c = k + s * jnp.eye(6)
            return jnp.linalg.solve(c, v), jnp.linalg.slogdet(c)[1], c @ v

        run = jax.jit(quax.quaxify(fn))
        for s in (jnp.inf, -jnp.inf, jnp.nan):
            for got, want in zip(run(k, s), fn(_dense(k), s), strict=True):
                assert np.all(np.isnan(want))
                assert np.all(np.isnan(got)), (s, got)
        # A finite noise is unchanged.
        for got, want in zip(run(k, 0.5), fn(_dense(k), 0.5), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.float64
def test_ieee_strict_refuses_a_traced_noise():
    """Inside `quax.zero.ieee_strict` a traced noise is not read: `noise *
    jnp.eye(n)` puts NaN off the diagonal for an infinite noise, which the
    structure's zeros would not. The sum refuses, naming `add`; a constant noise
    is still read."""
    with jax.enable_x64(True):
        m, _ = _structures(jnp.float64)["Diagonal"]
        traced = jax.jit(quax.quaxify(lambda m, s: m + s * jnp.eye(N)))
        with ieee_strict():
            with pytest.raises(
                qs.StructuredMaterialisationError, match="primitive `add`"
            ):
                traced(m, 0.5)
            out = jax.jit(quax.quaxify(lambda m: m + 0.5 * jnp.eye(N)))(m)
        assert isinstance(out, qs.Diagonal)
        np.testing.assert_allclose(_dense(out), _dense(m) + 0.5 * np.eye(N))
