"""Loop buffers that start as plain constants and receive quantities (quax-units):
quax lifts a start that is one constant fill which fits any unit (zeros, infinities,
NaNs) into the body's units, and never a start that only partly matches one."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from quax_units import Quantity, UnitError, ustrip


ROW = Quantity(jnp.array([1.0, 2.0]), "m")


def _fill_row_0(start: Any) -> Any:
    return lambda q: lax.fori_loop(0, 1, lambda i, b: b.at[0].set(q), start)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_partly_filled_buffer_raises(jit: bool) -> None:
    # The case: lifting the start would turn the plain 7s into metres.
    f = quax.quaxify(_fill_row_0(jnp.array([[0.0, 0.0], [7.0, 7.0]])))
    with pytest.raises(UnitError, match="`scatter` needs operands of the same"):
        (jax.jit(f) if jit else f)(ROW)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_filled_buffer_takes_the_units(jit: bool) -> None:
    f = quax.quaxify(_fill_row_0(jnp.full((2, 2), jnp.nan)))
    out = (jax.jit(f) if jit else f)(ROW)
    assert type(out) is Quantity
    np.testing.assert_array_equal(ustrip("m", out), [[1.0, 2.0], [np.nan, np.nan]])
