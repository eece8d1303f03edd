"""Who registered a quax rule (its distribution), for the registry's conflict
reports and messages."""

import functools as ft
import importlib.metadata
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from .._compat import Primitive


__all__ = ["RuleConflictWarning", "describe_rule", "owner", "report_conflict"]


class RuleConflictWarning(UserWarning):
    """Two distributions registered the same signature for the same primitive, or
    a rule without annotations caught a value type of another distribution."""


@ft.cache
def _packages_distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


@ft.cache
def _distribution_of(package: str) -> str:
    """The installed distribution providing the top-level `package`, else the
    package's own name. (Editable installs are not in `packages_distributions`;
    they are found by the distribution named like the package.)"""
    found = _packages_distributions().get(package)
    if found:
        return found[0]
    try:
        return importlib.metadata.distribution(package).metadata["Name"]
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return package


def owner(function: Callable[..., Any]) -> str:
    """Who registered a rule: the distribution of its module, else its top-level
    module. A signature registered again by the same owner is a redefinition, not
    a conflict."""
    return _distribution_of(
        (getattr(function, "__module__", None) or "?").split(".")[0]
    )


def describe_rule(function: Callable[..., Any]) -> str:
    """`module.name at file:line` of a rule, for messages."""
    inner = inspect.unwrap(function)
    name = (
        f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', inner)}"
    )
    code = getattr(inner, "__code__", None)
    if code is None:
        return name
    return f"{name} at {code.co_filename}:{code.co_firstlineno}"


def report_conflict(
    primitive: Primitive,
    old: Callable[..., Any],
    old_precedence: int,
    new: Callable[..., Any],
    new_precedence: int,
) -> None:
    """Warn that the rules `old` and `new` of two owners have the same signature
    for `primitive`, and which one wins."""
    old_name = f"{owner(old)} ({describe_rule(old)})"
    new_name = f"{owner(new)} ({describe_rule(new)})"
    if new_precedence == old_precedence:
        outcome = (
            f"both have precedence {new_precedence}, so the later one, {new_name}, "
            "wins; give one of them a different `precedence=` to choose explicitly"
        )
    else:
        winner = new_name if new_precedence > old_precedence else old_name
        outcome = f"{winner} wins by its higher precedence"
    warnings.warn(
        f"Two quax rules for primitive `{primitive.name}` have the same signature: "
        f"{old_name} (precedence {old_precedence}) and {new_name} (precedence "
        f"{new_precedence}); {outcome}.",
        RuleConflictWarning,
        stacklevel=3,
    )
