"""Every rule the families register with `quax.register_function` runs where a user
calls its function the usual way: eagerly and under `jax.jit`, with the function's
common keyword arguments. A rule that never runs is a silent bug (the body then
runs under the primitive rules, which may read it wrongly: `jnp.rad2deg` of an
angle multiplied the number, `jnp.round` of a temperature in `degC` rounded the
kelvins). Each case counts the rules that ran, with the caches off (a cached
program would skip them), and checks the result against literals or plain JAX on
the dense numbers."""

import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax._rules._functions as functions
import quax.testing
from jax import lax
from quax_structured import (
    Circulant,
    Diagonal,
    LowRankPlusDiagonal,
    StructuredMatrix,
    TridiagonalMatrix,
)
from quax_units import Quantity, UnitError, ustrip


def _registered_functions() -> set[str]:
    """The names of the functions some installed family registered a rule for."""
    quax.plugins.load()
    return {
        r.primitive.name.removesuffix(" (jitted function)")
        for candidates in functions._registered.values()
        for r in candidates
        if not r.code.co_filename.endswith(".py") or "/tests/" not in r.code.co_filename
    }


# Read when pytest imports this module, before any test runs: tests register rules
# for functions of their own that no file under `tests/` holds (`exec`'d source, a
# module they write and reload), and a worker that ran one of them first would
# count it as a family's.
_family_functions = _registered_functions()


@pytest.fixture
def fired(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The functions whose registered rules run (by name), with the caches off."""
    names: list[str] = []
    original = functions.registered_rule

    def recording(primitive: Any, args: Any, **kwargs: Any) -> Any:
        rule = original(primitive, args, **kwargs)
        if rule is not None:
            names.append(primitive.name.removesuffix(" (jitted function)"))
        return rule

    monkeypatch.setattr(functions, "registered_rule", recording)
    with quax.caching(False):
        yield names


def _close(got: Any, expected: Any) -> None:
    got = np.asarray(got)
    if got.dtype in (np.float32, np.complex64):
        # The backend's float32 accuracy: a TPU's differs from a CPU's
        # (`quax.testing.tolerance`).
        np.testing.assert_allclose(got, expected, **quax.testing.tolerance(got.dtype))
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


_Z = jnp.array([1 + 1j, -1.0 + 0j, 0 - 2j], dtype=jnp.complex64)
_PHASES = np.array([math.pi / 4, math.pi, -math.pi / 2])
_D = jnp.array([0.5, -1.0, 2.0])
_B = jnp.array([1.0, -2.0, 0.5])


_Case = tuple[str, str, Callable[..., Any], tuple[Any, ...], Callable[[Any], None]]


def _refuses(error: type[Exception], match: str) -> Callable[[Any], None]:
    # Where the rule's answer is a refusal with the way out, `out` is the error.
    def check(out: Any) -> None:
        assert isinstance(out, error), out
        assert match in str(out)

    return check


def _in_unit(
    unit: str, expected: Any, read_in: str | None = None
) -> Callable[[Any], None]:
    def check(out: Any) -> None:
        assert isinstance(out, Quantity) and str(out.unit) == unit
        _close(ustrip(read_in or unit, out), expected)

    return check


def _units_cases() -> list[_Case]:
    a, b = Quantity(jnp.array([3.0, 5.0]), "m"), Quantity(jnp.array([4.0, 12.0]), "m")
    km = Quantity(jnp.array([1.0, 2.0]), "km")
    kelvin = Quantity(jnp.array([293.65, 1.26]), "K")
    celsius = Quantity(jnp.array([20.65, 1.26]), "degC")
    turn = Quantity(jnp.array([math.pi, math.pi / 2]), "rad")
    quarter = Quantity(jnp.array([90.0, 45.0]), "deg")
    z = Quantity(_Z, "m")
    # The rule of `isclose` adds the way out (an `atol` in the operands' units) to
    # the body's error; that of `round` refuses a unit that is not SI-coherent.
    isclose_refused = _refuses(UnitError, "atol=Quantity")
    rounding_refused = _refuses(UnitError, "rounding depends on the unit")
    half_turn = [math.pi, math.pi / 2]
    quarter_turn = [math.pi / 2, math.pi / 4]
    return [
        ("hypot", "", jnp.hypot, (a, b), _in_unit("m", [5.0, 13.0])),
        ("hypot", "km", jnp.hypot, (km, a), _in_unit("km", [1.0000045, 2.0000062])),
        ("isclose", "", jnp.isclose, (km, km), isclose_refused),
        (
            "isclose",
            "equal_nan=True",
            lambda x, y: jnp.isclose(x, y, equal_nan=True),
            (km, km),
            isclose_refused,
        ),
        (
            "isclose",
            "allclose",
            lambda x, y: jnp.allclose(x, y),
            (km, km),
            isclose_refused,
        ),
        ("floor_divide", "", jnp.floor_divide, (km, a), _in_unit("", [333.0, 400.0])),
        ("copysign", "", jnp.copysign, (km, -a), _in_unit("km", [-1.0, -2.0])),
        (
            "signbit",
            "",
            jnp.signbit,
            (Quantity(jnp.array([-1.0, 2.0]), "km"),),
            lambda out: np.testing.assert_array_equal(out, [True, False]),
        ),
        (
            "floor_divide",
            "//",
            lambda x, y: x // y,
            (km, a),
            _in_unit("", [333.0, 400.0]),
        ),
        (
            "divmod",
            "quotient",
            lambda x, y: jnp.divmod(x, y)[0],
            (km, a),
            _in_unit("", [333.0, 400.0]),
        ),
        (
            "divmod",
            "remainder",
            lambda x, y: jnp.divmod(x, y)[1],
            (km, a),
            _in_unit("km", [1.0, 0.0], "m"),
        ),
        ("round", "", jnp.round, (kelvin,), _in_unit("K", [294.0, 1.0])),
        (
            "round",
            "decimals=12",
            lambda x: jnp.round(x, 12),
            (kelvin,),
            _in_unit("K", [293.65, 1.26]),
        ),
        (
            "round",
            "degC decimals=-9",
            # The body gave 0 K, where pint gives 0 degC (273.15 K).
            lambda x: jnp.round(x, -9),
            (celsius,),
            rounding_refused,
        ),
        (
            "round",
            "decimals=1",
            lambda x: jnp.round(x, 1),
            (kelvin,),
            _in_unit("K", [293.6, 1.3]),
        ),
        (
            "round",
            "degC",
            lambda x: jnp.round(x, decimals=1),
            (celsius,),
            rounding_refused,
        ),
        (
            "around",
            "decimals=1",
            lambda x: jnp.around(x, decimals=1),
            (kelvin,),
            _in_unit("K", [293.6, 1.3]),
        ),
        ("around", "degC", jnp.around, (celsius,), rounding_refused),
        (
            "sinc",
            "",
            jnp.sinc,
            (Quantity(jnp.array([0.5, 0.25]), "%"),),
            _in_unit("", np.sinc([0.005, 0.0025])),
        ),
        ("rad2deg", "", jnp.rad2deg, (turn,), _in_unit("deg", half_turn, "rad")),
        ("rad2deg", "degrees", jnp.degrees, (turn,), _in_unit("deg", half_turn, "rad")),
        ("deg2rad", "", jnp.deg2rad, (quarter,), _in_unit("rad", quarter_turn)),
        ("deg2rad", "radians", jnp.radians, (quarter,), _in_unit("rad", quarter_turn)),
        ("angle", "", jnp.angle, (z,), _in_unit("rad", _PHASES)),
        (
            "angle",
            "deg=True",
            lambda x: jnp.angle(x, deg=True),
            (z,),
            _in_unit("deg", _PHASES, "rad"),
        ),
    ]


def _structured_cases() -> list[_Case]:
    def diagonal(expected: Any) -> Callable[[Any], None]:
        def check(out: Any) -> None:
            # The structure is kept (the body would refuse, or give a dense array).
            assert isinstance(out, StructuredMatrix), out
            _close(out.dense(), np.diag(expected))

        return check

    def solved(m: StructuredMatrix) -> Callable[[Any], None]:
        def check(out: Any) -> None:
            _close(out, np.linalg.solve(np.asarray(m.dense()), np.asarray(_B)))

        return check

    def slogdet_of(m: StructuredMatrix) -> Callable[[Any], None]:
        def check(out: Any) -> None:
            sign, logabsdet = np.linalg.slogdet(np.asarray(m.dense()))
            _close(out[0], sign)
            _close(out[1], logabsdet)

        return check

    d = Diagonal(_D)
    lrpd = LowRankPlusDiagonal(
        jnp.array([2.0, 3.0, 4.0]), jnp.array([[1.0, 0.5], [0.0, -1.0], [2.0, 1.0]])
    )
    tri = TridiagonalMatrix(
        jnp.array([1.0, -0.5]), jnp.array([3.0, 4.0, 5.0]), jnp.array([0.5, 2.0])
    )
    exp = diagonal(np.exp(np.asarray(_D)))
    inverse = diagonal(1 / np.asarray(_D))
    return [
        ("expm", "", jsl.expm, (d,), exp),
        (
            "expm",
            "max_squarings=20",
            lambda m: jsl.expm(m, max_squarings=20),
            (d,),
            exp,
        ),
        (
            "expm",
            "upper_triangular=True",
            lambda m: jsl.expm(m, upper_triangular=True),
            (d,),
            exp,
        ),
        ("_pinv", "", jnp.linalg.pinv, (d,), inverse),
        (
            "_pinv",
            "hermitian=True",
            lambda m: jnp.linalg.pinv(m, hermitian=True),
            (d,),
            inverse,
        ),
        ("_pinv", "rtol", lambda m: jnp.linalg.pinv(m, rtol=1e-3), (d,), inverse),
        ("solve", "LowRankPlusDiagonal", jnp.linalg.solve, (lrpd, _B), solved(lrpd)),
        ("solve", "Tridiagonal", jnp.linalg.solve, (tri, _B), solved(tri)),
        ("slogdet", "", jnp.linalg.slogdet, (lrpd,), slogdet_of(lrpd)),
    ]


_CASES = _units_cases() + _structured_cases()


def test_every_registered_function_has_a_case() -> None:
    # A family that registers a rule for another function adds its cases here.
    assert _family_functions <= {name for name, *_ in _CASES}


# The functions whose rules keep a structure that a scan cannot stack and unstack (a
# `Diagonal` refuses to be squeezed): in a `scan` body, their output is the carry.
_STRUCTURED_OUTPUT = {"expm", "_pinv"}


def _called(how: str, name: str, f: Any) -> Any:
    """`f` quaxified and called `how`: eagerly, under `jax.jit` outside `quaxify`, or
    inside a body JAX traces itself before quax meets it (a `jax.jit` function, a
    `lax.scan` body), where JAX's own staging inlines a `jax.jit(inline=True)`
    function (`jnp.rad2deg`) unless quax keeps it as a call."""
    if how == "eager":
        return quax.quaxify(f)
    if how == "jit":
        return jax.jit(quax.quaxify(f))
    if how == "jit body":
        return quax.quaxify(jax.jit(lambda *args: f(*args)))
    assert how == "scan body"

    def scanned(*args: Any) -> Any:
        if name in _STRUCTURED_OUTPUT:
            # The rule runs once for the initial carry, once in the body.
            out, _ = lax.scan(lambda c, _: (f(*args), None), f(*args), length=1)
            return out
        _, ys = lax.scan(lambda c, _: (c, f(*c)), args, length=1)
        return jax.tree.map(lambda y: y[0], ys)

    return quax.quaxify(scanned)


@pytest.mark.parametrize(
    "name, f, args, check",
    [(name, f, args, check) for name, _, f, args, check in _CASES],
    ids=[f"{name}-{how}" if how else name for name, how, *_ in _CASES],
)
@pytest.mark.parametrize("how", ["eager", "jit", "jit body", "scan body"])
def test_the_rule_runs(
    name: str, f: Any, args: Any, check: Any, how: str, fired: list[str]
) -> None:
    try:
        out = _called(how, name, f)(*args)
    except Exception as e:  # a refusal the rule gives: `check` reads it
        out = e
    check(out)
    in_body = how == "scan body" and name in _STRUCTURED_OUTPUT
    assert fired.count(name) >= (2 if in_body else 1)


def test_expm_upper_triangular_of_a_structure_that_is_not_upper_triangular() -> None:
    # JAX's `expm(M, upper_triangular=True)` reads only the upper triangle of a
    # circulant: its answer is not the exponential the structure gives, so the
    # structure's rule refuses instead of answering differently from dense.
    c = Circulant(jnp.array([0.5, 0.2, -0.1]))
    dense = jsl.expm(c.dense(), upper_triangular=True)
    assert not np.allclose(dense, jsl.expm(c.dense()))
    with pytest.raises(ValueError, match="upper_triangular=True"):
        quax.quaxify(lambda m: jsl.expm(m, upper_triangular=True))(c)
