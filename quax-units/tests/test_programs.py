"""Control flow, autodiff and whole physics programs, against the plain program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from quax_units import (
    Quantity,
    UnitError,
    Unitful,
    kilograms,
    meters,
    seconds,
    unit,
    ustrip,
)


x0 = Quantity(jnp.array([0.0, 1.0]), "m")
v0 = Quantity(jnp.array([10.0, 20.0]), "m / s")
g = Quantity(jnp.array([0.0, -9.81]), "m / s2")
dt = Quantity(0.01, "s")


def _bare(tree):
    return jax.tree.map(
        lambda x: x.array if isinstance(x, Unitful) else x,
        tree,
        is_leaf=lambda x: isinstance(x, Unitful),
    )


def projectile_fori(x, v, g, dt):
    def step(i, state):
        x, v = state
        v = v + g * dt
        return x + v * dt, v

    return lax.fori_loop(0, 100, step, (x, v))


def projectile_scan(x, v, g, dt):
    def step(state, _):
        x, v = state
        v = v + g * dt
        x = x + v * dt
        return (x, v), 0.5 * jnp.sum(v * v)

    return lax.scan(step, (x, v), length=100)


def projectile_while(x, v, g, dt):
    def cond(state):
        x, _ = state
        return x[1] > x0_height

    def body(state):
        x, v = state
        v = v + g * dt
        return x + v * dt, v

    x0_height = -x[1] * 0  # a length, zero: the loop runs until the ball lands
    return lax.while_loop(cond, body, (x, v))


@pytest.mark.parametrize(
    "program", [projectile_fori, projectile_scan, projectile_while]
)
def test_physics_program_unchanged_with_units(program):
    args = (x0, v0, g, dt)
    out = jax.jit(quax.quaxify(program))(*args)
    want = jax.jit(program)(*_bare(args))
    for got, expected in zip(
        jax.tree.leaves(_bare(out)), jax.tree.leaves(want), strict=True
    ):
        np.testing.assert_array_equal(got, expected)
    x, v = out[0] if program is projectile_scan else out
    assert x.units == {meters: 1} and v.units == {meters: 1, seconds: -1}
    if program is projectile_scan:
        assert out[1].units == {meters: 2, seconds: -2}
        assert out[1].shape == (100,)


def test_cond_keeps_units():
    f = quax.quaxify(lambda p, x, y: lax.cond(p, lambda: x + y, lambda: x - y))
    out = jax.jit(f)(True, x0, Quantity(jnp.ones(2), "km"))
    np.testing.assert_allclose(out.value, [1000.0, 1001.0])
    assert out.units == {meters: 1}


def test_loop_changing_units_names_the_carry():
    def fori(x, v):
        return lax.fori_loop(0, 3, lambda i, c: c * v, x)

    def while_(x, v):
        return lax.while_loop(
            lambda c: jnp.array(False), lambda c: (c[0], c[1] * v), (v, x)
        )

    def scan(x, v):
        return lax.scan(lambda c, _: (c * v, None), x, length=2)

    for program, carry in [
        (fori, "carry.* of a scan"),
        (while_, r"carry.* of a while_loop"),
        (scan, "carry.* of a scan"),
    ]:
        with pytest.raises(
            Exception,
            match=rf"{carry}.*Refusing to materialise `Quantity` .*in m \(m\)",
        ) as info:
            jax.jit(quax.quaxify(program))(x0, v0)
        assert isinstance(info.value.__cause__, UnitError)


def test_cond_branches_with_different_units_raise():
    f = quax.quaxify(lambda p, x, v: lax.cond(p, lambda: x, lambda: v))
    with pytest.raises(Exception, match=r"output 0 of a cond.*plain array") as info:
        f(True, x0, v0)
    assert isinstance(info.value.__cause__, UnitError)


def test_quantity_built_inside_as_a_branch_output_or_initial_carry():
    # JAX compares the pytree structures of a cond's branch outputs (and of a
    # scan's carry) before quax sees the primitive: a `Quantity` built inside and
    # returned as it is stays a `Quantity` pytree beside the other branch's traced
    # array, and JAX raises. `jnp.asarray(q)` joins it to the quax trace (the way
    # out the README names); the results are the plain program's.
    fill = lambda: Quantity(jnp.array([5.0, 6.0]), "cm")
    cond = lambda p, x: lax.cond(p, lambda: x, lambda: jnp.asarray(fill()))
    scan = lambda x: lax.scan(lambda c, y: (c + y, c), jnp.asarray(fill()), x)
    for p in (True, False):
        for run in (quax.quaxify(cond), jax.jit(quax.quaxify(cond))):
            np.testing.assert_allclose(
                ustrip("m", run(p, x0)), x0.array if p else [0.05, 0.06]
            )
    xs = Quantity(jnp.array([[1.0, 2.0], [3.0, 4.0]]), "km")
    carry, ys = jax.jit(quax.quaxify(scan))(xs)
    plain_carry, plain_ys = lax.scan(
        lambda c, y: (c + y, c), jnp.array([0.05, 0.06]), xs.array
    )
    np.testing.assert_allclose(ustrip("m", carry), plain_carry, rtol=1e-6)
    np.testing.assert_allclose(ustrip("m", ys), plain_ys, rtol=1e-6)
    with pytest.raises(TypeError, match="pytree structure"):
        quax.quaxify(lambda p, x: lax.cond(p, lambda: x, fill))(True, x0)


def spring_energy(x, k):
    return 0.5 * k * jnp.sum(x**2)


def test_grad_has_units_of_output_over_input():
    k = Quantity(3.0, "N / m")
    x = Quantity(jnp.array([0.5, 2.0]), "cm")
    force = quax.quaxify(jax.grad(spring_energy))(x, k)
    assert force.units == unit("N").dimensions
    np.testing.assert_allclose(ustrip("N", force), 3.0 * x.array, rtol=1e-6)
    dk = quax.quaxify(jax.grad(spring_energy, argnums=1))(x, k)
    assert dk.units == {meters: 2}
    jitted = jax.jit(quax.quaxify(jax.grad(spring_energy)))(x, k)
    np.testing.assert_array_equal(
        jitted.array, jax.jit(jax.grad(spring_energy))(x.array, k.array)
    )


def test_value_and_grad_and_hessian():
    k = Quantity(3.0, "J / m3")
    value, grad = quax.quaxify(jax.value_and_grad(lambda x, k: jnp.sum(k * x**3)))(
        x0, k
    )
    assert value.units == unit("J").dimensions
    assert grad.units == unit("J / m").dimensions
    hess = quax.quaxify(jax.hessian(lambda x, k: jnp.sum(k * x**3)))(x0, k)
    assert hess.units == unit("J / m2").dimensions
    np.testing.assert_allclose(hess.array, jnp.diag(6 * k.array * x0.array))


def test_jvp_and_jacobian():
    x = Quantity(jnp.array([1.0, 2.0]), "m")
    t = Quantity(jnp.array([0.1, 0.2]), "m")
    out, tangent = quax.quaxify(lambda x, t: jax.jvp(lambda y: y**2, (x,), (t,)))(x, t)
    assert out.units == {meters: 2} and tangent.units == {meters: 2}
    np.testing.assert_allclose(tangent.array, 2 * x.array * t.array)
    jac = quax.quaxify(jax.jacrev(lambda x, m: m * x))(x, Quantity(2.0, "kg"))
    assert jac.units == {kilograms: 1}


def test_grad_through_loop():
    # The cotangent carry starts as plain zeros: quax-core lifts it into units with
    # `Unitful.lift`.
    def final_height(v, x, g, dt):
        x, _ = projectile_fori(x, v, g, dt)
        return x[1]

    grad = quax.quaxify(jax.grad(final_height))(v0, x0, g, dt)
    assert grad.units == {seconds: 1}
    want = jax.grad(final_height)(*_bare((v0, x0, g, dt)))
    np.testing.assert_allclose(grad.array, want, rtol=1e-6)


def test_loop_writes_quantities_into_a_plain_zeros_buffer():
    # The published repro: a buffer that starts as plain zeros (or NaNs) takes the
    # units of what the loop writes into it.
    def record(y):
        return lax.fori_loop(0, 3, lambda i, b: b.at[i].set(y * i), jnp.zeros((3, 2)))

    def record_while(y, n):
        buffer = jnp.full((3, 2), jnp.nan)
        return lax.fori_loop(0, n, lambda i, b: b.at[i].set(y * i), buffer)

    y = Quantity(jnp.array([1.0, 2.0]), "km")
    for out, expected in [
        (quax.quaxify(record)(y), record(y.value)),
        (jax.jit(quax.quaxify(record))(y), record(y.value)),
        (jax.jit(quax.quaxify(record_while))(y, 2), record_while(y.value, 2)),
    ]:
        assert out.units == {meters: 1}
        np.testing.assert_array_equal(ustrip("km", out), expected)


def test_trajectory_recorded_into_a_buffer_matches_the_plain_program():
    def trajectory(x, v, g, dt):
        def step(i, state):
            x, v, xs = state
            v = v + g * dt
            x = x + v * dt
            return x, v, xs.at[i].set(x)

        return lax.fori_loop(0, 50, step, (x, v, jnp.zeros((50, 2))))[2]

    out = jax.jit(quax.quaxify(trajectory))(x0, v0, g, dt)
    expected = jax.jit(trajectory)(*_bare((x0, v0, g, dt)))
    assert out.units == {meters: 1}
    np.testing.assert_array_equal(out.array, expected)


def test_a_buffer_written_with_mixed_units_raises():
    # Discovery only lifts the buffer's start; the body is then checked as usual.
    def mixed(x, v):
        def step(i, b):
            return b.at[i].set(x).at[i + 1].set(v)

        return lax.fori_loop(0, 2, step, jnp.zeros((3, 2)))

    with pytest.raises(UnitError, match="scatter"):
        quax.quaxify(mixed)(x0, v0)
