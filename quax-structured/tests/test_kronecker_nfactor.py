"""`Kronecker` products of three or more factors (issue 29, item 4): every rule
that works for two factors (products, transpose, conj, solve, slogdet/det, lu,
cholesky, eigh, svd/svdvals, qr, expm, matrix_power, scaling, `+ σ² I`) works
for N, against plain JAX on the dense `jnp.kron` chain; the nested
`Kronecker(Kronecker(A, B), C)` is the same matrix; the published two-factor
constructor keeps working."""

import functools as ft

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
import scipy.linalg


# Every test of this module runs with `x64` on (in conftest.py); float32 cases
# build float32 arrays.
pytestmark = pytest.mark.usefixtures("x64")

SIZES = (2, 3, 2)


def _rand(seed, *shape, dtype=jnp.float64):
    x = jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)
    return x.astype(dtype)


def _spd(seed, size, dtype=jnp.float64):
    a = _rand(seed, size, size, dtype=dtype)
    return a @ a.T + size * jnp.eye(size, dtype=dtype)


def _kron(*factors):
    return ft.reduce(jnp.kron, factors)


def _tol(dtype):
    return quax.testing.tolerance(jnp.dtype(dtype))


def _check(got, want, dtype=jnp.float64, scale=1.0):
    tol = _tol(dtype)
    np.testing.assert_allclose(
        np.asarray(got),
        np.asarray(want),
        rtol=tol["rtol"] * scale,
        atol=tol["atol"] * scale,
    )


def test_two_factor_constructor_unchanged():
    """`Kronecker(left, right)` as published: positional, keywords, the
    positional `symmetric`, and the fields `left`/`right` read back."""
    a, b = _rand(0, 2, 2), _rand(1, 3, 3)
    for k in (
        qs.Kronecker(a, b),
        qs.Kronecker(left=a, right=b),
        qs.Kronecker(a, right=b),
        qs.Kronecker(a, b, False, None),
    ):
        assert k.left is a and k.right is b and k.shape == (6, 6)
        np.testing.assert_array_equal(k.enable_materialise().dense(), jnp.kron(a, b))
    # The tag needs symmetric factors (a factor that is not is refused).
    sym = qs.Kronecker((a + a.T) / 2, (b + b.T) / 2, True)
    assert sym.symmetric
    p = qs.KroneckerPlusIdentity(a, b, 0.5)
    assert p.left is a and p.right is b and p.scale == 0.5
    want = jnp.kron((a + a.T) / 2, (b + b.T) / 2) + 0.5 * jnp.eye(6)
    np.testing.assert_allclose(p.enable_materialise().dense(), want, rtol=1e-15)


def test_three_factors_and_nesting():
    """Three factors: `right` names the way to all of them; nested products
    splice their factors in (any nesting is the same matrix)."""
    a, b, c = (_rand(i, s, s) for i, s in enumerate(SIZES))
    flat = qs.Kronecker(a, b, c)
    assert flat.left is a and len(flat.matrices) == 3 and flat.sizes == SIZES
    with pytest.raises(AttributeError, match=r"exactly two factors.*\.matrices"):
        flat.right  # noqa: B018
    for nested in (
        qs.Kronecker(qs.Kronecker(a, b), c),
        qs.Kronecker(a, qs.Kronecker(b, c)),
    ):
        assert len(nested.matrices) == 3
        np.testing.assert_array_equal(
            nested.enable_materialise().dense(), _kron(a, b, c)
        )
    with pytest.raises(ValueError, match="two or more factors"):
        qs.Kronecker(a)
    with pytest.raises(ValueError, match=r"square 2-dimensional.*matrices\[2\]"):
        qs.Kronecker(a, b, _rand(5, 2, 3))
    with pytest.raises(ValueError, match=r"factor 1 is a `LowRank`.*dense"):
        qs.Kronecker(a, qs.LowRank(_rand(6, 3, 1)))


def _solve_logdet(m, v):
    return jnp.linalg.solve(m, v), jnp.linalg.slogdet(m), jnp.linalg.det(m)


def _products(m, v):
    return m @ v, v @ m, m.T @ v, jnp.diagonal(m), jnp.trace(m), (2.0 * m) @ v


def _all_products(m, v):
    return _products(m, v), _solve_logdet(m, v)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("nested", [False, True])
def test_products_solve_slogdet(dtype, nested):
    """Products, transpose, scaling, diagonal, trace, `solve`, `slogdet` and
    `det` of a three-factor product (general factors, LU through the factors)
    match dense JAX, flat and nested."""
    a, b, c = (
        _rand(i, s, s, dtype=dtype) + 2 * jnp.eye(s, dtype=dtype)
        for i, s in zip((10, 11, 12), SIZES, strict=True)
    )
    k = qs.Kronecker(qs.Kronecker(a, b), c) if nested else qs.Kronecker(a, b, c)
    n = k.shape[-1]
    v = _rand(13, n, dtype=dtype)
    dense = _kron(a, b, c)
    got = jax.jit(quax.quaxify(_all_products))(k, v)
    want = _all_products(dense, v)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _check(g, w, dtype, scale=10.0)


def test_lu_solve_transposed():
    """`lu_factor` then `lu_solve` (also `trans=1`) with a Kronecker LU of three
    factors whose LAPACK pivots swap rows."""
    a, b, c = (_rand(i, s, s) for i, s in zip((20, 21, 22), SIZES, strict=True))
    k = qs.Kronecker(a, b, c)
    v = _rand(23, k.shape[-1])
    dense = _kron(a, b, c)

    def fn(m, v):
        lu = jsl.lu_factor(m)
        return jsl.lu_solve(lu, v), jsl.lu_solve(lu, v, trans=1)

    got = jax.jit(quax.quaxify(fn))(k, v)
    _check(got[0], jnp.linalg.solve(dense, v), scale=100.0)
    _check(got[1], jnp.linalg.solve(dense.T, v), scale=100.0)
    sign, logdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))(k)
    want_sign, want_logdet = jnp.linalg.slogdet(dense)
    assert sign == want_sign
    _check(logdet, want_logdet)


def test_gradients_of_solve_and_slogdet():
    """`jax.grad` of `v ⋅ solve(K, v) + slogdet(K)` with respect to all three
    factors, against the dense `jnp.kron` chain."""
    fs = [
        _rand(i, s, s) + 3 * jnp.eye(s)
        for i, s in zip((30, 31, 32), SIZES, strict=True)
    ]
    v = _rand(33, int(np.prod(SIZES)))

    def loss(m):
        return v @ jnp.linalg.solve(m, v) + jnp.linalg.slogdet(m)[1]

    got = jax.jit(jax.grad(quax.quaxify(loss)))(qs.Kronecker(*fs))
    want = jax.grad(lambda fs: loss(_kron(*fs)))(fs)
    for g, w in zip(got.matrices, want, strict=True):
        _check(g, w, scale=10.0)


def _decompositions(m):
    chol = jnp.linalg.cholesky(m)
    w, q = jnp.linalg.eigh(m)
    u, s, vh = jnp.linalg.svd(m)
    qq, r = jnp.linalg.qr(m)
    return (
        chol,
        w,
        (q * w) @ q.T,
        (u * s) @ vh,
        jnp.linalg.svdvals(m),
        qq @ r,
        jnp.tril(r) - jnp.diag(jnp.diagonal(r)),
        jsl.expm(m),
        jnp.linalg.matrix_power(m, 3),
    )


def test_decompositions():
    """`cholesky`, `eigh`, `svd`/`svdvals`, `qr`, `expm` and `matrix_power` of a
    symmetric positive definite three-factor product, against dense JAX
    (reconstructions where the factors are not unique)."""
    k = qs.Kronecker(*(_spd(40 + i, s) for i, s in enumerate(SIZES)), symmetric=True)
    dense = k.enable_materialise().dense()
    got = jax.jit(quax.quaxify(_decompositions))(k)
    want = _decompositions(dense)
    for g, w in zip(got, want, strict=True):
        _check(
            g
            if not isinstance(g, qs.StructuredMatrix)
            else g.enable_materialise().dense(),
            w,
            scale=100.0,
        )
    q, r = quax.quaxify(jnp.linalg.qr)(k)
    assert isinstance(q, qs.Kronecker) and len(q.matrices) == 3
    assert isinstance(r, qs.Kronecker) and r.triangle == "upper"
    power = quax.quaxify(lambda m: jnp.linalg.matrix_power(m, 3))(k)
    assert isinstance(power, qs.Kronecker) and len(power.matrices) == 3


def test_conj_of_complex_factors():
    """`M.conj()`, `M.conj().T` and `M.mT @ v` keep three complex factors."""
    fs = [
        (_rand(50 + i, s, s) + 1j * _rand(60 + i, s, s)).astype(jnp.complex128)
        for i, s in enumerate(SIZES)
    ]
    k = qs.Kronecker(*fs)
    v = _rand(70, k.shape[-1]).astype(jnp.complex128)
    out = quax.quaxify(lambda m: m.conj().T)(k)
    assert isinstance(out, qs.Kronecker) and len(out.matrices) == 3
    got = jax.jit(quax.quaxify(lambda m, v: (m.conj() @ v, m.conj().T @ v, m.mT @ v)))(
        k, v
    )
    dense = _kron(*fs)
    want = (jnp.conj(dense) @ v, jnp.conj(dense).T @ v, dense.T @ v)
    for g, w in zip(got, want, strict=True):
        _check(g, w)


def test_plus_noise():
    """`K + 0.3 * jnp.eye(n)` and `K + ScaledIdentity(s, n)` of a symmetric
    three-factor `K`: a `KroneckerPlusIdentity` of three factors; `solve`,
    `slogdet`, `det`, `eigvalsh` and `svdvals` as dense JAX's."""
    k = qs.Kronecker(*(_spd(80 + i, s) for i, s in enumerate(SIZES)), symmetric=True)
    n = k.shape[-1]
    v = _rand(84, n)

    def fn(k):
        c = k + 0.3 * jnp.eye(n)
        return (c, *_solve_logdet(c, v), jnp.linalg.eigvalsh(c), jnp.linalg.svdvals(c))

    c, *got = jax.jit(quax.quaxify(fn))(k)
    assert isinstance(c, qs.KroneckerPlusIdentity) and len(c.matrices) == 3
    dense = k.enable_materialise().dense() + 0.3 * jnp.eye(n)
    want = (
        *_solve_logdet(dense, v),
        jnp.linalg.eigvalsh(dense),
        jnp.linalg.svdvals(dense),
    )
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _check(g, w, scale=10.0)
    noise = qs.ScaledIdentity(jnp.array(0.3), n)
    c2 = quax.quaxify(lambda k, s: k + s)(k, noise)
    assert isinstance(c2, qs.KroneckerPlusIdentity)
    _check(c2.enable_materialise().dense(), dense)


def test_kronecker_of_diagonals():
    """`Kronecker(Diagonal(d1), Diagonal(d2), Diagonal(d3))` is stored as three
    diagonals; its products, solve and sums with `c I` or another such product
    (a `Diagonal`) match dense JAX."""
    ds = [1 + jnp.abs(_rand(90 + i, s)) for i, s in enumerate(SIZES)]
    k = qs.Kronecker(*(qs.Diagonal(d) for d in ds))
    assert k.diagonal == (True, True, True)
    dense = _kron(*(jnp.diag(d) for d in ds))
    np.testing.assert_array_equal(k.enable_materialise().dense(), dense)
    v = _rand(93, k.shape[-1])

    def fn(k):
        return k @ v, jnp.linalg.solve(k, v), jnp.linalg.slogdet(k)[1], k + 0.5 * k

    got = jax.jit(quax.quaxify(fn))(k)
    want = fn(dense)
    for g, w in zip(got[:3], want[:3], strict=True):
        _check(g, w)
    _check(got[3].enable_materialise().dense(), want[3])
    out = quax.quaxify(lambda k: k + qs.ScaledIdentity(jnp.array(2.0), k.shape[-1]))(k)
    assert isinstance(out, qs.Diagonal)
    _check(out.diag, jnp.diagonal(dense) + 2.0)
    out = quax.quaxify(lambda k: k + k)(k)
    assert isinstance(out, qs.Kronecker | qs.Diagonal)
    _check(out.enable_materialise().dense(), 2 * dense)


def test_expm_of_three_term_kronecker_sum():
    """`A ⊗ I ⊗ I + I ⊗ B ⊗ I + I ⊗ I ⊗ C` (the 3-D Laplacian's form), the
    identities built inside the jitted function: `expm(A) ⊗ expm(B) ⊗ expm(C)`, a
    three-factor `Kronecker`, against SciPy's `expm` of the dense sum."""
    a, b, c = (_rand(110 + i, s, s) for i, s in enumerate(SIZES))
    na, nb, nc = SIZES

    def fn(a, b, c):
        eye = jnp.eye
        terms = (
            qs.Kronecker(a, eye(nb), eye(nc)),
            qs.Kronecker(eye(na), 2.0 * b, eye(nc)),
            qs.Kronecker(eye(na), eye(nb), c),
        )
        return quax.quaxify(lambda p, q, r: jsl.expm(p + q + r))(*terms)

    out = jax.jit(fn)(a, b, c)
    assert isinstance(out, qs.Kronecker) and len(out.matrices) == 3
    dense = (
        _kron(a, np.eye(nb), np.eye(nc))
        + _kron(np.eye(na), 2.0 * b, np.eye(nc))
        + _kron(np.eye(na), np.eye(nb), c)
    )
    _check(out.enable_materialise().dense(), scipy.linalg.expm(dense), scale=100.0)
