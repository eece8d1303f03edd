"""Fast construction of value classes: `ValueMeta`, the metaclass of
[`quax.Value`][].

Quax builds values on its hot path (every rule returns new ones), where equinox's
general construction would cost as much as binding the primitive (timings in
`benchmarks/README.md`).
"""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .._compat import (
    eqx_finish_init,
    eqx_has_dataclass_init,
    eqx_warn_transformed_function,
)


__all__ = ["ValueMeta"]


class ValueMeta(type(eqx.Module)):
    """Equinox's metaclass, with fast constructors for plain value classes.

    For a class with the dataclass `__init__` and nothing for equinox to check after
    it (no converters, no `__check_init__`, no `init=False` fields), construction is
    the dataclass `__init__` alone; see `_constructor` for the two ways to run it.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            construct = _constructors[cls]
        except KeyError:
            construct = _constructors[cls] = _constructor(cls)
        return construct(cls, *args, **kwargs)


_constructors: dict[type, Callable[..., Any]] = {}


def _constructor(cls: type) -> Callable[..., Any]:
    """How `ValueMeta` builds a `cls`: a function of `(cls, *args, **kwargs)`."""
    if getattr(cls, "__abstractmethods__", None) or not eqx_has_dataclass_init(cls):
        return _construct_general
    if any("__check_init__" in vars(k) for k in cls.__mro__):
        return _construct_general
    fields = dataclasses.fields(cls)
    if not all(f.init and "converter" not in f.metadata for f in fields):
        return _construct_general
    return _generated_init(cls, fields) or _construct_dataclass_init


def _construct_general(cls: ValueMeta, *args: Any, **kwargs: Any) -> Any:
    return super(ValueMeta, cls).__call__(*args, **kwargs)


def _construct_dataclass_init(cls: ValueMeta, *args: Any, **kwargs: Any) -> Any:
    self = type.__call__(cls, *args, **kwargs)
    eqx_finish_init(self)
    return self


# The names the generated constructors use besides their parameters.
_GENERATED_GLOBALS = frozenset(
    {
        "self",
        "__quax_self__",
        "__quax_new__",
        "__quax_set__",
        "__quax_check__",
        "__quax_unchecked__",
        "__quax_defaults__",
    }
)


def _generated_init(
    cls: type, fields: tuple[dataclasses.Field, ...]
) -> Callable[..., Any] | None:
    """The dataclass `__init__` of `cls` as a constructor that sets each field with
    `object.__setattr__`, as a frozen dataclass's does: cheaper than going through
    equinox's `__new__` and `__setattr__`, which only do bookkeeping for
    `__init__` methods that assign fields themselves. `None` when `cls.__init__` is not
    exactly the one generated from `fields` (a `__post_init__`, `InitVar`s, default
    factories, a custom `__new__`), where the dataclass `__init__` itself is run.

    Like equinox's `__setattr__`, it warns about each field that holds a
    JAX-transformed function."""
    if (
        hasattr(cls, "__post_init__")
        or cls.__new__ is not eqx.Module.__new__
        or any(f.name in _GENERATED_GLOBALS for f in fields)
    ):
        return None
    if any(f.default_factory is not dataclasses.MISSING for f in fields):
        return None
    # The dataclass puts keyword-only fields last, each group in field order.
    positional = [f for f in fields if not f.kw_only]
    keyword = [f for f in fields if f.kw_only]
    expected = [("self", _POSITIONAL, _EMPTY)]
    expected += [(f.name, _POSITIONAL, _default(f)) for f in positional]
    expected += [(f.name, _KEYWORD, _default(f)) for f in keyword]
    actual = inspect.signature(cls.__init__).parameters.values()
    if len(actual) != len(expected) or any(
        (p.name, p.kind) != (name, kind) or p.default is not default
        for p, (name, kind, default) in zip(actual, expected, strict=False)
    ):
        return None
    header = ["self", *map(_parameter, positional)]
    if keyword:
        header += ["*", *map(_parameter, keyword)]
    body = "".join(
        f"    if type({f.name}) not in __quax_unchecked__:\n"
        f"        __quax_check__(self, {f.name})\n"
        f"    __quax_set__(__quax_self__, {f.name!r}, {f.name})\n"
        for f in fields
    )
    source = (
        f"def __init__({', '.join(header)}):\n"
        "    __quax_self__ = __quax_new__(self)\n"
        f"{body}"
        "    return __quax_self__\n"
    )
    namespace: dict[str, Any] = {
        "__quax_new__": object.__new__,
        "__quax_set__": object.__setattr__,
        "__quax_check__": _check_field,
        "__quax_unchecked__": _unchecked_types,
        "__quax_defaults__": {f.name: f.default for f in fields},
    }
    exec(source, namespace)
    init = namespace["__init__"]
    # Argument errors name `cls.__init__`, as the dataclass `__init__`'s do.
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


# The types of field values that equinox's check never warns about (arrays,
# tracers, scalars): seen once, they skip it, as rules build values on the hot path.
_unchecked_types: set[type] = set()
_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def _check_field(cls: type, value: Any) -> None:
    eqx_warn_transformed_function(cls, value)
    if isinstance(value, _ARRAY_TYPES):
        _unchecked_types.add(type(value))


_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_EMPTY = inspect.Parameter.empty


def _default(f: dataclasses.Field) -> Any:
    return _EMPTY if f.default is dataclasses.MISSING else f.default


def _parameter(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING:
        return f.name
    return f"{f.name}=__quax_defaults__[{f.name!r}]"
