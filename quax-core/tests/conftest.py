"""quax-core's tests under the caches' verify mode (`QUAX_VERIFY_CACHES=1`): tests
marked `caching_behaviour` run with verify mode off."""

from collections.abc import Iterator

import pytest
import quax
import quax._foundation._caches


@pytest.fixture(autouse=True)
def _caches_as_users_have_them(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A test marked `caching_behaviour` observes the caches themselves (that a
    recording was replayed, how many programs were compiled, how often a rule ran, a
    table's size). Verify mode recomputes every hit by design, which changes exactly
    that, so such a test runs with verify mode off, from empty caches. Verify mode's
    own tests (`test_caches.py`) turn it on themselves."""
    caches = quax._foundation._caches
    if request.node.get_closest_marker("caching_behaviour") and caches.verifying:
        monkeypatch.setattr(caches, "verifying", False)
        caches.invalidate()
        yield
        caches.invalidate()
    else:
        yield
