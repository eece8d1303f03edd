"""`DeterminantLU`: what `lax.linalg.lu` returns for a structured matrix, which
`jnp.linalg.solve`, `slogdet` and `det` read; `HalfSolved`: the first half of a
pivoted solve."""

import dataclasses
import math
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import quax
from jax import lax
from jaxtyping import Array

from ._base import StructuredMaterialisationError, StructuredMatrix


__all__ = ["DeterminantLU", "HalfSolved"]


class DeterminantLU(StructuredMatrix):
    """What `lax.linalg.lu` returns for every structure but `Kronecker`: its packed
    LU factors, which `jnp.linalg.solve` and `slogdet` read, and the pivots its
    determinant is read from.

    The factors are those of an LU without pivoting (except `BlockDiagonal`'s
    blocks). Where they would be inaccurate, the matrix gives better numbers:
    `pivots` (`TridiagonalMatrix`'s 2 x 2 block pivots; `Banded`'s, `Toeplitz`'s
    and `LowRankPlusDiagonal`'s from a partially pivoted elimination or a stable
    route, their product carrying the sign of the row swaps), which the diagonal
    reads as; and a matrix with `pivoted_solve` (`TridiagonalMatrix`, `Banded`,
    `LowRankPlusDiagonal`) is solved by `lu_solve`'s two triangular solves with
    pivoting (see `HalfSolved`); `Toeplitz`'s factors solve themselves (the
    Levinson recursion, checked by its backward error, and GKO's partial pivoting
    where the check fails; the Levinson recursion alone where tagged positive
    definite). Without `pivots`, where a pivot
    other than the last is exactly zero (a zero leading minor), the diagonal
    reads NaN, so that `det` and `slogdet`'s log-determinant are NaN, never a
    silent 0 / `-inf`.

    **Fields:**

    - `factors`: the packed LU factors (a structured matrix).
    - `matrix`: the factored matrix.
    - `pivots`: what the diagonal reads as (numbers whose product is the
        determinant) where the matrix gives better ones than its factors (see
        `TridiagonalMatrix`), else `None`.
    """

    conjugates_leafwise = False

    factors: StructuredMatrix
    matrix: StructuredMatrix
    pivots: Array | None = None

    def __init__(
        self,
        factors: StructuredMatrix,
        matrix: StructuredMatrix,
        pivots: Array | None = None,
    ):
        self.factors = factors
        self.matrix = matrix
        self.pivots = pivots
        # The factors follow the factored matrix's policy.
        self.allow_materialise = matrix.allow_materialise
        self.positive_definite = False

    def __check_init__(self):
        for field in ("factors", "matrix"):
            value = getattr(self, field)
            if not isinstance(value, StructuredMatrix):
                raise ValueError(
                    f"`DeterminantLU` needs `{field}` to be a structured matrix; got "
                    f"a `{type(value).__name__}`."
                )
        shape, matrix_shape = self.factors.shape, self.matrix.shape
        if shape != matrix_shape:
            raise ValueError(
                f"`DeterminantLU` needs `factors` of the shape of the factored "
                f"`matrix`, {matrix_shape}; got `factors` of shape {shape}."
            )
        if self.pivots is None:
            return
        want = (shape[:-1], jnp.result_type(self.factors.dtype))
        got = (jnp.shape(self.pivots), jnp.result_type(self.pivots))
        if got != want:
            raise ValueError(
                "`DeterminantLU` needs `pivots` (what the diagonal reads as, one "
                f"per row) of shape {want[0]} and dtype {want[1]}, as its factors of "
                f"shape {shape}; got `pivots` of shape {got[0]} and dtype {got[1]}."
            )

    def enable_materialise(self, allow: bool = True) -> "DeterminantLU":
        """A copy whose factors and matrix have `allow_materialise=allow`."""
        return DeterminantLU(
            self.factors.enable_materialise(allow),
            self.matrix.enable_materialise(allow),
            self.pivots,
        )

    def aval(self) -> jax.core.ShapedArray:
        return self.factors.aval()

    def dense(self) -> Array:
        return self.factors.dense()

    def way_out(self, primitive: Any) -> str:
        return self.factors.way_out(primitive)

    def entries(self, i: Array, j: Array) -> Array | None:
        if self.pivots is not None:
            if jax.eval_shape(lambda: self.factors.entries(i, j)) is None:
                return None
            n = self.shape[-1]
            on_diagonal = self.pivots[jnp.clip(i, 0, n - 1)].astype(self.dtype)

            def with_factors(on_diagonal: Array) -> Array:
                # A matrix that can (`packed_factors`) factors again inside this
                # branch, so that the factors outside it are dead code.
                refactor = getattr(self.matrix, "packed_factors", None)
                factors = self.factors if refactor is None else refactor()
                out = factors.entries(i, j)
                # `self.factors` has entries (checked above), and so has a
                # refactored copy, of their type.
                assert out is not None
                return jnp.where(i == j, on_diagonal.astype(out.dtype), out)

            # Where only the diagonal is read (`jnp.diagonal`, what `slogdet` and
            # `det` read), the factors are not: a `lax.cond` skips computing them
            # (`LowRankPlusDiagonal`'s are a sequential scan, which its pivots no
            # longer need: 58x a hand-written slogdet at n = 1,024 before).
            return lax.cond(jnp.all(i == j), lambda d: d, with_factors, on_diagonal)
        out = self.factors.entries(i, j)
        if out is None:
            return out
        if type(self.matrix).determinant is StructuredMatrix.determinant:
            out = jnp.where((i == j) & self._zero_leading_minor(), jnp.nan, out)
        return out

    def main_diagonal(self) -> Array:
        if self.pivots is not None:
            return self.pivots
        return super().main_diagonal()

    def _zero_leading_minor(self) -> Array:
        """Whether the factors' pivots (of an LU without pivoting) meet an exactly
        zero pivot other than the last (a zero leading minor), after which the
        others are infinite or NaN: their product is then not the determinant,
        which may be nonzero, so `slogdet`/`det` read NaN, never a silent zero."""
        n = self.shape[-1]
        index = jnp.arange(n)
        pivots = self.factors.entries(index, index)
        assert pivots is not None
        return jnp.any(pivots[:-1] == 0) | ~jnp.all(jnp.isfinite(pivots))

    def masked(self, y: Array, *, select: bool = False) -> StructuredMatrix | None:
        return self.factors.masked(y, select=select)

    def transpose(self) -> StructuredMatrix | None:
        return self.factors.transpose()

    def matmat(self, x: Array) -> Array | None:
        return self.factors.matmat(x)

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        if self._first_half(lower=lower, transpose_a=transpose_a) and (
            unit_diagonal == lower
        ):
            solve = self.matrix.pivoted_solve  # pyright: ignore[reportAttributeAccessIssue]
            solution = solve(b, transpose=transpose_a)
            return HalfSolved(  # pyright: ignore[reportReturnType]
                solution, transpose_a, b.shape, jnp.result_type(solution)
            )
        return self.factors.triangular_solve(
            b, lower=lower, transpose_a=transpose_a, unit_diagonal=unit_diagonal
        )

    def _first_half(self, *, lower: bool, transpose_a: bool) -> bool:
        """Whether this is the first of `lu_solve`'s two triangular solves (the unit
        lower one, or the transposed upper one) of a matrix that solves pivoted."""
        return hasattr(self.matrix, "pivoted_solve") and lower != transpose_a

    def second_half(
        self,
        b: "HalfSolved",
        *,
        left_side: bool,
        lower: bool,
        transpose_a: bool,
        conjugate_a: bool,
        unit_diagonal: bool,
    ) -> Array:
        """The second of `lu_solve`'s two triangular solves, after the first gave
        `b`: the solution `b` holds. Any other solve of a `HalfSolved` refuses.
        `conjugate_a`: whether this solve is conjugated (of a complex matrix)."""
        if (
            not left_side
            or lower != transpose_a
            or unit_diagonal != lower
            or transpose_a != b.transposed
            or conjugate_a != b.conjugated
            or not hasattr(self.matrix, "pivoted_solve")
            or b.solution.shape != b.first_shape
        ):
            raise StructuredMaterialisationError(
                "Refusing to materialise `HalfSolved` (primitive `triangular_solve`): "
                f"{b.way_out()}"
            )
        return b.solution


class HalfSolved(quax.ArrayValue):
    """The first of `lu_solve`'s two triangular solves with the `DeterminantLU` of
    a matrix that solves pivoted (`TridiagonalMatrix`, `Banded`,
    `LowRankPlusDiagonal`): its factors are the LU without pivoting, which loses
    all accuracy at a tiny leading pivot of a well-conditioned matrix. So the
    first solve (the unit lower one; transposed, the upper one) does the whole
    pivoted solve (`matrix.pivoted_solve`, with the identity permutation `lu`
    returns) and returns it as this, and the second solve returns the solution
    it holds. On its own, the first solve is not a triangular solve with the
    factors: every other use of this refuses.

    **Fields:**

    - `solution`: the solution of the whole (transposed if `transposed`) system.
    - `transposed`: whether the first solve was the transposed one.
    - `first_shape`: the shape the first solve gave. `lu_solve` reshapes between
        its two solves (`reshape` keeps this a `HalfSolved`); the second solve
        takes it only back in that shape, where the reshapes left every entry in
        its place.
    - `first_dtype`: the dtype the first solve gave, which the second returns
        (a `solution` rebuilt in another dtype would be returned in it: an
        integer one truncated).
    - `conjugated`: whether the first solve was conjugated (`lu_solve(...,
        trans=2)` of a complex matrix: `solution` solves `Aᴴ x = b`); the second
        solve must be too.
    """

    solution: Array
    transposed: bool = eqx.field(static=True)
    first_shape: tuple[int, ...] = eqx.field(static=True)
    first_dtype: Any = eqx.field(static=True)
    conjugated: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        size, dtype = jnp.size(self.solution), jnp.result_type(self.solution)
        if size != math.prod(self.first_shape) or dtype != self.first_dtype:
            raise ValueError(
                "`HalfSolved` holds the solution the first of `lu_solve`'s two "
                f"triangular solves gave, shape {self.first_shape} and dtype "
                f"{self.first_dtype}, in any shape of that size; got `solution` of "
                f"shape {jnp.shape(self.solution)} and dtype {dtype}. (A "
                "`jax.vmap` view of a stack of them is one too: the second solve "
                "takes only the whole stack; map over `jnp.linalg.solve` instead.)"
            )

    def reshaped(self, shape: tuple[int, ...]) -> "HalfSolved":
        """This, reshaped (row-major, as `lax.reshape` without `dimensions`)."""
        return dataclasses.replace(self, solution=self.solution.reshape(shape))

    def conjugated_solve(self) -> "HalfSolved":
        """The first half of the conjugated solve: `conj(op(A)) x = b` is
        `op(A) conj(x) = conj(b)`, so this, computed for `conj(b)`, conjugated."""
        return dataclasses.replace(
            self, solution=jnp.conj(self.solution), conjugated=not self.conjugated
        )

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.solution.shape, self.solution.dtype)

    def way_out(self) -> str:
        return (
            "it is the first half of a pivoted solve with the LU factors of a "
            "`TridiagonalMatrix`, `Banded` or `LowRankPlusDiagonal`, meant only "
            "for `lu_solve`'s second "
            "triangular solve. Call `jnp.linalg.solve` / `jax.scipy.linalg."
            "lu_solve`, or pass `allow_materialise=True` to the matrix "
            "(`.enable_materialise()`) and factor the dense matrix for its "
            "triangular factors."
        )

    def materialise(self) -> Array:
        raise StructuredMaterialisationError(
            f"Refusing to materialise `HalfSolved`: {self.way_out()}"
        )
