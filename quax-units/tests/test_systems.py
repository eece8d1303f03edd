"""Unit systems: `si`, `cgs`, `galactic` and user-made ones, `UnitSystem.unit_for`
and `Quantity.decompose`, against literal values (the astronomical ones as astropy
gives them), in float64 and float32, under `jit` and `grad`, and every error."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
from hypothesis import given, settings
from quax_units import (
    Dimension,
    Dimensions,
    Quantity,
    UnitSystem,
    cgs,
    constants,
    galactic,
    si,
    unit,
    ustrip,
)
from quax_units._value import held_range  # the range a dtype holds on a backend


# (value, unit, system, expected value, expected unit's name): literals.
_CASES = [
    (1.0, "kpc / Myr", si, 977792.2216807891, "m / s"),
    (1.0, "km / s", galactic, 0.001022712165045695, "kpc / Myr"),
    (1.0, "yr", galactic, 1e-6, "Myr"),
    (1.0, "Msun", si, 1.988409870698051e30, "kg"),
    (1.0, "Msun / kpc3", si, 6.767905323247329e-29, "kg / m3"),
    (1e30, "J", galactic, 5.260183968837699e-13, "Msun kpc2 / Myr2"),
    (1.0, "J", cgs, 1e7, "g cm2 / s2"),
    (1.0, "N", cgs, 1e5, "g cm / s2"),
    (1.0, "Pa", cgs, 10.0, "g / (cm s2)"),
    (1.0, "g / cm3", si, 1000.0, "kg / m3"),
    (1.0, "erg / s", si, 1e-7, "kg m2 / s3"),
    (1.0, "pc2", cgs, 9.521406136918414e36, "cm2"),
    (1.0, "C", cgs, 1.0, "s A"),  # current stays in amperes
    (4.0, "m**(1/2)", cgs, 40.0, "cm(1/2)"),
    (20.0, "degC", si, 293.15, "K"),
    (3.0, "km", si, 3000.0, "m"),
    (50.0, "%", galactic, 0.5, ""),
]


def _ids(case):
    return f"{case[1]}->{case[2].name}"


@pytest.mark.float64
@pytest.mark.parametrize("case", _CASES, ids=_ids)
def test_decompose_literals_float64(case):
    value, u, system, expected, name = case
    with jax.enable_x64(True):
        q = Quantity(value, u).decompose(system)
        assert str(q.unit) == name
        assert q.value.dtype == jnp.float64
        np.testing.assert_allclose(q.value, expected, rtol=2e-15)
        np.testing.assert_allclose(q.to_value(u), value, rtol=2e-15)


@pytest.mark.parametrize("case", _CASES, ids=_ids)
def test_decompose_literals_float32_and_jit(case):
    value, u, system, expected, name = case
    q = Quantity(jnp.asarray(value, jnp.float32), u)
    out = q.decompose(system)
    assert out.value.dtype == jnp.float32
    np.testing.assert_allclose(out.value, expected, rtol=2e-7)
    # Under `jit` the display unit is static (the pytree structure is unchanged),
    # and the numbers come from the SI-coherent array.
    jitted = jax.jit(lambda q: q.decompose(system))(q)
    assert str(jitted.unit) == name
    assert jax.tree.structure(jitted) == jax.tree.structure(q)
    np.testing.assert_allclose(jitted.value, expected, rtol=5e-7)


@pytest.mark.float64
def test_gravitational_constant_in_each_system():
    with jax.enable_x64(True):
        for system, expected, name in [
            (galactic, 4.498502151469553e-12, "kpc3 / (Msun Myr2)"),
            (cgs, 6.6743e-8, "cm3 / (g s2)"),
            (si, 6.6743e-11, "m3 / (kg s2)"),
        ]:
            G = constants.G.decompose(system)
            assert str(G.unit) == name
            np.testing.assert_allclose(G.value, expected, rtol=2e-15)


def test_decompose_under_grad():
    # d/dx of x km/s in kpc/Myr: the conversion factor.
    dvalue = jax.grad(lambda x: Quantity(x, "km / s").decompose(galactic).value)(2.0)
    np.testing.assert_allclose(dvalue, 0.001022712165045695, rtol=1e-6)
    # A gradient with units (kg m / s), shown in cgs (g cm / s).
    E = quax.quaxify(lambda m, v: 0.5 * m * jnp.sum(v**2))
    m, v = Quantity(2.0, "kg"), Quantity(jnp.array([30.0, 40.0]), "m / s")
    p = quax_units.grad(lambda v: E(m, v))(v).decompose(cgs)
    assert str(p.unit) == "g cm / s"
    np.testing.assert_allclose(p.value, [6e6, 8e6], rtol=1e-6)


def test_unit_for_inside_quaxify_jit_and_grad():
    # Inside `quax.quaxify` a quantity is a tracer, without `decompose`: strip it
    # in the system's unit for its dimensions.
    kmh = galactic.unit_for("m / s")
    f = jax.jit(quax.quaxify(lambda v: jnp.sum(ustrip(kmh, v) ** 2)))
    v = Quantity(jnp.array([1.0, 2.0]), "km / s")
    k = 0.001022712165045695
    np.testing.assert_allclose(f(v), 5 * k**2, rtol=1e-6)
    g = quax.quaxify(jax.grad(lambda v: jnp.sum(ustrip(kmh, v) ** 2)))(v)
    # d/dv of (k v / (1000 m/s))^2 summed: 2 k^2 v / (1e6 m2/s2), in s / m.
    assert g.units == unit("s / m").dimensions
    np.testing.assert_allclose(
        ustrip("s / m", g), 2 * k**2 * np.array([1e3, 2e3]) / 1e6, rtol=1e-6
    )


def test_unit_for():
    assert galactic.unit_for("km / s") == unit("kpc / Myr")
    assert str(galactic.unit_for(unit("J"))) == "Msun kpc2 / Myr2"
    assert cgs.unit_for(Dimensions()) == unit("")
    apple = Dimension("apple")
    u = galactic.unit_for(Dimensions({apple: 1, Dimension("s"): -1}))
    assert str(u) == "apple / Myr" and u.scale == 1 / 31557600.0e6
    assert str(cgs.unit_for("K A")) == "A K"


def test_user_system_and_names():
    solar = UnitSystem("solar", "au", "yr", "Msun")
    assert repr(solar) == "UnitSystem('solar', 'au', 'yr', 'Msun')"
    v = Quantity(30.0, "km / s").decompose(solar)
    assert str(v.unit) == "au / yr"
    np.testing.assert_allclose(v.value, 30e3 * 31557600.0 / 149597870700.0, 1e-6)
    assert Quantity(1.0, "m").decompose("GALACTIC").unit == unit("kpc")
    assert Quantity(1.0, "m").decompose("cgs").unit == unit("cm")
    assert solar == UnitSystem("solar", "au", "yr", "Msun") != galactic
    assert hash(solar) == hash(UnitSystem("solar", "au", "yr", "Msun"))
    with pytest.raises(AttributeError, match="immutable"):
        solar.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        solar.bases[Dimension("m")] = unit("km")  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("",), "needs a `name`"),
        (("x", "rad"), "'rad' is dimensionless"),
        (("x", "m / s"), "'m / s' has dimensions m / s"),
        (("x", "m2"), "'m2' has dimensions m2"),
        (("x", "degC"), "'degC' is an offset unit"),
        (("x", "km", "pc"), "both measure m"),
    ],
)
def test_bad_systems(args, match):
    with pytest.raises(ValueError, match=match):
        UnitSystem(*args)


def test_unknown_system_name():
    with pytest.raises(ValueError, match=r"Unknown unit system 'mks'.*'galactic'"):
        Quantity(1.0, "m").decompose("mks")


@pytest.mark.parametrize(
    ("dtype", "x", "source", "target", "factor"),
    [
        # A joule is 5.26e-43 galactic energy units: beyond float32's range, though
        # the numbers at both ends are in range.
        (jnp.float32, 1e30, "J", "Msun kpc2 / Myr2", 5.260183968837699e-43),
        # float16 holds at most 65504: a km is 1e5 cm.
        (jnp.float16, 0.01, "km", "cm", 1e5),
    ],
)
def test_factors_beyond_the_dtypes_range(dtype, x, source, target, factor):
    # A single multiplication by the factor would give 0 or infinity.
    q = Quantity(jnp.asarray(x, dtype), source)
    rtol = 1e-6 if dtype == jnp.float32 else 2e-3
    for out in [
        ustrip(target, q),  # from the numbers it was made with
        jax.jit(lambda q: ustrip(target, q))(q),  # from the SI array
        quax.quaxify(lambda q: ustrip(target, q))(q),  # traced
        jax.jit(quax.quaxify(lambda q: ustrip(target, q)))(q),
        jax.jit(lambda q: q.to(target).value)(q),
    ]:
        assert out.dtype == dtype
        np.testing.assert_allclose(out, x * factor, rtol=rtol)
    # And back: the target's numbers into SI and into the source unit.
    back = Quantity(jnp.asarray(x * factor, dtype), target)
    np.testing.assert_allclose(back.array, x * unit(source).scale, rtol=rtol)
    np.testing.assert_allclose(back.to_value(source), x, rtol=rtol)
    np.testing.assert_allclose(jax.jit(lambda b: b.to(source).value)(back), x, rtol)
    # Under grad (of the converted number relative to its value, as the factor
    # itself is out of range): one over the input.
    d = jax.grad(lambda y: ustrip(target, Quantity(y, source)) / dtype(x * factor))(
        jnp.asarray(x, dtype)
    )
    np.testing.assert_allclose(d, 1 / x, rtol=rtol)


def test_numbers_out_of_range_in_si_are_refused():
    # 1e12 Msun is 2e42 kg, beyond float32: refused rather than held as infinity.
    match = r"numbers in Msun out of float32's range .* use float64"
    with pytest.raises(ValueError, match=match):
        Quantity(1e12, "Msun")
    with pytest.raises(ValueError, match="in kpc3 out of float32"):
        Quantity(jnp.array([1.0, 1e3]), "kpc3")
    # In range, infinite on input, or in float64: accepted.
    np.testing.assert_allclose(Quantity(1e8, "Msun").array, 1.988409870698051e38, 1e-6)
    assert np.isinf(Quantity(jnp.inf, "km").array)
    with jax.enable_x64(True):
        if held_range(jnp.float64) == held_range(jnp.float32):
            # A TPU: XLA's float64 there holds float32's range (2e42 was NaN).
            with pytest.raises(ValueError, match="pairs of float32 numbers"):
                Quantity(1e12, "Msun")
        else:
            big = Quantity(1e12, "Msun")
            assert big.array == 1.988409870698051e42 and big.value == 1e12


def test_the_range_check_waits_for_the_device_only_for_device_numbers(monkeypatch):
    # Reading the check's answer from the device waits for it (a sync per
    # construction): integers cannot overflow (in most units), and NumPy or
    # Python numbers are checked on the host. Only numbers already on the device,
    # in the array's dtype, are checked there.
    asked = []
    device_check = quax_units._value._leaves_range
    monkeypatch.setattr(
        quax_units._value,
        "_leaves_range",
        lambda *a: asked.append(1) or device_check(*a),
    )
    for number in [
        jnp.array([1, 2**31 - 1], jnp.int32),  # at most 2.1e9 kpc: 6.6e28 m
        7,
        np.array([1.0, 2.0], np.float32),
        3.0,
    ]:
        q = Quantity(number, "kpc")
        np.testing.assert_allclose(
            q.array, np.asarray(number, np.float32) * np.float32(3.0856775814913673e19)
        )
    assert not asked
    with pytest.raises(ValueError, match="in Msun out of float32"):
        Quantity(np.array([1.0, 1e12], np.float32), "Msun")  # on the host
    assert not asked
    with pytest.raises(ValueError, match="in Msun out of float32"):
        Quantity(jnp.array([1.0, 1e12]), "Msun")  # on the device
    assert asked
    # Infinite numbers given are not refused, on the host or the device.
    assert np.isinf(Quantity(np.array([np.inf], np.float32), "Msun").array).all()
    assert np.isinf(Quantity(jnp.array([-jnp.inf]), "Msun").array).all()


_named = st.sampled_from(
    ["m", "km", "s", "h", "kg", "g", "N", "J", "eV", "Hz", "Pa", "au", "Msun", "A"]
)
_units = st.lists(st.tuples(_named, st.integers(-2, 2)), min_size=1, max_size=3).map(
    lambda terms: " ".join(f"{name}**({e})" for name, e in terms)
)


@pytest.mark.float64
@settings(max_examples=20, deadline=None)
@given(_units, st.sampled_from([si, cgs, galactic]))
def test_decompose_is_the_base_units_to_the_dimensions_exponents(u, system):
    # Independent of `unit_for`: the scale is the product of the system's base
    # units' scales to the dimensions' exponents.
    base = {"kg": "kg", "m": "m", "s": "s", "A": "A"}
    if system is cgs:
        base.update(kg="g", m="cm")
    elif system is galactic:
        base.update(kg="Msun", m="kpc", s="Myr")
    dims = unit(u).dimensions
    scale = 1.0
    for d, e in dims.items():
        scale *= unit(base[d.name]).scale ** float(e)
    with jax.enable_x64(True):
        q = Quantity(1.0, u).decompose(system)
        assert q.unit.dimensions == dims
        np.testing.assert_allclose(q.value, unit(u).scale / scale, rtol=1e-13)
        np.testing.assert_allclose(q.to_value(u), 1.0, rtol=1e-13)
        assert {symbol for symbol, _ in q.unit.terms} <= set(base.values())
