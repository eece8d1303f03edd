"""No cache keys a NumPy array (or any object its owner may change in place) by
identity: an array changed in place between two calls is another key, and code kept
for a key computes with the values of that key, whatever the caller did to its array
since. Each case against plain JAX (or NumPy) and `quax.caching(False)`, with the
caches on and in verify mode."""

from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._caching._keys as quax_keys
import quax._foundation._caches as quax_caches
from jax import lax
from jaxtyping import ArrayLike


class Probe(quax.ArrayValue):
    """An array to which a rule adds a plain operand, kept as it is where the
    operand is known to be zeros (as families keep a structure against a known
    constant); `tag` is a leaf of any shape that its aval ignores."""

    array: jax.Array
    tag: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> jax.Array:
        return self.array


@quax.register(lax.add_p)
def _(x: Probe, y: ArrayLike) -> Probe:
    known = quax.known_constant(y, 1 << 20)
    if known is not None and not np.any(known):
        return x  # adding known zeros
    return Probe(x.array + y, x.tag)


class Weighted(quax.ArrayValue):
    """An array with weights held as a static NumPy array, which a rule reads."""

    array: jax.Array
    weights: np.ndarray = eqx.field(static=True)

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> jax.Array:
        return self.array * self.weights


@quax.register(lax.mul_p)
def _(x: Weighted, y: ArrayLike) -> jax.Array:
    return x.array * y * jnp.asarray(x.weights)


@pytest.fixture(params=["on", "verify"])
def mode(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The caches on, or in verify mode (every hit recomputed and compared), from
    empty caches."""
    monkeypatch.setattr(quax_caches, "verifying", request.param == "verify")
    quax_caches.invalidate()
    yield request.param
    quax_caches.invalidate()


plus = jax.jit(lambda a, b: a + b)


@pytest.mark.parametrize("size", [8, 100])
def test_a_nested_jit_sees_a_numpy_array_changed_in_place(mode: str, size: int) -> None:
    # Above `MAX_CONSTANT_SIZE` (64) the array is passed in by its aval until the
    # rule asks for its value; from then on the body takes it by value. Its bytes
    # are the key: keyed by identity, the third call got the body traced for zeros.
    del mode
    f = quax.quaxify(lambda p, c: plus(p, c))
    p = Probe(jnp.arange(size, dtype=jnp.float32), jnp.zeros(1))
    c = np.zeros(size, np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(f(p, c).array, np.asarray(p.array))
    c[:] = 5.0
    expected = np.asarray(plus(p.array, c))  # plain JAX
    np.testing.assert_array_equal(expected, np.arange(size) + 5.0)
    np.testing.assert_array_equal(f(p, c).array, expected)
    with quax.caching(False):
        np.testing.assert_array_equal(f(p, c).array, expected)
    c[:] = 0.0
    np.testing.assert_array_equal(f(p, c).array, np.asarray(p.array))


@pytest.mark.parametrize("size", [8, 100])
def test_a_kept_body_traced_again_has_the_values_of_its_key(
    mode: str, size: int
) -> None:
    # The body kept for zeros closes over its key's copy of them: when JAX traces
    # it again (another shape of a leaf that the aval ignores), the array the first
    # caller passed, since changed in place, must not come back into it.
    del mode
    f = quax.quaxify(lambda p, c: plus(p, c))
    x = jnp.arange(size, dtype=jnp.float32)
    first = np.zeros(size, np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(f(Probe(x, jnp.zeros(1)), first).array, x)
    first[:] = 5.0  # the first caller reuses its buffer
    again = np.zeros(size, np.float32)
    out = f(Probe(x, jnp.zeros(3)), again)
    np.testing.assert_array_equal(out.array, np.asarray(plus(x, again)))
    np.testing.assert_array_equal(out.array, x)


def test_a_compiled_eager_program_sees_a_numpy_array_changed_in_place(
    mode: str,
) -> None:
    # A small plain input stays a constant of the compiled program, keyed by bytes.
    del mode
    previous = quax.set_eager_compilation(True)
    try:
        add = jax.jit(lambda p, c: p + c)
        f = quax.quaxify(add)
        p = Probe(jnp.arange(8, dtype=jnp.float32), jnp.zeros(1))
        c = np.ones(8, np.float32)
        for _ in range(3):  # the third call runs the compiled program
            np.testing.assert_array_equal(f(p, c).array, np.arange(8) + 1.0)
        c[:] = 0.0
        np.testing.assert_array_equal(f(p, c).array, np.asarray(add(p.array, c)))
        c[:] = 2.0
        with quax.caching(False):
            np.testing.assert_array_equal(f(p, c).array, np.arange(8) + 2.0)
        np.testing.assert_array_equal(f(p, c).array, np.arange(8) + 2.0)
    finally:
        quax.set_eager_compilation(previous)


def test_a_static_numpy_field_changed_in_place_is_never_replayed(mode: str) -> None:
    # Replayed by the identity of its static field, the third trace staged the
    # first one's weights.
    del mode
    weights = np.ones(3, np.float32)
    x = jnp.arange(3.0, dtype=jnp.float32)

    def call() -> np.ndarray:
        # A fresh function each time, so that JAX traces it again.
        f = lambda a: quax.quaxify(lambda v: v * 2.0)(Weighted(a, weights))
        return np.asarray(jax.jit(f)(x))

    for _ in range(2):
        np.testing.assert_array_equal(call(), np.asarray(x) * 2.0)
    weights[:] = 5.0
    np.testing.assert_array_equal(call(), np.asarray(x) * 2.0 * weights)
    with quax.caching(False):
        np.testing.assert_array_equal(call(), np.asarray(x) * 2.0 * weights)


@pytest.mark.parametrize(
    "field", [np.ones(2), [1, 2], (1.0, np.ones(2)), {"a": 1}], ids=repr
)
def test_a_static_field_that_cannot_be_hashed_is_never_keyed(field: Any) -> None:
    with pytest.raises(TypeError):
        quax_keys.static_key(field)
