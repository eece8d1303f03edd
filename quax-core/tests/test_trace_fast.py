"""The quax trace's shortcuts give what the long way gives: an inlined `jit`
(every `jax.numpy` function) re-binds each equation with its own name stack and
context, skipping only what would set a setting to its current value; the dispatch
cache read on the hot path follows `quax.register`."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import quax
from jax import lax
from jax.experimental.compute_on import compute_on

from .helpers import Dense


x = jnp.linspace(0.5, 1.5, 6)


def inlined(fn: Any) -> Any:
    """`fn` as an inlined `jit`, as `jax.numpy` defines its functions."""
    return jax.jit(fn, inline=True)


def _sin_eqn(jaxpr: Any) -> Any:
    (eqn,) = [e for e in jaxpr.eqns if e.primitive is lax.sin_p]
    return eqn


def test_inlined_jit_keeps_name_stacks():
    # Inner name stacks extend the caller's, as when JAX inlines the `jit` itself.
    @inlined
    def body(b):
        with jax.named_scope("inner"):
            return jnp.sin(b)

    def program(a):
        with jax.named_scope("outer"):
            return body(a) * 2

    got = _sin_eqn(jax.make_jaxpr(quax.quaxify(program))(Dense(x)))
    expected = _sin_eqn(jax.make_jaxpr(program)(x))
    assert str(got.source_info.name_stack) == "outer/inner"
    assert str(got.source_info.name_stack) == str(expected.source_info.name_stack)


def test_inlined_jit_keeps_equation_context():
    # An equation staged in another context than the caller's (here a compute
    # type) is re-bound in its own; the others in the caller's, unchanged.
    @inlined
    def body(b):
        with compute_on("device_host"):
            c = jnp.sin(b)
        return jnp.cos(c)

    got = jax.make_jaxpr(quax.quaxify(body))(Dense(x))
    expected = jax.make_jaxpr(body)(x)
    types = [(e.primitive.name, e.ctx.compute_type) for e in got.eqns]
    assert types == [("sin", "device_host"), ("cos", None)]
    assert types == [(e.primitive.name, e.ctx.compute_type) for e in expected.eqns]
    assert got.eqns[1].ctx is expected.eqns[1].ctx


def test_dispatch_cache_follows_register():
    # The hot path reads the registry's cache directly: a rule registered after a
    # primitive was dispatched (and cached) on a type takes over at the next trace.
    class Late(Dense):
        pass

    f = quax.quaxify(lambda a: jnp.sin(a))
    first = f(Late(x))
    assert isinstance(first, Late)
    np.testing.assert_allclose(first.array, np.sin(np.asarray(x)), rtol=1e-6)

    @quax.register(lax.sin_p)
    def _(a: Late, **params: Any) -> Late:
        return Late(lax.sin_p.bind(a.array, **params) + 1)

    second = f(Late(x))
    np.testing.assert_allclose(second.array, np.sin(np.asarray(x)) + 1, rtol=1e-6)


def test_materialisation_report_through_inlined_jit():
    # With a report open, rules run through the checked path: a materialisation
    # inside a `jax.numpy` function is attributed to its primitive.
    class Opaque(quax.ArrayValue):
        array: jax.Array

        def aval(self) -> jax.core.ShapedArray:
            return jax.core.ShapedArray(self.array.shape, self.array.dtype)

        def materialise(self) -> jax.Array:
            return self.array

    with quax.track_materialisation() as report:
        out = jax.jit(quax.quaxify(lambda a: jnp.sin(a)))(Opaque(x))
    np.testing.assert_allclose(out, np.sin(np.asarray(x)), rtol=1e-6)
    assert report.counts == {("sin", Opaque.__qualname__): 1}
