"""`Toeplitz`: products through a circulant embedding and the FFT, O(n log n);
solves and determinants through the Levinson recursion, checked by their backward
error, with GKO (`_gko.py`, partial pivoting) only where that check fails, both
O(n²)."""

import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from .._kernels import batched, circular_convolve, for_the_batch, gko, levinson
from ._base import StructuredMatrix
from ._circulant import SolverLU
from ._determinant import DeterminantLU


__all__ = ["Toeplitz", "ToeplitzLU", "levinson"]


def _tolerance(n: int, dtype) -> float:
    """The largest backward error (see `_backward_errors`) of an answer returned,
    by either route (above it, NaN): `(16 + n / 4) eps`, of the order of partial
    pivoting's bound (`3 n eps` times the growth factor: the guarantee of a dense
    `jnp.linalg.solve`), so that the forward error is at most `2 κ τ / (1 - κ τ)`
    (`τ` this tolerance, `κ` the condition number against `_backward_errors`'
    bound of `‖T‖₂`). Linear in `n` because GKO's own backward error grows about
    linearly (measured up to 15, 19, 83 and 298 eps at n = 64, 256, 1,024 and
    4,096, against 0.2 to 4 eps for a dense solve and for the Levinson recursion
    where it is stable): a tolerance growing more slowly would turn GKO's answers
    into NaN at large `n`; the 16 keeps twice GKO's 15 eps at n = 64. At `1024
    eps`, a Levinson answer of backward error 82 eps at n = 4 was 4.9x outside
    `20 cond eps` (`tests/test_toeplitz_guarantee.py`)."""
    return (16 + n / 4) * float(jnp.finfo(dtype).eps)


def _backward_errors(column: Array, row: Array, x: Array, b: Array) -> Array:
    """`‖b - T x‖₂ / (‖T‖₂ ‖x‖₂ + ‖b‖₂)` for each system of `T x = b` (`column`,
    `row` of shape `(*batch, n)`, `x`, `b` of shape `(*batch, n, k)`; returns
    `(*batch, k)`), O(n log n): `T x` by the FFT, and `‖T‖₂` bounded above by the
    largest eigenvalue modulus of the `2n` circulant matrix whose top-left block
    `T` is. 0 where the residual is exactly 0 (`b = 0`, `x = 0`), `inf` where the
    error is NaN (a failed solve)."""
    t = Toeplitz(column, row)
    residual = b - t.matmat(x)
    complex_ = jnp.issubdtype(column.dtype, jnp.complexfloating)
    spectrum = (jnp.fft.fft if complex_ else jnp.fft.rfft)(t.embedding())
    norm = jnp.max(jnp.abs(spectrum), axis=-1)[..., None]
    # Every vector scaled by `max |b|` (per system), so that the sums of squares
    # neither overflow nor underflow where `b` and `x` are of one magnitude.
    big = jnp.max(jnp.abs(b), axis=-2, keepdims=True, initial=0)
    scale = jnp.where(big > 0, big, 1)
    norm2 = lambda y: jnp.sqrt(jnp.sum(jnp.abs(y / scale) ** 2, axis=-2))
    size = norm2(residual)
    error = size / (norm * norm2(x) + norm2(b))
    error = jnp.where(size == 0, 0, error)
    return jnp.where(jnp.isnan(error), jnp.inf, error)


def _levinson_solve(column: Array, row: Array, b: Array) -> Array:
    return batched(lambda c, r, b: levinson(c, r, b)[0], column, row, b)


def _gko_solve(column: Array, row: Array, b: Array) -> Array:
    return batched(lambda c, r, b: gko(c, r, b)[0], column, row, b)


def _identity_where(mask: Array, column: Array, row: Array) -> tuple[Array, Array]:
    """The identity's column and row where `mask`, else `column`, `row`: the
    matrix a derivative runs a route on, so that where the route is not taken
    (a per-system `jnp.where` of both routes' derivatives), its NaN cannot reach
    the derivative through a zero cotangent (`0 · NaN = NaN`)."""
    identity = jnp.zeros_like(column).at[..., 0].set(1)
    mask = jnp.reshape(mask, mask.shape + (1,) * (column.ndim - mask.ndim))
    return jnp.where(mask, identity, column), jnp.where(mask, identity, row)


def _solve_route(column: Array, row: Array, b: Array) -> tuple[Array, Array]:
    """`T⁻¹ b` (see `_checked_solve`), and whether the Levinson recursion alone
    gave it."""
    x = _levinson_solve(column, row, b)
    errors = _backward_errors(column, row, x, b)
    tolerance = _tolerance(b.shape[-2], x.dtype)
    # Decided once for a `vmap` batch, as for a batch of matrices: the derivative's
    # `lax.cond` on tangents stays a branch (see `for_the_batch`).
    accurate = for_the_batch(jnp.all(errors <= tolerance))

    def fallback(x: Array) -> Array:
        y = _gko_solve(column, row, b)
        pivoted = _backward_errors(column, row, y, b)
        best = jnp.where((errors <= pivoted)[..., None, :], x, y)
        found = jnp.minimum(errors, pivoted) <= tolerance
        return jnp.where(found[..., None, :], best, jnp.nan).astype(x.dtype)

    return lax.cond(accurate, lambda x: x, fallback, x), accurate


@jax.custom_jvp
def _checked_solve(column: Array, row: Array, b: Array) -> Array:
    """`T⁻¹ b` for the Toeplitz `T` (`column`, `row` of shape `(*batch, n)`, `b`
    of shape `(*batch, n, k)`): the Levinson recursion (O(n² (k + 1)), no
    pivoting), checked by its backward error (`_backward_errors`, O(n log n)).
    Only where an error is above `_tolerance` (a tiny or zero leading minor), a
    `lax.cond` branch runs GKO (O(n² (k + 1)), partial pivoting) and keeps, per
    system, the answer with the smaller backward error, NaN where neither is
    below `_tolerance` (never an answer outside the guarantee). The branch is
    decided once for the batch, and for a `vmap` batch (`for_the_batch`). Its
    derivative is `T⁻¹ (ḃ - Ṫ x)`, solved by the Levinson recursion where the
    branch was not taken, else by GKO (so that the Levinson recursion's NaN
    cannot reach it)."""
    return _solve_route(column, row, b)[0]


@_checked_solve.defjvp
def _checked_solve_jvp(primals, tangents):
    column, row, b = primals
    d_column, d_row, d_b = tangents
    x, accurate = _solve_route(column, row, b)
    rhs = d_b - Toeplitz(d_column, d_row).matmat(x)
    by_levinson = lambda y: _levinson_solve(*_identity_where(~accurate, column, row), y)
    by_gko = lambda y: _gko_solve(*_identity_where(accurate, column, row), y)
    return x, lax.cond(accurate, by_levinson, by_gko, rhs)


def _levinson_pivots(column: Array, row: Array) -> Array:
    empty = jnp.zeros((*column.shape, 0), column.dtype)
    return batched(lambda c, r, b: levinson(c, r, b)[1], column, row, empty)


def _gko_pivots(column: Array, row: Array) -> Array:
    empty = jnp.zeros((*column.shape, 0), column.dtype)
    return batched(lambda c, r, b: gko(c, r, b)[1], column, row, empty)


def _pivots_route(column: Array, row: Array) -> tuple[Array, Array, Array]:
    """The pivots (see `_checked_pivots`), whether the Levinson recursion's were
    taken for every system, and for which systems they were (`(*batch,)`)."""
    n = column.shape[-1]
    start = jnp.cos(1.618 * jnp.arange(n)).astype(column.dtype)
    start = jnp.broadcast_to(start[:, None], (*column.shape, 1))
    probe = Toeplitz(column, row).matmat(start)
    x, pivots = batched(levinson, column, row, probe)
    errors = _backward_errors(column, row, x, probe)[..., 0]
    tolerance = _tolerance(n, column.dtype)
    kept = (errors <= tolerance) & jnp.all(jnp.isfinite(pivots), axis=-1)
    # Decided once for a `vmap` batch, as for a batch of matrices: the derivative's
    # `lax.cond` on tangents stays a branch (see `for_the_batch`).
    accurate = for_the_batch(jnp.all(kept))

    def fallback(pivots: Array) -> Array:
        y, pivoted = batched(gko, column, row, probe)
        pivoted_errors = _backward_errors(column, row, y, probe)[..., 0]
        finite = jnp.all(jnp.isfinite(pivoted), axis=-1)
        singular = finite & jnp.any(pivoted == 0, axis=-1)
        found = singular | (pivoted_errors <= tolerance)
        pivoted = jnp.where(found[..., None], pivoted, jnp.nan).astype(pivots.dtype)
        return jnp.where(kept[..., None], pivots, pivoted)

    return lax.cond(accurate, lambda p: p, fallback, pivots), accurate, kept


@jax.custom_jvp
def _checked_pivots(column: Array, row: Array) -> Array:
    """Numbers whose product is `det T` (`column`, `row` of shape `(*batch, n)`;
    returns `(*batch, n)`): the pivots of the Levinson recursion (those of LU
    without pivoting), where it solves a probe system `T x = T x₀` (`x₀ =
    cos(1.618 k)`) with a backward error below `_tolerance`. Only otherwise, in a
    `lax.cond` branch (decided once for the batch, and for a `vmap` batch, see
    `for_the_batch`), for each system whose probe failed, GKO's pivots (partial
    pivoting), where GKO solves the probe with a backward error below
    `_tolerance` or meets an exactly zero pivot (a singular `T`: `det` 0), else
    NaN. Not the better of both: a derivative must follow the pivots returned,
    and the Levinson recursion's is NaN where it failed. Its derivative is, for
    each system, that of the route its pivots took (on the identity in the
    other route, see `_identity_where`)."""
    return _pivots_route(column, row)[0]


@_checked_pivots.defjvp
def _checked_pivots_jvp(primals, tangents):
    column, row = primals
    pivots, accurate, kept = _pivots_route(column, row)

    def derivative(route, elsewhere, d_column, d_row):
        matrix = _identity_where(elsewhere, column, row)
        return jax.jvp(route, matrix, (d_column, d_row))[1]

    def by_levinson(d_column, d_row):
        return derivative(_levinson_pivots, ~accurate, d_column, d_row)

    def by_route(d_column, d_row):
        levinson_ = derivative(_levinson_pivots, ~kept, d_column, d_row)
        gko_ = derivative(_gko_pivots, kept, d_column, d_row)
        return jnp.where(kept[..., None], levinson_, gko_)

    return pivots, lax.cond(accurate, by_levinson, by_route, *tangents)


class ToeplitzLU(SolverLU):
    """`lax.linalg.lu` of a `Toeplitz` matrix (see `SolverLU`): solves by the
    Levinson recursion, checked by its backward error, with GKO (partial
    pivoting) where that check fails (see `_checked_solve`), O(n²) time; its
    pivots are those of the Levinson recursion where a probe solve passes the same
    check, else GKO's (see `_checked_pivots`). For a matrix tagged
    `positive_definite`, the Levinson recursion alone (no pivoting, which a
    positive definite matrix does not need; no check).

    **Fields:**

    - `matrix`: the `Toeplitz` matrix.
    - `values`: the pivots, where `lu` computed them (else `pivots()` does).
    """

    matrix: "Toeplitz"
    values: Array | None = None

    def __check_init__(self):
        self._check_factored(Toeplitz)
        if self.values is None:
            return
        want = (self.matrix.shape[:-1], jnp.result_type(self.matrix.dtype))
        if (jnp.shape(self.values), jnp.result_type(self.values)) != want:
            raise ValueError(
                "`ToeplitzLU` needs `values` (the pivots, one per row) of the shape "
                f"and dtype {want[0]} {want[1]} of its `Toeplitz` of shape "
                f"{self.matrix.shape}; got `values` of shape "
                f"{jnp.shape(self.values)} and dtype {jnp.result_type(self.values)}."
            )

    def pivots(self) -> Array:
        if self.values is not None:
            return self.values
        t = self.matrix
        if t.positive_definite:
            return _levinson_pivots(t.column, t.row)
        return _checked_pivots(t.column, t.row)

    def solve(self, b: Array, transpose: bool) -> Array:
        t = self.matrix.transpose() if transpose else self.matrix
        if self.matrix.positive_definite:
            return _levinson_solve(t.column, t.row, b)
        return _checked_solve(t.column, t.row, b)


class Toeplitz(StructuredMatrix):
    """A Toeplitz matrix, stored as its first column and first row: `T[..., i, j]
    = column[..., i - j]` for `i >= j` and `row[..., j - i]` for `j > i` (as in
    `scipy.linalg.toeplitz`, `row[..., 0]` is ignored).

    Products cost O(n log n): `T` is the top-left block of a `2n x 2n` circulant
    matrix, applied through the FFT. `jnp.linalg.solve`, `slogdet` and `det` cost
    O(n²) time: the Levinson recursion (O(n) memory), checked by its backward
    error (O(n log n), through the FFT); only where that check fails (a tiny or
    zero leading minor), GKO too (Gaussian elimination with partial pivoting on
    the Cauchy-like matrix the DFT turns `T` into, in complex arithmetic), as
    accurate as the dense pivoted solve there; memory O(n²) (the factors,
    complex: 8 n² bytes in float32, 16 n² in float64); NaN where neither is
    accurate. Tagged `positive_definite=True`, the Levinson recursion alone,
    without the check (stable for positive definite matrices: the tag is the
    user's declaration, not checked).

    **Fields:**

    - `column`: shape `(*batch, n)`.
    - `row`: shape `(*batch, n)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    batch_leading = True

    column: Array
    row: Array

    def __check_init__(self):
        if self.column.shape != self.row.shape or self.column.dtype != self.row.dtype:
            raise ValueError(
                "`Toeplitz` needs `column` and `row` of the same shape and dtype; got "
                f"{self.column.shape} {self.column.dtype} and {self.row.shape} "
                f"{self.row.dtype}."
            )

    def aval(self) -> jax.core.ShapedArray:
        *batch, n = self.column.shape
        return jax.core.ShapedArray((*batch, n, n), self.column.dtype)

    def dense(self) -> Array:
        n = self.column.shape[-1]
        i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
        return jnp.where(i >= j, self.column[..., i - j], self.row[..., j - i])

    def _with(self, column: Array, row: Array) -> "Toeplitz":
        return Toeplitz(column, row, allow_materialise=self.allow_materialise)

    def transpose(self) -> "Toeplitz":
        row = self.column
        column = jnp.concatenate([self.column[..., :1], self.row[..., 1:]], axis=-1)
        return self._with(column, row)

    def map_leaves(self, fn) -> "Toeplitz":
        return self._with(fn(self.column), fn(self.row))

    def matmat(self, x: Array) -> Array:
        """`T @ x` for `x` of shape `(*batch, n, k)`: the first `n` rows of the
        `2n` circulant embedding `[[T, S], [S, T]]` applied to `[x; 0]`."""
        n = self.column.shape[-1]
        padded = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, n), (0, 0)])
        return circular_convolve(self.embedding(), padded)[..., :n, :]

    def embedding(self) -> Array:
        """The first column of the `2n x 2n` circulant matrix `[[T, S], [S, T]]`
        whose top-left block `T` is (shape `(*batch, 2n)`)."""
        zero = jnp.zeros_like(self.column[..., :1])
        return jnp.concatenate(
            [self.column, zero, jnp.flip(self.row[..., 1:], -1)], axis=-1
        )

    def entries(self, i: Array, j: Array) -> Array:
        n = self.column.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        return jnp.where(i >= j, self.column[i - j], self.row[jnp.abs(j - i)])

    def lu(self) -> DeterminantLU:
        """A `ToeplitzLU` (a solver in place of factors) and its pivots: where a
        pivoted factorisation meets a zero pivot, the matrix is singular and
        `det` is 0 (not NaN, as for an LU without pivoting)."""
        allow = self.allow_materialise
        values = ToeplitzLU(self, allow_materialise=allow).pivots()
        solver = ToeplitzLU(self, values=values, allow_materialise=allow)
        return DeterminantLU(solver, self, pivots=values)

    def add(self, other: StructuredMatrix) -> "Toeplitz | None":
        if isinstance(other, Toeplitz):
            return self._with(self.column + other.column, self.row + other.row)
        return None
