"""`dot_general` with a LoraArray on either side, against the dense computation."""

import re

import equinox as eqx
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from hypothesis import given, settings
from jax import lax
from lora_helpers import normal


def _lora(shape, rank, seed, *, batch_ndim=None, alpha=None, dtype=jnp.float32):
    # `a` is `LoraArray`'s own initialisation, from the key, as users have it.
    lora = quax_lora.LoraArray(
        normal([seed, 0], shape, dtype),
        rank=rank,
        scale=0.5,
        alpha=alpha,
        batch_ndim=batch_ndim,
        key=jr.PRNGKey(seed),
    )
    b = 0.5 * normal([seed, 1], lora.b.shape, dtype)
    return eqx.tree_at(lambda lr: lr.b, lora, b)


def _dense(lora):
    return quax_lora.merge(lora)


def _forms_ab(jaxpr, lora):
    """Whether any dot_general multiplies `a` by `b` directly."""
    invars = jaxpr.jaxpr.invars
    a_var, b_var = invars[1], invars[2]
    for eqn in jaxpr.jaxpr.eqns:
        if eqn.primitive is lax.dot_general_p and {a_var, b_var} <= set(eqn.invars):
            return True
    return False


@st.composite
def _problems(draw):
    nb = draw(st.integers(0, 2))
    n_rest = 1 if draw(st.booleans()) else draw(st.integers(1, 2))
    dim = st.integers(1, 4)
    shape = tuple(draw(dim) for _ in range(nb + 1 + n_rest))
    # LoraArray refuses a rank above min(n, m) of the matrices it adapts.
    rank = draw(st.integers(1, min(3, shape[nb], int(np.prod(shape[nb + 1 :])))))
    roles = [draw(st.sampled_from(["contract", "batch", "free"])) for _ in shape]
    x_dims = []  # (size, role, lora_axis)
    for i, role in enumerate(roles):
        if role != "free":
            x_dims.append((shape[i], role, i))
    for _ in range(draw(st.integers(0, 2))):
        x_dims.append((draw(dim), "free", None))
    order = draw(st.permutations(range(len(x_dims))))
    x_dims = [x_dims[k] for k in order]
    x_shape = tuple(size for size, _, _ in x_dims)
    # Pair order in the dimension numbers is arbitrary too.
    contract = draw(
        st.permutations(
            [(i, j) for j, (_, r, i) in enumerate(x_dims) if r == "contract"]
        )
    )
    batch = draw(
        st.permutations([(i, j) for j, (_, r, i) in enumerate(x_dims) if r == "batch"])
    )
    lora_is_lhs = draw(st.booleans())
    alpha = draw(st.sampled_from([None, 2.0]))
    seed = draw(st.integers(0, 2**16))
    return shape, nb, rank, x_shape, contract, batch, lora_is_lhs, alpha, seed


@settings(max_examples=10, deadline=None)
@given(_problems())
def test_dot_general_every_layout(problem):
    shape, nb, rank, x_shape, contract, batch, lora_is_lhs, alpha, seed = problem
    lora = _lora(shape, rank, seed, batch_ndim=nb, alpha=alpha)
    x = normal([seed, 2], x_shape)
    l_c, x_c = (tuple(p) for p in zip(*contract, strict=True)) if contract else ((), ())
    l_b, x_b = (tuple(p) for p in zip(*batch, strict=True)) if batch else ((), ())
    if lora_is_lhs:
        dn = ((l_c, x_c), (l_b, x_b))
        fn = lambda lr, v: lax.dot_general(lr, v, dn)
        args = (lora, x)
        expected = lax.dot_general(_dense(lora), x, dn)
    else:
        dn = ((x_c, l_c), (x_b, l_b))
        fn = lambda lr, v: lax.dot_general(v, lr, dn)
        args = (lora, x)
        expected = lax.dot_general(x, _dense(lora), dn)
    out = quax.quaxify(fn)(*args)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    jaxpr = jax.make_jaxpr(quax.quaxify(fn))(*args)
    assert not _forms_ab(jaxpr, lora)


@pytest.mark.parametrize(
    "expr",
    [
        lambda w, x: w @ x[0],  # matrix-vector
        lambda w, x: w @ x.T,  # matrix-matrix
        lambda w, x: x @ w.T,  # the usual `x @ W^T` layout
        lambda w, x: (
            jnp.tanh(x @ x.T[:, :1] * jnp.ones((1, 12), x.dtype)) @ w
        ),  # LoRA on the right
        lambda w, x: jnp.einsum("nm,bm->bn", w, x),
        lambda w, x: jnp.dot(jnp.ones(12, x.dtype), w),
        lambda w, x: jnp.tensordot(w, x.T, axes=1),
    ],
)
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)])
def test_matmul_forms(expr, dtype, tol):
    lora = _lora((12, 10), 3, 0, dtype=dtype, alpha=6.0)
    x = normal(1, (5, 10), dtype)
    out = quax.quaxify(expr)(lora, x)
    expected = expr(_dense(lora), x)
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(
        np.asarray(out, np.float32),
        np.asarray(expected, np.float32),
        rtol=tol,
        atol=tol,
    )


def test_factored_cost():
    """`(w + a b) x` is `w x + a (b x)`: the jaxpr has three matmuls, none (n, m)."""
    lora = _lora((64, 48), 2, 0)
    x = jnp.ones((48,))
    jaxpr = jax.make_jaxpr(quax.quaxify(lambda lr, v: lr @ v))(lora, x)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive is lax.dot_general_p]
    assert [d.outvars[0].aval.shape for d in dots] == [(64,), (2,), (64,)]


def test_lora_times_lora():
    l1 = _lora((6, 5), 2, 0)
    l2 = _lora((5, 4), 3, 1)
    out = quax.quaxify(lambda x, y: x @ y)(l1, l2)
    np.testing.assert_allclose(out, _dense(l1) @ _dense(l2), rtol=1e-5, atol=1e-5)


def test_preferred_element_type():
    lora = _lora((6, 5), 2, 0, dtype=jnp.bfloat16)
    x = jnp.ones((5,), jnp.bfloat16)
    fn = lambda lr, v: lax.dot_general(
        lr, v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )
    out = quax.quaxify(fn)(lora, x)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, fn(_dense(lora), x), rtol=2e-2, atol=2e-2)


def _optimized_hlo(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    assert text is not None
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    return [ln for ln in text.splitlines() if ln.startswith(("%", "ENTRY", " ", "}"))]


@pytest.mark.parametrize("batch", [1, 16])
def test_same_program_as_hand_written(batch):
    """A LoRA layer through quaxify compiles to the same optimized HLO as the
    hand-written `w x + s a (b x)` (the benchmark's claim, without its noise)."""
    lora = _lora((48, 40), 4, 0, alpha=8.0)
    xs = normal(1, (batch, 40))
    quaxed = quax.quaxify(lambda lr, x: jax.vmap(lambda v: lr @ v)(x))
    hand = lambda lr, x: jax.vmap(
        lambda v: lr.w @ v + (lr.scaling * lr.a) @ (lr.b @ v)
    )(x)
    assert _optimized_hlo(quaxed, lora, xs) == _optimized_hlo(hand, lora, xs)
