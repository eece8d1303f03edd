"""`jnp.hypot` (a rule registered with `quax.register_function`) under `vmap`:
outside `quaxify` the rule sees each example's operands; inside it, JAX hands
quax the batched body, which the rule cannot read (it used to broadcast the
batched operand against the unbatched one along the wrong axis)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_units import Quantity, UnitError, ustrip


legs = jnp.arange(1.0, 10.0).reshape(3, 3)
other = jnp.array([10.0, 20.0, 30.0])


def test_vmap_outside_quaxify_uses_each_examples_operands() -> None:
    f = jax.vmap(quax.quaxify(jnp.hypot), in_axes=(1, None))
    out = f(Quantity(legs, "m"), Quantity(other / 1000, "km"))
    assert isinstance(out, Quantity)
    assert out.unit == "m"
    expected = jax.vmap(jnp.hypot, in_axes=(1, None))(legs, other)
    np.testing.assert_allclose(ustrip("m", out), expected, rtol=1e-6)


@pytest.mark.parametrize("in_axes", [(1, None), (1, 0)])
def test_vmap_inside_quaxify_is_refused_not_misread(in_axes: tuple) -> None:
    def f(a, b):
        return jax.vmap(jnp.hypot, in_axes=in_axes)(a, b)

    # Before, `(1, None)` gave hypot(legs[i, j], other[j]) instead of
    # hypot(legs[j, i], other[j]), and `(1, 0)` its transpose, with no error.
    with pytest.raises(UnitError) as info:
        quax.quaxify(f)(Quantity(legs, "m"), Quantity(other, "m"))
    assert "jax.vmap(quax.quaxify(f))" in "".join(info.value.__notes__)
