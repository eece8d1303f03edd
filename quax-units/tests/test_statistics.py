"""Statistics from `jax.numpy` on quantities; equinox's loop primitives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from equinox.internal._loop.common import _maybe_set, select_if_vmap_p
from quax_units import Quantity, UnitError, meters


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
