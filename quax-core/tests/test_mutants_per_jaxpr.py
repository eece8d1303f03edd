"""Tests written for mutants of `quax/_caching/_per_jaxpr.py` that a sampled run of
`scripts/mutation.sh caching-per-jaxpr` let through (see `docs/mutation.md`), each
failing with its mutant planted: whether a jaxpr stages a value, looked for in a
tuple of sub-jaxprs, kept only while the jaxpr lives, and checked in verify mode."""

import gc
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import quax
from jax import lax
from quax._caching import _per_jaxpr

from .test_nesting import T, Tagged, _assert_tagged, _build_inside


def test_a_value_built_in_a_cond_branch_on_plain_operands() -> None:
    """`lax.cond`'s branches are a tuple of jaxprs: a value built in one, from
    plain operands only, is still found there and typed by quax (mutant
    `_param_holds` 4 looked at no element of a tuple)."""
    x = jnp.array([3.0, 4.0])
    branch = lambda s: Tagged(2.0, "c") * s
    f = lambda t, x: lax.cond(True, _build_inside, branch, x)
    _assert_tagged(quax.quaxify(f)(T, x), "c*1", [6.0, 8.0])
    _assert_tagged(jax.jit(quax.quaxify(f))(T, x), "c*1", [6.0, 8.0])


@pytest.mark.caching_behaviour
def test_whether_a_jaxpr_stages_a_value_goes_with_it() -> None:
    """The answer is kept per jaxpr while the jaxpr lives, and dropped with it
    (mutant `per_jaxpr` 13 kept it for good)."""
    gc.collect()
    before = len(_per_jaxpr._holds)
    closed = jax.make_jaxpr(lambda a: jnp.sin(a) + 1.0)(jnp.ones(3))
    assert not _per_jaxpr.jaxpr_holds_staged_values(closed)
    assert len(_per_jaxpr._holds) == before + 1
    del closed
    gc.collect()
    assert len(_per_jaxpr._holds) == before


def test_verify_mode_tells_a_changed_answer_apart(
    verifying: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In verify mode a kept answer is worked out afresh at each hit: a different
    answer raises, saying what was compared (mutant `_jaxpr_holds` 12 changed
    that text)."""
    del verifying
    closed = jax.make_jaxpr(lambda a: jnp.cos(a) * 2.0)(jnp.ones(3))
    assert not _per_jaxpr.jaxpr_holds_staged_values(closed)
    assert not _per_jaxpr.jaxpr_holds_staged_values(closed)  # a hit, verified
    monkeypatch.setattr(_per_jaxpr, "_walk_holds", lambda jaxpr: True)
    with pytest.raises(quax.CacheMismatchError, match="whether it stages a value"):
        _per_jaxpr.jaxpr_holds_staged_values(closed)
