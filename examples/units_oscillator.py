"""A physics simulation with units, with quax-units and diffrax.

A damped mass on a spring, solved by an unmodified `diffrax.diffeqsolve` whose state is
a pair of `Quantity`s (position and velocity). diffrax's time is a plain number (here,
of seconds: the vector field multiplies by the `second` it is given, so that
`y + dt * f(t, y)` adds like units; diffrax's step-size controllers need a plain
time). Units are checked once, at trace time, and cost nothing at run time: the
compiled program is the plain one. Mixing up units is an error before anything runs.

At the end, Newton's law of cooling runs with adaptive step sizes (a
`PIDController` whose absolute tolerance is a temperature).

Needs `pip install quax-core quax-units diffrax`.

    python examples/units_oscillator.py
"""

import pathlib

import diffrax
import jax
import jax.numpy as jnp
import quax
from quax_units import Quantity, UnitError, ustrip


def oscillator(x0, v0, mass, stiffness, damping, second, ts):
    """`x'' = -(k x + c x') / m`, solved with Tsit5 at the times `ts` (plain numbers
    of `second`s)."""

    def field(t, y, args):
        x, v = y
        return v * second, -(stiffness * x + damping * v) / mass * second

    term = diffrax.ODETerm(field)
    saveat = diffrax.SaveAt(ts=ts)
    dt0 = (ts[1] - ts[0]) / 4
    solution = diffrax.diffeqsolve(
        term, diffrax.Tsit5(), ts[0], ts[-1], dt0, (x0, v0), saveat=saveat
    )
    return solution.ys


def cooling(temperature0, surroundings, rate, atol, ts):
    """Newton's law of cooling, `T' = -r (T - T_s)`, solved with adaptive steps: the
    step-size controller scales its error by `atol + rtol |T|`, so `atol` is a
    temperature too."""

    def field(t, temperature, args):
        return -rate * (temperature - surroundings)

    solution = diffrax.diffeqsolve(
        diffrax.ODETerm(field),
        diffrax.Tsit5(),
        ts[0],
        ts[-1],
        None,
        temperature0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=atol),
    )
    return solution.ys, solution.stats["num_steps"]


def kinetic_energy(m, v):
    return 0.5 * m * v**2


def main(out_dir: str | None = None) -> dict[str, str]:
    """Simulate the oscillator; plot the trajectory to
    `out_dir/units_oscillator.png` if given. Returns summary figures."""
    # 1. Checked at trace time, free at run time.
    energy = jax.jit(quax.quaxify(kinetic_energy))(
        Quantity(2.0, "kg"), Quantity(jnp.array([3.0, 4.0]), "km / s")
    )
    print(f"kinetic energy: {ustrip('kJ', energy)} kJ")
    try:
        quax.quaxify(lambda a, b: a + b)(Quantity(1.0, "m"), Quantity(1.0, "s"))
        refusal = "none"
    except UnitError as e:
        refusal = str(e).splitlines()[0]
    print(f"metres + seconds: {refusal}")

    # 2. diffrax, unchanged, on a state of quantities (centimetres in, the
    # units the program derives out).
    ts = jnp.linspace(0.0, 10.0, 201)
    second = Quantity(1.0, "s")
    simulate = jax.jit(quax.quaxify(oscillator))
    x, v = simulate(
        Quantity(10.0, "cm"),
        Quantity(0.0, "m / s"),
        Quantity(0.5, "kg"),
        Quantity(8.0, "N / m"),
        Quantity(0.3, "kg / s"),
        second,
        ts,
    )
    x_cm = ustrip("cm", x)
    # The closed form of the underdamped oscillator, in plain numbers (SI).
    m, k, c, x0 = 0.5, 8.0, 0.3, 0.10
    t = ts
    gamma = c / (2 * m)
    omega = jnp.sqrt(k / m - gamma**2)
    exact = (
        x0
        * jnp.exp(-gamma * t)
        * (jnp.cos(omega * t) + gamma / omega * jnp.sin(omega * t))
    )
    error_cm = float(jnp.max(jnp.abs(x_cm - 100 * exact)))
    print(f"x(10 s) = {float(x_cm[-1]):.3f} cm; max |x - exact| = {error_cm:.1e} cm")
    try:
        simulate(
            Quantity(10.0, "cm"),
            Quantity(0.0, "m / s"),
            Quantity(0.5, "kg"),
            Quantity(8.0, "N"),  # a force, not a stiffness
            Quantity(0.3, "kg / s"),
            second,
            ts,
        )
        wrong_stiffness = "none"
    except UnitError as e:
        wrong_stiffness = type(e).__name__
    print(f"stiffness given in N instead of N/m: {wrong_stiffness} at trace time")

    # 3. Adaptive steps (`PIDController`), on a temperature: the tolerance is a
    # temperature as well, and the steps are the plain solve's.
    hours = jnp.linspace(0.0, 5.0, 11)
    temperatures, steps = jax.jit(quax.quaxify(cooling))(
        Quantity(jnp.array([90.0, 60.0]), "K"),
        Quantity(20.0, "K"),
        0.8,
        Quantity(1e-6, "K"),
        hours,
    )
    closed = 20.0 + jnp.array([70.0, 40.0]) * jnp.exp(-0.8 * hours[:, None])
    cooling_error = float(jnp.max(jnp.abs(ustrip("K", temperatures) - closed)))
    print(
        f"cooling with adaptive steps ({int(steps)} steps): "
        f"max |T - closed form| = {cooling_error:.1e} K"
    )

    if out_dir is not None:
        _plot(
            t, x_cm, ustrip("cm / s", v), pathlib.Path(out_dir) / "units_oscillator.png"
        )
    return {
        "kinetic energy": f"{[round(float(e), 3) for e in ustrip('kJ', energy)]} kJ",
        "x(10 s)": f"{float(x_cm[-1]):.3f} cm",
        "max |x - closed form|": f"{error_cm:.1e} cm",
        "unit mistakes": f"refused at trace time ({wrong_stiffness})",
        "adaptive steps": f"{int(steps)} steps, max error {cooling_error:.1e} K",
    }


def _plot(t, x_cm, v_cms, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(t, x_cm, label="position (cm)")
    ax.plot(t, v_cms / 10, label="velocity (10 cm/s)")
    ax.set_xlabel("time (s)")
    ax.set_title("damped oscillator, diffrax on Quantity states")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    print(main())
