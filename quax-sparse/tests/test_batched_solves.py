"""Direct solves with a `BCOO` that has batch dimensions (a batch of matrices):
`jnp.linalg.solve`, `slogdet`, `cho_solve` and `lu_factor` factor and solve each
member (the host's callback loops over the batch), with gradients with respect to
the right-hand sides and the stored values, against dense batched JAX in float64,
on both solver routes. float64 is the subject (skipped on a backend without it, a
TPU): `test_solve_tangents.py` solves a batch in float32 on every backend."""

import re

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_sparse
from jax.extend.core import primitives
from jax.interpreters import ad
from quax_sparse import BCOO, _superlu
from sparse_helpers import needs_spsolve


pytestmark = [pytest.mark.usefixtures("x64"), pytest.mark.float64]

ROUTES = ["superlu", pytest.param("cusolver", marks=needs_spsolve)]


def _batch(shape=(3,), n: int = 7, seed: int = 0, spd: bool = False):
    """Dense matrices of `shape + (n, n)` (different patterns, one member's
    determinant negative) and the `BCOO` with `len(shape)` batch dimensions."""
    rng = np.random.default_rng(seed)
    m = np.where(rng.random((*shape, n, n)) < 0.3, rng.normal(size=(*shape, n, n)), 0)
    dense = m @ np.swapaxes(m, -1, -2) + n * np.eye(n) if spd else m + 4 * np.eye(n)
    if not spd:
        dense.reshape(-1, n, n)[0] = dense.reshape(-1, n, n)[0][::-1]
    a = BCOO.fromdense(jnp.asarray(dense), nse=n * n, n_batch=len(shape))
    return dense, a


def _at_pattern(grad, a: BCOO) -> np.ndarray:
    """A dense batched gradient read at each member's stored entries."""
    n = a.shape[-1]
    grad, indices = np.asarray(grad), np.asarray(a.indices)
    out = np.zeros(a.data.shape)
    for b in np.ndindex(*a.data.shape[:-1]):
        keep = indices[b][:, 0] < n
        rows, cols = indices[b][keep].T
        out[b][keep] = grad[b][rows, cols]
    return out


@pytest.mark.parametrize("route", ROUTES)
def test_batched_solve_matches_dense(route):
    dense, a = _batch()
    b = np.random.default_rng(1).normal(size=(3, 7, 2))
    with quax_sparse.solver_route(route):
        got = jax.jit(quax.quaxify(jnp.linalg.solve))(a, b)
        got_vector = quax.quaxify(
            lambda a, b: jnp.linalg.solve(a, b[..., None])[..., 0]
        )(a, b[..., 0])
    np.testing.assert_allclose(got, np.linalg.solve(dense, b), rtol=1e-12)
    want = np.linalg.solve(dense, b[..., :1])[..., 0]
    np.testing.assert_allclose(got_vector, want, rtol=1e-12)


@pytest.mark.parametrize("route", ROUTES)
def test_batched_solve_gradients(route):
    dense, a = _batch(seed=2)
    b = np.random.default_rng(3).normal(size=(3, 7, 2))
    w = np.random.default_rng(4).normal(size=(3, 7, 2))

    def loss(data, b):
        x = quax.quaxify(jnp.linalg.solve)(BCOO(data, a.indices, a.shape), b)
        return jnp.sum(x * w)

    def dense_loss(m, b):
        return jnp.sum(jnp.linalg.solve(m, b) * w)

    with quax_sparse.solver_route(route):
        g_data, g_b = jax.jit(jax.grad(loss, argnums=(0, 1)))(a.data, b)
    want_m, want_b = jax.grad(dense_loss, argnums=(0, 1))(jnp.asarray(dense), b)
    np.testing.assert_allclose(g_data, _at_pattern(want_m, a), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(g_b, want_b, rtol=1e-10)


def test_batched_slogdet_det_and_gradients():
    dense, a = _batch(shape=(2, 2), seed=5)
    sign, logdet = jax.jit(quax.quaxify(jnp.linalg.slogdet))(a)
    want_sign, want_logdet = np.linalg.slogdet(dense)
    np.testing.assert_array_equal(sign, want_sign)
    assert (want_sign < 0).any()
    np.testing.assert_allclose(logdet, want_logdet, rtol=1e-12)
    det = quax.quaxify(jnp.linalg.det)(a)
    np.testing.assert_allclose(det, np.linalg.det(dense), rtol=1e-10)

    def loss(data):
        a_ = BCOO(data, a.indices, a.shape)
        return jnp.sum(quax.quaxify(jnp.linalg.slogdet)(a_)[1])

    want = jax.grad(lambda m: jnp.sum(jnp.linalg.slogdet(m)[1]))(jnp.asarray(dense))
    np.testing.assert_allclose(
        jax.jit(jax.grad(loss))(a.data), _at_pattern(want, a), rtol=1e-10, atol=1e-14
    )


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("lower", [True, False])
def test_batched_cho_solve(route, lower):
    dense, a = _batch(spd=True, seed=6)
    b = np.random.default_rng(7).normal(size=(3, 7))

    def f(a, b):
        return jsl.cho_solve(jsl.cho_factor(a, lower=lower), b[..., None])[..., 0]

    with quax_sparse.solver_route(route):
        got = jax.jit(quax.quaxify(f))(a, b)
    want = np.linalg.solve(dense, b[..., None])[..., 0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("route", ROUTES)
def test_gradient_of_vmap_matches_dense(route, monkeypatch):
    """`jax.grad` of `vmap` over the stored values of two matrices (one pattern):
    `slogdet`, `det` and `solve`, against dense JAX, with JAX's `stop_gradient`
    as JAX has it (no transpose rule: lineax, which quax-units imports, registers
    one, which hid a `Toeplitz` failure of this order)."""
    monkeypatch.delitem(
        ad.primitive_transposes, primitives.stop_gradient_p, raising=False
    )
    _, a = _batch(shape=(), seed=12)
    datas = np.stack([a.data, 1.1 * a.data])
    bs = np.random.default_rng(13).normal(size=(2, 7, 2))
    rows, cols = a.indices[:, 0], a.indices[:, 1]

    def loss(m, b):
        _, logdet = jnp.linalg.slogdet(m)
        return logdet + jnp.linalg.det(m) / 100 + jnp.sum(jnp.linalg.solve(m, b))

    def ours(data, b):
        return quax.quaxify(loss)(BCOO(data, a.indices, a.shape), b)

    def dense_loss(data, b):
        return loss(jnp.zeros((7, 7), data.dtype).at[rows, cols].add(data), b)

    def grad_of_vmap(f):
        return jax.grad(lambda d, b: jnp.sum(jax.vmap(f)(d, b)), argnums=(0, 1))

    with quax_sparse.solver_route(route):
        got = jax.jit(grad_of_vmap(ours))(datas, bs)
    want = grad_of_vmap(dense_loss)(datas, bs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_batched_factor_is_reused_and_checks_its_right_hand_side(monkeypatch):
    dense, a = _batch()
    calls = []
    host_factor = _superlu._host_factor

    def counting(data, indices, **kwargs):
        calls.append(np.shape(data)[:-1])
        return host_factor(data, indices, **kwargs)

    monkeypatch.setattr(_superlu, "_host_factor", counting)
    lu = quax_sparse.lu_factor(a)
    assert lu.batch_shape == (3,) and calls == [(3,)]  # one callback, 3 members
    b = np.random.default_rng(8).normal(size=(3, 7))
    for trans, op in [(0, dense), (1, np.swapaxes(dense, -1, -2))]:
        want = np.linalg.solve(op, b[..., None])[..., 0]
        np.testing.assert_allclose(lu.solve(b, trans), want, rtol=1e-12)
    assert len(calls) == 1  # the solves reused the factorisations
    with pytest.raises(ValueError, match=r"\(3, 7\) or \(3, 7, 'k'\).*got \(7,\)"):
        lu.solve(b[0])


def test_vmap_over_a_batched_matrix_and_right_hand_sides():
    dense, a = _batch(seed=9)
    bs = np.random.default_rng(10).normal(size=(4, 3, 7, 1))
    f = jax.vmap(quax.quaxify(jnp.linalg.solve), in_axes=(None, 0))
    got = jax.jit(f)(a, bs)
    np.testing.assert_allclose(got, np.linalg.solve(dense, bs), rtol=1e-12)


def test_batched_gradient_program_holds_no_dense_matrix():
    n = 40
    _, a = _batch(shape=(2,), n=n, seed=11)
    b = jnp.ones((2, n, 1))

    def loss(data, b):
        a_ = BCOO(data, a.indices, a.shape)
        x = quax.quaxify(jnp.linalg.solve)(a_, b)
        return jnp.sum(x) + jnp.sum(quax.quaxify(jnp.linalg.slogdet)(a_)[1])

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(a.data, b).compile().as_text()
    assert hlo is not None
    assert not re.search(rf"\[(2,)?{n},{n}\]", hlo)
