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
import quax._dispatch._registry as _registry

from .helpers import TRACED_BODIES, Dense, Refusing, in_traced_body


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


@ft.partial(jax.jit, inline=True)
def _no_rule(a: Any) -> Any:
    return a * 5.0


@ft.partial(jax.jit, inline=True)
def shifted(a: Any, n: Any) -> Any:
    return a * 2.0 + n


calls: list[str] = []


@quax.register_function(to_tenths)
def _(a: Refusing, *, call: Any) -> Any:
    calls.append("to_tenths")
    return Refusing(a.array * 10.0 + 1000.0)


@quax.register_function(scaled, static={"scale": (5.0,)})
def _(a: Refusing, *, scale: float = 2.0, call: Any) -> Any:
    calls.append(f"scaled {scale}")
    return Refusing(a.array * scale + 1000.0)


@quax.register_function(jnp.rad2deg)
def _(a: Refusing, *, call: Any) -> Any:
    calls.append("rad2deg")
    return Refusing(a.array + 1000.0)


@quax.register_function(shifted)
def _(a: Refusing, n: Any, *, call: Any) -> Any:
    calls.append("shifted")
    return Refusing(a.array * 2.0 + n + 1000.0)


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


@pytest.mark.parametrize("how", TRACED_BODIES)
@pytest.mark.parametrize("outer_jit", [False, True], ids=["eager", "jit"])
def test_the_rule_runs_inside_a_body_jax_traces(how: str, outer_jit: bool) -> None:
    # JAX keeps the `jit` of a function with a rule as a call in the jaxprs it traces
    # (`quax._foundation._jit_rules.keep_inline_jit`): before, it inlined `x * 10`
    # there, before quax met the body.
    calls.clear()
    g = quax.quaxify(in_traced_body(how, to_tenths))
    out = (jax.jit(g) if outer_jit else g)(Refusing(x))
    assert isinstance(out, Refusing)
    np.testing.assert_array_equal(out.array, x * 10.0 + 1000.0)
    assert "to_tenths" in calls


@pytest.mark.parametrize("how", TRACED_BODIES)
def test_plain_jax_gives_the_same_values(how: str) -> None:
    # Kept as a call, the function computes what its inlined equations computed.
    f = lambda a: jnp.sin(to_tenths(a))
    np.testing.assert_allclose(in_traced_body(how, f)(x), jnp.sin(x * 10.0), rtol=1e-6)


def test_only_functions_with_rules_stay_calls() -> None:
    # In a jaxpr JAX traces itself, the inline `jit` of a function with a rule is a
    # `jit` equation (named after it); one without a rule is inlined as before.
    program = jax.make_jaxpr(lambda a: _no_rule(to_tenths(jnp.multiply(a, 2.0))))(x)
    jits = [e for e in program.eqns if e.primitive.name == "jit"]
    assert [e.params["name"] for e in jits] == ["to_tenths"]
    assert jits[0].params["inline"]
    assert [e.primitive.name for e in program.eqns] == ["mul", "jit", "mul"]


def test_a_body_traced_outside_quaxify_before_its_rule_was_registered() -> None:
    # JAX caches the jaxprs it traces: a `jax.jit` function traced on plain arrays
    # before a rule for a function it calls was registered holds that function's
    # inlined equations. JAX keys what it traces inside `quaxify` apart, so that
    # jaxpr never reaches quax, even where the registration keeps JAX's keys as
    # they are (as the installed families loading on the first quaxified call do).
    @ft.partial(jax.jit, inline=True)
    def late(a: Any) -> Any:
        return a * 4.0

    @jax.jit
    def uses_late(a: Any) -> Any:
        return late(a) + 1.0

    np.testing.assert_array_equal(uses_late(x), x * 4.0 + 1.0)
    with _registry.jit_generation_kept():

        @quax.register_function(late)
        def _(a: Refusing, *, call: Any) -> Any:
            return Refusing(a.array * 4.0 + 1000.0)

    out = quax.quaxify(uses_late)(Refusing(x))
    np.testing.assert_array_equal(out.array, x * 4.0 + 1001.0)


def test_a_body_traced_inside_quaxify_before_its_rule_was_registered() -> None:
    # Traced inside `quaxify` before the rule, the `jit` holds the inlined body;
    # registering a rule changes JAX's keys, so it is traced again.
    @ft.partial(jax.jit, inline=True)
    def later(a: Any) -> Any:
        return a * 4.0

    @jax.jit
    def uses_later(a: Any) -> Any:
        return later(a) + 1.0

    out = quax.quaxify(uses_later)(Refusing(x))
    np.testing.assert_array_equal(out.array, x * 4.0 + 1.0)

    @quax.register_function(later)
    def _(a: Refusing, *, call: Any) -> Any:
        return Refusing(a.array * 4.0 + 1000.0)

    out = quax.quaxify(uses_later)(Refusing(x))
    np.testing.assert_array_equal(out.array, x * 4.0 + 1001.0)


class _Weak(Refusing):
    """A `Refusing` whose aval keeps its array's weak type (as `jax.typeof` gives)."""

    def aval(self) -> Any:
        return jax.typeof(self.array)


def test_vmap_inside_of_a_weakly_typed_operand() -> None:
    # `vmap` inside `quaxify` batches `jnp.rad2deg`'s body traced on the weakly typed
    # element, which holds `180 / pi` as the Python float; `rad2deg` traced again on
    # the batched type holds the float32 number. quax compared the bodies' text and
    # ran the body (`a * 57.3`, without the rule's 1000); in float32 they are one.
    calls.clear()
    a = _Weak(jnp.asarray(3.0))
    assert a.aval().weak_type
    out = quax.quaxify(lambda v: jax.vmap(jnp.rad2deg)(jnp.stack([v, v])))(a)
    np.testing.assert_allclose(out.array, [1003.0, 1003.0], rtol=1e-6)
    assert calls == ["rad2deg"]


@pytest.mark.parametrize("outer_jit", [False, True], ids=["eager", "jit"])
def test_jvp_inside_quaxify_is_the_rules_jvp(outer_jit: bool) -> None:
    # JAX's `jvp` of the function's `jit` binds the `jvp` of its body (`x * 10` and
    # `t * 10`): quax recognises it and takes the `jvp` of the rule.
    calls.clear()
    g = quax.quaxify(lambda a, t: jax.jvp(to_tenths, (a,), (t,)))
    out, tangent = (jax.jit(g) if outer_jit else g)(Refusing(x), Refusing(2 * x))
    np.testing.assert_array_equal(out.array, x * 10.0 + 1000.0)
    np.testing.assert_array_equal(tangent.array, x * 20.0)
    assert calls == ["to_tenths"]


def test_jvp_inside_quaxify_with_a_plain_tangent_runs_the_body() -> None:
    # A plain tangent of a value is not of the primal's type: the rule's `jvp` cannot
    # take it, and the body's `jvp` runs, as before.
    calls.clear()
    f = quax.quaxify(lambda a, t: jax.jvp(to_tenths, (a,), (t,)))
    out, tangent = f(Refusing(x), 2 * x)
    np.testing.assert_array_equal(out.array, x * 10.0)
    np.testing.assert_array_equal(tangent, x * 20.0)
    assert calls == []


def test_jvp_inside_quaxify_with_an_integer_argument() -> None:
    # An integer argument has no tangent (JAX's is a `float0` zero): the rule's `jvp`
    # gets one of that type.
    calls.clear()
    three = jnp.int32(3)
    f = quax.quaxify(lambda a, t: jax.jvp(lambda b: shifted(b, three), (a,), (t,)))
    out, tangent = f(Refusing(x), Refusing(2 * x))
    np.testing.assert_array_equal(out.array, x * 2.0 + 1003.0)
    np.testing.assert_array_equal(tangent.array, x * 4.0)
    assert calls == ["shifted"]
