"""The conformance kit's `quaxify(vmap)` check on values built inside the function,
of a type with no batch axes (as quax-structured's `Kronecker`): `jax.vmap` returns
such a value with its leaves stacked, which the type refuses to read as a batch.
The kit compares it element by element, as `vmap(quaxify)` does: a right rule
passes, a rule wrong on one batch element fails naming it."""

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import pytest
import quax
import quax.testing as qt
from jax import lax
from quax.zero import Zero


class Outer(quax.ArrayValue):
    """The outer product `u v^T` of two vectors. It has no batch axes: with
    stacked vectors (as `jax.vmap` returns it) it refuses to give an aval or its
    dense matrix, rather than read the stack as something else."""

    u: jax.Array
    v: jax.Array

    def aval(self) -> Any:
        if jnp.ndim(self.u) != 1 or jnp.ndim(self.v) != 1:
            raise ValueError(
                f"Outer has no batch axes: its vectors have shapes {jnp.shape(self.u)}"
                f" and {jnp.shape(self.v)}"
            )
        dtype = jnp.result_type(self.u, self.v)
        return jax.core.ShapedArray((self.u.shape[0], self.v.shape[0]), dtype)

    def materialise(self) -> jax.Array:
        self.aval()
        return jnp.outer(self.u, self.v)


class Thresholded(Outer):
    """An `Outer` whose product rule is planted wrong: it drops the entries of `u`
    below 0.6 in magnitude, which the kit's arguments (entries from 1) do not have
    but its second batch copy (scaled by 0.5) does."""


@quax.register(lax.mul_p)
def _(x: Outer, y: jax.Array | float, **params: Any) -> Outer:
    del params
    if isinstance(x, Thresholded):
        u = jnp.where(jnp.abs(x.u) < 0.6, 0.0, x.u)
        return Thresholded(u * y, x.v)
    return Outer(x.u * y, x.v)


U = jnp.array([1.0, 1.1, 2.0])
V = jnp.array([1.5, -1.0, 3.0, 0.5])


def _built_inside(cls: type[Outer], zero: bool) -> Any:
    """`2 * outer(u, v)` with the `Outer` built inside from the plain vectors (and,
    where `zero`, a leafless `Zero` beside it, which `vmap(quaxify)` cannot
    batch: the kit skips that check, so `quaxify(vmap)` alone sees the batch)."""

    def fn(u: jax.Array, v: jax.Array) -> Any:
        out = quax.quaxify(lambda m: m * 2.0)(cls(u, v))
        return (out, Zero((3,), jnp.float32)) if zero else out

    def reference(u: jax.Array, v: jax.Array) -> Any:
        out = 2.0 * jnp.outer(u, v)
        return (out, jnp.zeros(3)) if zero else out

    return fn, reference


@pytest.mark.parametrize("zero", [False, True])
def test_built_inside_without_batch_axes_passes(zero):
    # Before the kit took the batch apart, `quaxify(vmap)` densified the stacked
    # `Outer` whole and failed on the type's refusal.
    fn, reference = _built_inside(Outer, zero)
    report = qt.assert_matches_dense(fn, U, V, reference=reference)
    assert report.checks["quaxify(vmap)"] == "passed"
    skipped = report.checks["vmap(quaxify)"].startswith("skipped: the output holds")
    assert skipped if zero else report.checks["vmap(quaxify)"] == "passed"


def test_built_inside_wrong_on_one_batch_element_fails():
    fn, reference = _built_inside(Thresholded, zero=True)
    # Right on the arguments themselves: eval, jit and the derivatives pass.
    qt.assert_matches_dense(fn, U, V, reference=reference, vmap=False)
    with pytest.raises(
        AssertionError, match=r"\[quaxify\(vmap\)\] batch element 1 leaf \[0\] differs"
    ):
        qt.assert_matches_dense(fn, U, V, reference=reference)
