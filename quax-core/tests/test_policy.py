"""The materialisation policy every family shares: `quax.GuardedValue` and
`quax.MaterialisationError`."""

from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax


class BandError(quax.MaterialisationError):
    pass


class Band(quax.GuardedValue):
    """A matrix stored by its main diagonal (a stand-in for a family's value)."""

    diagonal: jax.Array
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = BandError
    # Counts `__init__` runs: `enable_materialise` must not run it again.
    inits: ClassVar[list[int]] = []

    def __init__(self, diagonal: jax.Array, *, allow_materialise: bool = False):
        self.diagonal = diagonal
        self.allow_materialise = allow_materialise
        Band.inits.append(1)

    def aval(self):
        n = self.diagonal.shape[-1]
        return jax.core.ShapedArray((n, n), self.diagonal.dtype)

    def dense(self):
        return jnp.diag(self.diagonal)

    def way_out(self, primitive=None):
        return "Convert it with `Band.to_dense_copy()`. " + super().way_out(primitive)


class Mask(quax.GuardedValue):
    """A second policy-following type (another family's, say)."""

    array: jax.Array

    def aval(self):
        return jax.typeof(self.array)

    def dense(self):
        return self.array


d = jnp.array([1.0, 2.0, 3.0])


def test_refusal_names_type_primitive_inputs_reason_and_way_out() -> None:
    with pytest.raises(BandError) as e:
        quax.quaxify(jnp.sin)(Band(d))
    message = str(e.value)
    assert message.startswith("Refusing to materialise `Band` for primitive `sin`")
    assert "on input types (Band)" in message
    assert "has no rule for this case" in message
    assert "float32[3,3]" in message  # the base's reason names the dense array
    assert "Band.to_dense_copy()" in message  # the family's own way out
    assert "allow_materialise=True" in message and ".enable_materialise()" in message
    # Every family's error is the core's, and a RuntimeError (published contract).
    assert isinstance(e.value, quax.MaterialisationError)
    assert isinstance(e.value, RuntimeError)


def test_refusal_under_jit_and_direct_materialise() -> None:
    with pytest.raises(BandError, match="for primitive `exp`"):
        jax.jit(quax.quaxify(jnp.exp))(Band(d))
    with pytest.raises(BandError, match="Refusing to materialise `Band` with"):
        Band(d).materialise()


def test_refusal_outside_any_trace_says_why_the_rules_did_not_apply() -> None:
    """A value that meets JAX outside any quax trace (used outside `quax.quaxify`)
    refuses with its own error and message, and a sentence saying to pass it into
    a quaxified function, or build it inside one."""
    with pytest.raises(BandError) as e:
        jnp.sin(Band(d))
    message = str(e.value)
    assert message.startswith("Refusing to materialise `Band` with")
    assert "Band.to_dense_copy()" in message
    assert message.endswith(
        "Pass the value into a quaxified function, or build it inside one, for its "
        "rules to apply.)"
    )
    # Built inside a quaxified function called with plain arrays alone, and passed
    # in: its rules apply (here: none, so the refusal names the primitive).
    built_inside = lambda diagonal: jnp.sin(Band(diagonal))
    for call in (
        lambda: quax.quaxify(built_inside)(d),
        lambda: quax.quaxify(jnp.sin)(Band(d)),
    ):
        with pytest.raises(BandError, match="for primitive `sin`") as e:
            call()
        assert "outside any quax trace" not in str(e.value)


class QuantityError(RuntimeError):
    """A refusal as unxt's `Quantity` raises it: a plain `RuntimeError` whose
    constructor takes other arguments than its message, with an attribute."""

    def __init__(self, unit: str) -> None:
        super().__init__(f"Refusing to materialise `Quantity` in {unit}.")
        self.unit = unit


class Failing(quax.ArrayValue):
    """A value whose `materialise` raises what `error` gives."""

    array: jax.Array
    error: Callable[[], Exception] = eqx.field(static=True)

    def aval(self) -> jax.core.ShapedArray:
        return jax.typeof(self.array)

    def materialise(self) -> jax.Array:
        raise self.error()


def _refusing_as_unxt(array: jax.Array) -> Any:
    return Failing(array, lambda: QuantityError("m"))


def _broken(array: jax.Array) -> Any:
    return Failing(array, lambda: ValueError("materialise is broken"))


_JAX_FUNCTIONS = {
    "square": jnp.square,
    "asarray": jnp.asarray,
    "where": lambda v: jnp.where(True, v, v),
    "stack": lambda v: jnp.stack([v, v]),
    "jit": jax.jit(jnp.sin),
}


@pytest.mark.parametrize("function", _JAX_FUNCTIONS)
def test_refusal_outside_any_trace_is_a_type_error(function: str) -> None:
    """As the published quax's: a value is not an array there (its clients catch a
    `TypeError`, as unxt's documentation does around `jnp.square(q)`). The error
    stays the value's own (a refusal a `RuntimeError` saying "Refusing to
    materialise"), with its attributes, chained to what `materialise` raised."""
    call = _JAX_FUNCTIONS[function]
    for value, own in [
        (_refusing_as_unxt(d), QuantityError),
        (Band(d), BandError),
        (_broken(d), ValueError),
    ]:
        with pytest.raises(TypeError) as e:
            call(value)
        error = e.value
        assert isinstance(error, own), type(error).__mro__
        assert type(error.__cause__) is own
        assert str(error).startswith(str(error.__cause__))
        assert str(error).endswith("for its rules to apply.)")
        if own is not ValueError:
            assert isinstance(error, RuntimeError)
            assert str(error).startswith("Refusing to materialise")
    with pytest.raises(TypeError) as e:
        jnp.square(_refusing_as_unxt(d))
    assert e.value.unit == "m"  # type: ignore[attr-defined]
    assert not isinstance(e.value, quax.MaterialisationError)
    with pytest.raises(TypeError) as e:
        jnp.square(Band(d))
    assert isinstance(e.value, quax.MaterialisationError)


def test_refusal_of_a_primitive_bound_outside_any_trace_is_the_values_own() -> None:
    # `Primitive.bind` replaces a `TypeError` from an argument's conversion with its
    # own message: the refusal reaches the user as it was.
    with pytest.raises(BandError, match="Refusing to materialise `Band`") as e:
        jax.lax.sin_p.bind(Band(d), accuracy=None)
    assert not isinstance(e.value, TypeError)


def test_allowed_value_densifies_through_the_primitive() -> None:
    out = quax.quaxify(jnp.sin)(Band(d, allow_materialise=True))
    np.testing.assert_allclose(out, np.sin(np.diag([1.0, 2.0, 3.0])), rtol=1e-6)


def test_enable_materialise_copies_without_running_init() -> None:
    band = Band(d)
    before = len(Band.inits)
    allowed = band.enable_materialise()
    assert len(Band.inits) == before
    assert allowed.allow_materialise and not band.allow_materialise
    assert allowed.diagonal is band.diagonal
    assert not allowed.enable_materialise(False).allow_materialise
    np.testing.assert_array_equal(allowed.materialise(), np.diag([1.0, 2.0, 3.0]))


def test_flag_is_keyword_only_static_and_false_by_default() -> None:
    mask = Mask(jnp.ones(3))
    assert mask.allow_materialise is False
    assert jax.tree_util.tree_leaves(mask) == [mask.array]  # static: not a leaf
    with pytest.raises(TypeError):
        Mask(jnp.ones(3), True)  # type: ignore[misc]


def test_two_policy_types_share_one_default() -> None:
    # Two families following the policy meet on a primitive neither has a rule
    # for: no "override `Value.default` differently" error; the first refusing
    # value says so, and where both allow it, both densify.
    band, mask = Band(d), Mask(jnp.ones((3, 3)))
    with pytest.raises(BandError, match=r"on input types \(Band, Mask\)"):
        quax.quaxify(jnp.add)(band, mask)
    with pytest.raises(
        quax.MaterialisationError, match="Refusing to materialise `Mask`"
    ):
        quax.quaxify(jnp.add)(band.enable_materialise(), mask)
    out = quax.quaxify(jnp.add)(band.enable_materialise(), mask.enable_materialise())
    np.testing.assert_allclose(out, np.diag([1.0, 2.0, 3.0]) + 1.0)
    assert quax.resolve(jax.lax.add_p, [Band, Mask]).kind == "default"
