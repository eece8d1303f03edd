import itertools
import sys
from pathlib import Path

import equinox as eqx
import jax.random as jr
import jax.tree_util as jtu
import pytest
import quax_lora


# The tests import their shared helper, `lora_helpers`, from this folder.
sys.path.insert(0, str(Path(__file__).parent))
from lora_helpers import normal


def _perturb(model, key):
    """Give every LoraArray a nonzero `b` (a fresh one computes exactly `w`)."""
    counter = itertools.count()

    def leaf(x):
        if isinstance(x, quax_lora.LoraArray):
            b = 0.1 * normal(jr.fold_in(key, next(counter)), x.b.shape, x.b.dtype)
            return eqx.tree_at(lambda y: y.b, x, b)
        return x

    return jtu.tree_map(leaf, model, is_leaf=quax_lora.is_lora)


@pytest.fixture
def perturb():
    return _perturb
