"""The value types: `BCOO` (batch-coordinate format), `CSR` (compressed sparse rows),
and their refusal, `MaterialisationError`; one module per type."""

from ._bcoo import BCOO as BCOO, MaterialisationError as MaterialisationError
from ._csr import CSR as CSR
