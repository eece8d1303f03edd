"""`Banded`: products in O(n (p + q)), LU and solves in O(n p q)."""

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from .._kernels import (
    failed_factorisation,
    keep_or_scale,
    nan_where,
    on_diagonal,
    pivoted_band_pivots,
    pivoted_band_solve,
    shift,
)
from ._base import StructuredMatrix, is_size
from ._determinant import DeterminantLU


__all__ = ["Banded"]


class Banded(StructuredMatrix):
    """A banded matrix: `A[i, j] = 0` unless `-lower_bandwidth <= j - i <=
    upper_bandwidth`, stored by its diagonals, indexed by row.

    `A[..., i, i + d] = bands[..., d + lower_bandwidth, i]`; the entries of `bands`
    whose column `i + d` falls outside the matrix are ignored. Products cost
    O(n (p + q)) for bandwidths `p`, `q`; `jnp.linalg.solve`, `slogdet` and
    `det` use Gaussian elimination with partial pivoting (as LAPACK's `gbsv`:
    `pivoted_solve`, `pivots`), O(n p (p + q)) time and O(n (p + q)) memory,
    accurate at zero or tiny leading minors.

    **Fields:**

    - `bands`: shape `(*batch, lower_bandwidth + upper_bandwidth + 1, n)`.
    - `lower_bandwidth`, `upper_bandwidth`: the number of sub- and superdiagonals
        (static).
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    batch_leading = True

    bands: Array
    lower_bandwidth: int = eqx.field(static=True)
    upper_bandwidth: int = eqx.field(static=True)

    def __check_init__(self):
        p, q = self.lower_bandwidth, self.upper_bandwidth
        for name, width in (("lower_bandwidth", p), ("upper_bandwidth", q)):
            if not is_size(width):
                raise ValueError(
                    f"`Banded` needs `{name}` as a non-negative integer (the "
                    f"number of {'sub' if name[0] == 'l' else 'super'}diagonals); got "
                    f"`{name}={width!r}`."
                )
        if self.bands.ndim < 2 or self.bands.shape[-2] != p + q + 1:
            raise ValueError(
                f"`Banded` needs `bands` of shape (*batch, {p} + {q} + 1, n) for "
                f"bandwidths ({p}, {q}); got shape {self.bands.shape}."
            )

    def aval(self) -> jax.core.ShapedArray:
        *batch, _, n = self.bands.shape
        return jax.core.ShapedArray((*batch, n, n), self.bands.dtype)

    def _band(self, d: int) -> Array:
        """The diagonal at offset `d`, indexed by row, zero outside the matrix."""
        n = self.bands.shape[-1]
        row = self.bands[..., d + self.lower_bandwidth, :]
        valid = (jnp.arange(n) + d >= 0) & (jnp.arange(n) + d < n)
        return jnp.where(valid, row, jnp.zeros((), self.dtype))

    def _offsets(self) -> range:
        return range(-self.lower_bandwidth, self.upper_bandwidth + 1)

    def dense(self) -> Array:
        n = self.bands.shape[-1]
        out = jnp.zeros(self.shape, self.dtype)
        for d in self._offsets():
            if abs(d) < n:
                # Row i holds A[i, i + d]: the rows whose column is inside.
                band = self.bands[..., d + self.lower_bandwidth, :]
                inside = band[..., : n - d] if d >= 0 else band[..., -d:]
                out = out + on_diagonal(inside, d)
        return out

    def _with(self, bands: Array, p: int | None = None, q: int | None = None):
        p = self.lower_bandwidth if p is None else p
        q = self.upper_bandwidth if q is None else q
        return Banded(bands, p, q, allow_materialise=self.allow_materialise)

    def transpose(self) -> "Banded":
        # Aᵀ[i, i + d] = A[i + d, i]: the band at offset -d, shifted by d.
        rows = [shift(self._band(-d), d) for d in range(-self.upper_bandwidth, 0)]
        rows += [shift(self._band(-d), d) for d in range(self.lower_bandwidth + 1)]
        return self._with(
            jnp.stack(rows, axis=-2), self.upper_bandwidth, self.lower_bandwidth
        )

    def map_leaves(self, fn) -> "Banded":
        return self._with(fn(self.bands))

    def matmat(self, x: Array) -> Array:
        """`A @ x` for `x` of shape `(*batch, n, k)`, in O(n k (p + q))."""
        xt = jnp.swapaxes(x, -1, -2)  # (*batch, k, n)
        out = 0
        for d in self._offsets():
            out = out + self._band(d)[..., None, :] * shift(xt, d)
        return jnp.swapaxes(out, -1, -2)

    def entries(self, i: Array, j: Array) -> Array:
        n = self.bands.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        d = j - i
        inside = (d >= -self.lower_bandwidth) & (d <= self.upper_bandwidth)
        r = jnp.clip(d + self.lower_bandwidth, 0, self.bands.shape[-2] - 1)
        return jnp.where(inside, self.bands[r, i], jnp.zeros((), self.dtype))

    def masked(self, y: Array, *, select: bool = False) -> "Banded":
        n = self.bands.shape[-1]
        rows = []
        for d in self._offsets():
            diag = jnp.diagonal(y, d, -2, -1)
            if abs(d) >= n:
                # A band wider than the matrix (bandwidths may exceed n - 1): no
                # entry of it is inside, and `diag` is empty.
                rows.append(jnp.zeros((*diag.shape[:-1], n), diag.dtype))
                continue
            pad = [(0, 0)] * (diag.ndim - 1)
            rows.append(jnp.pad(diag, [*pad, (0, d)] if d >= 0 else [*pad, (-d, 0)]))
        scales = jnp.stack(rows, axis=-2)
        return self._with(keep_or_scale(self.bands, scales, select=select))

    def _widened(self, p: int, q: int) -> Array:
        pad = [(0, 0)] * (self.bands.ndim - 2)
        pad += [(p - self.lower_bandwidth, q - self.upper_bandwidth), (0, 0)]
        return jnp.pad(self.bands, pad)

    def add(self, other: StructuredMatrix) -> "Banded | None":
        if not isinstance(other, Banded):
            return None
        p = max(self.lower_bandwidth, other.lower_bandwidth)
        q = max(self.upper_bandwidth, other.upper_bandwidth)
        return self._with(self._widened(p, q) + other._widened(p, q), p, q)

    def add_diagonal(self, d: Array) -> "Banded":
        p = self.lower_bandwidth
        return self._with(self.bands.at[..., p, :].add(d))

    def row_scaled(self, d: Array) -> "Banded":
        return self._with(self.bands * d[..., None, :])

    def col_scaled(self, d: Array) -> "Banded":
        scale = jnp.stack([shift(d, k) for k in self._offsets()], axis=-2)
        return self._with(self.bands * scale)

    def lu(self) -> DeterminantLU:
        """The packed LU factors without pivoting (`_packed_lu`), identity
        permutation, whose diagonal reads as the pivots of the elimination with
        partial pivoting (`pivots`, the swaps' sign on the first): what
        `slogdet`/`det` read. `lu_solve` does not solve with the factors: its
        first triangular solve does the whole solve with partial pivoting
        (`pivoted_solve`), the second returns it (see `HalfSolved`). Under `jit`
        a program that only solves computes neither the factors nor the pivots
        (XLA drops them; `tests/test_pivoting.py` checks the HLO)."""
        return DeterminantLU(self._packed_lu(), self, pivots=self.pivots())

    def _packed_lu(self) -> "Banded":
        """The packed LU factors without pivoting, as a `Banded` matrix of the same
        bandwidths (`L - I` below the diagonal, `U` on and above it): Gaussian
        elimination over a sliding `(p + 1) x (q + 1)` window, O(n p q)."""
        p, q = self.lower_bandwidth, self.upper_bandwidth
        n = self.bands.shape[-1]
        # Dense rows of the band: full[i, c] = A[i, i - p + c], zero outside.
        bands = jnp.stack([self._band(d) for d in self._offsets()], axis=-2)
        bt = jnp.moveaxis(bands, (-1, -2), (0, 1))  # (n, p + q + 1, *batch)
        bt = jnp.pad(bt, [(0, p + 1)] + [(0, 0)] * (bt.ndim - 1))
        # The window W[r, c] = A[k + r, k + c] (r <= p, c <= q) at step k.
        rows = jnp.arange(p + 1)[:, None]
        cols = jnp.arange(q + 1)[None, :]
        window0 = jnp.moveaxis(bt[rows, p + cols - rows], (0, 1), (-2, -1))
        # What step k brings into the window: row k + p + 1 (columns k + 1 ..
        # k + q + 1) and column k + q + 1 (rows k + 1 .. k + p), untouched by
        # earlier eliminations. Read here, for all k at once, and scanned over: an
        # index into the whole band inside the loop makes XLA's CPU backend split
        # each step's (p + 1) x (q + 1) fusion across threads once the band passes
        # about a megabyte (a 40x slower solve from n = 32,768 at p = q = 2).
        new_rows = jnp.moveaxis(bt[p + 1 : p + 1 + n, : q + 1], 1, -1)
        cols = [bt[1 + r : 1 + r + n, q + p - r] for r in range(p)]
        new_cols = (
            jnp.stack(cols, axis=-1)
            if p
            else jnp.zeros((n, *bt.shape[2:], 0), bt.dtype)
        )

        def step(window, new):
            new_row, new_col = new
            pivot = window[..., 0, 0]
            ell = window[..., 1:, 0] / pivot[..., None]
            schur = window[..., 1:, 1:] - ell[..., :, None] * window[..., 0:1, 1:]
            top = jnp.concatenate([schur, new_col[..., :, None]], axis=-1)
            nxt = jnp.concatenate([top, new_row[..., None, :]], axis=-2)
            return nxt, (window[..., 0, :], ell)

        _, (u_rows, ells) = lax.scan(step, window0, (new_rows, new_cols))
        u_rows = jnp.moveaxis(u_rows, 0, -1)  # (*batch, q + 1, n)
        ells = jnp.moveaxis(ells, 0, -1)  # (*batch, p, n): ells[r, k] = L[k+1+r, k]
        lower = [shift(ells[..., r, :], -(r + 1)) for r in reversed(range(p))]
        packed = jnp.concatenate(
            [jnp.stack(lower, axis=-2), u_rows] if p else [u_rows], axis=-2
        )
        return self._with(packed)

    def _band_rows(self) -> Array:
        """`full[..., i, c] = A[i, i - p + c]`, zero outside the matrix."""
        return jnp.stack([self._band(d) for d in self._offsets()], axis=-1)

    def pivoted_solve(self, b: Array, *, transpose: bool) -> Array:
        """Solve `A x = b` (`Aᵀ x = b` if `transpose`) for `b` of shape
        `(*batch, n, k)` with partial pivoting, as LAPACK's `gbsv`: Gaussian
        elimination over a sliding window of the `p + 1` candidate rows, in
        which `U`'s upper bandwidth grows to `p + q`, then a back substitution,
        O(n p (p + q) k). What `jnp.linalg.solve` computes (see `HalfSolved`):
        accurate at a tiny leading pivot of a well-conditioned matrix, where the
        factors of `lu` (without pivoting) are not."""
        m = self.transpose() if transpose else self
        p, q = m.lower_bandwidth, m.upper_bandwidth
        full = m._band_rows()
        dtype = jnp.result_type(full, b)
        batch = jnp.broadcast_shapes(full.shape[:-2], b.shape[:-2])
        full = jnp.broadcast_to(full, (*batch, *full.shape[-2:])).astype(dtype)
        b = jnp.broadcast_to(b, (*batch, *b.shape[-2:])).astype(dtype)
        solve = lambda f, y: pivoted_band_solve(f, y, p, q)
        for _ in batch:
            solve = jax.vmap(solve)
        return solve(full, b)

    def pivots(self) -> Array:
        """Numbers whose product is the determinant (shape `(*batch, n)`), from
        the elimination with partial pivoting (`band_eliminate`), O(n p (p +
        q)): what `det`/`slogdet` read."""
        p, q = self.lower_bandwidth, self.upper_bandwidth
        pivots = lambda f: pivoted_band_pivots(f, p, q)
        for _ in self.bands.shape[:-2]:
            pivots = jax.vmap(pivots)
        return pivots(self._band_rows())

    def cholesky(self) -> "Banded":
        """The lower Cholesky factor `G` (`A = G Gᵀ`, bandwidths `(p, 0)`) from the
        lower triangle (as `lax.linalg.cholesky` reads it), O(n p²): the LU without
        pivoting of the symmetric matrix with that lower triangle is `L (D Lᵀ)`, so
        `G = L D^½`. As the dense Cholesky, `nan` where the matrix is not positive
        definite."""
        p = self.lower_bandwidth
        tri = self._with(self.bands[..., : p + 1, :], p, 0)
        upper = tri.transpose().bands[..., 1:, :]
        packed = self._with(
            jnp.concatenate([tri.bands, upper], axis=-2), p, p
        )._packed_lu()
        d = packed.bands[..., p, :]
        ones = jnp.ones_like(d)[..., None, :]
        unit = jnp.concatenate([packed.bands[..., :p, :], ones], axis=-2)
        root = jnp.sqrt(d)
        factor = self._with(unit, p, 0).col_scaled(root)
        return self._with(nan_where(failed_factorisation(root), factor.bands), p, 0)

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array:
        """Solve `op(A) x = b` with `A` the lower (or upper) triangle of this matrix,
        for `b` of shape `(*batch, n, k)`: a banded substitution, O(n k p)."""
        m = self.transpose() if transpose_a else self
        forward = lower != transpose_a
        width = m.lower_bandwidth if forward else m.upper_bandwidth
        sign = -1 if forward else 1
        # off[r] (r = 1 .. width) is the entry A[i, i -+ r] of row i.
        diag = m._band(0)
        empty = jnp.zeros((*diag.shape[:-1], 0, diag.shape[-1]), diag.dtype)
        off = jnp.concatenate(
            [empty] + [m._band(sign * r)[..., None, :] for r in range(1, width + 1)],
            axis=-2,
        )
        bt = jnp.moveaxis(b, -2, 0)  # (n, *batch, k)
        offt = jnp.moveaxis(off, -1, 0)  # (n, *batch, width)
        diagt = jnp.moveaxis(diag, -1, 0)
        if not forward:
            bt, offt, diagt = bt[::-1], offt[::-1], diagt[::-1]

        def step(prev, xs):
            # prev[r - 1] holds the solution r rows back.
            bi, oi, di = xs
            x = bi - jnp.sum(oi[..., :, None] * jnp.moveaxis(prev, 0, -2), axis=-2)
            if not unit_diagonal:
                x = x / di[..., None]
            return jnp.concatenate([x[None], prev])[:width], x

        prev0 = jnp.zeros((width, *bt.shape[1:]), jnp.result_type(b, self.dtype))
        _, out = lax.scan(step, prev0, (bt, offt, diagt))
        if not forward:
            out = out[::-1]
        return jnp.moveaxis(out, 0, -2)
