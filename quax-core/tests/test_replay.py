"""An inlined `jit` (every `jax.numpy` function) traced again on values of the same
key replays the equations its rules staged the first time (`quax._replay`): the
program is the one running the rules gives, and the recording is not reused for
other value types, other static fields, other settings, aliased inputs, a rule
that read a constant through `quax.known_constant`, or after `quax.register`."""

from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._replay as quax_replay
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
        return type(first)(primitive.bind(*arrays, **params), first.tag)


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


def test_replay_stages_what_the_rules_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    first = traced(program, Counted(x), Counted(y))
    assert calls == ["mul", "sin", "cos", "add"]
    with quax.plugins.track_evaluations() as evaluations:
        again = traced(program, Counted(x), Counted(y))
    assert calls == ["mul", "sin", "cos", "add"]  # replayed: no rule ran
    assert evaluations.total == 4
    # The same program, name stacks, tracebacks and contexts as running the rules.
    monkeypatch.setattr(quax_replay, "MAX_RECORDINGS", 0)
    quax_replay._recordings.clear()
    with quax.plugins.track_evaluations() as evaluations:
        ran = traced(program, Counted(x), Counted(y))
    assert calls == ["mul", "sin", "cos", "add"] * 2
    assert evaluations.total == 4
    assert str(again) == str(ran) == str(first)
    assert _summary(again) == _summary(ran)
    assert str(ran.eqns[0].source_info.name_stack) == "outer"


def test_replay_gives_the_values() -> None:
    for _ in range(2):
        out = jax.jit(lambda a, b: quax.quaxify(program)(a, b))(Counted(x), Counted(y))
        assert type(out) is Counted and out.tag == "a"
        expected = np.sin(np.asarray(x) * np.asarray(y)) + np.cos(np.asarray(x))
        np.testing.assert_allclose(out.array, expected, rtol=1e-6)
    assert len(calls) == 4


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
