"""One quaxified function called from several threads at once, on values of other
dtypes and static fields, eagerly (first calls, compiled programs, replays), under
`jit` and under `vmap`: every thread gets what one thread gets with the caches off,
while another thread switches a setting that rules read (`quax.zero.ieee_strict`,
thread-local) and the caches are shared."""

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import quax
from quax.zero import Zero

from .test_cache_keys_types import _Factor


def _f(s: Any, y: Any) -> Any:
    z = jnp.sin(s * y) + 1
    return jnp.sum(z * z, axis=0) / 3


def _case(dtype: Any, factor: Any, mode: str) -> list[tuple[str, bytes]]:
    a = (jnp.arange(6).reshape(3, 2) % 4).astype(dtype)
    f = quax.quaxify(_f)
    if mode == "jit":
        f = jax.jit(f)
    elif mode == "vmap":
        f = jax.vmap(f, in_axes=(None, 0))
    y = jnp.ones((2, 2), dtype) if mode == "vmap" else jnp.asarray(2, dtype)
    outs = []
    for _ in range(3):
        out = np.asarray(f(_Factor(a, factor), y))
        outs.append((str(out.dtype), out.tobytes()))
    return outs


_CASES = [
    (dtype, factor, mode)
    for dtype in (jnp.float16, jnp.int32)
    for factor in (1, 1.0, True)
    for mode in ("eager", "jit", "vmap")
]


def _strict_product(strict: bool) -> tuple[str, bytes]:
    """`Zero * [1, nan]`: `[0, nan]` under `ieee_strict`, else a zero."""
    f = quax.quaxify(lambda z, b: jnp.exp(z * b))
    with quax.zero.ieee_strict(strict):
        out = None
        for _ in range(3):
            out = np.asarray(f(Zero((2,), jnp.float32), jnp.array([1.0, jnp.nan])))
    assert out is not None
    return str(out.dtype), out.tobytes()


def test_threads_get_what_one_thread_gets() -> None:
    with quax.caching(False):
        expected = [_case(*case) for case in _CASES]
        strict_expected = {s: _strict_product(s) for s in (False, True)}
    np.testing.assert_array_equal(
        np.frombuffer(strict_expected[True][1], np.float32), [1.0, np.nan]
    )
    np.testing.assert_array_equal(
        np.frombuffer(strict_expected[False][1], np.float32), [1.0, 1.0]
    )

    def run(i: int) -> Any:
        if i % 5 == 0:
            strict = i % 10 == 0
            return ("strict", strict, _strict_product(strict))
        return ("case", i % len(_CASES), _case(*_CASES[i % len(_CASES)]))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(2 * len(_CASES) + 8)))
    for kind, which, got in results:
        want = strict_expected[which] if kind == "strict" else expected[which]
        assert got == want, (kind, which)
