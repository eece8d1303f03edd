"""Cache keys hold everything about the inputs that a rule may read (issue 45, items 3
and 5): which input a repeated value or leaf aliases (a compiled eager program), and
the type of every operand, not only the first ones (the dispatch cache). Each case
after a call that fills the cache for a neighbouring key, against plain JAX and
`quax.resolve`, with the caches on, off and in verify mode."""

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._foundation._caches as quax_caches
from jax import lax
from jaxtyping import ArrayLike

from .helpers import Dense


@pytest.fixture(params=["on", "off", "verify"])
def mode(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The caches on, off, or in verify mode (every hit recomputed and compared),
    from empty caches."""
    monkeypatch.setattr(quax_caches, "verifying", request.param == "verify")
    quax_caches.invalidate()
    with quax.caching(request.param != "off"):
        yield request.param
    quax_caches.invalidate()


# Item 3: which input a repeated value aliases ----------------------------------------

A = jnp.ones(3, jnp.float32)
B = 2 * jnp.ones(3, jnp.float32)
digits = jax.jit(lambda x, y, z: 100 * x + 10 * y + z)


@pytest.mark.parametrize("shared", ["value", "leaf"])
def test_an_eager_program_keys_which_input_a_repeat_aliases(
    mode: str, shared: str
) -> None:
    # `(a, b, b)` until its program is compiled, then `(a, b, a)`: the third input
    # repeats the first, not the second (121, not 122). The same value twice, or
    # two values on one leaf.
    del mode
    previous = quax.set_eager_compilation(True)
    try:
        f = quax.quaxify(digits)
        a, b = Dense(A), Dense(B)
        again = (lambda v: v) if shared == "value" else (lambda v: Dense(v.array))
        for _ in range(3):  # the third call runs the compiled program
            out = f(a, b, again(b))
            np.testing.assert_array_equal(out.array, np.asarray(digits(A, B, B)))
            np.testing.assert_array_equal(out.array, [122.0] * 3)
        out = f(a, b, again(a))
        np.testing.assert_array_equal(out.array, np.asarray(digits(A, B, A)))
        np.testing.assert_array_equal(out.array, [121.0] * 3)
    finally:
        quax.set_eager_compilation(previous)


# Item 5: the type of every operand ---------------------------------------------------


class V(quax.ArrayValue):
    """The second operand of both keys."""

    array: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> jax.Array:
        return self.array


class W(V):
    """The third operand of the second key: it has rules of its own."""


# The rules that ran, in order.
ran: list[Callable[..., Any]] = []


def _plain(x: Any) -> Any:
    return x.array if isinstance(x, V) else x


def _rules_for(primitive: Any, bind: Callable[..., Any]) -> None:
    """Register two rules for `primitive` (`bind` applies it to arrays): one for
    `(Array, V, Array)`, which also computes with any third operand it is handed,
    and one for `(Array, V, W)`."""

    @quax.register(primitive)
    def with_array(first: ArrayLike, x: V, third: ArrayLike) -> V:
        ran.append(with_array)
        return V(bind(first, x.array, _plain(third)))

    @quax.register(primitive)
    def with_w(first: ArrayLike, x: V, third: W) -> W:
        ran.append(with_w)
        return W(bind(first, x.array, third.array))


_rules_for(lax.select_n_p, lax.select_n)
_rules_for(lax.clamp_p, lax.clamp)


X = jnp.array([0.0, 1.0, 2.0, 3.0], jnp.float32)
Y = jnp.array([4.0, -1.0, 0.5, 1.0], jnp.float32)
WHICH = jnp.array([True, False, True, False])
LOW = jnp.array([0.5, 0.5, 0.5, 0.5], jnp.float32)

CASES = {
    "select_n": (lax.select_n_p, lambda p, a, b: lax.select_n(p, a, b), WHICH),
    "clamp": (lax.clamp_p, lambda lo, x, hi: lax.clamp(lo, x, hi), LOW),
}


@pytest.mark.parametrize("staged", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_dispatch_cache_keys_every_operand_type(
    mode: str, name: str, staged: bool
) -> None:
    # `(Array, V, Array)` fills the cache; `(Array, V, W)` then gets its own rule.
    # Under `jit`, each key once (a second trace of a key replays its recording,
    # running no rule).
    del mode
    primitive, call, first = CASES[name]
    for third in (Y, W(Y)) if staged else (Y, W(Y), Y, W(Y)):
        operands = [first, V(X), third]
        expected = quax.resolve(primitive, operands)
        assert expected.kind == "rule"
        f = quax.quaxify(call)
        if staged:
            f = jax.jit(lambda *a, f=f: f(*a))  # traced afresh
        del ran[:]
        out = f(*operands)
        assert ran == [expected.function]
        assert type(out) is (W if isinstance(third, W) else V)
        np.testing.assert_array_equal(
            out.array,
            np.asarray(call(first, X, Y)),  # plain JAX
        )
