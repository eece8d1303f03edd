"""JAX's newer array primitives (`stack`, `tile`, `unstack`) on a value type written
for the releases before them, as the published quax's clients' are (quaxed's
`MyArray`): it has rules for the primitives `jnp.stack`, `jnp.tile`, `jnp.resize` and
`jnp.unstack` used to bind, and a `materialise` that raises. Quax runs the newer
primitives as the older ones, so the value is kept, never materialised."""

from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax


class Old(quax.ArrayValue):
    """A dense wrapper with rules for the older primitives only."""

    array: jax.Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> jax.Array:
        raise NotImplementedError("Old never materialises")


def _array(x: Any) -> Any:
    return x.array if isinstance(x, Old) else x


def _unary(primitive: Any) -> None:
    @quax.register(primitive)
    def _(x: Old, **params: Any) -> Old:
        return replace(x, array=primitive.bind(x.array, **params))


for _p in (lax.broadcast_in_dim_p, lax.reshape_p, lax.slice_p, lax.squeeze_p):
    _unary(_p)


@quax.register(lax.concatenate_p)
def _(*xs: Old | jax.Array, **params: Any) -> Old:
    return Old(lax.concatenate_p.bind(*map(_array, xs), **params))


X = jnp.arange(6.0).reshape(2, 3)

CASES = {
    "stack": (lambda x, y: jnp.stack([x, y], axis=1), (Old(X), Old(X + 10))),
    "stack-mixed": (lambda x, y: jnp.stack([x, y]), (Old(X), X - 1)),
    "tile": (lambda x: jnp.tile(x, (2, 3)), (Old(X),)),
    "resize": (lambda x: jnp.resize(x, (4, 4)), (Old(X),)),
    "unstack": (lambda x: jnp.unstack(x, axis=1), (Old(X),)),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(CASES))
def test_newer_primitives_keep_the_value(name: str, jit: bool) -> None:
    fn, args = CASES[name]
    dense = [_array(a) for a in args]
    want = jax.tree.leaves(fn(*dense))
    quaxified = quax.quaxify(fn)
    with quax.track_materialisation() as report:
        got = (jax.jit(quaxified) if jit else quaxified)(*args)
    assert not report, report
    got = jax.tree.leaves(got, is_leaf=lambda x: isinstance(x, Old))
    assert all(type(g) is Old for g in got), got
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.array, w)


def test_a_types_own_rule_for_a_newer_primitive_wins() -> None:
    class Own(Old):
        pass

    @quax.register(lax.tile_p)
    def _(x: Own, **params: Any) -> Own:
        return Own(-lax.tile_p.bind(x.array, **params))

    out = quax.quaxify(lambda x: jnp.tile(x, (1, 2)))(Own(X))
    np.testing.assert_array_equal(out.array, -jnp.tile(X, (1, 2)))
