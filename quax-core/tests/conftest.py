"""quax-core's tests under the caches' verify mode (`QUAX_VERIFY_CACHES=1`): tests
marked `caching_behaviour` run with verify mode off. Every test compiles an eager
program on a key's second call."""

from collections.abc import Iterator
from typing import Any

import pytest
import quax
import quax._caching._eager
import quax._foundation._caches


@pytest.fixture(autouse=True)
def _programs_on_second_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Users' calls compile once the calls of a key after its first have taken as
    long as a compile (`quax._caching._eager.COMPILE_AFTER`), which few tests reach:
    here a key's second call compiles, so that every test calling twice runs a
    compiled program (and verify mode checks it). The cold path's own tests
    (`test_eager.py`) set it back."""
    monkeypatch.setattr(quax._caching._eager, "COMPILE_AFTER", 0.0)


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


@pytest.fixture
def verifying(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Verify mode on, from empty caches (for a test of verify mode itself)."""
    monkeypatch.setattr(quax._foundation._caches, "verifying", True)
    quax._foundation._caches.invalidate()
    yield
    quax._foundation._caches.invalidate()
