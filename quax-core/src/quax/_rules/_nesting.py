"""The traces of sub-functions that JAX traces while their primitive binds
(`shard_map`'s body, a custom derivative's function) nest in the trace that stages
them, as a `jit` body's trace nests in the trace the `jit` is staged in.

`Primitive.bind` makes the eval trace current while a trace processes the primitive,
so a `DynamicJaxprTrace` staging `shard_map`, `custom_jvp_call` or `custom_vjp_call`
would give the sub-function's trace the eval trace as its parent. Inside a quaxified
function (`jax.jit(jax.shard_map(g, ...))(t)`), the chain of parents from `g`'s trace
would then miss the quax trace (`quax._transform._trace.active_trace`): a value that
`g` builds would be neither staged nor joined (see `quax._dispatch._staged`), and its
operator would run in a quax trace of its own, taking `g`'s tracers for plain arrays,
and give a value of values. Here those methods run with their trace current.

The wrapper's frame is left out of the source locations JAX records, so that a plain
program's compiled metadata is the same with quax imported.
"""

import functools as ft
from collections.abc import Callable
from typing import Any

from .._compat import (
    BODY_TRACING_METHODS,
    hide_from_source_info,
    set_current_trace,
    set_staging_method,
    staging_method,
)


__all__: list[str] = []


def _nested_in_staging_trace(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` of a `DynamicJaxprTrace`, one of `BODY_TRACING_METHODS`, run with
    that trace current, so that the sub-function's trace has it as its parent."""

    @ft.wraps(method)
    def nested(trace: Any, *args: Any, **kwargs: Any) -> Any:
        with set_current_trace(trace):
            return method(trace, *args, **kwargs)

    return nested


hide_from_source_info(__file__)
for _name in BODY_TRACING_METHODS:
    set_staging_method(_name, _nested_in_staging_trace(staging_method(_name)))
