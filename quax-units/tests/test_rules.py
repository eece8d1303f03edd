"""Each rule against the same computation on the plain (SI) arrays, and every error."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
from jax import lax
from quax_units import Quantity, UnitError, Unitful, meters, seconds, unit, ustrip


a = Quantity(jnp.array([1.0, -2.0, 3.5]), "m")
b = Quantity(jnp.array([0.5, 4.0, -1.0]), "km")
t = Quantity(jnp.array([2.0, 3.0, 4.0]), "s")
plain = jnp.array([1.5, 2.0, -0.5])
angle = Quantity(jnp.array([0.0, 30.0, 90.0]), "deg")
ratio = Quantity(jnp.array([0.1, 0.2, 0.3]), "m / km")
_SINGLE_DEVICE = jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _bare(x):
    return x.array if isinstance(x, Unitful) else x


def check(f, *args, units, jit=True):
    """`quaxify(f)` on quantities equals `f` on their SI arrays, with `units`."""
    got = quax.quaxify(f)(*args)
    want = f(*[_bare(x) for x in args])
    if jit:
        jitted = jax.jit(quax.quaxify(f))(*args)
        np.testing.assert_array_equal(
            _bare(jitted), jax.jit(f)(*[_bare(x) for x in args])
        )
    if units is None:
        assert not isinstance(got, Unitful)
    else:
        assert isinstance(got, Unitful)
        assert got.units == unit(units).dimensions, (got.units, units)
    np.testing.assert_allclose(_bare(got), want, rtol=1e-6)
    return got


@pytest.mark.parametrize(
    "f",
    [
        jnp.add,
        jnp.subtract,
        jnp.maximum,
        jnp.minimum,
        jnp.remainder,
        lambda x, y: jnp.clip(x, y, 2 * y),
    ],
)
def test_same_units_keep_units_and_left_display(f):
    check(f, a, b, units="m")


def test_right_operand_takes_left_display_unit():
    assert str(quax.quaxify(jnp.add)(a, b).unit) == "m"
    assert str(quax.quaxify(jnp.subtract)(b, a).unit) == "km"


@pytest.mark.parametrize(
    "f",
    [
        jnp.less,
        jnp.less_equal,
        jnp.greater,
        jnp.greater_equal,
        jnp.equal,
        jnp.not_equal,
    ],
)
def test_comparisons_give_plain_bools(f):
    out = check(f, a, b, units=None)
    assert out.dtype == jnp.bool_


def test_select_concatenate_pad_atan2():
    check(lambda x, y: jnp.where(x > y, x, y), a, b, units="m")
    check(lambda x, y: jnp.concatenate([x, y]), a, b, units="m")
    check(lambda x, y: jnp.stack([x, y], axis=1), a, b, units="m")
    check(lambda x, y: lax.pad(x, y[0], [(1, 2, 0)]), a, b, units="m")
    out = check(jnp.arctan2, a, b, units="rad")
    assert str(out.unit) == "rad"


@pytest.mark.parametrize(
    "f",
    [
        lambda x, y: x + y,
        lambda x, y: x - y,
        lambda x, y: x < y,
        jnp.maximum,
        lambda x, y: jnp.where(jnp.array(True), x, y),
        lambda x, y: jnp.concatenate([x, y]),
        lambda x, y: jnp.stack([x, y]),
        lambda x, y: x.at[0].set(y[0]),
        lambda x, y: x.at[0].add(y[0]),
        lambda x, y: lax.dynamic_update_slice(x, y[:1], (0,)),
        jnp.arctan2,
        lambda x, y: jnp.clip(x, y, y),
    ],
)
def test_incompatible_units_raise_naming_both(f):
    with pytest.raises(UnitError, match=r"m \[m\] and s \[s\]|s \[s\] and m \[m\]"):
        quax.quaxify(f)(a, t)
    with pytest.raises(UnitError, match=r"m \[m\] and s \[s\]|s \[s\] and m \[m\]"):
        jax.jit(quax.quaxify(f))(a, t)


def test_plain_array_counts_as_dimensionless():
    with pytest.raises(UnitError, match=r"plain array float32\[3\] \[dimensionless\]"):
        quax.quaxify(jnp.add)(a, plain)
    check(jnp.add, ratio, plain, units="")


def test_update_covering_a_plain_operand_gives_its_units():
    # None of the plain operand's values remain, so its (unknown) units do not
    # matter: a solver's buffer of one saved step, overwritten by the final state.
    cover = lambda buf, q: lax.dynamic_update_slice(buf, q, (0,))
    out = jax.jit(quax.quaxify(cover))(plain, a)
    assert isinstance(out, Unitful) and out.unit == a.unit
    np.testing.assert_array_equal(out.array, a.array)
    # A partial update leaves plain values, whose units are unknown under `jit`.
    part = lambda buf, q: lax.dynamic_update_slice(buf, q[:2], (1,))
    with pytest.raises(UnitError, match="only known at run time"):
        jax.jit(quax.quaxify(part))(plain, a)
    # Two quantities are still checked.
    with pytest.raises(UnitError, match=r"m \[m\] and s \[s\]"):
        quax.quaxify(cover)(a, t)


def test_a_traced_product_with_zeros_fits_any_unit():
    # A solver starts from `jnp.zeros_like(y)` and scales it by a traced step:
    # `dt * zeros` is zero (or NaN) in any unit, so it adds to a quantity.
    start = lambda q, dt: q + 0.0 * (dt * jnp.zeros(3))
    out = jax.jit(quax.quaxify(start))(a, 2.0)
    assert isinstance(out, Unitful) and out.units == a.units
    np.testing.assert_array_equal(out.array, a.array)
    # A traced factor times anything else is still a plain, dimensionless array.
    with pytest.raises(UnitError, match="only known at run time"):
        jax.jit(quax.quaxify(lambda q, dt: q + dt * jnp.ones(3)))(a, 2.0)
    with pytest.raises(UnitError, match="only known at run time"):
        jax.jit(quax.quaxify(lambda q, dt: q + (dt * jnp.zeros(3) + dt)))(a, 2.0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_dimensionless_quantity_of_zeros_fits_any_unit(jit):
    # With an adaptive controller the step size is a dimensionless quantity (the
    # ratio of an error to a tolerance of the state's units): `0 * (dt * zeros)`
    # is a dimensionless quantity of zeros, which adds to a length as a plain
    # product with zeros does; the result keeps the length's unit.
    start = lambda q, dt: q + 0.0 * (dt * jnp.zeros(3))
    f = jax.jit(quax.quaxify(start)) if jit else quax.quaxify(start)
    for dt in [Quantity(2.0, ""), Quantity(50.0, "%")]:
        out = f(a, dt)
        assert isinstance(out, Unitful) and out.unit == a.unit
        np.testing.assert_array_equal(out.array, a.array)
        flipped = (jax.jit if jit else lambda g: g)(
            quax.quaxify(lambda q, dt: 0.0 * (dt * jnp.zeros(3)) + q)
        )(a, dt)
        assert isinstance(flipped, Unitful) and flipped.unit == a.unit
    # A dimensionless quantity of other numbers is no length.
    with pytest.raises(UnitError, match=r"m \[m\] and dimensionless"):
        f2 = quax.quaxify(lambda q, dt: q + dt * jnp.ones(3))
        (jax.jit(f2) if jit else f2)(a, Quantity(2.0, ""))
    # Nor is a quantity of zeros of other dimensions: a time.
    with pytest.raises(UnitError, match=r"\[m\] and s \[s\]"):
        f3 = quax.quaxify(lambda q, dt: q + 0.0 * (dt * jnp.zeros(3)))
        (jax.jit(f3) if jit else f3)(a, Quantity(2.0, "s"))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_polyval_of_quantity_coefficients(jit):
    # `jnp.polyval` scans `y * x + p` from a plain zero `y`: the zero takes the
    # coefficients' units, also where `x` is a dimensionless quantity.
    coeffs = Quantity(jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), "km")
    want = jnp.polyval(coeffs.array, 0.5)
    for x in [0.5, Quantity(50.0, "%")]:
        f = quax.quaxify(jnp.polyval)
        out = (jax.jit(f) if jit else f)(coeffs, x)
        assert isinstance(out, Unitful) and out.units == coeffs.units
        np.testing.assert_allclose(ustrip("m", out), want, rtol=1e-6)
    # With `x` in seconds, the terms of the sum have different units.
    with pytest.raises(UnitError, match=r"km s \[m s\] and km \[m\]"):
        quax.quaxify(jnp.polyval)(coeffs, Quantity(2.0, "s"))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_isclose_and_allclose_compare_in_one_unit(jit):
    # `jnp.isclose` adds `atol` to `rtol * |b|`: with a tolerance in the operands'
    # dimensions (or zero), metres and kilometres compare on their SI numbers.
    x = Quantity(jnp.array([1.0, 2.0, 3.0]), "m")
    y = Quantity(jnp.array([0.00101, 0.0021, 0.003]), "km")
    near = [True, False, True]  # within 2 cm + 1e-5 relative
    tol = lambda f: jax.jit(quax.quaxify(f)) if jit else quax.quaxify(f)
    close = tol(lambda a, b, t: jnp.isclose(a, b, atol=t))
    np.testing.assert_array_equal(close(x, y, Quantity(2.0, "cm")), near)
    np.testing.assert_array_equal(
        close(x, y, Quantity(2.0, "cm")), jnp.isclose(x.array, y.array, atol=0.02)
    )
    relative = tol(lambda a, b: jnp.isclose(a, b, rtol=0.02, atol=0))
    np.testing.assert_array_equal(relative(x, y), near)
    every = tol(lambda a, b, t: jnp.allclose(a, b, atol=t))
    assert not every(x, y, Quantity(2.0, "cm"))
    assert every(x, y, Quantity(20.0, "cm"))
    # Other dimensions, in the operands or the tolerance, are unit errors; and so
    # is JAX's default `atol` (a plain 1e-8, in no unit).
    with pytest.raises(UnitError, match=r"m \[m\] and s \[s\]"):
        close(x, Quantity(jnp.ones(3), "s"), Quantity(2.0, "cm"))
    with pytest.raises(UnitError, match=r"s \[s\] and km \[m\]"):
        close(x, y, Quantity(2.0, "s"))
    with pytest.raises(UnitError, match=r"km \[m\] and plain array"):
        tol(jnp.isclose)(x, y)
    # The error names the way out, for `allclose` (which calls `isclose`) too.
    for f in (jnp.isclose, jnp.allclose):
        with pytest.raises(UnitError, match=r"atol=Quantity\(1e-8, unit\)"):
            tol(f)(x, y)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_hypot_of_lengths_in_any_units(jit):
    # JAX's `hypot` divides by `where(x == 0, 1, x)` (a plain 1 among lengths):
    # quax-units computes it whole, on the SI numbers, in the first unit.
    f = jax.jit(quax.quaxify(jnp.hypot)) if jit else quax.quaxify(jnp.hypot)
    x = Quantity(jnp.array([3.0, 0.0, 1.0, -5.0, jnp.inf, jnp.nan]), "m")
    y = Quantity(jnp.array([0.004, 0.0, 0.001, 0.012, 1.0, 1.0]), "km")
    want = np.hypot(
        np.array([3.0, 0.0, 1.0, -5.0, np.inf, np.nan], np.float32),
        np.array([4.0, 0.0, 1.0, 12.0, 1000.0, 1000.0], np.float32),
    )
    out = f(x, y)
    assert isinstance(out, Unitful) and out.unit == x.unit
    np.testing.assert_allclose(ustrip("m", out), want, rtol=1e-6)
    np.testing.assert_allclose(ustrip("cm", f(y, x)), want * 100, rtol=1e-6)
    # A plain constant of zeros fits any unit; a plain length does not exist, nor a
    # time.
    g = quax.quaxify(lambda q: jnp.hypot(q, jnp.zeros(6)))
    np.testing.assert_allclose(ustrip("m", (jax.jit(g) if jit else g)(x)), abs(x.array))
    with pytest.raises(UnitError, match=r"`jnp.hypot` needs operands"):
        f(x, Quantity(jnp.ones(6), "s"))
    with pytest.raises(UnitError, match=r"`jnp.hypot` needs operands"):
        f(x, jnp.ones(6))
    # Dimensionless quantities and plain arrays keep JAX's own `hypot`.
    ratio = f(Quantity(jnp.array([3.0]), ""), jnp.array([4.0]))
    np.testing.assert_allclose(ustrip("", ratio), [5.0])
    # Differentiable: d hypot / dx = x / hypot.
    grad = jax.grad(lambda s: ustrip("m", f(s * x[:1], y[:1])).sum())(1.0)
    np.testing.assert_allclose(grad, 3.0 * 3.0 / 5.0, rtol=1e-6)


@pytest.mark.parametrize(
    "f",
    [
        jnp.negative, jnp.abs, jnp.floor, jnp.ceil, jnp.round, jnp.sum, jnp.max,
        jnp.min, jnp.mean, jnp.cumsum, lambda x: lax.cummax(x), jnp.sort,
        lambda x: x.reshape(3, 1),
        lambda x: x[None].squeeze(0), lambda x: jnp.broadcast_to(x, (2, 3)),
        lambda x: jnp.outer(x, jnp.ones(2)).T, lambda x: x[1:], lambda x: x[::-1],
        lambda x: x[jnp.array([2, 0])], lambda x: lax.dynamic_slice(x, (1,), (2,)),
        lambda x: x.astype(jnp.float16), lambda x: jnp.split(x, 3)[1],
        lambda x: lax.unstack(x[None], axis=1)[2],
        lambda x: lax.top_k(x, 2)[0], lambda x: jnp.linalg.norm(x), jnp.real,
        lambda x: lax.reduce_precision(x, 5, 10), jnp.copy,
        lambda x: jnp.tile(x, (2, 2)), jax.device_put,
        lambda x: jax.device_put(x, jax.devices()[0]),
        lambda x: lax.with_sharding_constraint(x, _SINGLE_DEVICE),
        lambda x: lax.reduce_window(x, 0.0, lax.add, (2,), (1,), "VALID"),
        lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2,), (1,), "VALID"),
        lambda x: lax.reduce_window(x, jnp.inf, lax.min, (2,), (1,), "SAME"),
    ],
)  # fmt: skip
def test_unit_preserving(f):
    check(f, a, units="m")


def test_device_put_keeps_each_operands_units():
    out = check(lambda x, y: jax.device_put((x, y))[0], a, t, units="m")
    assert str(out.unit) == "m"
    check(lambda x, y: jax.device_put((x, y))[1], a, t, units="s")
    check(lambda x, y: jax.device_put((x, y))[1], a, plain, units=None)


@pytest.mark.parametrize(
    "f",
    [
        jnp.fft.fft,
        jnp.fft.ifft,
        jnp.fft.rfft,
        lambda x: jnp.fft.irfft(x, n=4),
        lambda x: jnp.fft.irfft(jnp.fft.rfft(x), n=3),
    ],
)
def test_fourier_transforms_keep_dimensions(f):
    # The transforms are linear: sums of the operand's values times phases.
    out = check(f, b, units="m")
    assert str(out.unit) == "km"


@pytest.mark.parametrize(
    "f",
    [jnp.argmax, jnp.argmin, jnp.isfinite, lambda x: lax.top_k(x, 2)[1], jnp.argsort],
)
def test_plain_results(f):
    check(f, a, units=None)


def test_sign_is_dimensionless():
    check(jnp.sign, a, units="")


@pytest.mark.parametrize(
    ("f", "units"),
    [
        (lambda x, y: x * y, "m s"),
        (lambda x, y: x / y, "m / s"),
        (lambda x, y: 2.0 / y, "1 / s"),
        (lambda x, y: x * 3.0, "m"),
        (lambda x, y: jnp.dot(x, y), "m s"),
        (lambda x, y: jnp.outer(x, y) @ y, "m s2"),
        (lambda x, y: jnp.convolve(x, y), "m s"),
        (lambda x, y: x**2 / y**-3, "m2 s3"),
        (lambda x, y: jnp.sqrt(x * x) * jnp.cbrt(y**3), "m s"),
        (lambda x, y: lax.rsqrt(y), "s**(-1/2)"),
        (lambda x, y: jnp.square(y), "s2"),
        (lambda x, y: jnp.prod(y), "s3"),
        (lambda x, y: jnp.prod(y.reshape(3, 1), axis=1), "s"),
    ],
)
def test_combined_units(f, units):
    check(f, a, t, units=units)


def test_rational_exponents_and_display():
    area = Quantity(jnp.array([4.0, 9.0]), "km2")
    out = check(jnp.sqrt, area, units="m")
    assert str(out.unit) == "km"
    np.testing.assert_allclose(out.value, [2.0, 3.0])
    out = quax.quaxify(lambda x: x**1.5)(area)
    assert out.units == {meters: 3}
    assert quax.quaxify(lambda x: x ** (1 / 3))(area).units == {meters: Fraction(2, 3)}


def test_pow_exponent_errors():
    with pytest.raises(UnitError, match="only known at run time"):
        jax.jit(quax.quaxify(lambda x, p: x**p))(a, 2.0)
    with pytest.raises(UnitError, match="differing exponents"):
        quax.quaxify(lambda x: x ** jnp.array([1.0, 2.0, 3.0]))(a)
    with pytest.raises(UnitError, match=r"dimensionless exponent.*s \[s\]"):
        quax.quaxify(lambda x, y: x**y)(ratio, t)
    # A dimensionless base can take any exponent, even one only known at run time.
    check(lambda x, p: x**p, ratio, jnp.array([1.0, 2.0, 0.5]), units="")


@pytest.mark.parametrize("exponent", [jnp.nan, jnp.inf, -jnp.inf])
@pytest.mark.parametrize("jit", [False, True])
def test_pow_with_a_non_finite_exponent_names_it(exponent, jit):
    # A NaN exponent once read as "differing exponents nan", and an infinite one
    # raised a bare OverflowError from `Fraction`.
    f = quax.quaxify(lambda x: x**exponent)
    with pytest.raises(
        UnitError,
        match=rf"Cannot take `pow` of m \[m\] with the exponent -?{exponent}: the "
        r"exponent of a unit is a finite number.*dimensionless first",
    ):
        (jax.jit(f) if jit else f)(a)
    # NaN in, NaN out where the base is dimensionless, as in plain JAX.
    check(lambda x: x**exponent, ratio, units="")


def test_pow_with_an_exponent_no_simple_fraction_rounds_to():
    # Read as 10/81 before: the units said m^(10/81) of numbers raised to
    # 0.1234567.
    with pytest.raises(
        UnitError,
        match=r"exponent 0\.1234567: exponents of units are exact fractions.*"
        r"nearest is 10/81",
    ):
        quax.quaxify(lambda x: x**0.1234567)(a)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_pow_reads_one_third_in_every_float_dtype(dtype):
    x = Quantity(jnp.array([8.0, 27.0], dtype), "m")
    out = quax.quaxify(lambda x: x ** jnp.asarray(1 / 3, dtype))(x)
    assert out.units == {meters: Fraction(1, 3)}


def test_powers_whose_display_scale_overflows_show_si_units():
    # `km ** 200` has a scale of 1e600, out of a float's range: the numbers are in
    # SI units (`m ** 200`) anyway, and the display falls back to them. Before, a
    # bare OverflowError.
    x = Quantity(jnp.array([1.0, 1.5]), "km")
    out = quax.quaxify(lambda x: x**200)(x)
    assert out.units == {meters: 200} and str(out.unit) == "m200"
    np.testing.assert_array_equal(out.array, jnp.array([1000.0, 1500.0]) ** 200)
    out = quax.quaxify(jnp.prod)(Quantity(jnp.full(200, 1e-3), "km"))
    assert out.units == {meters: 200} and str(out.unit) == "m200"
    np.testing.assert_allclose(out.array, 1.0)


@pytest.mark.parametrize(
    "f",
    [jnp.exp, jnp.log, jnp.log1p, jnp.expm1, jnp.sin, jnp.cos, jnp.tan, jnp.tanh,
     jnp.sinh,
     jnp.arcsinh, jax.nn.sigmoid, jax.scipy.special.erf, jnp.cumprod, jnp.exp2],
)  # fmt: skip
def test_dimensionless_functions(f):
    check(f, ratio, units="")
    with pytest.raises(UnitError, match=r"needs a dimensionless operand .*m \[m\]"):
        quax.quaxify(f)(a)


def test_angles_are_radians():
    out = check(jnp.sin, angle, units="")
    np.testing.assert_allclose(out.array, [0.0, 0.5, 1.0], atol=1e-6)
    back = quax.quaxify(jnp.arcsin)(out)
    assert str(back.unit) == "rad"
    np.testing.assert_allclose(
        back.to_value("deg"), [0.0, 30.0, 90.0], rtol=1e-5, atol=1e-5
    )


def test_unsupported_primitive_raises_for_dimensionful():
    # The core's policy (`quax.GuardedValue`) words the refusal: the primitive,
    # the input types, the owner, then the units that would be dropped.
    with pytest.raises(
        UnitError,
        match=r"^Refusing to materialise `Quantity` for primitive `bessel_i0e` on "
        r"input types \(Quantity\): quax-units has no rule for this case, and "
        r"turning a quantity in m \(m\) into a plain array would drop its units\. "
        r"Strip the units first",
    ) as error:
        quax.quaxify(lambda x: lax.bessel_i0e(x))(a)
    assert isinstance(error.value, quax.MaterialisationError)
    assert isinstance(error.value, quax_units.UnitsMaterialisationError)


def test_unsupported_primitive_runs_on_the_numbers_where_allowed():
    # `allow_materialise=True` lets the quantity drop its units: the primitive runs
    # on its SI-coherent numbers (refused before, whatever the flag said).
    out = quax.quaxify(lambda x: lax.bessel_i0e(x))(b.enable_materialise())
    assert not isinstance(out, Quantity)
    np.testing.assert_allclose(out, lax.bessel_i0e(b.array), rtol=1e-6)


def test_unsupported_primitive_passes_dimensionless_through():
    out = quax.quaxify(lambda x: lax.bessel_i0e(x))(ratio)
    np.testing.assert_allclose(out, lax.bessel_i0e(ratio.array), rtol=1e-6)


def test_gather_scatter_keep_units():
    check(lambda x, y: x.at[jnp.array([0, 2])].set(y[:2]), a, b, units="m")
    check(lambda x, y: x.at[1].min(y[0]), a, b, units="m")
    check(lambda x, y: x.at[1].multiply(2.0), a, b, units="m")
    with pytest.raises(UnitError, match="dimensionless update"):
        quax.quaxify(lambda x, y: x.at[1].multiply(y[0]))(a, b)
    with pytest.raises(UnitError):
        quax.quaxify(lambda x, i: lax.dynamic_slice(x, (i,), (1,)))(a, Quantity(1, "m"))


@pytest.mark.parametrize("fill", [0.0, None, jnp.inf, jnp.nan, 5.0])
def test_a_gather_fills_out_of_bounds_entries_with_what_fits_the_units(fill):
    # `mode="fill"` writes its `fill_value` (a param, not an operand) where an index
    # is out of bounds. A plain number fits a dimensional quantity only where it is
    # 0, infinite or NaN, as anywhere else: 5.0 is refused for a length in km and a
    # temperature in degC (it used to be written into the SI numbers: 0.005 km,
    # -268.15 degC); a dimensionless quantity takes any.
    indices = jnp.array([1, 10])
    numbers = np.arange(12.0, dtype=np.float32).reshape(6, 2)
    f = quax.quaxify(lambda x: x.at[indices].get(mode="fill", fill_value=fill))
    dense = jnp.asarray(numbers).at[indices].get(mode="fill", fill_value=fill)
    for name in ("km", "degC", ""):
        q = Quantity(jnp.asarray(numbers), name)
        if fill == 5.0 and name:
            # The whole message, with its ways out (mutant `_index` 35: their end
            # changed).
            with pytest.raises(
                UnitError,
                match=r"^`gather` fills the entries out of bounds of .* with the plain "
                r"number 5\.0, which has no units: a plain number fits a dimensional "
                r"quantity only where it is 0, infinite or NaN\. Fill with NaN \(the "
                r"default for `mode='fill'`\) and put a quantity in the filled "
                r"entries \(`jnp\.where`\), or strip the units first "
                r"\(`quax_units\.ustrip`\)\.$",
            ):
                f(q)
            with pytest.raises(UnitError, match="plain number"):
                jax.jit(f)(q)
            continue
        for run in (f, jax.jit(f)):
            out = run(q)
            assert str(out.unit) == str(q.unit)
            np.testing.assert_array_equal(out.array[0], q.array[1])
            # The filled row: the fill as it is, in the SI numbers.
            np.testing.assert_array_equal(out.array[1], dense[1])


def test_vmap():
    check(jax.vmap(lambda x, y: x * y + x * y), a, t, units="m s")
    check(jax.vmap(lambda x: x * 2.0, in_axes=0), a, units="m")


def test_seconds_dimension():
    assert quax.quaxify(lambda x: x / x)(t).units == {}
    assert quax.quaxify(lambda x: 1 / x)(t).units == {seconds: -1}


def test_mixed_display_units_combine():
    out = quax.quaxify(lambda x, y: x / y)(
        Quantity(jnp.ones(3), "km"), Quantity(jnp.ones(3), "h")
    )
    assert str(out.unit) == "km / h"
    np.testing.assert_allclose(ustrip("km / h", out), 1.0, rtol=1e-6)


def test_copysign_and_signbit():
    # `jnp.signbit` reads the sign bit through `bitcast_convert_type`, which no rule
    # can give units: `jnp.copysign(length, time)` crashed with a refusal naming
    # that primitive. Now `copysign` is `x1`'s magnitude in its units with the
    # sign of `x2`'s SI numbers (of any dimensions), `signbit` that of the SI
    # numbers; each equals the plain computation on the SI arrays.
    check(jnp.copysign, b, t * -1.0, units="m")
    check(jnp.copysign, a, plain, units="m")
    check(jnp.copysign, plain, b, units=None)
    check(jnp.signbit, Quantity(jnp.array([1.0, -2.0, -0.0]), "km"), units=None)
    assert quax.quaxify(jnp.copysign)(b, t).unit == unit("km")
    # A temperature's sign is that of its kelvin, as for `jnp.sign` and `abs`.
    hot = quax.quaxify(jnp.copysign)(Quantity(jnp.array([20.0]), "degC"), -1.0)
    np.testing.assert_allclose(ustrip("K", hot), [-293.15], rtol=1e-6)
    # Under `vmap` and `grad` inside `quaxify`: d copysign(x, -1) / dx = -sign(x).
    got = quax.quaxify(jax.vmap(jnp.copysign))(b, t * -1.0)
    np.testing.assert_allclose(ustrip("m", got), jnp.copysign(b.array, -1.0))
    grad = quax.quaxify(
        jax.grad(lambda x: jnp.sum(jnp.copysign(x, -1.0)) / Quantity(1.0, "m"))
    )(b)
    np.testing.assert_allclose(ustrip("1 / m", grad), -jnp.sign(b.array))


@pytest.mark.parametrize("collective", [lax.psum, lax.pmean, lax.pmax, lax.pmin])
def test_collectives_over_a_named_axis(collective):
    # `psum`, `pmax` and `pmin` had no rule: a quantity under
    # `vmap(..., axis_name=...)` refused to materialise. They keep the units (a sum
    # or a selection), inside `quaxify` and outside it, against the plain program.
    x = Quantity(jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), "km")
    f = lambda v: collective(v, "i")
    want = jax.vmap(f, axis_name="i")(x.array)
    for run in (
        quax.quaxify(jax.vmap(f, axis_name="i")),
        jax.vmap(quax.quaxify(f), axis_name="i"),
        jax.jit(jax.vmap(quax.quaxify(f), axis_name="i")),
    ):
        got = run(x)
        assert got.unit == unit("km")
        np.testing.assert_allclose(ustrip("m", got), want, rtol=1e-6)
    # Temperatures: a sum is arithmetic, in kelvin; a maximum keeps the display.
    t = Quantity(jnp.array([1.0, 2.0, 3.0]), "degC")
    got = quax.quaxify(jax.vmap(f, axis_name="i"))(t)
    np.testing.assert_allclose(
        ustrip("K", got), jax.vmap(f, axis_name="i")(t.array), rtol=1e-6
    )
    selection = collective in (lax.pmax, lax.pmin)
    assert got.unit == unit("degC" if selection else "K")


@pytest.mark.parametrize("jit", [False, True])
def test_casting_to_bool_gives_plain_booleans(jit):
    # A cast to bool is whether each number is nonzero, the same in any unit: plain
    # booleans, as a comparison gives. It gave a quantity of booleans, whose True
    # read as 1 in SI units (`astype(bool)` of 2 m was 1 m, of 1e-3 mm 1000 mm), and
    # `jnp.any`/`jnp.all` of a quantity then refused (no rule for `reduce_or`).
    numbers = jnp.array([0.0, 1e-3, -2.0])
    for u in ("mm", "m", "km / h", "%"):
        x = Quantity(numbers, u)
        for f in (
            lambda x: x.astype(bool),
            jnp.any,
            jnp.all,
            jnp.logical_not,
            lambda x: jnp.where(x, 1, 0),
        ):
            run = quax.quaxify(f)
            got = (jax.jit(run) if jit else run)(x)
            assert not isinstance(got, Quantity)
            np.testing.assert_array_equal(got, f(numbers))
    # A temperature's numbers are kelvin, nonzero at 0 degC (a plain zero meeting a
    # temperature is read in kelvin, see the README).
    got = quax.quaxify(lambda t: t.astype(bool))(Quantity(jnp.array([0.0]), "degC"))
    np.testing.assert_array_equal(got, [True])
