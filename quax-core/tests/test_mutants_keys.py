"""The key builder's contract (`quax._caching._keys`), field by field: tests that kill
mutants the end-to-end cache tests let through (`scripts/mutation.sh caching-keys`;
docs/mutation.md lists each surviving mutant and the test that kills it).

Two keys must differ wherever a rule could read a difference (a looser key is a
silently wrong cache hit), and must be equal for fields that are the same by value
(a stricter key only misses). The references are the fields themselves: their types,
their values and their bits as NumPy gives them."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.plugins
import quax.testing
from quax._caching import _keys
from quax._caching._keys import (
    CONSTANT_MAX_SIZE,
    constant_key,
    float_key,
    jaxpr_key,
    params_key,
    static_key,
)
from quax._foundation import _journal

from .helpers import Dense


def _fresh_int(n: int) -> int:
    # An int object of its own (CPython shares only the small ones).
    return int(str(n))


def test_floats_are_keyed_by_type_and_bits() -> None:
    assert float_key(2.5) == float_key(float("2.5"))
    assert float_key(2.5) != float_key(3.5)
    assert float_key(0.0) != float_key(-0.0)
    # Equal values and bits, another type: a Python float is weakly typed.
    assert np.float64(2.5).tobytes() == np.asarray(2.5).tobytes()
    assert float_key(2.5) != float_key(np.float64(2.5))
    assert float_key(1 + 2j) != float_key(1 - 2j)


def test_static_scalars_strings_and_dtypes_are_keyed_by_value_and_type() -> None:
    assert _fresh_int(1000) is not _fresh_int(1000)
    assert static_key(_fresh_int(1000)) == static_key(_fresh_int(1000))
    assert static_key("ab" + str(len("x"))) == static_key("ab1")
    assert static_key(np.dtype("float32")) == static_key(np.dtype(np.float32))
    assert static_key(None) == static_key(None)
    # `1 == True == 1.0`, but a rule may read the type.
    keys = [static_key(1), static_key(True), static_key(1.0), static_key("1")]
    assert len(set(keys)) == 4
    assert static_key(np.dtype("float32")) != static_key(np.dtype("float64"))


def test_static_floats_are_keyed_by_bits() -> None:
    assert static_key(0.5) == static_key(float("0.5"))
    assert static_key(0.5) != static_key(0.25)
    assert static_key(0.0) != static_key(-0.0)


@pytest.mark.parametrize("ints", [(), (7,), (1, 2, 3), (0, -4)])
def test_static_tuples_of_ints_are_keyed_by_value(ints: tuple[int, ...]) -> None:
    copy = tuple(_fresh_int(i) for i in ints)
    assert static_key(copy) == static_key(ints)
    assert static_key(ints) != static_key((*ints, 9))


class _Loose:
    """Equal to everything: a static field whose `==` says less than rules read."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


@pytest.mark.parametrize(
    "make",
    [
        _Loose,
        lambda: (1, float("1")),  # a tuple holding a float: `(1, 1.0) == (1, 1)`
        lambda: (_Loose(),),
    ],
)
def test_other_static_fields_are_keyed_by_identity(make: Any) -> None:
    a, b = make(), make()
    assert a == b and a is not b
    assert static_key(a) == static_key(a)
    assert hash(static_key(a)) == hash(static_key(a))
    assert static_key(a) != static_key(b)
    # Never equal to a key of another kind, nor to the field itself.
    assert static_key(a) != a
    assert static_key((1, 1.0)) != static_key((1, 1))


@pytest.mark.parametrize("field", [[1, 2], np.zeros(2), (1, [2])])
def test_static_fields_that_cannot_be_hashed_are_refused(field: Any) -> None:
    with pytest.raises(TypeError):
        static_key(field)


def test_params_are_keyed_by_value_and_their_floats_by_bits() -> None:
    numbers = (((1,), (0,)), ((), ()))
    same = (((_fresh_int(1),), (0,)), ((), ()))
    assert params_key({"dimension_numbers": numbers, "precision": None}) == params_key(
        {"dimension_numbers": same, "precision": None}
    )
    assert params_key({"dimension_numbers": numbers}) != params_key(
        {"dimension_numbers": (((0,), (0,)), ((), ()))}
    )
    # `gather`'s `fill_value`: `-0.0 == 0.0`, but the zero's sign is the output's.
    assert params_key({"fill_value": 0.0}) != params_key({"fill_value": -0.0})
    assert params_key({"fill_value": 0.5}) == params_key({"fill_value": float("0.5")})


def test_constants_are_keyed_by_aval_and_bits() -> None:
    # The same bits in other shapes, dtypes or weak types: other constants.
    pairs = [
        (jnp.zeros((2, 2), jnp.float32), jnp.zeros((4,), jnp.float32)),
        (jnp.ones((), jnp.float32), jnp.asarray(1065353216, jnp.int32)),
        (jnp.asarray(2.0), jnp.asarray(2.0, jnp.float32)),  # weak, strong
        (2.0, np.float64(2.0)),  # a weak Python float, a strong NumPy one
        (np.array(2.0, np.float32), np.array(1073741824, np.int32)),
    ]
    for a, b in pairs:
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        assert constant_key(a) is not None and constant_key(b) is not None
        assert constant_key(a) != constant_key(b)
        copy = jnp.array(a) if isinstance(a, jax.Array) else a
        assert constant_key(a) == constant_key(copy)


def test_constants_keyed_up_to_the_size_bound() -> None:
    assert constant_key(jnp.zeros(CONSTANT_MAX_SIZE)) is not None
    assert constant_key(jnp.zeros(CONSTANT_MAX_SIZE + 1)) is None
    # NumPy arrays of one or more dimensions are never keyed (their owner may change
    # them in place, and copying their bits on every bind costs what a replay saves).
    assert constant_key(np.zeros(3, np.float32)) is None
    assert constant_key(np.float32(1.5)) is not None


@pytest.mark.parametrize(
    "constants",
    [
        [2.0, np.float64(2.0)],
        [np.float32(2.0), np.int32(2)],
    ],
)
def test_constants_of_one_value_inside_jit_keep_their_dtypes(
    constants: list[Any],
) -> None:
    # `x * c` with `c` a constant closed over inside `jit`: a staged rule is replayed
    # for a constant with the key of one seen before, so constants of one value
    # but other types must not share one. The reference is plain JAX.
    x = jnp.arange(3, dtype=jnp.float16)
    for _ in range(2):
        for c in constants:
            fn: Callable[[Any], Any] = lambda v, c=c: v * c
            got = jax.jit(quax.quaxify(fn))(Dense(x))
            want = fn(x)
            assert isinstance(got, Dense)
            assert got.array.dtype == want.dtype
            np.testing.assert_array_equal(got.array, want)


def test_a_failed_load_takes_its_setting_back_and_names_its_module() -> None:
    # A setting added in a block that raises is taken back, and the block names the
    # setting's module (the plugin loader forgets that package's modules, so that
    # importing them again adds the setting again).
    def read() -> str:
        return "planted"

    read.__module__ = "quax_planted_family._settings"
    before = list(_keys._settings)
    with (
        pytest.raises(RuntimeError, match="half-way"),
        _journal.all_or_nothing() as block,
    ):
        quax.plugins.add_setting(read)
        assert _keys._settings == [*before, read]
        raise RuntimeError("the family failed half-way")
    assert _keys._settings == before
    assert "quax_planted_family._settings" in block.modules


def test_a_jaxpr_is_keyed_by_a_weak_reference_to_it() -> None:
    # Equal for the same living jaxpr, other for another, and not keeping it alive.
    closed = jax.make_jaxpr(lambda a: a * 2)(1.0)
    other = jax.make_jaxpr(lambda a: a * 2)(1.0)
    key, parts = jaxpr_key(closed)
    assert key == jaxpr_key(closed)[0] and parts == key
    assert key[0]() is closed
    assert key != jaxpr_key(other)[0]


class Labelled(Dense):
    """A `Dense` with a dynamic field that holds a Python object, not an array."""

    label: Any = None


def test_a_value_with_a_leaf_that_is_no_array_runs_without_a_program() -> None:
    """A value one of whose leaves is not an array (a dynamic field holding a
    string) has no structure to key a compiled program by: each call runs
    equation by equation, and gives NumPy's values (mutant `value_structure` 73
    asked for the avals of such leaves too: JAX's `TypeError` for the string)."""
    f = quax.quaxify(lambda v: jnp.sin(v) * 2.0)
    x = jnp.array([0.5, -1.5, 2.25, 3.0])
    for _ in range(3):
        out = f(Labelled(x, "a label"))
        assert type(out) is Labelled
        np.testing.assert_allclose(
            out.array,
            2.0 * np.sin(np.asarray(x)),
            **quax.testing.tolerance(jnp.float32),
        )
