"""Entry point of the `lora` family (see `quax.hookspecs`)."""

from quax.hookspecs import hookimpl


@hookimpl
def quax_register_rules() -> None:
    import quax_lora  # noqa: F401  (importing the package registers its rules)
