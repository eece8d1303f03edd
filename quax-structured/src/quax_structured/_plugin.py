"""Entry point of the `structured` family (see `quax.hookspecs`)."""

from collections.abc import Sequence
from types import ModuleType

from quax import Value
from quax.hookspecs import hookimpl


@hookimpl
def quax_register_rules() -> None:
    import quax_structured  # noqa: F401  (importing the package registers its rules)


@hookimpl
def quax_value_types() -> Sequence[type[Value]]:
    import quax_structured

    return quax_structured.VALUE_TYPES


@hookimpl
def quax_example_module() -> ModuleType:
    import quax_structured

    return quax_structured


@hookimpl
def quax_example_aliases() -> Sequence[str]:
    return ["structured_matrices"]
