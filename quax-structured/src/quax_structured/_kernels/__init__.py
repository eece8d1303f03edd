"""The numerical routines the structures and rules call, on plain arrays (no
value types): dense helpers, the FFT circulant solve, the Levinson recursion,
GKO (the pivoted Toeplitz solve), banded elimination with partial pivoting,
Kronecker products through their factors (and `A₁ ⊗ ... ⊗ A_N + c I` through
their eigendecompositions), and the singular value, QR and
eigendecompositions and matrix exponentials of diagonal, circulant, Kronecker
and low-rank matrices."""

from ._banded import (
    band_eliminate as band_eliminate,
    pivoted_band_pivots as pivoted_band_pivots,
    pivoted_band_solve as pivoted_band_solve,
    shift as shift,
)
from ._decompositions import (
    circulant_eigh as circulant_eigh,
    circulant_expm as circulant_expm,
    circulant_svd as circulant_svd,
    diagonal_svd as diagonal_svd,
    kron_expm_symmetric as kron_expm_symmetric,
    kron_svd as kron_svd,
    lowrank_eigh as lowrank_eigh,
    lowrank_qr as lowrank_qr,
    lowrank_svd as lowrank_svd,
    sorted_columns as sorted_columns,
)
from ._dense import (
    dense_triangular_solve as dense_triangular_solve,
    failed_factorisation as failed_factorisation,
    for_the_batch as for_the_batch,
    keep_or_scale as keep_or_scale,
    nan_where as nan_where,
    on_diagonal as on_diagonal,
    stacked_sums as stacked_sums,
)
from ._fallback import (
    Fallback as Fallback,
    checked_or_fallback as checked_or_fallback,
    in_graph_fallbacks as in_graph_fallbacks,
)
from ._fft import circular_convolve as circular_convolve
from ._gko import batched as batched, gko as gko
from ._kronecker import (
    factor_solve as factor_solve,
    kron_apply as kron_apply,
    kron_diagonal as kron_diagonal,
    kron_entries as kron_entries,
    kron_sum_eigh as kron_sum_eigh,
)
from ._levinson import levinson as levinson
from ._lowrank_host import (
    host_determinant_fallback as host_determinant_fallback,
    host_solve_fallback as host_solve_fallback,
)
from ._shifted_kronecker import (
    shifted_kron_determinant as shifted_kron_determinant,
    shifted_kron_log_determinant as shifted_kron_log_determinant,
    shifted_kron_pivots as shifted_kron_pivots,
    shifted_kron_solve as shifted_kron_solve,
)
from ._tridiagonal import (
    parallel_tridiagonal_solve as parallel_tridiagonal_solve,
    tridiagonal_solve as tridiagonal_solve,
    tridiagonal_solver as tridiagonal_solver,
)
