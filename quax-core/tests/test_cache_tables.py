"""The memoisers that key on user input are cache tables like the others: the signs
of symbolic zeros' small evaluations (`quax.zero._rules`) and which registered
function a `jit` body is (`quax._rules._functions`) are listed by `python -m
quax caches`, switched off by `quax.caching(False)`, checked by verify mode, keyed
by the one key builder (floats by their bits) and hold no jaxpr alive."""

import gc
import inspect
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._caching._keys as quax_keys
import quax._foundation._caches as quax_caches
import quax.zero._rules as zero_rules
from jax.extend.core import Primitive
from quax._rules import _functions

from .helpers import Refusing


# A primitive whose output is its float param `fill`, in the shape of its operand:
# its sign is the sign of `fill`, which `==` does not see (`0.0 == -0.0`).
filled_p = Primitive("filled")
filled_p.def_impl(lambda x, *, fill: jnp.full(jnp.shape(x), fill, jnp.result_type(x)))
filled_p.def_abstract_eval(lambda x, *, fill: jax.core.ShapedArray(x.shape, x.dtype))

ZERO = zero_rules._operand("zero", (1,), np.dtype(np.float32), (False, False))


def _signs(fill: float) -> Any:
    return zero_rules._evaluated_signs(filled_p, [ZERO], {"fill": fill})


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Empty caches, verify mode off; `plant(name)` turns verify mode on and leaves
    a component out of every key."""
    monkeypatch.setattr(quax_caches, "verifying", False)
    quax_caches.invalidate()

    def plant(name: str) -> None:
        monkeypatch.setattr(quax_caches, "verifying", True)
        monkeypatch.setattr(quax_keys, "omitted", frozenset({name}))
        quax_caches.invalidate()

    yield plant
    quax_caches.invalidate()


def test_zero_signs_are_keyed_by_the_bits_of_float_params(fresh: Any) -> None:
    del fresh
    for _ in range(2):  # evaluated, then kept
        assert list(_signs(0.0)) == [(False, False)]
        assert list(_signs(-0.0)) == [(True, False)]
    assert len(zero_rules._evaluations) == 2


def test_zero_signs_are_a_listed_table_the_switch_turns_off(fresh: Any) -> None:
    del fresh
    names = [name for name, _, _ in quax_caches.report()]
    assert zero_rules._evaluations.name in names
    with quax.caching(False):
        assert list(_signs(-0.0)) == [(True, False)]
        assert len(zero_rules._evaluations) == 0
    _signs(-0.0)
    assert len(zero_rules._evaluations) == 1


def test_verify_mode_checks_zero_signs(fresh: Any) -> None:
    # With the code (the primitive and its params) left out of the key, the signs
    # evaluated for `fill = 0.0` would serve `fill = -0.0`.
    fresh("code")
    _signs(0.0)
    with pytest.raises(
        quax.CacheMismatchError, match=r"(?s)symbolic zeros.*differ.*: code;"
    ):
        _signs(-0.0)


# Which registered function a `jit` body is -------------------------------------------


def _registered() -> Any:
    @jax.jit
    def scale(a: Any) -> Any:
        return a * 3.0

    @quax.register_function(scale)
    def _(a: Refusing, *, call: Any) -> Any:
        del call
        return Refusing(a.array * 3.0)

    return scale


def _call_a_registered_function() -> None:
    x = jnp.arange(3.0)
    scale = _registered()
    f = quax.quaxify(lambda a: scale(a))
    np.testing.assert_array_equal(f(Refusing(x)).array, x * 3.0)


def test_identified_bodies_go_with_their_jaxpr(fresh: Any) -> None:
    del fresh
    _call_a_registered_function()
    assert len(_functions._identified) == 1
    jax.clear_caches()  # JAX's own caches hold the traced jaxprs
    gc.collect()
    assert len(_functions._identified) == 0


def test_verify_mode_checks_identified_bodies(fresh: Any) -> None:
    x = jnp.arange(3.0)
    scale = _registered()
    a_body = jax.make_jaxpr(scale)(x).eqns[0].params["jaxpr"]
    other = jax.make_jaxpr(jax.jit(lambda a: a + 1.0))(x).eqns[0].params["jaxpr"]
    fresh("jaxpr")  # every body shares one entry
    code = inspect.unwrap(scale).__code__
    candidates = [
        r for rs in _functions._registered.values() for r in rs if r.code is code
    ]
    assert _functions._identify(a_body, candidates) is not None
    with pytest.raises(
        quax.CacheMismatchError,
        match=r"(?s)functions of jit bodies.*differ.*: jaxpr;",
    ):
        _functions._identify(other, candidates)
