"""A nested `jit` body kept for a NumPy array is never served for that array changed
in place (issue 45, item 1): the families' rules ask `quax.known_constant` about a
plain argument of a `jit` (`jnp.where` binds one), the body then takes it by value,
keyed by its bytes. Each family against plain JAX and `quax.caching(False)`, with the
caches on and in verify mode."""

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._foundation._caches as quax_caches
from quax_named import Axis, NamedArray
from quax_sparse import BCOO
from quax_units import Quantity, UnitError


@pytest.fixture(params=["on", "verify"])
def mode(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The caches on, or in verify mode, from empty caches."""
    monkeypatch.setattr(quax_caches, "verifying", request.param == "verify")
    quax_caches.invalidate()
    yield request.param
    quax_caches.invalidate()


def _both(f: Callable[..., Any], *args: Any) -> list[Any]:
    """`f(*args)` with the caches as they are, then with them off."""
    outs = [f(*args)]
    with quax.caching(False):
        outs.append(f(*args))
    return outs


def test_sparse_where_sees_a_fill_changed_in_place(mode: str) -> None:
    del mode
    dense = 2 * jnp.eye(10)
    s = BCOO.fromdense(dense, nse=10, allow_materialise=True)
    mask = np.eye(10, dtype=bool) | np.eye(10, k=1, dtype=bool)
    f = quax.quaxify(lambda m, s, c: jnp.where(m, s, c))
    c = np.zeros((10, 10), np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(
            np.asarray(f(mask, s, c).todense()), np.where(mask, dense, 0.0)
        )
    c[:] = 5.0
    expected = np.asarray(jnp.where(mask, dense, c))  # plain JAX
    np.testing.assert_array_equal(expected[0], [2, 0] + [5] * 8)
    for out in _both(f, mask, s, c):
        dense_out = out.todense() if isinstance(out, BCOO) else out
        np.testing.assert_array_equal(np.asarray(dense_out), expected)


plus = jax.jit(lambda a, b: a + b)


def test_units_check_an_addend_changed_in_place(mode: str) -> None:
    # Zeros fit any unit; ones beside metres are dimensionless: refused, as uncached.
    del mode
    f = quax.quaxify(lambda q, c: plus(q, c))
    metres = Quantity(jnp.arange(100.0, dtype=jnp.float32), "m")
    c = np.zeros(100, np.float32)
    for _ in range(2):
        out = f(metres, c)
        assert str(out.unit) == "m"
        np.testing.assert_array_equal(np.asarray(out.value), np.arange(100.0))
    c[:] = 1.0
    with pytest.raises(UnitError, match="same dimensions"):
        f(metres, c)
    with quax.caching(False), pytest.raises(UnitError, match="same dimensions"):
        f(metres, c)


def test_named_refuses_an_addend_no_longer_uniform(mode: str) -> None:
    # A uniform unnamed array broadcasts like a scalar; one changed in place so that
    # it is not uniform any more is refused, as uncached.
    del mode
    f = quax.quaxify(lambda n, c: plus(n, c))
    named = NamedArray(jnp.ones((10, 10)), (Axis(10), Axis(10)))
    c = np.full((10, 10), 2.0, np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(
            np.asarray(f(named, c).array), np.full((10, 10), 3)
        )
    c[0, 0] = 7.0
    with pytest.raises(ValueError, match="unnamed array"):
        f(named, c)
    with quax.caching(False), pytest.raises(ValueError, match="unnamed array"):
        f(named, c)
