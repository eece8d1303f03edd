"""diffrax on `Quantity` states, with adaptive steps, and the shape probes it makes
(`jax.eval_shape`, `eqx.filter_eval_shape`) seeing units inside quaxify.

The solves run in float64, as adaptive solves are run, and carry the `float64`
marker: on a TPU, which has no native float64, lineax's LU fails in XLA's emulation
of it (seen on a TPU v5e), and they skip there."""

import re

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest
import quax
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
            r"diffrax's `linear_rescale`.*ustrip\('s', t0\).*f\(t \* s, y, args\) \* s",
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
