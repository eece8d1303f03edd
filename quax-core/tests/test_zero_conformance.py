"""Symbolic zeros through the conformance kit `quax.testing`: zero propagation stays
symbolic (the outputs are `Zero`s where the result is known to be zero), everything
matches plain JAX on `jnp.zeros`, and the compiled programs hold no zero array."""

import jax
import jax.numpy as jnp
import pytest
import quax.testing as qt
from jax import lax
from quax.zero import Zero


z = Zero((3, 4), jnp.float32)
# Positive: a zero times it is `+0.` everywhere, so the eager products stay symbolic
# (a zero times elements of both signs is computed densely, to give each its sign).
x = jnp.linspace(0.1, 1.0, 12).reshape(3, 4)
w = jnp.linspace(0.5, 2.0, 20).reshape(4, 5)


def test_zero_propagation():
    def fn(z, x, w):
        return z * x, z @ w, jnp.sum(-z, axis=0), jnp.reshape(z, (12,)), z + x

    report = qt.assert_matches_dense(
        fn, z, x, w, out_types=[Zero, Zero, Zero, Zero, jax.Array]
    )
    # `x` and `w` are batched and differentiated; the leafless zero is not, and
    # zeros in the output can be batched only inside quaxify.
    skipped = report.checks.pop("vmap(quaxify)")
    assert skipped.startswith("skipped: the output holds a Zero without array leaves")
    assert set(report.checks.values()) == {"passed"}


def test_zero_only_arguments():
    report = qt.assert_matches_dense(
        lambda z: jnp.transpose(2.0 * z), z, out_types=Zero
    )
    assert report.checks["vmap"].startswith("skipped: no argument has an array leaf")
    assert report.checks["grad"].startswith("skipped: no argument has a floating")


def test_zero_through_control_flow():
    def fn(z, x):
        # Both branches give `-0.`: branches of different signs cannot join as a
        # `Zero` (see test_zero_signs.py).
        y = lax.cond(jnp.sum(x) > 0, lambda a: -(a * x), lambda a: -a, z)
        return lax.fori_loop(0, 3, lambda i, c: c * 2.0, y)

    report = qt.assert_matches_dense(fn, z, x, out_types=Zero)
    assert report.checks["quaxify(vmap)"] == "passed"


def test_no_zero_array_compiled():
    # Not even `x`: the product with a zero does not depend on it.
    qt.assert_hlo_lacks(lambda z, x, w: (z * x) @ w + 1.0, z, x, w, shapes=[(3, 4)])
    # Where the zero has to become an array, the kit finds it.
    with pytest.raises(AssertionError, match=r"f32\[3, 4\]"):
        qt.assert_hlo_lacks(lambda z, w: jnp.exp(z) @ w, z, w, shapes=[(3, 4)])
