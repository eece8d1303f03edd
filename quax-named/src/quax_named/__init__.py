"""quax-named: (being written)."""
