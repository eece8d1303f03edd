"""Value construction: the fast path for plain classes behaves like equinox's."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
import quax


class Plain(quax.ArrayValue):
    array: jax.Array
    label: str = eqx.field(static=True, default="plain")

    def aval(self):
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self):
        return self.array


class Checked(Plain):
    def __check_init__(self):
        if self.array.ndim != 1:
            raise ValueError("Checked wants a vector")


class Converted(quax.ArrayValue):
    array: jax.Array = eqx.field(converter=jnp.asarray)

    def aval(self):
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self):
        return self.array


def test_plain_value_is_a_frozen_pytree() -> None:
    v = Plain(jnp.ones(3))
    w = Plain(array=jnp.ones(3), label="other")
    assert v.label == "plain" and w.label == "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.array = jnp.zeros(3)  # type: ignore[misc]
    leaves, treedef = jax.tree_util.tree_flatten(w)
    assert len(leaves) == 1
    assert jax.tree_util.tree_unflatten(treedef, leaves).label == "other"
    with pytest.raises(TypeError):
        Plain()  # type: ignore[call-arg]


def test_checks_and_converters_still_run() -> None:
    with pytest.raises(ValueError, match="wants a vector"):
        Checked(jnp.ones((2, 2)))
    assert Checked(jnp.ones(2)).shape == (2,)
    assert isinstance(Converted([1.0, 2.0]).array, jax.Array)


def test_abstract_value_cannot_be_built() -> None:
    with pytest.raises(TypeError):
        quax.ArrayValue()  # type: ignore[abstract]
