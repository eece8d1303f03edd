"""The debug-checks flag, `quax.set_debug_checks`: read by the transform (each rule's
output is checked against the primitive's abstract evaluation), by declared avals
(each is compared with the type's own `aval`) and by every cache's key (see
`quax._caching._keys`). It lives at the bottom so that each of those layers reads it
from below."""

import os


__all__ = ["enabled", "set_debug_checks"]

# Whether the debug checks run: read as `_debug.enabled` on every primitive (one
# attribute read), and set only by `set_debug_checks`.
enabled = os.environ.get("QUAX_DEBUG_CHECKS", "") not in ("", "0")


def set_debug_checks(enabled: bool) -> None:
    """Check every rule's output against the primitive's abstract evaluation.

    When enabled, a rule whose output shape or dtype disagrees with what JAX expects
    from the primitive raises an error naming the rule. It costs one abstract
    evaluation per primitive at trace time, so it is off unless turned on here or with
    the environment variable `QUAX_DEBUG_CHECKS=1`.

    **Arguments:**

    - `enabled`: whether to check.

    **Returns:**

    Nothing.
    """
    _set(enabled)


def _set(on: bool) -> None:
    global enabled
    enabled = bool(on)
