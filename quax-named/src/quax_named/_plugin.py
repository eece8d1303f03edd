"""Entry point of the `named` family (see `quax.hookspecs`)."""

from collections.abc import Sequence
from types import ModuleType

from quax import Value
from quax.hookspecs import hookimpl


@hookimpl
def quax_register_rules() -> None:
    import quax_named  # noqa: F401  (importing the package registers its rules)


@hookimpl
def quax_value_types() -> Sequence[type[Value]]:
    from quax_named import NamedArray

    return [NamedArray]


@hookimpl
def quax_example_module() -> ModuleType:
    import quax_named

    return quax_named


@hookimpl
def quax_example_aliases() -> Sequence[str]:
    return []
