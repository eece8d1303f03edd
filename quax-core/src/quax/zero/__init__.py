"""Symbolic zeros: [`quax.zero.Zero`][], an array known to be all zeros.

Operations on it are simplified at trace time (`x + zero` is `x`, `zero * x` and
`zero @ x` are zeros, reshapes and reductions of zeros are zeros); anything else
materialises it as `jnp.zeros`. A floating zero is signed as IEEE's is
(`Zero(shape, dtype, negative=True)` is `-0.`), and the rules keep the sign the
dense zero would have. See [`quax.zero.ieee_strict`][] for `0 * nan`.

The rules are registered through the plugin hooks (`quax.zero._plugin`), as an
installed family's are: `import quax` loads this built-in family.
"""

from ._value import (
    Zero as Zero,
    ieee_strict as ieee_strict,
    is_ieee_strict as is_ieee_strict,
)
