"""Derivatives through `jnp.rad2deg`, `jnp.deg2rad` and `jnp.angle(z, deg=True)` of
quantities under `grad`, `jvp`, `linearize`, `vjp`, `jacfwd`, `jacrev` and
`hessian` INSIDE `quax.quaxify`.

Their rules show the same angle in another unit (the SI numbers, radians,
unchanged), where their bodies multiply the numbers by 180 / pi: the body's
derivative is not the rule's. quax-units registers each rule with a `jvp`
(`quax.register_function(..., jvp=...)`); before it, every derivative below raised
a `NotImplementedError` at trace time (and before that refusal, silently gave the
body's derivative, 57.3 where it is 1). Each is compared with the same computation
in plain JAX on the SI numbers, where the conversions are the identity.
"""

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
from quax_units import Quantity, ustrip


def _si(x: Any) -> Any:
    """The SI numbers of the quantities in `x` (plain arrays as they are)."""
    return jax.tree.map(
        lambda v: np.asarray(v.array if isinstance(v, Quantity) else v),
        x,
        is_leaf=lambda v: isinstance(v, Quantity),
    )


def _assert_close(got: Any, want: Any) -> None:
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7),
        _si(got),
        _si(want),
    )


angles = jnp.array([0.3, -1.2, 2.0])  # radians, the SI numbers
q = Quantity(angles * (180 / math.pi), "deg")
lengths = Quantity(jnp.array([2.0, 3.0, 5.0]), "cm")


def f(a: Any, length: Any) -> Any:
    # An angle in `deg`, converted both ways, and a length in `cm`.
    return jnp.sum(length * jnp.cos(jnp.deg2rad(a)) * jnp.sin(jnp.rad2deg(a) * 2))


def f_dense(a: Any, length: Any) -> Any:
    return jnp.sum(length * jnp.cos(a) * jnp.sin(a * 2))


def g(a: Any) -> Any:
    # Vector-valued, for the Jacobians.
    return jnp.radians(a) * jnp.cos(jnp.degrees(a))


def g_dense(a: Any) -> Any:
    return a * jnp.cos(a)


_CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "grad": (jax.grad(f, argnums=(0, 1)), jax.grad(f_dense, argnums=(0, 1))),
    "value_and_grad": (jax.value_and_grad(f), jax.value_and_grad(f_dense)),
    "vjp": (
        lambda a, length: jax.vjp(g, a)[1](jnp.array([1.0, -2.0, 0.5])),
        lambda a, length: jax.vjp(g_dense, a)[1](jnp.array([1.0, -2.0, 0.5])),
    ),
    "linearize": (
        lambda a, length: jax.linearize(g, a)[1](jnp.array([1.0, -2.0, 0.5])),
        lambda a, length: jax.linearize(g_dense, a)[1](jnp.array([1.0, -2.0, 0.5])),
    ),
    "jvp of a plain tangent": (
        lambda a, length: jax.jvp(g, (a,), (jnp.array([1.0, -2.0, 0.5]),)),
        lambda a, length: jax.jvp(g_dense, (a,), (jnp.array([1.0, -2.0, 0.5]),)),
    ),
    "jacfwd": (
        lambda a, length: jax.jacfwd(g)(a),
        lambda a, length: jax.jacfwd(g_dense)(a),
    ),
    "jacrev": (
        lambda a, length: jax.jacrev(g)(a),
        lambda a, length: jax.jacrev(g_dense)(a),
    ),
    "hessian": (
        lambda a, length: jax.hessian(f)(a, length),
        lambda a, length: jax.hessian(f_dense)(a, length),
    ),
}


@pytest.mark.parametrize("name", list(_CASES))
def test_derivatives_inside_quaxify_equal_the_dense_ones(name: str) -> None:
    inside, dense = _CASES[name]
    _assert_close(quax.quaxify(inside)(q, lengths), dense(angles, lengths.array))


def test_the_units_of_the_gradient() -> None:
    # d f / d angle is in the length's unit per radian; d f / d length is a number.
    grad_angle, grad_length = quax.quaxify(jax.grad(f, argnums=(0, 1)))(q, lengths)
    want_angle, want_length = jax.grad(f_dense, argnums=(0, 1))(angles, lengths.array)
    np.testing.assert_allclose(ustrip("m", grad_angle), want_angle, rtol=2e-6)
    np.testing.assert_allclose(jnp.asarray(grad_length), want_length, rtol=2e-6)
    # The way outside `quaxify` gives the same.
    outside = quax_units.grad(quax.quaxify(f))(q, lengths)
    np.testing.assert_allclose(ustrip("m", outside), want_angle, rtol=2e-6)


def test_value_and_grad_shows_the_rules_value() -> None:
    # The value is the rule's, the same angle in `deg` (17.19 deg, 0.3 rad), where
    # the body's would be 17.19 rad; its derivative is 1 (57.3 deg/rad).
    value, grad = quax.quaxify(jax.value_and_grad(jnp.rad2deg))(
        Quantity(jnp.float32(0.3), "rad")
    )
    assert str(value.unit) == "deg"
    np.testing.assert_allclose(ustrip("deg", value), 0.3 * 180 / math.pi, rtol=1e-6)
    np.testing.assert_allclose(_si(grad), 1.0, rtol=1e-6)


def test_forward_equals_reverse_under_jit_and_vmap() -> None:
    forward = jax.jit(quax.quaxify(jax.jacfwd(g)))(q)
    reverse = jax.jit(quax.quaxify(jax.jacrev(g)))(q)
    dense = jax.jacrev(g_dense)(angles)
    _assert_close(forward, dense)
    _assert_close(reverse, dense)
    batch = Quantity(jnp.stack([angles, -angles]) * (180 / math.pi), "deg")
    dense_batch = jax.vmap(jax.grad(f_dense), (0, None))(
        jnp.stack([angles, -angles]), lengths.array
    )
    # `vmap` outside and inside `quaxify`.
    outside = jax.vmap(quax.quaxify(jax.grad(f)), (0, None))(batch, lengths)
    inside = quax.quaxify(jax.vmap(jax.grad(f), (0, None)))(batch, lengths)
    _assert_close(outside, dense_batch)
    _assert_close(inside, dense_batch)


def test_a_quantity_tangent_is_shown_in_the_rules_unit() -> None:
    # `jvp` with a quantity tangent: the same angle's tangent, shown in `deg` as the
    # output is.
    t = Quantity(jnp.float32(0.5), "rad")
    out, tangent = quax.quaxify(lambda a, u: jax.jvp(jnp.rad2deg, (a,), (u,)))(
        Quantity(jnp.float32(0.3), "rad"), t
    )
    assert str(out.unit) == "deg" and str(tangent.unit) == "deg"
    np.testing.assert_allclose(ustrip("rad", tangent), 0.5, rtol=1e-6)


z = jnp.array([1.0 + 0.5j, -2.0 + 3.0j], jnp.complex64)  # SI numbers, volts
zq = Quantity(z * 1e3, "mV")
dz = jnp.array([0.3 - 0.2j, 0.1 + 1.0j], jnp.complex64)


def phase(z: Any) -> Any:
    return jnp.angle(z, deg=True) ** 2 + jnp.angle(z)


def phase_dense(z: Any) -> Any:
    return jnp.angle(z) ** 2 + jnp.angle(z)


_FORWARD: dict[str, Callable[[Any], Any]] = {
    "jvp": lambda f: lambda z: jax.jvp(f, (z,), (dz,)),
    "linearize": lambda f: lambda z: jax.linearize(f, z)[1](dz),
    # Over the rows of a batch of `z`s, with the same tangent.
    "vmap of jvp": lambda f: jax.vmap(lambda z: jax.jvp(f, (z,), (dz,))),
}


@pytest.mark.parametrize("name", list(_FORWARD))
def test_angle_forward(name: str) -> None:
    # A plain tangent of `z` (per volt): the tangent of its phase in one over volts.
    how = _FORWARD[name]
    batched = name.startswith("vmap")
    a_dense = jnp.stack([z, -z]) if batched else z
    a = Quantity(a_dense * 1e3, "mV")
    _assert_close(quax.quaxify(how(phase))(a), how(phase_dense)(a_dense))


def test_angle_of_a_quantity_tangent() -> None:
    # A tangent in `mV`: its SI numbers, volts, as the dense `jvp` reads them.
    out, tangent = quax.quaxify(lambda a, t: jax.jvp(phase, (a,), (t,)))(
        zq, Quantity(dz, "mV")
    )
    want_out, want_tangent = jax.jvp(phase_dense, (z,), (dz * 1e-3,))
    _assert_close(out, want_out)
    _assert_close(tangent, want_tangent)


def test_angle_reverse() -> None:
    # Transposing `jnp.imag` binds `complex` of a plain zero and the quantity
    # cotangent, which quax-units' `complex` rule gives its units (before it, this
    # raised a `UnitsMaterialisationError`): see test_complex_derivatives.py.
    got = quax.quaxify(jax.grad(lambda z: jnp.sum(phase(z))))(zq)
    _assert_close(got, jax.grad(lambda z: jnp.sum(phase_dense(z)))(z))
