"""diffrax on `Quantity` states, with adaptive steps, and the shape probes it makes
(`jax.eval_shape`, `eqx.filter_eval_shape`) seeing units inside quaxify.

The solves run in float64, as adaptive solves are run, and carry the `float64`
marker: on a TPU, which has no native float64, lineax's LU fails in XLA's emulation
of it (seen on a TPU v5e), and they skip there."""

import functools as ft
import pathlib
import re
import subprocess
import sys

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest
import quax
import quax_units
import quax_units.diffrax as qudfx
from quax_units import Quantity, UnitError, ustrip


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
    assert sol.ys is not None  # saved at `ts`
    return sol.ys, sol.stats["num_steps"]


# Dopri5 interpolates the saved points with `jnp.polyval`, whose loop starts from
# plain zeros and multiplies them by a dimensionless quantity (the rescaled time).
# Kvaerno5 (implicit) solves each stage with a root finder (diffrax's `VeryChord`,
# with the controller's `atol`, in the state's units) whose state starts as plain
# infinities and zeros in the stage loop and passes through a `cond` that
# recomputes the Jacobian on the second stage: quax finds the state's units from
# the root finder's own loop, which gives them.
@pytest.mark.float64
@pytest.mark.parametrize(
    "solver", [dfx.Tsit5(), dfx.Dopri5(), dfx.Kvaerno5()], ids=type
)
def test_adaptive_steps_with_a_quantity_state(solver):
    # `PIDController` scales the error by `atol + rtol * |y|`: with a state in
    # metres, `atol` is a length too. Float64, as adaptive solves are run.
    with jax.enable_x64(True), _no_leak_check():
        y0 = jnp.array([1.0, 2.0])
        want, want_steps = _solve(y0, 0.5, 1e-8, solver, None)
        solve = lambda y, atol: _solve(y, 0.5, atol, solver, None)
        got, steps = jax.jit(quax.quaxify(solve))(
            Quantity(y0 * 100, "cm"), Quantity(1e-6, "cm")
        )
        assert got.value.dtype == jnp.float64
        np.testing.assert_allclose(ustrip("m", got), want, rtol=1e-6)
        # The same steps: the controller sees the same numbers.
        assert int(steps) == int(want_steps)
        np.testing.assert_allclose(want[-1], y0 * np.exp(-0.5), rtol=1e-6)


@pytest.mark.float64
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_lineax_solve_gives_the_units_of_vector_over_operator(jit):
    # lineax binds its solve as one primitive of its own (optimistix's root finders
    # and diffrax's implicit solvers call it): its LU steps run under the rules.
    # Without the leak checker, as for the solves (lineax's primitive is Equinox's).
    with jax.enable_x64(True), _no_leak_check():
        a = jnp.array([[2.0, 0.5], [0.1, 3.0]])
        b = jnp.array([1.0, 2.0])
        want = np.linalg.solve(np.asarray(a), np.asarray(b))

        def solve(a, b):
            return lx.linear_solve(lx.MatrixLinearOperator(a), b, lx.LU()).value

        f = jax.jit(quax.quaxify(solve)) if jit else quax.quaxify(solve)
        stiffness = f(Quantity(a, "N / m"), Quantity(b * 1000, "mN"))
        np.testing.assert_allclose(ustrip("m", stiffness), want, rtol=1e-12)
        # A plain (dimensionless) operator: the solution has the vector's units.
        plain = f(a, Quantity(b, "N"))
        np.testing.assert_allclose(ustrip("N", plain), want, rtol=1e-12)
        # The units follow the solve's steps: a length is not a force.
        with pytest.raises(UnitError):
            ustrip("N", f(Quantity(a, "N / m"), Quantity(b, "N")))
        # Differentiable through the steps.
        grad = jax.grad(
            lambda s: ustrip(
                "m", quax.quaxify(solve)(Quantity(a, "N / m"), s * Quantity(b, "N"))
            ).sum()
        )(1.0)
        np.testing.assert_allclose(grad, want.sum(), rtol=1e-12)


_SECOND = Quantity(1.0, "s")


def _rate(t, y, args):
    """A physical vector field: the state's units per second."""
    return -args * y


def _solve_in_seconds(y0, rate, t0, t1, dt0, atol):
    """An adaptive solve whose times are quantities at the boundary: diffrax gets
    them in seconds, and a vector field that gives its time units back and
    returns its rate times one second (the change per plain second)."""
    term = dfx.ODETerm(lambda t, y, args: _rate(t * _SECOND, y, args) * _SECOND)
    sol = dfx.diffeqsolve(
        term,
        dfx.Tsit5(),
        t0=ustrip("s", t0),
        t1=ustrip("s", t1),
        dt0=ustrip("s", dt0),
        y0=y0,
        args=rate,
        saveat=dfx.SaveAt(ts=jnp.linspace(ustrip("s", t0), ustrip("s", t1), 5)),
        stepsize_controller=dfx.PIDController(rtol=1e-8, atol=atol),
    )
    assert sol.ys is not None
    return sol.ys, sol.stats["num_steps"]


@pytest.mark.float64
def test_adaptive_solve_with_times_as_quantities():
    """Times given as quantities (`t0`, `t1`, `dt0` in any unit of time), the
    state in centimetres, the rate per second: the plain-time solve's numbers
    and steps."""
    with jax.enable_x64(True), _no_leak_check():
        y0 = jnp.array([1.0, 2.0])
        want, want_steps = _solve(y0, 0.5, 1e-8, dfx.Tsit5(), 0.1)
        got, steps = jax.jit(quax.quaxify(_solve_in_seconds))(
            Quantity(y0 * 100, "cm"),
            Quantity(0.5, "1 / s"),
            Quantity(0.0, "s"),
            Quantity(1000.0, "ms"),
            Quantity(100.0, "ms"),
            Quantity(1e-6, "cm"),
        )
        np.testing.assert_allclose(ustrip("m", got), want, rtol=1e-9)
        assert int(steps) == int(want_steps)


@pytest.mark.float64
def test_times_as_quantities_inside_diffrax_say_how_to_pass_them():
    """diffrax divides by `jnp.where(t0 == t1, 1, t1 - t0)` (`linear_rescale`): a
    plain 1 beside seconds, which no rule can give units (it would read a plain
    constant beside kilometres as metres). The refusal says how to pass times."""

    def solve(y0, t0, t1, dt0):
        term = dfx.ODETerm(lambda t, y, args: -0.5 * y / _SECOND)
        sol = dfx.diffeqsolve(
            term,
            dfx.Tsit5(),
            t0=t0,
            t1=t1,
            dt0=dt0,
            y0=y0,
            stepsize_controller=dfx.PIDController(rtol=1e-6, atol=Quantity(1e-8, "m")),
        )
        return sol.ys

    with (
        jax.enable_x64(True),
        _no_leak_check(),
        pytest.raises(
            UnitError,
            match=r"`select_n` needs .* s \[s\] and plain array.*"
            r"diffrax's `linear_rescale`.*`quax_units\.diffrax\.diffeqsolve`.*"
            r"ustrip\('s', t0\).*f\(t \* s, y, args\) \* s",
        ),
    ):
        quax.quaxify(solve)(
            Quantity(jnp.array([1.0, 2.0]), "m"),
            Quantity(0.0, "s"),
            Quantity(1.0, "s"),
            Quantity(0.1, "s"),
        )


def test_atol_in_the_wrong_units_reports_the_first_unit_error():
    """An `atol` in seconds beside a state in centimetres: the error quax caught
    first, while it traced the loop's first iteration to find its carries' types
    (`atol + rtol * |y|` adds seconds to centimetres), is quoted in the error the
    loop ends with (about the plain carry the loop then ran on), not lost."""
    solve = lambda y, atol: _solve(y, 0.5, atol, dfx.Tsit5(), None)
    with (
        jax.enable_x64(True),
        _no_leak_check(),
        pytest.raises(UnitError) as error,
    ):
        jax.jit(quax.quaxify(solve))(
            Quantity(jnp.array([100.0, 200.0]), "cm"), Quantity(1e-6, "s")
        )
    notes = "\n".join(getattr(error.value, "__notes__", []))
    assert re.search(r"UnitError: `add` needs .* s \[s\] and cm \[m\]", notes), notes


# `quax_units.diffrax.diffeqsolve`: diffrax's solve with times as quantities ----------


def _tsit5(y0, rate, t0, t1, dt0, saveat, controller, **kwargs):
    """An adaptive Tsit5 solve of `_rate` through `quax_units.diffrax`."""
    return qudfx.diffeqsolve(
        dfx.ODETerm(_rate),
        dfx.Tsit5(),
        t0,
        t1,
        dt0,
        y0,
        rate,
        saveat=saveat,
        stepsize_controller=controller,
        **kwargs,
    )


def _times_solve(y0, rate, t0, t1, dt0, atol, dtmax):
    """The adaptive Tsit5 solve of `_solve`, through `quax_units.diffrax`, saved at
    five times from `t0` to `t1` (quantities where the times are)."""
    sol = _tsit5(
        y0,
        rate,
        t0,
        t1,
        dt0,
        dfx.SaveAt(ts=jnp.linspace(t0, t1, 5)),
        dfx.PIDController(rtol=1e-8, atol=atol, dtmax=dtmax),
    )
    return sol.ys, sol.stats["num_steps"], sol.ts, sol.t0, sol.t1


def _plain_reference(y0, rate, t1, dt0, dtmax):
    """The same solve with plain times, through diffrax itself."""
    sol = dfx.diffeqsolve(
        dfx.ODETerm(_rate),
        dfx.Tsit5(),
        0.0,
        t1,
        dt0,
        y0,
        args=rate,
        saveat=dfx.SaveAt(ts=jnp.linspace(0.0, t1, 5)),
        stepsize_controller=dfx.PIDController(rtol=1e-8, atol=1e-8, dtmax=dtmax),
    )
    assert sol.ys is not None  # saved at `ts`
    return sol.ys, sol.stats["num_steps"]


@pytest.mark.float64
@pytest.mark.parametrize("unit", ["s", "ms"])
def test_diffeqsolve_with_times_as_quantities(unit):
    """`t0`, `t1`, `dt0`, `SaveAt(ts=...)` and the controller's `dtmax` as
    quantities (in mixed units of time), the state in centimetres: the plain-time
    solve's numbers and steps, and the solution's times in `t0`'s unit."""
    scale = {"s": 1.0, "ms": 1000.0}[unit]
    with jax.enable_x64(True), _no_leak_check():
        y0 = jnp.array([1.0, 2.0])
        want, want_steps = _plain_reference(y0, 0.5, 1.0, 0.1, 0.3)
        got, steps, ts, t0, t1 = jax.jit(quax.quaxify(_times_solve))(
            Quantity(y0 * 100, "cm"),
            Quantity(0.5, "1 / s"),
            Quantity(0.0, unit),
            Quantity(1.0, "s"),
            Quantity(100.0, "ms"),
            Quantity(1e-6, "cm"),
            Quantity(0.3 * scale, unit),
        )
    np.testing.assert_allclose(ustrip("m", got), want, rtol=1e-9)
    assert int(steps) == int(want_steps)
    # The exact solution, independently of diffrax.
    np.testing.assert_allclose(
        ustrip("m", got)[-1], np.array([1.0, 2.0]) * np.exp(-0.5), rtol=1e-7
    )
    # The solution's times are quantities in t0's unit (under `jit`, the unit of
    # the first trace; the numbers are right whatever the display).
    for t, expected in ((ts, np.linspace(0.0, 1.0, 5)), (t0, 0.0), (t1, 1.0)):
        assert isinstance(t, Quantity)
        np.testing.assert_allclose(ustrip("s", t), expected, rtol=1e-12, atol=0)


@pytest.mark.float64
def test_minutes_and_seconds_give_the_same_physical_solve():
    """The same physical problem, with times in minutes and in seconds, eagerly.
    The `SaveAt` is built outside the quaxified function with `quax.quaxify`
    (diffrax converts `ts` with `jnp.asarray`, which refuses a quantity outside
    it)."""

    def solve(y0, rate, t0, t1, dt0, saveat, time_unit=None):
        atol = Quantity(1e-9, "m")
        controller = dfx.PIDController(rtol=1e-9, atol=atol)
        sol = _tsit5(y0, rate, t0, t1, dt0, saveat, controller, time_unit=time_unit)
        return sol.ys, sol.ts, sol.t1, sol.stats["num_steps"]

    with jax.enable_x64(True), _no_leak_check():
        y0 = Quantity(jnp.array([1.0, 2.0]), "m")
        rate = Quantity(0.01, "1 / s")
        in_minutes = Quantity(jnp.array([0.5, 1.0, 2.0]), "min")
        at_minutes = quax.quaxify(dfx.SaveAt)(ts=in_minutes)
        at_seconds = quax.quaxify(dfx.SaveAt)(ts=in_minutes.to("s"))
        minute, second = Quantity(1.0, "min"), Quantity(1.0, "s")
        minutes = quax.quaxify(solve)(
            y0, rate, 0.0 * minute, 2.0 * minute, second, at_minutes
        )
        seconds = quax.quaxify(solve)(
            y0, rate, 0.0 * second, 120.0 * second, second, at_seconds
        )
        in_seconds = quax.quaxify(ft.partial(solve, time_unit="s"))(
            y0, rate, 0.0 * minute, 2.0 * minute, second, at_minutes
        )
    exact = (
        np.array([1.0, 2.0]) * np.exp(-0.01 * np.array([30.0, 60.0, 120.0]))[:, None]
    )
    for (ys, ts, t1, _), shown in (
        (minutes, "min"),
        (seconds, "s"),
        (in_seconds, "s"),
    ):
        np.testing.assert_allclose(ustrip("m", ys), exact, rtol=1e-7)
        assert ts.unit == quax_units.unit(shown)
        np.testing.assert_allclose(ustrip("s", ts), [30.0, 60.0, 120.0], rtol=1e-12)
        np.testing.assert_allclose(ustrip("s", t1), 120.0, rtol=1e-12)
    np.testing.assert_allclose(
        ustrip("m", minutes[0]), ustrip("m", seconds[0]), rtol=1e-9
    )
    # The same steps: only the numbers diffrax steps with differ.
    assert int(minutes[3]) == int(seconds[3]) == int(in_seconds[3])


@pytest.mark.float64
def test_controller_times_as_quantities():
    """A `ClipStepSizeController`'s `step_ts` around a `PIDController`'s `dtmin`,
    in milliseconds, in a solve in seconds: the plain solve's steps (it steps to
    each of `step_ts`) and numbers."""

    def solve(t0, t1, dt0, step_ts, dtmin, y0, rate, atol):
        pid = dfx.PIDController(rtol=1e-8, atol=atol, dtmin=dtmin)
        controller = dfx.ClipStepSizeController(pid, step_ts=step_ts)
        sol = _tsit5(y0, rate, t0, t1, dt0, dfx.SaveAt(t1=True), controller)
        assert sol.ys is not None  # saved at `t1`
        return sol.ys[-1], sol.stats["num_steps"]

    with jax.enable_x64(True), _no_leak_check():
        y0, step_ts = jnp.array([1.0, 2.0]), jnp.array([0.25, 0.5, 0.75])
        want, want_steps = solve(0.0, 1.0, 0.1, step_ts, 1e-6, y0, 0.5, 1e-8)
        _, no_stop_steps = solve(0.0, 1.0, 0.1, None, 1e-6, y0, 0.5, 1e-8)
        got, steps = quax.quaxify(solve)(
            Quantity(0.0, "s"),
            Quantity(1.0, "s"),
            Quantity(100.0, "ms"),
            Quantity(step_ts * 1000, "ms"),
            Quantity(1e-3, "ms"),
            Quantity(y0, "m"),
            Quantity(0.5, "1 / s"),
            Quantity(1e-8, "m"),
        )
        np.testing.assert_allclose(ustrip("m", got), want, rtol=1e-9)
    assert int(steps) == int(want_steps)
    # The stops are taken: without them the solve takes other steps.
    assert int(no_stop_steps) != int(want_steps)


@pytest.mark.float64
def test_vector_fields_see_times_as_quantities():
    """A vector field that reads `t` (a constant acceleration's velocity, `a t`)
    gets it as a quantity in the solve's unit: `y(t1) = a t1^2 / 2`, which Tsit5
    integrates exactly, whatever the unit the solve steps in."""

    def solve(t0, t1, dt0, y0, acceleration):
        term = dfx.ODETerm(lambda t, y, args: args * t)
        sol = qudfx.diffeqsolve(term, dfx.Tsit5(), t0, t1, dt0, y0, acceleration)
        assert sol.ys is not None  # saved at `t1`
        return sol.ys[-1]

    with jax.enable_x64(True), _no_leak_check():
        for unit in ("ms", "s", "min"):
            y1 = quax.quaxify(solve)(
                Quantity(0.0, unit),
                Quantity(3.0, "s"),
                Quantity(500.0, "ms"),
                Quantity(0.0, "m"),
                Quantity(2.0, "m / s2"),
            )
            np.testing.assert_allclose(ustrip("m", y1), 9.0, rtol=1e-12)


@pytest.mark.float64
def test_multiterms_and_stepto_with_times_as_quantities():
    """A `MultiTerm` of two `ODETerm`s (each half of the acceleration), stepping
    to `StepTo` times in milliseconds with `dt0=None`, in a solve in seconds: each
    term sees `t` as a quantity; `y(t1) = a t1^2 / 2` exactly."""

    def solve(t0, t1, ts, y0, acceleration):
        half = dfx.ODETerm(lambda t, y, args: 0.5 * args * t)
        sol = qudfx.diffeqsolve(
            dfx.MultiTerm(half, half),
            dfx.Tsit5(),
            t0,
            t1,
            None,
            y0,
            acceleration,
            stepsize_controller=dfx.StepTo(ts=ts),
        )
        assert sol.ys is not None  # saved at `t1`
        return sol.ys[-1], sol.stats["num_steps"]

    with jax.enable_x64(True), _no_leak_check():
        y1, steps = quax.quaxify(solve)(
            Quantity(0.0, "s"),
            Quantity(3.0, "s"),
            Quantity(jnp.linspace(0.0, 3000.0, 7), "ms"),
            Quantity(0.0, "m"),
            Quantity(2.0, "m / s2"),
        )
        np.testing.assert_allclose(ustrip("m", y1), 9.0, rtol=1e-12)
    assert int(steps) == 6


@pytest.mark.float64
def test_a_plain_state_with_a_rate_per_unit_of_time():
    """A plain (dimensionless) state whose rate is per second: its change per
    plain millisecond is a dimensionless quantity, given to diffrax as plain
    numbers, as the state is. The plain solve's numbers."""

    def solve(t0, t1, dt0, y0, rate):
        sol = qudfx.diffeqsolve(dfx.ODETerm(_rate), dfx.Tsit5(), t0, t1, dt0, y0, rate)
        assert sol.ys is not None  # saved at `t1`
        return sol.ys[-1]

    with jax.enable_x64(True), _no_leak_check():
        y0 = jnp.array([1.0, 2.0])
        want = solve(0.0, 1.0, 0.1, y0, 0.5)
        got = jax.jit(quax.quaxify(solve))(
            Quantity(0.0, "ms"),
            Quantity(1.0, "s"),
            Quantity(100.0, "ms"),
            y0,
            Quantity(0.5, "1 / s"),
        )
        assert not isinstance(got, Quantity)
        np.testing.assert_allclose(got, want, rtol=1e-9)
        np.testing.assert_allclose(got, y0 * np.exp(-0.5), rtol=1e-6)


def test_a_plain_state_with_a_plain_rate_is_refused():
    """A plain state whose vector field returns plain numbers, with times as
    quantities: the rate per what? Refused (called outside `quax.quaxify`, where
    the vector field's output is a quantity that the check sees)."""
    with (
        _no_leak_check(),
        pytest.raises(UnitError, match=r"change over one ms is in ms \(s\), where a"),
    ):
        qudfx.diffeqsolve(
            dfx.ODETerm(_rate),
            dfx.Euler(),
            Quantity(0.0, "ms"),
            Quantity(1.0, "s"),
            Quantity(100.0, "ms"),
            jnp.array([1.0, 2.0]),
            0.5,
        )


@pytest.mark.float64
def test_save_functions_see_times_as_quantities():
    """A `SubSaveAt`'s `fn` gets `t` as a quantity in the solve's unit: saving `t`
    itself gives the save times in that unit."""
    with jax.enable_x64(True), _no_leak_check():

        def solve(t0, t1, dt0, y0, rate):
            ts = jnp.linspace(t0, t1, 3)
            sol = qudfx.diffeqsolve(
                dfx.ODETerm(_rate),
                dfx.Euler(),
                t0,
                t1,
                dt0,
                y0,
                rate,
                saveat=dfx.SaveAt(
                    subs=[
                        dfx.SubSaveAt(ts=ts, fn=lambda t, y, args: t * args),
                        dfx.SubSaveAt(t1=True),
                    ]
                ),
            )
            return sol.ys, sol.ts

        (scaled_times, y1), (ts, t1s) = quax.quaxify(solve)(
            Quantity(0.0, "ms"),
            Quantity(1.0, "s"),
            Quantity(0.1, "s"),
            Quantity(1.0, "m"),
            Quantity(1.0, "1 / s"),
        )
        # `t * args` is dimensionless: `t` was a time.
        np.testing.assert_allclose(
            ustrip("", scaled_times), [0.0, 0.5, 1.0], rtol=1e-12
        )
        np.testing.assert_allclose(ustrip("ms", ts), [0.0, 500.0, 1000.0], rtol=1e-12)
        np.testing.assert_allclose(ustrip("s", t1s), [1.0], rtol=1e-12)
        # Ten Euler steps of dy/dt = -y from 1 m.
        np.testing.assert_allclose(ustrip("m", y1), 0.9**10, rtol=1e-9)


@pytest.mark.float64
def test_plain_times_run_diffrax_unchanged():
    """Plain times: diffrax's own solve, bit for bit, also with a quantity state."""
    with jax.enable_x64(True), _no_leak_check():
        y0 = jnp.array([1.0, 2.0])
        want, want_steps = _plain_reference(y0, 0.5, 1.0, 0.1, 0.3)
        got, steps, ts, *_ = _times_solve(y0, 0.5, 0.0, 1.0, 0.1, 1e-8, 0.3)
        in_cm, cm_steps, *_ = quax.quaxify(_times_solve)(
            Quantity(y0 * 100, "cm"), 0.5, 0.0, 1.0, 0.1, Quantity(1e-6, "cm"), 0.3
        )
    np.testing.assert_array_equal(got, want)
    assert int(steps) == int(want_steps) == int(cm_steps)
    assert not isinstance(ts, Quantity)
    np.testing.assert_allclose(ustrip("m", in_cm), want, rtol=1e-12)


def _tsit5_in_ms(y0, rate, controller=None):
    """The state at `t1` of a Tsit5 solve of `_rate` from 0 ms to 1 s, in steps
    starting at 100 ms (constant without a `controller`), through
    `quax_units.diffrax`."""
    sol = qudfx.diffeqsolve(
        dfx.ODETerm(_rate),
        dfx.Tsit5(),
        Quantity(0.0, "ms"),
        Quantity(1.0, "s"),
        Quantity(100.0, "ms"),
        y0,
        rate,
        stepsize_controller=controller or dfx.ConstantStepSize(),
    )
    assert sol.ys is not None  # saved at `t1`
    return sol.ys[-1]


@pytest.mark.float64
def test_gradients_through_a_solve_with_times_as_quantities():
    """`jax.grad` with respect to the initial state and to the rate, through the
    solve with times in milliseconds (constant steps): the plain solve's
    gradients."""

    def plain(y0, rate):
        sol = dfx.diffeqsolve(dfx.ODETerm(_rate), dfx.Tsit5(), 0.0, 1.0, 0.1, y0, rate)
        assert sol.ys is not None  # saved at `t1`
        return sol.ys[-1].sum()

    def timed(y0, rate):
        y1 = _tsit5_in_ms(Quantity(y0, "m"), Quantity(rate, "1 / s"))
        return ustrip("m", y1).sum()

    with jax.enable_x64(True), _no_leak_check():
        y0, rate = jnp.array([1.0, 2.0]), 0.5
        want = jax.grad(plain, argnums=(0, 1))(y0, rate)
        got = jax.jit(jax.grad(quax.quaxify(timed), argnums=(0, 1)))(y0, rate)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-9)
    # d/dy0 of y0 e^{-r}: e^{-0.5}; d/dr: -(1 + 2) e^{-0.5} (Tsit5's ten steps).
    np.testing.assert_allclose(got[0], np.exp(-0.5), rtol=1e-6)
    np.testing.assert_allclose(got[1], -3.0 * np.exp(-0.5), rtol=1e-6)


def _decay(y0, rate, atol, solver, adaptive):
    """The state at `t = 1` of `y' = -rate y` from `t = 0`, plain times, with
    constant steps of 0.1 or adaptive ones (`atol` in the state's units)."""
    controller = (
        dfx.PIDController(rtol=1e-8, atol=atol) if adaptive else dfx.ConstantStepSize()
    )
    sol = dfx.diffeqsolve(
        dfx.ODETerm(_rate),
        solver,
        0.0,
        1.0,
        0.1,
        y0,
        rate,
        stepsize_controller=controller,
    )
    assert sol.ys is not None  # saved at `t1`
    return sol.ys[-1]


# Tsit5 and Dopri5 are first-same-as-last: their first stage is the last one of the
# step before, a carry that starts as plain zeros, whose cotangent equinox's
# backward loop starts from zeros too (quax lifts both into the state's units).
# Euler with constant steps and Tsit5 with adaptive ones (first-same-as-last and the
# controller's rejected steps) run in CI; the other four repeat those checks on more
# solvers and are sweeps (`bash scripts/test.sh sweeps`), 10-16 s of compiles each.
_GRADIENT_SOLVES = [
    pytest.param(dfx.Euler(), False, id="Euler-constant"),
    pytest.param(dfx.Heun(), False, id="Heun-constant", marks=pytest.mark.sweep),
    pytest.param(dfx.Heun(), True, id="Heun-PIDController", marks=pytest.mark.sweep),
    pytest.param(dfx.Tsit5(), False, id="Tsit5-constant", marks=pytest.mark.sweep),
    pytest.param(dfx.Tsit5(), True, id="Tsit5-PIDController"),
    pytest.param(
        dfx.Dopri5(), True, id="Dopri5-PIDController", marks=pytest.mark.sweep
    ),
]


@pytest.mark.float64
@pytest.mark.parametrize(("solver", "adaptive"), _GRADIENT_SOLVES)
def test_gradients_of_a_solve_on_a_quantity_state(solver, adaptive):
    """`jax.grad` of diffrax's solve on a `Quantity` state (and `atol`) with
    JVP-traced leaves, passed into `quax.quaxify`, with respect to the initial
    state and a plain rate: the plain solve's gradients. Diffrax's adjoint
    (equinox's checkpointed loop, a `custom_vjp`) mixes cotangents with the state
    (`sum(ct * y)` for the rate), which needs the cotangents per metre."""
    solve = ft.partial(_decay, solver=solver, adaptive=adaptive)

    def plain(y0, rate):
        return solve(y0, rate, 1e-8).sum()

    def in_cm(y0, rate):
        y1 = quax.quaxify(solve)(Quantity(y0 * 100, "cm"), rate, Quantity(1e-6, "cm"))
        return ustrip("m", y1).sum()

    with jax.enable_x64(True), _no_leak_check():
        y0, rate = jnp.array([1.0, 2.0]), 0.5
        want = jax.grad(plain, argnums=(0, 1))(y0, rate)
        got = jax.grad(in_cm, argnums=(0, 1))(y0, rate)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-9)
    # d/dy0 of y0 e^{-r}: e^{-0.5}; d/dr: -(1 + 2) e^{-0.5}, to the method's order.
    rtol = 1e-6 if adaptive else 5e-2
    np.testing.assert_allclose(got[0], np.exp(-0.5), rtol=rtol)
    np.testing.assert_allclose(got[1], -3.0 * np.exp(-0.5), rtol=rtol)


# Under `jit` with adaptive steps in CI; the other three pairs are sweeps.
@pytest.mark.float64
@pytest.mark.parametrize(
    ("jit", "adaptive"),
    [
        pytest.param(False, False, id="eager-constant", marks=pytest.mark.sweep),
        pytest.param(False, True, id="eager-PIDController", marks=pytest.mark.sweep),
        pytest.param(True, False, id="jit-constant", marks=pytest.mark.sweep),
        pytest.param(True, True, id="jit-PIDController"),
    ],
)
def test_gradients_of_a_solve_with_a_rate_per_second(jit, adaptive):
    """`jax.grad` with respect to the initial state (in centimetres) and a rate in
    `1 / s`, both passed into `quax.quaxify` as quantities, through a Tsit5 solve
    with times in milliseconds (`quax_units.diffrax.diffeqsolve`): the plain
    solve's gradients. The rate's cotangent, in seconds, is summed over the steps
    in equinox's backward loop from plain zeros, which quax lifts into seconds."""

    def controller(atol):
        if adaptive:
            return dfx.PIDController(rtol=1e-8, atol=atol)
        return dfx.ConstantStepSize()

    def plain(y0, rate):
        return _decay(y0, rate, 1e-8, dfx.Tsit5(), adaptive).sum()

    def solve(y0, rate, atol):
        return _tsit5_in_ms(y0, rate, controller(atol))

    def in_cm(y0, rate):
        y1 = quax.quaxify(solve)(
            Quantity(y0 * 100, "cm"), Quantity(rate, "1 / s"), Quantity(1e-6, "cm")
        )
        return ustrip("m", y1).sum()

    with jax.enable_x64(True), _no_leak_check():
        y0, rate = jnp.array([1.0, 2.0]), 0.5
        want = jax.grad(plain, argnums=(0, 1))(y0, rate)
        grad = jax.grad(in_cm, argnums=(0, 1))
        got = (jax.jit(grad) if jit else grad)(y0, rate)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-9)
    # d/dy0 of y0 e^{-r}: e^{-0.5}; d/dr: -(1 + 2) e^{-0.5}, to the method's order.
    np.testing.assert_allclose(got[0], np.exp(-0.5), rtol=1e-6)
    np.testing.assert_allclose(got[1], -3.0 * np.exp(-0.5), rtol=1e-6)


@pytest.mark.float64
def test_a_state_built_inside_and_taken_apart_by_diffrax_says_what_to_do():
    """A `Quantity` built inside the quaxified function is a pytree there, not a
    traced value: diffrax's step-size controller maps over its leaves, giving its
    numbers without units beside the `atol` in metres. The `UnitError` says to
    pass it in or write `jnp.asarray(q)`; with `jnp.asarray` the solve and its
    gradient are the plain program's."""

    def built_inside(y0, rate, join):
        y = Quantity(y0, "m")
        y = jnp.asarray(y) if join else y
        y1 = _decay(y, rate, Quantity(1e-8, "m"), dfx.Heun(), adaptive=True)
        return ustrip("m", y1).sum()

    def plain(y0, rate):
        return _decay(y0, rate, 1e-8, dfx.Heun(), adaptive=True).sum()

    with jax.enable_x64(True), _no_leak_check():
        y0, rate = jnp.array([1.0, 2.0]), 0.5
        with pytest.raises(UnitError, match=r"tree_map.*jnp\.asarray\(q\)"):
            quax.quaxify(built_inside)(y0, rate, False)
        want = jax.grad(plain, argnums=(0, 1))(y0, rate)
        got = jax.grad(
            lambda y, r: quax.quaxify(built_inside)(y, r, True), argnums=(0, 1)
        )(y0, rate)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-9)


_S = Quantity(1.0, "s")


@pytest.mark.parametrize(
    ("times", "kwargs", "error", "message"),
    [
        (
            (_S * 0.0, 1.0, _S * 0.1),
            {},
            UnitError,
            r"got `t0`, `dt0` as quantities and `t1` as plain numbers: give every "
            r"time as a quantity",
        ),
        (
            (_S * 0.0, _S, _S * 0.1),
            {
                "stepsize_controller": dfx.PIDController(
                    rtol=1e-6, atol=1e-6, dtmin=1e-3
                )
            },
            UnitError,
            r"`stepsize_controller.dtmin` as plain numbers",
        ),
        (
            (_S * 0.0, Quantity(1.0, "m"), _S * 0.1),
            {},
            UnitError,
            r"`t1` is not a time \(Cannot convert from m",
        ),
        (
            (0.0, 1.0, 0.1),
            {"time_unit": "s"},
            UnitError,
            r"got `time_unit` with plain times",
        ),
        (
            (_S * 0.0, _S, _S * 0.1),
            {"time_unit": "m"},
            UnitError,
            r"needs a unit of time, got m \(m\) as `time_unit`",
        ),
        (
            (_S * 0.0, _S, _S * 0.1),
            {"saveat": dfx.SaveAt(dense=True)},
            TypeError,
            r"does not save dense output",
        ),
        (
            (_S * 0.0, _S, _S * 0.1),
            {"event": dfx.Event(lambda t, y, args, **kw: t > 0.5)},
            TypeError,
            r"does not take an `event`",
        ),
    ],
    ids=[
        "mixed",
        "plain-dtmin",
        "not-a-time",
        "unit-with-plain",
        "unit-not-time",
        "dense",
        "event",
    ],
)
def test_diffeqsolve_refusals(times, kwargs, error, message):
    """Times that cannot be read without guessing a unit, and what the solve with
    times as quantities does not do, are refused before diffrax runs."""
    t0, t1, dt0 = times
    with pytest.raises(error, match=message):
        qudfx.diffeqsolve(
            dfx.ODETerm(_rate),
            dfx.Euler(),
            t0,
            t1,
            dt0,
            Quantity(1.0, "m"),
            _S**-1,
            **kwargs,
        )


def test_diffeqsolve_refuses_control_terms():
    """A `ControlTerm`'s control is a path diffrax evaluates at plain times."""
    control = dfx.ControlTerm(
        lambda t, y, args: y,
        dfx.LinearInterpolation(jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0])),
    )
    terms = dfx.MultiTerm(dfx.ODETerm(_rate), control)
    with pytest.raises(TypeError, match=r"not `ControlTerm`.*Solve with plain times"):
        qudfx.diffeqsolve(
            terms, dfx.Euler(), _S * 0.0, _S, _S * 0.1, Quantity(1.0, "m"), _S**-1
        )


def test_the_module_needs_no_diffrax(tmp_path):
    """quax-units installs without diffrax: with diffrax missing, the family (and
    `quax_units.diffrax`, as its layout check imports every module) imports, and
    `diffeqsolve` says what to install."""
    code = (
        "import sys\n"
        "sys.modules['diffrax'] = None\n"  # `import diffrax` raises ImportError
        "import quax, quax.testing, quax_units\n"
        "from quax_units.diffrax import diffeqsolve\n"
        "quax.testing.assert_family_layout('quax_units')\n"
        "try:\n"
        "    diffeqsolve(None, None, 0.0, 1.0, 0.1, 0.0)\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert "pip install diffrax" in out.stdout, out


def test_units_page_example_runs():
    """The diffrax example of docs/families/units.md, which the documentation tests
    skip (they run with the tracer-leak checker on, see `_no_leak_check`), runs here
    as written, and gives the results its comments state."""
    page = pathlib.Path(__file__).resolve().parent.parent / "docs/families/units.md"
    marker = "<!-- skip: next \"JAX's tracer-leak checker"
    after = page.read_text().split(marker, 1)[1]
    block = after.split("```python\n", 1)[1].split("```", 1)[0]
    assert "from quax_units.diffrax import diffeqsolve" in block
    namespace: dict = {}
    with _no_leak_check():
        exec(compile(block, str(page), "exec"), namespace)
    np.testing.assert_allclose(ustrip("s", namespace["ts"]), [0, 30, 60, 90, 120])
    np.testing.assert_allclose(
        ustrip("m", namespace["ys"])[-1], np.array([1.0, 2.0]) * np.exp(-1.2), rtol=1e-5
    )
