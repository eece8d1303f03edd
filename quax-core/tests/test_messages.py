"""How errors name a primitive's inputs: a value by its type, a plain input as an
array with its aval (`array float32[3]`), whatever JAX's own type for it is (a
jaxpr's literal is a `TypedNdArray`, a traced one a `DynamicJaxprTracer`, an eager
one an `ArrayImpl`)."""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax


class Strict(quax.GuardedValue):
    array: jax.Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def dense(self) -> jax.Array:
        return self.array


class Left(quax.ArrayValue):
    array: jax.Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> jax.Array:
        return self.array

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        raise NotImplementedError


class Right(Left):
    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        raise NotImplementedError


class Wrong(Left):
    """Its `mul` rule returns the wrong shape (the debug checks name it)."""


@quax.register(lax.mul_p)
def _(x: Wrong, y: jax.Array | np.ndarray | float, **params: Any) -> Wrong:
    return Wrong(jnp.zeros((7,)))


_PLAIN_NAMES = ("TypedNdArray", "ArrayImpl", "DynamicJaxprTracer", "ndarray")


def _message(fn: Any, *args: Any, error: type[Exception] = Exception) -> list[str]:
    """The error of `quaxify(fn)(*args)`, eagerly and under `jit`."""
    messages = []
    for call in (quax.quaxify(fn), jax.jit(quax.quaxify(fn))):
        with pytest.raises(error) as info:
            call(*args)
        message = str(info.value)
        assert not any(name in message for name in _PLAIN_NAMES), message
        messages.append(message)
    return messages


@pytest.mark.parametrize(
    ("fn", "plain"),
    [
        pytest.param(lambda x: x * 2.0, "float32[]", id="literal"),
        pytest.param(lambda x: jnp.add(x, 2.0), "float32[]", id="jnp-literal"),
        pytest.param(
            lambda x: jnp.arctan2(x, jnp.array([1.0, 2.0, 3.0])),
            "float32[3]",
            id="constant",
        ),
        pytest.param(
            lambda x: lax.add(x, np.ones(3, np.float32)), "float32[3]", id="numpy"
        ),
    ],
)
def test_refusal_names_plain_inputs_as_arrays(fn: Any, plain: str) -> None:
    for message in _message(fn, Strict(jnp.ones(3)), error=quax.MaterialisationError):
        assert f"on input types (Strict, array {plain})" in message, message


def test_ambiguous_defaults_name_plain_inputs_as_arrays() -> None:
    left, right = Left(jnp.ones(3)), Right(jnp.ones(3))
    messages = _message(lambda a, b: lax.clamp(0.0, a, b), left, right, error=TypeError)
    for message in messages:
        assert "on input types (array float32[], Left, Right)" in message, message


def test_debug_check_names_plain_inputs_as_arrays() -> None:
    # The suites run with the debug checks on (see the root conftest.py).
    for message in _message(lambda x: x * 2.0, Wrong(jnp.ones(3)), error=TypeError):
        assert "on input types (Wrong, array float32[])" in message, message


def test_resolve_names_types() -> None:
    with pytest.raises(TypeError, match=r"input types \(Left, Left, Right\)"):
        quax.resolve(lax.clamp_p, [Left, Left, Right])
