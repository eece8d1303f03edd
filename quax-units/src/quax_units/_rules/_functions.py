"""The quax rules of quax-units for jitted `jax.numpy` functions whose bodies are
written for plain arrays in a way no primitive rule can follow (registered with
`quax.register_function`, for operands that are quantities or plain arrays; with
another family's value among them the body runs under the rules as usual):

- `jnp.hypot` divides by `where(x == 0, 1, x)`: a plain 1 among lengths. It is
  computed whole on the SI-coherent numbers of operands of one dimension, in the
  first quantity's unit;
- `jnp.isclose` (and `jnp.allclose`, which calls it) adds JAX's default `atol`, a
  plain `1e-8`, to `rtol * |b|`: its `UnitError` names the way out, an `atol` in
  the operands' units (read in the first operand's unit it would be a guess: 1e-8
  cm and 1e-8 km are different tolerances).
"""

from typing import Any

import jax.numpy as jnp
import quax
from quax._compat import release_traces

from .._dimensions import UnitError
from .._value import Quantity, describe
from ._arrays import _array, _Operand, _same_units, _wrap


@quax.register_function(jnp.hypot)
def _hypot(x: _Operand, y: _Operand, *, call: Any) -> Quantity:
    dims, shown = _same_units("jnp.hypot", [x, y])
    # `hypot(x, y)` is `|x|` times a function of `y / x`: in any unit of the common
    # dimensions it is the same length, so it is computed on the SI numbers.
    return _wrap(jnp.hypot(_array(x), _array(y)), dims, shown.linear)


@quax.register_function(jnp.isclose)
def _isclose(*args: _Operand, call: Any) -> Any:
    try:
        return call(*args)
    except UnitError as e:
        release_traces(e)
        operands = ", ".join(describe(a) for a in args)
        raise UnitError(
            f"`jnp.isclose`/`jnp.allclose` of {operands}: {e}\n"
            "JAX's default `atol` is a plain 1e-8, which has no units: pass a "
            "tolerance in the operands' dimensions, `atol=Quantity(1e-8, unit)`, or "
            "`atol=0`. (A plain `atol` is not read in the first operand's unit: 1e-8 "
            "cm and 1e-8 km are different tolerances.)"
        ) from None
