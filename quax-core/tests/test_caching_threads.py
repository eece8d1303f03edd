"""`quax.caching`, `quax.set_eager_compilation` and `quax.set_debug_checks` hold in
the context that sets them (issue 45, item 14): two threads whose settings overlap
(A sets, B sets, A restores, B restores; forced in that order by events) each keep
their own, and leave the setting as it was. Each setting is observed through what it
changes: whether a trace replays a recording, whether an eager call runs compiled,
whether a rule's wrong output is caught."""

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import quax
from jax import lax

from .helpers import Dense, compiles_eager_programs


class Counted(Dense):
    """A `Dense` whose `sin` rule counts its runs."""


runs = threading.local()


@quax.register(lax.sin_p)
def _(x: Counted, **params: Any) -> Counted:
    runs.count = getattr(runs, "count", 0) + 1
    return Counted(lax.sin_p.bind(x.array, **params))


class Sloppy(Dense):
    """A `Dense` whose `cos` rule gives an output of the wrong shape."""


@quax.register(lax.cos_p)
def _(x: Sloppy, **params: Any) -> Sloppy:
    return Sloppy(lax.cos_p.bind(x.array[:1], **params))


X = jnp.arange(3.0, dtype=jnp.float32)


def _runs(f: Callable[[], Any]) -> int:
    """How many times the `sin` rule ran in `f()` (in this thread)."""
    before = getattr(runs, "count", 0)
    f()
    return runs.count - before if hasattr(runs, "count") else 0


def caches_on() -> bool:
    """Whether a second trace of one program replays the first one's recording,
    running no rule."""
    for _ in range(2):
        # A fresh function each time, so that JAX traces it again.
        n = _runs(lambda: jax.jit(quax.quaxify(lambda a: jnp.sin(a)))(Counted(X)))
    return n == 0


def compiling() -> bool:
    """Whether one of six eager calls of a library function runs its compiled
    program, running no rule (the third does, where nothing intervenes). Setting
    the switch in any thread drops every compiled program
    (`quax.set_eager_compilation`), and the other thread of the test below sets
    its own while this one observes: then the calls begin again (a first call, a
    compile), and a later one runs the program. With the switch off, every call
    runs the rule."""
    f = quax.quaxify(jnp.sin)
    return any(_runs(lambda: f(Counted(X))) == 0 for _ in range(6))


def checking() -> bool:
    """Whether a rule's output of the wrong shape is caught."""
    try:
        quax.quaxify(lax.cos)(Sloppy(X))
    except TypeError as e:  # the debug check's error names the rule's mistake
        assert "returned output 0 with aval float32[1]" in str(e), e
        return True
    return False


def _set_caching(on: bool) -> Callable[[], object]:
    block = quax.caching(on)
    block.__enter__()
    return lambda: block.__exit__(None, None, None)


def _set_compiling(on: bool) -> Callable[[], object]:
    previous = quax.set_eager_compilation(on)
    return lambda: quax.set_eager_compilation(previous)


def _set_checking(on: bool) -> Callable[[], object]:
    quax.set_debug_checks(on)
    return lambda: quax.set_debug_checks(not on)


SETTINGS = {
    "caching": (_set_caching, caches_on),
    "eager compilation": (_set_compiling, compiling),
    "debug checks": (_set_checking, checking),
}
# Each setting, as a test parameter: where the backend compiles no eager program (a
# TPU), eager compilation has no effect to observe.
SETTING_NAMES = [
    pytest.param(name, marks=compiles_eager_programs)
    if name == "eager compilation"
    else name
    for name in SETTINGS
]


def _in_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


@pytest.mark.caching_behaviour
@pytest.mark.parametrize("name", SETTING_NAMES)
def test_two_threads_overlapping_settings_keep_their_own(name: str) -> None:
    set_to, observe = SETTINGS[name]
    # Both threads start from the setting a new thread has, and flip it.
    initial = _in_thread(observe)
    here = observe()
    a_set, b_set, a_restored = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}
    errors: list[BaseException] = []

    def party(
        name: str,
        first: threading.Event | None,
        done_setting: threading.Event,
        then: threading.Event,
        done_restoring: threading.Event | None,
    ) -> Callable[[], None]:
        """A thread that waits for `first`, sets, signals `done_setting`, waits
        for `then`, observes, restores, signals `done_restoring`, observes."""

        def run() -> None:
            try:
                assert first is None or first.wait(60)
                restore = set_to(not initial)
                done_setting.set()
                assert then.wait(60)
                seen[f"{name} before restoring"] = observe()
                restore()
                if done_restoring is not None:
                    done_restoring.set()
                seen[f"{name} restored"] = observe()
            except BaseException as e:
                errors.append(e)
            finally:  # never leave the other thread waiting
                done_setting.set()
                if done_restoring is not None:
                    done_restoring.set()

        return run

    a = party("A", None, a_set, b_set, a_restored)
    b = party("B", a_set, b_set, a_restored, None)
    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # A observes while B's is set; B, after A restored its own.
    assert seen == {
        "A before restoring": not initial,
        "A restored": initial,
        "B before restoring": not initial,
        "B restored": initial,
    }
    # And afterwards, as before: in a new thread, and in this one.
    assert _in_thread(observe) is initial
    assert observe() is here


@pytest.mark.caching_behaviour
@pytest.mark.parametrize("name", SETTING_NAMES)
def test_a_setting_holds_in_its_own_thread_only(name: str) -> None:
    # While another thread holds the other setting, this one keeps its own.
    set_to, observe = SETTINGS[name]
    here = observe()
    held, done = threading.Event(), threading.Event()
    seen: list[bool] = []

    def elsewhere() -> None:
        restore = set_to(not here)
        try:
            seen.append(observe())
        finally:
            held.set()
            assert done.wait(60)
            restore()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    try:
        assert held.wait(60)
        assert observe() is here
    finally:
        done.set()
        thread.join()
    assert seen == [not here]
    assert observe() is here
