"""A value type's checks, re-run where a value comes into quax from outside.

Equinox runs a module's `__check_init__` methods after its `__init__`, but JAX and
Equinox rebuild a pytree without either: `jax.tree_util.tree_unflatten`, and so
`jax.tree.map` (an optimiser's update), `eqx.tree_at` (model surgery), `eqx.combine`,
`jax.vmap`'s view of one example. A value rebuilt so can hold a leaf whose shape or
dtype its type does not allow (a LoRA factor `a` of shape `(1, rank)`), and the rules,
which assume the type's invariants, would broadcast it silently into a wrong result.

So `quax.quaxify` re-runs every `__check_init__` of a value's type (each class's own,
in the order Equinox runs them) where it boxes a value that comes from outside quax:
its arguments, and values closed over that meet its tracers or a JAX function. Values
held in a value's fields (the weight of a QLoRA `LoraArray`, the parts of a sum), and
the Equinox modules there (a double-quantised scale), are checked too. A value
type's `__check_init__` must therefore read only static structure (shapes, dtypes,
static fields), never array values, which may be tracers; the checks then cost
tracing time only, never work in the compiled program. The values that rules build
inside quax are not checked again: the rules keep their types' invariants (and under
the debug checks their outputs' avals are compared with JAX's).
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
from jax.errors import ConcretizationTypeError

from ._value import Value, value_classes


__all__ = ["check_value"]

# Each value type's own `__check_init__` methods, in method resolution order (as
# Equinox runs them), and the names of its fields: filled on first use.
_checks: dict[type, tuple[tuple[Callable[[Any], None], ...], tuple[str, ...]]] = {}


def check_value(value: Value | eqx.Module) -> None:
    """Re-run the checks of `value`'s type (its `__check_init__` methods), and those
    of the values and Equinox modules held in its fields, as their constructors ran
    them.

    **Arguments:**

    - `value`: a [`quax.Value`][] (or an Equinox module held in one), perhaps
        rebuilt without its constructor.

    **Raises:**

    `ValueError`, naming the type and chaining the check's own error (which names
    the field), when a check fails.
    """
    cls = type(value)
    try:
        checks, names = _checks[cls]
    except KeyError:
        checks, names = _checks[cls] = _class_checks(cls)
    for check in checks:
        try:
            check(value)
        except ConcretizationTypeError:
            # A check that reads array values (against the contract above), which
            # are tracers here: it is skipped, as quax skipped it before it re-ran
            # checks, rather than fail a program that ran.
            continue
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"quax met a `{cls.__qualname__}` whose fields break its own checks: "
                f"{e} Its constructor refuses such a value; one rebuilt without it "
                "(`eqx.tree_at`, `jax.tree.map`, `jax.tree_util.tree_unflatten`, an "
                "optimiser's update) skips the checks, so quax runs them again here, "
                "before any rule reads it. Build it with its constructor "
                f"(`{cls.__qualname__}(...)`), or swap in leaves of the shapes and "
                "dtypes that the ones replaced had."
            ) from e
    fields = vars(value)
    for name in names:
        field: Any = fields.get(name)
        kind = _kinds.get(type(field))
        if kind is None:
            kind = _kinds[type(field)] = _kind(type(field))
        if kind is _MODULE:
            check_value(field)
        elif kind is _CONTAINER:
            for leaf in jtu.tree_leaves(field, is_leaf=_is_module):
                if isinstance(leaf, eqx.Module):
                    check_value(leaf)


# What a field's type holds, by type: a module to check, a container to walk, or
# neither (an array, a number, static data): one dict lookup per field.
_MODULE, _CONTAINER, _NEITHER = "module", "container", "neither"
_kinds: dict[type, str] = {}


def _kind(cls: type) -> str:
    if cls in value_classes or issubclass(cls, eqx.Module):
        return _MODULE
    if issubclass(cls, (tuple, list, dict)):
        return _CONTAINER
    return _NEITHER


def _is_module(x: Any) -> bool:
    return isinstance(x, eqx.Module)


def _class_checks(
    cls: type,
) -> tuple[tuple[Callable[[Any], None], ...], tuple[str, ...]]:
    checks = tuple(
        k.__dict__["__check_init__"] for k in cls.__mro__ if "__check_init__" in vars(k)
    )
    names = tuple(getattr(cls, "__dataclass_fields__", {}))
    return checks, names
