"""Cache keys tell apart inputs that compare equal but differ in type or bits.

Python and NumPy scalars of one value (a weak-typed `2`, `2.0` or `True`, a strong
`np.float32(2)`, a 0-d `jax.Array`), signed zeros, and static fields equal by `==`
(`1 == 1.0 == True`) give other dtypes or other bits, so no cache may answer for one
with what it kept for another. Each input is run eagerly three times (the first call
runs equation by equation, the second compiles a program, the third replays it) and
under `jit` (where a rule's staged equations are replayed) and `vmap`, interleaved
with the others, against plain JAX on the dense arrays.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._foundation._caches

from .helpers import Dense


_CONSTANTS = [
    2,
    2.0,
    True,
    np.float32(2),
    np.float64(2),
    np.int8(2),
    jnp.float32(2),
    np.array(2, np.int32),
    -0.0,
    0.0,
    float("nan"),
]
_OPS: list[Callable[[Any, Any], Any]] = [jnp.multiply, jnp.maximum]


def _bits(x: Any) -> tuple[str, bytes]:
    array = np.asarray(x)
    return str(array.dtype), array.tobytes()


def _modes(op: Callable[[Any, Any], Any]) -> dict[str, Callable[[Any, Any], Any]]:
    f = quax.quaxify(lambda x, c: op(x, c))
    return {
        "eager": f,
        "jit": jax.jit(f),
        "vmap": jax.vmap(f, in_axes=(0, None)),
    }


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.int8])
def test_scalar_constants_of_one_value_keep_their_types(dtype: Any) -> None:
    """`x * 2`, `x * 2.0`, `x * True`, `x * np.float32(2)`, ... on a float16 or an
    int8 value: each gives plain JAX's dtype and bits (a weak constant keeps the
    value's dtype, a strong one promotes), however the calls interleave. (`Dense`
    keeps inexact outputs wrapped and gives integer ones plain.)"""
    x = jnp.arange(1, 4).astype(dtype)
    expected = {
        (op.__name__, i): _bits(op(x, c))
        for op in _OPS
        for i, c in enumerate(_CONSTANTS)
    }
    for op in _OPS:
        for mode, f in _modes(op).items():
            for _ in range(3):
                for i, c in enumerate(_CONSTANTS):
                    out = f(Dense(x), c)
                    got = _bits(out.array if isinstance(out, Dense) else out)
                    assert got == expected[op.__name__, i], (mode, op, c)


class _Factor(quax.ArrayValue):
    """`array * factor`, with `factor` a static field: `1`, `1.0` and `True` give
    three dtypes for an integer `array`."""

    array: Any
    factor: Any = eqx.field(static=True)

    def aval(self) -> jax.core.ShapedArray:
        dtype = jnp.result_type(self.array, self.factor)
        return jax.core.ShapedArray(jnp.shape(self.array), dtype)

    def materialise(self) -> Any:
        return self.array * self.factor


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap"])
def test_static_fields_equal_by_value_keep_their_types(mode: str) -> None:
    """Static fields `1`, `1.0`, `True`, `np.float32(1)`, `-0.0` and `0.0` are equal
    by `==` (or by bits, for the zeros): each value gives its own dtype and bits."""
    a = jnp.arange(3, dtype=jnp.int32)
    factors = [1, 1.0, True, np.float32(1), -0.0, 0.0]
    f = quax.quaxify(lambda s, y: jnp.sin(s * y) + s)
    if mode == "jit":
        f = jax.jit(f)
    elif mode == "vmap":
        f = jax.vmap(f, in_axes=(None, 0))
    y = jnp.full((2, 3), -1, jnp.int32) if mode == "vmap" else jnp.int32(-1)
    for _ in range(3):
        for factor in factors:
            dense = a * factor
            ref = jnp.sin(dense * y) + dense  # rows of `y` broadcast, as `vmap` maps
            assert _bits(f(_Factor(a, factor), y)) == _bits(ref), factor


_LIBRARY_JIT = jax.jit(lambda x, c: x * c)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, c: jnp.multiply(x, c),  # library code: a compiled eager program
        lambda x, c: _LIBRARY_JIT(x, c),  # a nested `jit`'s body
    ],
    ids=["eager program", "nested jit"],
)
def test_numpy_and_jax_constants_of_one_value_keyed_apart(
    verifying: Any, call: Callable[[Any, Any], Any]
) -> None:
    """`np.float32(2)` and `jnp.float32(2)` have one aval and one bit pattern, but
    JAX stages the first as a literal and the second as a constant of the program:
    what the rules stage differs, so they are two keys. Before, they shared one,
    and verify mode raised a `CacheMismatchError` on the hit (naming the constants)."""
    del verifying
    x = jnp.arange(1, 4).astype(jnp.int8)
    f = quax.quaxify(call)
    for first, then in [(np.float32(2), jnp.float32(2)), (jnp.float32(2), 2.0)]:
        for c in (first, first, then, then, first):
            out = f(Dense(x), c)
            assert _bits(out.array) == _bits(x * c), c


@pytest.mark.parametrize("verify", [False, True], ids=["normal", "verify mode"])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.int8])
def test_numpy_scalars_and_0d_arrays_replay_apart_under_jit(
    request: pytest.FixtureRequest, verify: bool, dtype: Any
) -> None:
    """Inside `jax.jit`, where a rule's staged equations replay: `x * c` for `c` a
    NumPy scalar, a 0-d NumPy array, a 0-d JAX array and a Python float, all 2 (and
    0-d NumPy arrays of other dtypes and of both signed zeros), each gives plain
    JAX's dtype and bits, however they interleave. In verify mode every replay is
    also checked against running the rules."""
    if verify:
        request.getfixturevalue("verifying")
    x = jnp.arange(1, 4).astype(dtype)
    constants = [
        np.float32(2),
        np.array(2.0, np.float32),
        jnp.float32(2),
        2.0,
        np.array(2, np.int32),
        np.array(2.0, np.float16),
        np.array(-0.0, np.float32),
        np.array(0.0, np.float32),
    ]
    for _ in range(2):
        for c in constants:
            # A fresh function each time: JAX traces it, and quax replays.
            out = jax.jit(quax.quaxify(lambda a, c=c: a * c))(Dense(x))
            got = _bits(out.array if isinstance(out, Dense) else out)
            assert got == _bits(x * c), c
