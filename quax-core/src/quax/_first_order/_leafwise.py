"""Rules for primitives that act on every leaf of any value alike:
`stop_gradient`, `copy`, equinox's `nondifferentiable_backward` (an identity that
refuses reverse-mode differentiation, which diffrax's implicit solvers put around
their root finder's state), `optimization_barrier`, and `select_n` with a scalar
predicate between values of one structure."""

from typing import Any

import equinox.internal as eqxi
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.extend.core import primitives as _prims

from .._compat import Primitive, optimization_barrier_p
from .._dispatch._registry import fallback_rule, register
from .._values._value import Value, ValueLike, structure


__all__: list[str] = []


def _leafwise(primitive: Primitive) -> None:
    @register(primitive)
    def _(x: Value, **params: Any) -> Value:
        return jtu.tree_map(lambda leaf: primitive.bind(leaf, **params), x)


for _p in (_prims.stop_gradient_p, _prims.copy_p, eqxi.nondifferentiable_backward_p):
    _leafwise(_p)


@register(optimization_barrier_p)
def _optimization_barrier(*args: ValueLike) -> list[Any]:
    leaves, treedef = jtu.tree_flatten(list(args))
    return jtu.tree_unflatten(treedef, lax.optimization_barrier(leaves))


@register(_prims.select_n_p)
def _select_n(which: ValueLike, *cases: ValueLike) -> Any:
    # With a scalar predicate, choosing between values of one structure is choosing
    # leaf by leaf; anything else goes to the types' own rules or fallback.
    if (
        not isinstance(which, Value)
        and np.ndim(which) == 0
        and all(isinstance(c, Value) for c in cases)
        and len({structure(c) for c in cases}) == 1
    ):
        return jtu.tree_map(lambda *leaves: lax.select_n(which, *leaves), *cases)
    return fallback_rule(_prims.select_n_p, [which, *cases])([which, *cases], {})
