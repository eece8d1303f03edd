"""Plugin discovery (placeholder until the loader lands)."""


def autoload() -> None:
    """Load every installed family once."""
