"""Entry point of the `units` family (see `quax.hookspecs`)."""

from quax.hookspecs import hookimpl


@hookimpl
def quax_register_rules() -> None:
    import quax_units  # noqa: F401  (importing the package registers its rules)
