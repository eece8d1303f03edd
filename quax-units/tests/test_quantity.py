"""The `Unitful` value: the published API, `Quantity`, conversion, display."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
from quax_units import (
    Dimension,
    Quantity,
    UnitError,
    Unitful,
    kilograms,
    meters,
    seconds,
    unit,
    ustrip,
)


def test_published_api():
    x = Unitful(jnp.array([1.0, 2.0]), meters)
    assert x.units == {meters: 1}
    np.testing.assert_array_equal(x.array, [1.0, 2.0])
    y = Unitful(jnp.array(3.0), {kilograms: 1, seconds: -2})
    assert y.units == {kilograms: 1, seconds: -2}
    assert isinstance(meters, Dimension)
    assert x.shape == (2,) and x.dtype == jnp.float32 and x.ndim == 1 and x.size == 2

    @quax.quaxify
    def f(a, b):
        return a * b

    z = f(x, y)
    assert z.units == {kilograms: 1, meters: 1, seconds: -2}
    np.testing.assert_array_equal(z.array, [3.0, 6.0])


def test_quantity_stores_si_and_displays_its_unit():
    q = Quantity(jnp.array([1.0, 2.5]), "km")
    np.testing.assert_allclose(q.array, [1000.0, 2500.0])
    assert q.unit == unit("km") and str(q.unit) == "km"
    np.testing.assert_allclose(q.value, [1.0, 2.5])
    np.testing.assert_allclose(ustrip("m", q), [1000.0, 2500.0])
    np.testing.assert_allclose(
        q.to_value("mi"), np.array([1000.0, 2500.0]) / 1609.344, rtol=1e-6
    )
    km_h = Quantity(36.0, "km / h")
    assert float(ustrip("m / s", km_h)) == pytest.approx(10.0)
    assert str(km_h.to("m / s").unit) == "m / s"
    assert float(km_h.to("m / s").value) == pytest.approx(10.0)


def test_integer_values():
    assert Quantity(3, "m").dtype == jnp.int32
    assert float(Quantity(3, "km").array) == 3000.0


def test_conversion_errors():
    q = Quantity(1.0, "m")
    with pytest.raises(UnitError, match=r"from m \(m\) to s \(s\)"):
        q.to("s")
    with pytest.raises(UnitError, match=r"from m \(m\) to kg \(kg\)"):
        ustrip("kg", q)
    with pytest.raises(UnitError, match="plain"):
        ustrip("m", jnp.ones(2))
    with pytest.raises(UnitError, match="does not have the dimensions"):
        Unitful(jnp.ones(2), meters, unit("s"))


def test_ustrip_plain_dimensionless():
    np.testing.assert_allclose(ustrip("", jnp.ones(2)), [1.0, 1.0])
    np.testing.assert_allclose(ustrip("percent", jnp.ones(2)), [100.0, 100.0])


def test_repr_eager_and_under_jit():
    q = Quantity(jnp.array([1.0, 2.0]), "km / s")
    assert repr(q) == "Quantity(Array([1., 2.], dtype=float32), unit='km / s')"
    seen = []

    @jax.jit
    @quax.quaxify
    def f(x):
        seen.append(repr(x))
        return x

    f(q)
    assert seen == ["QuaxTracer(Quantity(float32[2], unit='km / s'))"]


def test_repr_of_a_shape_shows_its_unit():
    # `jax.eval_shape` gives a quantity of a `ShapeDtypeStruct`: no numbers to
    # convert into its (non-SI) display unit, which the repr still shows.
    q = Quantity(jnp.array([1.0, 2.0]), "km")
    shape = jax.eval_shape(quax.quaxify(lambda x: 2 * x), q)
    assert repr(shape) == (
        "Quantity(ShapeDtypeStruct(shape=(2,), dtype=float32), unit='km')"
    )
    degrees = eqx.filter_eval_shape(lambda x: x, Quantity(20.0, "degC"))
    assert str(degrees).endswith("unit='degC')")


def test_materialise_refuses_dimensionful_allows_dimensionless():
    with pytest.raises(
        UnitError, match=r"Refusing to materialise `Quantity` .*in m / s \(m / s\)"
    ):
        Quantity(1.0, "m / s").materialise()
    np.testing.assert_allclose(Quantity(90.0, "deg").materialise(), np.pi / 2)


def test_m_and_km_share_one_compilation():
    # The families load on the first quaxified call, inside `jax.jit`'s trace; one
    # that adds a JAX context when it loads (quax-named's `axis_mapping`, where it is
    # installed) changes JAX's cache key after that call's, which then compiles
    # twice. Loading them first counts only the units' share.
    quax.plugins.load()
    f = jax.jit(quax.quaxify(lambda x, t: x / t))
    a = f(Quantity(jnp.ones(3), "m"), Quantity(2.0, "s"))
    b = f(Quantity(jnp.ones(3), "km"), Quantity(2.0, "h"))
    assert f._cache_size() == 1  # type: ignore[attr-defined]
    np.testing.assert_allclose(ustrip("m / s", a), 0.5)
    np.testing.assert_allclose(ustrip("m / s", b), 1000.0 / 7200.0, rtol=1e-6)
    # Different dimensions are a different pytree structure.
    f(Quantity(jnp.ones(3), "kg"), Quantity(2.0, "s"))
    assert f._cache_size() == 2  # type: ignore[attr-defined]


def test_tree_equal_is_physical():
    assert eqx.tree_equal(Quantity(1.0, "km"), Quantity(1000.0, "m"))
    assert not eqx.tree_equal(Quantity(1.0, "km"), Quantity(1.0, "s"))


def test_unit_times_number_is_quantity():
    q = 3.0 * unit("km")
    assert isinstance(q, Unitful) and q.array == 3000.0
    assert (unit("m") * 2.0).array == 2.0


def test_plugin_hooks():
    from quax_units import _plugin

    _plugin.quax_register_rules()
    assert list(_plugin.quax_value_types()) == [Unitful]
    assert _plugin.quax_example_module() is quax_units
    assert list(_plugin.quax_example_aliases()) == ["unitful"]


def test_quantity_is_a_class_and_unitful_the_same_class():
    q = Quantity(jnp.array([1.0, 2.0]), "km")
    assert isinstance(q, Quantity) and isinstance(q, Unitful) and Quantity is Unitful
    assert isinstance(Unitful(jnp.ones(2), meters), Quantity)
    assert isinstance(q, quax.ArrayValue)


def test_quantity_as_a_rule_annotation():
    # `x: Quantity` works in a rule: plum (and beartype) need a class.
    import plum
    from jax import lax

    @plum.dispatch
    def which(x: Quantity) -> str:  # pyright: ignore[reportRedeclaration]  (plum adds a method)
        return "quantity"

    @plum.dispatch
    def which(x: jax.Array) -> str:  # noqa: F811
        return "array"

    assert which(Quantity(1.0, "m")) == "quantity" and which(jnp.ones(1)) == "array"

    seen = []

    @quax.register(lax.exp2_p)
    def _(x: Quantity, **params):
        seen.append(x.unit)
        return Quantity(2.0 ** ustrip("", x), "")

    try:
        out = quax.quaxify(jnp.exp2)(Quantity(300.0, "%"))
        np.testing.assert_allclose(ustrip("", out), 8.0)
        # The rule ran, on the quantity; how many times is not part of the contract
        # (a compiled eager program traces it beside the first call).
        assert seen and all(u == unit("%") for u in seen)
    finally:
        # Restore the family's rule (registered by importing `_rules._arrays`).
        from quax_units._rules import _arrays

        quax.register_elementwise([lax.exp2_p])(_arrays._dimensionless)


def test_zeros_computed_from_a_quantity_fit_its_unit_with_eager_compilation():
    # Library code computes a plain zero from the quantity: equation by equation it
    # is known, so it fits the unit. Compiled eagerly it is traced: the check asks
    # `quax.known_constant`, and the code runs equation by equation, as answered.
    library = jax.jit(lambda q: q + (q > 0) * 0.0, inline=True)
    previous = quax.set_eager_compilation(True)
    try:
        for numbers in ([1.0, 2.0], [3.0, -4.0]):
            out = quax.quaxify(library)(Quantity(jnp.array(numbers), "km"))
            assert isinstance(out, Quantity) and out.unit == unit("km")
            np.testing.assert_array_equal(out.array, np.array(numbers) * 1000.0)
    finally:
        quax.set_eager_compilation(previous)
    # Under `jit` it is traced, but a product with zero: zero (or NaN) in any unit
    # (`quax.known_scale_invariant`).
    out = jax.jit(quax.quaxify(library))(Quantity(jnp.array([1.0, 2.0]), "km"))
    np.testing.assert_array_equal(out.array, [1000.0, 2000.0])
    # A zero that only the run time shows is refused, as before.
    differing = jax.jit(lambda q: q + ((q > 0) * 1.0 - (q > 0) * 1.0), inline=True)
    with pytest.raises(UnitError, match="only known at run time"):
        jax.jit(quax.quaxify(differing))(Quantity(jnp.ones(2), "km"))


def test_asarray_says_how_to_strip_units():
    q = Quantity(jnp.array([1.0, 2.0]), "km")
    for to_array in (jnp.asarray, np.asarray, jnp.array):
        with pytest.raises(
            UnitError,
            # NumPy's `__array__` and JAX's `__jax_array__` (the core's refusal,
            # with the units' reason) word it apart; both say how to strip them.
            match=r"would drop its units\. (Take its numbers in a unit of your "
            r"choice|Strip the units explicitly) with `quax_units\.ustrip",
        ):
            to_array(q)
    with pytest.raises(UnitError, match=r"q.to_value\('km'\)"):
        np.asarray(q)
    # Dimensionless quantities convert to their numbers.
    np.testing.assert_allclose(np.asarray(Quantity(jnp.array([50.0]), "%")), [0.5])
    np.testing.assert_allclose(jnp.asarray(Quantity(2.0, "")), 2.0)
    # Arrays still combine with quantities through the operators.
    np.testing.assert_allclose(ustrip("km", jnp.ones(2) * q), [1.0, 2.0])


def test_enable_materialise():
    q = Quantity(jnp.array([1.0, 2.0]), "km")
    with pytest.raises(UnitError, match=r"Refusing to materialise `Quantity` .*in km"):
        q.materialise()
    allowed = q.enable_materialise()
    np.testing.assert_allclose(allowed.materialise(), [1000.0, 2000.0])
    assert allowed.unit == q.unit and allowed.allow_materialise
    assert not allowed.enable_materialise(False).allow_materialise


def test_the_materialisation_policy_is_the_cores():
    q = Quantity(jnp.array([1.0, 2.0]), "km")
    assert issubclass(Quantity, quax.GuardedValue)
    # The refusal is a `UnitError`, as it always was, and a
    # `quax.MaterialisationError`, as every family's is.
    assert issubclass(quax_units.UnitsMaterialisationError, UnitError)
    assert issubclass(quax_units.UnitsMaterialisationError, quax.MaterialisationError)
    with pytest.raises(
        quax.MaterialisationError,
        match=r"^Refusing to materialise `Quantity` with `allow_materialise=False`, "
        r"and turning a quantity in km \(m\) into a plain array would drop its "
        r"units\. Strip the units explicitly",
    ):
        q.materialise()
    # A dimensionless quantity is a number: it may always materialise, and says so.
    for dimensionless in [Quantity(0.5), Quantity(50.0, "%"), q / q]:
        assert dimensionless.allow_materialise
    assert not Quantity(1.0, "m", allow_materialise=False).allow_materialise


@pytest.mark.parametrize(
    "u", ["km", "cm", "mi", "h", "ft", "km / h", "degC", "degF", "%"]
)
def test_given_numbers_read_back_exactly(u):
    # The numbers a quantity was made with come back bit for bit in its unit, as in
    # pint and unxt, although the array is held in SI-coherent units.
    numbers = np.random.default_rng(0).uniform(-100, 100, 1000).astype(np.float32)
    q = Quantity(jnp.asarray(numbers), u)
    np.testing.assert_array_equal(q.value, numbers)
    np.testing.assert_array_equal(ustrip(u, q), numbers)
    np.testing.assert_array_equal(
        q.to("m" if u in ("km", "cm", "mi", "ft") else u).to(u).value, numbers
    )
    # A computed quantity (here by `jax.jit`) reads its numbers from the SI array:
    # float32 rounding of the SI numbers (absolute: about 3e-5 K near 300 K).
    out = jax.jit(lambda q: q)(q)
    np.testing.assert_allclose(out.value, numbers, rtol=2e-7, atol=1e-4)


def test_examples_of_issue_18_round_trip():
    assert float(Quantity(3.0, "km").value) == 3.0
    assert float(Quantity(3, "km").value) == 3.0
    assert float(Quantity(0.1, "degC").value) == np.float32(0.1)
    to_f = Quantity(20.0, "degC").to("degF")
    assert (
        float(to_f.value) == 68.0
        and float(ustrip("degF", Quantity(20.0, "degC"))) == 68.0
    )
    assert repr(to_f) == "Quantity(Array(68., dtype=float32), unit='degF')"
    # The SI-coherent array (what programs compute on) is unchanged by `.to`.
    np.testing.assert_array_equal(to_f.array, Quantity(20.0, "degC").array)


def test_quantity_declares_its_array() -> None:
    # The declared aval (`Value.aval_leaf`) is the array's, weak type included: a weakly
    # typed Python-float Quantity times float16 stays float16, as in plain JAX.
    q = Quantity(2.0, "km")
    assert q.aval() == jax.typeof(q.array)
    half = jnp.ones(3, jnp.float16)
    out = quax.quaxify(jnp.multiply)(q, half)
    assert out.array.dtype == jnp.multiply(q.array, half).dtype == jnp.float16


@pytest.mark.parametrize(
    "args, error, match",
    [
        (("abc", "m"), ValueError, r"Quantity needs numbers as its `value`.*'abc'"),
        ((None, "m"), ValueError, r"Quantity needs numbers as its `value`.*None"),
        ((1.0, "furlong"), ValueError, r"Quantity's `unit` 'furlong' is not a unit"),
        ((1.0, "m**(1/0)"), ValueError, r"`unit` 'm\*\*\(1/0\)'.*divides by zero"),
        ((1.0, 3), TypeError, r"Quantity's `unit` 3 is not a unit: Expected a unit"),
        ((1.0, "m", "furlong"), ValueError, r"Quantity's `display` 'furlong'"),
    ],
)
def test_constructor_names_the_bad_argument(args, error, match):
    with pytest.raises(error, match=match):
        Quantity(*args)


def test_nan_in_is_nan_out():
    # NaNs stay where plain JAX has them, through rules that combine and convert
    # units, under jit, and when the numbers are read back in another unit.
    x = jnp.array([1.0, jnp.nan, 3.0, 4.0])
    y = jnp.array([2.0, 2.0, jnp.nan, 0.5])
    f = lambda a, b: jnp.sqrt(a * b + a**2) / b * a - a
    got = jax.jit(quax.quaxify(f))(Quantity(x, "km"), Quantity(y, "km"))
    want = f(x * 1e3, y * 1e3)
    assert np.array_equal(np.isnan(got.array), np.isnan(want))
    np.testing.assert_allclose(got.array, want, rtol=1e-6)
    np.testing.assert_allclose(ustrip("km", got), want / 1e3, rtol=1e-6)
