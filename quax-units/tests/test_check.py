"""`check_units`: the dimensions of arguments and return values, checked when a
function is called (at trace time under `jit`): compatible units accepted,
everything else refused with a `UnitError` naming the argument, the function, the
expected and the actual dimensions; outside and inside `quax.quaxify`, under
`jit`, `vmap` and `grad`; plain arrays only where dimensionless."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
from quax_units import Quantity, UnitError, check_units, ustrip


@check_units(x="m", t="s", return_="m / s")
def speed(x, t):
    """Distance over time."""
    return x / t


def _plain_speed(x, t):
    return x / t


def test_compatible_units_are_accepted_and_numbers_unchanged():
    x, t = Quantity(jnp.array([3.0, 6.0]), "km"), Quantity(2.0, "h")
    v = speed(x, t)
    np.testing.assert_allclose(ustrip("km / h", v), [1.5, 3.0], rtol=1e-6)
    np.testing.assert_allclose(ustrip("m / s", v), [1 / 2.4, 1 / 1.2], rtol=1e-6)
    assert speed.__name__ == "speed" and speed.__doc__ == "Distance over time."
    # Keywords, and an offset unit for its dimensions (degC is a temperature).
    assert ustrip("m / s", speed(t=Quantity(1.0, "s"), x=Quantity(2.0, "m"))) == 2.0
    warm = check_units(T="K")(lambda T: T)(Quantity(20.0, "degC"))
    np.testing.assert_allclose(ustrip("K", warm), 293.15, rtol=1e-6)


def _message(where, want, got):
    # `where` and `got` are patterns.
    return (
        f"check_units: {where} must have dimensions {re.escape(want)}"
        rf" \(those of .*\), but got {got}"
    )


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            (Quantity(3.0, "km"), Quantity(2.0, "m")),
            _message(
                "argument `t` of `speed`", "s", r"a quantity in m \(dimensions m\)"
            ),
        ),
        (
            (Quantity(3.0, "s"), Quantity(2.0, "s")),
            _message("argument `x` of `speed`", "m", r"a quantity in s"),
        ),
        (
            (Quantity(3.0, "km"), 2.0),
            _message(
                "argument `t` of `speed`",
                "s",
                # Inside quaxify the number is a traced array.
                r"(the plain number 2.0|a plain array float32\[\]) \(dimensionless\)",
            ),
        ),
        (
            (jnp.array([3.0]), Quantity(2.0, "s")),
            _message("argument `x` of `speed`", "m", r"a plain array float32\[1\]"),
        ),
        (
            (np.float64(3.0), Quantity(2.0, "s")),
            _message("argument `x` of `speed`", "m", r"a plain array"),
        ),
    ],
)
def test_refused_arguments(args, match):
    with pytest.raises(UnitError, match=match):
        speed(*args)
    # Also inside `quax.quaxify`, under `jit`: when the program is traced.
    with pytest.raises(UnitError, match=match):
        jax.jit(quax.quaxify(speed)).trace(*args)


def test_refused_return_value():
    @check_units(x="m", return_="m2")
    def volume(x):
        return x**3

    match = _message(
        "the return value of `.*volume`", "m2", r"a quantity in m3 \(dimensions m3\)"
    )
    with pytest.raises(UnitError, match=match):
        volume(Quantity(2.0, "m"))
    with pytest.raises(UnitError, match=match):
        jax.jit(quax.quaxify(volume))(Quantity(2.0, "m"))
    with pytest.raises(UnitError) as error:
        volume(Quantity(2.0, "m"))
    assert "`test_refused_return_value.<locals>.volume`" in str(error.value)


def test_inside_quaxify_jit_vmap_grad():
    x = Quantity(jnp.array([3.0, 6.0]), "km")
    t = Quantity(jnp.array([1.0, 2.0]), "h")
    expected = ustrip("m / s", quax.quaxify(_plain_speed)(x, t))
    for f in [
        quax.quaxify(speed),
        jax.jit(quax.quaxify(speed)),
        quax.quaxify(jax.vmap(speed)),
        jax.jit(quax.quaxify(jax.vmap(speed))),
        jax.vmap(speed),  # outside quaxify: quantities with batched arrays
        jax.jit(speed),  # quantities with traced arrays
    ]:
        np.testing.assert_allclose(ustrip("m / s", f(x, t)), expected, rtol=1e-6)
    # vmap inside quaxify still refuses.
    with pytest.raises(UnitError, match="argument `t` of `speed`"):
        quax.quaxify(jax.vmap(speed))(x, x)
    # grad inside quaxify: d(x / t)/dx = 1 / t, in 1 / s.
    x0, t0 = Quantity(3.0, "km"), Quantity(2.0, "s")
    g = quax.quaxify(jax.grad(lambda x, t: speed(x, t)))(x0, t0)
    np.testing.assert_allclose(ustrip("1 / s", g), 0.5, rtol=1e-6)
    # ... with the check refusing there too, and quax_units.grad outside.
    with pytest.raises(UnitError, match="argument `t` of `speed`"):
        quax.quaxify(jax.grad(lambda x, t: speed(x, t)))(x0, x0)
    g = quax_units.grad(quax.quaxify(lambda t: speed(x0, t)), argnums=0)(t0)
    # d(x / t)/dt = -x / t^2 = -3000 / 4 m / s2.
    np.testing.assert_allclose(ustrip("m / s2", g), -750.0, rtol=1e-6)


def test_the_check_costs_nothing():
    # Inside quaxify the rule checks and passes the quantity on: the program is
    # the undecorated one.
    x, t = Quantity(3.0, "km"), Quantity(2.0, "s")
    checked = jax.make_jaxpr(quax.quaxify(speed))(x, t)
    plain = jax.make_jaxpr(quax.quaxify(_plain_speed))(x, t)
    assert str(checked) == str(plain)


def test_dimensionless_arguments():
    @check_units(theta="", ratio="dimensionless")
    def f(theta, ratio):
        return jnp.sin(theta) * ratio

    expected = np.sin(0.5) * 0.25
    np.testing.assert_allclose(f(0.5, 0.25), expected, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(f)(0.5, jnp.array(0.25)), expected, 1e-6)
    np.testing.assert_allclose(jax.grad(f)(0.5, 0.25), np.cos(0.5) * 0.25, 1e-6)
    batched = jax.vmap(f, in_axes=(0, None))(jnp.array([0.5]), 0.25)
    np.testing.assert_allclose(batched, [expected], 1e-6)
    # Dimensionless quantities (% and rad are numbers).
    out = quax.quaxify(f)(Quantity(0.5, "rad"), Quantity(25.0, "%"))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)
    match = (
        re.escape("check_units: argument `ratio` of ")
        + r".*must be dimensionless .*but got a quantity in m \(dimensions m\)"
    )
    with pytest.raises(UnitError, match=match):
        f(0.5, Quantity(1.0, "m"))
    with pytest.raises(UnitError, match=match):
        jax.jit(quax.quaxify(f))(0.5, Quantity(1.0, "m"))


def test_pytrees_defaults_and_methods():
    @check_units(points="m", weights="kg", t="s")
    def centre(points, *weights, t=None):
        moment, total = points[0] * weights[0], weights[0]
        for p, w in zip(points[1:], weights[1:], strict=True):
            moment, total = moment + p * w, total + w
        return moment / total

    points = (Quantity(1.0, "m"), Quantity(3.0, "km"))
    c = centre(points, Quantity(1.0, "kg"), Quantity(1.0, "kg"))
    np.testing.assert_allclose(ustrip("m", c), 1500.5, rtol=1e-6)
    centre(points, Quantity(1.0, "kg"), Quantity(1.0, "g"), t=Quantity(1.0, "s"))
    with pytest.raises(UnitError, match=r"argument `points` of .* got a quantity in s"):
        centre((Quantity(1.0, "m"), Quantity(1.0, "s")), Quantity(1.0, "kg"))
    with pytest.raises(
        UnitError, match=r"argument `weights` of .* got a quantity in m"
    ):
        centre(points, Quantity(1.0, "kg"), Quantity(1.0, "m"))
    with pytest.raises(UnitError, match=r"argument `t` of .* got a quantity in m"):
        centre(points, Quantity(1.0, "kg"), Quantity(1.0, "g"), t=Quantity(1.0, "m"))

    metre = Quantity(1.0, "m")

    @check_units(t="s")
    def later(t=metre):
        return t

    with pytest.raises(UnitError, match=r"argument `t` of .*later"):
        later()  # a default other than None is checked

    class Body:
        @check_units(dt="s")
        def step(self, dt):
            return dt

    assert Body().step(Quantity(2.0, "ms")).units == Quantity(1.0, "s").units
    with pytest.raises(UnitError, match=r"argument `dt` of `.*Body.step`"):
        Body().step(Quantity(2.0, "m"))


def test_not_an_array_and_unknown_arguments():
    with pytest.raises(UnitError, match=r"argument `x` of .* got str 'three'"):
        speed("three", Quantity(1.0, "s"))
    with pytest.raises(
        ValueError,
        match=r"`.*<lambda>` has no argument 'y', 'z'; its arguments are 'x'\.",
    ):
        check_units(y="m", z="s")(lambda x: x).__call__  # noqa: B018
    with pytest.raises(ValueError, match="Unknown unit 'furlongs'"):
        check_units(x="furlongs")
