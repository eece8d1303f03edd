"""quax-units: physical units for JAX programs, checked at trace time, free at run time.

```python
import jax, jax.numpy as jnp, quax
from quax_units import Quantity, ustrip

@jax.jit
@quax.quaxify
def kinetic(m, v):
    return 0.5 * m * v**2

ustrip("kJ", kinetic(Quantity(2.0, "kg"), Quantity(jnp.array([3.0, 4.0]), "km / s")))
```
"""

from . import _rules as _rules, constants as constants  # `_rules` registers the rules
from ._autodiff import (
    grad as grad,
    jacobian as jacobian,
    value_and_grad as value_and_grad,
)
from ._check import check_units as check_units
from ._dimensions import (
    Dimension as Dimension,
    Dimensions as Dimensions,
    UnitError as UnitError,
    amperes as amperes,
    candelas as candelas,
    dimensionless as dimensionless,
    kelvins as kelvins,
    kilograms as kilograms,
    meters as meters,
    moles as moles,
    seconds as seconds,
)
from ._interop import (
    from_astropy as from_astropy,
    from_pint as from_pint,
    to_astropy as to_astropy,
    to_pint as to_pint,
)
from ._systems import (
    UnitSystem as UnitSystem,
    cgs as cgs,
    galactic as galactic,
    si as si,
)
from ._units import Unit as Unit, unit as unit
from ._value import (
    Quantity as Quantity,
    Unitful as Unitful,
    UnitsMaterialisationError as UnitsMaterialisationError,
    ustrip as ustrip,
)


__version__ = "0.1.0"


# Every family names its refusal after itself (`UnitsMaterialisationError`), so
# that the errors of families imported side by side, and the core's
# `quax.MaterialisationError` they subclass, keep distinct names. 0.5.0 documented this
# one as `quax_units.MaterialisationError`: kept as an alias, the same class.
MaterialisationError = UnitsMaterialisationError
