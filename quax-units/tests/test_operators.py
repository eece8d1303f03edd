"""Python operators on `Unitful` outside `quax.quaxify`, offset units, `lift`."""

import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_units import Quantity, UnitError, Unitful, meters, unit, ustrip


a = Quantity(jnp.array([1.0, 2.0]), "m")
b = Quantity(jnp.array([3.0, 4.0]), "km")


def test_arithmetic_operators_follow_the_rules():
    np.testing.assert_allclose((a + b).array, [3001.0, 4002.0])
    assert str((a + b).unit) == "m"
    np.testing.assert_allclose((b - a).value, [2.999, 3.998])
    assert (a * 2).units == {meters: 1} and (2 * a).units == {meters: 1}
    assert (a * b).units == {meters: 2} and (a**2).units == {meters: 2}
    assert (a / b).units.is_dimensionless
    np.testing.assert_allclose(ustrip("", a / b), [1 / 3000, 2 / 4000])
    assert (1 / a).units == {meters: -1}
    np.testing.assert_allclose((-a).array, [-1.0, -2.0])
    np.testing.assert_allclose(abs(-a).array, [1.0, 2.0])
    np.testing.assert_allclose((+a).array, [1.0, 2.0])
    np.testing.assert_allclose((a @ b).array, 11000.0)
    np.testing.assert_allclose((b % Quantity(1.5, "km")).array, [0.0, 1000.0])
    np.testing.assert_allclose(ustrip("", b // a), [3000.0, 2000.0])
    # A TPU's float32 `pow` is an approximation (2 ** 1.5 within 1.6e-6, TPU v5e).
    rtol = 1e-5 if jax.default_backend() == "tpu" else 1e-7
    np.testing.assert_allclose((a**1.5).array, [1.0, 2.0**1.5], rtol=rtol)
    assert (a**1.5).units == unit("m**(3/2)").dimensions


def test_plain_and_numpy_operands():
    for left in (np.ones(2), jnp.ones(2), 1.0):
        out = left * a
        assert isinstance(out, Unitful) and out.units == {meters: 1}
    with pytest.raises(UnitError, match=r"`add` needs operands.*m \[m\] and plain"):
        _ = a + 1.0
    with pytest.raises(UnitError, match=r"m \[m\] and s \[s\]"):
        _ = a + Quantity(1.0, "s")
    with pytest.raises(TypeError):
        _ = a + "1 m"


_RATIO = Quantity(jnp.array([0.5, 2.0]), "")


@pytest.mark.parametrize(
    ("name", "left", "right"),
    [
        ("add", a, b),
        ("sub", 2.0 * _RATIO, 1.0),  # a plain left operand: `__rsub__`
        ("mul", 3.0, a),
        ("truediv", 1.0, a),
        ("floordiv", b, a),
        ("mod", b, Quantity(1.5, "km")),
        ("pow", a, 2),
        ("pow", 2.0, _RATIO),
        ("matmul", jnp.ones((2, 2)), a),
        ("lt", a, b),
        ("ge", b, a),
        ("eq", a, a),
        ("ne", a, b),
    ],
)
def test_each_operator_is_its_function_under_the_rules(name, left, right):
    # The operators come from `quax.OperatorMethods`: each is the function of
    # `operator` run by `quax.quaxify`, reflected too (`1.0 / a` is
    # `a.__rtruediv__(1.0)`).
    op = getattr(operator, name)
    want = quax.quaxify(op)(left, right)
    got = op(left, right)
    assert type(got) is type(want)
    if isinstance(want, Quantity):
        assert got.units == want.units
        np.testing.assert_array_equal(got.array, want.array)
    else:
        np.testing.assert_array_equal(got, want)


def test_bitwise_operators_and_other_operands_are_declined():
    # A quantity has no `&`, `|`, `^`: Python's own `TypeError`, as before.
    for op in (operator.and_, operator.or_, operator.xor):
        with pytest.raises(TypeError, match="unsupported operand"):
            op(a, a)
    with pytest.raises(TypeError, match="can't multiply sequence"):
        _ = "2" * a


def test_comparisons():
    np.testing.assert_array_equal(a < b, [True, True])
    np.testing.assert_array_equal(b >= a, [True, True])
    np.testing.assert_array_equal(a == Quantity(jnp.array([0.001, 3.0]), "km"), [1, 0])
    np.testing.assert_array_equal(a != a, [False, False])
    assert (a == "m") is False
    with pytest.raises(UnitError, match="`lt` needs operands of the same dimensions"):
        _ = a < Quantity(1.0, "s")


def test_indexing_len_iteration_shape():
    assert a[0].shape == () and float(a[0].array) == 1.0 and str(a[0].unit) == "m"
    m = Quantity(jnp.arange(6.0).reshape(2, 3), "s")
    np.testing.assert_array_equal(m[:, 1:].array, [[1.0, 2.0], [4.0, 5.0]])
    np.testing.assert_array_equal(m[jnp.array([1, 0]), 0].array, [3.0, 0.0])
    assert len(m) == 2 and m.shape == (2, 3) and m.ndim == 2 and m.size == 6
    assert [float(x.array) for x in a] == [1.0, 2.0]
    with pytest.raises(TypeError, match="len"):
        len(a[0])


def test_operators_under_jit():
    out = jax.jit(lambda x, y: (x + y) * x)(a, b)
    assert out.units == {meters: 2}
    np.testing.assert_allclose(out.array, [3001.0, 8004.0])


# Offset units ---------------------------------------------------------------------


def test_offset_units_convert_between_absolute_temperatures():
    t = Quantity(jnp.array([20.0, 100.0]), "degC")
    np.testing.assert_allclose(t.array, [293.15, 373.15])
    np.testing.assert_allclose(t.to_value("degF"), [68.0, 212.0], rtol=1e-6)
    np.testing.assert_allclose(t.to_value("K"), [293.15, 373.15])
    np.testing.assert_allclose(Quantity(-40.0, "°F").to_value("°C"), -40.0, rtol=1e-6)
    assert str(t.to("degF").unit) == "degF"
    np.testing.assert_allclose(Quantity(0, "degC").array, 273.15)
    assert unit("degC") != unit("K") and unit("delta_degC") == unit("K")


def test_offset_unit_arithmetic_is_in_kelvin():
    t1, t2 = Quantity(30.0, "degC"), Quantity(20.0, "degC")
    diff = t1 - t2  # a temperature difference
    assert str(diff.unit) == "K"
    np.testing.assert_allclose(diff.array, 10.0, rtol=1e-6)
    np.testing.assert_allclose(diff.to_value("delta_degF"), 18.0, rtol=1e-5)
    warmer = t2 + Quantity(5.0, "delta_degC")
    assert str(warmer.unit) == "K"
    np.testing.assert_allclose(warmer.to_value("degC"), 25.0, rtol=1e-6)
    # Every operation works on absolute (kelvin) values, as pint does with
    # `autoconvert_offset_to_baseunit`: a mean of temperatures is a temperature.
    m = quax.quaxify(jnp.mean)(Quantity(jnp.array([10.0, 20.0]), "degC"))
    np.testing.assert_allclose(m.to_value("degC"), 15.0, rtol=1e-6)
    np.testing.assert_allclose((t1 * 2).array, 2 * 303.15, rtol=1e-6)
    assert str((t1 * 2).unit) == "K"
    # Selections keep the display unit.
    pair = Quantity(jnp.array([10.0, 20.0]), "degC")
    assert str(pair[1].unit) == "degC"
    assert str(quax.quaxify(jnp.max)(pair).unit) == "degC"


def test_offset_units_do_not_compose():
    with pytest.raises(UnitError, match=r"offset unit degC.*delta_degC"):
        unit("degC / s")
    with pytest.raises(UnitError, match="offset unit degF"):
        _ = unit("degF") ** 2
    assert unit("delta_degC / s").dimensions == unit("K / s").dimensions


# Joining plain arrays with quantities ----------------------------------------------


def test_lift_plain_array_into_units():
    like = Quantity(jnp.ones(3), "s")
    zeros = Unitful.lift(np.zeros(3, np.float32), like)
    assert isinstance(zeros, Unitful) and zeros.units == like.units
    assert Unitful.lift(np.full(3, np.inf, np.float32), like) is not None
    assert Unitful.lift(np.ones(3, np.float32), like) is None
    assert Unitful.lift(jnp.ones(3), Quantity(jnp.ones(3), "%")) is not None
    traced = jax.jit(lambda x: Unitful.lift(x, like) is None)
    assert traced(jnp.zeros(3))  # unknown at trace time: not lifted
