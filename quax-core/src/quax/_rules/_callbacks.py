"""Rules for host callbacks: `pure_callback` gets dense arrays; `jax.debug.callback`
and `jax.debug.print` get the values rebuilt on the host, never densified on the
device."""

from collections.abc import Sequence
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from .._compat import (
    Primitive,
    debug_callback_p,
    debug_print_p,
    pure_callback_p,
    run_debug_on_host,
)
from .._dispatch._registry import register
from .._values._value import Value, ValueLike, materialise_or_explain


__all__: list[str] = []


@register(pure_callback_p)
def _pure_callback(*args: ValueLike, **params: Any) -> Any:
    # The callback is host code written for arrays: it gets the dense arrays,
    # materialised at trace time so that a value that refuses says so now.
    dense = [
        materialise_or_explain(
            x,
            lambda value: (
                f"`{pure_callback_p.name}` hands its inputs to host code as dense "
                f"arrays, so quax must materialise the {value}"
            ),
        )
        for x in args
    ]
    return pure_callback_p.bind(*dense, **params)


def _host_view(x: Any) -> Any:
    """How a value is shown to a debug callback: dense if it allows it, else itself
    (with its leaves on the host)."""
    if not isinstance(x, Value):
        return x
    try:
        return np.asarray(x.materialise())
    except Exception:
        return x


def _on_host(
    primitive: Primitive, args: Sequence[Any], params: dict[str, Any]
) -> list[Any]:
    """Run a debug primitive with its values rebuilt on the host, never densified on
    the device: the values' leaves travel, and the host shows them."""
    leaves, treedef = jtu.tree_flatten(list(args))

    def host(*host_leaves: Any) -> None:
        views = [_host_view(v) for v in jtu.tree_unflatten(treedef, host_leaves)]
        run_debug_on_host(primitive, views, params)

    jax.debug.callback(host, *leaves, ordered=bool(params.get("ordered", False)))
    return []


@register(debug_callback_p)
def _debug_callback(*args: ValueLike, **params: Any) -> list[Any]:
    return _on_host(debug_callback_p, args, params)


@register(debug_print_p)
def _debug_print(*args: ValueLike, **params: Any) -> list[Any]:
    return _on_host(debug_print_p, args, params)
