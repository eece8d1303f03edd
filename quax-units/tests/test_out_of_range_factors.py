"""Conversion factors out of the dtype's range (a joule is 5.3e-43 `Msun kpc2 /
Myr2`, below float32's smallest normal number): the numbers come out as one
product in float64 rounded to the dtype gives them, in every floating dtype,
eagerly, under `jit`, `vmap`, `jvp` and `grad`; and the compiled program holds no
optimisation barrier, which TPUs cannot compile (issue 46)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
from quax_units import Quantity, galactic, ustrip
from quax_units._value import scaled  # the helper every conversion goes through


_FACTORS = [5.260183968837699e-43, 1e-45, 3e-39, 7.5e38, 1e40, 1e300, 1e-300]
_DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def _numbers(dtype):
    """Numbers across `dtype`'s normal range, both signs, and its extremes.
    (Subnormal numbers are left out: XLA's backends read them as zeros, in any
    product.)"""
    finfo = jnp.finfo(dtype)
    spread = np.geomspace(float(finfo.tiny), float(finfo.max), 400)
    extremes = [float(finfo.tiny), float(finfo.max), 1.0, 0.75, 1.5]
    values = np.concatenate([spread, extremes, -spread[::7]])
    return np.asarray(jnp.asarray(values, dtype))


def _reference(x, factor, divide):
    """The product (or quotient) in float64, rounded once to `x`'s dtype; where
    float64 itself over- or underflows (1e300 * 1e300), in two float64 steps,
    each exact or rounded far below the dtype's precision."""
    wide = x.astype(np.float64)
    root = np.sqrt(factor)
    with np.errstate(over="ignore", under="ignore"):
        out = wide / root / (factor / root) if divide else wide * root * (factor / root)
        return out.astype(x.dtype)  # beyond the dtype's range: infinite


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("factor", _FACTORS)
@pytest.mark.parametrize("divide", [False, True])
def test_numbers_match_one_rounding(dtype, factor, divide):
    x = _numbers(dtype)
    finfo = jnp.finfo(dtype)
    want = _reference(x, factor, divide).astype(np.float64)
    for out in (
        scaled(jnp.asarray(x), factor, divide=divide),
        jax.jit(lambda a: scaled(a, factor, divide=divide))(jnp.asarray(x)),
    ):
        assert out.dtype == dtype
        got = np.asarray(out).astype(np.float64)
        # The factor's mantissa is held in the dtype (as in any product with a
        # Python float): within one unit in the last place. Results below the
        # normal range are subnormal or flushed to zero, as the backend makes
        # any product's.
        np.testing.assert_allclose(
            got, want, rtol=2 * float(finfo.eps), atol=float(finfo.tiny)
        )
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        np.testing.assert_array_equal(np.signbit(got), np.signbit(x))


@pytest.mark.parametrize("divide", [False, True])
def test_zeros_infinities_and_nans(divide):
    x = jnp.array([0.0, -0.0, jnp.inf, -jnp.inf, jnp.nan], jnp.float32)
    out = np.asarray(scaled(x, 5.3e-43, divide=divide))
    np.testing.assert_array_equal(out[:4], [0.0, -0.0, np.inf, -np.inf])
    assert np.signbit(out[1]) and np.isnan(out[4])
    z = jnp.array([1e30 - 2e30j, -3e35 + 0j], jnp.complex64)
    got = scaled(z, 5.260183968837699e-43, divide=divide)
    wide = np.asarray(z).astype(np.complex128)
    want = wide / 5.260183968837699e-43 if divide else wide * 5.260183968837699e-43
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(got, want.astype(np.complex64), rtol=2e-7)


_J = 5.260183968837699e-43  # one joule in Msun kpc2 / Myr2


def test_conversion_under_jit_vmap_jvp_and_grad():
    energies = jnp.array([1e30, -2.5e33, 3e38], jnp.float32)

    def galactic_numbers(x):
        return Quantity(x, "J").decompose(galactic).value

    want = np.asarray(energies, np.float64) * _J
    np.testing.assert_allclose(galactic_numbers(energies), want, rtol=2e-7)
    np.testing.assert_allclose(jax.jit(galactic_numbers)(energies), want, rtol=2e-7)
    np.testing.assert_allclose(jax.vmap(galactic_numbers)(energies), want, rtol=2e-7)
    # Linear: the tangent and the cotangent are scaled as the numbers are.
    _, tangent = jax.jvp(galactic_numbers, (energies,), (energies,))
    np.testing.assert_allclose(tangent, want, rtol=2e-7)
    _, pullback = jax.vjp(galactic_numbers, energies)
    (cotangent,) = pullback(jnp.full(3, 1e30, jnp.float32))
    np.testing.assert_allclose(cotangent, np.full(3, 1e30 * _J), rtol=2e-7)
    grad = jax.grad(lambda x: jnp.sum(galactic_numbers(x) * 1e30))(energies)
    np.testing.assert_allclose(grad, np.full(3, 1e30 * _J), rtol=2e-7)
    # And back: divided by the factor.
    back = jax.jit(quax.quaxify(lambda q: ustrip("J", q)))(
        Quantity(jnp.asarray(want, jnp.float32), "Msun kpc2 / Myr2")
    )
    np.testing.assert_allclose(back, energies, rtol=4e-7)


def test_no_optimisation_barrier_in_the_program():
    """XLA's CPU compiler removes barriers before it prints the optimised HLO,
    and a TPU refuses them: the program as lowered must not hold one."""
    q = Quantity(jnp.array([1e30, 2e31], jnp.float32), "J")

    def f(q):
        return ustrip("Msun kpc2 / Myr2", q)

    lowered = jax.jit(quax.quaxify(f)).lower(q).as_text()
    assert "optimization_barrier" not in lowered
    assert "opt-barrier" not in quax.testing.hlo_ops(quax.testing.compiled_hlo(f, q))
    grad = jax.jit(jax.grad(lambda x: jnp.sum(scaled(x, _J)))).lower(q.array)
    assert "optimization_barrier" not in grad.as_text()
