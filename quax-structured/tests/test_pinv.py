"""`jnp.linalg.pinv` as a structure (issue 29, item 6): unmodified calls under
`jit`, against JAX's dense `pinv` of the same matrix with the same `rtol` and
`hermitian`, in float32, float64 and complex64; singular inputs and singular
values on either side of the cutoff; derivatives against dense `jax.grad`; the
Kronecker product whose cutoff does not factor (NaN, never another matrix); the
compiled programs hold no `(n, n)` array."""

import functools as ft

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
from hypothesis import given, settings
from quax_structured import (
    BlockDiagonal,
    Circulant,
    Diagonal,
    Kronecker,
    LowRank,
    ScaledIdentity,
    TridiagonalMatrix,
)


DTYPES = [np.float32, np.float64, np.complex64]

# How a singular value is drawn, relative to the largest (2) and the cutoff `c`
# (`rtol` times the largest): `kept` in [0.5, 2], `near` = 4c (kept), `under` =
# c / 4 (dropped), `zero` (a singular matrix).
KINDS = ["kept", "kept", "near", "under", "zero"]


def _dense(m):
    return m.enable_materialise().materialise()


def _default_rtol(n, dtype):
    return 10.0 * n * float(np.finfo(dtype).eps)


def _magnitudes(rng, kinds, cutoff):
    """Singular values for `kinds`, the first one the largest (2)."""
    out = []
    for kind in kinds:
        if kind == "kept":
            out.append(rng.uniform(0.5, 2.0))
        elif kind == "near":
            out.append(4 * cutoff)
        elif kind == "under":
            out.append(cutoff / 4)
        else:
            out.append(0.0)
    out[0] = 2.0
    return np.asarray(out)


def _phases(rng, n, dtype):
    """Unit numbers: signs for a real dtype, complex phases for a complex one."""
    if np.issubdtype(dtype, np.complexfloating):
        return np.exp(2j * np.pi * rng.uniform(size=n))
    return rng.choice([-1.0, 1.0], size=n)


def _unitary(rng, n, dtype):
    x = rng.standard_normal((n, n))
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal((n, n))
    return np.linalg.qr(x)[0]


def _circulant_column(rng, s, dtype):
    """The first column of a circulant (real for a real dtype) whose eigenvalues
    have the moduli `s` (mirrored, `|λ_k| = |λ_{n-k}|`, for a real one)."""
    n = s.shape[0]
    if np.issubdtype(dtype, np.complexfloating):
        return np.fft.ifft(s * _phases(rng, n, dtype))
    eigenvalues = np.zeros(n, complex)
    for k in range(n // 2 + 1):
        real = k == 0 or 2 * k == n
        phase = rng.choice([-1.0, 1.0]) if real else np.exp(2j * np.pi * rng.uniform())
        eigenvalues[k] = s[k] * phase
        eigenvalues[(n - k) % n] = np.conj(eigenvalues[k])
    return np.fft.ifft(eigenvalues).real


def _structure(name, rng, n, dtype, kinds, cutoff, hermitian=False):
    """A matrix of structure `name` and size about `n` whose singular values are
    drawn by `kinds`; with `hermitian`, a Hermitian one (its eigenvalues the
    singular values with signs)."""
    if name == "Diagonal":
        s = _magnitudes(rng, kinds[:n], cutoff)
        phases = _phases(rng, n, np.float64 if hermitian else dtype)
        return Diagonal(jnp.asarray((s * phases).astype(dtype)))
    if name == "Circulant":
        s = _magnitudes(rng, kinds[:n], cutoff)
        if hermitian:
            # Real eigenvalues (mirrored for a real matrix).
            eigenvalues = s * _phases(rng, n, np.float64)
            if not np.issubdtype(dtype, np.complexfloating):
                eigenvalues = np.asarray([eigenvalues[min(k, n - k)] for k in range(n)])
            column = np.fft.ifft(eigenvalues)
            if not np.issubdtype(dtype, np.complexfloating):
                column = column.real
        else:
            column = _circulant_column(rng, s, dtype)
        return Circulant(jnp.asarray(column.astype(dtype)))
    if name == "BlockDiagonal":
        m, b = n // 2, 2
        s = _magnitudes(rng, kinds[: m * b], cutoff)
        s = rng.permutation(s * _phases(rng, m * b, np.float64)).reshape(m, b)
        blocks = []
        for si in s:
            q = _unitary(rng, b, dtype)
            w = q if hermitian else _unitary(rng, b, dtype)
            blocks.append(q @ np.diag(si) @ w.conj().T)
        return BlockDiagonal(jnp.asarray(np.stack(blocks).astype(dtype)))
    # A Kronecker product of 2 x 2 and n/2 x n/2 factors: the kinds go to the
    # right factor (the left one's values are 1 and 1/2); its cutoff then
    # factors for "kept" and "zero" values.
    nb = n // 2
    left = _unitary(rng, 2, dtype) @ np.diag([1.0, 0.5]) @ _unitary(rng, 2, dtype)
    s = _magnitudes(rng, kinds[:nb], cutoff)
    right = _unitary(rng, nb, dtype) @ np.diag(s) @ _unitary(rng, nb, dtype).T
    return Kronecker(jnp.asarray(left.astype(dtype)), jnp.asarray(right.astype(dtype)))


@ft.cache
def _compiled(rtol, hermitian):
    """The structured and the dense `pinv` under `jit`, `rtol` a constant (JAX's
    `pinv` closes its `custom_jvp` over a traced `rtol`, which the tracer-leak
    check reports)."""
    fn = lambda m: jnp.linalg.pinv(m, rtol=rtol, hermitian=hermitian)
    return jax.jit(quax.quaxify(fn)), jax.jit(fn)


def _check(m, rtol, hermitian=False):
    """`pinv(m)` keeps `m`'s structure and matches JAX's dense `pinv`, judged on
    the scale of the result (the tolerance of its dtype)."""
    structured, dense = _compiled(rtol, hermitian)
    got, want = structured(m), dense(_dense(m))
    assert type(got) is type(m)
    assert got.dtype == want.dtype
    tol = quax.testing.tolerance(want.dtype)["rtol"]
    scale = float(np.max(np.abs(want)))
    np.testing.assert_allclose(_dense(got), want, atol=100 * tol * max(1, scale))


STRUCTURES = ["Diagonal", "Circulant", "BlockDiagonal", "Kronecker"]


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(STRUCTURES),
    n=st.sampled_from([4, 6, 8]),
    dtype=st.sampled_from(DTYPES),
    kinds=st.lists(st.sampled_from(KINDS), min_size=8, max_size=8),
    rtol=st.sampled_from([None, 1e-3, 0.05]),
    seed=st.integers(0, 2**16),
)
def test_pinv_matches_dense(name, n, dtype, kinds, rtol, seed):
    """Singular values kept, just above the cutoff, just under it, and zero, for
    JAX's default `rtol` and for ones passed explicitly."""
    rng = np.random.default_rng(seed)
    with jax.enable_x64(dtype == np.float64):
        r = _default_rtol(n, dtype) if rtol is None else rtol
        if rtol is None:
            # Values 4x JAX's tiny default cutoff make the dense reference
            # itself inaccurate (its SVD's error is eps times the largest value).
            kinds = ["kept" if k == "near" else k for k in kinds]
        m = _structure(name, rng, n, dtype, kinds, 2 * r)
        _check(m, rtol)


@settings(max_examples=10, deadline=None)
@given(
    name=st.sampled_from(["Diagonal", "Circulant", "BlockDiagonal"]),
    n=st.sampled_from([4, 6]),
    dtype=st.sampled_from(DTYPES),
    kinds=st.lists(st.sampled_from(KINDS), min_size=6, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_pinv_hermitian_pseudo_inverts_the_hermitian_part(name, n, dtype, kinds, seed):
    """`hermitian=True` on a matrix that is not Hermitian: as JAX, the
    pseudo-inverse of `(M + Mᴴ) / 2` (a Hermitian part with the drawn singular
    values, plus a skew-Hermitian part)."""
    rng = np.random.default_rng(seed)
    with jax.enable_x64(dtype == np.float64):
        rtol = 0.05
        part = _structure(name, rng, n, dtype, kinds, 2 * rtol, hermitian=True)
        skew = _hermitian(_structure(name, rng, n, dtype, ["kept"] * 8, 0.0), -1)
        m = quax.quaxify(lambda a, b: a + b)(part, skew)
        _check(m, rtol, hermitian=True)


def _hermitian(m, sign=1):
    """`(m + sign mᴴ) / 2`, of `m`'s structure."""
    return quax.quaxify(lambda a: (a + sign * jnp.conj(a.T)) / 2)(m)


def test_pinv_scaled_identity():
    """`1 / c`, zero at `c = 0` and where `rtol >= 1` drops every value."""
    for c, rtol, want in [(2.0, None, 0.5), (0.0, None, 0.0), (2.0, 1.0, 0.0)]:
        m = ScaledIdentity(jnp.asarray(c), 4)
        got = jax.jit(quax.quaxify(ft.partial(jnp.linalg.pinv, rtol=rtol)))(m)
        assert isinstance(got, ScaledIdentity)
        np.testing.assert_allclose(_dense(got), want * np.eye(4))
        np.testing.assert_allclose(_dense(got), jnp.linalg.pinv(_dense(m), rtol=rtol))


def test_pinv_batched_with_a_batch_of_rtol():
    """A batch of diagonals and one `rtol` per matrix (JAX's `rtol` of shape
    `a.shape[:-2]`)."""
    d = jnp.asarray([[2.0, 0.1, 0.01], [2.0, 0.1, 0.01]])
    rtol = jnp.asarray([0.02, 0.001])
    got = quax.quaxify(jnp.linalg.pinv)(Diagonal(d), rtol)
    np.testing.assert_allclose(got.diag, [[0.5, 10.0, 0.0], [0.5, 10.0, 100.0]])
    np.testing.assert_allclose(
        _dense(got), jnp.linalg.pinv(_dense(Diagonal(d)), rtol), rtol=1e-6
    )


def test_pinv_kronecker_with_a_cutoff_that_does_not_factor_is_nan():
    """`a = (1, 0.1)`, `b = (1, 0.1)`, `rtol = 0.05`: the products 1, 0.1, 0.1
    are kept and 0.01 dropped, which no Kronecker product of the factors'
    pseudo-inverses gives: NaN rather than that other matrix. With `rtol =
    0.005` every product is kept: the exact pseudo-inverse."""
    a = jnp.diag(jnp.asarray([1.0, 0.1]))
    m = Kronecker(a, a)
    fn = lambda r: jax.jit(quax.quaxify(ft.partial(jnp.linalg.pinv, rtol=r)))
    assert np.all(np.isnan(_dense(fn(0.05)(m))))
    np.testing.assert_allclose(
        _dense(fn(0.005)(m)), jnp.linalg.pinv(_dense(m), rtol=0.005), rtol=1e-6
    )


# The dtypes times the shapes (two of rank below `n`, one `r > n`): CI runs each
# shape in one dtype and each dtype once, `(6, 2)` float32, `(5, 3)` float64, `(4, 6)`
# complex64; the other six repeat a shape's route in another dtype: sweeps (`bash
# scripts/test.sh sweeps`).
_LOW_RANK_CI = {(6, 2): np.float32, (5, 3): np.float64, (4, 6): np.complex64}


@pytest.mark.parametrize(
    ("dtype", "n", "r"),
    [
        pytest.param(
            dtype,
            n,
            r,
            id=f"{n}-{r}-{dtype.__name__}",
            marks=[] if _LOW_RANK_CI[n, r] is dtype else [pytest.mark.sweep],
        )
        for dtype in DTYPES
        for n, r in _LOW_RANK_CI
    ],
)
def test_pinv_low_rank(dtype, n, r):
    """`U Vᵀ` to a `LowRank` of the same rank, also with a dependent column of
    `U` (rank below `r`), a symmetric one (`v=None`), `r > n`, and `rtol`
    passed explicitly."""
    rng = np.random.default_rng(n + r)
    with jax.enable_x64(dtype == np.float64):

        def draw():
            x = rng.standard_normal((n, r))
            if np.issubdtype(dtype, np.complexfloating):
                x = x + 1j * rng.standard_normal((n, r))
            return jnp.asarray(x.astype(dtype))

        u, v = draw(), draw()
        dependent = u.at[:, -1].set(u[:, 0])
        for m in (LowRank(u, v), LowRank(dependent, v), LowRank(u)):
            for rtol in (None, 0.05):
                _check(m, rtol)


@pytest.mark.usefixtures("x64")
def test_pinv_low_rank_gradient_matches_dense():
    """Through JAX's formula on the factors (not the QR factorisations'
    derivative, NaN at dependent columns): at full rank, with a zero column of
    `U`, and symmetric."""
    rng = np.random.default_rng(5)
    u = jnp.asarray(rng.standard_normal((6, 3)))
    v = jnp.asarray(rng.standard_normal((6, 3)))
    w = jnp.linspace(-1.0, 1.0, 6)
    loss = quax.quaxify(lambda m: _loss(jnp.linalg.pinv(m), w))
    for left in (u, u.at[:, 2].set(0.0)):
        got = jax.grad(lambda a, b: loss(LowRank(a, b)), (0, 1))(left, v)
        want = jax.grad(lambda a, b: _loss(jnp.linalg.pinv(a @ b.T), w), (0, 1))(
            left, v
        )
        for g, x in zip(got, want, strict=True):
            np.testing.assert_allclose(g, x, rtol=1e-8, atol=1e-10)
    got = jax.grad(lambda a: loss(LowRank(a)))(u)
    want = jax.grad(lambda a: _loss(jnp.linalg.pinv(a @ a.T), w))(u)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)


def _loss(p, w):
    return jnp.sum(jnp.sin(jnp.real(p @ w)))


GRADIENT_CASES = {
    "Diagonal": (
        lambda d: Diagonal(d),
        lambda d: jnp.diag(d),
        np.asarray([2.0, -0.7, 0.0, 1e-9, 1.3]),
    ),
    "Circulant": (
        lambda c: Circulant(c),
        lambda c: _dense(Circulant(c)),
        np.asarray(
            _circulant_column(
                np.random.default_rng(0),
                np.asarray([2.0, 1.0, 0.0, 0.7, 0.0, 1.0]),
                np.float64,
            )
        ),
    ),
    "BlockDiagonal": (
        lambda b: BlockDiagonal(b),
        lambda b: _dense(BlockDiagonal(b)),
        np.asarray([[[1.0, 2.0], [0.5, 1.0]], [[0.3, -1.0], [2.0, 0.4]]]),
    ),
}


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("name", sorted(GRADIENT_CASES))
def test_pinv_gradient_matches_dense(name):
    """`jax.grad` through the structured `pinv` against dense `jax.grad` through
    JAX's `pinv`, at singular matrices (a zero and a dropped singular value; a
    singular block)."""
    build, dense, leaves = GRADIENT_CASES[name]
    leaves = jnp.asarray(leaves)
    n = dense(leaves).shape[-1]
    w = jnp.linspace(-1.0, 1.0, n)
    structured = quax.quaxify(lambda m: _loss(jnp.linalg.pinv(m), w))
    got = jax.grad(lambda x: structured(build(x)))(leaves)
    want = jax.grad(lambda x: _loss(jnp.linalg.pinv(dense(x)), w))(leaves)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)


@pytest.mark.usefixtures("x64")
def test_pinv_kronecker_gradient_matches_dense():
    """Both factors' derivatives, also with a singular factor (whose dropped
    values factor: every product with a nonzero value of it is kept)."""
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((2, 2)))
    b = jnp.asarray(rng.standard_normal((3, 3)))
    w = jnp.linspace(-1.0, 1.0, 6)
    loss = quax.quaxify(lambda m: _loss(jnp.linalg.pinv(m), w))
    structured = lambda a, b: loss(Kronecker(a, b))
    for right in (b, b.at[:, 0].set(0.0)):
        dense = lambda a, b: _loss(jnp.linalg.pinv(jnp.kron(a, b)), w)
        got = jax.grad(structured, (0, 1))(a, right)
        want = jax.grad(dense, (0, 1))(a, right)
        for g, x in zip(got, want, strict=True):
            np.testing.assert_allclose(g, x, rtol=1e-8, atol=1e-10)


def test_pinv_of_other_structures_runs_the_body():
    """A structure without a pseudo-inverse of its own refuses through the body
    (its `svd`), naming the way out, as before."""
    t = TridiagonalMatrix(jnp.ones(3), jnp.full(4, 2.0), jnp.ones(3))
    with pytest.raises(quax.MaterialisationError, match="allow_materialise"):
        quax.quaxify(jnp.linalg.pinv)(t)
    got = quax.quaxify(jnp.linalg.pinv)(t.enable_materialise())
    np.testing.assert_allclose(got, jnp.linalg.pinv(_dense(t)), rtol=1e-5, atol=1e-6)


N = 300


def test_circulant_kronecker_and_low_rank_pinv_hold_no_dense_matrix():
    k = jr.split(jr.key(4), 3)
    c = Circulant(jr.normal(k[0], (N,)))
    kron = Kronecker(jr.normal(k[1], (15, 15)), jr.normal(k[2], (20, 20)))
    low = LowRank(jr.normal(k[1], (N, 4)), jr.normal(k[2], (N, 4)))
    for m in (c, kron, low):
        quax.testing.assert_hlo_lacks(jnp.linalg.pinv, m, shapes=[(N, N)])


def test_circulant_qr_refusal_gives_the_ways_out():
    """A circulant's `qr` stays refused (its `R` has no structure); the message
    says why and what runs through the FFT instead, and the way to the dense
    factors, which then match JAX's."""
    c = Circulant(jnp.asarray([4.0, 1.0, 0.5, 2.0]))
    with pytest.raises(quax.MaterialisationError) as info:
        quax.quaxify(jnp.linalg.qr)(c)
    message = str(info.value)
    for part in ("no structure", "jnp.linalg.pinv(C) @ b", "allow_materialise=True"):
        assert part in message
    q, r = quax.quaxify(jnp.linalg.qr)(c.enable_materialise())
    np.testing.assert_allclose(q @ r, _dense(c), rtol=1e-5, atol=1e-5)
