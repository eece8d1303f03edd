"""Units: tests that kill mutants of `quax_units/_rules/_arrays.py` and
`_functions.py` which the other test files let through (`scripts/mutation.sh
units-rules`, `units-functions`; docs/mutation.md lists each
surviving mutant of the sample run and the test that kills it). They check what the
errors tell a user: the unit the numbers are held in, and the way out."""

import jax
import jax.extend.core.primitives as jprim
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from equinox.internal._loop.common import _maybe_set, select_if_vmap_p
from jax import lax
from quax_units import Quantity, UnitError


def test_rounding_refused_names_the_unit_the_numbers_are_held_in() -> None:
    # A length in km is held in metres; an angle in degrees as plain numbers
    # (radians). The message says so (mutant: `si or ...` read as `si and ...`, which
    # names plain numbers for a length, and nothing for an angle).
    floor = quax.quaxify(jnp.floor)
    with pytest.raises(UnitError, match=r"its numbers are held in m, not km "):
        floor(Quantity(jnp.array([1.6, 2.2]), "km"))
    with pytest.raises(
        UnitError,
        match=r"its numbers are held in plain numbers \(an angle in radians\), "
        r"not deg ",
    ):
        floor(Quantity(jnp.array([90.5]), "deg"))


def test_refused_exponents_name_the_way_out() -> None:
    # `x ** y` with `y` traced: the units would depend on it. float32 pi is no
    # fraction with a denominator up to 1000 (355/113 rounds to another float32):
    # refused with the way out of a power of a quantity, not `rational_exponent`'s
    # default. (Mutants: the first way out changed, the second left out.)
    x = Quantity(jnp.array([1.0, 2.0]), "m")
    with pytest.raises(
        UnitError,
        match=r"the units of the result would depend on it\. Use a constant "
        r"exponent \(`x \*\* 1\.5`\)\.",
    ):
        jax.jit(quax.quaxify(lambda a, e: a**e))(x, jnp.float32(2.0))
    with pytest.raises(
        UnitError,
        match=r"Use a finite exponent that is a simple fraction \(`x \*\* \(1 / 3\)`, "
        r"`x \*\* 1\.5`\), or make the base dimensionless first",
    ):
        quax.quaxify(lambda a: a ** jnp.float32(jnp.pi))(x)


def test_adding_a_length_to_a_time_says_what_went_wrong_and_nothing_else() -> None:
    # Eagerly, with both operands concrete quantities, the message holds no hint about
    # traced plain operands, and no way out of another operation (mutant: a stray
    # hint text where no hint applies).
    with pytest.raises(UnitError) as info:
        quax.quaxify(jnp.add)(Quantity(1.0, "m"), Quantity(2.0, "s"))
    assert str(info.value).splitlines()[0] == (
        "`add` needs operands of the same dimensions, but got m [m] and s [s]. "
        "Quantities with the same dimensions in different units (m, km) combine; "
        "these cannot."
    )


def test_a_complex_number_of_two_dimensions_names_the_way_out() -> None:
    # `lax.complex(x, y)` of a length and a time: refused with its own way out, the
    # one sentence that says how (mutant: the way out never appended).
    with pytest.raises(
        UnitError,
        match=r"these cannot\. Give both parts in one dimension "
        r"\(`lax\.complex\(x, Quantity\(y, unit\)\)`\), or strip the units",
    ):
        quax.quaxify(lax.complex)(Quantity(1.0, "m"), Quantity(2.0, "s"))


# `_functions.py`, a sample (seed 46).


def test_an_angle_shown_in_another_unit_keeps_its_numbers_and_dtype() -> None:
    # `jnp.rad2deg` and `jnp.deg2rad` of an angle show it in deg or rad: the numbers
    # (radians) stay, in the dtype JAX's functions give, float16 here (mutant
    # `_angle_shown_in` 10: cast to the default float dtype, float32).
    x = Quantity(jnp.array([0.5, 1.0], jnp.float16), "rad")
    for fn, unit in ((jnp.rad2deg, "deg"), (jnp.deg2rad, "rad")):
        f = quax.quaxify(fn)
        for run in (f, jax.jit(f)):
            out = run(x)
            assert str(out.unit) == unit
            assert out.array.dtype == jnp.float16 == fn(jnp.float16(0.5)).dtype
            np.testing.assert_array_equal(out.array, np.array([0.5, 1.0], np.float16))


def test_converting_a_length_as_an_angle_names_both_ways_out() -> None:
    # `jnp.rad2deg` of metres: refused, with the way out for plain numbers and for
    # an angle (mutant `_angle_shown_in` 6: the second changed).
    with pytest.raises(
        UnitError,
        match=r"To scale plain numbers by 180 / pi, strip the units first "
        r"\(`quax_units\.ustrip\(unit, q\)`\); to show an angle in another unit, "
        r"use `q\.to\(unit\)`\.",
    ):
        quax.quaxify(jnp.rad2deg)(Quantity(1.0, "m"))


# The registered rules, a first sample (seed 48, `--decorated`).


def test_clamping_a_length_between_two_lengths() -> None:
    # `lax.clamp(low, x, high)` of lengths: the numbers clipped as NumPy clips them,
    # in metres (mutant `_clamp` 15: the lower bound left out of the bind).
    x = np.array([-1.5, 0.25, 0.75, 3.0], np.float32)
    f = quax.quaxify(lax.clamp)
    for run in (f, jax.jit(f)):
        out = run(Quantity(0.0, "m"), Quantity(jnp.asarray(x), "m"), Quantity(1.0, "m"))
        assert str(out.unit) == "m"
        np.testing.assert_array_equal(out.array, np.clip(x, 0.0, 1.0))


def test_a_loop_buffer_written_at_an_index_with_units_names_the_index() -> None:
    # Equinox's loop buffers are written with `maybe_set_p` (diffrax's saved
    # solution; bound here as equinox binds it, for one array index): a length
    # written into a buffer of lengths stays one, and an index in seconds is refused
    # as an index (mutant `_maybe_set` 12: called an operand). Equinox's own
    # `buffer.at[i].set(x)` never gets there with such an index: it wraps a
    # negative index first, and that sum is refused.
    from equinox.internal._loop.common import maybe_set_p

    def write(buffer: Quantity, x: Quantity, i: object) -> Quantity:
        (out,) = maybe_set_p.bind(
            jnp.bool_(True),
            buffer,
            x,
            i,
            i_static=None,
            i_treedef=jax.tree_util.tree_structure(0),
            kwargs=(),
            makes_false_steps=False,
        )
        return out

    buffer = Quantity(jnp.zeros(4), "m")
    f = quax.quaxify(write)
    for run in (f, jax.jit(f)):
        out = run(buffer, Quantity(jnp.float32(2.5), "m"), jnp.int32(2))
        assert str(out.unit) == "m"
        np.testing.assert_array_equal(out.array, np.array([0.0, 0.0, 2.5, 0.0]))
    with pytest.raises(UnitError, match=r"`maybe_set` needs a dimensionless index \("):
        f(buffer, Quantity(jnp.float32(2.5), "m"), Quantity(jnp.int32(2), "s"))


def test_a_known_plain_part_beside_a_quantity_in_add_any_is_refused_either_way() -> (
    None
):
    # Autodiff's accumulation of a quantity in metres and a plain part: zeros (an
    # instantiated symbolic zero) take the metres, a known nonzero part is refused,
    # with the quantity first or second (mutant: the plain part looked for on the
    # wrong side when the quantity comes first).
    add_any = jprim.add_jaxvals_p
    q = Quantity(jnp.array([1.0, 2.0]), "m")
    for first in (True, False):
        bind = quax.quaxify(
            lambda q, p, first=first: (
                add_any.bind(q, p) if first else add_any.bind(p, q)
            )
        )
        out = bind(q, jnp.zeros(2))
        assert out.units == q.units
        np.testing.assert_array_equal(out.array, [1.0, 2.0])
        with pytest.raises(
            UnitError, match=r"a plain part other than zeros beside a dimensional one"
        ):
            bind(q, jnp.array([3.0, 4.0]))


def test_complex_builds_a_quantity_from_its_two_parts() -> None:
    # `lax.complex` of two lengths: a complex length, the real part first (mutants:
    # the result's array dropped; the real part replaced by `None`). A plain zero
    # part fits any unit; parts of two dimensions are refused.
    re = Quantity(jnp.array([1.0, 2.0]), "km")
    im = Quantity(jnp.array([30.0, -40.0]), "m")
    f = quax.quaxify(lax.complex)
    g = quax.quaxify(lambda im: lax.complex(jnp.zeros(2), im))
    for run, run_zero in ((f, g), (jax.jit(f), jax.jit(g))):
        out = run(re, im)
        assert out.units == re.units
        np.testing.assert_array_equal(out.array, [1000.0 + 30.0j, 2000.0 - 40.0j])
        zero_real = run_zero(im)
        np.testing.assert_array_equal(zero_real.array, [30.0j, -40.0j])
        assert zero_real.units == im.units
    with pytest.raises(UnitError, match=r"Give both parts in one dimension"):
        f(re, Quantity(jnp.array([1.0, 2.0]), "s"))


def test_an_update_in_other_units_names_dynamic_update_slice() -> None:
    # Writing seconds into metres is refused, naming the primitive (mutant: the
    # primitive left out of the refusal).
    x = Quantity(jnp.zeros(4), "m")
    with pytest.raises(UnitError, match=r"dynamic_update_slice"):
        quax.quaxify(lambda x, u: lax.dynamic_update_slice(x, u, (1,)))(
            x, Quantity(jnp.ones(2), "s")
        )
    out = quax.quaxify(lambda x, u: lax.dynamic_update_slice(x, u, (1,)))(
        x, Quantity(jnp.ones(2), "km")
    )
    np.testing.assert_array_equal(out.array, [0.0, 1000.0, 1000.0, 0.0])


# The registered rules against the whole suite (seed 51, `--suite --decorated`).


def test_joining_a_length_and_a_time_names_concatenate() -> None:
    # `jnp.concatenate` of metres and seconds: refused, naming the primitive
    # (mutant `_concatenate` 2: `None` named in its place).
    with pytest.raises(
        UnitError, match=r"^`concatenate` needs operands of the same dimensions"
    ):
        quax.quaxify(lambda x, y: jnp.concatenate([x, y]))(
            Quantity(jnp.ones(2), "m"), Quantity(jnp.ones(3), "s")
        )


def test_a_cumulative_product_of_lengths_says_why_it_is_refused() -> None:
    # The reason, whole: element i has the units to the power i + 1, and an array
    # holds one unit (mutant `_cumprod` 5: a sentence of it changed).
    with pytest.raises(
        UnitError,
        match=r"^`cumprod` needs a dimensionless operand \(element i of a cumulative "
        r"product has the units raised to the power i \+ 1: m, m2, m3, \.\.\., and "
        r"an array holds one unit for all its elements\), but got ",
    ):
        quax.quaxify(jnp.cumprod)(Quantity(jnp.array([1.0, 2.0]), "m"))


# Units' registered rules against the whole suite (seed 52, `--suite --decorated`).


def test_a_scatter_at_indices_with_units_names_the_index() -> None:
    # The indices of a scatter must be plain numbers: refused, naming the index as
    # what needs to be dimensionless (mutant `_scatter` 13: "a dimensionless None").
    a = Quantity(jnp.array([1.0, 2.0, 3.0]), "km")
    numbers = lax.ScatterDimensionNumbers(
        update_window_dims=(),
        inserted_window_dims=(0,),
        scatter_dims_to_operand_dims=(0,),
    )
    f = quax.quaxify(lambda a, i, u: lax.scatter(a, i, u, numbers))
    with pytest.raises(
        UnitError, match=r"^`scatter` needs a dimensionless index \(angles count"
    ):
        f(a, Quantity(jnp.array([[1]]), "m"), Quantity(jnp.array([9.0]), "km"))


_I = jnp.array([2, 0])
_MASK = jnp.array([True, False, True])

# (program of two quantities x, y; the unit its result shows for two lengths in km;
# for two temperatures in degC). A selection (max, where, a scatter that sets, a
# slice) keeps an offset unit; arithmetic gives its SI unit, K; `None`: a program
# that temperatures do not make sense in, run for lengths only.
_SHOWN = {
    "add": (lambda x, y: x + y, "km", "K"),
    "sub": (lambda x, y: x - y, "km", "K"),
    "max": (jnp.maximum, "km", "degC"),
    "min": (jnp.minimum, "km", "degC"),
    "rem": (jnp.remainder, "km", "K"),
    "nextafter": (jnp.nextafter, "km", "degC"),
    "clamp": (lambda x, y: lax.clamp(y[1], x, y[2]), "km", "degC"),
    "select_n": (lambda x, y: jnp.where(_MASK, x, y), "km", "degC"),
    "concatenate": (lambda x, y: jnp.concatenate([x, y]), "km", "degC"),
    "stack": (lambda x, y: jnp.stack([x, y]), "km", "degC"),
    "pad": (lambda x, y: jnp.pad(x, 1, constant_values=y[0]), "km", "degC"),
    "dynamic_update_slice": (
        lambda x, y: lax.dynamic_update_slice(x, y[:1], (1,)),
        "km",
        "degC",
    ),
    "scatter": (lambda x, y: x.at[_I].set(y[:2]), "km", "degC"),
    "scatter_max": (lambda x, y: x.at[_I].max(y[:2]), "km", "degC"),
    "scatter_add": (lambda x, y: x.at[_I].add(y[:2]), "km", "K"),
    "scatter_mul": (lambda x, y: x.at[_I].multiply(2.0), "km", None),
    "complex": (lax.complex, "km", None),
    "real": (lambda x, y: jnp.real(lax.complex(x, y)), "km", None),
    "mul": (lambda x, y: x * y, "km2", None),
    "div": (lambda x, y: x / (y / x), "km", None),
    "reciprocal": (lambda x, y: 1.0 / x, "1 / km", None),
    "pow": (lambda x, y: x**2, "km2", None),
    "integer_pow": (lambda x, y: lax.integer_pow(x, 3), "km3", None),
    "sqrt": (lambda x, y: jnp.sqrt(x * y), "km", None),
    "cbrt": (lambda x, y: jnp.cbrt(x * x * x), "km", None),
    "neg": (lambda x, y: -x, "km", "K"),
    "abs": (lambda x, y: jnp.abs(x), "km", "K"),
    "sort": (lambda x, y: jnp.sort(x), "km", "degC"),
    "gather": (lambda x, y: x[_I], "km", "degC"),
    "slice": (lambda x, y: x[1:], "km", "degC"),
    "sum": (lambda x, y: jnp.sum(x), "km", "K"),
    "reduce_max": (lambda x, y: jnp.max(x), "km", "degC"),
    "prod": (lambda x, y: jnp.prod(x), "km3", None),
    "cumsum": (lambda x, y: jnp.cumsum(x), "km", None),
    "cummax": (lambda x, y: lax.cummax(x), "km", "degC"),
    "dot": (lambda x, y: x @ y, "km2", None),
    "var": (lambda x, y: jnp.var(x), "km2", None),
    "hypot": (jnp.hypot, "km", None),
    # Equinox's loop primitives, bound as its loops bind them (diffrax's steps and
    # saved solution), which `jax.numpy` never binds.
    "select_if_vmap": (
        lambda x, y: select_if_vmap_p.bind(jnp.bool_(True), x, y),
        "km",
        "degC",
    ),
    "maybe_set": (
        lambda x, y: _maybe_set(True, x, y[0], 1, kwargs={}, makes_false_steps=False),
        "km",
        "degC",
    ),
}


@pytest.mark.parametrize(
    ("op", "kind"),
    [(op, "km") for op in sorted(_SHOWN)]
    + [(op, "degC") for op in sorted(_SHOWN) if _SHOWN[op][2] is not None],
)
def test_each_rule_shows_its_result_in_the_operands_unit(op: str, kind: str) -> None:
    # The numbers are held in SI units; what a result shows (`.unit`) follows the
    # operands' units, so that a program in km prints km (mutants: a rule's display
    # unit dropped, as `_select_n` 25 did, or taken linear where a selection keeps
    # an offset unit, or the other way round).
    f, km, degc = _SHOWN[op]
    want = km if kind == "km" else degc
    x = Quantity(jnp.array([10.0, 20.0, 30.0]), kind)
    y = Quantity(jnp.array([15.0, 5.0, 40.0]), kind)
    assert str(quax.quaxify(f)(x, y).unit) == want
