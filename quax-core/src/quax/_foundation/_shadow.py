"""The published `quax` distribution installed beside quax-core.

Both distributions provide the package `quax`. Clients of the published quax
(unxt, quaxed) require the distribution `quax>=...`, so a plain
`pip install quax-core unxt` installs it too, and whichever was installed last owns
the package's files: the user then runs the published quax, or a mixture of both,
without knowing. Quax-core says so at import and in `python -m quax families`; the
README ("Running clients of the published quax") gives the ways to install clients
without it.
"""

import importlib.metadata
import warnings
from collections.abc import Callable
from typing import Any


__all__ = ["QuaxShadowWarning", "shadowing_message", "warn_if_shadowed"]


class QuaxShadowWarning(UserWarning):
    """The published `quax` distribution is installed beside quax-core."""


def shadowing_message(
    distribution: Callable[[str], Any] = importlib.metadata.distribution,
) -> str | None:
    """What to tell the user when the published `quax` distribution is installed,
    else `None`.

    **Arguments:**

    - `distribution`: how to look a distribution up by name (for tests).

    **Returns:**

    The message, or `None`.
    """
    try:
        published = distribution("quax")
    except importlib.metadata.PackageNotFoundError:
        return None
    return (
        f"The distribution `quax` {published.version} (the published quax) is "
        "installed beside quax-core. Both provide the package `quax`, and the one "
        "installed last owns its files, so you may be running the published quax or "
        "a mixture of both. Uninstall both and reinstall quax-core "
        "(`pip uninstall -y quax quax-core && pip install quax-core`); install "
        "clients that require `quax>=...` (unxt, quaxed) with `pip install "
        "--no-deps` and a constraints file, or with uv's `override-dependencies` "
        "(see quax-core's README, 'Running clients of the published quax')."
    )


def warn_if_shadowed() -> None:
    """Warn (`QuaxShadowWarning`) when the published `quax` distribution is
    installed beside quax-core."""
    message = shadowing_message()
    if message is not None:
        warnings.warn(message, QuaxShadowWarning, stacklevel=2)
