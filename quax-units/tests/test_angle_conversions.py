"""`jnp.rad2deg`, `jnp.deg2rad`, `jnp.degrees`, `jnp.radians` and `jnp.angle(z,
deg=True)` on quantities: they show the same angle in `deg` or `rad`, as pint's do
(its `rad2deg` takes radians and gives degrees, converting the operand first), and
refuse an operand with dimensions. Their bodies multiply the numbers by `180 / pi`
or `pi / 180`, which on a quantity changed the angle: `rad2deg` of pi rad gave
180 rad, and `angle(1 + 1j, deg=True)` 45 rad. The expected values are pint 0.25's,
written out as literals."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_units import Quantity, UnitError, ustrip


_CONVERSIONS = {
    "rad2deg": (jnp.rad2deg, "deg"),
    "degrees": (jnp.degrees, "deg"),
    "deg2rad": (jnp.deg2rad, "rad"),
    "radians": (jnp.radians, "rad"),
}

# An operand and its angle in radians (pint reads a dimensionless operand, 50 %
# among them, in radians).
_ANGLES = [
    ((math.pi, "rad"), math.pi),
    ((90.0, "deg"), math.pi / 2),
    ((0.5, ""), 0.5),
    ((50.0, "%"), 0.5),
]


def _transformed(how: str, f):
    g = quax.quaxify(f)
    if how == "jit":
        return jax.jit(g)
    if how == "vmap":
        return lambda q: jax.vmap(g)(Quantity(jnp.stack([q.value] * 3), q.unit))[1]
    if how == "vmap inside":
        batched = quax.quaxify(jax.vmap(f))
        return lambda q: batched(Quantity(jnp.stack([q.value] * 3), q.unit))[1]
    return g


@pytest.mark.parametrize("name", list(_CONVERSIONS))
@pytest.mark.parametrize(("given", "radians"), _ANGLES)
@pytest.mark.parametrize("how", ["eager", "jit", "vmap", "vmap inside"])
def test_an_angle_is_shown_in_the_unit_the_function_names(name, given, radians, how):
    f, shown = _CONVERSIONS[name]
    out = _transformed(how, f)(Quantity(jnp.float32(given[0]), given[1]))
    assert isinstance(out, Quantity)
    assert str(out.unit) == shown
    expected = radians if shown == "rad" else radians * 180 / math.pi
    np.testing.assert_allclose(out.value, expected, rtol=1e-6)
    np.testing.assert_allclose(ustrip("rad", out), radians, rtol=1e-6)
    assert out.dtype == jnp.float32


@pytest.mark.parametrize("name", list(_CONVERSIONS))
def test_the_gradient_of_a_conversion(name):
    # The same angle: its derivative is 1 in radians, 180 / pi read in degrees.
    f, _ = _CONVERSIONS[name]

    def in_degrees(x):
        return ustrip("deg", quax.quaxify(f)(Quantity(x, "rad")))

    np.testing.assert_allclose(jax.grad(in_degrees)(0.3), 180 / math.pi, rtol=1e-6)


@pytest.mark.parametrize("name", list(_CONVERSIONS))
def test_an_integer_angle_becomes_a_float_one(name):
    # JAX promotes an integer operand to the default float dtype.
    f, shown = _CONVERSIONS[name]
    out = quax.quaxify(f)(Quantity(jnp.array([0, 1, 2]), ""))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(ustrip("rad", out), [0.0, 1.0, 2.0])
    assert str(out.unit) == shown


@pytest.mark.parametrize("name", list(_CONVERSIONS))
@pytest.mark.parametrize("jit", [False, True])
def test_a_quantity_with_dimensions_is_refused(name, jit):
    f, _ = _CONVERSIONS[name]
    g = quax.quaxify(f)
    with pytest.raises(UnitError, match="converts an angle") as info:
        (jax.jit(g) if jit else g)(Quantity(jnp.array([1.0, 2.0]), "m"))
    message = str(info.value)
    assert "m [m]" in message and "ustrip" in message and ".to(" in message


_Z = jnp.array([1 + 1j, -1.0 + 0j, 0 - 2j], dtype=jnp.complex64)
_PHASES = np.array([math.pi / 4, math.pi, -math.pi / 2])


@pytest.mark.parametrize("deg", [False, True])
@pytest.mark.parametrize("u", ["m", "km / s", ""])
@pytest.mark.parametrize("jit", [False, True])
def test_the_angle_of_a_complex_quantity(deg, u, jit):
    g = quax.quaxify(lambda z: jnp.angle(z, deg=deg))
    out = (jax.jit(g) if jit else g)(Quantity(_Z, u))
    assert str(out.unit) == ("deg" if deg else "rad")
    np.testing.assert_allclose(ustrip("rad", out), _PHASES, rtol=1e-6)
    expected = np.degrees(_PHASES) if deg else _PHASES
    np.testing.assert_allclose(out.value, expected, rtol=1e-6)


def test_the_angle_in_degrees_under_vmap_and_grad():
    def phase_in_degrees(y):
        z = Quantity(1.0 + 1j * y, "m")
        return ustrip("deg", quax.quaxify(lambda z: jnp.angle(z, deg=True))(z))

    ys = jnp.array([1.0, 0.0, -1.0])
    np.testing.assert_allclose(jax.vmap(phase_in_degrees)(ys), [45.0, 0.0, -45.0])
    # d/dy atan(y) at 1 is 1/2 radian: 90 / pi degrees.
    np.testing.assert_allclose(jax.grad(phase_in_degrees)(1.0), 90 / math.pi)
