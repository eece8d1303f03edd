"""Eager quax runs library code on values as one compiled program per call
(`quax._caching._eager`): inlined `jit`s (every `jax.numpy` function), Python operators
on traced values, and `quax.quaxify` of a jitted or `operator` function. What must not
change: exact results, the user's Python side effects and `jax.debug` calls, the
materialisation report, and refusals (same point, same text)."""

import operator
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._caching._eager as quax_eager
from jaxtyping import Array
from quax._caching._keys import value_structure

from .helpers import BARRIERS, Dense, compiles_eager_programs


class Opaque(quax.ArrayValue):
    """A value with no rules that refuses to materialise unless allowed."""

    array: Array
    allow: bool = eqx.field(static=True, default=False)

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        if not self.allow:
            raise RuntimeError(
                "Refusing to materialise `Opaque`: allow_materialise=True"
            )
        return self.array


@pytest.fixture(autouse=True)
def _compiled() -> Any:
    """Every test here runs with eager compilation on (the default, unless the
    session runs with `QUAX_EAGER_COMPILE=0`), except where it turns it off itself."""
    previous = quax.set_eager_compilation(True)
    yield
    quax.set_eager_compilation(previous)


def _programs_of(code: Any) -> list[Any]:
    """The entries of the compiled eager programs kept for `code` (keyed by its
    `id`, the first component of their keys)."""
    return [e for k, e in quax_eager._programs._data.items() if k[0] == id(code)]


X = jnp.array([0.5, -1.5, 2.25, 3.0])
Y = jnp.array([1.25, 2.0, -0.75, 4.0])

FUNCTIONS = [
    pytest.param(jnp.multiply, id="jnp.multiply"),
    pytest.param(operator.mul, id="operator.mul"),
    pytest.param(lambda a, b: a * b + a, id="a*b+a"),
    pytest.param(lambda a, b: (a - b) / 3.0 + a**2 - 2.5 * b, id="operators"),
    pytest.param(lambda a, b: jnp.sin(a) * jnp.exp(b) @ a, id="jnp"),
    pytest.param(lambda a, b: jax.nn.softmax(a * b), id="softmax"),
    pytest.param(lambda a, b: jnp.var(a) + jnp.sum(b), id="reductions"),
]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_exact_results(fn: Any) -> None:
    q = quax.quaxify(fn)
    expected = fn(X, Y)  # plain JAX
    with quax.track_materialisation():  # equation by equation
        by_equation = q(Dense(X), Dense(Y)).array
    for _ in range(3):  # the first runs by equation, the second compiles, then replays
        out = q(Dense(X), Dense(Y))
        assert type(out) is Dense
        np.testing.assert_array_equal(out.array, expected)
        np.testing.assert_array_equal(out.array, by_equation)


class Fused(quax.ArrayValue):
    """A value whose rules compute what XLA would fuse: a multiply feeding an add
    (contracted to one fused multiply-add when compiled whole), and `exp` of a
    constant (which a compiled program could fold with its own arithmetic)."""

    array: Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        return self.array


_EXPONENTS = np.linspace(-3.0, 3.0, 257, dtype=np.float32)


@quax.register(jax.lax.sub_p)
def _(x: Fused, y: Fused) -> Fused:
    return Fused(x.array * jnp.float32(10.0) - y.array)


@quax.register(jax.lax.add_p)
def _(x: Fused, y: Fused) -> Fused:
    return Fused(x.array * y.array + jnp.exp(_EXPONENTS) * x.array)


@pytest.mark.parametrize("fn", [jnp.subtract, jnp.add, operator.sub])
def test_first_and_later_calls_round_alike(fn: Any) -> None:
    # The first call runs the rules' equations one by one, each rounding its
    # outputs; the compiled program of the later calls must not round otherwise
    # (XLA would contract `x * 10 - y` into a fused multiply-add: 1.5e-8 for
    # x = 0.1, y = 1 in float32, where the equations give 0).
    x = jnp.asarray(np.random.default_rng(0).uniform(-2, 2, 257), jnp.float32)
    x = x.at[:4].set(0.1)
    y = jnp.ones(257, jnp.float32)
    q = quax.quaxify(fn)
    first = q(Fused(x), Fused(y)).array
    if fn is not jnp.add:
        np.testing.assert_array_equal(first[:4], 0.0)
    traced = quax_eager.programs_traced
    for _ in range(3):  # the second call compiles, the third replays
        np.testing.assert_array_equal(q(Fused(x), Fused(y)).array, first)
    if BARRIERS:  # else every call ran equation by equation
        assert quax_eager.programs_traced == traced + 1


@pytest.mark.caching_behaviour
def test_backend_without_barriers_runs_by_equation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The TPU runtime cannot compile the optimisation barrier that keeps each
    # equation's rounding (`UNIMPLEMENTED: HLO opt-barrier is not implemented on
    # TPU`): the check fails, and every call of that backend runs equation by
    # equation, with the first call's bits, never the backend's error.
    def unimplemented(device: Any) -> bool:
        raise jax.errors.JaxRuntimeError(
            "UNIMPLEMENTED: HLO opt-barrier is not implemented on TPU"
        )

    monkeypatch.setattr(quax_eager, "_barriers_checked", {})
    monkeypatch.setattr(quax_eager, "_barriers_kept_on", unimplemented)
    x = jnp.asarray(np.random.default_rng(1).uniform(-2, 2, 33), jnp.float32)
    x = x.at[:4].set(0.1)
    y = jnp.ones(33, jnp.float32)
    q = quax.quaxify(jnp.subtract)
    first = q(Fused(x), Fused(y)).array
    np.testing.assert_array_equal(first[:4], 0.0)  # the equations' rounding
    for _ in range(3):
        np.testing.assert_array_equal(q(Fused(x), Fused(y)).array, first)
    assert quax_eager._barriers_checked == {jax.default_backend(): False}
    assert quax_eager._BY_EQUATION in _programs_of(jnp.subtract)


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_library_code_runs_compiled() -> None:
    q = quax.quaxify(lambda a, b: jnp.sin(a) * b)
    for _ in range(2):  # the second call compiles the programs
        q(Dense(X), Dense(Y))
        quax.quaxify(jnp.multiply)(Dense(X), Dense(Y))
    with quax.plugins.track_evaluations() as report:
        q(Dense(X), Dense(Y))
        quax.quaxify(jnp.multiply)(Dense(X), Dense(Y))
    assert report.total == 0
    with quax.plugins.track_evaluations() as report, quax.track_materialisation():
        q(Dense(X), Dense(Y))
    assert report.total == 2  # `sin` and `multiply`, equation by equation


@pytest.mark.caching_behaviour
def test_side_effects_and_debug_calls(capfd: pytest.CaptureFixture[str]) -> None:
    calls = []

    @jax.jit
    def library(a: Any) -> Any:
        jax.debug.print("library {}", a[0])
        return a * 2.0

    def fn(a: Any, b: Any) -> Any:
        calls.append(1)
        jax.debug.print("user {}", b.sum())
        return library(a) + b

    q = quax.quaxify(fn)
    expected = fn(X, Y)
    for _ in range(3):
        np.testing.assert_array_equal(q(Dense(X), Dense(Y)).array, expected)
    jax.effects_barrier()
    assert len(calls) == 4
    out = capfd.readouterr().out
    assert out.count("library 0.5") == 4
    assert out.count(f"user {Y.sum()}") == 4


def test_materialisation_report_unchanged() -> None:
    q = quax.quaxify(lambda a: jnp.sin(a) * 2.0)
    value = Opaque(X, allow=True)
    for _ in range(2):  # compiled, cached
        np.testing.assert_array_equal(q(value), jnp.sin(X) * 2.0)
    for _ in range(2):
        with quax.track_materialisation() as report:
            np.testing.assert_array_equal(q(value), jnp.sin(X) * 2.0)
        assert report.counts == {("sin", "Opaque"): 1}


def test_refusals_raise_each_call() -> None:
    for fn in (quax.quaxify(jnp.sin), quax.quaxify(lambda a: jnp.sin(a) + 1.0)):
        for _ in range(2):
            with pytest.raises(RuntimeError, match="Refusing to materialise `Opaque`"):
                fn(Opaque(X))


def test_varying_plain_operands() -> None:
    # Plain operands are constants of the compiled programs; past a few of them,
    # quax runs equation by equation again, with the same results.
    q = quax.quaxify(lambda a, s: a * s)
    for s in range(12):
        np.testing.assert_array_equal(q(Dense(X), float(s)).array, X * float(s))
    big = jnp.arange(100.0)
    np.testing.assert_array_equal(q(Dense(big), big).array, big * big)


class Named(Dense):
    """A value with a leaf that is not an array: it runs equation by equation."""

    name: str = "out"


@compiles_eager_programs
def test_program_tables_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # At most `MAX_PROGRAMS` entries are kept (programs, and keys called but not
    # compiled yet), the oldest dropped first: a key dropped starts afresh, its
    # next call running equation by equation as a first call.
    monkeypatch.setattr(quax_eager._programs, "bound", 2)
    q = quax.quaxify(jax.jit(lambda a, s: a * s, inline=True))
    traced = quax_eager.programs_traced
    for s, programs in ((1.0, 0), (2.0, 0), (3.0, 0), (1.0, 0), (3.0, 1), (1.0, 2)):
        np.testing.assert_array_equal(q(Dense(X), s).array, X * s)
        assert quax_eager.programs_traced == traced + programs
        assert len(quax_eager._programs) <= 2
    assert len(_programs_of(q.fn)) == 2


def test_value_with_other_leaves() -> None:
    out = quax.quaxify(lambda a, b: a * b)(Named(X, "x"), Named(Y, "y"))
    assert type(out) is Named and out.name == "out"
    np.testing.assert_array_equal(out.array, X * Y)


def test_programs_follow_new_rules() -> None:
    # A program compiled before a rule is registered must not answer after it.
    class Late(quax.ArrayValue):
        array: Array

        def aval(self) -> Any:
            return jax.typeof(self.array)

        def materialise(self) -> Array:
            return self.array

    q = quax.quaxify(jnp.negative)
    assert type(q(Late(X))) is not Late  # materialised: no rule yet

    @quax.register(jax.lax.neg_p)
    def _(x: Late, **params: Any) -> Late:
        return Late(jax.lax.neg(x.array, **params))

    out = q(Late(X))
    assert type(out) is Late
    np.testing.assert_array_equal(out.array, -X)


def test_default_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Read at import: on unless `QUAX_EAGER_COMPILE=0`.
    for setting, on in (("0", False), ("1", True), ("", True), (None, True)):
        if setting is None:
            monkeypatch.delenv("QUAX_EAGER_COMPILE", raising=False)
        else:
            monkeypatch.setenv("QUAX_EAGER_COMPILE", setting)
        assert quax_eager.environment_setting() is on


def test_setting_returns_the_previous_one() -> None:
    assert quax.set_eager_compilation(False) is True  # the fixture's
    assert quax.set_eager_compilation(False) is False
    assert quax.set_eager_compilation(True) is False


def test_turned_off() -> None:
    q = quax.quaxify(lambda a, b: jnp.sin(a) * b)
    q(Dense(X), Dense(Y))
    quax.set_eager_compilation(False)
    with quax.plugins.track_evaluations() as report:
        out = q(Dense(X), Dense(Y))
    assert report.total == 2  # `sin` and `multiply`, equation by equation
    np.testing.assert_array_equal(out.array, jnp.sin(X) * Y)


class Counted(Dense):
    """A value whose `mul` rule reads its leaf concretely (as a rule that sizes its
    result from the data does)."""


@quax.register(jax.lax.mul_p)
def _(x: Counted, y: Counted, **params: Any) -> Counted:
    positive = int(jnp.sum(x.array > 0))  # needs a concrete leaf
    return Counted(jax.lax.mul(x.array, y.array, **params) + positive)


def test_rules_needing_concrete_leaves_run_by_equation() -> None:
    q = quax.quaxify(jnp.multiply)
    for _ in range(2):  # the second call remembers: no compile attempt
        out = q(Counted(X), Counted(Y))
        assert type(out) is Counted
        np.testing.assert_array_equal(out.array, X * Y + 3)


# Rules that choose on concrete leaves must answer alike with compilation on and off.


class Signed(Dense):
    """A value whose `neg` rule keeps a `positive` tag it reads from its leaf
    through `quax.known_constant` (as the structured family's tags do)."""

    positive: bool = eqx.field(static=True, default=False)


neg_calls = []


@quax.register(jax.lax.neg_p)
def _(x: Signed, **params: Any) -> Signed:
    neg_calls.append(1)
    known = quax.known_constant(x.array)
    negative = known is not None and bool(np.all(known < 0))
    return Signed(jax.lax.neg(x.array, **params), positive=negative)


def test_known_constant_on_a_leaf_runs_by_equation() -> None:
    q = quax.quaxify(jnp.negative)
    # The first call runs by equation; the second traces its program, which stops
    # at `known_constant`, and runs by equation; so do the second and third for the
    # inlined `jit` inside `jnp.negative`; then everything runs by equation only.
    for calls in (1, 2, 2, 1):
        neg_calls.clear()
        out = q(Signed(-jnp.abs(X)))
        assert out.positive  # as equation by equation: the leaf is known
        np.testing.assert_array_equal(out.array, jnp.abs(X))
        assert len(neg_calls) == calls
    quax.set_eager_compilation(False)
    assert q(Signed(-jnp.abs(X))).positive


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_known_constant_of_a_large_leaf_keeps_the_program() -> None:
    # Over `max_size`, equation by equation does not look either: compiled.
    q = quax.quaxify(jnp.negative)
    big = -jnp.arange(1.0, 2000.0)
    q(Signed(big))
    q(Signed(big))  # compiles
    neg_calls.clear()
    with quax.plugins.track_evaluations() as report:
        out = q(Signed(big))
    assert report.total == 0 and not neg_calls  # the compiled program answered
    assert not out.positive
    np.testing.assert_array_equal(out.array, -big)
    # Another leaf shape is another key: its own first call, its own check.
    small = -jnp.arange(1.0, 4.0)
    for _ in range(3):
        out = q(Signed(small))
        assert out.positive  # known, as equation by equation
        np.testing.assert_array_equal(out.array, -small)


class Sized(quax.ArrayValue):
    """Nonzeros first, then zeros: its leaf holds as many numbers as its `abs` rule
    finds nonzero when the leaf is concrete (reading it with NumPy, as quax-sparse's
    product counts its entries), else all of them."""

    array: Array
    length: int = eqx.field(static=True)

    def aval(self) -> Any:
        return jax.core.ShapedArray((self.length,), self.array.dtype)

    def materialise(self) -> Array:
        return (
            jnp.zeros(self.length, self.array.dtype)
            .at[: len(self.array)]
            .set(self.array)
        )


@quax.register(jax.lax.abs_p)
def _(x: Sized, **params: Any) -> Sized:
    try:
        kept = int(np.sum(np.asarray(x.array) != 0))
    except Exception:  # a tracer: the worst case
        kept = len(x.array)
    return Sized(jnp.abs(x.array[:kept]), x.length)


def test_other_structures_than_by_equation_run_by_equation() -> None:
    # Its program is traced on the second call and dropped: it kept more numbers.
    q = quax.quaxify(jnp.abs)
    for _ in range(3):
        out = q(Sized(jnp.array([1.0, -2.0, 0.0, 0.0]), 4))
        np.testing.assert_array_equal(out.array, [1.0, 2.0])
    assert _programs_of(jnp.abs) == [quax_eager._BY_EQUATION]


class Fussy(Dense):
    """A value whose rule fails on traced leaves for another reason than JAX's
    concretization errors (as unxt's `pow` did)."""


@quax.register(jax.lax.sign_p)
def _(x: Fussy, **params: Any) -> Fussy:
    if isinstance(x.array, jax.core.Tracer):
        raise ValueError("Fussy needs its numbers")
    return Fussy(jax.lax.sign(x.array, **params))


def test_programs_failing_to_trace_run_by_equation() -> None:
    q = quax.quaxify(jnp.sign)
    for _ in range(2):
        np.testing.assert_array_equal(q(Fussy(X)).array, jnp.sign(X))


class Shown(Dense):
    """A value with a display label that compares equal to every other (as
    quax-units' display units do), so that `jit` compiles once for all labels."""

    label: "Label" = eqx.field(static=True)


class Label(str):
    def __hash__(self) -> int:
        return hash(Label)

    def __eq__(self, other: object) -> bool:  # every label is equal
        return isinstance(other, Label)


@quax.register(jax.lax.exp_p)
def _(x: Shown, **params: Any) -> Shown:
    return Shown(jax.lax.exp(x.array, **params), Label(f"exp {x.label}"))


def test_each_display_text_has_its_program() -> None:
    q = quax.quaxify(jnp.exp)
    for _ in range(3):
        for text in ("m", "km"):
            out = q(Shown(X, Label(text)))
            assert str.__eq__(out.label, f"exp {text}")
            np.testing.assert_array_equal(out.array, jnp.exp(X))


class Paired(Dense):
    """A value with a tuple of arrays in a field: it is flattened each time."""

    pair: tuple[Array, Array] = (X, Y)


def test_value_structures() -> None:
    # One structure per text and treedef: found again from the same static objects
    # without flattening, or from other ones alike in text and equal.
    label = Label("m")
    structure, leaves, avals = value_structure(Shown(X, label))
    assert structure is not None and "'m'" in structure.text
    assert list(leaves) == [X] and avals == [jax.typeof(X)]
    for other in (Shown(Y, label), Shown(X, Label("m"))):
        again, leaves, _ = value_structure(other)
        assert again is structure and list(leaves) == [other.array]
    assert value_structure(Shown(X, Label("km")))[0] is not structure
    tag = Tag()
    tagged = value_structure(Tagged(X, tag))[0]
    assert value_structure(Tagged(Y, tag))[0] is tagged
    assert value_structure(Tagged(X, Tag()))[0] is not tagged
    paired, leaves, avals = value_structure(Paired(X))
    assert [id(x) for x in leaves] == [id(X), id(X), id(Y)]
    assert avals == [jax.typeof(X)] * 3
    assert value_structure(Paired(Y, (Y, X)))[0] is paired
    # The shapes of the leaves are no part of the structure: they key apart.
    _, _, avals = value_structure(Paired(Y, (Y, X[:2])))
    assert avals[2] == jax.typeof(X[:2])
    # No structure (so no program): a leaf that is not an array.
    assert value_structure(Named(X, "x"))[0] is None


class Counting(Dense):
    """A value whose `sin` rule counts its runs."""


sin_calls = []


@quax.register(jax.lax.sin_p)
def _(x: Counting, **params: Any) -> Counting:
    sin_calls.append(1)
    return Counting(jax.lax.sin(x.array, **params))


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_one_off_calls_compile_nothing() -> None:
    # The first call runs equation by equation only; the second traces (its rules
    # run once, on tracers) and compiles; later calls replay.
    q = quax.quaxify(jax.jit(lambda a, b: jnp.sin(a) * b, inline=True))
    traced = quax_eager.programs_traced
    for calls, programs in ((1, 0), (1, 1), (0, 1), (0, 1)):
        sin_calls.clear()
        out = q(Counting(X), Counting(Y))
        assert type(out) is Counting
        np.testing.assert_array_equal(out.array, jnp.sin(X) * Y)
        assert len(sin_calls) == calls
        assert quax_eager.programs_traced == traced + programs


def test_rules_generation_counts_registrations() -> None:
    before = quax.plugins.rules_generation()

    class Fresh(Dense):
        pass

    @quax.register(jax.lax.cos_p)
    def _(x: Fresh, **params: Any) -> Fresh:
        return Fresh(jax.lax.cos(x.array, **params))

    assert quax.plugins.rules_generation() == before + 1


class Tag:
    """Equal only to itself (as quax-named's anonymous axes), with one text for all."""

    def __repr__(self) -> str:
        return "Tag()"


class Tagged(Dense):
    tag: Tag = eqx.field(static=True, default_factory=Tag)


@quax.register(jax.lax.mul_p)
def _(x: Tagged, y: Tagged, **params: Any) -> Tagged:
    if x.tag is not y.tag:
        raise TypeError("mismatched tags")
    return Tagged(jax.lax.mul(x.array, y.array, **params), x.tag)


@quax.register(jax.lax.exp_p)
def _(x: Tagged, **params: Any) -> Tagged:
    return Tagged(jax.lax.exp(x.array, **params))  # a fresh tag each time


def test_static_fields_equal_only_to_themselves() -> None:
    # Alike by their text, different by `==`: each has its own program.
    q = quax.quaxify(jnp.multiply)
    tag = Tag()
    for _ in range(3):
        out = q(Tagged(X, tag), Tagged(Y, tag))
        assert out.tag is tag
        np.testing.assert_array_equal(out.array, X * Y)
    with pytest.raises(TypeError, match="mismatched tags"):
        q(Tagged(X, tag), Tagged(Y, Tag()))


def test_outputs_unequal_to_by_equation_run_by_equation() -> None:
    # A fresh tag per call: a compiled program would give every call its traced one.
    q = quax.quaxify(jnp.exp)
    value = Tagged(X)
    tags = [q(value).tag for _ in range(3)]
    assert len({id(t) for t in tags}) == 3


class Listed(Dense):
    """A value with a static field that cannot be hashed (equal lists, by `==`)."""

    names: list[str] = eqx.field(static=True, default_factory=lambda: ["x"])


def test_unhashable_static_fields() -> None:
    q = quax.quaxify(jnp.sin)
    for _ in range(3):
        out = q(Listed(X))
        assert type(out) is Listed and out.names == ["x"]
        np.testing.assert_array_equal(out.array, jnp.sin(X))


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_calls_made_a_few_times_compile_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As users have it: the calls after a key's first run equation by equation
    # until together they have taken as long as a compile (here, as at first in a
    # process, `COMPILE_AFTER_AT_FIRST`: 50 ms, where each of these takes about a
    # tenth of a millisecond), so a call made a few times compiles nothing.
    monkeypatch.setattr(quax_eager, "COMPILE_AFTER", None)
    monkeypatch.setattr(
        quax_eager, "_compile_seconds", quax_eager.COMPILE_AFTER_AT_FIRST
    )
    q = quax.quaxify(jnp.subtract)
    x = jnp.asarray(np.random.default_rng(2).uniform(-2, 2, 33), jnp.float32)
    x = x.at[:4].set(0.1)
    y = jnp.ones(33, jnp.float32)
    traced = quax_eager.programs_traced
    first = q(Fused(x), Fused(y)).array
    for _ in range(3):
        np.testing.assert_array_equal(q(Fused(x), Fused(y)).array, first)
    assert quax_eager.programs_traced == traced
    # Once the calls after the first have taken as long as a compile, the next
    # call compiles, with the first call's bits (the equations' rounding), and
    # later calls replay the program.
    monkeypatch.setattr(quax_eager, "_compile_seconds", 1e-9)
    for _ in range(3):
        np.testing.assert_array_equal(q(Fused(x), Fused(y)).array, first)
    assert quax_eager.programs_traced == traced + 1
    np.testing.assert_array_equal(first[:4], 0.0)


def test_compile_time_is_the_mean_of_the_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The time the calls after a key's first spend before it compiles is the mean
    # of the compiles measured so far in the process.
    monkeypatch.setattr(quax_eager, "_compiles", 0)
    monkeypatch.setattr(quax_eager, "_compile_seconds", 0.05)
    quax_eager._compiled(0.08)
    assert quax_eager._compile_seconds == pytest.approx(0.08)
    quax_eager._compiled(0.02)
    assert quax_eager._compile_seconds == pytest.approx(0.05)
