"""No two installed families (nor a family and the symbolic zeros) have ambiguous
rules on any primitive.

Generic: every installed family is loaded, its value types are asked through the
plugin hooks, and every primitive with a registered rule is resolved on every pair
of those types (and plain arrays) at every pair of input positions. A new family
is covered as soon as it is installed.

Two types that override `Value.default` differently and meet on a primitive neither
has a rule for are not ambiguous rules: quax refuses that with its own error, which
names both types and asks for a rule. (Types sharing one `default`, as every
`quax.GuardedValue` does, do not compete: the shared policy decides.)
"""

import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
from jax import lax
from jax.extend.core import Primitive
from jaxtyping import ArrayLike
from quax._dispatch import _registry
from quax.zero import Zero


def _value_types() -> list[type]:
    quax.plugins.load()
    types: list[type] = []
    for declared in quax.plugins.manager().hook.quax_value_types():
        types.extend(t for t in declared if t not in types)
    if Zero not in types:
        types.append(Zero)
    return types


# Primitives that JAX never binds with fewer inputs than this (`select_n` takes a
# predicate and at least one case), where a rule's `*args` allows fewer.
_MIN_INPUTS = {"select_n": 2}


def _arities(primitive: Primitive) -> set[int]:
    """The numbers of inputs the registered rules of `primitive` take (a rule
    with `*args` takes one or two more than its named inputs)."""
    arities = set()
    for registration in _registry._registrations[primitive]:
        n = len(registration.signature.types)
        arities.update({n + 1, n + 2} if registration.signature.has_varargs else {n})
    least = _MIN_INPUTS.get(primitive.name, 1)
    return {n for n in arities if n >= least}


def _ambiguities(primitive: Primitive, types: Sequence[type]) -> list[str]:
    """Every input-type tuple on which `primitive`'s rules are ambiguous: one or
    two of `types` (or plain arrays) placed at any positions, plain arrays
    elsewhere."""
    candidates = [*types, jax.Array]
    found = []
    for n in sorted(_arities(primitive)):
        for positions in itertools.combinations(range(n), min(n, 2)):
            for chosen in itertools.product(candidates, repeat=len(positions)):
                inputs: list[type] = [jax.Array] * n
                for position, t in zip(positions, chosen, strict=True):
                    inputs[position] = t
                if all(t is jax.Array for t in inputs):
                    continue
                try:
                    quax.resolve(primitive, inputs)
                except TypeError as e:
                    if str(e).startswith("Ambiguous quax rules"):
                        names = ", ".join(t.__qualname__ for t in inputs)
                        found.append(f"{primitive.name}({names})")
    return found


@pytest.mark.long_running
def test_no_two_families_are_ambiguous_on_any_primitive() -> None:
    types = _value_types()
    families = {f.name for f in quax.plugins.families()}
    assert {"lora", "units"} <= families, families
    found = [
        ambiguity
        for primitive in list(_registry._registrations)
        for ambiguity in _ambiguities(primitive, types)
    ]
    assert not found, "Ambiguous quax rules:\n" + "\n".join(found)


class _Planted(quax.ArrayValue):
    array: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> Any:
        return self.array


class _Left(_Planted):
    pass


class _Right(_Planted):
    pass


@quax.register(lax.nextafter_p)
def _(x: _Left, y: ArrayLike | quax.ArrayValue, **params: Any) -> Any:
    return x.array


@quax.register(lax.nextafter_p)
def _(x: ArrayLike | quax.ArrayValue, y: _Right, **params: Any) -> Any:
    return y.array


def test_the_check_finds_a_planted_ambiguity() -> None:
    found = _ambiguities(lax.nextafter_p, [_Left, _Right])
    assert found == ["nextafter(_Left, _Right)"]


# LoRA and symbolic zeros: a zero annihilates the product ------------------------------


@pytest.fixture
def lora() -> Any:
    quax_lora = pytest.importorskip("quax_lora", reason="quax-lora is not installed")
    return quax_lora.LoraArray(jnp.ones((4, 3)), rank=2, alpha=1.0, key=jr.key(0))


def test_lora_times_zero_is_zero(lora: Any) -> None:
    out = quax.quaxify(lambda a, b: a @ b)(lora, Zero((3, 5), jnp.float32))
    assert isinstance(out, Zero) and out.shape == (4, 5)
    out = quax.quaxify(lambda a, b: a @ b)(Zero((2, 4), jnp.float32), lora)
    assert isinstance(out, Zero) and out.shape == (2, 3)
    out = quax.quaxify(lambda a, b: b * a)(lora, Zero((), jnp.float32))
    assert isinstance(out, Zero) and out.shape == (4, 3)
    np.testing.assert_array_equal(out.materialise(), np.zeros((4, 3)))
