"""The value type: `NamedArray`, an array whose every axis carries an `Axis`."""

import numbers
import operator
import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import quax


__all__ = ["Axis", "NamedArray", "NamedMaterialisationError", "as_axes"]


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

    def __init__(self, name: str | int | None = None, size: int | None = None):
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
        return Axis(self.name, size)

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
    whatever axis meets it."""

    __slots__ = ()

    def __init__(self, size: int):
        super().__init__(None, None)
        object.__setattr__(self, "size", size)

    def resized(self, size: int) -> "Axis":
        return self if self.size == size else Broadcast(size)

    def __repr__(self) -> str:
        return f"<broadcast {self.size}>"

    def label(self) -> str:
        return f"<broadcast {self.size}>"


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


def labels(axes: Sequence[Axis]) -> str:
    """`axes` for an error message: `('batch', 'feature')`."""
    return (
        "("
        + ", ".join(repr(a.label()) for a in axes)
        + ("," if len(axes) == 1 else "")
        + ")"
    )


class NamedMaterialisationError(quax.MaterialisationError):
    """A `NamedArray` with `allow_materialise=False` met an operation that has no rule
    keeping its axis names. A [`quax.MaterialisationError`][] (a `RuntimeError`):
    its message starts with "Refusing to materialise"."""


def _shape(array: Any) -> tuple[int, ...]:
    if quax.is_value(array):
        return tuple(array.aval().shape)
    return tuple(jax.typeof(array).shape)


class NamedArray(quax.GuardedValue):
    """An array with each axis bound to an [`quax_named.Axis`][].

    Inside [`quax.quaxify`][], unmodified positional code runs on it with the names
    checked: elementwise operations align and broadcast by name (never by position),
    `@`/`dot_general` contracts only matching axes, reductions drop the axes they
    reduce. It follows the core's materialisation policy ([`quax.GuardedValue`][]):
    an operation without a rule that keeps the names raises a
    [`quax_named.NamedMaterialisationError`][] naming it, unless
    `allow_materialise=True`.

    **Fields:**

    - `array`: the wrapped array (a JAX array, or another quax value).
    - `axes`: one `Axis` per axis of `array` (static).
    - `allow_materialise`: whether an operation without a named rule may drop the
        names and run on the plain array (static).
    """

    array: Any
    axes: tuple[Axis, ...] = eqx.field(static=True, converter=as_axes)

    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        NamedMaterialisationError
    )
    linear_in_leaves: ClassVar[bool] = True

    def __init__(
        self,
        array: Any,
        axes: Sequence[Axis | str],
        allow_materialise: bool = False,
    ):
        """**Arguments:**

        - `array`: the wrapped array (a JAX or NumPy array, or another quax value).
        - `axes`: one `Axis` or name per axis of `array`, in storage order.
        - `allow_materialise`: whether an operation without a named rule may drop
            the names and run on the plain array (the published quax's positional
            third argument).
        """
        self.array = array
        self.axes = axes  # pyright: ignore[reportAttributeAccessIssue]
        self.allow_materialise = allow_materialise

    def __check_init__(self) -> None:
        if not isinstance(self.allow_materialise, bool):
            raise ValueError(
                "`allow_materialise` of a `NamedArray` must be a bool, got "
                f"{type(self.allow_materialise).__name__} {self.allow_materialise!r}."
            )
        keys = [a.key for a in self.axes]
        repeated = [a for i, a in enumerate(self.axes) if a.key in keys[:i]]
        if repeated:
            raise ValueError(
                "Axis names for `NamedArray` must be unique; repeated: "
                f"{labels(repeated)} in {labels(self.axes)}."
            )
        try:
            shape = _shape(self.array)
        except TypeError:
            raise ValueError(
                "`array` of a `NamedArray` must be an array (JAX or NumPy) or a quax "
                f"value, got {type(self.array).__name__}. Convert it with "
                "`jnp.asarray` first."
            ) from None
        if len(shape) != len(self.axes):
            raise ValueError(
                "`NamedArray` must have every axis be named: got "
                f"{len(self.axes)} axes {labels(self.axes)} for an array of shape "
                f"{shape}."
            )
        for size, axis in zip(shape, self.axes, strict=True):
            if axis.size is not None and size != axis.size:
                raise ValueError(
                    f"Mismatched axis size for axis {axis}: the array has size {size} "
                    f"along it (array shape {shape}, axes {labels(self.axes)})."
                )

    @classmethod
    def _unchecked(
        cls, array: Any, axes: tuple[Axis, ...], allow_materialise: bool
    ) -> "NamedArray":
        """A `NamedArray` whose axes are known to fit (a rule's result): built as
        equinox unflattens a module, without the converter and checks of
        `__init__`, which would cost more than the rule itself."""
        self = object.__new__(cls)
        object.__setattr__(self, "array", array)
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "allow_materialise", allow_materialise)
        return self

    # The published API ---------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:  # pyright: ignore[reportIncompatibleVariableOverride]
        if self.allow_materialise:
            return super().shape
        raise NamedMaterialisationError(
            "Refusing to access the shape of a `NamedArray` with "
            "`allow_materialise=False`: positions are not names. Use `.sizes` "
            "(a dict from axis name to size) or `.axes`, or call "
            "`.enable_materialise()`."
        )

    def aval(self) -> jax.core.ShapedArray:
        aval = (
            self.array.aval() if quax.is_value(self.array) else jax.typeof(self.array)
        )
        if len(aval.shape) != len(self.axes):
            raise ValueError(
                f"This NamedArray names {len(self.axes)} axes {labels(self.axes)} but "
                f"its array has shape {aval.shape}: a JAX transform mapped or sliced "
                "its stored array by position (`jax.vmap` maps storage axis 0, or "
                "the one `in_axes` gives; `jax.lax.scan` and `jax.lax.map` slice "
                "axis 0), or a tree map stacked or sliced its leaves. quax_named "
                "refuses it: the names no longer match the array's axes. To run "
                "code over some named axes, vectorised over the others, use "
                "`quax_named.nmap(fn, axes)`; to `jax.vmap` over a batch, map plain "
                "arrays and name them inside the mapped function "
                "(`NamedArray(a, axes)`), or call `jax.vmap` inside `quax.quaxify`, "
                "where it maps the array positional code sees and every name is "
                "kept."
            )
        return aval  # pyright: ignore[reportReturnType]

    def dense(self) -> Any:
        if quax.is_value(self.array):
            return self.array.materialise()
        return self.array

    def refusal_reason(self) -> str:
        return (
            f"quax_named keeps its axis names {labels(self.axes)}, which a plain "
            "array would drop"
        )

    def way_out(self, primitive: Any = None) -> str:
        if primitive is None:
            return (
                "Pass allow_materialise=True or call `.enable_materialise()` to drop "
                "the names, or use `.array`."
            )
        return (
            "Ways out: run the positional code through `quax_named.nmap` over the "
            "axes it needs, use the by-name functions of quax_named, or pass "
            "allow_materialise=True / call `.enable_materialise()` to drop the names."
        )

    # Names ---------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str | None, ...]:
        """The axis names in storage order (`None` for an anonymous axis)."""
        return tuple(a.name for a in self.axes)

    @property
    def sizes(self) -> dict[Any, int]:
        """Each axis's size, keyed by its name (by the `Axis` itself if anonymous)."""
        return dict(zip((a.key for a in self.axes), self.aval().shape, strict=True))

    def index(self, axis: Axis | str) -> int:
        """The position of `axis` (an `Axis` or a name) among this array's axes.

        **Arguments:**

        - `axis`: the axis, or its name.

        **Returns:**

        Its position. Raises a `ValueError` naming the axes if it is missing.
        """
        key = axis if isinstance(axis, str) else axis.key
        for i, a in enumerate(self.axes):
            if a.key == key:
                return i
        shown = axis if isinstance(axis, str) else axis.label()
        raise ValueError(
            f"Axis {shown!r} is not an axis of this NamedArray; its axes are "
            f"{labels(self.axes)}."
        )

    def axis(self, axis: Axis | str) -> Axis:
        """The `Axis` object for `axis` (an `Axis` or a name)."""
        return self.axes[self.index(axis)]

    # By name -------------------------------------------------------------------------

    def rename(self, mapping: Any) -> "NamedArray":
        """See [`quax_named.rename`][]."""
        from ._ops import rename

        return rename(self, mapping)

    def transpose(self, *order: Any) -> "NamedArray":
        """See [`quax_named.transpose`][]: `x.transpose("feature", "batch")`."""
        from ._ops import transpose

        return transpose(self, order)

    def __getitem__(self, selection: Any) -> Any:
        """Index by name: `x[{"batch": 0, "seq": slice(0, 4)}]`."""
        from ._ops import getitem

        return getitem(self, selection)

    @property
    def at(self) -> Any:
        """Functional updates by name: `x.at[{"batch": 0}].set(v)` (also `add`,
        `multiply`, `min`, `max`, `get`)."""
        from ._ops import _AtIndexer

        return _AtIndexer(self)

    def _binary(self, op: Any, other: Any, reverse: bool = False) -> Any:
        from ._ops import binary

        return binary(op, other, self) if reverse else binary(op, self, other)

    def __add__(self, other: Any) -> Any:
        return self._binary(operator.add, other)

    def __radd__(self, other: Any) -> Any:
        return self._binary(operator.add, other, reverse=True)

    def __sub__(self, other: Any) -> Any:
        return self._binary(operator.sub, other)

    def __rsub__(self, other: Any) -> Any:
        return self._binary(operator.sub, other, reverse=True)

    def __mul__(self, other: Any) -> Any:
        return self._binary(operator.mul, other)

    def __rmul__(self, other: Any) -> Any:
        return self._binary(operator.mul, other, reverse=True)

    def __truediv__(self, other: Any) -> Any:
        return self._binary(operator.truediv, other)

    def __rtruediv__(self, other: Any) -> Any:
        return self._binary(operator.truediv, other, reverse=True)

    def __pow__(self, other: Any) -> Any:
        return self._binary(operator.pow, other)

    def __lt__(self, other: Any) -> Any:
        return self._binary(operator.lt, other)

    def __le__(self, other: Any) -> Any:
        return self._binary(operator.le, other)

    def __gt__(self, other: Any) -> Any:
        return self._binary(operator.gt, other)

    def __ge__(self, other: Any) -> Any:
        return self._binary(operator.ge, other)

    def __neg__(self) -> Any:
        from ._rules import call

        return NamedArray(
            call(operator.neg, self.array), self.axes, self.allow_materialise
        )

    def __repr__(self) -> str:
        parts = []
        for axis, size in zip(self.axes, self.aval().shape, strict=True):
            parts.append(f"{axis.label()}={size}")
        aval = self.aval()
        return f"NamedArray({aval.dtype}[{', '.join(parts)}])"
