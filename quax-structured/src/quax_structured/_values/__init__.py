"""The structured matrices, one module per structure: what each stores, its dense
array (where allowed) and the structured operations the rules call. `_base`
holds what they share (the materialisation policy, through `quax.GuardedValue`,
and the derivatives of `slogdet`/`det`); `_determinant` the LU factors the rules
return; `_composite` the lazy `Sum` and `Product`."""

from ._banded import Banded as Banded
from ._base import (
    StructuredMaterialisationError as StructuredMaterialisationError,
    StructuredMatrix as StructuredMatrix,
)
from ._blockdiagonal import BlockDiagonal as BlockDiagonal
from ._circulant import Circulant as Circulant, CirculantLU as CirculantLU
from ._composite import Product as Product, Sum as Sum
from ._determinant import DeterminantLU as DeterminantLU, HalfSolved as HalfSolved
from ._diagonal import Diagonal as Diagonal, ScaledIdentity as ScaledIdentity
from ._kronecker import (
    Kronecker as Kronecker,
    KroneckerEigenLU as KroneckerEigenLU,
    KroneckerLU as KroneckerLU,
    KroneckerPlusDiagonal as KroneckerPlusDiagonal,
    KroneckerPlusIdentity as KroneckerPlusIdentity,
    KroneckerSpectralLU as KroneckerSpectralLU,
)
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
