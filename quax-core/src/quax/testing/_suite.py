"""`cache_eager_primitive_programs`: what a family's test suite runs once, in its
`conftest.py`, to run fast under JAX's tracer-leak check."""

import functools as ft
from typing import Any

from .._compat import (
    eager_primitive_compiler,
    set_eager_primitive_compiler,
    trace_context,
)


__all__ = ["cache_eager_primitive_programs"]


def cache_eager_primitive_programs(size: int = 4096) -> None:
    """Keep the compiled program of each primitive applied outside a trace, as JAX
    keeps it without `jax_check_tracer_leaks`, for test suites that run with the
    check on.

    Under the leak check JAX stops caching these programs (one per primitive and
    parameters), so every `jnp` call of a test's references is compiled anew. The
    cache is put back, keyed by JAX's trace context, the primitive and its concrete
    parameters, as JAX keys it: its programs hold no tracers, so the leak check
    reports the same tracers. Call it once, from the suite's `conftest.py`:

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
        return compile(primitive, **params)

    def compile_cached(primitive: Any, **params: Any) -> Any:
        return cached(trace_context(), primitive, **params)

    set_eager_primitive_compiler(compile_cached)
