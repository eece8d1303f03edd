"""The quax trace's shortcuts give what the long way gives: an inlined `jit`
(every `jax.numpy` function) re-binds each equation with its own name stack and
context, skipping only what would set a setting to its current value, and `bind`'s
checks only where they hold; the dispatch cache read on the hot path follows
`quax.register`; a compiled eager program's outputs compute their avals when read;
a finished trace is invalidated."""

from typing import Any, ClassVar

import jax
import jax.core
import jax.extend.core.primitives
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jax.experimental.compute_on import compute_on
from quax._foundation._evaluation import binds_directly
from quax._transform._interpreter import _steps

from .helpers import Dense, compiles_eager_programs


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


def test_inlined_jit_binds_as_bind_does():
    # Equations on tracers skip `bind`'s checks only for primitives that bind as
    # `Primitive.bind` does; a custom derivative (`jax.nn.relu`), constants and a
    # plain traced input go through `bind`, and the program is JAX's.
    assert binds_directly(lax.sin_p) and binds_directly(lax.mul_p)
    assert not binds_directly(jax.extend.core.primitives.custom_jvp_call_p)

    @inlined
    def body(b, p):
        return jax.nn.relu(jnp.sin(b) * p) + 1.0

    def program(a, p):
        return body(a, p) * 2

    p = jnp.full(6, 3.0)
    got = jax.make_jaxpr(quax.quaxify(program))(Dense(x), p)
    expected = jax.make_jaxpr(program)(x, p)
    names = [e.primitive.name for e in expected.eqns]
    assert [e.primitive.name for e in got.eqns] == names
    assert "custom_jvp_call" in names
    out = jax.jit(quax.quaxify(program))(Dense(x), p)
    np.testing.assert_array_equal(out.array, jax.jit(program)(x, p))


def test_equation_steps_are_kept_per_jaxpr():
    # Each jaxpr's equations are read once; a second evaluation gives the same
    # program, and equations on constants are still computed at trace time.
    @inlined
    def body(b):
        return jnp.sin(b) * jnp.full(6, 2.0)

    program = quax.quaxify(body)
    first = jax.make_jaxpr(program)(Dense(x))
    steps = dict(_steps._data)
    second = jax.make_jaxpr(program)(Dense(x))
    assert str(first) == str(second)
    assert dict(_steps._data) == steps
    assert [e.primitive.name for e in first.eqns] == ["sin", "mul"]
    np.testing.assert_allclose(
        program(Dense(x)).array, np.sin(np.asarray(x)) * 2, rtol=1e-6
    )


class _CountedAval(Dense):
    calls: ClassVar[list[int]] = [0]

    def aval(self) -> Any:
        _CountedAval.calls[0] += 1
        return super().aval()


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_compiled_eager_output_reads_its_aval_when_asked():
    # A compiled eager program's output is wrapped without its aval, which is
    # computed (once) when JAX or the user first reads it.
    seen: dict[str, int] = {}

    def program(a, b):
        before = _CountedAval.calls[0]
        c = a * b
        seen["wrap"] = _CountedAval.calls[0] - before
        seen["shape"] = c.shape
        seen["read"] = _CountedAval.calls[0] - before
        assert c.aval is c.aval
        seen["again"] = _CountedAval.calls[0] - before
        return c + a

    previous = quax.set_eager_compilation(True)
    try:
        a, b = _CountedAval(x), _CountedAval(2 * x)
        # The first calls run equation by equation (and trace the program): the
        # third runs it compiled, whichever call compiles it.
        for _ in range(3):
            out = quax.quaxify(program)(a, b)
    finally:
        quax.set_eager_compilation(previous)
    assert seen == {"wrap": 0, "shape": (6,), "read": 1, "again": 1}
    xs = np.asarray(x)
    np.testing.assert_allclose(out.array, 2 * xs**2 + xs, rtol=1e-6)


def test_a_finished_trace_is_invalidated_without_leak_checks():
    # Without JAX's leak check (which reports leaks), a tracer that escaped its
    # finished trace is still refused when used.
    leaked: list[Any] = []

    def keep(a):
        leaked.append(a)
        return a

    with jax.check_tracer_leaks(False):
        quax.quaxify(keep)(Dense(x))
    with pytest.raises(jax.errors.UnexpectedTracerError):
        jnp.sin(leaked.pop())
