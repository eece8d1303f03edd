"""JAX's newer array primitives, run as the primitives they replaced.

JAX 0.10 binds `stack` for `jnp.stack`, `tile` for `jnp.tile` (and `jnp.resize`) and
`unstack` for `jnp.unstack`, where earlier releases bound `broadcast_in_dim`,
`concatenate`, `reshape`, `slice` and `squeeze`. A value type written for those
releases (the published quax's clients' are) has rules for the older primitives
only, and would be materialised by the newer ones. For a value without a rule of its
own for them, quax runs them as the older primitives, each dispatched to the value's
rules. A type's own rule for a newer primitive is more specific, and wins.
"""

from typing import Any

from jax import lax

from .._dispatch._registry import register
from .._transform._quaxify import quaxify
from .._values._value import ValueLike


__all__: list[str] = []


def _stack(*xs: Any, axis: int) -> Any:
    return lax.concatenate([lax.expand_dims(x, (axis,)) for x in xs], axis)


def _tile(x: Any, reps: tuple[int, ...]) -> Any:
    # `x` of shape (s0, s1, ...) broadcast to (r0, s0, r1, s1, ...), then merged.
    shape = [n for pair in zip(reps, x.shape, strict=True) for n in pair]
    dims = tuple(range(1, 2 * x.ndim, 2))
    tiled = lax.broadcast_in_dim(x, shape, dims)
    return lax.reshape(tiled, tuple(r * s for r, s in zip(reps, x.shape, strict=True)))


def _unstack(x: Any, axis: int) -> list[Any]:
    return [lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]


@register(lax.stack_p)
def _stack_rule(*xs: ValueLike, axis: int) -> Any:
    return quaxify(_stack)(*xs, axis=axis)


@register(lax.tile_p)
def _tile_rule(x: ValueLike, *, reps: tuple[int, ...]) -> Any:
    return quaxify(_tile)(x, reps)


@register(lax.unstack_p)
def _unstack_rule(x: ValueLike, *, axis: int) -> list[Any]:
    return quaxify(_unstack)(x, axis)
