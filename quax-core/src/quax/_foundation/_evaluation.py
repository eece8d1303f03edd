"""What evaluating a jaxpr reads of an equation, and how many jaxprs quax evaluates.

Two things evaluate the equations of a jaxpr on values: the jaxpr interpreter
(`quax._transform._interpreter`), and, while a program is staged, the replayed
recordings of what rules staged before (`quax._caching._replay`). Both read the same
facts of an equation: whether its primitive runs host code (`HOST_CALLBACKS`), whether
its params hold a jaxpr (`calls_jaxpr`), and whether it binds as `Primitive.bind`
does by default (`binds_directly`); and both count into the same reports
(`track_evaluations`), a replay of a body standing in for its evaluation.
"""

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

from .._compat import (
    ClosedJaxpr,
    Jaxpr,
    Primitive,
    debug_callback_p,
    debug_print_p,
    io_callback_p,
    pure_callback_p,
)


__all__ = [
    "HOST_CALLBACKS",
    "EvaluationReport",
    "binds_directly",
    "calls_jaxpr",
    "evaluations",
    "track_evaluations",
]

# Host code runs when the program does, never at trace time (`eqx.error_if`'s error
# branch raises from a `pure_callback` on constant inputs).
HOST_CALLBACKS = frozenset(
    {pure_callback_p, io_callback_p, debug_callback_p, debug_print_p}
)


def calls_jaxpr(params: dict[str, Any]) -> bool:
    """Whether a primitive's `params` hold a jaxpr (closed or open)."""
    return any(isinstance(p, ClosedJaxpr | Jaxpr) for p in params.values())


def binds_directly(primitive: Primitive) -> bool:
    """Whether `primitive` binds as `Primitive.bind` does by default: then, on valid
    tracers, outside `shard_map`, with no sub-jaxpr `is_high`, `bind`'s checks
    change nothing, and the interpreter skips them."""
    cls = type(primitive)
    return (
        cls.bind is Primitive.bind
        and cls.bind_with_trace is Primitive.bind_with_trace
        and cls.is_high is Primitive.is_high
        and not {"bind", "bind_with_trace", "is_high"} & vars(primitive).keys()
    )


# Counting evaluations ----------------------------------------------------------------


@dataclasses.dataclass
class EvaluationReport:
    """How many jaxprs (bodies of higher-order primitives, inlined `jit`s) quax
    evaluated on values in a block: each is one re-trace of a body."""

    total: int = 0


class _Evaluations(threading.local):
    reports: list[EvaluationReport]

    def __init__(self) -> None:
        self.reports = []


# The reports open in this thread, each counting every evaluation (see
# `track_evaluations`).
evaluations = _Evaluations()


@contextlib.contextmanager
def track_evaluations() -> Iterator[EvaluationReport]:
    """Count the jaxprs quax evaluates inside the block, in this thread.

    JAX traces a loop's or a branch's body once into a jaxpr; quax evaluates that
    jaxpr on the values once per branch or function, plus once per round of type
    joins. This counts those evaluations (benchmarks use it to measure re-traces).

    ```python
    with quax.plugins.track_evaluations() as report:
        quax.quaxify(f)(x)
    print(report.total)
    ```

    **Returns:**

    A [`quax.plugins.EvaluationReport`][], filled in as the block runs.
    """
    report = EvaluationReport()
    evaluations.reports.append(report)
    try:
        yield report
    finally:
        evaluations.reports.remove(report)
