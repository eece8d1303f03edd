"""diffrax on `Quantity` states, with adaptive steps, and the shape probes it makes
(`jax.eval_shape`, `eqx.filter_eval_shape`) seeing units inside quaxify."""

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import quax
from quax_units import Quantity, ustrip


def _no_leak_check():
    """JAX's tracer-leak checker crashes (IndexError in `leaked_tracer_error`) on
    the abstract evaluation of Equinox primitives (diffrax's loops), with or
    without quax (see `test_real_programs.py`): the solves run without it."""
    return jax.check_tracer_leaks(False)


def test_eval_shape_inside_quaxify_sees_units():
    seen = {}

    def f(y, v):
        seen["closure"] = jax.eval_shape(lambda: y)
        seen["derived"] = jax.eval_shape(lambda: y / v)
        seen["filtered"] = eqx.filter_eval_shape(lambda a, s: (a * a, s), y, "tag")
        return y / v

    out = quax.quaxify(f)(Quantity(jnp.array([1.0, 2.0]), "m"), Quantity(2.0, "m/s"))
    closure, derived = seen["closure"], seen["derived"]
    assert isinstance(closure, Quantity) and closure.unit == Quantity(1.0, "m").unit
    assert isinstance(derived, Quantity) and derived.unit == out.unit
    assert derived.value == jax.ShapeDtypeStruct((2,), jnp.float32)
    square, tag = seen["filtered"]
    assert tag == "tag"
    assert isinstance(square, Quantity)
    assert square.unit == Quantity(1.0, "m2").unit


def _solve(y0, rate, atol, solver, dt0):
    term = dfx.ODETerm(lambda t, y, args: -args * y)
    sol = dfx.diffeqsolve(
        term,
        solver,
        t0=0.0,
        t1=1.0,
        dt0=dt0,
        y0=y0,
        args=rate,
        saveat=dfx.SaveAt(ts=jnp.linspace(0.0, 1.0, 5)),
        stepsize_controller=dfx.PIDController(rtol=1e-8, atol=atol),
    )
    return sol.ys, sol.stats["num_steps"]


def test_adaptive_steps_with_a_quantity_state():
    # `PIDController` scales the error by `atol + rtol * |y|`: with a state in
    # metres, `atol` is a length too. Float64, as adaptive solves are run.
    with jax.enable_x64(True), _no_leak_check():
        y0 = jnp.array([1.0, 2.0])
        want, want_steps = _solve(y0, 0.5, 1e-8, dfx.Tsit5(), None)
        solve = lambda y, atol: _solve(y, 0.5, atol, dfx.Tsit5(), None)
        got, steps = jax.jit(quax.quaxify(solve))(
            Quantity(y0 * 100, "cm"), Quantity(1e-6, "cm")
        )
        assert got.value.dtype == jnp.float64
        np.testing.assert_allclose(ustrip("m", got), want, rtol=1e-6)
        # The same steps: the controller sees the same numbers.
        assert int(steps) == int(want_steps)
        np.testing.assert_allclose(want[-1], y0 * np.exp(-0.5), rtol=1e-6)
