"""Statistics from `jax.numpy` on quantities; equinox's loop primitives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from equinox.internal._loop.common import _maybe_set, select_if_vmap_p
from quax_units import Quantity, UnitError, meters, ustrip


x = Quantity(jnp.array([1.0, 2.0, 4.0, 9.0]), "km")


@pytest.mark.parametrize(
    ("f", "power"),
    [(jnp.mean, 1), (jnp.average, 1), (jnp.ptp, 1), (jnp.sum, 1), (jnp.max, 1)],
)
@pytest.mark.parametrize("jit", [False, True])
def test_statistics_keep_units(f, power, jit):
    g = quax.quaxify(f)
    out = (jax.jit(g) if jit else g)(x)
    assert out.units == {meters: power}
    np.testing.assert_allclose(out.array, f(x.array), rtol=1e-6)


@pytest.mark.parametrize(
    ("f", "power"),
    [
        (jnp.var, 2),
        (jnp.std, 1),
        (jnp.median, 1),
        (jnp.nanmean, 1),
        (jnp.nansum, 1),
        (jnp.nanstd, 1),
        (jnp.nanvar, 2),
        (jnp.nanmax, 1),
        (jnp.nanmedian, 1),
        (lambda q: jnp.percentile(q, 50.0), 1),
        (lambda q: jnp.quantile(q, 0.25), 1),
        (lambda q: jnp.nanpercentile(q, 90.0), 1),
    ],
)
@pytest.mark.parametrize("jit", [False, True])
def test_statistics_selecting_constants(f, power, jit):
    # These select against NaN or zero constants inside nested `jit`s.
    g = quax.quaxify(f)
    out = (jax.jit(g) if jit else g)(x)
    assert out.units == {meters: power}
    np.testing.assert_allclose(out.array, f(x.array), rtol=1e-5)


def test_power_with_constant_exponent_under_jit():
    q = Quantity(4.0, "m")
    for f, power in [(lambda x: x**1.5, 1.5), (lambda x: jnp.power(x, 0.5), 0.5)]:
        out = jax.jit(quax.quaxify(f))(q)
        assert out.units == {meters: power}
        np.testing.assert_allclose(out.array, f(4.0), rtol=1e-6)


def test_equinox_loop_primitives_keep_units():
    y, other = Quantity(jnp.ones(2), "m"), Quantity(jnp.zeros(2), "km")
    out = quax.quaxify(lambda p, a, b: select_if_vmap_p.bind(p, a, b))(True, y, other)
    assert out.units == {meters: 1}
    buffer = Quantity(jnp.zeros((3, 2)), "m")

    def write(buffer, y):
        return _maybe_set(True, buffer, y, 1, kwargs={}, makes_false_steps=False)

    out = quax.quaxify(write)(buffer, y)
    assert out.units == {meters: 1}
    np.testing.assert_array_equal(out.array, [[0, 0], [1, 1], [0, 0]])
    with pytest.raises(UnitError, match="`maybe_set` needs operands"):
        quax.quaxify(write)(buffer, Quantity(jnp.ones(2), "s"))


def test_interp_with_plain_grid_and_quantity_values():
    # `jnp.interp` finds the interval with `searchsorted` (`lt_to`, `eq_to`).
    xp = jnp.array([0.0, 1.0, 2.0])
    fp = Quantity(jnp.array([0.0, 10.0, 40.0]), "m")
    out = quax.quaxify(jnp.interp)(jnp.array([0.5, 1.5, 3.0]), xp, fp)
    assert out.units == {meters: 1}
    np.testing.assert_allclose(ustrip("m", out), [5.0, 25.0, 40.0])
    idx = quax.quaxify(jnp.searchsorted)(
        Quantity(jnp.array([1.0, 2.0]), "m"), Quantity(jnp.array([150.0]), "cm")
    )
    np.testing.assert_array_equal(idx, [1])


def test_interp_on_a_quantity_grid_says_why_it_is_refused():
    # jnp.interp compares |xp[i] - xp[i-1]| with a unitless epsilon, and divides by
    # `where(dx == 0, 1, dx)`: both mix a length with a plain number.
    xp = Quantity(jnp.array([0.0, 1.0, 2.0]), "s")
    with pytest.raises(UnitError, match="same dimensions"):
        quax.quaxify(jnp.interp)(Quantity(0.5, "s"), xp, xp)


def test_histogram_with_quantity_bin_edges():
    x = Quantity(jnp.array([1.0, 2.0, 3.0, 3.5]), "m")
    edges = Quantity(jnp.array([0.0, 150.0, 250.0, 400.0]), "cm")
    counts, out_edges = quax.quaxify(lambda x, e: jnp.histogram(x, bins=e))(x, edges)
    np.testing.assert_array_equal(counts, [1.0, 1.0, 2.0])
    np.testing.assert_allclose(ustrip("m", out_edges), [0.0, 1.5, 2.5, 4.0])
    density, _ = quax.quaxify(lambda x, e: jnp.histogram(x, bins=e, density=True))(
        x, edges
    )
    assert density.units == {meters: -1}
    np.testing.assert_allclose(ustrip("1 / m", density), [1 / 6, 1 / 4, 1 / 3])
    # A number of bins pads a degenerate range by a plain 0.5: refused.
    with pytest.raises(UnitError, match="same dimensions"):
        quax.quaxify(lambda x: jnp.histogram(x, bins=3))(x)


def test_cumprod_of_a_dimensionless_quantity():
    ratio = quax.quaxify(lambda a, b: jnp.cumprod(a / b))(
        Quantity(jnp.array([1.0, 2.0, 3.0]), "km"), Quantity(500.0, "m")
    )
    np.testing.assert_allclose(ustrip("", ratio), [2.0, 8.0, 48.0])
    pct = quax.quaxify(jnp.cumprod)(Quantity(jnp.array([50.0, 50.0]), "%"))
    np.testing.assert_allclose(ustrip("", pct), [0.5, 0.25])
    with pytest.raises(UnitError, match=r"units raised to the power i \+ 1"):
        quax.quaxify(jnp.cumprod)(Quantity(jnp.array([1.0, 2.0]), "m"))
