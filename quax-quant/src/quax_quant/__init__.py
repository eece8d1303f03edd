"""quax-quant: (being written)."""
