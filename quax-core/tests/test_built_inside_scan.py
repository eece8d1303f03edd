"""A value built inside a `scan` body and returned as a stacked output, in a scan with
no value among its inputs (only the body's staged value brings it to quax: see
`quax._dispatch._staged`).

Such a scan reaches the core's `scan` rule, which stacks the value as `jax.vmap`
stacks one built in its function (a `Tagged` of the stacked array). A family's rule
for `scan` that takes its values or arrays (`NamedArray | ArrayLike`, as quax-named
registers) matched these plain inputs too, ran the body as plain JAX and refused with
`StagedValueError`; the `Scanned` family below registers one alike.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jaxtyping import Array, ArrayLike

from .test_nesting import T, Tagged


class Scanned(quax.ArrayValue):
    """A family with its own `scan` rule, taking its values or arrays."""

    array: Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        return self.array


@quax.register(lax.scan_p, precedence=-1)
def _scan_of_scanned(*args: Scanned | ArrayLike, **params: Any) -> list[Any]:
    del params
    if not any(isinstance(a, Scanned) for a in args):
        raise AssertionError("a family's scan rule ran on a scan without its values")
    raise NotImplementedError("not used by these tests")


def _stacked(t: Any) -> Any:
    """The stacked output of a scan whose body builds a value from constants."""
    del t
    return lax.scan(
        lambda c, _: (c, Tagged(2.0, "c") * jnp.ones(2)), 0.0, None, length=2
    )[1]


def _programs() -> dict[str, Any]:
    return {
        "indexed": lambda t: _stacked(t)[0] * t,
        "stacked": _stacked,
        "in-jit": lambda t: jax.jit(_stacked)(t),
        "in-cond": lambda t: lax.cond(True, _stacked, _stacked, t),
    }


# Plain JAX on the dense arrays: the scan stacks 2 * ones(2) twice.
_DENSE_STACK = np.asarray(
    lax.scan(lambda c, _: (c, 2.0 * jnp.ones(2)), 0.0, None, length=2)[1]
)
_EXPECTED = {
    "indexed": ("c*1*t", _DENSE_STACK[0] * np.array([1.0, 2.0])),
    "stacked": ("c*1", _DENSE_STACK),
    "in-jit": ("c*1", _DENSE_STACK),
    "in-cond": ("c*1", _DENSE_STACK),
}


def _assert_tagged(r: Any, tag: str, expected: Any) -> None:
    assert type(r) is Tagged, r
    assert not isinstance(r.array, quax.Value), r
    assert r.tag == tag
    np.testing.assert_allclose(r.array, expected, rtol=1e-6)


@pytest.mark.parametrize("caching", [True, False], ids=["caches-on", "caches-off"])
@pytest.mark.parametrize("name", list(_EXPECTED))
def test_value_built_inside_scan_stacked(name: str, caching: bool) -> None:
    tag, expected = _EXPECTED[name]
    with quax.caching(caching):
        _assert_tagged(quax.quaxify(_programs()[name])(T), tag, expected)
        staged = jax.jit(quax.quaxify(_programs()[name]))
        _assert_tagged(staged(T), tag, expected)
        _assert_tagged(staged(T), tag, expected)


def test_value_built_inside_scan_in_verify_mode(verifying: None) -> None:
    del verifying
    for name, (tag, expected) in _EXPECTED.items():
        program = _programs()[name]
        _assert_tagged(quax.quaxify(program)(T), tag, expected)
        _assert_tagged(quax.quaxify(program)(T), tag, expected)


def test_scan_stacks_as_vmap_and_cond_give() -> None:
    # `jax.vmap` of the same construction stacks the value alike; `lax.cond` and
    # `lax.while_loop` give the per-step value.
    scanned = quax.quaxify(_stacked)(T)
    mapped = quax.quaxify(
        lambda t: jax.vmap(lambda x: Tagged(2.0, "c") * x)(jnp.ones((2, 2)))
    )(T)
    _assert_tagged(mapped, scanned.tag, scanned.array)
    step = quax.quaxify(
        lambda t: lax.cond(
            True,
            lambda: Tagged(2.0, "c") * jnp.ones(2),
            lambda: Tagged(3.0, "c") * jnp.ones(2),
        )
    )(T)
    _assert_tagged(step, scanned.tag, scanned.array[0])
    looped = quax.quaxify(
        lambda t: lax.fori_loop(0, 2, lambda i, c: c, Tagged(2.0, "c") * jnp.ones(2))
    )(T)
    _assert_tagged(looped, scanned.tag, scanned.array[1])


def test_value_built_inside_scan_under_vmap_and_grad() -> None:
    # vmap over the quaxified function's input: each row times the first step.
    batch = Tagged(jnp.array([[1.0, 2.0], [3.0, 4.0]]), "t")
    r = jax.vmap(quax.quaxify(lambda t: _stacked(t)[0] * t))(batch)
    _assert_tagged(r, "c*1*t", _DENSE_STACK[0] * np.array([[1.0, 2.0], [3.0, 4.0]]))
    # d/dx sum(x * stacked[1]) = sum(2 * ones(2)).
    g = quax.quaxify(lambda t: jax.grad(lambda x: jnp.sum(x * _stacked(t)[1]))(3.0))(T)
    _assert_tagged(g, "1*c*1", np.sum(_DENSE_STACK[1]))


def test_family_scan_rule_still_applies_to_its_values() -> None:
    # The core's rule is taken only where no value is among the inputs.
    with pytest.raises(NotImplementedError, match="not used"):
        quax.quaxify(
            lambda s: lax.scan(lambda c, x: (c + x, None), s, jnp.ones((2, 2)))[0]
        )(Scanned(jnp.zeros(2)))
