"""The value types: `BCOO` (batch-coordinate format), `CSR` (compressed sparse rows),
`BlockSparse` (a matrix of dense blocks), the factorisation of a sparse direct solve
(`SparseLU`, with `PendingSolve` between its two triangular solves), and their
refusal, `SparseMaterialisationError`; one module per type."""

from ._bcoo import (
    BCOO as BCOO,
    SparseMaterialisationError as SparseMaterialisationError,
)
from ._block import BlockSparse as BlockSparse
from ._csr import CSR as CSR
from ._factor import (
    PendingSolve as PendingSolve,
    SparseLU as SparseLU,
    apply_inverse as apply_inverse,
    cho_factor as cho_factor,
    factorise as factorise,
    lu_factor as lu_factor,
    unfactorable as unfactorable,
)
