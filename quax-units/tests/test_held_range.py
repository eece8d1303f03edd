"""The range a dtype holds on a backend (`held_range`): `jnp.finfo`'s, but float32's
for float64 and complex128 on a TPU, whose XLA emulates float64 with pairs of float32
numbers (seen on a TPU v5e: `Quantity(1e12, "Msun")` in float64, 1.99e42 kg, was held
as NaN, and 1.05e-39 as 0). Quantities refuse numbers out of that range, with a
message that says why and what to do, and conversions by factors out of it take the
exact route. On a CPU, the emulating platform is simulated by naming the CPU as one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax_units._interop
import quax_units._value
from quax_units import Quantity
from quax_units._value import float64_emulated, held_range, scaled


_FLOAT32 = (float(jnp.finfo(jnp.float32).tiny), float(jnp.finfo(jnp.float32).max))
_FLOAT64 = (float(jnp.finfo(jnp.float64).tiny), float(jnp.finfo(jnp.float64).max))


@pytest.fixture
def cpu_as_tpu(monkeypatch):
    """This process's CPU taken for a platform whose float64 holds float32's range (on
    a TPU, the tests that take it run against the real emulation)."""
    emulating = quax_units._value._FLOAT64_IN_FLOAT32_RANGE | {"cpu"}
    monkeypatch.setattr(quax_units._value, "_FLOAT64_IN_FLOAT32_RANGE", emulating)


def test_the_range_per_dtype_and_platform():
    for platform in ["cpu", "gpu"]:
        assert held_range(jnp.float64, platform) == _FLOAT64
        assert held_range(jnp.complex128, platform) == _FLOAT64
        assert held_range(jnp.float32, platform) == _FLOAT32
    assert held_range(jnp.float64, "tpu") == _FLOAT32
    assert held_range(jnp.complex128, "tpu") == _FLOAT32
    assert held_range(jnp.float32, "tpu") == _FLOAT32
    assert held_range(jnp.float16, "tpu") == (6.103515625e-05, 65504.0)
    assert held_range(jnp.float64) == held_range(jnp.float64, jax.default_backend())
    assert float64_emulated(jnp.float64, "tpu") and float64_emulated(
        jnp.complex128, "tpu"
    )
    assert not float64_emulated(jnp.float32, "tpu")
    assert not float64_emulated(jnp.float64, "cpu")
    assert not float64_emulated(jnp.float64, "gpu")


def test_numbers_beyond_the_emulated_range_are_refused(cpu_as_tpu):
    with jax.enable_x64(True):
        # On the host (a Python number) and on the device (an array): 2e42 kg.
        for value in [1e12, jnp.array([1.0, 1e12])]:
            with pytest.raises(ValueError) as info:
                Quantity(value, "Msun")
            message = str(info.value)
            assert "numbers in Msun out of float64's range" in message
            assert f"at most 3.40282e+38 on a {jax.default_backend()}" in message
            assert "pairs of float32 numbers" in message
            assert "jax.default_device(jax.devices('cpu')[0])" in message
            assert "jax_enable_x64" not in message  # float64 is no help there
        # 1e-30 ns is 1e-39 s, below float32's smallest normal number.
        for value in [1e-30, jnp.array([1.0, 1e-30])]:
            with pytest.raises(
                ValueError, match="below float64's normal range"
            ) as info:
                Quantity(value, "ns")
            platform = jax.default_backend()
            assert f"smallest normal number is 1.17549e-38 on a {platform}" in str(
                info.value
            )
        # In range: accepted, and held as without the simulation.
        q = Quantity(jnp.array([1.0, 1e8]), "Msun")
        np.testing.assert_allclose(
            q.array, [1.988409870698051e30, 1.988409870698051e38]
        )
        assert q.array.dtype == jnp.float64
        np.testing.assert_allclose(Quantity(1e-20, "ns").array, 1e-29)


@pytest.mark.float64
def test_without_emulation_float64_holds_them():
    with jax.enable_x64(True):
        assert Quantity(1e12, "Msun").array == 1.988409870698051e42
        np.testing.assert_allclose(
            Quantity(jnp.array([1e-30]), "ns").array, [1e-39], rtol=1e-15
        )


def test_factors_beyond_the_emulated_range_take_two_steps(cpu_as_tpu):
    # A joule is 5.26e-43 Msun kpc2 / Myr2: beyond float32's range, in float64's.
    factor = 5.260183968837699e-43
    # Pairs of float32 numbers hold about 44 bits (6.62607015e-34 as
    # 6.62607015000327e-34 on a TPU v5e), not float64's 53, and fewer for small
    # numbers: on a TPU v5e, 1e30 and -3e20 J came out to 1e-12, 1e-30 J (divided)
    # to 3.2e-9, the same figure with a division by each step and with products by
    # the reciprocals, so the loss is the emulation's holding of 1e-30.
    tpu = jax.default_backend() == "tpu"
    rtol, small_rtol = (1e-12, 1e-8) if tpu else (1e-15, 1e-15)
    with jax.enable_x64(True):
        x = jnp.array([1e30, -3e20], jnp.float64)
        # Not the exact route of other platforms (`jnp.frexp` of a float64 does not
        # compile on a TPU), but two products by factors in float32's range.
        jaxpr = jax.make_jaxpr(lambda x: scaled(x, factor))(x).jaxpr
        assert [e.primitive.name for e in jaxpr.eqns] == ["mul", "mul"]
        np.testing.assert_allclose(
            scaled(x, factor), [1e30 * factor, -3e20 * factor], rtol=rtol
        )
        small = jnp.array([1e-30, -3e-20], jnp.float64)
        np.testing.assert_allclose(
            scaled(small, factor, divide=True),
            [1e-30 / factor, -3e-20 / factor],
            rtol=small_rtol,
        )


@pytest.mark.float64
def test_without_emulation_float64_factors_are_one_product():
    with jax.enable_x64(True):
        x = jnp.array([1e30], jnp.float64)
        jaxpr = str(jax.make_jaxpr(lambda x: scaled(x, 5.260183968837699e-43))(x))
        assert "custom_linear_solve" not in jaxpr and "mul" in jaxpr


def test_conversions_from_other_libraries_are_refused_beyond_it(cpu_as_tpu):
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match="pairs of float32 numbers") as info:
            quax_units._interop._numbers(np.array([1.0, 2e42]), "pint")
        assert "beyond float64's range (at most 3.40282e+38)" in str(info.value)
        with pytest.raises(ValueError, match=r"smallest normal number 1\.17549e-38"):
            quax_units._interop._numbers(np.array([1e-39]), "pint")
        np.testing.assert_allclose(
            quax_units._interop._numbers(np.array([1.0, 2e38]), "pint"),
            [1.0, 2e38],
            rtol=1e-15,
        )
