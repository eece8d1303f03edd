"""The inner jaxprs of higher-order primitives as quaxified functions, and the
branch indices and loop predicates they decide on, for the rules of
`_control_flow.py` and `_loops.py`."""

import functools as ft
from collections.abc import Callable
from typing import Any

from .._caching._per_jaxpr import MAX_JAXPRS, jaxpr_holds_staged_values, per_jaxpr
from .._compat import ClosedJaxpr
from .._dispatch._staged import staged_values_into
from .._foundation._caches import Table
from .._transform import _trace
from .._transform._interpreter import eval_quaxified
from .._transform._quaxify import quaxify
from .._values._value import ValueLike, materialise_or_explain


__all__ = ["decision", "quaxified_jaxpr"]

# The quaxified function of each jaxpr: the same function for the same jaxpr, so that
# JAX's own tracing caches hit when a body comes back.
_functions = Table("quaxified bodies of higher-order primitives", MAX_JAXPRS)


def quaxified_jaxpr(jaxpr: Any) -> Callable[..., list[Any]]:
    """A quaxified function evaluating `jaxpr` (closed or open), kept per jaxpr so
    that JAX's own tracing caches hit when the same jaxpr comes back. A jaxpr that
    stages values (see `quax._dispatch._staged`) runs under a quax trace even on plain
    inputs, as only one gives those values their types."""
    return per_jaxpr(
        _functions, jaxpr, _quaxified, _same_evaluation, "the jaxpr it evaluates"
    )


def _quaxified(jaxpr: Any) -> Callable[..., list[Any]]:
    if isinstance(jaxpr, ClosedJaxpr):
        fn = ft.partial(eval_quaxified, jaxpr.jaxpr, jaxpr.consts)
    else:
        fn = ft.partial(eval_quaxified, jaxpr, ())
    if jaxpr_holds_staged_values(jaxpr):
        return ft.partial(_run_staging, fn)
    return quaxify(fn)


def _evaluates(fn: Any) -> tuple[Any, ...]:
    """The open jaxpr and constants that a function of `_quaxified` evaluates."""
    inner = fn.args[0] if isinstance(fn, ft.partial) else fn.fn
    return inner.args


def _same_evaluation(kept: Any, fresh: Any) -> bool:
    """Whether two functions of `_quaxified` run alike: the same way (staging or
    not), on the same jaxpr and constants (the same objects)."""
    a, b = _evaluates(kept), _evaluates(fresh)
    return (
        type(kept) is type(fresh)
        and len(a) == len(b)
        and all(x is y for x, y in zip(a, b, strict=True))
    )


def _run_staging(fn: Callable[..., list[Any]], *args: Any) -> list[Any]:
    def body(trace: _trace.QuaxTrace) -> list[Any]:
        with staged_values_into(trace):
            return fn(*[trace.wrap(a) for a in args])

    return _trace.run_nested(body)


def decision(x: ValueLike, what: str) -> Any:
    """A branch index or loop predicate as the plain array JAX decides on: a value
    there is materialised, or refused with an error naming the primitive."""
    return materialise_or_explain(
        x,
        lambda value: (
            f"{what} is a {value}: JAX decides on a plain array there, so quax must "
            "materialise it"
        ),
        "\nAllow the value to materialise (`allow_materialise=True` or "
        "`.enable_materialise()` where the type has it), or compute the decision "
        "from plain arrays (e.g. with `quax.quaxify` applied to a smaller function).",
    )
