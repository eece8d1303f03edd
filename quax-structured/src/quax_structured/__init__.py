"""quax-structured: structured matrices that unmodified `jnp.linalg` code solves at
the structure's cost.

```python
import jax.numpy as jnp, quax
from quax_structured import TridiagonalMatrix

T = TridiagonalMatrix(lower, main, upper)
x = quax.quaxify(jnp.linalg.solve)(T, b)  # O(n), no n x n array
```
"""

from . import _rules as _rules  # registers the rules
from ._kernels import (
    in_graph_fallbacks as in_graph_fallbacks,
    tridiagonal_solver as tridiagonal_solver,
)
from ._lineax import from_lineax as from_lineax, to_lineax as to_lineax
from ._values import (
    Banded as Banded,
    BlockDiagonal as BlockDiagonal,
    Circulant as Circulant,
    CirculantLU as CirculantLU,
    DeterminantLU as DeterminantLU,
    Diagonal as Diagonal,
    HalfSolved as HalfSolved,
    Kronecker as Kronecker,
    KroneckerEigenLU as KroneckerEigenLU,
    KroneckerLU as KroneckerLU,
    KroneckerPlusDiagonal as KroneckerPlusDiagonal,
    KroneckerPlusIdentity as KroneckerPlusIdentity,
    KroneckerSpectralLU as KroneckerSpectralLU,
    LowerTriangular as LowerTriangular,
    LowRank as LowRank,
    LowRankPlusDiagonal as LowRankPlusDiagonal,
    Product as Product,
    ScaledIdentity as ScaledIdentity,
    Semiseparable as Semiseparable,
    StructuredMaterialisationError as StructuredMaterialisationError,
    StructuredMatrix as StructuredMatrix,
    Sum as Sum,
    Toeplitz as Toeplitz,
    ToeplitzLU as ToeplitzLU,
    TridiagonalEigenvectors as TridiagonalEigenvectors,
    TridiagonalMatrix as TridiagonalMatrix,
    UpperTriangular as UpperTriangular,
)


VALUE_TYPES = (
    TridiagonalMatrix,
    TridiagonalEigenvectors,
    Diagonal,
    ScaledIdentity,
    LowerTriangular,
    UpperTriangular,
    LowRank,
    LowRankPlusDiagonal,
    Semiseparable,
    Kronecker,
    KroneckerLU,
    KroneckerPlusDiagonal,
    KroneckerPlusIdentity,
    KroneckerEigenLU,
    KroneckerSpectralLU,
    Banded,
    BlockDiagonal,
    Circulant,
    CirculantLU,
    Toeplitz,
    ToeplitzLU,
    DeterminantLU,
    HalfSolved,
    Sum,
    Product,
)


# Every family names its refusal after itself (`StructuredMaterialisationError`), so
# that the errors of families imported side by side, and the core's
# `quax.MaterialisationError` they subclass, keep distinct names. 0.5.0 documented this
# one as `quax_structured.MaterialisationError`: kept as an alias, the same class.
MaterialisationError = StructuredMaterialisationError
