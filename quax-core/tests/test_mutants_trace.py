"""Tests written for mutants of the core's trace and dispatch (`quax/_transform/`,
`quax/_dispatch/`) that a sampled run of `scripts/mutation.sh` let through (see
`docs/mutation.md`), each failing with its mutant planted: which resolutions the
dispatch cache may keep, and its bound."""

from typing import Any

import equinox as eqx
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jaxtyping import Array, Float, Int
from quax._dispatch import _registry

from .helpers import Dense


X = jnp.array([0.5, -1.5, 2.25, 3.0])


class ByDtype(Dense):
    """A `Dense` whose power notes which rule made it."""

    rule: str = eqx.field(static=True, default="")


@quax.register(lax.pow_p)
def _(x: ByDtype, y: Float[Array, "..."]) -> ByDtype:
    return ByDtype(lax.pow(x.array, y), "float")


@quax.register(lax.pow_p)
def _(x: ByDtype, y: Int[Array, "..."]) -> ByDtype:
    return ByDtype(lax.pow(x.array, y), "int")


@pytest.mark.parametrize("caching", [True, False], ids=["cached", "uncached"])
def test_rules_chosen_by_more_than_types_are_never_cached_by_types(
    caching: bool,
) -> None:
    """Two rules told apart by their exponent's dtype (jaxtyping's `Float[...]`,
    `Int[...]`), where the Python type of both exponents is one: each power runs
    its own rule, with the caches on as off (mutant `rule_for` 27 cached the first
    resolution of the primitive and its types, and the integer exponent got the
    float rule)."""
    power = quax.quaxify(lax.pow)
    with quax.caching(caching):
        by_float = power(ByDtype(X), jnp.asarray(2.0, jnp.float32))
        by_int = power(ByDtype(X), jnp.asarray(3, jnp.int32))
    assert (by_float.rule, by_int.rule) == ("float", "int")
    # The backend's float32 tolerance: a TPU's float32 `pow` is an approximation
    # (2.25 ** 2 gave 5.062486 on a TPU v5e).
    tolerance = quax.testing.tolerance(jnp.float32)
    np.testing.assert_allclose(by_float.array, np.asarray(X) ** 2, **tolerance)
    np.testing.assert_allclose(by_int.array, np.asarray(X) ** 3, **tolerance)


@pytest.mark.caching_behaviour
def test_the_dispatch_cache_starts_afresh_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatch cache holds at most `MAX_DISPATCH` resolutions: at the bound
    it starts afresh (mutant `rule_for` 40 let it reach one more)."""
    monkeypatch.setattr(_registry, "MAX_DISPATCH", 2)
    _registry._cache.clear()
    for primitive in (lax.sin_p, lax.cos_p, lax.neg_p):
        rule: Any = _registry.rule_for(primitive, [Dense(X)])
        assert len(_registry._cache) <= 2
        assert _registry._cache[(primitive, (Dense,))] is rule
    np.testing.assert_array_equal(rule([Dense(X)], {}).array, -X)


class ScaledBy(Dense):
    """A `Dense` that a primitive of a test's own multiplies by a plain array."""


@pytest.mark.caching_behaviour
def test_rules_on_value_types_and_jax_arrays_are_cached_by_types() -> None:
    """A rule annotated with a value type and `jax.Array` is decided by the input
    types, so its resolution is kept in the dispatch cache (mutants
    `_decided_by_types` 6 and 15 counted `jax.Array`, or a value type's class,
    equinox's, as not deciding: every call of the primitive resolved afresh). The
    primitive is the test's own, so that its rule is the only one registered for it
    (a primitive's resolutions are cached only where all of its rules are decided
    by types), and registered here, where mutmut sees the test reach the check."""
    scale_p = jax.extend.core.Primitive("quax_test_scale")
    scale_p.def_abstract_eval(lambda x, y: x)

    @quax.register(scale_p)
    def _(x: ScaledBy, y: jax.Array) -> ScaledBy:
        return ScaledBy(x.array * y)

    values = [ScaledBy(X), jnp.asarray(X)]
    rule: Any = _registry.rule_for(scale_p, values)
    assert _registry._cache[(scale_p, (ScaledBy, type(values[1])))] is rule
    np.testing.assert_array_equal(rule(values, {}).array, np.asarray(X) ** 2)
    out = quax.quaxify(scale_p.bind)(ScaledBy(X), jnp.asarray(X))
    np.testing.assert_array_equal(out.array, np.asarray(X) ** 2)
