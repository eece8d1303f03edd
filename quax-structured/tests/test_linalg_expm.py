"""`jax.scipy.linalg.expm` and `jnp.linalg.matrix_power` through the structures
(issue 29, item 6): unmodified calls, under `jit` (traced leaves), batched,
under `vmap` and `grad`; the Kronecker sum's `expm(A) ⊗ expm(B)`; the refusal
naming `expm`; a user's own function named `expm` left alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import scipy.linalg
from jax.scipy.linalg import expm
from quax_structured import (
    BlockDiagonal,
    Circulant,
    Diagonal,
    Kronecker,
    KroneckerPlusIdentity,
    LowRank,
    LowRankPlusDiagonal,
    ScaledIdentity,
    StructuredMaterialisationError,
    TridiagonalMatrix,
)


pytestmark = pytest.mark.usefixtures("x64")

rng = np.random.default_rng(1)


def _normal(*shape, scale=0.5):
    return jnp.asarray(scale * rng.standard_normal(shape))


def _dense(m):
    return m.enable_materialise().materialise()


def test_expm_under_jit_keeps_the_structure():
    """Traced leaves (arguments of `jax.jit`), each structure's exact
    exponential against SciPy's on the dense matrix."""
    d, c, blocks = _normal(6), _normal(7), _normal(3, 2, 2)
    u, v = _normal(8, 2), _normal(8, 2)
    cases = [
        (Diagonal(d), Diagonal, np.diag(d)),
        (ScaledIdentity(jnp.asarray(0.3), 4), ScaledIdentity, 0.3 * np.eye(4)),
        (Circulant(c), Circulant, scipy.linalg.circulant(c)),
        (BlockDiagonal(blocks), BlockDiagonal, scipy.linalg.block_diag(*blocks)),
        (LowRank(u, v), LowRankPlusDiagonal, np.asarray(u @ v.T)),
        (LowRank(u), LowRankPlusDiagonal, np.asarray(u @ u.T)),
    ]
    for m, kind, dense in cases:
        out = jax.jit(quax.quaxify(expm))(m)
        assert isinstance(out, kind)
        np.testing.assert_allclose(_dense(out), scipy.linalg.expm(dense), atol=1e-12)


def test_expm_symmetric_kronecker_and_plus_identity():
    sym = lambda x: (x + x.T) / 2
    # The tag needs symmetric factors (a factor that is not is refused).
    a, b = sym(_normal(3, 3)), sym(_normal(4, 4))
    k = Kronecker(a, b, symmetric=True)
    out = jax.jit(quax.quaxify(expm))(k)
    want = scipy.linalg.expm(np.kron(sym(a), sym(b)))
    np.testing.assert_allclose(out, want, atol=1e-12)
    kpi = KroneckerPlusIdentity(a, b, jnp.asarray(-0.4))
    out = jax.jit(quax.quaxify(expm))(kpi)
    want = scipy.linalg.expm(np.kron(sym(a), sym(b)) - 0.4 * np.eye(12))
    np.testing.assert_allclose(out, want, atol=1e-12)


def test_expm_kronecker_sum():
    """`A ⊗ I + I ⊗ B` (the 2-D Laplacian's form) as code writes it, with the
    identities built inside the jitted function (constants of its program):
    `expm(A) ⊗ expm(B)`, a `Kronecker`; also a multiple of the identity and a
    single term."""
    a, b = _normal(3, 3), _normal(4, 4)

    # The structures enter quaxify as inputs: build them outside the body.
    out, single = jax.jit(
        lambda a, b: quax.quaxify(lambda p, q, r: (expm(p + q), expm(r)))(
            Kronecker(a, 2.0 * jnp.eye(4)),
            Kronecker(jnp.eye(3), b),
            Kronecker(a, jnp.eye(4)),
        )
    )(a, b)
    assert isinstance(out, Kronecker) and isinstance(single, Kronecker)
    dense = np.kron(a, 2 * np.eye(4)) + np.kron(np.eye(3), b)
    np.testing.assert_allclose(_dense(out), scipy.linalg.expm(dense), atol=1e-11)
    want = scipy.linalg.expm(np.kron(a, np.eye(4)))
    np.testing.assert_allclose(_dense(single), want, atol=1e-12)


def test_expm_kronecker_sum_with_traced_identity_refuses():
    """An identity passed into `jax.jit` is not known to be one: refused, naming
    `expm` (never a wrong answer)."""
    a, b = _normal(2, 2), _normal(3, 3)
    k = quax.quaxify(lambda p, q: p + q)(
        Kronecker(a, jnp.eye(3)), Kronecker(jnp.eye(2), b)
    )
    with pytest.raises(
        StructuredMaterialisationError, match=r"jax\.scipy\.linalg\.expm"
    ):
        jax.jit(quax.quaxify(expm))(k)
    eager = quax.quaxify(expm)(k)
    want = scipy.linalg.expm(np.kron(a, np.eye(3)) + np.kron(np.eye(2), b))
    np.testing.assert_allclose(_dense(eager), want, atol=1e-12)


def test_expm_batched_and_vmap():
    """A `(*batch, n, n)` structure (`expm` vectorises its `jit`) and
    `jax.vmap`."""
    d, c = _normal(3, 5), _normal(2, 6)
    out = jax.jit(quax.quaxify(expm))(Diagonal(d))
    assert isinstance(out, Diagonal)
    np.testing.assert_allclose(out.diag, np.exp(d), atol=1e-12)
    out = quax.quaxify(expm)(Circulant(c))
    for k in range(2):
        want = scipy.linalg.expm(scipy.linalg.circulant(c[k]))
        np.testing.assert_allclose(_dense(out)[k], want, atol=1e-12)
    mapped = jax.vmap(quax.quaxify(expm))(Circulant(c))
    np.testing.assert_allclose(mapped.column, out.column, atol=1e-12)


def test_expm_gradient_matches_dense():
    """`jax.grad` w.r.t. the leaves of a function of `expm(M)`, against dense
    JAX's `expm` of the dense matrix built from the same leaves."""
    weights = _normal(6, 6)
    loss = lambda m: jnp.sum(weights * (m @ jnp.eye(6)))
    structured = quax.quaxify(lambda m: loss(expm(m)))
    c = _normal(6)
    got = jax.grad(lambda c: structured(Circulant(c)))(c)
    n = jnp.arange(6)
    dense = lambda c: c[(n[:, None] - n[None, :]) % 6]
    want = jax.grad(lambda c: loss(expm(dense(c))))(c)
    np.testing.assert_allclose(got, want, atol=1e-10)
    u = _normal(6, 2)
    got = jax.grad(lambda u: structured(LowRank(u)))(u)
    want = jax.grad(lambda u: loss(expm(u @ u.T)))(u)
    np.testing.assert_allclose(got, want, atol=1e-10)


def test_expm_refusal_names_expm_and_the_way_out():
    t = TridiagonalMatrix(_normal(4), _normal(5), _normal(4))
    with pytest.raises(StructuredMaterialisationError) as info:
        quax.quaxify(expm)(t)
    message = str(info.value)
    assert "jax.scipy.linalg.expm" in message
    assert "allow_materialise=True" in message and "enable_materialise()" in message
    with pytest.raises(
        StructuredMaterialisationError, match=r"jax\.scipy\.linalg\.expm"
    ):
        quax.quaxify(expm)(Kronecker(_normal(2, 2), _normal(2, 2)))
    # Allowed to materialise: JAX's dense Padé path.
    out = quax.quaxify(expm)(t.enable_materialise())
    np.testing.assert_allclose(out, scipy.linalg.expm(_dense(t)), atol=1e-12)


def test_a_function_named_expm_is_not_intercepted():
    @jax.jit
    def expm(m):  # not JAX's: doubles the matrix
        return m * 2

    d = jnp.asarray([1.0, 2.0])
    out = quax.quaxify(expm)(Diagonal(d))
    assert isinstance(out, Diagonal)
    np.testing.assert_allclose(out.diag, [2.0, 4.0])


@pytest.mark.parametrize("power", [0, 1, 2, 5])
def test_matrix_power_keeps_the_structure(power):
    """Positive powers keep `Diagonal`, `Circulant`, `Kronecker`, `BlockDiagonal`
    (JAX's repeated squaring through the products' closed forms); the zeroth is
    JAX's dense identity."""
    cases = [
        Diagonal(_normal(5)),
        Circulant(_normal(5)),
        Kronecker(_normal(2, 2), _normal(3, 3)),
        BlockDiagonal(_normal(2, 3, 3)),
    ]
    for m in cases:
        out = jax.jit(quax.quaxify(lambda m: jnp.linalg.matrix_power(m, power)))(m)
        want = np.linalg.matrix_power(np.asarray(_dense(m)), power)
        if power > 0:
            assert type(out) is type(m)
            out = _dense(out)
        np.testing.assert_allclose(out, want, atol=1e-12)


def test_matrix_power_negative_is_dense():
    """`matrix_power(M, -k)` inverts through `jnp.linalg.inv` (a structured solve
    with the identity as right-hand side): a dense result."""
    d = _normal(4) + 2.0
    out = quax.quaxify(lambda m: jnp.linalg.matrix_power(m, -2))(Diagonal(d))
    np.testing.assert_allclose(out, np.diag(1 / np.asarray(d) ** 2), atol=1e-12)


def test_expm_holds_no_dense_matrix():
    """The structured exponentials compile with no `(n, n)` array, n = 300."""
    n = 300
    cases = [
        Diagonal(_normal(n)),
        Circulant(_normal(n, scale=0.01)),
        BlockDiagonal(_normal(100, 3, 3)),
        LowRank(_normal(n, 4), _normal(n, 4)),
    ]
    for m in cases:
        quax.testing.assert_hlo_lacks(expm, m, shapes=[(n, n)])
