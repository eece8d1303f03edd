"""Entry point of the `quant` family (see `quax.hookspecs`)."""

from collections.abc import Sequence
from types import ModuleType

from quax import Value
from quax.hookspecs import hookimpl


@hookimpl
def quax_register_rules() -> None:
    import quax_quant  # noqa: F401  (importing the package registers its rules)


@hookimpl
def quax_value_types() -> Sequence[type[Value]]:
    from quax_quant import QuantisedArray

    return [QuantisedArray]


@hookimpl
def quax_example_module() -> ModuleType:
    import quax_quant

    return quax_quant


@hookimpl
def quax_example_aliases() -> Sequence[str]:
    return ["quantised", "quantized"]
