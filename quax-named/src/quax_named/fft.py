"""`jax.numpy.fft` along named axes: `quax_named.fft.fft(x, "seq")`.

Each function is its `jax.numpy.fft` namesake with the axis (or axes) given by name.
Every axis keeps its name; a transform that changes an axis's size (`rfft`,
`irfft`, `n=`/`s=`) keeps the name at the new size. In positional code
(`jnp.fft.fft(x, axis=0)` inside `quax.quaxify`) the same holds, through the rule
for `fft`.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

from ._axes import AxisLike
from ._kernels import call
from ._value import NamedArray, check_named, like, positions


__all__ = [
    "fft",
    "fftn",
    "fftshift",
    "hfft",
    "ifft",
    "ifftn",
    "ifftshift",
    "ihfft",
    "irfft",
    "irfftn",
    "rfft",
    "rfftn",
]


def _positions(x: NamedArray, axes: AxisLike | Sequence[AxisLike] | None) -> Any:
    # `None`: jnp.fft's own default (every axis, or the last ones).
    return None if axes is None else positions(x, axes)


def _one(name: str) -> Callable[..., Any]:
    fn = getattr(jnp.fft, name)

    def transform(
        x: NamedArray, axis: AxisLike, n: int | None = None, norm: str | None = None
    ) -> Any:
        x = check_named(x, f"fft.{name}")
        return like(x, call(fn, x.array, n=n, axis=x.index(axis), norm=norm))

    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = f"""`jnp.fft.{name}` along the named axis `axis`.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axis`: the axis (name or `Axis`).
    - `n`, `norm`: as for `jnp.fft.{name}`.

    **Returns:**

    A `NamedArray` with the same axes (`axis` at its new size).
    """
    return transform


def _many(name: str) -> Callable[..., Any]:
    fn = getattr(jnp.fft, name)

    def transform(
        x: NamedArray,
        axes: AxisLike | Sequence[AxisLike] | None = None,
        s: Sequence[int] | None = None,
        norm: str | None = None,
    ) -> Any:
        x = check_named(x, f"fft.{name}")
        return like(x, call(fn, x.array, s=s, axes=_positions(x, axes), norm=norm))

    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = f"""`jnp.fft.{name}` along named axes.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axes`: the axis or axes (names or `Axis`es), in the order `jnp.fft.{name}`
        takes them; `None` for every axis.
    - `s`, `norm`: as for `jnp.fft.{name}`.

    **Returns:**

    A `NamedArray` with the same axes (each at its new size).
    """
    return transform


def _shift(name: str) -> Callable[..., Any]:
    fn = getattr(jnp.fft, name)

    def shift(x: NamedArray, axes: AxisLike | Sequence[AxisLike] | None = None) -> Any:
        x = check_named(x, f"fft.{name}")
        return like(x, call(fn, x.array, axes=_positions(x, axes)))

    shift.__name__ = shift.__qualname__ = name
    shift.__doc__ = f"""`jnp.fft.{name}` along named axes.

    **Arguments:**

    - `x`: a `NamedArray`.
    - `axes`: the axis or axes (names or `Axis`es); `None` for every axis.

    **Returns:**

    A `NamedArray` with the same axes.
    """
    return shift


fft = _one("fft")
ifft = _one("ifft")
rfft = _one("rfft")
irfft = _one("irfft")
hfft = _one("hfft")
ihfft = _one("ihfft")
fftn = _many("fftn")
ifftn = _many("ifftn")
rfftn = _many("rfftn")
irfftn = _many("irfftn")
fftshift = _shift("fftshift")
ifftshift = _shift("ifftshift")
