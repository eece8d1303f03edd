"""`quax.register_function` rules for functions JAX inlines (`jax.jit(inline=True)`:
quax-units' `jnp.rad2deg`, `deg2rad`, `degrees`, `radians`) run where they are called
inside a body JAX traces itself before quax meets it: a `jax.jit` or `eqx.filter_jit`
function, a `lax.scan`, `lax.cond`, `lax.while_loop` or `lax.fori_loop` body,
`jax.checkpoint`, a `custom_jvp` function, `vmap` inside `quaxify`. JAX's staging
inlined them there, so quax met their body, a multiplication by `180 / pi`, and
`rad2deg` of pi rad gave 180 rad; quax-core now keeps their `jit` as a call. The
expected values are pint 0.25's, written out as literals: `rad2deg` of pi rad is 180
deg, `deg2rad` of 180 deg is pi rad, `angle(1 + 1j, deg=True)` is 45 deg."""

import math
import sys
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
from jax import lax
from quax_units import Quantity, ustrip


sys.path.insert(0, str(Path(__file__).parents[1] / "quax-core" / "tests"))
from helpers import TRACED_BODIES, in_traced_body


# Each function, its operand, the unit it shows its output in and that output's
# value in that unit (pint's).
_FUNCTIONS = {
    "rad2deg": (jnp.rad2deg, (math.pi, "rad"), "deg", 180.0),
    "degrees": (jnp.degrees, (math.pi, "rad"), "deg", 180.0),
    "deg2rad": (jnp.deg2rad, (180.0, "deg"), "rad", math.pi),
    "radians": (jnp.radians, (180.0, "deg"), "rad", math.pi),
    "angle deg=True": (lambda z: jnp.angle(z, deg=True), (1 + 1j, "m"), "deg", 45.0),
}


@pytest.mark.parametrize("name", list(_FUNCTIONS))
@pytest.mark.parametrize("how", TRACED_BODIES)
@pytest.mark.parametrize("outer_jit", [False, True], ids=["eager", "jit"])
def test_the_rule_runs_inside_a_body_jax_traces(
    name: str, how: str, outer_jit: bool
) -> None:
    f, (value, unit), shown, expected = _FUNCTIONS[name]
    g = quax.quaxify(in_traced_body(how, f))
    dtype = jnp.complex64 if isinstance(value, complex) else jnp.float32
    out = (jax.jit(g) if outer_jit else g)(Quantity(jnp.asarray(value, dtype), unit))
    assert isinstance(out, Quantity)
    assert str(out.unit) == shown
    np.testing.assert_allclose(ustrip(shown, out), expected, rtol=1e-6)
    assert out.dtype == jnp.float32


@pytest.mark.parametrize("name", ["rad2deg", "deg2rad", "degrees", "radians"])
def test_jvp_inside_quaxify(name: str) -> None:
    # JAX's `jvp` binds the `jvp` of the function's body (both multiplied by
    # `180 / pi`: 180 rad); quax recognises it and takes the `jvp` of the rule.
    f, (value, unit), shown, expected = _FUNCTIONS[name]
    q = Quantity(jnp.float32(value), unit)
    primal, tangent = quax.quaxify(lambda a: jax.jvp(f, (a,), (a,)))(q)
    for out in (primal, tangent):
        assert str(out.unit) == shown
        np.testing.assert_allclose(ustrip(shown, out), expected, rtol=1e-6)


def _scan_grad(f: Any) -> Any:
    def grad_in_a_scan(a: Any) -> Any:
        def body(carry: Any, _: Any) -> tuple[Any, Any]:
            return carry, jax.grad(f)(a)

        return lax.scan(body, 0.0, None, length=1)[1][0]

    return grad_in_a_scan


# The transformations inside `quaxify` that change a body before quax meets it.
_DIFFERENTIATIONS = {
    "grad": jax.grad,
    "value_and_grad": jax.value_and_grad,
    "vjp": lambda f: lambda a: jax.vjp(f, a)[1](jnp.float32(1.0)),
    "linearize": lambda f: lambda a: jax.linearize(f, a)[1](jnp.float32(1.0)),
    "jacfwd": jax.jacfwd,
    "jacrev": jax.jacrev,
    "hessian": jax.hessian,
    "checkpoint grad": lambda f: jax.grad(jax.checkpoint(f)),
    "jit grad": lambda f: jax.jit(jax.grad(f)),
    "scan grad": _scan_grad,
    "filter_grad": eqx.filter_grad,
    # A plain tangent of a quantity, which the rule's `jvp` cannot take.
    "jvp of a plain tangent": lambda f: lambda a: jax.jvp(f, (a,), (jnp.float32(1),)),
}


# The derivatives that JAX takes while it traces a body on abstract arguments (a
# `jax.checkpoint` or `jax.jit` body), before quax knows that a quantity reaches the
# function: the rule's `jvp` cannot run there.
_ABSTRACT = ("checkpoint grad", "jit grad")


def _si(x: Any) -> Any:
    """The SI numbers of the quantities in `x` (plain arrays as they are)."""
    return jax.tree.map(
        lambda v: np.asarray(v.array if isinstance(v, Quantity) else v),
        x,
        is_leaf=lambda v: isinstance(v, Quantity),
    )


@pytest.mark.parametrize("how", [h for h in _DIFFERENTIATIONS if h not in _ABSTRACT])
@pytest.mark.parametrize("name", ["rad2deg", "deg2rad", "degrees", "radians"])
def test_derivatives_inside_quaxify(name: str, how: str) -> None:
    # Under `grad` inside `quaxify` quax met the parts of the body's derivative (a
    # multiplication by 180 / pi), not the function: `jax.grad(jnp.rad2deg)` of an
    # angle in rad gave 57.3 where the derivative is 1 (57.3 deg/rad), and the
    # value of `value_and_grad` 17.19 rad where it is 0.3 rad (17.19 deg); then quax
    # raised. quax-units registers these rules with a `jvp` (the same angle: its
    # tangent unchanged), which quax runs there: the derivative of the identity on
    # the SI numbers, in plain JAX.
    f, (value, unit), _, _ = _FUNCTIONS[name]
    q = Quantity(jnp.float32(value), unit)
    inside = quax.quaxify(_DIFFERENTIATIONS[how](f))(q)
    dense = _DIFFERENTIATIONS[how](lambda a: a)(q.array)
    jax.tree.map(
        lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6),
        _si(inside),
        _si(dense),
    )


@pytest.mark.parametrize("how", _ABSTRACT)
@pytest.mark.parametrize("name", ["rad2deg", "deg2rad", "degrees", "radians"])
def test_a_derivative_traced_on_abstract_arguments_raises(name: str, how: str) -> None:
    f, (value, unit), _, _ = _FUNCTIONS[name]
    q = Quantity(jnp.float32(value), unit)
    with pytest.raises(NotImplementedError) as info:
        quax.quaxify(_DIFFERENTIATIONS[how](f))(q)
    message = str(info.value)
    assert "of Quantity inside a transformation inside `quax.quaxify`" in message
    assert "quax_units.grad(quax.quaxify(f))" in message
    assert "jax.jit(quax.quaxify(jax.grad(f)))" in message


def test_grad_outside_quaxify() -> None:
    # The way out the error gives: the derivative of the same angle shown in
    # degrees, 180 / pi deg/rad (that is, 1).
    q = Quantity(jnp.float32(0.3), "rad")
    outside = quax_units.grad(quax.quaxify(jnp.rad2deg))(q)
    np.testing.assert_allclose(ustrip("deg / rad", outside), 180 / math.pi, rtol=1e-6)


@pytest.mark.parametrize("how", ["grad", "jacrev", "jit grad"])
@pytest.mark.parametrize(
    "f, value, unit",
    [(jnp.sinc, 0.3, ""), (jnp.round, 293.6, "K")],
    ids=["sinc", "round"],
)
def test_rules_whose_bodies_stand_in_still_differentiate(
    f: Any, value: float, unit: str, how: str
) -> None:
    # Their bodies compute what their rules do: the body's derivative runs, as
    # `quax_units.grad` outside `quaxify` gives it (sinc's -0.902, round's 0).
    q = Quantity(jnp.float32(value), unit)
    inside = quax.quaxify(_DIFFERENTIATIONS[how](f))(q)
    outside = quax_units.grad(quax.quaxify(f))(q)
    np.testing.assert_allclose(
        jnp.asarray(getattr(inside, "array", inside)),
        jnp.asarray(getattr(outside, "array", outside)),
        rtol=1e-6,
    )


def test_vmap_inside_of_a_weakly_typed_angle() -> None:
    # A Python float is weakly typed: JAX keeps `180 / pi` in `rad2deg`'s body as the
    # Python float, which `vmap` keeps too, where `rad2deg` traced again on the
    # batched type holds the float32 number. quax compared the two bodies' text and
    # ran the body: 180 rad each.
    q = Quantity(math.pi, "rad")
    out = quax.quaxify(lambda a: jax.vmap(jnp.rad2deg)(jnp.stack([a, a])))(q)
    assert str(out.unit) == "deg"
    np.testing.assert_allclose(ustrip("deg", out), [180.0, 180.0], rtol=1e-6)
