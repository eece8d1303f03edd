"""The plugin: the family is `quax.examples.sparse`."""

import quax
from quax_sparse import BCOO


def test_is_quax_examples_sparse():
    assert quax.examples.sparse.BCOO is BCOO
