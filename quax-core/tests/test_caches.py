"""Quax's caches (compiled eager programs, replayed recordings, nested `jit`
bodies, the dispatch cache) may only return what running the rules would return.
Each test here plants a case where a cache key once missed something the rules
see, and checks every call against the answer of the rules run afresh."""

import sys
import threading
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._control_flow as _control_flow
import quax._eager as quax_eager
import quax._registry as _registry
from jax import lax
from jaxtyping import Array, ArrayLike
from quax.zero import Zero, ieee_strict


@pytest.fixture(autouse=True)
def _compiled() -> Any:
    """Eager compilation on (the default), whatever the session's setting."""
    previous = quax.set_eager_compilation(True)
    yield
    quax.set_eager_compilation(previous)


class Wrapped(quax.ArrayValue):
    """An array in a wrapper, which materialises to it."""

    array: eqx.AbstractVar[Array]

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> Array:
        return self.array


# Aliasing between inputs --------------------------------------------------------------


class Twin(Wrapped):
    """An array, and how the last sum made it: its `add` rule gives a closed form
    (`2 * x`, kind "twice") for one value added to itself, or for two values on
    one array, as a structured family does for `K + K`."""

    array: Array
    kind: str = eqx.field(static=True, default="given")


@quax.register(lax.add_p)
def _(x: Twin, y: Twin, **params: Any) -> Twin:
    if x is y:
        return Twin(2 * x.array, "same value")
    if x.array is y.array:
        return Twin(2 * x.array, "same array")
    return Twin(lax.add_p.bind(x.array, y.array, **params), "sum")


A = jnp.array([1.0, 2.0, 3.0])


def test_aliased_inputs_keyed() -> None:
    add = quax.quaxify(lambda a, b: a + b)
    t, u, v = Twin(A), Twin(A + 0), Twin(A)  # `v` shares `t`'s array only
    for _ in range(3):  # by equation, compiled, replayed: all keyed alike
        assert add(t, u).kind == "sum"
    for _ in range(3):
        assert add(t, t).kind == "same value"
        assert add(t, v).kind == "same array"
        assert add(t, u).kind == "sum"
        assert add(v, t).kind == "same array"
    np.testing.assert_array_equal(add(t, t).array, [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(add(t, u).array, [2.0, 4.0, 6.0])


def test_aliased_inputs_of_a_nested_jit() -> None:
    """A `jit`'s body sees each argument as its own tracer (as in JAX), however
    often it is cached: every call answers as the rules do afresh."""
    add = quax.quaxify(jax.jit(lambda a, b: a + b))
    t, u, v = Twin(A), Twin(A + 0), Twin(A)
    pairs = [(t, u), (t, t), (t, v)]
    with quax.track_materialisation():  # no compiled program, no replay
        fresh = [add(*pair).kind for pair in pairs]
    for _ in range(3):
        assert [add(t, u).kind for _ in range(2)] == [fresh[0]] * 2
        assert [add(*pair).kind for pair in pairs] == fresh


# A nested `jit` called eagerly on fresh plain arrays ----------------------------------


class Metres(Wrapped):
    """An array with a static unit exponent: `pow` by a known exponent raises it,
    reading the exponent through `quax.known_constant` as a units family does."""

    array: Array
    power: float = eqx.field(static=True, default=1.0)


@quax.register(lax.mul_p)
def _(x: Metres, y: ArrayLike, **params: Any) -> Metres:
    return Metres(lax.mul_p.bind(x.array, y, **params), x.power)


@quax.register(lax.add_p)
def _(x: Metres, y: Metres, **params: Any) -> Metres:
    assert x.power == y.power
    return Metres(lax.add_p.bind(x.array, y.array, **params), x.power)


@quax.register(lax.pow_p)
def _(x: Metres, y: ArrayLike, **params: Any) -> Metres:
    known = quax.known_constant(y)
    if known is None or np.unique(known).size != 1:
        raise ValueError("the exponent of a `Metres` must be known, and one number")
    power = x.power * float(known.flat[0])
    return Metres(lax.pow_p.bind(x.array, y, **params), power)


def test_nested_jit_on_fresh_arrays_compiles_once() -> None:
    inner = jax.jit(lambda a, c: a * c + a)
    g = quax.quaxify(lambda a, c: inner(a, c))
    before = len(_control_flow._nested)
    for i in range(50):
        c = jnp.full(100, float(i))  # a fresh array each call
        out = g(Metres(jnp.arange(100.0)), c)
        np.testing.assert_array_equal(out.array, jnp.arange(100.0) * (i + 1))
    assert len(_control_flow._nested) - before == 1


def test_nested_jit_reading_a_plain_argument_keys_it_by_value() -> None:
    inner = jax.jit(lambda a, c: a**c)
    g = quax.quaxify(lambda a, c: inner(a, c))
    x = jnp.linspace(1.0, 2.0, 100)
    for c in [2.0, 3.0, 2.0, 3.0]:
        # Larger than a constant kept by value: passed in, until the rule asks.
        exponent = jnp.full(100, c)
        out = g(Metres(x), exponent)
        assert out.power == c
        np.testing.assert_allclose(out.array, x**c, rtol=1e-6)
    for c in [2.0, 3.0]:  # small ones stay constants
        assert g(Metres(x), c).power == c


def test_nested_jit_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_control_flow._nested, "bound", 4)
    inner = jax.jit(lambda a, c: a * c)
    g = quax.quaxify(lambda a, c: inner(a, c))
    for n in range(1, 10):  # a shape each: a program each
        out = g(Metres(jnp.ones(n)), jnp.full(n, 2.0))
        np.testing.assert_array_equal(out.array, jnp.full(n, 2.0))
        assert len(_control_flow._nested) <= 4


# Registering while another thread dispatches ------------------------------------------


def _probe_type() -> type:
    """A fresh value type with a `sin` rule answering "old" (dispatch never saw it)."""

    class Probe(Wrapped):
        array: Array
        tag: str = eqx.field(static=True, default="given")

    @quax.register(lax.sin_p)
    def _(x: Probe, **params: Any) -> Probe:
        return Probe(lax.sin_p.bind(x.array, **params), "old")

    return Probe


def _register_new(probe: type) -> None:
    @quax.register(lax.sin_p)  # the same signature and owner: replaces "old"
    def _(x: probe, **params: Any) -> probe:  # type: ignore[valid-type]
        return probe(lax.sin_p.bind(x.array, **params), "new")


def test_rule_registered_during_a_resolution_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = _probe_type()
    original = _registry._warn_if_foreign

    def resolving(*args: Any) -> None:
        # Between the resolution and its caching: another thread registers.
        monkeypatch.setattr(_registry, "_warn_if_foreign", original)
        _register_new(probe)
        original(*args)

    monkeypatch.setattr(_registry, "_warn_if_foreign", resolving)
    sin = quax.quaxify(lax.sin)
    assert sin(probe(A)).tag == "old"  # resolved before the registration
    for _ in range(2):
        out = sin(probe(A))
        assert out.tag == "new"
        np.testing.assert_allclose(out.array, np.sin(np.asarray(A)), rtol=1e-6)


def test_rule_registered_while_threads_dispatch_is_used() -> None:
    sin = quax.quaxify(lax.sin)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(10):
            probe = _probe_type()
            started = threading.Barrier(5)

            def dispatch(probe: type = probe, started: Any = started) -> None:
                started.wait()
                for _ in range(20):
                    sin(probe(A))

            threads = [threading.Thread(target=dispatch) for _ in range(4)]
            for t in threads:
                t.start()
            started.wait()
            _register_new(probe)
            for t in threads:
                t.join()
            assert sin(probe(A)).tag == "new"
    finally:
        sys.setswitchinterval(interval)


# Concurrent eager calls ---------------------------------------------------------------


def test_concurrent_eager_calls_share_the_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two keys remembered: with many shapes, every call drops the oldest.
    monkeypatch.setattr(quax_eager, "MAX_FIRST_CALLS", 2)
    monkeypatch.setattr(quax_eager, "MAX_PROGRAMS", 3)
    mul = quax.quaxify(jnp.multiply)
    errors: list[BaseException] = []
    started = threading.Barrier(6)

    def calls(seed: int) -> None:
        started.wait()
        try:
            for i in range(60):
                n = 1 + (seed + i) % 7
                x = jnp.arange(n, dtype=jnp.float32) + seed
                out = mul(Metres(x), 2.0)
                np.testing.assert_array_equal(out.array, 2 * np.asarray(x))
        except BaseException as e:  # reported below
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=calls, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors


# Settings in the compiled eager key ---------------------------------------------------


def test_settings_in_the_compiled_eager_key() -> None:
    """`Zero * b` is a `Zero`, unless IEEE semantics are asked for (`0 * nan` is
    `nan`): the output is dense either way, so only the key tells the two apart."""
    f = quax.quaxify(jax.jit(lambda a, b: jnp.exp(a * b)))
    b = jnp.array([1.0, jnp.nan, 2.0])
    zero = Zero((3,), jnp.float32)
    for _ in range(2):  # by equation, then compiled
        np.testing.assert_array_equal(f(zero, b), [1.0, 1.0, 1.0])
    with ieee_strict():
        for _ in range(2):
            np.testing.assert_array_equal(f(zero, b), [1.0, np.nan, 1.0])
    np.testing.assert_array_equal(f(zero, b), [1.0, 1.0, 1.0])
