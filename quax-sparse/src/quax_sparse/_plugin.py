"""Entry point of the `sparse` family (see `quax.hookspecs`)."""

from collections.abc import Sequence
from types import ModuleType

from quax import Value
from quax.hookspecs import hookimpl


@hookimpl
def quax_register_rules() -> None:
    import quax_sparse  # noqa: F401  (importing the package registers its rules)


@hookimpl
def quax_value_types() -> Sequence[type[Value]]:
    from quax_sparse import BCOO, CSR, BlockSparse

    return [BCOO, CSR, BlockSparse]


@hookimpl
def quax_example_module() -> ModuleType:
    import quax_sparse

    return quax_sparse


@hookimpl
def quax_example_aliases() -> Sequence[str]:
    return []
