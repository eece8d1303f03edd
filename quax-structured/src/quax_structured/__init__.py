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
from ._banded import Banded as Banded
from ._base import (
    MaterialisationError as MaterialisationError,
    StructuredMatrix as StructuredMatrix,
)
from ._blockdiagonal import BlockDiagonal as BlockDiagonal
from ._circulant import Circulant as Circulant, CirculantLU as CirculantLU
from ._composite import Product as Product, Sum as Sum
from ._determinant import DeterminantLU as DeterminantLU, HalfSolved as HalfSolved
from ._diagonal import Diagonal as Diagonal, ScaledIdentity as ScaledIdentity
from ._kronecker import Kronecker as Kronecker, KroneckerLU as KroneckerLU
from ._lineax import from_lineax as from_lineax, to_lineax as to_lineax
from ._lowrank import (
    LowRank as LowRank,
    LowRankPlusDiagonal as LowRankPlusDiagonal,
    Semiseparable as Semiseparable,
)
from ._toeplitz import Toeplitz as Toeplitz, ToeplitzLU as ToeplitzLU
from ._triangular import (
    LowerTriangular as LowerTriangular,
    UpperTriangular as UpperTriangular,
)
from ._tridiagonal import (
    TridiagonalEigenvectors as TridiagonalEigenvectors,
    TridiagonalMatrix as TridiagonalMatrix,
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
