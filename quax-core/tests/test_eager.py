"""Eager quax runs library code on values as one compiled program per call
(`quax._eager`): inlined `jit`s (every `jax.numpy` function), Python operators on
traced values, and `quax.quaxify` of a jitted or `operator` function. What must not
change: exact results, the user's Python side effects and `jax.debug` calls, the
materialisation report, and refusals (same point, same text)."""

import operator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jaxtyping import Array

from .helpers import Dense


class Opaque(quax.ArrayValue):
    """A value with no rules that refuses to materialise unless allowed."""

    array: Array
    allow: bool = eqx.field(static=True, default=False)

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        if not self.allow:
            raise RuntimeError(
                "Refusing to materialise `Opaque`: allow_materialise=True"
            )
        return self.array


@pytest.fixture(autouse=True)
def _compiled() -> Any:
    """Every test here runs with eager compilation on (it is opt-in), except where
    it turns it off itself."""
    quax.set_eager_compilation(True)
    yield
    quax.set_eager_compilation(False)


X = jnp.array([0.5, -1.5, 2.25, 3.0])
Y = jnp.array([1.25, 2.0, -0.75, 4.0])

FUNCTIONS = [
    pytest.param(jnp.multiply, id="jnp.multiply"),
    pytest.param(operator.mul, id="operator.mul"),
    pytest.param(lambda a, b: a * b + a, id="a*b+a"),
    pytest.param(lambda a, b: (a - b) / 3.0 + a**2 - 2.5 * b, id="operators"),
    pytest.param(lambda a, b: jnp.sin(a) * jnp.exp(b) @ a, id="jnp"),
    pytest.param(lambda a, b: jax.nn.softmax(a * b), id="softmax"),
    pytest.param(lambda a, b: jnp.var(a) + jnp.sum(b), id="reductions"),
]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_exact_results(fn: Any) -> None:
    q = quax.quaxify(fn)
    expected = fn(X, Y)  # plain JAX
    with quax.track_materialisation():  # equation by equation
        by_equation = q(Dense(X), Dense(Y)).array
    for _ in range(2):  # the second call runs the cached programs
        out = q(Dense(X), Dense(Y))
        assert type(out) is Dense
        np.testing.assert_array_equal(out.array, expected)
        np.testing.assert_array_equal(out.array, by_equation)


def test_library_code_runs_compiled() -> None:
    q = quax.quaxify(lambda a, b: jnp.sin(a) * b)
    q(Dense(X), Dense(Y))
    quax.quaxify(jnp.multiply)(Dense(X), Dense(Y))  # compiles its program
    with quax.plugins.track_evaluations() as report:
        q(Dense(X), Dense(Y))
        quax.quaxify(jnp.multiply)(Dense(X), Dense(Y))
    assert report.total == 0
    with quax.plugins.track_evaluations() as report, quax.track_materialisation():
        q(Dense(X), Dense(Y))
    assert report.total == 2  # `sin` and `multiply`, equation by equation


def test_side_effects_and_debug_calls(capfd: pytest.CaptureFixture[str]) -> None:
    calls = []

    @jax.jit
    def library(a: Any) -> Any:
        jax.debug.print("library {}", a[0])
        return a * 2.0

    def fn(a: Any, b: Any) -> Any:
        calls.append(1)
        jax.debug.print("user {}", b.sum())
        return library(a) + b

    q = quax.quaxify(fn)
    expected = fn(X, Y)
    for _ in range(3):
        np.testing.assert_array_equal(q(Dense(X), Dense(Y)).array, expected)
    jax.effects_barrier()
    assert len(calls) == 4
    out = capfd.readouterr().out
    assert out.count("library 0.5") == 4
    assert out.count(f"user {Y.sum()}") == 4


def test_materialisation_report_unchanged() -> None:
    q = quax.quaxify(lambda a: jnp.sin(a) * 2.0)
    value = Opaque(X, allow=True)
    np.testing.assert_array_equal(q(value), jnp.sin(X) * 2.0)  # compiled, cached
    for _ in range(2):
        with quax.track_materialisation() as report:
            np.testing.assert_array_equal(q(value), jnp.sin(X) * 2.0)
        assert report.counts == {("sin", "Opaque"): 1}


def test_refusals_raise_each_call() -> None:
    for fn in (quax.quaxify(jnp.sin), quax.quaxify(lambda a: jnp.sin(a) + 1.0)):
        for _ in range(2):
            with pytest.raises(RuntimeError, match="Refusing to materialise `Opaque`"):
                fn(Opaque(X))


def test_varying_plain_operands() -> None:
    # Plain operands are constants of the compiled programs; past a few of them,
    # quax runs equation by equation again, with the same results.
    q = quax.quaxify(lambda a, s: a * s)
    for s in range(12):
        np.testing.assert_array_equal(q(Dense(X), float(s)).array, X * float(s))
    big = jnp.arange(100.0)
    np.testing.assert_array_equal(q(Dense(big), big).array, big * big)


class Named(Dense):
    """A value with a leaf that is not an array: it runs equation by equation."""

    name: str = "out"


def test_value_with_other_leaves() -> None:
    out = quax.quaxify(lambda a, b: a * b)(Named(X, "x"), Named(Y, "y"))
    assert type(out) is Named and out.name == "out"
    np.testing.assert_array_equal(out.array, X * Y)


def test_programs_follow_new_rules() -> None:
    # A program compiled before a rule is registered must not answer after it.
    class Late(quax.ArrayValue):
        array: Array

        def aval(self) -> Any:
            return jax.typeof(self.array)

        def materialise(self) -> Array:
            return self.array

    q = quax.quaxify(jnp.negative)
    assert type(q(Late(X))) is not Late  # materialised: no rule yet

    @quax.register(jax.lax.neg_p)
    def _(x: Late, **params: Any) -> Late:
        return Late(jax.lax.neg(x.array, **params))

    out = q(Late(X))
    assert type(out) is Late
    np.testing.assert_array_equal(out.array, -X)


def test_off_by_default_and_when_turned_off() -> None:
    q = quax.quaxify(lambda a, b: jnp.sin(a) * b)
    q(Dense(X), Dense(Y))
    quax.set_eager_compilation(False)
    with quax.plugins.track_evaluations() as report:
        out = q(Dense(X), Dense(Y))
    assert report.total == 2  # `sin` and `multiply`, equation by equation
    np.testing.assert_array_equal(out.array, jnp.sin(X) * Y)


class Counted(quax.ArrayValue):
    """A value whose `mul` rule reads its leaf concretely (as a rule that sizes its
    result from the data does)."""

    array: Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        return self.array


@quax.register(jax.lax.mul_p)
def _(x: Counted, y: Counted, **params: Any) -> Counted:
    positive = int(jnp.sum(x.array > 0))  # needs a concrete leaf
    return Counted(jax.lax.mul(x.array, y.array, **params) + positive)


def test_rules_needing_concrete_leaves_run_by_equation() -> None:
    q = quax.quaxify(jnp.multiply)
    for _ in range(2):  # the second call remembers: no compile attempt
        out = q(Counted(X), Counted(Y))
        assert type(out) is Counted
        np.testing.assert_array_equal(out.array, X * Y + 3)
