"""The nested-`jit` body cache keeps no body of a function that no longer exists:
each entry holds its jaxpr weakly and goes with it (a compiled body holds about a
megabyte; 256 of functions long gone held about 350 MB, issue 45 item 16)."""

import gc
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._foundation._caches as quax_caches
from jax import lax
from jaxtyping import ArrayLike
from quax._caching import _nested

from .helpers import Dense


class Asking(Dense):
    """A `Dense` whose product with a plain array asks for that array's value (as
    the families' rules do), so that a nested `jit` body takes it by value."""


@quax.register(lax.mul_p)
def _(x: Asking, y: ArrayLike) -> Asking:
    quax.known_constant(y, 1 << 20)
    return Asking(x.array * y)


TABLES = ["_bodies", "_by_value", "made"]


@pytest.fixture(params=["on", "verify"])
def mode(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The caches on, or in verify mode (which keeps what each body was made with
    too), from empty caches."""
    monkeypatch.setattr(quax_caches, "verifying", request.param == "verify")
    quax_caches.invalidate()
    yield request.param
    quax_caches.invalidate()


def _sizes() -> dict[str, int]:
    """The entries of the nested-jit table (its jitted bodies, and the plain
    arguments that bodies take by value), and of the verify table's entries for
    them (`made`: the key components and the programs each body was made with)."""
    gc.collect()
    len(quax_caches._made)  # drops the dead jaxprs' entries
    len(_nested._bodies)  # likewise
    made = [k for k in quax_caches._made._data if k[0] == _nested._bodies.name]
    entries = list(_nested._bodies._data.values())
    by_value = sum(type(e) is frozenset for e in entries)
    return {
        "_bodies": len(entries) - by_value,
        "_by_value": by_value,
        "made": len(made),
    }


def _new_function() -> Callable[[], Asking]:
    """A call of a new jitted function inside `quax.quaxify`."""
    x = Asking(jnp.arange(100.0, dtype=jnp.float32))
    scale = np.full(100, 3.0, np.float32)  # large: passed in, until a rule asks
    inner = jax.jit(lambda a, s: a * s)
    return lambda: quax.quaxify(lambda v, s: inner(v, s))(x, scale)


@pytest.mark.caching_behaviour
def test_a_dead_functions_bodies_are_dropped(mode: str) -> None:
    alive = [_new_function()]
    for _ in range(2):
        out = alive[0]()
    np.testing.assert_array_equal(out.array, np.arange(100.0) * 3.0)
    gc.collect()
    kept = _sizes()
    assert kept["_bodies"] >= 1 and kept["_by_value"] == 1
    if mode == "verify":
        assert kept["made"] >= 2  # a program, the arguments by value
    alive.clear()  # the function dies
    gc.collect()
    assert _sizes() == dict.fromkeys(TABLES, 0)


@pytest.mark.caching_behaviour
def test_a_living_functions_body_is_kept(mode: str) -> None:
    del mode
    x = Dense(jnp.arange(4.0, dtype=jnp.float32))
    inner = jax.jit(lambda a: jnp.cos(a) + 1.0)
    f = quax.quaxify(lambda v: inner(v))
    f(x)
    gc.collect()
    body = next(iter(_nested._bodies._data.values()))
    for _ in range(3):
        np.testing.assert_allclose(f(x).array, np.cos(np.arange(4.0)) + 1.0, rtol=1e-6)
    assert list(_nested._bodies._data.values()) == [body]
