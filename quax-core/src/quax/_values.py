"""The values quax dispatches on, and materialisation tracking."""

import abc
import contextlib
import dataclasses
import functools as ft
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeAlias, TypeGuard

import equinox as eqx
from jaxtyping import ArrayLike

from ._compat import Primitive, ShapedArray, eqx_finish_init, eqx_has_dataclass_init


__all__ = [
    "ArrayValue",
    "MaterialisationReport",
    "Value",
    "ValueLike",
    "is_value",
    "track_materialisation",
]


class _ValueMeta(type(eqx.Module)):
    """Equinox's metaclass, with a fast constructor for plain value classes.

    Quax builds values on its hot path (every rule returns new ones). For a class
    with the dataclass `__init__` and nothing for equinox to check after it (no
    converters, no `__check_init__`, no `init=False` fields), construction is the
    dataclass `__init__` alone: about 4x cheaper than equinox's general path.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        fast = _fast_construction.get(cls)
        if fast is None:
            fast = _fast_construction[cls] = _can_construct_fast(cls)
        if not fast:
            return super().__call__(*args, **kwargs)
        self = type.__call__(cls, *args, **kwargs)
        eqx_finish_init(self)
        return self


_fast_construction: dict[type, bool] = {}


def _can_construct_fast(cls: type) -> bool:
    if getattr(cls, "__abstractmethods__", None) or not eqx_has_dataclass_init(cls):
        return False
    if any("__check_init__" in vars(k) for k in cls.__mro__):
        return False
    fields = dataclasses.fields(cls)
    return all(f.init and "converter" not in f.metadata for f in fields)


class Value(eqx.Module, metaclass=_ValueMeta):
    """An object that quax dispatches on.

    Subclass it (usually through [`quax.ArrayValue`][]) and implement `aval` and
    `materialise`. Rules for it are registered with [`quax.register`][]; primitives
    without a rule fall back to `default`.

    Set the class variable `linear_in_leaves = True` when `materialise` is linear in
    the value's array leaves (a dense wrapper, a symbolic zero, sparse data, units):
    then the tangents and cotangents of a `custom_jvp`/`custom_vjp` function stay
    values of the same type. Otherwise such functions see the materialised array.
    """

    linear_in_leaves: ClassVar[bool] = False

    @abc.abstractmethod
    def aval(self) -> Any:
        """The abstract value JAX sees for this object.

        It must be pure: the same instance always gives the same aval. Python metadata
        that changes it belongs in static fields. Quax calls it for every value a rule
        returns, so keep it cheap: where a leaf has the value's shape and dtype,
        `return jax.typeof(leaf)` (about 1 us) beats building a new `ShapedArray`
        (about 3 us).

        **Returns:**

        A JAX abstract value, typically a `jax.core.ShapedArray`.
        """

    @abc.abstractmethod
    def materialise(self) -> Any:
        """The dense JAX array this object represents.

        Raise here (naming the type and how to allow it) if densifying would be too
        costly or would lose information.

        **Returns:**

        A JAX array whose shape and dtype match `self.aval()`.
        """

    @staticmethod
    def default(
        primitive: Primitive, values: Sequence["ValueLike"], params: dict[str, Any]
    ) -> "ValueLike | Sequence[ValueLike]":
        """The rule used when no registered rule matches.

        For `primitive.bind(*values, **params)`, quax uses, in order: a registered
        rule matching the input types; else the `default` of the single input type
        that overrides this method; else it materialises every `Value` and binds the
        primitive as usual. Two input types overriding `default` is a `TypeError`.

        **Arguments:**

        - `primitive`: the primitive being bound.
        - `values`: its inputs, each a `Value` or a JAX array-like.
        - `params`: the primitive's parameters.

        **Returns:**

        The primitive's output: one value, or a sequence of them when
        `primitive.multiple_results` is true.
        """
        dense = [v.materialise() if isinstance(v, Value) else v for v in values]
        return primitive.bind(*dense, **params)

    @classmethod
    def lift(cls, array: ArrayLike, like: "Value") -> "Value | None":
        """`array` (a plain array, possibly a tracer) as a value of type `cls` with the
        static metadata of `like`, or `None` to decline.

        Quax calls it to join a loop carry, branch output or linear-solve right-hand
        side that is plain on one side and a `cls` on the other (e.g. the zero
        cotangent a reverse-mode loop starts with), before falling back to
        materialising. `like`'s leaves are `jax.ShapeDtypeStruct`s: use only its
        type and static fields. The default declines.

        **Arguments:**

        - `array`: the plain array.
        - `like`: a value of type `cls` with the target structure.

        **Returns:**

        A value of `like`'s pytree structure, or `None`.
        """
        del array, like
        return None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Record every materialisation while a `track_materialisation` block is
        # active. The wrapper costs one attribute read when nothing is tracked.
        own = cls.__dict__.get("materialise")
        if own is not None and not getattr(own, "__isabstractmethod__", False):
            cls.materialise = _tracked(own)


ValueLike: TypeAlias = Value | ArrayLike


def is_value(x: Any) -> TypeGuard[Value]:
    """Whether `x` is a [`quax.Value`][]."""
    return isinstance(x, Value)


class ArrayValue(Value):
    """A [`quax.Value`][] that represents an array: it gains `shape`, `dtype`, `ndim`
    and `size` from its `aval`, which must be a `jax.core.ShapedArray`."""

    @abc.abstractmethod
    def aval(self) -> ShapedArray:
        """See [`quax.Value.aval`][]."""

    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval().shape

    @property
    def dtype(self) -> Any:
        return self.aval().dtype

    @property
    def ndim(self) -> int:
        return self.aval().ndim

    @property
    def size(self) -> int:
        return self.aval().size


# Materialisation tracking ------------------------------------------------------------


@dataclasses.dataclass
class MaterialisationReport:
    """What a block of code materialised: a count per (primitive name, value type).

    The primitive is the one quax was dispatching when the value was densified
    (`"<outside>"` when it happened outside any primitive, e.g. a user call).
    """

    counts: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __bool__(self) -> bool:
        return self.total > 0

    def __str__(self) -> str:
        if not self.counts:
            return "no value was materialised"
        lines = ["materialised values (primitive, type: count):"]
        for (prim, typ), n in self.counts.most_common():
            lines.append(f"  {prim}, {typ}: {n}")
        return "\n".join(lines)


class _State(threading.local):
    reports: list[MaterialisationReport]
    primitive: str

    def __init__(self) -> None:
        self.reports = []
        self.primitive = "<outside>"


_state = _State()


@contextlib.contextmanager
def current_primitive(primitive: Primitive) -> Iterator[None]:
    """Name `primitive` as the one being dispatched, for materialisation reports."""
    previous = _state.primitive
    _state.primitive = primitive.name
    try:
        yield
    finally:
        _state.primitive = previous


def tracking() -> bool:
    return bool(_state.reports)


def _tracked(materialise: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @ft.wraps(materialise)
    def wrapper(self: Any) -> Any:
        if _state.reports:
            key = (_state.primitive, type(self).__qualname__)
            for report in _state.reports:
                report.counts[key] += 1
        return materialise(self)

    return wrapper


@contextlib.contextmanager
def track_materialisation() -> Iterator[MaterialisationReport]:
    """Record every [`quax.Value`][] materialised inside the block.

    ```python
    with quax.track_materialisation() as report:
        jax.jit(quax.quaxify(f)).lower(x)
    print(report)  # which primitive densified which type, and how often
    ```

    Materialisation happens at trace time, so trace the function inside the block
    (call it, or `.lower` it) rather than reusing an already compiled one.

    **Returns:**

    A [`quax.MaterialisationReport`][], filled in as the block runs.
    """
    report = MaterialisationReport()
    _state.reports.append(report)
    try:
        yield report
    finally:
        _state.reports.remove(report)
