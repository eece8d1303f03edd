"""quax-sparse: sparse arrays (BCOO, CSR, and BlockSparse, a matrix of dense
blocks) that unmodified JAX programs use at their own cost, inside `quax.quaxify`.

```python
import jax.numpy as jnp, quax, quax_sparse
a = quax_sparse.BCOO.fromdense(jnp.eye(1000), nse=1000)
y = quax.quaxify(lambda a, v: a @ v)(a, jnp.ones(1000))
```
"""

from . import _rules as _rules  # registers the rules
from ._cusolver import solver_route as solver_route
from ._jacobian import (
    colour as colour,
    hessian as hessian,
    jacfwd as jacfwd,
    jacrev as jacrev,
)
from ._values import (
    BCOO as BCOO,
    CSR as CSR,
    BlockSparse as BlockSparse,
    PendingSolve as PendingSolve,
    SparseLU as SparseLU,
    SparseMaterialisationError as SparseMaterialisationError,
    cho_factor as cho_factor,
    lu_factor as lu_factor,
)


fromdense = BCOO.fromdense


# Every family names its refusal after itself (`SparseMaterialisationError`), so
# that the errors of families imported side by side, and the core's
# `quax.MaterialisationError` they subclass, keep distinct names. 0.5.0 documented this
# one as `quax_sparse.MaterialisationError`: kept as an alias, the same class.
MaterialisationError = SparseMaterialisationError
