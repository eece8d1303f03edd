"""Entry point of the `lora` family (see `quax.hookspecs`)."""

from collections.abc import Sequence
from types import ModuleType

import quax
from quax.hookspecs import hookimpl


@hookimpl
def quax_register_rules() -> None:
    import quax_lora  # noqa: F401  (importing the package registers its rules)


@hookimpl
def quax_value_types() -> Sequence[type[quax.Value]]:
    from quax_lora import LoraArray

    return [LoraArray]


@hookimpl
def quax_example_module() -> ModuleType:
    import quax_lora

    return quax_lora


@hookimpl
def quax_example_aliases() -> Sequence[str]:
    return []
