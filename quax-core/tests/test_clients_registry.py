"""What the published quax's clients register: quaxed's test wrapper declares rules
with no positional parameters for primitives it does not support (`after_all`,
`psum`, ...), as placeholders. plum accepts them: they match only a call with no
operands, so they never catch a call on a value."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import quax
from jax import lax

from .helpers import Dense


def test_rule_without_positional_parameters_is_accepted() -> None:
    def placeholder(**params: Any) -> Any:
        raise NotImplementedError

    assert quax.register(lax.nextafter_p)(placeholder) is placeholder
    # It catches no call on a value: `Dense`'s default runs, with the right result.
    assert quax.resolve(lax.nextafter_p, [Dense, jax.Array]).kind == "default"
    x, y = np.array([1.0, 2.0], np.float32), np.array([2.0, 1.0], np.float32)
    out = quax.quaxify(lax.nextafter)(Dense(jnp.asarray(x)), jnp.asarray(y))
    assert isinstance(out, Dense)
    np.testing.assert_array_equal(np.asarray(out.array), np.nextafter(x, y))


def test_rule_without_any_parameter_is_accepted() -> None:
    def placeholder() -> Any:
        raise NotImplementedError

    assert quax.register(lax.after_all_p)(placeholder) is placeholder
    assert quax.resolve(lax.after_all_p, [Dense]).kind == "default"
