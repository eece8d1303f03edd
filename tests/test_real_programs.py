"""Third-party programs run unchanged on custom values: optax, lineax, diffrax."""

import sys
from pathlib import Path
from typing import cast

import diffrax as dfx
import jax
import jax.numpy as jnp
import lineax as lx
import optax
import pytest
import quax


sys.path.insert(0, str(Path(__file__).parents[1] / "quax-core" / "tests"))
from helpers import Dense, Liftable, Refusing, dense


def test_optax_adam_step_on_values():
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))

    def step(params, state):
        grads = jax.tree.map(lambda p: 2 * p, params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    # optax types the updated parameters as its `ArrayTree`: here the dict given.
    expected = cast(dict[str, jax.Array], step(params, opt.init(params))[0])
    wrapped = {k: Refusing(v) for k, v in params.items()}
    state = quax.quaxify(opt.init)(wrapped)
    new, state = jax.jit(quax.quaxify(step))(wrapped, state)
    assert all(isinstance(v, Refusing) for v in new.values())
    for k in params:
        assert jnp.allclose(new[k].array, expected[k], atol=1e-6)


def _no_leak_check():
    """JAX's tracer-leak checker crashes (IndexError in `leaked_tracer_error`) on
    the abstract evaluation of Equinox primitives (lineax, diffrax), with or without
    quax: `lx.linear_solve` on plain arrays fails under it too. Those tests run
    without it."""
    return jax.check_tracer_leaks(False)


def test_lineax_solve_with_value_rhs():
    matrix = jnp.array([[3.0, 1.0], [1.0, 2.0]])
    b = jnp.array([1.0, 2.0])

    def solve(b):
        op = lx.MatrixLinearOperator(matrix)
        return lx.linear_solve(op, b, lx.LU()).value

    with _no_leak_check():
        expected = solve(b)
        out = quax.quaxify(solve)(Dense(b))
        grad = jax.grad(lambda b: jnp.sum(dense(quax.quaxify(solve)(Dense(b)))))(b)
        expected_grad = jax.grad(lambda b: jnp.sum(solve(b)))(b)
    assert jnp.allclose(dense(out), expected, atol=1e-5)
    assert jnp.allclose(grad, expected_grad, atol=1e-5)


def test_diffrax_solve_with_value_state():
    # An ODE solve (a while loop of Equinox primitives) on a state that refuses to
    # materialise: the loop runs on the value itself, and diffrax's plain output
    # buffers are lifted into its type.
    def solve(y0):
        term = dfx.ODETerm(lambda t, y, args: -0.5 * y)
        sol = dfx.diffeqsolve(term, dfx.Tsit5(), t0=0.0, t1=1.0, dt0=0.1, y0=y0)
        assert sol.ys is not None  # saved at t1, the default
        return sol.ys[-1]

    y0 = jnp.array([1.0, 2.0])
    with _no_leak_check():
        out = quax.quaxify(solve)(Liftable(y0))
    assert isinstance(out, Liftable)
    assert jnp.allclose(out.array, y0 * jnp.exp(-0.5), atol=1e-4)


_SOLVES = {
    # The default `SaveAt(t1=True)`: the final state overwrites a buffer that the
    # loop passed through untouched, behind a `cond` on a static flag.
    "tsit5-t1": (dfx.Tsit5(), dfx.SaveAt(t1=True)),
    # Tsit5 saving at times repeats what Euler's and Dopri5's times and Tsit5's `t1`
    # check: a sweep (`bash scripts/test.sh sweeps`).
    "tsit5-ts": pytest.param(
        dfx.Tsit5(),
        dfx.SaveAt(ts=jnp.linspace(0.0, 1.0, 5)),
        marks=pytest.mark.sweep,
    ),
    "euler-ts": (dfx.Euler(), dfx.SaveAt(ts=jnp.linspace(0.0, 1.0, 5))),
    "dopri5-ts": (dfx.Dopri5(), dfx.SaveAt(ts=jnp.linspace(0.0, 1.0, 5))),
    # Heun's stages are stacked (`jnp.stack`).
    "heun-t0-t1": (dfx.Heun(), dfx.SaveAt(t0=True, t1=True)),
    # Every step, into buffers of `max_steps` rows (8192 elements here).
    "tsit5-steps": (dfx.Tsit5(), dfx.SaveAt(steps=True)),
}


@pytest.mark.parametrize("solver, saveat", _SOLVES.values(), ids=_SOLVES.keys())
def test_diffrax_solve_with_a_quantity_state(solver, saveat):
    # diffrax writes its steps into buffers that start as plain zeros and infs,
    # passes them through a checkpointed loop (a `custom_vjp`), and guards its
    # solution with `eqx.error_if` (whose error branch is built from a shape): quax
    # gives them the state's units.
    from quax_units import Quantity, ustrip

    def solve(y0, rate):
        term = dfx.ODETerm(lambda t, y, args: -args * y)
        sol = dfx.diffeqsolve(
            term, solver, t0=0.0, t1=1.0, dt0=0.1, y0=y0, args=rate, saveat=saveat
        )
        assert sol.ys is not None  # every `saveat` of `_SOLVES` saves states
        return sol.ys

    y0 = jnp.array([1.0, 2.0])
    with _no_leak_check():
        expected = solve(y0, 0.5)
        eager = quax.quaxify(solve)(Quantity(y0, "m"), 0.5)
        jitted = jax.jit(quax.quaxify(solve))(Quantity(y0, "km"), 0.5)
    # `ustrip` checks the dimensions (a length); unused rows of a `steps` buffer
    # stay infinite, as in the plain solve. In km the solve runs on SI values, a
    # thousand times larger: float32 rounding differs by a few ulps per step.
    assert jnp.allclose(ustrip("m", eager), expected, rtol=1e-6, equal_nan=True)
    assert jnp.allclose(ustrip("km", jitted), expected, rtol=1e-5, equal_nan=True)


def test_diffrax_dense_output_with_a_quantity_state():
    # `SaveAt(dense=True)`: the interpolation's coefficients are recorded in buffers
    # too, and evaluating the solution between steps keeps the units.
    from quax_units import Quantity, ustrip

    def solve(y0):
        term = dfx.ODETerm(lambda t, y, args: -0.5 * y)
        saveat = dfx.SaveAt(dense=True, t1=True)
        sol = dfx.diffeqsolve(term, dfx.Tsit5(), 0.0, 1.0, 0.1, y0, saveat=saveat)
        assert sol.ys is not None  # saved at t1
        return sol.ys, sol.evaluate(0.55)

    y0 = jnp.array([1.0, 2.0])
    with _no_leak_check():
        expected = solve(y0)
        ys, mid = jax.jit(quax.quaxify(solve))(Quantity(y0, "m"))
    assert jnp.allclose(ustrip("m", ys), expected[0], rtol=1e-6)
    assert jnp.allclose(ustrip("m", mid), expected[1], rtol=1e-6)
    assert jnp.allclose(expected[1], y0 * jnp.exp(-0.5 * 0.55), rtol=1e-4)
