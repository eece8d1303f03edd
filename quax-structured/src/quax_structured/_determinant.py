"""`DeterminantLU`: the LU factors of a matrix whose determinant has a
division-free derivative, so that the derivative of `jnp.linalg.det` is exact at
singular matrices."""

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import quax
from jax import lax
from jaxtyping import Array

from ._base import MaterialisationError, StructuredMatrix


__all__ = ["DeterminantLU", "HalfSolved", "product_derivative"]


def product_derivative(a: Array, da: Array) -> Array:
    """`Σ_i da_i Π_{j≠i} a_j` over the last axis: the derivative of `prod(a)` in
    the direction `da`, without dividing (exact where entries of `a` are zero)."""
    ones = jnp.ones_like(a[..., :1])
    left = jnp.cumprod(jnp.concatenate([ones, a[..., :-1]], axis=-1), axis=-1)
    tail = jnp.concatenate([a[..., 1:], ones], axis=-1)
    right = jnp.flip(jnp.cumprod(jnp.flip(tail, -1), axis=-1), -1)
    return jnp.sum(da * left * right, axis=-1)


class DeterminantLU(StructuredMatrix):
    """What `lax.linalg.lu` returns for every structure but `Kronecker`: its packed
    LU factors (without pivoting, except `BlockDiagonal`'s blocks), which
    `jnp.linalg.solve` and `slogdet` read unchanged.

    The derivative of `jnp.linalg.det` (JAX's cofactor solve) replaces the last
    pivot (a `scatter`), then solves with the unit lower and the upper triangle and
    takes the trace. The LU factors cannot give that derivative where a pivot other
    than the last is zero (they divide by it; the derivative, the adjugate, is not
    zero there). With its last pivot replaced, this factor's unit lower solve gives
    instead a matrix whose only nonzero entry, the last diagonal one, is
    `trace(adj(A) X)` (the matrix's `det_tangent(X)`, for `X` in its own pattern),
    and its upper solve is the identity: the trace comes out exact. Any other solve
    with it refuses.

    A matrix without `det_tangent` (`Banded`, `Toeplitz`, low rank plus diagonal:
    no division-free form here) factors without pivoting. Where a pivot other than
    the last is exactly zero (a zero leading minor; the pivots after it are
    infinite or NaN), the pivots do not give the determinant, which may be
    nonzero: the diagonal then reads NaN, so that `det` is NaN and `slogdet`'s
    log-determinant is NaN (never a silent 0 / `-inf`), and `det`'s derivative is
    NaN too. Elsewhere the derivative goes through the factors as JAX's rule
    computes it (exact where only the last pivot is zero: `det` 0, `slogdet`
    `(0, -inf)`, as they should be). `solve` reads the factors unchanged, except
    for a matrix with `pivoted_solve` (`TridiagonalMatrix`, `Banded`), which
    `lu_solve`'s two triangular solves solve with partial pivoting (see
    `HalfSolved`).

    **Fields:**

    - `factors`: the packed LU factors (a structured matrix), for the rows
        `permutation` orders.
    - `matrix`: the factored matrix.
    - `permutation`: the rows' order (`lax.linalg.lu`'s third output), or `None`
        for the identity.
    - `last`: the replaced last pivot, else `None`.
    - `pivots`: what the diagonal reads as (numbers whose product is the
        determinant) where the matrix gives better ones than its factors (see
        `TridiagonalMatrix`), else `None`.
    """

    factors: StructuredMatrix
    matrix: StructuredMatrix
    permutation: Array | None = None
    last: Array | None = None
    pivots: Array | None = None

    @property
    def allow_materialise(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.matrix.allow_materialise

    def enable_materialise(self, allow: bool = True) -> "DeterminantLU":
        """A copy whose factors and matrix have `allow_materialise=allow`."""
        return dataclasses.replace(
            self,
            factors=self.factors.enable_materialise(allow),
            matrix=self.matrix.enable_materialise(allow),
        )

    def aval(self) -> jax.core.ShapedArray:
        return self.factors.aval()

    def dense(self) -> Array:
        if self.last is not None:
            raise MaterialisationError(
                "Refusing to materialise `DeterminantLU` with its last pivot "
                f"replaced: {self.way_out(None)}"
            )
        return self.factors.dense()

    def way_out(self, primitive: Any) -> str:
        if self.last is None:
            return self.factors.way_out(primitive)
        return (
            "With its last pivot replaced, `DeterminantLU` serves only the derivative "
            "of `jnp.linalg.det`. Factor the dense matrix (`.enable_materialise()` "
            "on the original) to get LU factors."
        )

    def entries(self, i: Array, j: Array) -> Array | None:
        out = self.factors.entries(i, j)
        if out is None:
            return out
        if self.pivots is None and not hasattr(self.matrix, "det_tangent"):
            out = jnp.where((i == j) & self._zero_leading_minor(), jnp.nan, out)
        if self.pivots is not None:
            n = self.shape[-1]
            on_diagonal = self.pivots[jnp.clip(i, 0, n - 1)]
            out = jnp.where(i == j, on_diagonal.astype(out.dtype), out)
        if self.last is None:
            return out
        n = self.shape[-1]
        return jnp.where((i == n - 1) & (j == n - 1), self.last, out)

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

    def masked(self, y: Array) -> StructuredMatrix | None:
        return None if self.last is not None else self.factors.masked(y)

    def transpose(self) -> StructuredMatrix | None:
        return None if self.last is not None else self.factors.transpose()

    def matmat(self, x: Array) -> Array | None:
        return None if self.last is not None else self.factors.matmat(x)

    def with_diagonal_entry(self, i: int, value: Array) -> "DeterminantLU | None":
        if i != self.shape[-1] - 1:
            return None
        return dataclasses.replace(self, last=value)

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        if self.last is None:
            if self._first_half(lower=lower, transpose_a=transpose_a) and (
                unit_diagonal == lower
            ):
                solve = self.matrix.pivoted_solve  # pyright: ignore[reportAttributeAccessIssue]
                return HalfSolved(solve(b, transpose=transpose_a), transpose_a, b.shape)  # pyright: ignore[reportReturnType]
            return self.factors.triangular_solve(
                b, lower=lower, transpose_a=transpose_a, unit_diagonal=unit_diagonal
            )
        n = self.shape[-1]
        if transpose_a or lower != unit_diagonal:
            return None
        if not lower:
            return b
        if b.shape[-2:] != (n, n):
            return None
        if hasattr(self.matrix, "det_tangent"):
            if self.permutation is not None:
                # `b` arrives with its rows in the factors' order: put them back.
                order = jnp.argsort(self.permutation, axis=-1)
                b = jnp.take_along_axis(b, order[..., :, None], axis=-2)
            derivative = self.matrix.det_tangent(b)  # pyright: ignore[reportAttributeAccessIssue]
        else:
            derivative = self._factors_derivative(b)
            if derivative is None:
                return None
        return jnp.zeros_like(b).at[..., -1, -1].set(derivative.astype(b.dtype))

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
        unit_diagonal: bool,
    ) -> Array:
        """The second of `lu_solve`'s two triangular solves, after the first gave
        `b`: the solution `b` holds. Any other solve of a `HalfSolved` refuses."""
        if (
            self.last is not None
            or not left_side
            or lower != transpose_a
            or unit_diagonal != lower
            or transpose_a != b.transposed
            or not hasattr(self.matrix, "pivoted_solve")
            or b.solution.shape != b.first_shape
        ):
            raise MaterialisationError(
                "Refusing to materialise `HalfSolved` (primitive `triangular_solve`): "
                f"{b.way_out()}"
            )
        return b.solution

    def _factors_derivative(self, b: Array) -> Array | None:
        """`trace(adj(A) b)` through the factors, as JAX's cofactor solve computes
        it (`U'⁻¹ diag(det, ..., det, 1) L⁻¹ b`, `U'` with the replaced last pivot),
        NaN where a pivot other than the last is zero."""
        n = self.shape[-1]
        assert self.last is not None
        replaced = self.factors.with_diagonal_entry(n - 1, self.last)
        index = jnp.arange(n)
        pivots = self.factors.entries(index, index)
        if self.permutation is not None or replaced is None or pivots is None:
            return None
        y = self.factors.triangular_solve(
            b, lower=True, transpose_a=False, unit_diagonal=True
        )
        if y is None:
            return None
        y = jnp.concatenate([y[..., :-1, :] * jnp.prod(pivots), y[..., -1:, :]], -2)
        z = replaced.triangular_solve(
            y, lower=False, transpose_a=False, unit_diagonal=False
        )
        if z is None:
            return None
        trace = jnp.trace(z, axis1=-2, axis2=-1)
        return jnp.where(self._zero_leading_minor(), jnp.nan, trace)


class HalfSolved(quax.ArrayValue):
    """The first of `lu_solve`'s two triangular solves with the `DeterminantLU` of
    a matrix that solves pivoted (`TridiagonalMatrix`, `Banded`): its factors are
    the LU without pivoting, which loses all accuracy at a tiny leading pivot of a
    well-conditioned matrix. So the first solve (the unit lower one; transposed,
    the upper one) does the whole pivoted solve (`matrix.pivoted_solve`, with the
    identity permutation `lu` returns) and returns it as this, and the second
    solve returns the solution it holds. On its own, the first solve is not a
    triangular solve with the factors: every other use of this refuses.

    **Fields:**

    - `solution`: the solution of the whole (transposed if `transposed`) system.
    - `transposed`: whether the first solve was the transposed one.
    - `first_shape`: the shape the first solve gave. `lu_solve` reshapes between
        its two solves (`reshape` keeps this a `HalfSolved`); the second solve
        takes it only back in that shape, where the reshapes left every entry in
        its place.
    """

    solution: Array
    transposed: bool = eqx.field(static=True)
    first_shape: tuple[int, ...] = eqx.field(static=True)

    def reshaped(self, shape: tuple[int, ...]) -> "HalfSolved":
        """This, reshaped (row-major, as `lax.reshape` without `dimensions`)."""
        return HalfSolved(
            self.solution.reshape(shape), self.transposed, self.first_shape
        )

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.solution.shape, self.solution.dtype)

    def way_out(self) -> str:
        return (
            "it is the first half of a pivoted solve with the LU factors of a "
            "`TridiagonalMatrix` or `Banded`, meant only for `lu_solve`'s second "
            "triangular solve. Call `jnp.linalg.solve` / `jax.scipy.linalg."
            "lu_solve`, or pass `allow_materialise=True` to the matrix "
            "(`.enable_materialise()`) and factor the dense matrix for its "
            "triangular factors."
        )

    def materialise(self) -> Array:
        raise MaterialisationError(
            f"Refusing to materialise `HalfSolved`: {self.way_out()}"
        )


@quax.register(lax.linalg.triangular_solve_p)
def _(
    a: DeterminantLU,
    b: HalfSolved,
    *,
    left_side: bool,
    lower: bool,
    transpose_a: bool,
    unit_diagonal: bool,
    **params: Any,
) -> Array:
    """The second of `lu_solve`'s two triangular solves of a pivoted solve (see
    `HalfSolved`): the solution the first one computed; anything else refuses."""
    del params
    return a.second_half(
        b,
        left_side=left_side,
        lower=lower,
        transpose_a=transpose_a,
        unit_diagonal=unit_diagonal,
    )


@quax.register(lax.reshape_p)
def _(x: HalfSolved, *, new_sizes: Any, dimensions: Any, **params: Any) -> HalfSolved:
    """`lu_solve` reshapes between its two triangular solves: the first's
    `HalfSolved` stays one."""
    del params
    if dimensions is not None:
        raise MaterialisationError(
            "Refusing to materialise `HalfSolved` (primitive `reshape` with "
            f"`dimensions`): {x.way_out()}"
        )
    return x.reshaped(tuple(new_sizes))
