"""quax-structured: (being written)."""
