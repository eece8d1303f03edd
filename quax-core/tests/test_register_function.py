"""`quax.register_function`: a rule for a jitted library function, used in place of
its body where quax meets its `jit` with a value among the arguments."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax

from .helpers import Dense, Refusing, dense


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
def _(call: Any, a: Any, b: Any) -> Any:
    if isinstance(a, Refusing) and isinstance(b, Refusing):
        calls.append("rule")
        # Another computation than the body's, to see which one ran.
        return Refusing(a.array + 2 * b.array + 100)
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
    def _(call: Any, a: Any) -> Any:
        return a, a

    with pytest.raises(TypeError, match="`pair` returned 2 arrays"):
        quax.quaxify(pair)(Refusing(x))


def test_registering_something_else_than_a_function_is_an_error() -> None:
    with pytest.raises(TypeError, match=r"decorated with `jax.jit`"):
        quax.register_function(jnp.float32(1.0))
