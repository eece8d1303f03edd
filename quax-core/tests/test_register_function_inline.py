"""`quax.register_function` on a function whose `jit` JAX inlines into its caller
(`jax.jit(inline=True)`, as `jnp.rad2deg` and most of `jax.numpy` are): quax meets
its `jit` before inlining it, so the rule runs, where the function is called on the
quax trace (eagerly, under `jax.jit`, `jax.vmap` or `jax.grad` outside `quaxify`,
and inside a `jax.jit` that `quaxify` sees); the functions without rules are still
inlined, equation by equation."""

import functools as ft
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax

from .helpers import Dense, Refusing


@jax.jit
def _kept(a: Any) -> Any:
    return a * 3.0


@ft.partial(jax.jit, inline=True)
def to_tenths(a: Any) -> Any:
    # A body a rule for `Refusing` computes otherwise (to see which one ran).
    return a * 10.0


@ft.partial(jax.jit, inline=True, static_argnames=("scale",))
def scaled(a: Any, scale: float = 2.0) -> Any:
    return a * scale


calls: list[str] = []


@quax.register_function(to_tenths)
def _(a: Refusing, *, call: Any) -> Any:
    calls.append("to_tenths")
    return Refusing(a.array * 10.0 + 1000.0)


@quax.register_function(scaled, static={"scale": (5.0,)})
def _(a: Refusing, *, scale: float = 2.0, call: Any) -> Any:
    calls.append(f"scaled {scale}")
    return Refusing(a.array * scale + 1000.0)


x = jnp.array([1.0, 2.0, -3.0])


def _transformed(how: str, f: Any) -> Any:
    if how == "eager":
        return f
    if how == "jit":
        return jax.jit(f)
    if how == "jit inside":
        # The function itself jitted inside `quaxify`. (A function JAX stages that
        # calls it, a `jax.jit` of another function or a `lax.scan` body, has it
        # inlined by JAX before quax sees it: see `quax.register_function`.)
        return quax.quaxify(jax.jit(f.__wrapped__))
    assert how == "vmap"
    return jax.vmap(f)


@pytest.mark.parametrize("how", ["eager", "jit", "jit inside", "vmap"])
def test_the_rule_of_an_inlined_function_runs(how: str) -> None:
    # Before quax looked up the rules of inlined `jit`s, their equations were bound
    # one by one: `x * 10`, without the rule's 1000.
    calls.clear()
    out = _transformed(how, quax.quaxify(to_tenths))(Refusing(x))
    np.testing.assert_array_equal(out.array, x * 10.0 + 1000.0)
    assert calls == ["to_tenths"]


@pytest.mark.parametrize("how", ["eager", "jit", "jit inside"])
@pytest.mark.parametrize("scale", [None, 5.0])
def test_an_inlined_function_with_a_declared_static_value(
    how: str, scale: float | None
) -> None:
    calls.clear()
    kwargs = {} if scale is None else {"scale": scale}
    f = quax.quaxify(ft.partial(scaled, **kwargs))
    out = _transformed(how, f)(Refusing(x))
    expected = 2.0 if scale is None else scale
    np.testing.assert_array_equal(out.array, x * expected + 1000.0)
    assert calls == [f"scaled {expected}"]


@pytest.mark.parametrize("how", ["eager", "jit"])
def test_an_undeclared_static_value_runs_the_inlined_body(how: str) -> None:
    calls.clear()
    f = quax.quaxify(ft.partial(scaled, scale=7.0))
    out = _transformed(how, f)(Refusing(x))
    np.testing.assert_array_equal(out.array, x * 7.0)
    assert calls == []


@pytest.mark.parametrize("how", ["eager", "jit"])
def test_types_no_rule_takes_run_the_inlined_body(how: str) -> None:
    calls.clear()
    out = _transformed(how, quax.quaxify(to_tenths))(Dense(x))
    assert isinstance(out, Dense)
    np.testing.assert_array_equal(out.array, x * 10.0)
    assert calls == []


def test_the_gradient_through_the_rule() -> None:
    # `grad` outside `quaxify`: the rule's derivative, 10 per element.
    def loss(a: Any) -> Any:
        return jnp.sum(quax.quaxify(to_tenths)(Refusing(a)).array)

    calls.clear()
    np.testing.assert_allclose(jax.grad(loss)(x), jnp.full(3, 10.0))
    assert calls == ["to_tenths"]


def test_functions_without_rules_are_still_inlined() -> None:
    # An inlined `jit` of a function without a rule leaves no `jit` equation in the
    # staged program (its equations are bound one by one), as before.
    f = quax.quaxify(lambda a: jnp.sin(jnp.multiply(a, 2.0)))
    program = str(jax.make_jaxpr(f)(Dense(x)))
    assert "jit[" not in program
    assert "sin" in program
    # A kept `jit` (not inlined) stays a `jit` equation.
    program = str(jax.make_jaxpr(quax.quaxify(_kept))(Dense(x)))
    assert "jit[" in program
