"""Derivatives with the right units: `quax_units.grad`, `value_and_grad`, `jacobian`,
and `ustrip` on traced quantities inside `quax.quaxify` (also under autodiff)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
from quax_units import Quantity, UnitError, unit, ustrip


kinetic = quax.quaxify(lambda m, v: 0.5 * m * jnp.sum(v**2))
V = jnp.array([30.0, 40.0])


def test_grad_of_energy_is_momentum():
    # The example of issue 18: d(energy)/d(velocity) is a momentum, in kg m/s
    # (`jax.grad` labels it m/s, the input's unit).
    m = Quantity(2.0, "kg")
    p = quax_units.grad(lambda v: kinetic(m, v))(Quantity(V, "m/s"))
    assert isinstance(p, Quantity)
    assert p.unit == unit("kg m / s") and str(p.unit) == "kg m / s"
    np.testing.assert_allclose(ustrip("kg m / s", p), [60.0, 80.0])
    # In km/s the numbers per SI unit are the same; the gradient is still kg m/s.
    p_km = quax_units.grad(lambda v: kinetic(m, v))(Quantity(V / 1000, "km/s"))
    np.testing.assert_allclose(ustrip("kg m / s", p_km), [60.0, 80.0], rtol=1e-6)


def test_grad_of_a_stripped_output_is_per_input_unit():
    # `ustrip("J", E)` is the number of joules: its gradient is in 1 / (m / s).
    m = Quantity(2.0, "kg")
    g = quax_units.grad(lambda v: ustrip("J", kinetic(m, v)))(Quantity(V, "m/s"))
    assert g.units == unit("s / m").dimensions
    np.testing.assert_allclose(ustrip("s / m", g), [60.0, 80.0])
    # Stripped in kJ, the number is a thousand times smaller, and so is its gradient.
    g_kj = quax_units.grad(lambda v: ustrip("kJ", kinetic(m, v)))(Quantity(V, "m/s"))
    np.testing.assert_allclose(ustrip("s / m", g_kj), [0.06, 0.08], rtol=1e-6)


def test_value_and_grad_argnums_pytrees_and_aux():
    def energy(params, v):
        return kinetic(params["m"], v) + params["e0"], "aux"

    params = {"m": Quantity(2.0, "kg"), "e0": Quantity(1.0, "kJ")}
    v = Quantity(V, "m/s")
    (value, aux), (dp, dv) = quax_units.value_and_grad(
        energy, argnums=(0, 1), has_aux=True
    )(params, v)
    assert aux == "aux"
    np.testing.assert_allclose(ustrip("J", value), 3500.0)
    np.testing.assert_allclose(ustrip("m2 / s2", dp["m"]), 1250.0)  # v^2 / 2
    assert dp["e0"] == pytest.approx(1.0) and not isinstance(dp["e0"], Quantity)
    np.testing.assert_allclose(ustrip("kg m / s", dv), [60.0, 80.0])
    g, aux = quax_units.grad(energy, has_aux=True)(params, v)
    np.testing.assert_allclose(ustrip("m2 / s2", g["m"]), 1250.0)
    # A plain argument: the gradient has the output's units.
    dt = quax_units.grad(lambda t: Quantity(3.0, "m / s") * t)(2.0)
    np.testing.assert_allclose(ustrip("m / s", dt), 3.0)


def test_jacobian_units_and_shape():
    t = Quantity(jnp.array([1.0, 2.0, 3.0]), "s")
    x0 = Quantity(jnp.array([1.0, 1.0, 1.0]), "m")

    def position(v):
        return x0 + v * t

    jac = quax_units.jacobian(position)(Quantity(jnp.array([1.0, 2.0, 3.0]), "m/s"))
    assert jac.shape == (3, 3) and jac.units == unit("s").dimensions
    np.testing.assert_allclose(ustrip("s", jac), np.diag([1.0, 2.0, 3.0]))
    jac, aux = quax_units.jacobian(lambda v: (position(v), 1), has_aux=True)(
        Quantity(jnp.ones(3), "m/s")
    )
    assert aux == 1 and jac.units == unit("s").dimensions


def test_has_aux_needs_a_pair():
    with pytest.raises(TypeError, match="has_aux=True needs the function to return"):
        quax_units.grad(lambda v: kinetic(Quantity(1.0, "kg"), v), has_aux=True)(
            Quantity(V, "m/s")
        )


def test_ustrip_on_traced_quantities_inside_quaxify():
    m, v = Quantity(2.0, "kg"), Quantity(V, "m/s")

    def kilojoules(m, v):
        return ustrip("kJ", 0.5 * m * jnp.sum(v**2))

    np.testing.assert_allclose(quax.quaxify(kilojoules)(m, v), 2.5)
    np.testing.assert_allclose(jax.jit(quax.quaxify(kilojoules))(m, v), 2.5)
    speeds = quax.quaxify(jax.vmap(lambda v: ustrip("km / h", v)))(v)
    np.testing.assert_allclose(speeds, [108.0, 144.0], rtol=1e-6)
    with pytest.raises(UnitError, match=r"Cannot express kg m2 / s2 in s"):
        quax.quaxify(lambda m, v: ustrip("s", 0.5 * m * jnp.sum(v**2)))(m, v)
    # Plain tracers count as dimensionless.
    np.testing.assert_allclose(jax.jit(lambda x: ustrip("%", x))(0.5), 50.0)
    with pytest.raises(UnitError, match="a plain"):
        jax.jit(lambda x: ustrip("m", x))(0.5)


def test_grad_inside_quaxify_agrees_with_quax_units_grad():
    m, v = Quantity(2.0, "kg"), Quantity(V, "m/s")
    # A quantity output: units of output over input.
    p = quax.quaxify(jax.grad(lambda m, v: 0.5 * m * jnp.sum(v**2), argnums=1))(m, v)
    assert p.units == unit("kg m / s").dimensions

    # A stripped output is a plain number: units of one over the input's, as
    # `quax_units.grad` gives (before, `ustrip` failed on the traced quantity).
    def joules(m, v):
        return ustrip("J", 0.5 * m * jnp.sum(v**2))

    g = quax.quaxify(jax.grad(joules, argnums=1))(m, v)
    want = quax_units.grad(quax.quaxify(joules), argnums=1)(m, v)
    assert g.units == want.units == unit("s / m").dimensions
    np.testing.assert_allclose(ustrip("s / m", g), ustrip("s / m", want))
    # Forward mode and second derivatives through `ustrip`.
    _, tangent = quax.quaxify(
        lambda m, v, t: jax.jvp(lambda v: joules(m, v), (v,), (t,))
    )(m, v, jnp.ones(2))
    np.testing.assert_allclose(tangent, 140.0)
    hessian = quax.quaxify(jax.hessian(joules, argnums=1))(m, v)
    np.testing.assert_allclose(ustrip("kg / J", hessian), 2.0 * np.eye(2))


def test_plain_jax_grad_keeps_the_input_label():
    # The documented pitfall: JAX copies the input's static unit onto the gradient.
    # The numbers are right per SI unit; the label is not (see the README).
    v = Quantity(V, "m/s")
    g = jax.grad(lambda v: ustrip("J", kinetic(Quantity(2.0, "kg"), v)))(v)
    assert g.units == v.units
    np.testing.assert_allclose(g.array, [60.0, 80.0])


@jax.custom_vjp
def _decay(y, rate):
    return rate * y


def _decay_fwd(y, rate):
    return rate * y, (y, rate)


_seen_cotangents: list = []


def _decay_bwd(res, ct):
    # A rule that mixes the cotangent with its residuals, as an adjoint does:
    # `sum(ct * y)` is the rate's (dimensionless) cotangent only with `ct` per
    # metre.
    y, rate = res
    # (The plain reference's cotangent is an array.)
    _seen_cotangents.append(getattr(ct, "units", None))
    return rate * ct, jnp.sum(ct * y)


_decay.defvjp(_decay_fwd, _decay_bwd)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_custom_vjp_cotangents_are_per_unit(jit):
    """A `custom_vjp` rule on a quantity gets its output's cotangent per the
    output's units (`1 / m` for a length), as reverse mode gives cotangents inside
    `quax.quaxify`, and returns the input's the same way: the gradients of the
    plain program."""
    _seen_cotangents.clear()
    y0 = jnp.array([1.0, 2.0])

    def in_cm(y, rate):
        return ustrip("cm", quax.quaxify(_decay)(Quantity(y, "m"), rate)).sum()

    def plain(y, rate):
        return (100.0 * _decay(y, rate)).sum()

    grad = jax.grad(in_cm, argnums=(0, 1))
    got = (jax.jit(grad) if jit else grad)(y0, 0.5)
    want = jax.grad(plain, argnums=(0, 1))(y0, 0.5)
    # d/dy of 100 r y: 100 r; d/dr: 100 (y1 + y2).
    np.testing.assert_allclose(want[0], [50.0, 50.0])
    np.testing.assert_allclose(want[1], 300.0)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    assert set(_seen_cotangents) == {None, unit("1 / m").dimensions}


@jax.custom_vjp
def _shift(y, offset):
    """`y + offset`, with a rule that gives both cotangents as `y`'s (per metre)."""
    return y + offset


def _shift_fwd(y, offset):
    return _shift(y, offset), None


def _shift_bwd(_, ct):
    return ct, ct


_shift.defvjp(_shift_fwd, _shift_bwd)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_custom_vjp_cotangent_of_a_constant_plain_input(jit):
    """A plain constant input (zeros, which the rule takes beside metres, as a
    solver's loop takes the zeros it starts a carry from) whose cotangent the rule
    gives per metre: no derivative flows through a constant, so its cotangent is
    a zero rather than a quantity that quax would have to strip of its units. The
    gradient is the plain program's."""
    y0 = jnp.array([1.0, 2.0])

    def in_cm(y):
        shifted = quax.quaxify(lambda q: _shift(q, jnp.zeros(2)))(Quantity(y, "m"))
        return ustrip("cm", shifted).sum()

    grad = jax.grad(in_cm)
    got = (jax.jit(grad) if jit else grad)(y0)
    want = jax.grad(lambda y: (100.0 * _shift(y, jnp.zeros(2))).sum())(y0)
    np.testing.assert_allclose(want, [100.0, 100.0])
    # Stripping to centimetres divides by 0.01: exact on a CPU, within an ulp on a TPU,
    # whose float32 division is not correctly rounded (100.0000076 eagerly, TPU v5e).
    tpu = jax.default_backend() == "tpu"
    np.testing.assert_allclose(got, want, rtol=2e-7 if tpu else 1e-12)
