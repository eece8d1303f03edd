"""Cases where replaying the equations a rule staged (`quax._replay`) could stage
something other than running the rule: each test traces a program whose rules, run
every time, give one answer, and checks that the staged program gives it too."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._replay as quax_replay
from jax import lax

from .helpers import Dense


x = jnp.linspace(0.5, 1.5, 4)


@pytest.fixture(autouse=True)
def fresh() -> Any:
    quax_replay._recordings.clear()
    quax_replay._by_primitive.clear()
    yield
    quax_replay._recordings.clear()
    quax_replay._by_primitive.clear()


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
    return [
        type(r).__name__ for r in quax_replay._by_primitive.get(primitive, {}).values()
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
