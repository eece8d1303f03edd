"""Host callbacks on a TPU: every place of a program gets channels of its own.

JAX lowers a host callback (`jax.pure_callback`, `io_callback`, `jax.debug.print`) for
a TPU as send and receive operations on host-transfer channels, numbered once, when the
callback is lowered. JAX's lowering also reuses what it lowered before:

- the lowering of an equation of a cacheable primitive (`custom_linear_solve`, `cond`,
  `while`, `scan`, `checkpoint`) serves every later equation of the same primitive with
  the same parameters and input types;
- the function of a `jit` body, or of a called jaxpr, is lowered once and called at
  every place.

A callback inside a reused lowering then runs at two places of one program on the same
channels, and the TPU runtime hands one callback the operands that another sent. Plain
JAX 0.10.2 on a TPU v5e (2026-12-07): `jax.jit` of the JVP of a `custom_linear_solve`
whose solve is a host callback, after another callback (a factorisation on the host),
gave `[10, 10]` for `[2.5, 1.75]` with no error; JAX binds the solve twice there (the
primal and the tangent), and the second reused the first's lowering. Every sparse
solve of quax-sparse on a TPU took that path (`jnp.linalg.solve` of a `BCOO` under
`jax.jvp`, `jax.grad`).

Here JAX's lowering is told not to reuse a lowering that lowered a callback for a TPU:
each place lowers its callbacks again, on channels of its own. A lowering without such
a callback is reused as before, and on every other platform (a callback there is a
call by address, with no channel) nothing changes. Installed at `import quax`, since a
plain JAX program gets the same wrong results (`docs/architecture.md`, "What quax
changes in JAX").
"""

import threading
from typing import Any

from .._compat import (
    forget_called_jaxpr,
    forget_equation_lowering,
    forget_jit_body,
    wrap_called_jaxpr_lowering,
    wrap_equation_lowering_miss,
    wrap_jit_lowering,
    wrap_tpu_callback_lowering,
)


__all__ = ["tpu_callbacks_lowered"]

# How many host callbacks this thread has lowered for a TPU. A module is lowered in
# one thread, so a lowering's callbacks are the growth of its thread's count.
_lowered = threading.local()


def tpu_callbacks_lowered() -> int:
    """How many host callbacks the current thread has lowered for a TPU."""
    return getattr(_lowered, "count", 0)


def _count(emit: Any) -> Any:
    """JAX's lowering of a host callback for a TPU, counted."""

    def emit_counted(*args: Any, **kwargs: Any) -> Any:
        _lowered.count = tpu_callbacks_lowered() + 1
        return emit(*args, **kwargs)

    return emit_counted


def _equation_afresh(miss: Any) -> Any:
    """An equation's lowering, not kept for the module's next equation of the same
    primitive, parameters and input types where it lowered a TPU callback."""

    def lower_equation(
        ctx: Any, eqn: Any, cache_key: Any, *args: Any, **kw: Any
    ) -> Any:
        before = tpu_callbacks_lowered()
        entry = miss(ctx, eqn, cache_key, *args, **kw)
        if tpu_callbacks_lowered() != before:
            forget_equation_lowering(ctx, cache_key)
        return entry

    return lower_equation


def _called_jaxpr_afresh(lower: Any) -> Any:
    """A called jaxpr's function, not kept for the module's next call of it where
    it lowered a TPU callback."""

    def lower_called_jaxpr(
        ctx: Any,
        fn_name: Any,
        call_jaxpr: Any,
        num_const_args: int,
        effects: Any,
        *args: Any,
        **kw: Any,
    ) -> Any:
        before = tpu_callbacks_lowered()
        func = lower(ctx, fn_name, call_jaxpr, num_const_args, effects, *args, **kw)
        if tpu_callbacks_lowered() != before:
            forget_called_jaxpr(ctx, fn_name, call_jaxpr, effects)
        return func

    return lower_called_jaxpr


def _jit_afresh(rule: Any) -> Any:
    """A `jit` body's function, not kept for the module's next `jit` of the same
    body where it lowered a TPU callback."""

    def lower_jit(ctx: Any, *args: Any, jaxpr: Any, **params: Any) -> Any:
        before = tpu_callbacks_lowered()
        out = rule(ctx, *args, jaxpr=jaxpr, **params)
        if tpu_callbacks_lowered() != before:
            forget_jit_body(ctx.module_context, jaxpr)
        return out

    return lower_jit


wrap_tpu_callback_lowering(_count)
wrap_equation_lowering_miss(_equation_afresh)
wrap_called_jaxpr_lowering(_called_jaxpr_afresh)
wrap_jit_lowering(_jit_afresh)
