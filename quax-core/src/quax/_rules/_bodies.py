"""The inner jaxprs of higher-order primitives as quaxified functions, and the
branch indices and loop predicates they decide on, for the rules of
`_control_flow.py` and `_loops.py`."""

import contextlib
import functools as ft
import weakref
from collections.abc import Callable
from typing import Any

from .._caching._jaxpr import eval_quaxified
from .._compat import ClosedJaxpr
from .._dispatch._staged import jaxpr_holds_staged_values, staged_values_into
from .._transform import _trace
from .._transform._quaxify import quaxify
from .._values._value import ValueLike, materialise_or_explain


__all__ = ["decision", "quaxified_jaxpr"]

_eval_cache: "weakref.WeakKeyDictionary[Any, Callable[..., list[Any]]]" = (
    weakref.WeakKeyDictionary()
)


def quaxified_jaxpr(jaxpr: Any) -> Callable[..., list[Any]]:
    """A quaxified function evaluating `jaxpr` (closed or open), cached per jaxpr so
    that JAX's own tracing caches hit when the same jaxpr comes back. A jaxpr that
    stages values (see `quax._dispatch._staged`) runs under a quax trace even on plain
    inputs, as only one gives those values their types."""
    try:
        return _eval_cache[jaxpr]
    except (KeyError, TypeError):
        pass
    if isinstance(jaxpr, ClosedJaxpr):
        fn = ft.partial(eval_quaxified, jaxpr.jaxpr, jaxpr.consts)
    else:
        fn = ft.partial(eval_quaxified, jaxpr, ())
    if jaxpr_holds_staged_values(jaxpr):
        out = ft.partial(_run_staging, fn)
    else:
        out = quaxify(fn)
    with contextlib.suppress(TypeError):  # unhashable jaxprs are not cached
        _eval_cache[jaxpr] = out
    return out


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
