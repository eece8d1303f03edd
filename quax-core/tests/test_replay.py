"""An inlined `jit` (every `jax.numpy` function), or a primitive, traced again on values
of the same key replays the equations its rules staged the first time
(`quax._caching._replay`): the program is the one running the rules gives, and the
recording is not reused for other value types, other static fields, other plain inputs'
avals, other params, other settings (quax's and JAX's), aliased inputs, a rule that read
a constant through `quax.known_constant`, or after `quax.register`. Floats in keys count
by their bits, and static fields that a rule makes afresh are never shared between
binds."""

import contextvars
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._caching._replay as quax_replay
from jax import lax
from jaxtyping import ArrayLike

from .helpers import Dense


x = jnp.linspace(0.5, 1.5, 4)
y = jnp.linspace(-1.0, 1.0, 4)

# The primitives the `default` of `Counted` ran, in order.
calls: list[str] = []


class Counted(Dense):
    """A `Dense` with a static tag that every primitive keeps, and a declared aval;
    its `default` notes each primitive it runs."""

    tag: str = eqx.field(static=True, default="a")
    aval_leaf: ClassVar[str] = "array"

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        calls.append(primitive.name)
        first = next(v for v in values if isinstance(v, Counted))
        arrays = [v.array if isinstance(v, Counted) else v for v in values]
        out = primitive.bind(*arrays, **params)
        if primitive.multiple_results:
            return [type(first)(o, first.tag) for o in out]
        return type(first)(out, first.tag)


class Other(Counted):
    pass


@pytest.fixture(autouse=True)
def fresh() -> Any:
    quax_replay._recordings.clear()
    calls.clear()
    yield
    quax_replay._recordings.clear()


def program(a: Any, b: Any) -> Any:
    with jax.named_scope("outer"):
        return jnp.sin(a * b) + jnp.cos(a)


def traced(fn: Any, *args: Any) -> Any:
    # A fresh function each time, so that JAX's own tracing cache never answers.
    return jax.make_jaxpr(lambda *a: quax.quaxify(fn)(*a))(*args)


def _summary(jaxpr: Any) -> list[Any]:
    return [
        (str(e), str(e.source_info.name_stack), e.source_info.traceback, e.ctx)
        for e in jaxpr.eqns
    ]


@pytest.mark.caching_behaviour
def test_replay_stages_what_the_rules_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    first = traced(program, Counted(x), Counted(y))
    assert calls == ["mul", "sin", "cos", "add"]
    with quax.plugins.track_evaluations() as evaluations:
        again = traced(program, Counted(x), Counted(y))
    assert calls == ["mul", "sin", "cos", "add"]  # replayed: no rule ran
    assert evaluations.total == 4
    # The same program, name stacks, tracebacks and contexts as running the rules.
    monkeypatch.setattr(quax_replay._recordings, "bound", 0)  # nothing kept
    quax_replay._recordings.clear()
    with quax.plugins.track_evaluations() as evaluations:
        ran = traced(program, Counted(x), Counted(y))
    assert calls == ["mul", "sin", "cos", "add"] * 2
    assert evaluations.total == 4
    assert str(again) == str(ran) == str(first)
    assert _summary(again) == _summary(ran)
    assert str(ran.eqns[0].source_info.name_stack) == "outer"


@pytest.mark.caching_behaviour
def test_replay_gives_the_values() -> None:
    for _ in range(2):
        out = jax.jit(lambda a, b: quax.quaxify(program)(a, b))(Counted(x), Counted(y))
        assert type(out) is Counted and out.tag == "a"
        expected = np.sin(np.asarray(x) * np.asarray(y)) + np.cos(np.asarray(x))
        np.testing.assert_allclose(out.array, expected, rtol=1e-6)
    assert len(calls) == 4


@pytest.mark.caching_behaviour
def test_replay_extends_the_callers_name_stack() -> None:
    def scoped(name: str) -> Any:
        def fn(a: Any) -> Any:
            with jax.named_scope(name):
                return jnp.sin(a)

        return fn

    traced(scoped("first"), Counted(x))
    (eqn,) = traced(scoped("second"), Counted(x)).eqns
    assert calls == ["sin"]
    assert str(eqn.source_info.name_stack) == "second"


@pytest.mark.caching_behaviour
def test_other_types_and_static_fields_run_their_rules() -> None:
    fn = lambda a: jnp.sin(a)
    for value in [Counted(x), Counted(x, "b"), Other(x), Other(x, "b"), Counted(x)]:
        out = jax.eval_shape(lambda a: quax.quaxify(fn)(a), value)
        assert type(out) is type(value) and out.tag == value.tag
    assert calls == ["sin"] * 4


def test_aliased_inputs_are_their_own_key() -> None:
    square = traced(lambda a: jnp.multiply(a, a), Counted(x))
    product = traced(lambda a, b: jnp.multiply(a, b), Counted(x), Counted(y))
    a, b = square.eqns[0].invars
    assert a is b is square.jaxpr.invars[0]
    a, b = product.eqns[0].invars
    assert [a, b] == product.jaxpr.invars
    assert calls == ["mul", "mul"]


def test_ieee_strict_is_part_of_the_key() -> None:
    z = quax.zero.Zero((4,), jnp.float32)
    shape = lambda: jax.eval_shape(lambda b: quax.quaxify(jnp.multiply)(z, b), y)
    # Recorded outside the block (the zero annihilates), replayed there too.
    assert isinstance(shape(), quax.zero.Zero)
    assert isinstance(shape(), quax.zero.Zero)
    with quax.zero.ieee_strict():
        # `b` could be NaN: the product is computed.
        assert isinstance(shape(), jax.ShapeDtypeStruct)
    assert isinstance(shape(), quax.zero.Zero)


class Reads(Counted):
    """Its product with a plain array reads that array's constant value."""


@quax.register(lax.mul_p)
def _(a: Reads, b: ArrayLike, **params: Any) -> Reads:
    del params
    calls.append("mul")
    known = quax.known_constant(b)
    zeros = known is not None and not known.any()
    return Reads(lax.mul(a.array, b), "zeros" if zeros else "product")


def test_a_rule_reading_a_known_constant_runs_every_time() -> None:
    def times(zeros: bool) -> Any:
        # `zeros_like` stages a broadcast of a literal: a known constant.
        fn = lambda a, b: jnp.multiply(a, jnp.zeros_like(b) if zeros else b)
        return jax.eval_shape(lambda a, b: quax.quaxify(fn)(a, b), Reads(x), y)

    assert times(zeros=True).tag == "zeros"
    assert times(zeros=False).tag == "product"
    assert times(zeros=True).tag == "zeros"


class Densified(quax.ArrayValue):
    """No rules: every primitive materialises it."""

    array: jax.Array
    aval_leaf: ClassVar[str] = "array"

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Any:
        return self.array


def test_materialisation_reports_are_unchanged() -> None:
    fn = lambda a: jnp.sin(a)
    for _ in range(2):
        with quax.track_materialisation() as report:
            traced(fn, Densified(x))
        assert dict(report.counts) == {("sin", "Densified"): 1}
        # Outside a report too: a materialising body is never replayed.
        traced(fn, Densified(x))
        traced(fn, Counted(x))
        with quax.track_materialisation() as report:
            traced(fn, Counted(x))
        assert not report


def test_register_drops_recordings() -> None:
    class Late(Counted):
        pass

    fn = lambda a: jnp.sin(a)
    assert traced(fn, Late(x)).eqns[0].primitive is lax.sin_p

    @quax.register(lax.sin_p)
    def _(a: Late, **params: Any) -> Late:
        del params
        return Late(lax.cos(a.array))

    assert traced(fn, Late(x)).eqns[0].primitive is lax.cos_p


# Primitives bound directly (`lax`), not through an inlined `jit` ----------------------


def lax_program(a: Any) -> Any:
    return lax.sin(lax.mul(a, a))


@pytest.mark.caching_behaviour
def test_a_primitive_replays_what_its_rule_stages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = traced(lax_program, Counted(x))
    assert calls == ["mul", "sin"]
    again = traced(lax_program, Counted(x))
    assert calls == ["mul", "sin"]  # replayed: no rule ran
    monkeypatch.setattr(quax_replay._recordings, "bound", 0)  # nothing kept
    quax_replay._recordings.clear()
    ran = traced(lax_program, Counted(x))
    assert calls == ["mul", "sin"] * 2
    assert str(again) == str(ran) == str(first)
    assert [e.ctx for e in again.eqns] == [e.ctx for e in ran.eqns]


@pytest.mark.caching_behaviour
def test_a_replayed_primitive_carries_its_own_source_info() -> None:
    def first(a: Any) -> Any:
        return lax.sin(a)

    def second(a: Any) -> Any:
        with jax.named_scope("here"):
            return lax.sin(a)

    traced(first, Counted(x))
    (eqn,) = traced(second, Counted(x)).eqns
    assert calls == ["sin"]
    assert str(eqn.source_info.name_stack) == "here"
    names = [f.function_name for f in eqn.source_info.traceback.frames]
    assert any(n.endswith("second") for n in names)
    assert not any(n.endswith("first") for n in names)


@pytest.mark.caching_behaviour
def test_a_replayed_primitive_gives_the_values() -> None:
    fn = jax.jit(lambda a: quax.quaxify(lax_program)(a))
    for _ in range(2):
        out = fn(Counted(x))
        assert type(out) is Counted and out.tag == "a"
        np.testing.assert_allclose(out.array, np.sin(np.asarray(x) ** 2), rtol=1e-6)
        fn = jax.jit(lambda a: quax.quaxify(lax_program)(a))  # traced again
    assert calls == ["mul", "sin"]


@pytest.mark.caching_behaviour
def test_plain_inputs_avals_and_params_are_part_of_the_key() -> None:
    m = Counted(jnp.ones((3, 4)))
    for k in [2, 5, 2]:
        out = jax.eval_shape(
            lambda a, b: quax.quaxify(lax.dot)(a, b), m, jnp.ones((4, k))
        )
        assert out.shape == (3, k)
    for axes, shape in [((0,), (4,)), ((1,), (3,)), ((0,), (4,))]:
        out = jax.eval_shape(
            lambda a, axes=axes: quax.quaxify(lax.reduce_sum)(a, axes), m
        )
        assert out.shape == shape
    assert calls == ["dot_general", "dot_general", "reduce_sum", "reduce_sum"]


class Squared(Counted):
    """Its negation is its matrix square, as `jnp.dot` stages it (so the default
    matmul precision, one of JAX's settings, decides the staged `dot_general`)."""


@quax.register(lax.neg_p)
def _(a: Squared, **params: Any) -> Squared:
    del params
    calls.append("neg")
    return Squared(jnp.dot(a.array, a.array))


@pytest.mark.caching_behaviour
def test_jax_settings_are_part_of_the_key() -> None:
    def precision() -> Any:
        jaxpr = traced(lax.neg, Squared(jnp.ones((3, 3))))
        (eqn,) = [e for e in jaxpr.eqns if e.primitive is lax.dot_general_p]
        return eqn.params["precision"]

    # Both settings named (an accelerator's suite runs at "highest" by default: the
    # root conftest.py).
    with jax.default_matmul_precision("bfloat16"):
        fast = precision()
    with jax.default_matmul_precision("highest"):
        highest = precision()
    assert highest != fast
    with jax.default_matmul_precision("bfloat16"):
        assert precision() == fast
    assert calls == ["neg", "neg"]


def test_a_primitive_with_a_jaxpr_is_never_recorded() -> None:
    def reduced(a: Any, init: Any) -> Any:
        return lax.reduce(a, init, lambda u, v: u + 2 * v, (0,))

    for _ in range(2):
        jaxpr = traced(reduced, Counted(x), jnp.zeros(()))
        assert jaxpr.eqns[0].primitive is lax.reduce_p
    assert calls == ["reduce", "reduce"]
    assert lax.reduce_p in quax_replay._unreplayable
    assert not _recorded(lax.reduce_p)


def test_a_values_constant_leaf_runs_the_rule() -> None:
    const = Counted(x)  # given to `quaxify` only: its leaf is a constant
    times = lambda a, b: lax.mul(a, b)
    for _ in range(2):
        jax.make_jaxpr(lambda a: quax.quaxify(times)(a, const))(Counted(y))
    assert calls == ["mul"] * 2


def _constants(jaxpr: Any) -> list[tuple[Any, bytes]]:
    """The literals and constants of a program: dtypes and bits."""
    literals = [
        v.val for e in jaxpr.eqns for v in e.invars if isinstance(v, jex.core.Literal)
    ]
    return [(np.asarray(c).dtype, np.asarray(c).tobytes()) for c in literals] + [
        (np.asarray(c).dtype, np.asarray(c).tobytes()) for c in jaxpr.consts
    ]


@pytest.mark.caching_behaviour
def test_plain_constants_are_keyed_by_their_value() -> None:
    # A scalar or JAX array among a primitive's inputs (`x * 0.5`) is keyed by its
    # type, aval and bits: an equal one replays, any other (`-0.0`, a NaN of the other
    # sign, an int, another array) runs the rules, and each program stages the
    # constant it was given, as running the rules does.
    nan = float("nan")
    four, five = jnp.array([1.0, 2, 3, 4]), jnp.array([1.0, 2, 3, 5])
    given = [2.0, 2.0, 0.0, -0.0, -0.0, nan, -nan, -nan, 2, four, five, four + 0]
    # A NumPy scalar reaches the rules as a 0-d NumPy array, keyed by its bits too
    # (the recording keeps a copy of it, see below): the second replays.
    given += [np.float32(2.0), np.float32(2.0)]
    fns = [lambda a, c=c: a * c for c in given]
    got, ran = [], []
    for fn in fns:
        before = len(calls)
        got.append(traced(fn, Counted(y)))
        ran.append(len(calls) > before)
    # The int 2 reaches `jnp.multiply`'s body as another constant, which converts it
    # to the float32 2.0 that the body's `mul` had with 2.0: that `mul` replays.
    assert ran[:9] == [True, False, True, True, False, True, True, False, False]
    assert ran[9:] == [True, True, False, True, False]
    with quax.caching(False):
        for fn, jaxpr in zip(fns, got, strict=True):
            expected = traced(fn, Counted(y))
            assert str(jaxpr) == str(expected)
            assert _constants(jaxpr) == _constants(expected)
    for c, jaxpr in zip(given[2:8], got[2:8], strict=True):
        ((dtype, bits),) = _constants(jaxpr)
        assert np.signbit(np.frombuffer(bits, dtype)[0]) == np.signbit(c)


def test_a_numpy_array_is_never_replayed() -> None:
    # JAX stages a view of a NumPy array: a recording would hold its owner's buffer,
    # which may change before a later bind with an array of the first values.
    owned = np.array([1.0, 2, 3, 4], np.float32)
    traced(lambda a: a * owned, Counted(y))
    owned[:] = -1.0
    again = traced(lambda a: a * np.array([1.0, 2, 3, 4], np.float32), Counted(y))
    ((_, bits),) = _constants(again)
    np.testing.assert_array_equal(np.frombuffer(bits, np.float32), [1.0, 2, 3, 4])
    assert calls == ["mul", "mul"]


@pytest.mark.caching_behaviour
def test_a_0d_numpy_array_replays_the_values_of_its_key() -> None:
    # A 0-d NumPy array is keyed by its bits, copied when the key is made, and the
    # recording keeps a read-only copy of what the rules staged: a change its owner
    # makes afterwards reaches neither (JAX stages the array itself).
    owned = np.array(2.0, np.float32)
    traced(lambda a: a * owned, Counted(y))
    owned[()] = -1.0
    again = traced(lambda a: a * np.array(2.0, np.float32), Counted(y))  # replayed
    changed = traced(lambda a: a * owned, Counted(y))  # another key: the rules run
    assert calls == ["mul", "mul"]
    with quax.caching(False):
        for c, jaxpr in [(2.0, again), (-1.0, changed)]:
            expected = traced(lambda a, c=c: a * np.array(c, np.float32), Counted(y))
            assert str(jaxpr) == str(expected)
            assert _constants(jaxpr) == _constants(expected)
            ((dtype, bits),) = _constants(jaxpr)
            assert np.frombuffer(bits, dtype).tolist() == [c]


@pytest.mark.caching_behaviour
def test_a_rule_reading_a_constant_input_replays_for_that_value() -> None:
    # `Reads` asks `quax.known_constant` about a plain constant: a function of its key.
    def tag(c: Any) -> str:
        fn = lambda a: a * c
        return jax.eval_shape(lambda a: quax.quaxify(fn)(a), Reads(x)).tag

    assert [tag(c) for c in [0.0, 1.0, 0.0, -0.0, 1.0]] == [
        "zeros",
        "product",
        "zeros",
        "zeros",
        "product",
    ]
    assert calls == ["mul"] * 3


# A mode that the rule below reads, declared as a setting of quax's keys.
_mode: contextvars.ContextVar[str] = contextvars.ContextVar("mode", default="sin")
quax.plugins.add_setting(_mode.get)


class Moded(Counted):
    """Its `sin` is `sin` or `cos`, as the mode says."""


@quax.register(lax.sin_p)
def _(a: Moded, **params: Any) -> Moded:
    del params
    calls.append(_mode.get())
    op = lax.sin if _mode.get() == "sin" else lax.cos
    return Moded(op(a.array))


@pytest.mark.caching_behaviour
def test_a_declared_setting_is_part_of_the_key() -> None:
    def primitive() -> Any:
        return traced(lax.sin, Moded(x)).eqns[0].primitive

    assert primitive() is lax.sin_p
    token = _mode.set("cos")
    try:
        assert primitive() is lax.cos_p
        assert primitive() is lax.cos_p
    finally:
        _mode.reset(token)
    assert primitive() is lax.sin_p
    assert calls == ["sin", "cos"]


class Signed(Counted):
    """Its `sin` is scaled by a static float."""

    scale: float = eqx.field(static=True, default=1.0)


@quax.register(lax.sin_p)
def _(a: Signed, **params: Any) -> Signed:
    del params
    return Signed(lax.sin(a.array) * a.scale, scale=a.scale)


def test_static_floats_are_keyed_by_their_bits() -> None:
    # `0.0 == -0.0`, but the rule stages a different literal for each.
    fn = lambda a: lax.sin(a)
    for scale in [0.0, -0.0, 0.0]:
        out = jax.jit(lambda a: quax.quaxify(fn)(a))(Signed(x, scale=scale))
        assert out.scale == scale
        assert np.all(np.signbit(out.array) == np.signbit(scale))


# Static outputs and float keys: where a replay could stage other than the rule -------


class Token:
    """Equal only to itself (as quax-named's anonymous axes)."""


class Tokened(Dense):
    """A `Dense` whose `exp` gets a fresh token, and whose `mul` needs one token."""

    token: Token = eqx.field(static=True, default_factory=Token)


@quax.register(lax.exp_p)
def _(a: Tokened, **params: Any) -> Tokened:
    return Tokened(lax.exp(a.array, **params))  # a fresh token each run


@quax.register(lax.mul_p)
def _(a: Tokened, b: Tokened, **params: Any) -> Tokened:
    if a.token is not b.token:
        raise TypeError("different tokens")
    return Tokened(lax.mul(a.array, b.array, **params), a.token)


def _exp_twice(a: Any) -> Any:
    return lax.exp(a) * lax.exp(a)


def test_a_fresh_static_output_is_not_replayed() -> None:
    # Each run of `exp`'s rule gives its own token: two `exp`s are two tokens, in
    # a staged program as equation by equation (a replay gave the first's twice).
    with pytest.raises(TypeError, match="different tokens"):
        quax.quaxify(_exp_twice)(Tokened(x))
    with pytest.raises(TypeError, match="different tokens"):
        jax.jit(quax.quaxify(_exp_twice))(Tokened(x))
    with pytest.raises(TypeError, match="different tokens"):
        jax.make_jaxpr(quax.quaxify(lambda a: jnp.exp(a) * jnp.exp(a)))(Tokened(x))


@quax.register(lax.sin_p)
def _(a: Tokened, **params: Any) -> Tokened:
    return Tokened(lax.sin(a.array, **params), a.token)  # the input's token


class Label:
    """Equal to every other `Label` of the same text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return type(other) is Label and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Label({self.text!r})"


class Labelled(Dense):
    label: Label = eqx.field(static=True, default_factory=lambda: Label("a"))


def _recorded(primitive: Any) -> list[Any]:
    """The kinds of the entries of `primitive`'s recordings (whose keys' code is
    the primitive and its params)."""
    return [
        type(r).__name__
        for key, r in quax_replay._recordings._data.items()
        if type(key[0]) is tuple and key[0][0] is primitive
    ]


def test_static_outputs_equal_each_run_are_replayed() -> None:
    # The input's token, kept: the same object each run, replayed from the first.
    token = Token()
    for _ in range(3):
        fn = quax.quaxify(lambda a: lax.mul(lax.sin(a), lax.sin(a)))
        out = jax.jit(fn)(Tokened(x, token))
        assert out.token is token
        np.testing.assert_allclose(out.array, np.sin(np.asarray(x)) ** 2, rtol=1e-6)
    assert _recorded(lax.sin_p) == ["_Recording"]
    # A fresh label each run, equal to the others: replayed once a second run
    # gives an equal one.
    label = Label("a")
    for _ in range(3):
        out = jax.jit(quax.quaxify(lambda a: lax.cos(a)))(Labelled(x, label))
        assert out.label == Label("a")
        np.testing.assert_allclose(out.array, np.cos(np.asarray(x)), rtol=1e-6)
    assert _recorded(lax.cos_p) == ["_Recording"]


class Loose:
    """Equal to every other `Loose`, whatever its text (as quax-units' display units
    are, so that `jit` compiles once for all of them)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return type(other) is Loose

    def __hash__(self) -> int:
        return hash(Loose)

    def __repr__(self) -> str:
        return f"Loose({self.text!r})"


class Shown(Dense):
    label: Loose = eqx.field(static=True, default_factory=lambda: Loose("a"))


# How many times the `tan` rule of `Shown` ran: each run labels its output so.
shown_runs: list[int] = []


@quax.register(lax.tan_p)
def _(a: Shown, **params: Any) -> Shown:
    shown_runs.append(len(shown_runs) + 1)
    return Shown(lax.tan(a.array, **params), Loose(f"run {len(shown_runs)}"))


def test_static_outputs_equal_but_shown_otherwise_are_never_replayed() -> None:
    # Each run labels its output afresh, equal to the last by `==` but not in text:
    # the second run does not confirm the first's recording (a replay would give
    # every later bind the first run's label), so every bind runs the rule.
    shown_runs.clear()
    label = Loose("in")
    for run in range(1, 4):
        out = jax.jit(quax.quaxify(lambda a: lax.tan(a)))(Shown(x, label))
        assert out.label.text == f"run {run}"
        np.testing.assert_allclose(out.array, np.tan(np.asarray(x)), rtol=1e-6)
    assert shown_runs == [1, 2, 3]


class Filled(Dense):
    """Its `sin` is filled with a static float (a NaN keeps its sign bit)."""

    fill: float = eqx.field(static=True, default=0.0)


@quax.register(lax.sin_p)
def _(a: Filled, **params: Any) -> Filled:
    del params
    return Filled(jnp.full(a.array.shape, a.fill), fill=a.fill)


def test_static_nans_are_keyed_by_their_sign() -> None:
    # `float.hex` gives "nan" for both signs, but the rule stages the NaN it holds.
    nan = float("nan")
    for fill in [nan, -nan, nan]:
        out = jax.jit(quax.quaxify(lambda a: lax.sin(a)))(Filled(x, fill=fill))
        assert np.all(np.isnan(out.array))
        assert np.all(np.signbit(out.array) == np.signbit(fill))


def test_float_params_are_keyed_by_their_bits() -> None:
    # `gather`'s `fill_value` param: `0.0 == -0.0`, but the bind stages the one given.
    indices = jnp.array([0, 7])
    for fill in [0.0, -0.0, np.float32(0.0), np.float32(-0.0), 0.0]:
        fn = lambda a, i, fill=fill: a.at[i].get(mode="fill", fill_value=fill)
        out = jax.jit(quax.quaxify(fn))(Dense(x), indices)
        np.testing.assert_array_equal(out.array, [x[0], fill])
        assert np.signbit(out.array[1]) == np.signbit(fill)


class Paired(Dense):
    """Its tokens in a tuple; its `cos` keeps them, in a new tuple."""

    tokens: tuple[Token, ...] = eqx.field(static=True, default=())


@quax.register(lax.cos_p)
def _(a: Paired, **params: Any) -> Paired:
    return Paired(lax.cos(a.array, **params), tuple(list(a.tokens)))


def test_static_outputs_of_the_inputs_objects_are_replayed_at_once() -> None:
    # The same objects every run: kept by the first, with no second run to confirm.
    tokens = (Token(), Token())
    out = jax.jit(quax.quaxify(lambda a: lax.cos(a)))(Paired(x, tokens))
    assert out.tokens == tokens
    assert _recorded(lax.cos_p) == ["_Recording"]
