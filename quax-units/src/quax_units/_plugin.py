"""Entry point of the `units` family (see `quax.hookspecs`)."""

from collections.abc import Sequence
from types import ModuleType

from quax import Value
from quax.hookspecs import hookimpl


@hookimpl
def quax_register_rules() -> None:
    import quax_units  # noqa: F401  (importing the package registers its rules)


@hookimpl
def quax_value_types() -> Sequence[type[Value]]:
    from quax_units import Quantity

    return [Quantity]


@hookimpl
def quax_example_module() -> ModuleType:
    import quax_units

    return quax_units


@hookimpl
def quax_example_aliases() -> Sequence[str]:
    return ["unitful"]
