"""`cache_eager_primitive_programs`: what a family's test suite runs once, in its
`conftest.py`, to run fast under JAX's tracer-leak check."""

import functools as ft
from typing import Any

from .._compat import (
    eager_primitive_compiler,
    set_eager_primitive_compiler,
    trace_context,
)
from .._dispatch._registry import _jit_generation


__all__ = ["cache_eager_primitive_programs"]

# The count of registered rules (quax's part of JAX's trace context) under which
# primitives applied outside a trace are compiled and run.
_HELD_GENERATION = -1


def cache_eager_primitive_programs(size: int = 4096) -> None:
    """Keep the compiled program of each primitive applied outside a trace, as JAX
    keeps it without `jax_check_tracer_leaks`, for test suites that run with the
    check on.

    Under the leak check JAX stops caching these programs (one per primitive and
    parameters), so every `jnp` call of a test's references is compiled anew. The
    cache is put back, keyed by JAX's trace context, the primitive and its concrete
    parameters, as JAX keys it: its programs hold no tracers, so the leak check
    reports the same tracers. The count of rules registered, which quax adds to
    JAX's trace context (so that a `jax.jit` traced before a registration is traced
    again after it), is held at one value while a program is compiled and run: a
    primitive applied outside a trace runs no rule (quax's rules run inside
    `quaxify` only), so its program is the same before and after a registration,
    and a suite that registers rules (as `quax.testing.assert_thread_safe` does,
    thousands of times) does not compile every primitive again after each. Call it
    once, from the suite's `conftest.py`:

    ```python
    jax.config.update("jax_check_tracer_leaks", True)
    quax.testing.cache_eager_primitive_programs()
    ```

    Where JAX keeps no such cache to replace, it does nothing.

    **Arguments:**

    - `size`: the most programs kept (the least recently used go first).

    **Returns:**

    Nothing.
    """
    compile = eager_primitive_compiler()
    if compile is None:
        return

    @ft.lru_cache(size)
    def cached(context: Any, primitive: Any, **params: Any) -> Any:
        program = compile(primitive, **params)

        def run(*args: Any) -> Any:
            # JAX's `jit` of the primitive keys its own caches on the trace context
            # too: it runs with the count held as it was keyed.
            with _jit_generation(_HELD_GENERATION):
                return program(*args)

        return run

    def compile_cached(primitive: Any, **params: Any) -> Any:
        with _jit_generation(_HELD_GENERATION):
            context = trace_context()
        return cached(context, primitive, **params)

    set_eager_primitive_compiler(compile_cached)
