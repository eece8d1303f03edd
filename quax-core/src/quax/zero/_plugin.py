"""The symbolic zeros as a family built into quax-core: they implement the same hooks
as an installed family (see `quax.hookspecs`), and `quax.plugins` loads them at
`import quax`."""

import importlib
from collections.abc import Sequence
from types import ModuleType

from .._values._value import Value
from ..hookspecs import hookimpl
from ._value import Zero


@hookimpl
def quax_register_rules() -> None:
    importlib.import_module("quax.zero._rules")  # importing it registers the rules


@hookimpl
def quax_value_types() -> Sequence[type[Value]]:
    return [Zero]


@hookimpl
def quax_example_module() -> ModuleType:
    return importlib.import_module("quax.zero")


@hookimpl
def quax_example_aliases() -> Sequence[str]:
    return []
