"""quax-lora (work in progress)."""
