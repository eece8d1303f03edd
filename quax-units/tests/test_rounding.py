"""Functions whose result depends on the unit the numbers are read in: rounding
(`floor`, `ceil`, `round`, integer casts) and `jnp.sinc`, against literals and NumPy
on the numbers in the unit they are given in."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_units import Quantity, UnitError, ustrip


_ROUNDINGS = [
    jnp.floor,
    jnp.ceil,
    jnp.round,
    jnp.rint,
    jnp.trunc,
    lambda x: jnp.round(x, 2),
    lambda x: jnp.around(x, 1),
    lambda x: jnp.modf(x)[0],
    lambda x: x.astype(jnp.int32),
]


@pytest.mark.parametrize("f", _ROUNDINGS)
@pytest.mark.parametrize("u", ["km", "ft", "degC", "km / h"])
@pytest.mark.parametrize("jit", [False, True])
def test_rounding_a_dimensional_quantity_in_a_scaled_unit_is_refused(f, u, jit):
    # The numbers are held in SI-coherent units: `floor` of 1.6 km rounded there is
    # 1600 m, still 1.6 km, where pint gives 1 km (`round(1.2345 km, 2)` gave 1.2345
    # km, `round(20.6 degC)` 294 K). Rounding in the display unit is not exact
    # either (3 ft read back from metres may be 2.9999998 ft, whose floor is 2 ft).
    g = quax.quaxify(f)
    with pytest.raises(UnitError, match="rounding depends on the unit") as info:
        (jax.jit(g) if jit else g)(Quantity(jnp.array([1.6, 20.6]), u))
    assert "ustrip" in str(info.value)


@pytest.mark.parametrize("f", _ROUNDINGS)
def test_rounding_in_si_coherent_units_matches_numpy(f):
    values = np.array([1.6, -2.5, 20.6049, 3.0], np.float32)
    for u in ["m", "K", "m / s"]:
        got = jax.jit(quax.quaxify(f))(Quantity(jnp.asarray(values), u))
        np.testing.assert_array_equal(ustrip(u, got), f(jnp.asarray(values)))


def test_a_dimensionless_quantity_rounds_as_its_number():
    # A dimensionless quantity is a number (`np.asarray` gives it), whatever unit it
    # is shown in: `5 km // 2 m` is 2500 (shown as 2.5 `km / m`), as in pint.
    q = quax.quaxify(jnp.floor_divide)(
        Quantity(jnp.array([5.0, 7.0]), "km"), Quantity(jnp.array([2.0, 3.0]), "m")
    )
    np.testing.assert_array_equal(ustrip("", q), [2500.0, 2333.0])
    np.testing.assert_array_equal(
        ustrip("", quax.quaxify(jnp.floor)(Quantity(jnp.array([50.4]), "%"))), [0.0]
    )


@pytest.mark.parametrize("jit", [False, True])
def test_sinc_of_an_angle_is_dimensionless(jit):
    # `sinc(x)` is `sin(πx) / (πx)` of the number in radians; it divided by the
    # quantity, so 90 deg came out as -0.00345 `1 / deg`.
    f = quax.quaxify(jnp.sinc)
    f = jax.jit(f) if jit else f
    values = np.array([0.0, 0.5, 1.0, 90.0, 180.0])
    for u, in_radians in [("deg", np.deg2rad(values)), ("rad", values), ("", values)]:
        got = f(Quantity(jnp.asarray(values, jnp.float32), u))
        assert str(got.unit) == ""
        np.testing.assert_allclose(got.value, np.sinc(in_radians), atol=1e-6)
    with pytest.raises(UnitError, match=r"`jnp\.sinc` needs a dimensionless operand"):
        f(Quantity(jnp.ones(2), "m"))
