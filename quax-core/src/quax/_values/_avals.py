"""Declared avals: the `aval` of a value type that names its leaf (`aval_leaf`; see
`quax.Value.aval`)."""

import dataclasses
from collections.abc import Callable
from typing import Any

from .._compat import typeof
from .._foundation import _debug


__all__ = ["declared_aval"]

_object_getattribute = object.__getattribute__


def declared_aval(
    cls: type, name: str, value_classes: set[type]
) -> Callable[[Any], Any]:
    """The `aval` of a class declaring `aval_leaf = name`: the field's aval (its
    `jax.typeof`, or its own `aval()` when its type is in `value_classes`), checked
    against the class's own `aval` method (if any) under debug checks."""
    _check_aval_leaf(cls, name)
    reference = vars(cls).get("aval")
    if reference is None:
        # Inherited: a parent's method, or the reference of its generated `aval`.
        reference = getattr(cls.aval, "__quax_reference__", cls.aval)
    if getattr(reference, "__isabstractmethod__", False):
        reference = None

    def aval(self: Any) -> Any:
        leaf = _object_getattribute(self, name)
        out = type(leaf).aval(leaf) if type(leaf) in value_classes else typeof(leaf)
        if reference is not None and _debug.is_enabled():
            _check_declared(self, name, out, reference(self))
        return out

    aval.__qualname__ = f"{cls.__qualname__}.aval"
    aval.__doc__ = f"The aval of the field `{name}` (declared by `aval_leaf`)."
    aval.__quax_reference__ = reference  # pyright: ignore[reportFunctionMemberAccess]
    return aval


def _check_aval_leaf(cls: type, name: str) -> None:
    """Refuse an `aval_leaf` that names no field of `cls`, or a static one."""
    for k in cls.__mro__:
        annotation = vars(k).get("__annotations__", {}).get(name)
        if annotation is None:
            continue
        if "ClassVar" in str(annotation):
            break
        default = vars(k).get(name)
        if isinstance(default, dataclasses.Field) and default.metadata.get("static"):
            raise TypeError(
                f"{cls.__qualname__} declares `aval_leaf = {name!r}`, but `{name}` "
                "is a static field: the aval must come from an array (or value) "
                "leaf. Name the leaf whose `jax.typeof` is the value's aval, or "
                "remove `aval_leaf` and implement `aval`."
            )
        return
    raise TypeError(
        f"{cls.__qualname__} declares `aval_leaf = {name!r}`, but it has no field "
        f"`{name}`. Name the leaf whose `jax.typeof` is the value's aval, or remove "
        "`aval_leaf` and implement `aval`."
    )


def _described(aval: Any) -> str:
    weak = " (weakly typed)" if getattr(aval, "weak_type", False) else ""
    return aval.str_short() + weak


def _check_declared(value: Any, name: str, declared: Any, reference: Any) -> None:
    same = (
        declared.shape == reference.shape
        and declared.dtype == reference.dtype
        and getattr(declared, "weak_type", False)
        == getattr(reference, "weak_type", False)
    )
    if not same:
        cls = type(value).__qualname__
        raise TypeError(
            f"{cls} declares `aval_leaf = {name!r}`, so quax reads its aval from "
            f"the field `{name}`: {_described(declared)}; but `{cls}.aval` gives "
            f"{_described(reference)}. The declaration is wrong for this value: "
            f"name the field whose aval is the value's, or remove `aval_leaf` "
            "to have quax call `aval`."
        )
