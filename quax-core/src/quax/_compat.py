"""Every access to JAX's private API, in one place.

A JAX upgrade should touch this file and no other. The rest of quax imports the names
below rather than reaching into `jax._src` itself.
"""

from typing import Any

import jax
import jax.extend.core as jexc
import jax.extend.core.primitives as jprim
from jax._src import core as _core
from jax._src.debugging import debug_callback_p, debug_print_p
from jax._src.lax.lax import optimization_barrier_p
from jax._src.interpreters import ad as _ad


__all__ = [
    "ClosedJaxpr",
    "Primitive",
    "ShapedArray",
    "Trace",
    "TraceTag",
    "Tracer",
    "clean_trace_state",
    "cond_p",
    "custom_jvp_call_p",
    "custom_vjp_call_p",
    "debug_callback_p",
    "debug_print_p",
    "eval_jaxpr",
    "jit_p",
    "optimization_barrier_p",
    "linear_solve_p",
    "pure_callback_p",
    "remat_p",
    "scan_p",
    "set_current_trace",
    "take_current_trace",
    "typeof",
    "while_p",
]

# Trace machinery.
Trace = _core.Trace
Tracer = _core.Tracer
TraceTag = jexc.TraceTag
take_current_trace = jexc.take_current_trace
set_current_trace = jexc.set_current_trace
typeof = jax.typeof
ShapedArray = jax.core.ShapedArray
ClosedJaxpr = jexc.ClosedJaxpr
Primitive = jexc.Primitive
eval_jaxpr = _core.eval_jaxpr

# Higher-order primitives that quax-core gives rules for.
jit_p = jprim.jit_p
cond_p = jprim.cond_p
while_p = jprim.while_p
scan_p = jprim.scan_p
remat_p = jprim.remat_p
linear_solve_p = jprim.linear_solve_p
custom_jvp_call_p = jprim.custom_jvp_call_p
custom_vjp_call_p = jprim.custom_vjp_call_p
from jax._src.callback import pure_callback_p  # noqa: E402


def clean_trace_state() -> bool:
    """Whether no trace is active (used by tests to check for leaks)."""
    return _core.trace_state_clean()


def zeros_like_aval(aval: Any) -> Any:
    """A dense zero of the given abstract value (used to materialise symbolic zeros)."""
    return _ad.zeros_like_aval(aval)


def ensure_no_leaks(trace: Any) -> Any:
    """JAX's leak check for a finished trace (active under `JAX_CHECK_TRACER_LEAKS`)."""
    return _core.ensure_no_leaks(trace)


def is_unspecified(sharding: Any) -> bool:
    """Whether a jit sharding parameter is JAX's 'unspecified' sentinel."""
    from jax._src.sharding_impls import UnspecifiedValue

    return isinstance(sharding, UnspecifiedValue)
