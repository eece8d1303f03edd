"""Tests written for mutants of the core's trace and dispatch (`quax/_transform/`,
`quax/_dispatch/`) that a sampled run of `scripts/mutation.sh` let through (see
`docs/mutation.md`), each failing with its mutant planted: which resolutions the
dispatch cache may keep, and its bound."""

from typing import Any

import equinox as eqx
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
    np.testing.assert_allclose(by_float.array, np.asarray(X) ** 2, rtol=1e-6)
    np.testing.assert_allclose(by_int.array, np.asarray(X) ** 3, rtol=1e-6)


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
