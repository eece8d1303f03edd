"""When a `cond`'s branch index counts as known: only as a constant of a staged
program. Eagerly, equation by equation or as one compiled eager program, it is a
run-time value, and the index is not read (whose branches must join instead)."""

import jax
import jax.numpy as jnp
import numpy as np
import quax._caching._eager as quax_eager
from quax._rules._control_flow import _known_index

from .helpers import Dense


def _constant_index():
    # Computed by equations on constants: under `jit`, a tracer whose value the
    # staged program shows.
    return (jnp.ones(()) + jnp.ones(()) > 1).astype(jnp.int32)


def test_index_known_when_staged():
    seen = {}

    def f(a):
        seen["literal"] = _known_index(np.int32(2))
        seen["constant"] = _known_index(_constant_index())
        seen["argument"] = _known_index((jnp.sum(a) > 0).astype(jnp.int32))
        return a

    jax.jit(f).trace(jnp.ones(3))
    assert seen == {"literal": 2, "constant": 1, "argument": None}


def test_index_not_known_eagerly():
    assert _known_index(np.int32(1)) is None
    assert _known_index(jnp.int32(1)) is None
    assert _known_index(True) is None


def test_index_not_read_in_a_compiled_eager_program():
    # Library code run eagerly as one compiled program must answer as it does
    # equation by equation: there the index is concrete, so not known. A constant
    # of the program is not read, and an index computed from a value's leaf does
    # not make the code fall back to running equation by equation
    # (`ConcreteNeeded`).
    seen = {}

    def f(v):
        seen["constant"] = _known_index(_constant_index())
        seen["leaf"] = _known_index((jnp.sum(v.array) > 0).astype(jnp.int32))
        return v

    value = Dense(jnp.ones(3))
    quax_eager._compile(f, [value], 1).trace(value.array)
    assert seen == {"constant": None, "leaf": None}
