"""What quax works out once per jaxpr, and the first of those tables: whether a jaxpr
stages a value.

A function of a jaxpr's equations alone (the interpreter's steps, the quaxified
function of a higher-order primitive's body, the registered function a `jit` body
is) is worked out once and kept in a `Table` under the jaxpr's key
(`per_jaxpr`), which holds the jaxpr weakly, so that the entry goes with it.
"""

import operator
from collections.abc import Callable
from typing import Any, TypeVar

from .._compat import ClosedJaxpr, Jaxpr
from .._dispatch._staged import staged_value_p
from .._foundation import _caches
from .._foundation._caches import Table
from ._keys import JAXPR, jaxpr_key


__all__ = [
    "MAX_JAXPRS",
    "holds_staged_values",
    "jaxpr_holds_staged_values",
    "per_jaxpr",
]

# How many jaxprs each table of what is worked out once per jaxpr keeps (beyond it,
# the oldest is dropped, and worked out again when it comes back).
MAX_JAXPRS = 4096

_T = TypeVar("_T")
_MISSING: Any = object()


def per_jaxpr(
    table: Table,
    jaxpr: Any,
    compute: Callable[[Any], _T],
    same: Callable[[_T, _T], bool],
    what: str,
) -> _T:
    """`compute(jaxpr)`, kept in `table` while the caches are on (`quax.caching`),
    under the key of `jaxpr` (see `quax._caching._keys.jaxpr_key`). In verify mode
    a hit is computed afresh, and raises a `quax.CacheMismatchError` when `same`
    tells the two apart (`what` says what was compared).

    **Arguments:**

    - `table`: where the entries are kept.
    - `jaxpr`: the jaxpr (closed or open) `compute` reads.
    - `compute`: a function of the jaxpr alone.
    - `same`: whether a kept and a fresh result agree.
    - `what`: what `same` compares, for the error.

    **Returns:**

    `compute(jaxpr)`, or the result it gave before for this jaxpr.
    """
    if not _caches.is_enabled():
        return compute(jaxpr)
    try:
        key, parts = jaxpr_key(jaxpr)
    except TypeError:  # a jaxpr that is not weakly referable: not kept
        return compute(jaxpr)
    if not _caches.verifying:
        # A hit, read here rather than through `remembered` (which checks the
        # switch again): this runs twice on every inlined `jit` run equation by
        # equation.
        out = table.get(key, _MISSING)
        if out is not _MISSING:
            return out
    return _caches.remembered(
        table, key, JAXPR, parts, lambda: compute(jaxpr), what, same, jaxpr
    )


# Jaxprs that hold staged values -------------------------------------------------------

_holds = Table("jaxprs: whether each stages a value", MAX_JAXPRS)


def holds_staged_values(params: dict[str, Any]) -> bool:
    """Whether the sub-jaxprs among a primitive's `params` stage a value (see
    `quax._dispatch._staged`)."""
    return any(_param_holds(p) for p in params.values())


def jaxpr_holds_staged_values(jaxpr: Any) -> bool:
    """Whether a closed or open jaxpr (or its sub-jaxprs) stages a value; kept per
    jaxpr. For a primitive whose only sub-jaxpr is known (an inlined `jit`'s
    `jaxpr`), this is `holds_staged_values` without a walk over every param."""
    return _jaxpr_holds(jaxpr.jaxpr if type(jaxpr) is ClosedJaxpr else jaxpr)


def _param_holds(p: Any) -> bool:
    if isinstance(p, ClosedJaxpr):
        return _jaxpr_holds(p.jaxpr)
    if isinstance(p, Jaxpr):
        return _jaxpr_holds(p)
    if isinstance(p, tuple):
        return any(_param_holds(x) for x in p)
    return False


def _jaxpr_holds(jaxpr: Any) -> bool:
    return per_jaxpr(
        _holds, jaxpr, _walk_holds, operator.eq, "whether it stages a value"
    )


def _walk_holds(jaxpr: Any) -> bool:
    return any(
        eqn.primitive is staged_value_p or holds_staged_values(eqn.params)
        for eqn in jaxpr.eqns
    )
