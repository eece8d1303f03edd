"""`assert_thread_safe`: a quaxified function called from many threads at once gives
what it gives in one, while rules are registered meanwhile."""

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.extend.core as jexc
import jax.tree_util as jtu
import numpy as np

from .._dispatch._registry import register
from .._foundation._journal import temporarily
from .._transform._quaxify import quaxify
from .._values._value import ArrayValue, is_value
from ._dense import densify as _densify


__all__ = ["assert_thread_safe"]


class _Unrelated(ArrayValue):
    """A value type that no program meets: `assert_thread_safe` registers rules for
    it while the threads run, which must change no result."""

    array: Any

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Any:
        return self.array


def _primitives(jaxpr: Any) -> Iterator[Any]:
    """Every primitive `jaxpr` binds, its sub-jaxprs' included."""
    for eqn in jaxpr.eqns:
        yield eqn.primitive
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                if isinstance(sub, jexc.ClosedJaxpr):
                    yield from _primitives(sub.jaxpr)
                elif isinstance(sub, jexc.Jaxpr):
                    yield from _primitives(sub)


def _register_unrelated(primitive: Any) -> None:
    @register(primitive)
    def _(x: _Unrelated, *rest: Any, **params: Any) -> Any:
        raise AssertionError("a rule for a type no program meets was called")


def _outcome(out: Any, densify: Callable[[Any], Any]) -> tuple[Any, list[Any]]:
    """What two calls must agree on: the output's structure (value types and their
    static fields included) and its dense arrays."""
    structure = jtu.tree_structure(out, is_leaf=is_value)
    return structure, [np.asarray(x) for x in jtu.tree_leaves(densify(out))]


def _same(a: tuple[Any, list[Any]], b: tuple[Any, list[Any]]) -> bool:
    return (
        a[0] == b[0]
        and len(a[1]) == len(b[1])
        and all(
            x.shape == y.shape
            and x.dtype == y.dtype
            and np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")
            for x, y in zip(a[1], b[1], strict=True)
        )
    )


def assert_thread_safe(
    fn: Callable[..., Any],
    *args: Any,
    threads: int = 8,
    calls: int = 4,
    densify: Callable[[Any], Any] = _densify,
) -> None:
    """Check that `quax.quaxify(fn)` gives, called from many threads at once, what
    it gives in one thread, eagerly and under `jax.jit`, while another thread keeps
    registering rules.

    ```python
    quax.testing.assert_thread_safe(lambda x, y: x @ y + 1, MyValue(...), y)
    ```

    First `quax.quaxify(fn)(*args)` and its `jax.jit` (non-array leaves static, as
    `eqx.filter_jit` holds them) run once each, in this thread: the references.
    Then `threads` threads start together, and each calls both `calls` times. All
    the while another thread registers, over and over, a rule for every primitive
    `fn` binds, for a value type of its own that no call meets: each registration
    invalidates what quax derived from dispatch (its caches), which the calls then
    rebuild concurrently, but no result may change. Python switches threads every
    microsecond meanwhile, to interleave them finely. The rules are taken back at
    the end.

    Every call must return the reference's structure (value types and static
    fields) and, densified, the same arrays bit for bit (NaN where the reference
    has NaN), and raise nothing.

    **Arguments:**

    - `fn`: a function of arrays (it need not know about quax).
    - `*args`: its arguments: pytrees of arrays and [`quax.Value`][]s.
    - `threads`: how many threads call it at once.
    - `calls`: how many times each thread calls it, eagerly and jitted each time.
    - `densify`: how outputs are densified to compare them (default
        [`quax.testing.densify`][]).

    **Returns:**

    Nothing.

    **Raises:**

    `AssertionError` naming the first calls that raised or differed.
    """
    eager = quaxify(fn)
    jitted = eqx.filter_jit(quaxify(fn))
    references = {
        "eager": _outcome(eager(*args), densify),
        "jit": _outcome(jitted(*args), densify),
    }
    dynamic, static = eqx.partition(densify(args), eqx.is_array)
    jaxpr = jax.make_jaxpr(lambda *d: fn(*eqx.combine(d, static)))(*dynamic)
    primitives = list(dict.fromkeys(_primitives(jaxpr.jaxpr)))

    failures: list[str] = []
    start = threading.Barrier(threads + 1)
    done = threading.Event()

    def work(i: int) -> None:
        start.wait()
        for n in range(calls):
            for kind, call in (("eager", eager), ("jit", jitted)):
                try:
                    got = _outcome(call(*args), densify)
                except Exception as e:
                    failures.append(
                        f"thread {i}, {kind} call {n} raised {type(e).__name__}: {e}"
                    )
                    continue
                if not _same(got, references[kind]):
                    failures.append(
                        f"thread {i}, {kind} call {n} differs from the "
                        f"single-threaded call: {got[0]} vs {references[kind][0]}"
                    )

    def keep_registering() -> None:
        # Taken back when done (what a thread registers is its own to take back).
        with temporarily():
            start.wait()
            while not done.is_set():
                for primitive in primitives:
                    _register_unrelated(primitive)

    interval = sys.getswitchinterval()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    registering = threading.Thread(target=keep_registering)
    sys.setswitchinterval(1e-6)
    try:
        registering.start()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        done.set()
        registering.join()
        sys.setswitchinterval(interval)
    if failures:
        shown = "\n  ".join(failures[:5])
        raise AssertionError(
            f"{len(failures)} of {threads * calls * 2} concurrent calls of "
            f"quaxify({getattr(fn, '__name__', fn)}) raised or differed from the "
            f"single-threaded ones, e.g.:\n  {shown}"
        )
