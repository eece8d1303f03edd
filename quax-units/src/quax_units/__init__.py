"""quax-units (work in progress)."""
