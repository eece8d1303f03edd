"""`quax.testing.assert_thread_safe`: many threads calling a quaxified function,
eagerly and under `jit`, while rules are registered meanwhile, get what one thread
gets; a rule that is not thread-safe is caught."""

import threading
import time
from typing import Any

import jax.numpy as jnp
import pytest
import quax
import quax.testing as qt
from jax import lax
from quax.zero import Zero

from .helpers import Dense


class Scratch(Dense):
    """A `Dense` whose `sin` rule keeps its work in shared state, as a rule that is
    not thread-safe would."""


_scratch = threading.Lock()


@quax.register(lax.sin_p)
def _(x: Scratch, **params: Any) -> Scratch:
    if not _scratch.acquire(blocking=False):
        raise RuntimeError("the shared scratch space is in use by another call")
    try:
        time.sleep(0.001)  # the work, during which another thread may enter
        return Scratch(lax.sin_p.bind(x.array, **params))
    finally:
        _scratch.release()


def test_thread_safe_families_pass() -> None:
    x = Dense(jnp.arange(4.0).at[1].set(jnp.nan))
    qt.assert_thread_safe(lambda a, b: jnp.sin(a) * b + a, x, jnp.ones(4))
    qt.assert_thread_safe(
        lambda z, b: z @ b + 1.0, Zero((3, 4), jnp.float32), jnp.ones(4)
    )


def test_registered_rules_are_taken_back() -> None:
    before = qt.registry_state()
    qt.assert_thread_safe(lambda a: a * 2.0, Dense(jnp.ones(3)), threads=2, calls=1)
    assert qt.registry_state() == before


def test_a_rule_that_is_not_thread_safe_is_caught() -> None:
    with pytest.raises(AssertionError, match="shared scratch space is in use"):
        qt.assert_thread_safe(jnp.sin, Scratch(jnp.ones(3)), threads=8, calls=4)
