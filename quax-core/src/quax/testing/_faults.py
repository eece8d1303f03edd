"""`assert_registration_all_or_nothing`: a family whose registration raises half-way
leaves quax as it was."""

import warnings
from collections.abc import Callable
from typing import Any

from .._caching import _keys
from .._dispatch import _registry
from .._dispatch._plugins import PluginWarning, load_in_process
from .._foundation._owners import describe_rule
from .._values import _value
from ..hookspecs import hookimpl


__all__ = ["RegistrationFault", "assert_registration_all_or_nothing", "registry_state"]


class RegistrationFault(Exception):
    """The error a faulty family of `assert_registration_all_or_nothing` raises."""


def registry_state() -> dict[str, Any]:
    """What families add to quax, as it stands: comparable between two calls.

    **Returns:**

    A dict: `"rules"`, per primitive (by name) the registered rules in order, each
    `(function, precedence)`; `"settings"`, the functions given to
    `quax.plugins.add_setting`; `"value types"`, every subclass of `quax.Value`.
    """
    rules = {
        primitive.name: tuple((r.function, r.precedence) for r in registrations)
        for primitive, registrations in _registry._registrations.items()
        if registrations
    }
    return {
        "rules": rules,
        "settings": tuple(_keys._settings),
        "value types": frozenset(_value.value_classes),
    }


def _differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    problems = []
    rules_before, rules_after = before["rules"], after["rules"]
    for name in sorted(rules_before.keys() | rules_after.keys()):
        was, now = rules_before.get(name, ()), rules_after.get(name, ())
        if was != now:
            added = [f for f, _ in now if all(f is not g for g, _ in was)]
            lost = [f for f, _ in was if all(f is not g for g, _ in now)]
            problems.append(
                f"the rules for `{name}` changed (kept: "
                f"{[describe_rule(f) for f in added]}; lost: "
                f"{[describe_rule(f) for f in lost]})"
            )
    if before["settings"] != after["settings"]:
        problems.append(
            f"the settings changed: {before['settings']} -> {after['settings']}"
        )
    kept = after["value types"] - before["value types"]
    if kept:
        names = sorted(f"{t.__module__}.{t.__qualname__}" for t in kept)
        problems.append(f"value types were kept: {names}")
    return problems


def assert_registration_all_or_nothing(
    register: Callable[[], Any], name: str = "faulty"
) -> None:
    """Check that a family whose registration raises half-way leaves quax as it
    was: no rule, setting or value type of it is kept, and every rule it replaced
    is back.

    ```python
    def register():
        @quax.register(jax.lax.exp_p)
        def _(x: MyArray, **params):
            ...
        importlib.reload(my_family._rules)  # or a real family's registrations

    quax.testing.assert_registration_all_or_nothing(register)
    ```

    `register` runs as the `quax_register_rules` hook of a family loaded by quax's
    plugin loader (not installed: loaded in this process), which then raises. The
    check passes when the loader reports the failure (a `quax.plugins.PluginWarning`
    naming the family and the error) and every rule (by function and precedence),
    setting and value type is as before `register` ran.

    **Arguments:**

    - `register`: registers what a family would (rules, settings, value types).
    - `name`: the faulty family's name, in the warning.

    **Returns:**

    Nothing.

    **Raises:**

    `AssertionError` naming what was kept or lost.
    """
    message = f"the family {name!r} raised half-way through registering"

    class Faulty:
        @hookimpl
        def quax_register_rules(self) -> None:
            register()
            raise RegistrationFault(message)

    before = registry_state()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        family = load_in_process(name, Faulty())
    after = registry_state()
    reports = [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]
    if family.state != "failed" or not any(
        repr(name) in r and message in r for r in reports
    ):
        raise AssertionError(
            f"the loader did not report the faulty family {name!r} as failed (state "
            f"{family.state!r}; warnings: {reports})"
        )
    problems = _differences(before, after)
    if problems:
        raise AssertionError(
            f"a family that raised half-way through registering left quax changed: "
            f"{'; '.join(problems)}"
        )
