import sys
from pathlib import Path

import jax
import pytest


sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def x64():
    """float64 for one test. The global flag, not the thread-local
    `jax.enable_x64` context: JAX runs a host callback's output conversion in its
    own thread, which that context does not reach (float64 results would be cast
    to float32 there)."""
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)
