"""`Kronecker` products: products through reshapes, LU and Cholesky through the
factors; `KroneckerPlusIdentity`, `A ⊗ B + σ² I` (a Gaussian process's covariance
on a grid with its noise), solved through the factors' eigendecompositions."""

from typing import Literal

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from .._kernels import (
    factor_solve,
    failed_factorisation,
    kron_apply,
    kron_entries,
    nan_where,
    on_diagonal,
)
from ._base import MaterialisationError, StructuredMatrix, unbatched
from ._circulant import SolverLU
from ._determinant import DeterminantLU
from ._diagonal import ScaledIdentity


__all__ = ["Kronecker", "KroneckerEigenLU", "KroneckerLU", "KroneckerPlusIdentity"]


class Kronecker(StructuredMatrix):
    """`left ⊗ right`, the Kronecker product of two square matrices (row-major, as
    `jnp.kron`). Products cost O(n (na + nb)) through reshapes; `jnp.linalg.solve`,
    `det`, `slogdet` and `cholesky` go through the factors.

    **Fields:**

    - `left`: shape `(na, na)`.
    - `right`: shape `(nb, nb)`.
    - `symmetric`: whether both factors are symmetric (static; a property tag that
        `jnp.linalg.cholesky` needs, as it symmetrises its input first).
    - `triangle`: `"lower"` or `"upper"` when both factors are triangular (static;
        set on Cholesky factors), else `None`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    left: Array
    right: Array
    symmetric: bool = eqx.field(default=False, static=True)
    triangle: Literal["lower", "upper"] | None = eqx.field(default=None, static=True)

    linear_in_leaves = False

    def __check_init__(self):
        for name in ("left", "right"):
            shape = getattr(self, name).shape
            if len(shape) != 2 or shape[0] != shape[1]:
                raise ValueError(
                    f"`Kronecker` needs square 2-dimensional factors, got `{name}` "
                    f"of shape {shape}."
                )

    def aval(self) -> jax.core.ShapedArray:
        unbatched(self, "left", 2)
        n = self.left.shape[0] * self.right.shape[0]
        return jax.core.ShapedArray((n, n), jnp.result_type(self.left, self.right))

    def factors(self) -> tuple[Array, Array]:
        """The two factors; symmetrised, `(a + aᵀ) / 2`, when `symmetric`, so that
        the matrix is symmetric whatever its leaves hold (and under `grad`)."""
        if self.symmetric:
            return (self.left + self.left.T) / 2, (self.right + self.right.T) / 2
        return self.left, self.right

    def dense(self) -> Array:
        return jnp.kron(*self.factors())

    def _with(self, left: Array, right: Array, **kw) -> "Kronecker":
        fields = dict(
            symmetric=self.symmetric,
            triangle=self.triangle,
            allow_materialise=self.allow_materialise,
        )
        return Kronecker(left, right, **{**fields, **kw})

    def transpose(self) -> "Kronecker":
        if self.symmetric:
            return self
        flipped = {"lower": "upper", "upper": "lower", None: None}[self.triangle]
        return self._with(self.left.T, self.right.T, triangle=flipped)

    def scaled(self, s: Array) -> "Kronecker":
        return self._with(self.left * s, self.right)

    def add(self, other: StructuredMatrix) -> "KroneckerPlusIdentity | None":
        """`A ⊗ B + c I` for a symmetric `Kronecker` (tagged `symmetric=True` or
        `positive_definite=True`) and a `ScaledIdentity` `c I` (one matrix, no
        batch): a `KroneckerPlusIdentity`, solved through the factors'
        eigendecompositions."""
        if not (isinstance(other, ScaledIdentity) and self.symmetric):
            return None
        if jnp.ndim(other.scale) != 0 or self.triangle is not None:
            return None
        if jnp.iscomplexobj(self.left) or jnp.iscomplexobj(self.right):
            # `KroneckerPlusIdentity` is real: a complex symmetric factor has no
            # orthogonal eigendecomposition (the sum stays a lazy `Sum`).
            return None
        if jnp.iscomplexobj(other.scale):
            return None
        left, right = self.factors()
        return KroneckerPlusIdentity(
            left,
            right,
            other.scale,
            allow_materialise=self.allow_materialise,
            positive_definite=self.positive_definite and other.positive_definite,
        )

    def matmat(self, x: Array) -> Array:
        return kron_apply(*self.factors(), x)

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        return kron_entries(
            *self.factors(), jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        )

    def product(self, other: StructuredMatrix) -> "Kronecker | None":
        """`self @ other` for a Kronecker `other` with factors of matching sizes."""
        if not isinstance(other, Kronecker):
            return None
        if self.left.shape != other.left.shape:
            return None
        (a, b), (c, d) = self.factors(), other.factors()
        return Kronecker(a @ c, b @ d, allow_materialise=self.allow_materialise)

    def lu(self) -> DeterminantLU:
        """The factors' LUs with partial pivoting (LAPACK), `Pa A = La Ua` and
        `Pb B = Lb Ub`, as one `KroneckerLU` that applies the row permutation
        `Pa ⊗ Pb` itself (in its unit lower solve), so that `lu` returns the
        identity pivots: LAPACK's row swaps of the n-permutation `Pa ⊗ Pb` (what
        `slogdet` would read its sign from) take a sequential scan over n, which
        made `slogdet` about 27x a hand-written one through the factors at
        n = 1,024. The diagonal (what `slogdet`/`det` read) is `Ua ⊗ Ub`'s, its
        first entry signed by the permutation's parity, `sign(Pa)^nb
        sign(Pb)^na`."""
        left, right = self.factors()
        la, swaps_a, perm_a = lax.linalg.lu(left)
        lb, swaps_b, perm_b = lax.linalg.lu(right)
        na, nb = left.shape[0], right.shape[0]
        perm = (perm_a[:, None] * nb + perm_b[None, :]).reshape(-1)

        def odd(swaps: Array) -> Array:
            return jnp.sum(swaps != jnp.arange(swaps.shape[0], dtype=swaps.dtype)) % 2

        sign = jnp.where((odd(swaps_a) * nb + odd(swaps_b) * na) % 2 == 1, -1, 1)
        pivots = jnp.kron(jnp.diagonal(la), jnp.diagonal(lb))
        pivots = pivots.at[0].multiply(sign.astype(pivots.dtype))
        factors = KroneckerLU(la, lb, perm, allow_materialise=self.allow_materialise)
        return DeterminantLU(factors, self, pivots=pivots)

    def determinant(self) -> Array:
        """`det(A)^nb det(B)^na` for `A ⊗ B` (`A` of size `na`, `B` of size `nb`),
        through `jnp.linalg.det` of the factors (whose derivative is exact at a
        factor of rank n - 1)."""
        left, right = self.factors()
        na, nb = left.shape[0], right.shape[0]
        return jnp.linalg.det(left) ** nb * jnp.linalg.det(right) ** na

    def cholesky(self) -> "Kronecker | None":
        if not self.symmetric:
            return None
        left, right = (lax.linalg.cholesky(f) for f in self.factors())
        # As dense JAX: where the matrix is not positive definite (a factor is
        # not), the whole lower triangle of its factor is NaN.
        failed = failed_factorisation(jnp.diagonal(left)) | failed_factorisation(
            jnp.diagonal(right)
        )
        return Kronecker(
            jnp.tril(nan_where(failed, left)),
            jnp.tril(nan_where(failed, right)),
            triangle="lower",
            allow_materialise=self.allow_materialise,
        )

    def eigh(self) -> tuple[Array, Array] | None:
        """With the `symmetric` tag: through the factors' eigendecompositions,
        `O(na³ + nb³)`, plus O(n²) for the eigenvector matrix (the output)."""
        if not self.symmetric:
            return None
        (wa, qa), (wb, qb) = (jnp.linalg.eigh(f) for f in self.factors())
        values = jnp.outer(wa, wb).reshape(-1)
        order = jnp.argsort(values)
        return values[order], jnp.kron(qa, qb)[:, order]

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        if self.triangle is None:
            return None
        if (self.triangle == "lower") == lower:
            if unit_diagonal:
                return None
            return factor_solve(
                *self.factors(), b, lower=lower, transpose_a=transpose_a, unit=False
            )
        # The other triangle of a triangular Kronecker product is its diagonal.
        if unit_diagonal:
            return b
        left, right = self.factors()
        diag = jnp.kron(jnp.diagonal(left), jnp.diagonal(right))
        return b / diag[:, None]


class KroneckerLU(StructuredMatrix):
    """The packed LU factors of a `Kronecker` product's factors, `Pa A = La Ua`
    and `Pb B = Lb Ub`: `L = La ⊗ Lb` (unit diagonal) and `U = Ua ⊗ Ub`, with
    the row permutation `P = Pa ⊗ Pb` applied by the unit lower solve (`L y =
    P b`; transposed, `x = Pᵀ L⁻ᵀ c`), so that `lu` returns the identity pivots
    and `jnp.linalg.solve`'s two triangular solves (and `lu_solve(trans=1)`'s)
    solve with the matrix. Its diagonal is `U`'s; its other entries read as NaN
    (as a packed LU matrix with the identity pivots they would be wrong: `L`
    without `P`), and it never materialises.

    **Fields:**

    - `left`, `right`: the packed LU factors of the two factors.
    - `perm`: the row permutation `P` of the product, as `lax.linalg.lu`'s
        permutation output (`A[perm] = L U`).
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    conjugates_leafwise = False

    left: Array
    right: Array
    perm: Array

    linear_in_leaves = False

    def aval(self) -> jax.core.ShapedArray:
        unbatched(self, "left", 2)
        n = self.left.shape[0] * self.right.shape[0]
        return jax.core.ShapedArray((n, n), jnp.result_type(self.left, self.right))

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        upper = kron_entries(jnp.triu(self.left), jnp.triu(self.right), i, j)
        return jnp.where(i == j, upper, jnp.nan)

    def dense(self) -> Array:
        raise MaterialisationError(
            "Refusing to materialise `KroneckerLU`: it solves with the row "
            "permutation of a `Kronecker` product's LU folded in (`lu` returns the "
            "identity pivots), so as a packed LU matrix its lower triangle would "
            "be wrong. Use `jnp.linalg.solve` / `jax.scipy.linalg.lu_solve`, or "
            "factor the dense matrix (`allow_materialise=True` on the `Kronecker`) "
            "for its triangular factors."
        )

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        if lower != unit_diagonal:
            # tril with the U diagonal, or triu with a unit one: not a product.
            return None
        if lower and not transpose_a:
            b = b[self.perm]
        x = factor_solve(
            self.left,
            self.right,
            b,
            lower=lower,
            transpose_a=transpose_a,
            unit=unit_diagonal,
        )
        if lower and transpose_a:
            x = jnp.zeros_like(x).at[self.perm].set(x)
        return x


class KroneckerPlusIdentity(StructuredMatrix):
    """`A ⊗ B + scale · I` for symmetric `A` (size `na`) and `B` (size `nb`): the
    covariance of a Gaussian process on a grid (a product kernel) plus its noise,
    as `K + noise * jnp.eye(n)` or `K + ScaledIdentity(noise, n)` builds it from a
    symmetric `Kronecker` `K`. With `A = Qa Λa Qaᵀ` and `B = Qb Λb Qbᵀ`, it is
    `(Qa ⊗ Qb)(Λa ⊗ Λb + scale)(Qa ⊗ Qb)ᵀ`: `jnp.linalg.solve`, `slogdet` and
    `det` cost the factors' eigendecompositions, O(na³ + nb³), and O(n (na + nb))
    per right-hand side, for `n = na nb`; products cost O(n (na + nb)). No `(n, n)`
    array is formed.

    **Fields:**

    - `left`, `right`: the factors `A`, `B`, symmetrised (`(a + aᵀ) / 2`) wherever
        they are read.
    - `scale`: a scalar.
    - `allow_materialise`, `positive_definite`: as for every structure (static).
    """

    left: Array
    right: Array
    scale: Array

    linear_in_leaves = False

    def __check_init__(self):
        for name in ("left", "right"):
            shape = jnp.shape(getattr(self, name))
            if len(shape) != 2 or shape[0] != shape[1]:
                raise ValueError(
                    f"`KroneckerPlusIdentity` needs square 2-dimensional factors, got "
                    f"`{name}` of shape {shape}."
                )
        if jnp.ndim(self.scale) != 0:
            raise ValueError(
                "`KroneckerPlusIdentity` needs a scalar `scale`; got `scale` of shape "
                f"{jnp.shape(self.scale)}."
            )
        for name in ("left", "right", "scale"):
            if jnp.iscomplexobj(getattr(self, name)):
                raise ValueError(
                    f"`KroneckerPlusIdentity` needs real `left`, `right` and `scale`; "
                    f"got a complex `{name}`. Its solve diagonalises the factors "
                    "with orthogonal eigenvectors, which a complex symmetric factor "
                    "does not have: write `Kronecker(left, right) + ScaledIdentity("
                    "scale, n)` instead (a lazy `Sum`, solved with "
                    "`jax.scipy.sparse.linalg.gmres`)."
                )

    @property
    def symmetric(self) -> bool:
        return True

    def factors(self) -> tuple[Array, Array]:
        """The two factors, symmetrised."""
        return (self.left + self.left.T) / 2, (self.right + self.right.T) / 2

    def aval(self) -> jax.core.ShapedArray:
        unbatched(self, "left", 2)
        n = self.left.shape[0] * self.right.shape[0]
        dtype = jnp.result_type(self.left, self.right, self.scale)
        return jax.core.ShapedArray((n, n), dtype)

    def dense(self) -> Array:
        n = self.shape[-1]
        identity = on_diagonal(jnp.full((n,), self.scale, self.dtype))
        return jnp.kron(*self.factors()).astype(self.dtype) + identity

    def _with(self, left: Array, right: Array, scale: Array) -> "KroneckerPlusIdentity":
        return KroneckerPlusIdentity(
            left, right, scale, allow_materialise=self.allow_materialise
        )

    def transpose(self) -> "KroneckerPlusIdentity":
        return self

    def scaled(self, s: Array) -> "KroneckerPlusIdentity":
        return self._with(self.left * s, self.right, self.scale * s)

    def matmat(self, x: Array) -> Array:
        return kron_apply(*self.factors(), x) + self.scale * x

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        identity = jnp.where(i == j, self.scale, jnp.zeros((), self.dtype))
        return kron_entries(*self.factors(), i, j) + identity

    def add(self, other: StructuredMatrix) -> "KroneckerPlusIdentity | None":
        if isinstance(other, ScaledIdentity) and jnp.ndim(other.scale) == 0:
            return self._with(self.left, self.right, self.scale + other.scale)
        return None

    def eigenvalues(self) -> Array:
        """`λa_i λb_j + scale` (real), in the factors' order."""
        (wa, _), (wb, _) = (jnp.linalg.eigh(f) for f in self.factors())
        return (jnp.outer(wa, wb).reshape(-1) + self.scale).astype(self.dtype)

    def lu(self) -> DeterminantLU:
        """Not LU factors: a `KroneckerEigenLU`, the factors' eigendecompositions,
        which `jnp.linalg.solve`'s two triangular solves use as one solve, and
        whose diagonal holds the eigenvalues (`slogdet`, `det`)."""
        (wa, qa), (wb, qb) = (jnp.linalg.eigh(f) for f in self.factors())
        solver = KroneckerEigenLU(
            self, wa, qa, wb, qb, allow_materialise=self.allow_materialise
        )
        return DeterminantLU(solver, self)

    def log_determinant(self) -> tuple[Array, Array]:
        """`Σ log |λa_i λb_j + scale|` and the sign of the product, through the
        factors' eigenvalues (differentiable: `slogdet`'s derivative is theirs)."""
        w = self.eigenvalues()
        return jnp.prod(jnp.sign(w)), jnp.sum(jnp.log(jnp.abs(w)))

    def determinant(self) -> Array:
        return jnp.prod(self.eigenvalues())


class KroneckerEigenLU(SolverLU):
    """`lax.linalg.lu` of a `KroneckerPlusIdentity` (see `SolverLU`): the factors'
    eigendecompositions, `A = Qa Λa Qaᵀ`, `B = Qb Λb Qbᵀ`. Its solve is
    `(Qa ⊗ Qb) (Λa ⊗ Λb + scale)⁻¹ (Qa ⊗ Qb)ᵀ b`, O(n (na + nb)) per column (the
    matrix is symmetric: the transposed solve is the same); its pivots are the
    eigenvalues `λa_i λb_j + scale`.

    **Fields:**

    - `matrix`: the `KroneckerPlusIdentity`.
    - `wa`, `qa`, `wb`, `qb`: the eigenvalues and eigenvectors of the factors.
    """

    matrix: "KroneckerPlusIdentity"
    wa: Array
    qa: Array
    wb: Array
    qb: Array

    def pivots(self) -> Array:
        w = jnp.outer(self.wa, self.wb).reshape(-1) + self.matrix.scale
        return w.astype(self.dtype)

    def solve(self, b: Array, transpose: bool) -> Array:
        del transpose  # symmetric
        rotated = kron_apply(self.qa.T, self.qb.T, b)
        return kron_apply(self.qa, self.qb, rotated / self.pivots()[:, None])
