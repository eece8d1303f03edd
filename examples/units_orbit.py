"""A planet's orbit with physical constants, checked arguments and unit systems.

The Earth around the Sun, integrated by leapfrog steps in a `jax.lax.scan` whose
carry is a pair of `Quantity`s. The Sun's mass parameter comes from
`quax_units.constants` (CODATA 2022 `G` times IAU 2015's nominal solar mass), the
integrator declares the dimensions of its arguments with `quax_units.check_units`
(a time step given in metres is refused when the program is traced), and the
results are shown in the galactic unit system (`kpc`, `Myr`, `Msun`) as well as in
SI. The same program on plain numbers of SI units is the reference.

Needs `pip install quax-core quax-units`.

    python examples/units_orbit.py
"""

import jax
import jax.numpy as jnp
import quax
import quax_units
from quax_units import Quantity, UnitError, constants, galactic, ustrip


def make_orbit(steps: int):
    """A leapfrog integrator of `steps` steps around a point mass of mass
    parameter `gm` (a plain program: quantities or numbers of SI units alike)."""

    def orbit(x, v, dt, gm):
        def acceleration(x):
            r = jnp.sqrt(jnp.sum(x**2))
            return -gm * x / r**3

        def step(carry, _):
            x, v = carry
            v = v + 0.5 * dt * acceleration(x)
            x = x + dt * v
            v = v + 0.5 * dt * acceleration(x)
            return (x, v), x

        (x, v), xs = jax.lax.scan(step, (x, v), length=steps)
        return x, v, xs

    return orbit


def main(steps: int = 2000) -> dict[str, str]:
    """Integrate one sidereal year of the Earth's orbit; returns summary figures."""
    gm = constants.G * constants.M_sun  # m3 / s2
    au = Quantity(1.0, "au")
    # Python operators on quantities, outside quaxify: a circular orbit's speed and
    # period (Kepler's third law).
    speed = (gm / au) ** 0.5
    period = 2 * jnp.pi * (au**3 / gm) ** 0.5
    print(f"circular speed at 1 au: {float(ustrip('km / s', speed)):.3f} km / s")
    in_galactic = float(speed.decompose(galactic).value)
    print(f"  in galactic units: {in_galactic:.6f} kpc / Myr")
    print(f"period: {float(ustrip('d', period)):.3f} days")

    checked = quax_units.check_units(x="m", v="m / s", dt="s", gm="m3 / s2")(
        make_orbit(steps)
    )
    x0 = Quantity(jnp.array([1.0, 0.0]), "au")
    v0 = Quantity(jnp.array([0.0, 1.0]), "km / s") * ustrip("km / s", speed)
    dt = period / steps
    x, v, xs = jax.jit(quax.quaxify(checked))(x0, v0, dt, gm)

    # The reference: the same program on plain numbers of SI units.
    plain = jax.jit(make_orbit(steps))
    x_ref, v_ref, xs_ref = plain(
        ustrip("m", x0), ustrip("m / s", v0), ustrip("s", dt), ustrip("m3 / s2", gm)
    )
    difference = max(
        float(jnp.max(jnp.abs(ustrip("m", xs) - xs_ref))),
        float(jnp.max(jnp.abs(ustrip("m", x) - x_ref))),
        float(jnp.max(jnp.abs(ustrip("m / s", v) - v_ref))),
    )
    closure_km = float(jnp.sqrt(jnp.sum((ustrip("m", x) - ustrip("m", x0)) ** 2)))
    closure_km /= 1e3
    print(f"after one period the Earth is {closure_km:.0f} km from its start")
    print(f"max |unitful - plain| (positions in m, velocities in m/s): {difference}")

    try:
        jax.jit(quax.quaxify(checked))(x0, v0, Quantity(1.0, "m"), gm)
        refusal = "none"
    except UnitError as e:
        refusal = str(e).split(" (those")[0]
    print(f"a time step in metres: {refusal}")
    return {
        "circular speed": f"{float(ustrip('km / s', speed)):.3f} km / s",
        "period": f"{float(ustrip('d', period)):.3f} d",
        "closure after one period": f"{closure_km:.0f} km",
        "max |unitful - plain|": f"{difference:.1e}",
        "time step in metres": refusal,
    }


if __name__ == "__main__":
    print(main())
