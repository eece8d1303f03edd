"""Every quax rule of quax-units (every `quax.register` of the family is in this
package; importing it registers them):

- `_arrays`: `lax`'s array primitives: which keep, combine or require units;
- `_check`: the primitive behind `check_units`;
- `_functions`: jitted `jax.numpy` functions computed whole (`jnp.hypot`,
  `jnp.sinc`), checked first (`jnp.round`) or whose errors name the way out
  (`jnp.isclose`);
- `_linalg`: linear algebra and Fourier transforms;
- `_lineax`: lineax's `linear_solve` primitive (when lineax is installed);
- `_strip`: the primitives behind `ustrip`.
"""

from . import (
    _arrays as _arrays,
    _check as _check,
    _functions as _functions,
    _linalg as _linalg,
    _lineax as _lineax,
    _strip as _strip,
)
