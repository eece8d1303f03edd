"""Introspection: which families are installed, which rule a primitive resolves to,
and what a program materialises."""

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.extend.core.primitives as jprim

from ._compat import Primitive
from ._dispatch import _plugins, _registry
from ._transform._quaxify import quaxify
from ._values._value import MaterialisationReport, track_materialisation


__all__ = ["FamilySummary", "materialisations", "primitive_named", "summarise"]


@dataclasses.dataclass(frozen=True)
class FamilySummary:
    """One installed family: where it comes from and what it registers."""

    name: str
    distribution: str
    version: str
    state: str
    value_types: tuple[str, ...]
    num_rules: int
    primitives: tuple[str, ...]
    error: str | None


def summarise(load: bool = True) -> list[FamilySummary]:
    """Describe every installed family.

    **Arguments:**

    - `load`: load the families first (otherwise unloaded ones show no rules).

    **Returns:**

    A list of [`quax.plugins.FamilySummary`][].
    """
    if load:
        _plugins.load()
    out = []
    for family in _plugins.families():
        owned = [
            p
            for p, regs in _registry._registrations.items()
            for r in regs
            if family.owns(getattr(r.function, "__module__", "") or "")
        ]
        prims = sorted({p.name for p in owned})
        num_rules = len(owned)
        out.append(
            FamilySummary(
                family.name,
                family.distribution,
                family.version,
                family.state,
                tuple(t.__qualname__ for t in _plugins.value_types(family)),
                num_rules,
                tuple(prims),
                family.error,
            )
        )
    return out


def primitive_named(name: str) -> Primitive:
    """The JAX primitive called `name` (`"dot_general"`, `"mul"`, ...)."""
    for primitive in _registry._registrations:
        if primitive.name == name:
            return primitive
    candidate = getattr(jprim, f"{name}_p", None)
    if isinstance(candidate, Primitive):
        return candidate
    raise LookupError(f"No JAX primitive named {name!r}.")


def materialisations(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> MaterialisationReport:
    """Trace `quaxify(fn)(*args, **kwargs)` (without compiling or running it) and
    report every value it materialises, by primitive and type, and every refusal
    to materialise (tracing goes on past each, so a strict model reports all).

    **Arguments:**

    - `fn`: the program.
    - `*args`, `**kwargs`: its inputs, with the values to check: any pytree, as
        `eqx.filter_eval_shape` takes (a model with activation functions, ...).

    **Returns:**

    A [`quax.MaterialisationReport`][].
    """
    _plugins.autoload()
    with track_materialisation(collect_refusals=True) as report:
        eqx.filter_eval_shape(quaxify(fn), *args, **kwargs)
    return report
