"""The compiled program of named code is the positional program: names cost nothing
at run time, and aligning by name adds no array beyond what the positional program
holds (no transposed copy where the orders agree)."""

from collections import Counter

import jax
import jax.numpy as jnp
import jax.random as jr
import quax.testing
from quax_named import NamedArray


def block(p, x):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    h = h - h.mean(-1, keepdims=True)
    return jax.nn.softmax(h @ p["w2"], axis=-1)


def instructions(hlo):
    return Counter((i.op, i.arrays) for i in quax.testing.hlo_instructions(hlo))


def test_named_mlp_compiles_to_the_positional_program():
    k = jr.split(jr.PRNGKey(0), 3)
    plain = {
        "w1": jr.normal(k[0], (16, 32)),
        "b1": jnp.zeros(32),
        "w2": jr.normal(k[1], (32, 8)),
    }
    axes = {"w1": ("feature", "hidden"), "b1": ("hidden",), "w2": ("hidden", "out")}
    named = {n: NamedArray(plain[n], axes[n]) for n in plain}
    x = jr.normal(k[2], (64, 16))
    named_hlo = quax.testing.compiled_hlo(
        lambda p, x: block(p, x), named, NamedArray(x, ("batch", "feature"))
    )
    plain_hlo = jax.jit(block).lower(plain, x).compile().as_text()
    assert plain_hlo is not None
    assert instructions(named_hlo) == instructions(plain_hlo)


def test_alignment_by_name_costs_what_the_hand_transposition_costs():
    # (a, b) + (b, a) by name compiles to the hand-written `x + y.T`.
    x, y = jr.normal(jr.PRNGKey(0), (64, 64)), jr.normal(jr.PRNGKey(1), (64, 64))
    named_hlo = quax.testing.compiled_hlo(
        lambda x, y: jnp.exp(x + y),
        NamedArray(x, ("a", "b")),
        NamedArray(y, ("b", "a")),
    )
    plain_hlo = jax.jit(lambda x, y: jnp.exp(x + y.T)).lower(x, y).compile().as_text()
    assert plain_hlo is not None
    assert instructions(named_hlo) == instructions(plain_hlo)
