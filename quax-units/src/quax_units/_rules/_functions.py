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
  cm and 1e-8 km are different tolerances);
- `jnp.round(a, decimals)` (and `jnp.around`) multiplies by `10**decimals`
  before rounding, which turns a temperature in `degC` into one in `K`, where the
  primitive rule for `round` would round the kelvin (20.6 °C to one decimal is
  293.8 K, 20.65 °C): the operand's unit is checked as that rule checks it;
- `jnp.sinc` divides by its operand, so an angle in `deg` came out shown in
  `1 / deg`: it is computed on the numbers of a dimensionless operand (angles in
  radians, as `jnp.sin` reads them) and shown dimensionless.
"""

from typing import Any

import jax.numpy as jnp
import quax
from quax._compat import release_traces

from .._dimensions import UnitError, dimensionless
from .._value import Quantity, describe
from ._arrays import _array, _Operand, _refuse_rounding_in_si, _same_units, _wrap


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


# The numbers of decimals the rounding rules take (`decimals` is a static argument
# of `jnp.round`: a rule runs only for the values it declares; any other runs the
# body, which rounds the SI numbers).
_DECIMALS = tuple(range(-8, 9))


@quax.register_function(jnp.round, static={"decimals": _DECIMALS})
def _round(a: Quantity, *, decimals: int = 0, call: Any) -> Any:
    _refuse_rounding_in_si("`jnp.round` of", a)
    return call(a)


@quax.register_function(jnp.around, static={"decimals": _DECIMALS})
def _around(a: Quantity, *, decimals: int = 0, call: Any) -> Any:
    _refuse_rounding_in_si("`jnp.around` of", a)
    return call(a)


@quax.register_function(jnp.sinc)
def _sinc(x: Quantity, *, call: Any) -> Quantity:
    if not x.units.is_dimensionless:
        raise UnitError(
            f"`jnp.sinc` needs a dimensionless operand (angles count, in radians), "
            f"but got {describe(x)}. Divide by a reference quantity, or strip the "
            "units with `quax_units.ustrip`."
        )
    return _wrap(jnp.sinc(x.array), dimensionless, None)
