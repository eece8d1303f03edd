"""`Sum` and `Product`: lazy sums and products of structured matrices, for the pairs
that have no closed form (e.g. `TridiagonalMatrix + Circulant`)."""

import functools as ft
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array

from ._base import StructuredMatrix
from ._diagonal import Diagonal, ScaledIdentity
from ._kronecker import Kronecker


__all__ = ["Product", "Sum", "add", "matmul"]


_FACTORISATIONS = {"lu", "cholesky", "triangular_solve", "eig", "eigh"}


def _all(results: list[Any]) -> list[Any] | None:
    return None if any(r is None for r in results) else results


def _same_leaves(x: StructuredMatrix, y: StructuredMatrix) -> bool:
    lx, tx = jtu.tree_flatten(x)
    ly, ty = jtu.tree_flatten(y)
    return tx == ty and all(a is b for a, b in zip(lx, ly, strict=True))


class _Lazy(StructuredMatrix):
    """What `Sum` and `Product` share: a tuple of parts of one shape, rebuilt
    part by part by the structured operations, and the refusal of factorisations
    that names an iterative solver."""

    # Linear in the leaves only when every part is (and a sum's): declared for
    # the type.
    linear_in_leaves = False

    @property
    def parts(self) -> tuple[StructuredMatrix, ...]:
        raise NotImplementedError

    def __check_init__(self):
        parts = self.parts
        if len(parts) < 2 or len({p.shape for p in parts}) != 1:
            raise ValueError(
                f"`{type(self).__name__}` needs at least two structured matrices of "
                f"one shape, got {[p.shape for p in parts]}."
            )

    def aval(self) -> jax.core.ShapedArray:
        dtype = jnp.result_type(*(p.dtype for p in self.parts))
        return jax.core.ShapedArray(self.parts[0].shape, dtype)

    def way_out(self, primitive: Any) -> str:
        way_out = StructuredMatrix.way_out(self, primitive)
        if primitive is None or primitive.name not in _FACTORISATIONS:
            return way_out
        kinds = ", ".join(f"`{type(p).__name__}`" for p in self.parts)
        symmetrised = ""
        if primitive.name in ("cholesky", "eigh") and len(self.parts) == 2:
            symmetrised = (
                f" (`jnp.linalg.{primitive.name}` symmetrises its input, `(M + Mᴴ) / "
                "2`: a matrix `M` not known to be symmetric arrives here as the sum "
                "of it and its transpose; tag a symmetric positive definite `M` "
                "`positive_definite=True`, or build it symmetric)"
            )
        kronecker = ""
        if any(isinstance(p, Kronecker) for p in self.parts) and any(
            isinstance(p, Diagonal | ScaledIdentity)
            or (isinstance(p, Kronecker) and all(p.diagonal))
            for p in self.parts
        ):
            kronecker = (
                " (`Kronecker + Diagonal` has a closed form here only where the "
                "`Kronecker`'s factors are real (and not triangular) and the "
                "diagonal is a scalar multiple of the identity, "
                "`ScaledIdentity(noise, n)` or `noise * jnp.eye(n)` with a constant "
                "or traced real `noise` (a `KroneckerPlusIdentity`), or a Kronecker "
                "product of positive diagonals of the factors' sizes, "
                "`Kronecker(Diagonal(d1), Diagonal(d2))` (a "
                "`KroneckerPlusDiagonal`); both are solved through the factors' "
                "eigendecompositions, `eigh` where the `Kronecker` is built with "
                "`symmetric=True`, else chosen when the program runs)"
            )
        return (
            f"This `{type(self).__name__}` of {kinds}{symmetrised}{kronecker} has no "
            "structured "
            "factorisation; solve through its products instead, which cost the sum "
            "of its parts' products: e.g. `jax.scipy.sparse.linalg.cg(lambda v: M @ "
            "v, b)` (symmetric positive definite) or `jax.scipy.sparse.linalg.gmres`. "
            "Or: " + way_out
        )

    def _with(self, parts: list[StructuredMatrix] | None) -> Any:
        """The same kind of matrix over `parts`; `None` for `None`."""
        return (
            None
            if parts is None
            else type(self)(tuple(parts), allow_materialise=self.allow_materialise)
        )

    def _each(self, method: str, *args: Any) -> list[Any] | None:
        """`part.method(*args)` for every part, or `None` if one has no such form."""
        return _all([getattr(p, method)(*args) for p in self.parts])

    def _replaced(self, method: str, *args: Any, at: tuple[int, ...] | None = None):
        """The same matrix with the first part (among `at`, default all) for which
        `part.method(*args)` has a form replaced by that form; `None` if none has."""
        for k in range(len(self.parts)) if at is None else at:
            out = getattr(self.parts[k], method)(*args)
            if out is not None:
                parts = list(self.parts)
                parts[k] = out
                return self._with(parts)
        return None

    def batches(self) -> bool:
        return all(p.batches() for p in self.parts)

    def map_leaves(self, fn) -> Any:
        # For a product, only dtype conversions reach this (`scaled` is its own).
        return self._with(self._each("map_leaves", fn))


class Sum(_Lazy):
    """`terms[0] + terms[1] + ...`, kept lazy: what `A + B` gives for two structures
    without a closed form for their sum. Products cost the sum of the terms'
    costs; transpose, negation and scalar multiplication act on every term.
    `jnp.linalg.solve` and the other factorisations refuse (no structured LU),
    naming the way out: an iterative solver such as `cg` through `M @ v`.

    Symmetric when every term is; tagged positive definite when every term is.

    **Fields:**

    - `terms`: a tuple of at least two structured matrices of one shape (nested sums
        are flattened).
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    terms: tuple[StructuredMatrix, ...]

    @property
    def parts(self) -> tuple[StructuredMatrix, ...]:
        return self.terms

    @property
    def symmetric(self) -> bool:
        return self.positive_definite or all(t.symmetric for t in self.terms)

    def dense(self) -> Array:
        return ft.reduce(jnp.add, (t.dense() for t in self.terms))

    def transpose(self) -> "Sum | None":
        return self._with(self._each("transpose"))

    def scaled(self, s: Array) -> "Sum | None":
        return self._with(self._each("scaled", s))

    def masked(self, y: Array, *, select: bool = False) -> "Sum | None":
        return self._with(_all([t.masked(y, select=select) for t in self.terms]))

    def row_scaled(self, d: Array) -> "Sum | None":
        return self._with(self._each("row_scaled", d))

    def col_scaled(self, d: Array) -> "Sum | None":
        return self._with(self._each("col_scaled", d))

    def add_diagonal(self, d: Array) -> "Sum | None":
        return self._replaced("add_diagonal", d)

    def matmat(self, x: Array) -> Array | None:
        outs = self._each("matmat", x)
        return None if outs is None else ft.reduce(jnp.add, outs)

    def entries(self, i: Array, j: Array) -> Array | None:
        outs = self._each("entries", i, j)
        return None if outs is None else ft.reduce(jnp.add, outs)


class Product(_Lazy):
    """`factors[0] @ factors[1] @ ...`, kept lazy: what `A @ B` gives for two
    structures without a closed form for their product. `M @ x` applies the
    factors right to left, costing the sum of their products' costs; transpose
    reverses the transposed factors; scalar multiplication scales one factor.
    Entries (`jnp.diagonal`, `M[i, j]`) and factorisations refuse, naming the way
    out (an iterative solver through `M @ v`).

    **Fields:**

    - `factors`: a tuple of at least two structured matrices of one shape (nested
        products are flattened).
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    factors: tuple[StructuredMatrix, ...]

    @property
    def parts(self) -> tuple[StructuredMatrix, ...]:
        return self.factors

    def dense(self) -> Array:
        return ft.reduce(jnp.matmul, (f.dense() for f in self.factors))

    def transpose(self) -> "Product | None":
        flipped = self._each("transpose")
        return None if flipped is None else self._with(flipped[::-1])

    def scaled(self, s: Array) -> "Product | None":
        return self._replaced("scaled", s)

    def row_scaled(self, d: Array) -> "Product | None":
        return self._replaced("row_scaled", d, at=(0,))

    def col_scaled(self, d: Array) -> "Product | None":
        return self._replaced("col_scaled", d, at=(len(self.factors) - 1,))

    def matmat(self, x: Array) -> Array | None:
        out: Array | None = x
        for factor in reversed(self.factors):
            out = None if out is None else factor.matmat(out)
        return out


def _terms(x: StructuredMatrix) -> tuple[StructuredMatrix, ...]:
    return x.terms if isinstance(x, Sum) else (x,)


def _factors(x: StructuredMatrix) -> tuple[StructuredMatrix, ...]:
    return x.factors if isinstance(x, Product) else (x,)


def closed_sum(x: StructuredMatrix, y: StructuredMatrix) -> StructuredMatrix | None:
    """`x + y` in a structure of their own, or `None` (not a `Sum`)."""
    if isinstance(x, Sum) or isinstance(y, Sum):
        return None
    out = x.add(y)
    if out is None:
        out = y.add(x)
    if out is None and _same_leaves(x, y):
        # `K + K`, e.g. a symmetric matrix plus its transpose (`jnp.linalg.cholesky`
        # symmetrises its input).
        out = x.scaled(jnp.asarray(2, x.dtype))
    return out


def add(x: StructuredMatrix, y: StructuredMatrix) -> StructuredMatrix:
    """`x + y`: a closed form where one exists (`Diagonal + TridiagonalMatrix`, ...),
    else a flat `Sum` in which each new term first merges with a term it has a
    closed form with. Tagged positive definite when both are."""
    out = closed_sum(x, y)
    if out is None:
        terms = list(_terms(x))
        for term in _terms(y):
            for k, existing in enumerate(terms):
                merged = closed_sum(existing, term)
                if merged is not None:
                    terms[k] = merged
                    break
            else:
                terms.append(term)
        allow = x.allow_materialise and y.allow_materialise
        out = (
            terms[0] if len(terms) == 1 else Sum(tuple(terms), allow_materialise=allow)
        )
    if x.positive_definite and y.positive_definite and not out.positive_definite:
        out = out.with_tags(positive_definite=True)
    return out


def closed_product(x: StructuredMatrix, y: StructuredMatrix) -> StructuredMatrix | None:
    """`x @ y` in a structure of their own (`K @ K`, `D @ T`, `T @ D`, ...), or
    `None` (not a `Product`)."""
    if isinstance(x, Product) or isinstance(y, Product):
        return None
    out = x.product(y)
    if out is None and isinstance(y, Diagonal):
        out = x.col_scaled(y.diag)
    if out is None and isinstance(y, ScaledIdentity) and jnp.ndim(y.scale) == 0:
        out = x.scaled(y.scale)
    return out


def matmul(x: StructuredMatrix, y: StructuredMatrix) -> StructuredMatrix:
    """`x @ y`: a closed form where one exists, else a flat `Product` in which the
    two factors that meet first merge when they have a closed form."""
    out = closed_product(x, y)
    if out is not None:
        return out
    left, right = list(_factors(x)), list(_factors(y))
    merged = closed_product(left[-1], right[0])
    factors = (
        [*left[:-1], merged, *right[1:]] if merged is not None else [*left, *right]
    )
    if len(factors) == 1:
        return factors[0]
    allow = x.allow_materialise and y.allow_materialise
    return Product(tuple(factors), allow_materialise=allow)
