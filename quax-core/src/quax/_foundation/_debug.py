"""The debug-checks flag, `quax.set_debug_checks`: read by the transform (each rule's
output is checked against the primitive's abstract evaluation), by declared avals
(each is compared with the type's own `aval`) and by every cache's key (see
`quax._caching._keys`). It lives at the bottom so that each of those layers reads it
from below."""

import contextvars
import os
from collections.abc import Callable


__all__ = ["is_enabled", "set_debug_checks"]

# Whether the debug checks run, in each context (a thread starts from the
# environment's setting); set only by `set_debug_checks`.
_enabled = contextvars.ContextVar(
    "quax_debug_checks",
    default=os.environ.get("QUAX_DEBUG_CHECKS", "") not in ("", "0"),
)

# Whether the debug checks run in this context, read on every primitive:
# `_enabled.get`, bound once, so that `is_enabled()` is one C call.
is_enabled: Callable[[], bool] = _enabled.get


def set_debug_checks(enabled: bool) -> None:
    """Check every rule's output against the primitive's abstract evaluation.

    When enabled, a rule whose output shape or dtype disagrees with what JAX expects
    from the primitive raises an error naming the rule. It costs one abstract
    evaluation per primitive at trace time, so it is off unless turned on here or with
    the environment variable `QUAX_DEBUG_CHECKS=1`.

    The setting belongs to the context that sets it, as NumPy's `np.seterr` does (a
    `contextvars.ContextVar`): this thread, and the asyncio tasks it starts
    afterwards. Other threads keep their own; a new thread starts from the
    environment's setting.

    **Arguments:**

    - `enabled`: whether to check.

    **Returns:**

    Nothing.
    """
    _enabled.set(bool(enabled))
