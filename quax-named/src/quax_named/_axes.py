"""Axes and their names: `Axis`, the broadcast axes positional code creates, and
the checks every name passes."""

import itertools
import numbers
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


__all__ = [
    "Axis",
    "AxisLike",
    "AxisSelection",
    "Broadcast",
    "Flattened",
    "as_axes",
    "check_name",
    "intern_axes",
    "labels",
]


class Axis:
    """An axis of a [`quax_named.NamedArray`][].

    `Axis("batch", 32)` is the axis named `batch`, of size 32: every axis with the
    name `batch` is the same axis, and `"batch"` finds it wherever an axis is asked
    for. `Axis(3)` is an anonymous axis of size 3, as in the published quax: it is
    equal only to itself. A size of `None` matches any size.
    """

    __slots__ = ("name", "size")
    name: str | None
    size: int | None

    def __init__(
        self,
        name: str | int | np.integer | None = None,
        size: int | np.integer | None = None,
    ):
        """**Arguments:**

        - `name`: the axis name. For the published form `Axis(size)`, an integer (or
            `None`) here is the size of an anonymous axis.
        - `size`: `None` (any size), or the size every array must have along this
            axis: `NamedArray` raises a `ValueError` otherwise.
        """
        if name is not None and not isinstance(name, str):
            if size is not None:
                raise ValueError(
                    f"Axis(name, size) needs a string name; got name={name!r}. Use "
                    "Axis(size) for an anonymous axis."
                )
            if isinstance(name, bool) or not isinstance(name, numbers.Integral):
                raise ValueError(
                    "Axis takes a name (a string) or, for an anonymous axis, a size "
                    f"(an integer); got {type(name).__name__} {name!r}."
                )
            name, size = None, name
        if name is not None:
            check_name(name, "Axis name")
        if size is not None:
            size = _check_size(size)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "size", size)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Axis is immutable.")

    @property
    def key(self) -> Any:
        """What identifies the axis: its name, or the object itself if anonymous."""
        return self if self.name is None else self.name

    def resized(self, size: int) -> "Axis":
        """This axis with another size (the same object when the size fits)."""
        if self.size is None or self.size == size:
            return self
        if self.name is None:
            return Axis(size)
        return _unchecked(self.name, size)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Axis) or self.name is None or other.name is None:
            return False
        return self.name == other.name and self.size == other.size

    def __hash__(self) -> int:
        return id(self) if self.name is None else hash((self.name, self.size))

    def __repr__(self) -> str:
        if self.name is None:
            return f"Axis(size={self.size})"
        if self.size is None:
            return f"Axis({self.name!r})"
        return f"Axis({self.name!r}, size={self.size})"

    def label(self) -> str:
        """A short label for messages and reprs: the name, or `<anonymous>`."""
        return self.name if self.name is not None else f"<anonymous {self.size}>"


def _unchecked(name: str | None, size: int | None) -> Axis:
    """`Axis(name, size)` without the name check: for a name checked when its axis
    was made, or the group name of a `Flattened` axis (`"(seq embed)"`)."""
    axis = object.__new__(Axis)
    object.__setattr__(axis, "name", name)
    object.__setattr__(axis, "size", size)
    return axis


# Characters an axis name may not hold: whitespace and the separators of
# `quax_named.einsum`'s spec ("batch feature, feature hidden -> batch hidden").
_SEPARATORS = (",", "->")


def check_name(name: Any, field: str) -> str:
    """`name` if it is a valid axis name, else a `ValueError` naming `field`.

    A valid name is a non-empty string without whitespace, `,` or `->` (which
    `quax_named.einsum` reads as separators).
    """
    if not isinstance(name, str):
        raise ValueError(
            f"{field} must be a string, got {type(name).__name__} {name!r}. An "
            "anonymous axis is `Axis(size)`."
        )
    if not name:
        raise ValueError(
            f"{field} must be a non-empty string, got ''. Give the axis a name, or "
            "use `Axis(size)` for an anonymous axis."
        )
    bad = [s for s in _SEPARATORS if s in name]
    if bad or any(c.isspace() for c in name):
        shown = repr(bad[0]) if bad else "whitespace"
        suggestion = re.sub(r"\s|,|->", "_", name)
        raise ValueError(
            f"{field} {name!r} holds {shown}, which `quax_named.einsum` reads as a "
            "separator: use a name without whitespace, ',' or '->' (e.g. "
            f"{suggestion!r})."
        )
    return name


def _check_size(size: Any) -> int:
    """`size` as an `int` if it is a valid axis size (an integer >= 0, NumPy's
    included), else a `ValueError` naming the field."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise ValueError(
            f"Axis size must be an integer >= 0 or None, got {type(size).__name__} "
            f"{size!r}."
        )
    if size < 0:
        raise ValueError(f"Axis size must be >= 0, got {size}.")
    return int(size)


class Broadcast(Axis):
    """An axis that positional code created by broadcasting (`jnp.expand_dims`, a
    `keepdims=True` reduction): the array is constant along it, so it aligns with
    whatever axis meets it.

    Two broadcast axes of one size are equal (`==`), as they stand for the same
    thing, so that equal layouts are equal tuples; each still has its own `key`,
    so that an array may hold several (`x[:, None, None]`)."""

    __slots__ = ("_key",)
    _key: tuple[str, int]

    def __init__(self, size: int):
        # Set directly: rules make many, and a broadcast axis has no name to check.
        object.__setattr__(self, "name", None)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "_key", ("<broadcast>", next(_broadcast_keys)))

    @property
    def key(self) -> Any:
        return self._key

    def resized(self, size: int) -> "Axis":
        return self if self.size == size else Broadcast(size)

    def __eq__(self, other: object) -> bool:
        return type(other) is Broadcast and other.size == self.size

    def __hash__(self) -> int:
        return hash(("<broadcast>", self.size))

    def __repr__(self) -> str:
        return f"<broadcast {self.size}>"

    def label(self) -> str:
        return f"<broadcast {self.size}>"


_broadcast_keys = itertools.count()


class Flattened(Axis):
    """An axis that positional code made by merging adjacent named axes
    (`x.reshape(batch, -1)` of an array over `(batch, seq, embed)`): named after its
    parts, in order, as einops writes a group (`"(seq embed)"`), and split back
    into them by a positional reshape to their sizes. A `ValueError` refuses any
    other split, which could not know the names of the pieces.

    Refer to it by that name (`quax_named.sum(x, "(seq embed)")`), or rename it
    (`quax_named.rename(x, {"(seq embed)": "features"})`).
    """

    __slots__ = ("part_sizes", "parts")
    parts: tuple[Axis, ...]
    part_sizes: tuple[int, ...]

    def __init__(self, parts: Sequence[Axis], part_sizes: Sequence[int]):
        """**Arguments:**

        - `parts`: the merged axes, in storage order (each named).
        - `part_sizes`: their sizes.
        """
        super().__init__(None, None)
        size = 1
        for n in part_sizes:
            size *= n
        name = "(" + " ".join(a.label() for a in parts) + ")"
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "parts", tuple(parts))
        object.__setattr__(self, "part_sizes", tuple(part_sizes))

    def resized(self, size: int) -> "Axis":
        # A piece of the merged axis (a slice of it) keeps its name, but is no
        # longer the product of its parts: a plain `Axis`.
        return self if self.size == size else _unchecked(self.name, size)


def as_axes(
    axes: Iterable[Axis | str], field: str = "`NamedArray` field `axes`"
) -> tuple[Axis, ...]:
    """`axes` as a tuple of `Axis`: a string `s` is `Axis(s)`.

    **Arguments:**

    - `axes`: a sequence of `Axis` objects and names.
    - `field`: what `axes` is, for the `ValueError` that a bad entry raises.

    **Returns:**

    A tuple of `Axis`.
    """
    if isinstance(axes, str) or not isinstance(axes, Iterable):
        hint = f" (for one axis write ({axes!r},))" if isinstance(axes, str) else ""
        raise ValueError(
            f"{field} must be a sequence of axes (`Axis` objects or names), got "
            f"{type(axes).__name__} {axes!r}{hint}."
        )
    out = []
    for i, axis in enumerate(axes):
        if isinstance(axis, str):
            axis = Axis(check_name(axis, f"Entry {i} of {field}"))
        elif not isinstance(axis, Axis):
            raise ValueError(
                f"Entry {i} of {field} must be an `Axis` or a name (a non-empty "
                f"string), got {type(axis).__name__} {axis!r}. An anonymous axis is "
                "`Axis(size)`."
            )
        out.append(axis)
    return tuple(out)


# Axes tuples by value: equal layouts share one tuple object. Quax keys the static
# fields of values by identity (its replayed recordings, `quax._caching._replay`), so an
# array's axes are this one tuple, and a rule's result on equal layouts is too.
_INTERNED: dict[tuple[Axis, ...], tuple[Axis, ...]] = {}
_INTERNED_MAX = 1 << 14


def intern_axes(axes: tuple[Axis, ...]) -> tuple[Axis, ...]:
    """The one tuple object equal to `axes` (a tuple of `Axis`)."""
    found = _INTERNED.get(axes)
    if found is not None:
        return found
    if len(_INTERNED) >= _INTERNED_MAX:
        _INTERNED.clear()
    _INTERNED[axes] = axes
    return axes


def labels(axes: Sequence[Axis]) -> str:
    """`axes` for an error message: `('batch', 'feature')`."""
    return (
        "("
        + ", ".join(repr(a.label()) for a in axes)
        + ("," if len(axes) == 1 else "")
        + ")"
    )


# An axis as the by-name functions take it: an `Axis`, or its name.
AxisLike = Axis | str
# One axis, several, or `None` for all of them.
AxisSelection = AxisLike | Sequence[AxisLike] | None
