"""`quax.plugins.jit_context`: a setting that JAX's caches (and quax's) key on, as
one made with `jax.make_user_context`, but whose making adds nothing to JAX's trace
context, so that a family that makes one as it loads inside a `jax.jit` does not
change that `jit`'s cache key between its first call and the next."""

import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax._compat import trace_context
from quax._dispatch import _plugins
from quax.plugins import jit_context


def test_values_nest_per_context_and_come_back() -> None:
    ctx, other = jit_context("a"), jit_context(0)
    assert (ctx.value, other.value) == ("a", 0)
    with ctx("b"):
        assert (ctx.value, other.value) == ("b", 0)
        with other(1):
            with ctx("c"):
                assert (ctx.value, other.value) == ("c", 1)
            assert (ctx.value, other.value) == ("b", 1)
        assert (ctx.value, other.value) == ("b", 0)
    assert ctx.value == "a"
    with pytest.raises(RuntimeError, match="inside"), ctx("d"):
        raise RuntimeError("inside")
    assert ctx.value == "a"


def test_a_block_keeps_the_other_values_it_is_entered_under() -> None:
    ctx, other = jit_context(0), jit_context(0)
    block = ctx(1)  # made before `other` is set, entered after
    with other(2), block:
        assert (ctx.value, other.value) == (1, 2)
    assert (ctx.value, other.value) == (0, 0)


def test_making_one_changes_no_trace_context() -> None:
    before = trace_context()
    ctx = jit_context(None)
    assert trace_context() == before
    with ctx(None):  # the default: the key outside any block
        assert trace_context() == before
    with ctx("set"):
        assert trace_context() != before
    assert trace_context() == before


def test_a_jit_is_traced_again_for_each_value() -> None:
    ctx = jit_context(None)
    traces: list[Any] = []

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        traces.append(ctx.value)
        # `1` and `True` are equal, as JAX compares its keys: the type tells them
        # apart here, so a trace made under one must not serve the other.
        factor = {type(None): 1.0, int: 2.0, bool: 3.0}[type(ctx.value)]
        return x * factor

    x = jnp.float32(1)
    outs = [f(x)]
    with ctx(1):
        outs += [f(x), f(x)]
    with ctx(True):
        outs.append(f(x))
    with ctx(None):
        outs.append(f(x))
    outs.append(f(x))
    np.testing.assert_array_equal(np.array(outs), [1, 2, 2, 3, 1, 1])
    assert traces == [None, 1, True]


def test_the_value_is_per_thread() -> None:
    ctx = jit_context("default")
    seen: list[str] = []
    with ctx("this thread"):
        thread = threading.Thread(target=lambda: seen.append(ctx.value))
        thread.start()
        thread.join()
        assert ctx.value == "this thread"
    assert seen == ["default"]


def test_unhashable_values_are_refused() -> None:
    with pytest.raises(TypeError, match="unhashable"):
        jit_context([])
    ctx = jit_context(())
    with pytest.raises(TypeError, match="unhashable"):
        ctx([1])
    assert ctx.value == ()


class _Marked(quax.ArrayValue):
    """An array whose `neg` rule returns its negation times the current value of
    `_factor`."""

    array: jax.Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> jax.Array:
        return self.array


_factor = jit_context(1.0)


@quax.register(jax.lax.neg_p)
def _(x: _Marked) -> jax.Array:
    return -x.array * _factor.value


def test_quax_caches_key_on_it() -> None:
    # `jnp.negative` is a library function: eagerly, a compiled program kept per key;
    # under `jax.jit`, a replayed recording of the rule.
    x = _Marked(jnp.arange(3.0))
    eager = quax.quaxify(jnp.negative)
    jitted = jax.jit(quax.quaxify(jnp.negative))
    for fn in (eager, jitted):
        np.testing.assert_array_equal(fn(x), [0.0, -1.0, -2.0])
        with _factor(10.0):
            np.testing.assert_array_equal(fn(x), [0.0, -10.0, -20.0])
        np.testing.assert_array_equal(fn(x), [0.0, -1.0, -2.0])


def test_a_family_that_makes_one_as_it_loads_inside_a_jit() -> None:
    made: list[Any] = []

    class MakesOne:
        @quax.hookspecs.hookimpl
        def quax_register_rules(self) -> None:
            made.append(jit_context("made while loading"))

    traces = []

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        traces.append(None)
        if not made:
            _plugins.load_in_process("makes_a_jit_context", MakesOne())
        return x + 1

    try:
        outs = [f(jnp.float32(1)) for _ in range(3)]
    finally:
        _plugins.manager().unregister(name="makes_a_jit_context")
    assert [float(o) for o in outs] == [2.0, 2.0, 2.0]
    assert len(made) == 1 and made[0].value == "made while loading"
    assert len(traces) == 1  # the later calls hit the first call's entry
