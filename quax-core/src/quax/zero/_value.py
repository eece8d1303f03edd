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

from .._caching._keys import add_setting
from .._compat import ShapedArray
from .._values._value import ArrayValue


__all__ = ["Zero", "ieee_strict", "is_ieee_strict", "signed_zeros"]


class Zero(ArrayValue):
    """An array known to be all zeros, without storing them.

    Operations on it are simplified at trace time: `x + zero` is `x`, `x * zero`,
    `zero @ x`, reshapes, slices, reductions, ... are `Zero`s again, and anything
    without a rule materialises it as `jnp.zeros(shape, dtype)`.

    Like JAX's own symbolic zero tangents, a `Zero` *annihilates*: `Zero * x` and
    `Zero @ x` are zero even where `x` is `nan` or `inf`, whereas IEEE arithmetic
    gives `0 * nan = nan`. Inside [`quax.zero.ieee_strict`][] those products are
    computed densely instead, so non-finite values propagate.

    A floating zero has a sign, as IEEE's does: `Zero(shape, dtype, negative=True)`
    is `-0.` (a complex one has a sign for each part), `-zero` and `zero * -2.` are
    negative, and `1 / zero`, `jnp.signbit`, `jnp.copysign`, `jnp.arctan2`,
    `jnp.sqrt`, `jnp.minimum`, ... give what they give on the dense signed zeros.
    Every rule keeps the result symbolic only when the sign of every element is
    known when quax traces the program, and computes densely otherwise. The sign of
    `zero * x` (or `zero / x`, `zero @ x`) follows `x` when `x` is known (a literal
    or concrete array); for an `x` known only when the program runs, the zero
    annihilates as if `x` were a positive finite number, and `x + zero` is `x`, as
    XLA itself simplifies `x + 0` (so a `-0.` in `x` stays `-0.`, where eager IEEE
    arithmetic gives `+0.`). Inside [`quax.zero.ieee_strict`][] the product is
    computed densely instead, so its signs (and NaNs) are exactly IEEE's. Integer
    and boolean zeros have no sign.

    A `Zero` has no array leaves (its shape, dtype and sign are static), so `jax.vmap`
    cannot add a batch axis to one returned from the function it maps:
    `jax.vmap(quax.quaxify(f))` raises a `ValueError` when `f` returns one. Put the
    vmap inside quaxify (`quax.quaxify(jax.vmap(f))`), where the rules see the
    batched shapes.

    **Raises:** `ValueError` for a shape that is not a tuple of non-negative ints,
    a dtype that JAX has no arrays of (`object`, strings, `datetime64`, ...), or a
    sign that the dtype cannot hold.
    """

    _shape: tuple[int, ...] = eqx.field(static=True)
    _dtype: np.dtype = eqx.field(static=True)
    _signs: tuple[bool, bool] = eqx.field(static=True)

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: Any,
        negative: bool | tuple[bool, bool] = False,
    ) -> None:
        """**Arguments:**

        - `shape`: the shape of the zero array.
        - `dtype`: its dtype (canonicalised as JAX does, so `float64` is `float32`
            unless 64-bit mode is enabled).
        - `negative`: whether every element is `-0.`; for a complex dtype, `True`
            makes both parts `-0.`, and a pair `(real, imaginary)` gives each part
            its own sign. Integer and boolean zeros take only `False`.
        """
        self._shape = _checked_shape(shape)
        self._dtype = _checked_dtype(dtype)
        self._signs = _checked_signs(negative, self._dtype)

    @property
    def negative(self) -> bool | tuple[bool, bool]:
        """Whether the elements are `-0.`: a bool, or for a complex dtype the pair
        `(real part negative, imaginary part negative)`."""
        if jnp.issubdtype(self._dtype, jnp.complexfloating):
            return self._signs
        return self._signs[0]

    def aval(self) -> ShapedArray:
        return _aval(self._shape, self._dtype)

    def materialise(self) -> jax.Array:
        return signed_zeros(self._shape, self._dtype, self._signs)


def signed_zeros(
    shape: tuple[int, ...], dtype: np.dtype, signs: tuple[bool, bool]
) -> jax.Array:
    """`jnp.zeros(shape, dtype)` whose real and imaginary parts have the signs
    `signs` (`True` for `-0.`)."""
    if not any(signs):
        return jnp.zeros(shape, dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.finfo(dtype).dtype
        real, imag = (jnp.full(shape, -0.0 if s else 0.0, part) for s in signs)
        return jax.lax.complex(real, imag)
    return jnp.full(shape, -0.0, dtype)


def _checked_dtype(dtype: Any) -> np.dtype:
    """`dtype` canonicalised as JAX does, or a `ValueError` naming the field and
    saying why it is not a dtype of JAX's arrays."""
    try:
        canonical = jax.dtypes.canonicalize_dtype(dtype)
    except (TypeError, ValueError) as e:
        # Not a dtype (`"float"` typed wrongly), or an extended one (PRNG keys).
        raise ValueError(
            f"Zero: `dtype` {dtype!r} is not a dtype of JAX's numeric arrays ({e})."
        ) from e
    reason = _unsupported(canonical)
    if reason is not None:
        raise ValueError(
            f"Zero: `dtype` must be a boolean, integer, floating or complex dtype, "
            f"as JAX's arrays have; got {canonical}, which JAX has no arrays of "
            f"({reason})"
        )
    return canonical


@ft.lru_cache(maxsize=64)
def _unsupported(dtype: np.dtype) -> str | None:
    """Why JAX has no arrays of `dtype` (`object`, strings, `datetime64`,
    `longdouble`, ...), or `None` where it has; asked once per dtype."""
    try:
        jax.dtypes.result_type(dtype)
    except TypeError as e:
        return str(e)
    return None


def _checked_signs(negative: Any, dtype: np.dtype) -> tuple[bool, bool]:
    """`negative` as a `(real, imaginary)` pair of signs, or a `ValueError` saying
    why `dtype` cannot hold it."""
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
    if isinstance(negative, bool | np.bool_):
        signs = (bool(negative), bool(negative) and complex_)
    elif (
        isinstance(negative, tuple)
        and len(negative) == 2
        and all(isinstance(n, bool | np.bool_) for n in negative)
    ):
        if not complex_:
            raise ValueError(
                f"Zero: a pair of signs {negative!r} is for a complex dtype; a "
                f"{dtype} zero takes one bool, `negative=True` or `False`."
            )
        signs = (bool(negative[0]), bool(negative[1]))
    else:
        raise ValueError(
            f"Zero: `negative` must be a bool (or, for a complex dtype, a pair of "
            f"bools), got {negative!r}."
        )
    if any(signs) and not jnp.issubdtype(dtype, jnp.inexact):
        raise ValueError(
            f"Zero: a {dtype} zero has no sign; pass `negative=False` (the default), "
            f"or a floating or complex dtype for `-0.`."
        )
    return signs


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


# Compiled eager programs follow the setting; its read is `_strict.get`, one C call
# per key.
add_setting(_strict.get)
