"""Low-rank structures: `LowRank` (`U Vᵀ`), `LowRankPlusDiagonal` (`D + U Vᵀ`), and
`Semiseparable`, the form their LU and Cholesky factors take."""

import abc
import functools as ft

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array

from .._kernels import (
    Fallback,
    checked_or_fallback,
    failed_factorisation,
    for_the_batch,
    host_determinant_fallback,
    host_solve_fallback,
    nan_where,
    on_diagonal,
    stacked_sums,
)
from ._base import StructuredMatrix, unbatched
from ._determinant import DeterminantLU


__all__ = ["LowRank", "LowRankPlusDiagonal", "Semiseparable"]


def _outer(u: Array, v: Array) -> Array:
    return jnp.einsum("...ir,...jr->...ij", u, v)


# The largest backward error (relative to `eps`) a `LowRankPlusDiagonal` solve or
# determinant is returned with; above it, NaN (see `pivoted_solve`). A backward
# stable solve stays within a small multiple of `eps`.
_TOLERANCE = 1024


def _best(
    matrix: "LowRankPlusDiagonal",
    b: Array,
    solves: list[Array],
    answers: list[Array],
    norm: Array,
) -> Array:
    """The answer whose solve of `A x = b` has the smallest backward error (the
    first of equal ones), NaN where none is below `_TOLERANCE · eps`. An
    answer of finite pivots with a zero product (a singular matrix, from
    `pivots`) counts as exact. The candidates are compared pairwise with
    `jnp.where`, not stacked for an `argmin` (a reduction, see
    `_column_squares`). `norm`: `matrix._norm_bound()`."""
    out, least = None, None
    for x, answer in zip(solves, answers, strict=True):
        error = matrix.backward_error(x, b, norm)
        if answer is not x:
            # A product of zero has no infinite or NaN factor (that would
            # make it infinite or NaN in any order).
            error = jnp.where(jnp.prod(answer) == 0, 0, error)
        if out is None or least is None:
            out, least = answer, error
        else:
            better = error < least
            out, least = jnp.where(better, answer, out), jnp.minimum(error, least)
    assert out is not None and least is not None
    eps = jnp.finfo(out.dtype).eps
    return jnp.where(least <= _TOLERANCE * eps, out, jnp.nan).astype(out.dtype)


def _solve_fallback(woodbury: Array, m: "LowRankPlusDiagonal", b: Array) -> Array:
    """`pivoted_solve`'s fallback, where Woodbury (`woodbury`, shape `(n,)` for
    one right-hand side, else `b`'s `(n, k)`) failed its check: the
    semiseparable LU without pivoting and Woodbury with `K` partially pivoted
    (where `woodbury` solved `K` by Cholesky, which may have failed: `K` need
    not be positive definite), the answer of the smaller backward error per
    system, NaN where neither is below `_TOLERANCE`. On the host (the CPU
    backend) `_SOLVE_FALLBACK` runs its NumPy twin, `host_solve_fallback`."""
    rhs = b.reshape(woodbury.shape)
    if m._capacitance_by_cholesky():
        # `K`'s parts formed again here: `K` passed in would be copied on every
        # call (`potrf` overwrites its operand).
        woodbury = m._woodbury(rhs, pivoted=True)
    candidates = [m._lu_solve(m.semiseparable()._packed_lu(), b)]
    candidates.append(woodbury.reshape(b.shape))
    norm = m._norm_bound()
    return _best(m, b, candidates, candidates, norm).reshape(rhs.shape)


def _probe(m: "LowRankPlusDiagonal") -> Array:
    """The right-hand side `x₀ = cos(1.618 k)` whose Woodbury solve
    `_determinant_factors` checks (a constant of the compiled program)."""
    return jnp.cos(1.618 * np.arange(m.shape[-1])).astype(m.dtype)


def _determinant_fallback(
    lemma: Array, m: "LowRankPlusDiagonal", woodbury: Array
) -> Array:
    """`_determinant_factors`' fallback, where the lemma's factors `lemma`
    failed the check of Woodbury's solve `woodbury` of the probe: the pivots of
    the semiseparable LU (and `r` ones), or the lemma with `K` partially
    pivoted where `lemma` came from its Cholesky factor, whichever candidate's
    solve of the probe has the smaller backward error, NaN where neither is
    below `_TOLERANCE`. On the host, its NumPy twin `host_determinant_fallback`
    (`_DETERMINANT_FALLBACK`)."""
    probe = _probe(m)
    ones = jnp.ones((m.u.shape[-1] - 1,), m.dtype)
    lu = m.semiseparable()._packed_lu()
    solves = [m._lu_solve(lu, probe[:, None]), woodbury[:, None]]
    answers = [jnp.concatenate([lu.main, ones, jnp.ones((1,), m.dtype)]), lemma]
    if m._capacitance_by_cholesky():
        # `K` partially pivoted, formed again here (as in `_solve_fallback`).
        scaled, k, _ = m._woodbury_parts()
        pivoted = m._woodbury(probe, (scaled, k, None))
        solves[1] = pivoted[:, None]
        answers[1] = jnp.concatenate([m.diag, ones, jnp.linalg.det(k)[None]])
    return _best(m, probe[:, None], solves, answers, m._norm_bound())


_SOLVE_FALLBACK = Fallback(
    _solve_fallback, ft.partial(host_solve_fallback, tolerance=_TOLERANCE)
)
_DETERMINANT_FALLBACK = Fallback(
    _determinant_fallback, ft.partial(host_determinant_fallback, tolerance=_TOLERANCE)
)


def _check_factors(name: str, n: int | None, u: Array, v: Array | None) -> None:
    """Refuse factors `u`, `v` of `name` that are not both `(n, r)` matrices of
    one shape (`n=None`: any number of rows)."""
    for field, factor in (("u", u), ("v", v)):
        if factor is None:
            continue
        shape = jnp.shape(factor)
        if len(shape) != 2:
            raise ValueError(
                f"`{name}` needs `{field}` of shape (n, r); got `{field}` of shape "
                f"{shape}. A batch of matrices is not supported here: `jax.vmap` "
                "over the batch instead."
            )
        if n is not None and shape[0] != n:
            raise ValueError(
                f"`{name}` needs `{field}` with as many rows as `diag` has entries "
                f"({n}); got `{field}` of shape {shape}."
            )
    if v is not None and jnp.shape(u) != jnp.shape(v):
        raise ValueError(
            f"`{name}` needs `u` and `v` of the same shape (n, r) (the same rank r); "
            f"got `u` of shape {jnp.shape(u)} and `v` of shape {jnp.shape(v)}. Pad "
            "the smaller factor with zero columns to the same rank."
        )


def _column_squares(columns: list[Array]) -> Array:
    """`Σᵢ |yᵢ|²` down the first axis of each of `columns` (all of one shape,
    `(n,)` or `(n, k)`), stacked (shape `(len(columns),)` or `(len(columns), k)`):
    one reduction of the stacked arrays. XLA's CPU runtime sets up every
    reduction's small scalar buffers (its combining function's) on every call
    of the compiled program, also in a branch of a `lax.cond` that is not
    taken: a reduction each took about 0.1x of a hand-written Woodbury solve
    at n = 256 more (a dot product of vectors too: XLA rewrites it as a
    reduction), and a Gram matrix of the columns (no reduction) took as long
    as the whole hand-written solve at n = 4,096."""
    stacked = jnp.stack(columns)
    return jnp.sum(jnp.real(stacked * stacked.conj()), axis=1)


def _row_squares(f: Array) -> Array:
    """`Σᵣ |fᵢᵣ|²` along each row of `f` (shape `(n, r)`): for a rank up to 32 as
    `r` elementwise additions of columns, which XLA fuses into the operation
    that consumes them (no reduction of its own), else a reduction."""
    squares = jnp.real(f * f.conj())
    if f.shape[-1] > 32:
        return jnp.sum(squares, axis=-1)
    return ft.reduce(
        jnp.add,
        [squares[:, j] for j in range(f.shape[-1])],
        jnp.zeros(f.shape[:1], squares.dtype),
    )


class _UVt(StructuredMatrix):
    """The `U Vᵀ` term that `LowRank` and `LowRankPlusDiagonal` share: its symmetry,
    its dense array and its products, O(n r)."""

    u: eqx.AbstractVar[Array]
    v: eqx.AbstractVar[Array | None]

    linear_in_leaves = False

    @property
    def symmetric(self) -> bool:
        return self.v is None

    def _v(self) -> Array:
        return self.u if self.v is None else self.v

    def _uvt(self) -> Array:
        return _outer(self.u, self._v())

    def _uvt_matmat(self, x: Array) -> Array:
        return self.u @ (self._v().T @ x)

    @abc.abstractmethod
    def _product(self, x: Array) -> Array:
        """`A x` for `x` of shape `(n, k)`, O(n r k), with `U (Vᵀ x)`: what
        `matmat` returns where it is finite."""

    def _diagonal_part(self) -> Array | None:
        """The diagonal added to `U Vᵀ`, `None` for none."""
        return None

    def matmat(self, x: Array) -> Array:
        """`A x` for `x` of shape `(n, k)`: `U (Vᵀ x)`, O(n r k), where every entry
        of the factors (and the diagonal) is finite. Where one is not, the dense
        product's rows, one at a time in a `lax.cond` branch
        (`_dense_rows_product`, O(n² r k), no `(n, n)` array): the factored
        product meets an infinity times a zero or two opposite infinities other
        than where the dense sum does (`U Uᵀ x` with `U = [[0, 0], [0, inf]]` and
        `x = [1, 2]`: `[nan, inf]`, where the dense matrix holds `0 * inf = nan`
        off the diagonal and dense JAX gives `[nan, nan]`).

        The branch is decided by the matrix alone, not by `x` or the product:
        `matmat` stays linear in `x`, so that `jax.linear_transpose` and
        `lax.custom_linear_solve` (which transposes its `matvec`) see a
        conditional whose predicate is a constant. Under `vmap` it is decided
        once for the batch (`for_the_batch`). With finite factors and an
        infinite or NaN entry of `x`, `U (Vᵀ x)` is NaN wherever the dense
        product is, and equal to it elsewhere but where it is NaN and the dense
        product `±inf` (every `cᵣ = (Vᵀ x)ᵣ` is then infinite or NaN, so an
        entry `Σᵣ uᵢᵣ cᵣ` that is not NaN has every `uᵢᵣ cᵣ` infinite of one
        sign, and so has every dense term `(Σᵣ uᵢᵣ vⱼᵣ) xⱼ` with `xⱼ` infinite).
        A rank of zero (`U (Vᵀ x)` is zero whatever `x`): the dense rows."""
        if self.u.shape[-1] == 0:
            return self._dense_rows_product(x)
        leaves = [self.u, self.v, self._diagonal_part()]
        checks = [jnp.all(jnp.isfinite(y)) for y in leaves if y is not None]
        finite = for_the_batch(ft.reduce(jnp.logical_and, checks))
        return lax.cond(
            finite,
            lambda x: self._product(x),
            lambda x: self._dense_rows_product(x),
            x,
        )

    def _dense_rows_product(self, x: Array) -> Array:
        """`A x` for `x` of shape `(n, k)` as dense JAX computes it, one row of `A`
        at a time (`Σⱼ Aᵢⱼ xⱼ`, each `Aᵢⱼ = dᵢ δᵢⱼ + Σᵣ uᵢᵣ vⱼᵣ` formed first),
        O(n² r k) time and O(n (r + k)) memory: the infinite and NaN entries
        where dense JAX puts them."""
        v, diag = self._v(), self._diagonal_part()
        # A field may be a NumPy array (the constructors keep what they are
        # given), which the traced row index `i` below cannot index.
        diag = None if diag is None else jnp.asarray(diag)

        def row(args: tuple[Array, Array]) -> Array:
            i, u_i = args
            a_i = v @ u_i
            if diag is not None:
                a_i = a_i.at[i].add(diag[i])
            return a_i @ x

        rows = jnp.arange(self.u.shape[-2])
        return lax.map(row, (rows, self.u)).astype(jnp.result_type(self.dtype, x))

    def add(self, other: StructuredMatrix) -> "LowRank | LowRankPlusDiagonal | None":
        """`self + other` for another low-rank matrix (with or without a diagonal):
        the factors stacked, `[U₁ U₂] [V₁ V₂]ᵀ = U₁ V₁ᵀ + U₂ V₂ᵀ`, the diagonals
        added. The rank is the sum of the ranks (nothing is recompressed); the sum
        is symmetric (`v=None`) when both terms are."""
        if not isinstance(other, _UVt):
            return None
        u = jnp.concatenate([self.u, other.u], axis=-1)
        v = None
        if self.v is not None or other.v is not None:
            v = jnp.concatenate([self._v(), other._v()], axis=-1)
        diags = [m.diag for m in (self, other) if isinstance(m, LowRankPlusDiagonal)]
        allow = self.allow_materialise
        if not diags:
            return LowRank(u, v, allow_materialise=allow)
        diag = diags[0] if len(diags) == 1 else diags[0] + diags[1]
        return LowRankPlusDiagonal(diag, u, v, allow_materialise=allow)


class LowRank(_UVt):
    """`U Vᵀ`, an `(n, n)` matrix of rank at most `r`. Products cost O(n r).

    **Fields:**

    - `u`: shape `(n, r)`.
    - `v`: shape `(n, r)`; `None` (the default) means `v = u`, a symmetric matrix.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    u: Array
    v: Array | None = None

    def __check_init__(self):
        _check_factors("LowRank", None, self.u, self.v)

    def aval(self) -> jax.core.ShapedArray:
        unbatched(self, "u", 2)
        n = self.u.shape[-2]
        return jax.core.ShapedArray((n, n), self.u.dtype)

    def dense(self) -> Array:
        return self._uvt()

    def transpose(self) -> "LowRank":
        if self.v is None:
            return self
        return LowRank(self.v, self.u, allow_materialise=self.allow_materialise)

    def scaled(self, s: Array) -> "LowRank":
        return LowRank(self.u * s, self._v(), allow_materialise=self.allow_materialise)

    def _product(self, x: Array) -> Array:
        return self._uvt_matmat(x)

    def entries(self, i: Array, j: Array) -> Array:
        n = self.u.shape[0]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        return jnp.sum(self.u[i] * self._v()[j], axis=-1)

    def add_diagonal(self, d: Array) -> "LowRankPlusDiagonal":
        return LowRankPlusDiagonal(
            d, self.u, self.v, allow_materialise=self.allow_materialise
        )

    def row_scaled(self, d: Array) -> "LowRank":
        return LowRank(
            d[:, None] * self.u, self._v(), allow_materialise=self.allow_materialise
        )

    def col_scaled(self, d: Array) -> "LowRank":
        return LowRank(
            self.u, d[:, None] * self._v(), allow_materialise=self.allow_materialise
        )


class LowRankPlusDiagonal(_UVt):
    """`diag(d) + U Vᵀ`. Products cost O(n r); `jnp.linalg.solve` and
    `jnp.linalg.cholesky` cost O(n r²) (the factors are semiseparable, the
    Woodbury identity and the matrix determinant lemma in disguise), through an
    LU factorisation *without pivoting*: where a pivot other than the last is
    exactly zero (a zero leading minor), `det` and `slogdet`'s log-determinant
    are NaN, not a silent 0 / `-inf`.

    **Fields:**

    - `diag`: shape `(n,)`.
    - `u`: shape `(n, r)`.
    - `v`: shape `(n, r)`; `None` (the default) means `v = u`: a symmetric matrix,
        positive definite when `diag > 0` (a kernel matrix with inducing points).
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    diag: Array
    u: Array
    v: Array | None = None

    def __check_init__(self):
        if jnp.ndim(self.diag) != 1:
            raise ValueError(
                "`LowRankPlusDiagonal` needs `diag` of shape (n,); got `diag` of "
                f"shape {jnp.shape(self.diag)}. A batch of matrices is not supported "
                "here: `jax.vmap` over the batch instead."
            )
        _check_factors("LowRankPlusDiagonal", jnp.shape(self.diag)[0], self.u, self.v)

    def aval(self) -> jax.core.ShapedArray:
        unbatched(self, "diag", 1)
        n = self.diag.shape[-1]
        return jax.core.ShapedArray((n, n), jnp.result_type(self.diag, self.u))

    def dense(self) -> Array:
        return on_diagonal(self.diag.astype(self.dtype)) + self._uvt()

    def transpose(self) -> "LowRankPlusDiagonal":
        if self.v is None:
            return self
        return LowRankPlusDiagonal(
            self.diag, self.v, self.u, allow_materialise=self.allow_materialise
        )

    def scaled(self, s: Array) -> "LowRankPlusDiagonal":
        return LowRankPlusDiagonal(
            self.diag * s,
            self.u * s,
            self._v(),
            allow_materialise=self.allow_materialise,
        )

    def _product(self, x: Array) -> Array:
        return self.diag[:, None] * x + self._uvt_matmat(x)

    def _diagonal_part(self) -> Array:
        return self.diag

    def entries(self, i: Array, j: Array) -> Array:
        return self.semiseparable().entries(i, j)

    def add_diagonal(self, d: Array) -> "LowRankPlusDiagonal":
        return LowRankPlusDiagonal(
            self.diag + d, self.u, self.v, allow_materialise=self.allow_materialise
        )

    def row_scaled(self, d: Array) -> "LowRankPlusDiagonal":
        return LowRankPlusDiagonal(
            d * self.diag,
            d[:, None] * self.u,
            self._v(),
            allow_materialise=self.allow_materialise,
        )

    def col_scaled(self, d: Array) -> "LowRankPlusDiagonal":
        return LowRankPlusDiagonal(
            self.diag * d,
            self.u,
            d[:, None] * self._v(),
            allow_materialise=self.allow_materialise,
        )

    def semiseparable(self) -> "Semiseparable":
        """The same matrix as a `Semiseparable` (generators `U`, `V` both sides)."""
        v = self._v()
        main = self.diag + jnp.sum(self.u * v, axis=-1)
        return Semiseparable(
            self.u, v, main, self.u, v, allow_materialise=self.allow_materialise
        )

    def lu(self) -> DeterminantLU:
        """The semiseparable LU factors without pivoting, whose diagonal reads as
        `pivots()`: what `slogdet`/`det` read. `lu_solve` does not solve with the
        factors: its first triangular solve does the whole solve
        (`pivoted_solve`), the second returns it (see `HalfSolved`)."""
        return DeterminantLU(self.packed_factors(), self, pivots=self.pivots())

    def packed_factors(self) -> "Semiseparable":
        """The packed LU factors without pivoting, O(n r²) (a sequential scan):
        `DeterminantLU` computes them again where it reads entries off the
        diagonal, so that reading the diagonal alone (`slogdet`, `det`) skips
        them."""
        return self.semiseparable()._packed_lu()

    def cholesky(self) -> "Semiseparable":
        return self.semiseparable().cholesky()

    def pivoted_solve(self, b: Array, *, transpose: bool) -> Array:
        """Solve `A x = b` (`Aᵀ x = b` if `transpose`) for `b` of shape `(n, k)`:
        by Woodbury first (`D⁻¹ b - D⁻¹ U K⁻¹ Vᵀ D⁻¹ b`, the `r x r` capacitance
        `K = I + Vᵀ D⁻¹ U` solved by Cholesky where it is real symmetric, see
        `_woodbury_parts`, else with partial pivoting), O(n r k + n r² + r³),
        checked by its backward error `‖b - A x‖₂ / (‖A‖₂ ‖x‖₂ + ‖b‖₂)` (O(n r k),
        see `backward_error`; `_woodbury_accurate` bounds it from above with
        the `r`-vector `z - Vᵀ x`, never saying yes where it is above the
        tolerance). Only where that is above
        `_TOLERANCE` (a tiny entry of `diag` against `U Vᵀ`, or a capacitance
        that is not positive definite), a `lax.cond` branch (on the CPU
        backend one custom call into the same computation in NumPy on the
        host: `checked_or_fallback`) runs the semiseparable LU without
        pivoting and Woodbury with `K` partially
        pivoted, and keeps, per system, the answer with the smaller backward
        error, NaN where neither is below `_TOLERANCE` (never a silently
        inaccurate answer): the LU fails at a tiny leading minor, so only both
        at once gives NaN. Under `vmap` (over the matrices or over `b`) the
        branch is decided once for the batch (`for_the_batch`): Woodbury alone
        where every system passes its check, else the fallback for all of them
        (each keeping its better answer). A matrix tagged `positive_definite`
        solves by the LU alone (stable there)."""
        m = self.transpose() if transpose else self
        if self.positive_definite:
            return m._lu_solve(m.semiseparable()._packed_lu(), b)
        parts = m._woodbury_parts()
        # One right-hand side: Woodbury and its check on vectors, which XLA's CPU
        # backend runs as matrix-vector products (on `(n, 1)` matrices it took up
        # to 2x as long at n = 4,096).
        rhs = b[:, 0] if b.shape[-1] == 1 else b
        woodbury, z = m._woodbury_steps(rhs, parts)
        accurate = for_the_batch(m._woodbury_accurate(rhs, woodbury, z))
        out = checked_or_fallback(accurate, woodbury, _SOLVE_FALLBACK, m, b)
        return out.reshape(b.shape)

    def pivots(self) -> Array:
        """Numbers whose product is the determinant (shape `(n,)`): the `n + r`
        numbers of `_determinant_factors`, the last `r + 1` multiplied into the
        last one. Tagged `positive_definite`: the LU's pivots alone."""
        if self.positive_definite:
            return self.semiseparable()._packed_lu().main
        n = self.shape[-1]
        factors = self._determinant_factors()
        return factors[:n].at[-1].multiply(jnp.prod(factors[n:]))

    def _determinant_factors(self) -> Array:
        """`n + r` numbers whose product is the determinant: `diag` and the
        squares of the diagonal of `K`'s Cholesky factor (the matrix
        determinant lemma, `K` factored as `_woodbury_parts` does; where `K` is
        not real symmetric, `r - 1` ones and `det K`; of rank 0, `diag` alone),
        where Woodbury with that factorisation solves a probe system `A x = x₀`
        (`x₀ = cos(1.618 k)`, a constant of the compiled program) with a
        backward error below `_TOLERANCE`. Only otherwise, in a `lax.cond`
        branch (decided once for a batch under `vmap`, and on the CPU backend
        a program of its own, as in `pivoted_solve`),
        the pivots of the semiseparable LU (and `r` ones) or the lemma with `K`
        partially pivoted, whichever candidate's solve has the smaller backward
        error (finite numbers with a zero product, a singular matrix, count as
        exact), NaN where neither is below `_TOLERANCE`. `r` numbers rather
        than `det K` folded into the last entry of `diag`: `slogdet` takes the
        logarithms of all of them in one reduction, where a product of the
        Cholesky diagonal would be another."""
        r = self.u.shape[-1]
        if r == 0:
            return self.diag
        parts = self._woodbury_parts()
        _, capacitance, cholesky = parts
        ones = jnp.ones((r - 1,), self.dtype)
        if cholesky is None:
            lemma = jnp.concatenate(
                [self.diag, ones, jnp.linalg.det(capacitance)[None]]
            )
        else:
            # The diagonal as a strided slice: `jnp.diagonal` is a gather (and
            # a `lax.cond` on the offset).
            diagonal = cholesky.reshape(-1)[:: r + 1]
            lemma = jnp.concatenate([self.diag, diagonal**2])
        probe = _probe(self)
        woodbury, z = self._woodbury_steps(probe, parts)
        accurate = for_the_batch(self._woodbury_accurate(probe, woodbury, z))
        return checked_or_fallback(
            accurate, lemma, _DETERMINANT_FALLBACK, self, woodbury
        )

    def slogdet(self) -> tuple[Array, Array]:
        """`jnp.linalg.slogdet`'s `(sign, logabsdet)`, read off
        `_determinant_factors()` in one reduction (for a real dtype: `Σ log|pᵢ|`
        and the number of negative factors, stacked), what `jnp.linalg.slogdet`
        calls directly (a registered rule). Its body reads `pivots()` through
        `lax.linalg.lu` (`DeterminantLU`): the diagonal's own `lax.cond`, a
        gather of the pivots by the identity permutation, and four reductions
        (whether a pivot is zero, the permutation's parity, the signs' product,
        the sum of the logarithms); XLA's CPU runtime sets up each reduction's
        scalar buffers on every call. A zero factor gives sign 0 and `-inf`, a
        NaN one NaN for both, as the body does. Tagged `positive_definite`:
        the LU's pivots."""
        if self.positive_definite:
            p = self.semiseparable()._packed_lu().main
        else:
            p = self._determinant_factors()
        if jnp.issubdtype(p.dtype, jnp.complexfloating):
            magnitude = jnp.abs(p)
            logabsdet = jnp.sum(jnp.log(magnitude))
            sign = jnp.prod(p / magnitude)
        else:
            parts = jnp.stack([jnp.log(jnp.abs(p)), (p < 0).astype(p.dtype)])
            logabsdet, negative = jnp.sum(parts, axis=1)
            sign = jnp.where(negative % 2 == 1, -1, 1).astype(p.dtype)
            sign = jnp.where(jnp.isnan(logabsdet), jnp.nan, sign)
        return jnp.where(logabsdet == -jnp.inf, 0, sign).astype(p.dtype), logabsdet

    def _woodbury_parts(self) -> tuple[Array, Array, Array | None]:
        """`D⁻¹ U`, the capacitance `K = I + Vᵀ D⁻¹ U` (`r x r`), and, where `K` is
        real symmetric (`v is None`, a real dtype), its lower Cholesky factor
        (`None` otherwise; NaN where `K` is not positive definite, which it is
        where every `dᵢ > 0`). `potrf` and two triangular solves are four XLA
        calls on the CPU backend where `jnp.linalg.solve`'s `getrf`, its
        permutation loop and gather and two triangular solves are eight: a
        rank-8 Woodbury solve took about 0.85x of the hand-written one at
        n = 256 (which solves `K` as `jnp.linalg.solve`). A complex symmetric
        `K` (`U Uᵀ`, not conjugated) is not Hermitian: solved pivoted."""
        scaled = self.u / self.diag[:, None]
        eye = jnp.eye(self.u.shape[-1], dtype=self.dtype)
        capacitance = eye + self._v().T @ scaled
        cholesky = None
        if self._capacitance_by_cholesky():
            cholesky = lax.linalg.cholesky(capacitance, symmetrize_input=False)
        return scaled, capacitance, cholesky

    def _capacitance_by_cholesky(self) -> bool:
        """Whether `_woodbury_parts` factors the capacitance by Cholesky: where
        it is real symmetric (`v is None`, a real dtype)."""
        return self.v is None and not jnp.issubdtype(self.dtype, jnp.complexfloating)

    def _woodbury(
        self,
        b: Array,
        parts: tuple[Array, Array, Array | None] | None = None,
        *,
        pivoted: bool = False,
    ) -> Array:
        """`A⁻¹ b` by the Woodbury identity, O(n r k + n r² + r³), for `b` of shape
        `(n, k)` or `(n,)`: NaN/inf at a zero entry of `diag`, NaN where `K` has
        a Cholesky factor that failed. `parts`: `_woodbury_parts()`, where the
        caller has them; `pivoted`: solve `K` with partial pivoting even where
        it has a Cholesky factor."""
        return self._woodbury_steps(b, parts, pivoted=pivoted)[0]

    def _woodbury_steps(
        self,
        b: Array,
        parts: tuple[Array, Array, Array | None] | None = None,
        *,
        pivoted: bool = False,
    ) -> tuple[Array, Array]:
        """`_woodbury`'s answer `x` and the capacitance solve's `z = K⁻¹ Vᵀ D⁻¹ b`
        (shape `(r,)` or `(r, k)`), what `_woodbury_accurate` reads with it."""
        scaled, k, cholesky = self._woodbury_parts() if parts is None else parts
        diag = self.diag if b.ndim == 1 else self.diag[:, None]
        c = self._vt_times(b / diag)
        if cholesky is None or pivoted:
            z = jnp.linalg.solve(k, c)
        else:
            column = c if c.ndim == 2 else c[:, None]
            solve = ft.partial(lax.linalg.triangular_solve, cholesky, left_side=True)
            y = solve(column, lower=True)
            z = solve(y, lower=True, transpose_a=True)
            z = z if c.ndim == 2 else z[:, 0]
        return self._back_substitute(b, z, scaled), z

    def _back_substitute(self, b: Array, z: Array, scaled: Array) -> Array:
        """`D⁻¹ b - (D⁻¹ U) z` for any `z` (`scaled`: `D⁻¹ U`), as `_woodbury`
        forms its answer: what `_woodbury_accurate` assumes of `x`."""
        diag = self.diag if b.ndim == 1 else self.diag[:, None]
        return b / diag - scaled @ z

    def _vt_times(self, x: Array) -> Array:
        """`Vᵀ x` for `x` of shape `(n,)` or `(n, k)`. A vector as the row `xᵀ V`
        (a `(1, n)` by `(n, r)` product): XLA's CPU backend runs `Vᵀ x` as a
        fusion that transposes `V`, which took 1.4x as long at n = 256 and
        1,024 and 2x at n = 4,096."""
        if x.ndim == 1:
            return (x[None, :] @ self._v())[0]
        return self._v().T @ x

    def _woodbury_accurate(self, b: Array, x: Array, z: Array) -> Array:
        """Whether the backward error of `x` (as `backward_error`, of every
        column of `b`) is at most `_TOLERANCE · eps`, where `x` is
        `_back_substitute(b, z, D⁻¹ U)` for some `z` (`_woodbury_steps`' or any
        other: nothing is assumed of `z`). O(n r k) and one pass over `V`
        (`Vᵀ x`), against two for `b - A x`, and no `n`-vector residual.

        The bound, never below the backward error (a proof). With `x = D⁻¹(b -
        U z)` in exact arithmetic, `b - D x - U Vᵀ x = U (z - Vᵀ x)`. In floating
        point, each `xᵢ` is `wᵢ - Σᵣ sᵢᵣ zᵣ` with `wᵢ = fl(bᵢ / dᵢ)` and `sᵢᵣ =
        fl(uᵢᵣ / dᵢ)`, each term carrying at most `r + 3` roundings (two for a
        division done as a product with `1 / dᵢ`, one for the product with
        `zᵣ`, `r` for the sum): `dᵢ xᵢ = bᵢ (1 + θ) - Σᵣ uᵢᵣ zᵣ (1 + θᵣ)` with
        every `|θ| ≤ g = m μ / (1 - m μ)`, `m = r + 3`, `μ` the unit roundoff
        (`eps / 2`; `3 eps` for a complex dtype, whose products and quotients
        round by up to about `5.7 u` rather than `u`). So the residual is `e + U y`
        with `y = z - Vᵀ x` and `|eᵢ| ≤ g (|bᵢ| + Σᵣ |uᵢᵣ| |zᵣ|)`, and

            ‖b - A x‖ ≤ ‖U‖_F (‖y‖ + g ‖z‖) + g ‖b‖
                      ≤ √2 ‖U‖_F (‖y‖² + g² ‖z‖²)^½ + g ‖b‖,

        `y` as computed up to its subtraction's rounding (a factor `1 + 2u`).
        `‖A‖₂` in the backward error is at most `max |dᵢ| + ‖U‖_F ‖V‖_F`; the
        check divides by the smaller `‖D x‖ + ‖U‖_F ‖V‖_F ‖x‖ + ‖b‖`, so that
        it says yes only where

            √2 (1 + 2u) ‖U‖_F (‖y‖² + g² ‖z‖²)^½
                ≤ (_TOLERANCE · eps - g) (‖D x‖ + ‖U‖_F ‖V‖_F ‖x‖ + ‖b‖),

        which implies `‖b - A x‖ ≤ _TOLERANCE · eps (‖A‖₂ ‖x‖ + ‖b‖)`. As for
        any computed residual, `Vᵀ x` and the sums of squares are taken as
        computed (their rounding is not bounded here). The sums of squares are
        unscaled (no `max |b|` as in `backward_error`): a square that
        underflows loses less than `tiny`, so the left side adds `tiny` per
        entry summed (an upper bound still), the right side only shrinks (the
        check is stricter), and a sum that overflows makes the right side
        infinite (then no) or the left side (no). NaN anywhere: no. Where `g`
        reaches `_TOLERANCE · eps` (a rank in the thousands), never yes: the
        caller's fallback decides with `backward_error`."""
        n, r = self.u.shape
        info = jnp.finfo(x.dtype)
        eps, tiny = float(info.eps), float(info.tiny)
        unit = 3 * eps if jnp.issubdtype(x.dtype, jnp.complexfloating) else eps / 2
        m = (r + 3) * unit
        gamma = m / (1 - m) if m < 1 else float("inf")
        y = z - self._vt_times(x)
        squares = lambda a: jnp.real(a * a.conj())
        near = jnp.sum(squares(y) + gamma**2 * squares(z), axis=0) + 2 * r * tiny
        diag = self.diag if x.ndim == 1 else self.diag[:, None]
        # The factors' sums of squares in the same reduction as `x`'s, `b`'s and
        # `D x`'s: each factor's rows summed first, elementwise (`_row_squares`),
        # then stacked beside the vectors. XLA's CPU backend runs each reduction
        # as three calls (the squares, a partial `reduce-window`, the final
        # `reduce`): one reduction for all of them is three calls fewer than a
        # reduction per factor, about 0.15x of a hand-written Woodbury solve at
        # n = 256.
        # (`stacked_sums`; under `vmap` over right-hand sides the factors' rows
        # are summed once, apart, not broadcast to the batch.)
        factors = [self.u] if self.v is None else [self.u, self.v]
        vectors = (squares(x), squares(b), squares(diag * x))
        sums, frobenius = stacked_sums(vectors, tuple(map(_row_squares, factors)))
        size_x, size_b, size_dx = sums
        size_u = frobenius[0] + n * r * tiny
        product = (
            frobenius[0] if self.v is None else jnp.sqrt(frobenius[0] * frobenius[1])
        )
        left = np.sqrt(2) * (1 + eps) * jnp.sqrt(size_u * near)
        denominator = jnp.sqrt(size_dx) + product * jnp.sqrt(size_x) + jnp.sqrt(size_b)
        accurate = left <= (_TOLERANCE * eps - gamma) * denominator
        return jnp.all(accurate & jnp.isfinite(denominator))

    def _lu_solve(self, packed: "Semiseparable", b: Array) -> Array:
        """`A⁻¹ b` with the semiseparable LU without pivoting, O(n r k)."""
        kw = dict(transpose_a=False)
        y = packed.triangular_solve(b, lower=True, unit_diagonal=True, **kw)
        return packed.triangular_solve(y, lower=False, unit_diagonal=False, **kw)

    def _norm_bound(self) -> Array:
        """An upper bound of `‖A‖₂`: `max_i |dᵢ| + ‖U‖_F ‖V‖_F`, the size of the
        factors (a sum of squares over each of `U` and `V`, rather than the
        tighter `‖U Vᵀ‖_F` from two `r x r` Gram matrices, which took 0.2x to
        0.45x of a hand-written Woodbury solve more). `pivoted_solve` and
        `_determinant_factors` compute it in their fallback branch, once for
        every candidate's `backward_error` (their check,
        `_woodbury_accurate`, needs no `max |dᵢ|`)."""
        factors = [self.u] if self.v is None else [self.u, self.v]
        squares = [jnp.sum(jnp.real(y * y.conj())) for y in factors]
        frobenius = squares[0] if self.v is None else jnp.sqrt(squares[0] * squares[1])
        return jnp.max(jnp.abs(self.diag)) + frobenius

    def backward_error(self, x: Array, b: Array, norm: Array | None = None) -> Array:
        """`max_k ‖b_k - A x_k‖₂ / (‖A‖₂ ‖x_k‖₂ + ‖b_k‖₂)` over the columns of `b`
        (`b` of shape `(n, k)`, or `(n,)`: one system), with `‖A‖₂` bounded above
        by `norm` (default `_norm_bound()`, `max |dᵢ| + ‖U‖_F ‖V‖_F`); `inf` where it
        is NaN. O(n r k): two passes over the factors for `A x`."""
        norm = self._norm_bound() if norm is None else norm
        if x.ndim == 1:
            ax = self.diag * x + self.u @ (self._v().T @ x)
            x, b, ax = x[:, None], b[:, None], ax[:, None]
        else:
            ax = self._product(x)
        # Every vector scaled by `max |b|` (per column), so that the sums of
        # squares neither overflow nor underflow where `b` and `x` are of one
        # magnitude (where `x` is beyond `b`'s by more than the dtype's range,
        # the denominator is infinite and the error 0: the residual is indeed
        # tiny against `‖A‖ ‖x‖`).
        big = jnp.max(jnp.abs(b), axis=0)
        scale = jnp.where(big > 0, big, 1)
        sums = _column_squares([(b - ax) / scale, x / scale, b / scale])
        residual, size_x, size_b = jnp.sqrt(sums)
        errors = residual / (norm * size_x + size_b)
        error = errors[0] if errors.shape[0] == 1 else jnp.max(errors)
        return jnp.where(jnp.isnan(error), jnp.inf, error)


class Semiseparable(StructuredMatrix):
    """A matrix whose strictly lower part is that of `C Eᵀ`, whose diagonal is
    `main`, and whose strictly upper part is that of `A Bᵀ`: the form of the LU and
    Cholesky factors of `LowRankPlusDiagonal`. Products and triangular solves cost
    O(n r) per column, LU and Cholesky factorisations O(n r²).

    **Fields:**

    - `lower_left`, `lower_right`: `C` and `E`, shape `(n, r)`.
    - `main`: shape `(n,)`.
    - `upper_left`, `upper_right`: `A` and `B`, shape `(n, s)`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    conjugates_leafwise = False

    lower_left: Array
    lower_right: Array
    main: Array
    upper_left: Array
    upper_right: Array

    linear_in_leaves = False

    def __check_init__(self):
        if jnp.ndim(self.main) != 1:
            raise ValueError(
                "`Semiseparable` needs `main` of shape (n,); got `main` of shape "
                f"{jnp.shape(self.main)}."
            )
        n = jnp.shape(self.main)[0]
        for left, right in (
            ("lower_left", "lower_right"),
            ("upper_left", "upper_right"),
        ):
            a, b = jnp.shape(getattr(self, left)), jnp.shape(getattr(self, right))
            if len(a) != 2 or a != b or a[0] != n:
                raise ValueError(
                    f"`Semiseparable` needs `{left}` and `{right}` of one shape "
                    f"({n}, r); got {a} and {b}."
                )

    def aval(self) -> jax.core.ShapedArray:
        n = self.main.shape[-1]
        return jax.core.ShapedArray((n, n), self.main.dtype)

    def dense(self) -> Array:
        lower = jnp.tril(_outer(self.lower_left, self.lower_right), -1)
        upper = jnp.triu(_outer(self.upper_left, self.upper_right), 1)
        return lower + upper + on_diagonal(self.main)

    def transpose(self) -> "Semiseparable":
        return Semiseparable(
            self.upper_right,
            self.upper_left,
            self.main,
            self.lower_right,
            self.lower_left,
            allow_materialise=self.allow_materialise,
        )

    def scaled(self, s: Array) -> "Semiseparable":
        return Semiseparable(
            self.lower_left * s,
            self.lower_right,
            self.main * s,
            self.upper_left * s,
            self.upper_right,
            allow_materialise=self.allow_materialise,
        )

    def add_diagonal(self, d: Array) -> "Semiseparable":
        return Semiseparable(
            self.lower_left,
            self.lower_right,
            self.main + d,
            self.upper_left,
            self.upper_right,
            allow_materialise=self.allow_materialise,
        )

    def entries(self, i: Array, j: Array) -> Array:
        n = self.main.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        lower = jnp.sum(self.lower_left[i] * self.lower_right[j], axis=-1)
        upper = jnp.sum(self.upper_left[i] * self.upper_right[j], axis=-1)
        return jnp.where(i > j, lower, jnp.where(i < j, upper, self.main[i]))

    def matmat(self, x: Array) -> Array:
        # Exclusive prefix sums of E_k x_k (lower part) and suffix sums of B_k x_k.
        e_x = jnp.einsum("kr,kc->krc", self.lower_right, x)
        before = jnp.cumsum(e_x, axis=0) - e_x
        b_x = jnp.einsum("kr,kc->krc", self.upper_right, x)
        after = jnp.cumsum(b_x[::-1], axis=0)[::-1] - b_x
        out = self.main[:, None] * x
        out = out + jnp.einsum("ir,irc->ic", self.lower_left, before)
        return out + jnp.einsum("ir,irc->ic", self.upper_left, after)

    def lu(self) -> DeterminantLU:
        """The packed LU factors (`_packed_lu`), for `jnp.linalg.solve`/`slogdet`."""
        return DeterminantLU(self._packed_lu(), self)

    def _packed_lu(self) -> "Semiseparable":
        """The packed LU factors without pivoting, O(n r s): the strictly lower part
        of `L` has generators `(C, Q)`, `U` has diagonal `u` and generators
        `(P, B)`."""
        c, e, m, a, b = (
            self.lower_left,
            self.lower_right,
            self.main,
            self.upper_left,
            self.upper_right,
        )

        def step(s, x):
            ci, ei, mi, ai, bi = x
            p = ai - s.T @ ci
            u = mi - ci @ s @ bi
            q = (ei - s @ bi) / u
            return s + jnp.outer(q, p), (q, u, p)

        s0 = jnp.zeros((c.shape[-1], a.shape[-1]), self.dtype)
        _, (q, u, p) = lax.scan(step, s0, (c, e, m, a, b))
        return Semiseparable(c, q, u, p, b, allow_materialise=self.allow_materialise)

    def cholesky(self) -> "Semiseparable":
        """The lower Cholesky factor `G` (`M = G Gᵀ`), from the lower triangle only
        (as `lax.linalg.cholesky` reads it), O(n r²)."""
        sym = Semiseparable(
            self.lower_left,
            self.lower_right,
            self.main,
            self.lower_right,
            self.lower_left,
            allow_materialise=self.allow_materialise,
        )
        lu = sym._packed_lu()
        root = jnp.sqrt(lu.main)
        # As dense JAX: where the matrix is not positive definite, the whole lower
        # triangle of the factor is NaN.
        failed = failed_factorisation(root)
        zeros = jnp.zeros_like(self.lower_left[:, :1])
        return Semiseparable(
            nan_where(failed, lu.lower_left),
            lu.lower_right * root[:, None],
            nan_where(failed, root),
            zeros,
            zeros,
            allow_materialise=self.allow_materialise,
        )

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array:
        """Solve `op(A) x = b` with `A` the lower (or upper) triangle, O(n r k)."""
        if lower:
            g, h = (
                (self.lower_right, self.lower_left)
                if transpose_a
                else (self.lower_left, self.lower_right)
            )
        else:
            g, h = (
                (self.upper_right, self.upper_left)
                if transpose_a
                else (self.upper_left, self.upper_right)
            )
        diag = None if unit_diagonal else self.main
        return _generator_solve(g, h, diag, b, forward=lower != transpose_a)


def _generator_solve(
    g: Array, h: Array, diag: Array | None, b: Array, forward: bool
) -> Array:
    """`x_i = (b_i - g_iᵀ Σ_k h_k x_kᵀ) / d_i` over `k < i` (forward) or `k > i`."""
    d = jnp.ones(b.shape[:1], b.dtype) if diag is None else diag

    def step(w, xs):
        gi, hi, bi, di = xs
        x = (bi - gi @ w) / di
        return w + jnp.outer(hi, x), x

    w0 = jnp.zeros((h.shape[-1], b.shape[-1]), jnp.result_type(h, b))
    _, x = lax.scan(step, w0, (g, h, b, d), reverse=not forward)
    return x
