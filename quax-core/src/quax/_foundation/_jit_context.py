"""The families' `jax.jit`-cache-sensitive settings (`quax.plugins.jit_context`).

A family's own `jax.jit`-cache-sensitive settings are made with `jit_context`, not
`jax.make_user_context`: each of the latter adds a value to JAX's trace context when it
is made, so a family that made one as it loaded inside a `jax.jit` (a first quaxified
call there) would change that `jit`'s cache key between its first call and the next,
and its second call would trace and compile again. Every `jit_context` lives in one
JAX context made at `import quax`, which holds only the settings set away from their
defaults: making one changes no key. A family whose load grows JAX's trace context
anyway is reported with a `PluginWarning` that names it and `jit_context`.
"""

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import jax


__all__ = ["JitContext", "jit_context"]


# The values of every `JitContext` set away from its default, as a tuple of
# `(index, type, value)` triples sorted by index (the type too, as JAX compares keys
# by `==`, under which `1`, `1.0` and `True` are one): one `jax.jit`-cache-sensitive
# context made at `import quax`, so that a `JitContext` made later (a family loading
# inside a `jax.jit`) adds nothing to JAX's trace context.
_jit_contexts: Any = jax.make_user_context(default_value=())
_jit_context_indices = itertools.count()


class JitContext:
    """A setting that JAX's caches key on, as one made with `jax.make_user_context`
    (a `jax.jit` traced under one value is traced, lowered and compiled again under
    another), which making adds nothing to JAX's trace context: made with
    [`quax.plugins.jit_context`][].

    `ctx.value` reads it; `with ctx(value): ...` sets it in this thread inside the
    block.
    """

    __slots__ = ("_default", "_index")

    def __init__(self, default: Any) -> None:
        self._default = default
        self._index = next(_jit_context_indices)

    @property
    def value(self) -> Any:
        """The current value: the innermost `with ctx(value)` of this thread, or the
        default outside any."""
        for index, _, value in _jit_contexts.value:
            if index == self._index:
                return value
        return self._default

    def __call__(self, value: Any) -> contextlib.AbstractContextManager[None]:
        """A context manager that sets the value to `value` inside its block (in
        this thread).

        **Arguments:**

        - `value`: the value, hashable (it joins JAX's cache keys).

        **Returns:**

        The context manager.
        """
        hash(value)  # refused here rather than in the next `jax.jit`'s key
        return self._set(value)

    @contextlib.contextmanager
    def _set(self, value: Any) -> Iterator[None]:
        # The other contexts' values as they are when the block is entered.
        with _jit_contexts(self._with(_jit_contexts.value, value)):
            yield

    def _with(self, values: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
        """`values` (the triples of `_jit_contexts`) with this context's set to
        `value`, or left out where `value` is the default (of its type and equal:
        the key outside any block is then the same)."""
        others = [entry for entry in values if entry[0] != self._index]
        if type(value) is not type(self._default) or value != self._default:
            others.append((self._index, type(value), value))
            others.sort(key=_first)
        return tuple(others)


def _first(entry: tuple[Any, ...]) -> int:
    return entry[0]


def jit_context(default: Any) -> JitContext:
    """Make a setting that JAX's caches key on, for a family: a `jax.jit` traced
    under one value of it is traced, lowered and compiled again under another, as
    with `jax.make_user_context`, and quax's own caches key on it too (through JAX's
    trace context).

    Use it in place of `jax.make_user_context` in a family's code: making one of
    those adds a value to JAX's trace context, so that when the family loads inside
    a `jax.jit` (the program's first quaxified call is there), that `jit`'s next
    call finds its cache key changed and traces and compiles it again. Making a
    `jit_context` changes no key: every one lives in a single JAX context made at
    `import quax`, which holds only the settings set away from their defaults.

    ```python
    route = quax.plugins.jit_context("double")
    f = jax.jit(lambda x: 2 * x if route.value == "double" else 3 * x)
    f(1.0)  # 2.0
    with route("triple"):
        f(1.0)  # 3.0: traced again, for this value
    route.value  # "double" again outside the block
    ```

    **Arguments:**

    - `default`: the value outside any `with ctx(value)` block, hashable.

    **Returns:**

    A [`quax.plugins.JitContext`][].
    """
    hash(default)
    return JitContext(default)
