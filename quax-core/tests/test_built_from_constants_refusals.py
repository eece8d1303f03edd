"""A value built from constants inside a quaxified function, crossing into a loop or
a branch as a pytree, where the body or another branch gives a plain array: quax
cannot dispatch on the value there (it met an array that JAX traces in the body, whose
type JAX erased, or a `jax.numpy` function, so it was staged), and JAX refuses the
structures. The refusal says what to do: `jnp.asarray(value)` where the value is
built joins it to the quax trace, whose loop and branch rules dispatch on it; each
program so rewritten gives plain JAX's result on the dense arrays.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import quax
from jax import lax

from .test_built_from_constants import Metres, X, _check, _metres
from .test_nesting import Tagged


# Each program takes `x` (metres) and the constructor `V` of its value built from
# constants: `Metres` refused, `jnp.asarray(Metres(...))` as the note says, and
# `jnp.asarray` for plain JAX on the dense arrays.
Program = Callable[[Any, Callable[[Any], Any]], Any]

PROGRAMS: dict[str, Program] = {
    # The carry meets the loop index.
    "fori_index": lambda x, V: (
        lax.fori_loop(0, 3, lambda i, c: c * (i + 1.0), V(jnp.ones(3))) + x
    ),
    # The carry meets an array made in the body.
    "fori_array_made_in_body": lambda x, V: (
        lax.fori_loop(0, 3, lambda i, c: c * jnp.full(3, 2.0), V(jnp.ones(3))) + x
    ),
    # The carry meets a `jax.numpy` function.
    "fori_jax_numpy": lambda x, V: (
        lax.fori_loop(0, 3, lambda i, c: jnp.multiply(c, 2.0), V(jnp.ones(3))) + x
    ),
    # A branch returns a value built from constants, the other the traced input.
    "cond_built_or_input": lambda x, V: lax.cond(
        False, lambda x: V(jnp.ones(3)), lambda x: x, x
    ),
    "cond_built_or_closed_over_input": lambda x, V: lax.cond(
        True, lambda: V(jnp.ones(3)), lambda: x
    ),
    "switch_built_or_input": lambda x, V: lax.switch(
        0, [lambda x: V(jnp.ones(3)), lambda x: x * 2.0], x
    ),
    # The operand is built from constants; a branch adds the traced input.
    "cond_operand_built": lambda x, V: lax.cond(
        False, lambda c: c * 2.0, lambda c: c + x, V(jnp.ones(3))
    ),
}


def _joined(array: Any) -> Any:
    return jnp.asarray(Metres(array))


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_refusal_says_to_join_the_value(name: str) -> None:
    f = quax.quaxify(lambda x: PROGRAMS[name](x, Metres))
    for run in (f, jax.jit(f)):
        with pytest.raises(TypeError, match="same pytree structure") as refused:
            run(_metres(X))
        notes = getattr(refused.value, "__notes__", [])
        assert sum("jnp.asarray(value)" in note for note in notes) == 1, notes


@pytest.mark.parametrize("caching", [True, False], ids=["caches-on", "caches-off"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_joined_value_runs(name: str, caching: bool) -> None:
    want = PROGRAMS[name](jnp.asarray(X), jnp.asarray)
    f = quax.quaxify(lambda x: PROGRAMS[name](x, _joined))
    with quax.caching(caching):
        _check(f(_metres(X)), want)
        _check(f(_metres(X)), want)
        _check(jax.jit(f)(_metres(X)), want)


def test_plain_structure_mismatch_gets_no_note() -> None:
    # A mismatch of plain pytrees is the user's own: JAX's message alone.
    f = quax.quaxify(lambda x: lax.cond(True, lambda: (x, x), lambda: x))
    with pytest.raises(TypeError, match="same pytree structure") as refused:
        f(_metres(X))
    notes = getattr(refused.value, "__notes__", [])
    assert not any("quax" in note for note in notes), notes


def test_value_changing_its_static_fields_gets_no_note() -> None:
    # A carry whose tag each step changes (`Tagged`'s product names both factors):
    # a value on both sides, which no `jnp.asarray` mends.
    f = quax.quaxify(
        lambda x: lax.fori_loop(0, 2, lambda i, c: c * 2.0, Tagged(jnp.ones(3), "c"))
    )
    with pytest.raises(TypeError, match="same pytree structure") as refused:
        f(_metres(X))
    notes = getattr(refused.value, "__notes__", [])
    assert not any("quax" in note for note in notes), notes
