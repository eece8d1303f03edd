"""A refusal raised while JAX linearizes a `jit` under `JAX_CHECK_TRACER_LEAKS`.

`quax.quaxify(lambda v: jax.grad(lambda a: jnp.sin(Sealed(a)).sum())(v.array))`
builds a value from `grad`'s tracers inside `jnp.sin`'s own `jit`: the value is
staged there (see `quax._dispatch._staged`), and linearizing that `jit` meets the
staged value with a tangent, which quax refuses (a `NotImplementedError` saying what
to do). JAX 0.10 linearizes a `jit` in `jax._src.interpreters.ad._linearize_jaxpr`,
inside `core.set_current_trace(lin_trace, check_leaks=True)`; that context's
`__exit__` checks for leaked tracers also while an error propagates, when the
function's own frame still holds its `LinearizeTracer`s (its local `tracers`, and
`lin_trace`). So under the leak check every error raised in a rule it runs is
replaced by "Leaked trace LinearizeTrace", with the error as its `__context__`: a
plain JAX primitive whose `jvp` rule raises, under `jax.grad(jax.jit(f))`, gives the
same report. The leak is JAX's, not quax's: these tests pin quax's part (the
refusal, and that quax keeps no tracer of the failed linearization alive)."""

import gc
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import pytest
import quax
from jax import lax


X = jnp.arange(4.0).reshape(2, 2) / 4.0


class Sealed(quax.ArrayValue):
    """A value with no rules that refuses to materialise."""

    array: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> Any:
        raise quax.MaterialisationError("Refusing to materialise `Sealed`")


# Functions of a `Sealed` argument that differentiate a value built inside a `jit`
# from `grad`'s tracers.
PROGRAMS: dict[str, Callable[[Any], Any]] = {
    "grad": lambda v: jax.grad(lambda a: jnp.sin(Sealed(a)).sum())(v.array),
    "grad-jit": lambda v: jax.grad(jax.jit(lambda a: lax.sin(Sealed(a)).sum()))(
        v.array
    ),
    "jit-grad": lambda v: jax.jit(jax.grad(lambda a: jnp.sin(Sealed(a)).sum()))(
        v.array
    ),
    "linearize": lambda v: jax.linearize(lambda a: jnp.sin(Sealed(a)), v.array),
}


def _refusal(error: BaseException) -> BaseException:
    """The refusal `error` is, or the one JAX's leak report (see the module's
    docstring) replaced."""
    if isinstance(error, NotImplementedError):
        return error
    assert str(error).startswith("Leaked trace LinearizeTrace"), error
    assert error.__context__ is not None
    return error.__context__


def _live_tracers() -> int:
    gc.collect()
    return sum(isinstance(o, jax.core.Tracer) for o in gc.get_objects())


@pytest.mark.parametrize("program", PROGRAMS)
def test_refusal_without_the_leak_check(program: str) -> None:
    f = quax.quaxify(PROGRAMS[program])
    with (
        jax.check_tracer_leaks(False),
        pytest.raises(NotImplementedError, match="Build the value outside"),
    ):
        f(Sealed(X))


@pytest.mark.parametrize("program", PROGRAMS)
def test_refusal_under_the_leak_check_keeps_no_tracer(program: str) -> None:
    f = quax.quaxify(PROGRAMS[program])
    before = _live_tracers()
    with jax.check_tracer_leaks(True), pytest.raises(Exception) as info:
        f(Sealed(X))
    refusal = _refusal(info.value)
    assert isinstance(refusal, NotImplementedError)
    assert "Build the value outside" in str(refusal)
    # Once the error is dropped, nothing (no cache entry, recorded replay or kept
    # error of quax's) holds a tracer of the failed trace.
    del info, refusal
    assert _live_tracers() <= before
