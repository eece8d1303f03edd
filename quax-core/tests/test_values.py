"""Value construction: the fast path for plain classes behaves like equinox's."""

import dataclasses
import types

import equinox as eqx
import jax
import jax.core
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


class Keywords(quax.ArrayValue):
    array: jax.Array
    scale: float = 1.0
    name: str = eqx.field(static=True, default="k", kw_only=True)

    def aval(self):
        return jax.typeof(self.array)

    def materialise(self):
        return self.scale * self.array


class PostInit(Plain):
    doubled: jax.Array = eqx.field(init=True, default=None)

    def __post_init__(self):
        self.doubled = 2 * self.array


class Factory(Plain):
    extra: tuple = eqx.field(static=True, default_factory=tuple)


def test_fast_construction_takes_the_dataclass_signature() -> None:
    v = Keywords(jnp.ones(2), 3.0, name="n")
    assert (v.scale, v.name) == (3.0, "n")
    assert Keywords(array=jnp.ones(2)).scale == 1.0
    with pytest.raises(TypeError, match=r"Keywords\.__init__\(\) missing 1 required"):
        Keywords()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"Keywords\.__init__\(\) takes from 2 to 3"):
        Keywords(jnp.ones(2), 1.0, "n")  # type: ignore[misc]
    assert PostInit(jnp.ones(2)).doubled.tolist() == [2.0, 2.0]
    assert Factory(jnp.ones(2)).extra == ()


class Mixin(eqx.Module):
    def __getattribute__(self, name):
        if name == "answer":
            return 42
        return super().__getattribute__(name)


class Mixed(Plain, Mixin):
    pass


def test_attribute_lookup_is_equinox_s() -> None:
    v = Plain(jnp.ones(3))
    # Methods are pytrees bound to the value, magic methods plain bound methods.
    assert jax.tree_util.tree_leaves(v.aval)[0] is v.array
    assert v.aval() == jax.typeof(v.array)
    assert isinstance(v.__repr__, types.MethodType)
    # A base after `Value` with its own lookup still sees every attribute.
    assert Mixed(jnp.ones(3)).answer == 42  # type: ignore[attr-defined]
