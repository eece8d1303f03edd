"""Declared avals (`Value.aval_leaf`): the same avals as the method, read without
calling user code, and a wrong declaration refused loudly."""

from collections.abc import Iterator
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._foundation._debug
from quax.zero import Zero

from .helpers import Dense


class Counted(Dense):
    """Declares its leaf, and keeps an `aval` method (the reference) that counts
    its calls."""

    calls: ClassVar[list[int]] = [0]
    aval_leaf: ClassVar[str] = "array"

    def aval(self):
        Counted.calls[0] += 1
        return jax.typeof(self.array)


class Declared(quax.ArrayValue):
    """Declares its leaf and writes no `aval` at all. Quax writes `aval` when it
    builds the class; pyright sees only the abstract method, hence the
    `pyright: ignore[reportAbstractUsage]` where this class and `Outer` are built."""

    array: Any
    aval_leaf: ClassVar[str] = "array"

    def materialise(self):
        return self.array


class Outer(quax.ArrayValue):
    """Its leaf is itself a value: the aval is that value's."""

    inner: Declared
    aval_leaf: ClassVar[str] = "inner"

    def materialise(self):
        return self.inner.materialise()


class Padded(quax.ArrayValue):
    """A wrong declaration: its aval is one longer than its leaf."""

    array: jax.Array
    aval_leaf: ClassVar[str] = "array"

    def aval(self):
        (n,) = self.array.shape
        return jax.core.ShapedArray((n + 1,), self.array.dtype)

    def materialise(self):
        return jnp.pad(self.array, (0, 1))


def _debug_checks_set_to(on: bool) -> Iterator[None]:
    previous = quax._foundation._debug.is_enabled()
    quax.set_debug_checks(on)
    yield
    quax.set_debug_checks(previous)


@pytest.fixture
def debug_checks() -> Iterator[None]:
    yield from _debug_checks_set_to(True)


@pytest.fixture
def no_debug_checks() -> Iterator[None]:
    yield from _debug_checks_set_to(False)


LEAVES = [
    jnp.arange(6.0).reshape(2, 3),
    jnp.arange(4, dtype=jnp.int32),
    jnp.asarray(2.0),  # weakly typed, as JAX keeps it
    np.ones((3,), np.float64),  # canonicalised to float32
    1.5,
    True,
]


@pytest.mark.parametrize("leaf", LEAVES, ids=lambda x: type(x).__name__)
def test_declared_aval_is_the_leaf_aval(leaf) -> None:
    expected = jax.typeof(leaf)
    for value in (Declared(leaf), Counted(leaf), Outer(Declared(leaf))):  # pyright: ignore[reportAbstractUsage]
        aval = value.aval()
        assert (aval.shape, aval.dtype, aval.weak_type) == (
            expected.shape,
            expected.dtype,
            expected.weak_type,
        )
    assert Declared(leaf).shape == np.shape(leaf)  # pyright: ignore[reportAbstractUsage]
    assert Declared(leaf).dtype == expected.dtype  # pyright: ignore[reportAbstractUsage]


def test_declared_aval_of_traced_leaves() -> None:
    # Under jit and vmap the leaf is a tracer: the declared aval is its type.
    def avals(x):
        v = Declared(x)  # pyright: ignore[reportAbstractUsage]
        assert v.aval() == jax.typeof(x)
        assert Outer(v).aval() == jax.typeof(x)  # pyright: ignore[reportAbstractUsage]
        return x

    jax.jit(avals)(jnp.ones((2, 3)))
    jax.vmap(avals)(jnp.ones((4, 3)))


def test_quaxify_reads_the_declared_aval_without_the_method(no_debug_checks) -> None:
    """Tracing asks every value for its aval; with a declaration (debug checks
    off), the class's own method is never called, and the results are plain
    JAX's."""
    x = jnp.linspace(-1.0, 1.0, 5)

    def f(a, b):
        return jnp.sin(a * b) + a

    Counted.calls[0] = 0
    out = quax.quaxify(f)(Counted(x), Counted(2 * x))
    assert Counted.calls[0] == 0
    assert isinstance(out, Counted)
    np.testing.assert_allclose(out.array, f(x, 2 * x), rtol=1e-6)
    jaxpr = jax.make_jaxpr(quax.quaxify(f))(Counted(x), Counted(x))
    assert Counted.calls[0] == 0
    assert jaxpr.out_avals == jax.make_jaxpr(f)(x, x).out_avals


def test_weak_type_follows_the_dense_array() -> None:
    """The declared aval keeps a weak type, so dtype promotion is plain JAX's."""
    half = jnp.ones(3, jnp.float16)
    two = jnp.asarray(2.0)
    out = quax.quaxify(jnp.multiply)(Declared(two), half)  # pyright: ignore[reportAbstractUsage]
    assert out.dtype == jnp.multiply(two, half).dtype == jnp.float16


def test_debug_checks_compare_the_declaration_with_the_method(debug_checks) -> None:
    Counted.calls[0] = 0
    x = jnp.ones(3)
    quax.quaxify(jnp.sin)(Counted(x))
    assert Counted.calls[0] > 0  # the reference method was consulted
    with pytest.raises(TypeError, match=r"Padded declares `aval_leaf = 'array'`"):
        Padded(x).aval()
    with pytest.raises(TypeError, match=r"float32\[3\].*float32\[4\]"):
        quax.quaxify(jnp.sin)(Padded(x))


class Strong(Counted):
    """A declaration that differs from its `aval` method only in the weak type."""

    def aval(self):
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)


def test_debug_checks_name_a_weak_type_difference(debug_checks) -> None:
    # Both print as float32[]; the message says which side is weakly typed.
    with pytest.raises(TypeError, match=r"float32\[\] \(weakly typed\); but"):
        quax.quaxify(jnp.sin)(Strong(jnp.asarray(2.0)))


def test_a_wrong_declaration_passes_without_debug_checks(no_debug_checks) -> None:
    # The declaration is what quax trusts: without checks the leaf's aval is used.
    assert Padded(jnp.ones(3)).aval().shape == (3,)


def test_declaration_must_name_a_leaf() -> None:
    with pytest.raises(TypeError, match=r"has no field `arr`"):

        class Misnamed(quax.ArrayValue):  # pyright: ignore[reportUnusedClass]
            array: jax.Array
            aval_leaf: ClassVar[str] = "arr"

    with pytest.raises(TypeError, match=r"`shape` is a static field"):

        class Static(quax.ArrayValue):  # pyright: ignore[reportUnusedClass]
            shape: tuple[int, ...] = eqx.field(static=True)  # pyright: ignore[reportIncompatibleVariableOverride]
            aval_leaf: ClassVar[str] = "shape"

    with pytest.raises(TypeError, match=r"has no field `calls`"):

        class ClassVarLeaf(quax.ArrayValue):  # pyright: ignore[reportUnusedClass]
            calls: ClassVar[int] = 0
            aval_leaf: ClassVar[str] = "calls"


def test_subclasses_inherit_the_declaration_and_the_reference(debug_checks) -> None:
    class Sub(Padded):
        pass

    class Fixed(Padded):
        def aval(self):
            return jax.typeof(self.array)

    x = jnp.ones(3)
    with pytest.raises(TypeError, match="Sub declares"):
        Sub(x).aval()
    assert Fixed(x).aval() == jax.typeof(x)


@pytest.mark.parametrize(
    "shape, dtype", [((), jnp.float32), ((2, 3), jnp.int32), ((0,), jnp.bool_)]
)
def test_zero_aval_from_its_static_shape_and_dtype(shape, dtype) -> None:
    z = Zero(shape, dtype)
    assert z.aval() == jax.core.ShapedArray(shape, dtype)
    assert z.aval() is Zero(shape, dtype).aval()
    out = quax.quaxify(lambda a: a.reshape(-1))(z)
    assert isinstance(out, Zero)
    assert out.aval() == jax.core.ShapedArray((int(np.prod(shape)),), dtype)
