"""`quax.register_function`: a rule for a jitted library function, used in place of
its body where quax meets its `jit` with arguments of the types it annotates."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax

from .helpers import Dense, Refusing, Scaled, dense


@jax.jit
def scaled_sum(a: Any, b: Any) -> Any:
    return a + 2 * b


def _other_module_function() -> Any:
    # A function of the same name, elsewhere: it is not the registered one.
    @jax.jit
    def scaled_sum(a: Any, b: Any) -> Any:
        return a + 2 * b

    return scaled_sum


calls: list[str] = []


@quax.register_function(scaled_sum)
def _(a: Refusing, b: Refusing, *, call: Any) -> Any:
    calls.append("rule")
    # Another computation than the body's, to see which one ran.
    return Refusing(a.array + 2 * b.array + 100)


@quax.register_function(scaled_sum)
def _(a: Dense, b: Any, *, call: Any) -> Any:
    calls.append("body")
    return call(a, b)


x = jnp.array([1.0, 2.0])
y = jnp.array([0.5, -1.0])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_the_rule_runs_in_place_of_the_body(jit: bool) -> None:
    calls.clear()
    f = quax.quaxify(scaled_sum)
    out = (jax.jit(f) if jit else f)(Refusing(x), Refusing(y))
    assert isinstance(out, Refusing)
    np.testing.assert_array_equal(out.array, x + 2 * y + 100)
    assert calls == ["rule"]


def test_call_runs_the_body_under_the_rules() -> None:
    calls.clear()
    out = quax.quaxify(scaled_sum)(Dense(x), y)
    assert isinstance(out, Dense)
    np.testing.assert_array_equal(dense(out), x + 2 * y)
    assert calls == ["body"]


def test_plain_arguments_and_other_functions_do_not_reach_the_rule() -> None:
    calls.clear()
    np.testing.assert_array_equal(quax.quaxify(scaled_sum)(x, y), x + 2 * y)
    # The same name and body, defined elsewhere: not the registered function.
    other = _other_module_function()
    out = quax.quaxify(other)(Refusing(x), Refusing(y))
    np.testing.assert_array_equal(out.array, x + 2 * y)
    assert calls == []


def test_a_rule_returning_other_outputs_is_an_error() -> None:
    @jax.jit
    def pair(a: Any) -> Any:
        return a * 2

    @quax.register_function(pair)
    def _(a: Refusing, *, call: Any) -> Any:
        return a, a

    with pytest.raises(TypeError, match="`pair` returned 2 arrays"):
        quax.quaxify(pair)(Refusing(x))


def test_registering_something_else_than_a_function_is_an_error() -> None:
    with pytest.raises(TypeError, match=r"decorated with `jax.jit`"):
        quax.register_function(jnp.float32(1.0))


def test_the_most_specific_rule_wins_and_unmatched_types_run_the_body() -> None:
    calls.clear()
    # `Refusing` is a `Dense`: its rule is the more specific one.
    quax.quaxify(scaled_sum)(Refusing(x), Refusing(y))
    quax.quaxify(scaled_sum)(Dense(x), Refusing(y))
    assert calls == ["rule", "body"]
    calls.clear()
    # No rule takes a `Scaled` first: the body runs under the rules.
    out = quax.quaxify(scaled_sum)(Scaled(x, 3.0), y)
    np.testing.assert_allclose(dense(out), 3.0 * x + 2 * y)
    assert calls == []


def _function_rule_from(package: str, offset: float) -> Any:
    def rule(a: Refusing, *, call: Any) -> Any:
        return Refusing(a.array + offset)

    rule.__module__ = f"{package}._rules"
    return rule


def test_two_distributions_registering_one_function_dispatch_and_warn() -> None:
    @jax.jit
    def shared(a: Any) -> Any:
        return a * 2

    first = _function_rule_from("quax_lora", 1.0)
    second = _function_rule_from("quax_units", 2.0)
    quax.register_function(shared)(first)
    # A rule for another type, from another family: both are kept, each for its type.
    quax.register_function(shared)(_scaled_rule)
    with pytest.warns(quax.RuleConflictWarning, match=r"`shared \(jitted function\)`"):
        quax.register_function(shared, precedence=1)(second)
    out = quax.quaxify(shared)(Refusing(x))
    np.testing.assert_array_equal(out.array, x + 2.0)
    out = quax.quaxify(shared)(Scaled(x, 3.0))
    np.testing.assert_array_equal(out.materialise(), 3.0 * x)


def _scaled_rule(a: Scaled, *, call: Any) -> Any:
    # Not the body's `a * 2`, to see that this rule ran.
    return a


# One function per test (a function is recognised by its source: one defined in a
# factory would be the same function each time).
@jax.jit
def late_eager(a: Any, b: Any) -> Any:
    return a - b


@jax.jit
def late_jit(a: Any, b: Any) -> Any:
    return a - b


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_registering_a_rule_after_calls_forgets_what_they_kept(jit: bool) -> None:
    # The function is called (traced, compiled, recorded) before its rule exists:
    # no result kept from those calls may stand in for the rule's afterwards.
    # Under `jit`, a new `jax.jit` each call (JAX's own cache of a jitted function
    # is keyed by the function, as for any global a traced function reads): quax's
    # recordings and nested `jit` bodies are what is tested.
    late = late_jit if jit else late_eager

    def f(a: Any, b: Any) -> Any:
        g = quax.quaxify(late)
        return jax.jit(lambda a, b: g(a, b))(a, b) if jit else g(a, b)

    for _ in range(3):  # past the eager cache's first call, to compile and replay
        out = f(Refusing(x), Refusing(y))
        np.testing.assert_array_equal(out.array, x - y)

    @quax.register_function(late)
    def _multiply(a: Refusing, b: Refusing, *, call: Any) -> Any:
        return Refusing(a.array * b.array)

    for _ in range(3):
        out = f(Refusing(x), Refusing(y))
        np.testing.assert_array_equal(out.array, x * y)
