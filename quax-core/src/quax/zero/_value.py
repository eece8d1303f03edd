"""The symbolic zero value and the IEEE-strict switch."""

import contextlib
import contextvars
import functools as ft
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._caching._eager import add_setting
from .._compat import ShapedArray
from .._values._value import ArrayValue


__all__ = ["Zero", "ieee_strict", "is_ieee_strict"]


class Zero(ArrayValue):
    """An array known to be all zeros, without storing them.

    Operations on it are simplified at trace time: `x + zero` is `x`, `x * zero`,
    `zero @ x`, reshapes, slices, reductions, ... are `Zero`s again, and anything
    without a rule materialises it as `jnp.zeros(shape, dtype)`.

    Like JAX's own symbolic zero tangents, a `Zero` *annihilates*: `Zero * x` and
    `Zero @ x` are zero even where `x` is `nan` or `inf`, whereas IEEE arithmetic
    gives `0 * nan = nan`. Inside [`quax.zero.ieee_strict`][] those products are
    computed densely instead, so non-finite values propagate.

    A `Zero` has no array leaves (its shape and dtype are static), so `jax.vmap`
    cannot add a batch axis to one returned from the function it maps:
    `jax.vmap(quax.quaxify(f))` raises a `ValueError` when `f` returns one. Put the
    vmap inside quaxify (`quax.quaxify(jax.vmap(f))`), where the rules see the
    batched shapes.

    **Raises:** `ValueError` for a shape that is not a tuple of non-negative ints,
    or a dtype that is not one.
    """

    _shape: tuple[int, ...] = eqx.field(static=True)
    _dtype: np.dtype = eqx.field(static=True)

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        """**Arguments:**

        - `shape`: the shape of the zero array.
        - `dtype`: its dtype (canonicalised as JAX does, so `float64` is `float32`
            unless 64-bit mode is enabled).
        """
        self._shape = _checked_shape(shape)
        try:
            self._dtype = jax.dtypes.canonicalize_dtype(dtype)
        except TypeError as e:
            raise ValueError(f"Zero: {dtype!r} is not a dtype ({e}).") from e

    def aval(self) -> ShapedArray:
        return _aval(self._shape, self._dtype)

    def materialise(self) -> jax.Array:
        return jnp.zeros(self._shape, self._dtype)


@ft.lru_cache(maxsize=1024)
def _aval(shape: tuple[int, ...], dtype: np.dtype) -> ShapedArray:
    """A `Zero`'s aval from its static shape and dtype, built once per pair: JAX
    interns equal `ShapedArray`s anyway, but only after the cost of building one."""
    return ShapedArray(shape, dtype)


def _checked_shape(shape: Any) -> tuple[int, ...]:
    """`shape` as a tuple of ints, or a `ValueError` saying what is wrong with it."""
    if isinstance(shape, int | np.integer):
        raise ValueError(
            f"Zero: the shape must be a tuple of ints, got the int {shape}; "
            f"write `({shape},)`."
        )
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(
            f"Zero: the shape must be a tuple of ints, got {shape!r}."
        ) from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int | np.integer):
            raise ValueError(
                f"Zero: every dimension of the shape must be an int, got {d!r} in "
                f"{shape!r}."
            )
        if d < 0:
            raise ValueError(
                f"Zero: dimensions must be non-negative, got {int(d)} in {shape!r}."
            )
    return tuple(int(d) for d in dims)


_strict: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "quax_zero_ieee_strict", default=False
)


@contextlib.contextmanager
def ieee_strict(enabled: bool = True) -> Iterator[None]:
    """Make products with a [`quax.zero.Zero`][] follow IEEE arithmetic.

    ```python
    with quax.zero.ieee_strict():
        quax.quaxify(jnp.multiply)(Zero((), jnp.float32), jnp.nan)  # nan, not 0
    ```

    Inside the block, `mul`, `div` and `dot_general` with a `Zero` operand are
    computed densely (`0 * x`) whenever the other operand could hold `nan` or `inf`:
    it has a floating or complex dtype and is not a concrete array known to be
    finite. Outside it, a `Zero` annihilates (`Zero * nan = 0`), as JAX's symbolic
    zero tangents do.

    The switch acts when quax traces the program: a function already compiled by
    `jax.jit` keeps the behaviour it was traced with.

    **Arguments:**

    - `enabled`: `False` restores annihilation inside an outer strict block.

    **Returns:**

    A context manager.
    """
    token = _strict.set(enabled)
    try:
        yield
    finally:
        _strict.reset(token)


def is_ieee_strict() -> bool:
    """Whether [`quax.zero.ieee_strict`][] is active.

    **Returns:**

    `True` inside an `ieee_strict()` block.
    """
    return _strict.get()


add_setting(is_ieee_strict)  # compiled eager programs follow the setting
