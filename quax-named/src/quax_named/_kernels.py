"""The array routines that rules and by-name operations share: running a
function on arrays that may be quax values, and laying an array out on other
axes (transposed, its broadcast axes dropped, new ones broadcast)."""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import quax
from jax import lax
from jax.core import Tracer
from jax.extend.core import Primitive

from ._axes import Axis, Broadcast


__all__ = ["array_shape", "bind", "call", "relayout", "uniform_value"]


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, quaxified when an argument is itself a quax value (a
    `NamedArray` wrapping a LoRA array, a quantity, a symbolic zero)."""
    if any(quax.is_value(a) for a in args):
        return quax.quaxify(fn)(*args, **kwargs)
    return fn(*args, **kwargs)


def bind(primitive: Primitive, *args: Any, **params: Any) -> Any:
    return call(primitive.bind, *args, **params)


def array_shape(x: Any) -> tuple[int, ...]:
    """The shape of `x`, a quax value (its aval's) or an array. A tracer's is read
    from its aval (what `jax.typeof` and `np.shape` give, without their lookups:
    rules ask for it on every operand while they trace)."""
    if isinstance(x, Tracer):
        aval: Any = x.aval
        return aval.shape
    return tuple(x.aval().shape) if quax.is_value(x) else tuple(np.shape(x))


def relayout(x: Any, out: Sequence[Axis], shape: tuple[int, ...]) -> Any:
    """`x.array` laid out on the axes `out` (shape `shape`): transposed by name, its
    broadcast axes dropped and the axes it lacks broadcast."""
    array = x.array
    positions = {a.key: j for j, a in enumerate(out)}
    own = array_shape(array)
    real = [i for i, a in enumerate(x.axes) if not isinstance(a, Broadcast)]
    if len(real) != len(own):
        # Drop the broadcast axes (the array is constant along them).
        start = [0] * len(own)
        limit = [n if i in real else min(n, 1) for i, n in enumerate(own)]
        if any(lim != n for lim, n in zip(limit, own, strict=True)):
            array = call(lax.slice, array, start, limit)
        array = call(lax.reshape, array, tuple(own[i] for i in real))
    order = sorted(range(len(real)), key=lambda k: positions[x.axes[real[k]].key])
    if order != list(range(len(real))):
        array = call(lax.transpose, array, order)
    dims = tuple(sorted(positions[x.axes[i].key] for i in real))
    if tuple(array_shape(array)) != shape:
        array = call(lax.broadcast_in_dim, array, shape, dims)
    return array


# Largest unnamed array checked for being one value repeated (a `jnp.full_like` of a
# named array, as `jnp.std` and `jnp.where` make): those broadcast like scalars.
_UNIFORM_MAX_SIZE = 1 << 16


def uniform_value(x: Any) -> Any:
    """`x` as a scalar if it is known now to hold one value everywhere, else `None`."""
    if quax.is_value(x) or np.size(x) > _UNIFORM_MAX_SIZE:
        return None
    known = quax.known_constant(x, _UNIFORM_MAX_SIZE)
    if known is None or known.size == 0:
        return None
    # One value by its bits: 0.0 and -0.0 (and NaNs of two signs) are two values,
    # which a product or a quotient tells apart.
    flat = np.ascontiguousarray(known).reshape(-1)
    bits = flat.view(np.uint8).reshape(flat.size, -1)
    if not (bits == bits[:1]).all():
        return None
    return flat[:1]
