"""quax-sparse: (being written)."""
