"""`quax.testing.assert_matches_dense` on named programs whose storage order is the
positional one: values, jit, vmap, grad and jvp against plain JAX, nothing
materialised. The programs are written out, and drawn by
`quax.testing.strategies.programs`."""

import jax
import jax.numpy as jnp
import jax.random as jr
import pytest
import quax.testing
from hypothesis import given, settings, strategies as st
from quax.testing import strategies as qst
from quax_named import NamedArray


def named(shape, names, key):
    return NamedArray(jr.normal(jr.PRNGKey(key), shape), names)


PROGRAMS = {
    "mlp": lambda x, w, b: jax.nn.gelu(x @ w + b),
    "layer_norm": lambda x, w, b: (
        (x - x.mean(-1, keepdims=True))
        * jax.lax.rsqrt(
            jnp.mean((x - x.mean(-1, keepdims=True)) ** 2, -1, keepdims=True) + 1e-5
        )
        @ w
    ),
    "cumsum_slice": lambda x, w, b: jnp.cumsum(x @ w, axis=0)[1:] * b,
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_match_plain_jax(name):
    x = named((5, 3), ("batch", "feature"), 0)
    w = named((3, 4), ("feature", "hidden"), 1)
    b = named((4,), ("hidden",), 2)
    quax.testing.assert_matches_dense(PROGRAMS[name], x, w, b, out_types=NamedArray)


@settings(max_examples=4, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from([jnp.float32, jnp.float16, jnp.bfloat16]),
)
def test_attention_scores_over_shapes_and_dtypes(nq, nk, nh, dtype):
    q = named((2, nq, nh), ("batch", "seq", "head"), 3)
    k = named((2, nk, nh), ("batch", "kseq", "head"), 4)
    q, k = (NamedArray(t.array.astype(dtype), t.axes) for t in (q, k))

    def scores(q, k):
        return jax.nn.softmax(jnp.einsum("bqh,bkh->bqk", q, k), axis=-1)

    quax.testing.assert_matches_dense(
        scores, q, k, out_types=NamedArray, vmap=False, jvp=False
    )


# The operations of `quax.testing.strategies.programs` that keep the names: not
# `matmul` (an unnamed weight, which quax_named never contracts by position).
# `reshape` merges every axis into one named after them; `scan` slices the leading
# axis and stacks its outputs under it.
NAMED_OPS = (
    "sin",
    "tanh",
    "neg",
    "square",
    "scale",
    "add_const",
    "sum",
    "transpose",
    "reshape",
    "cond",
    "scan",
    "while_loop",
)


@settings(max_examples=8, deadline=None)
@given(qst.programs(ops=NAMED_OPS, max_ops=3), qst.data())
def test_random_programs_match_plain_jax(program, data):
    x = data.draw(qst.arrays(program.in_shape, program.dtype))
    names = ("a", "b", "c")[: len(program.in_shape)]
    quax.testing.assert_matches_dense(
        program,
        NamedArray(x, names),
        out_types=NamedArray if program.out_shape else jax.Array,
        grad=program.reverse_mode,
    )
