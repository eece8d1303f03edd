"""`Kronecker` products: products through reshapes, LU and Cholesky through the
factors."""

from typing import Literal

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from ._base import (
    StructuredMatrix,
    dense_triangular_solve,
    failed_factorisation,
    nan_where,
)


__all__ = ["Kronecker", "KroneckerLU"]


def _kron_apply(a: Array, b: Array, x: Array) -> Array:
    """`(a ⊗ b) @ x` for `x` of shape `(na nb, k)`: `a X bᵀ` per column."""
    xs = x.reshape(a.shape[1], b.shape[1], x.shape[-1])
    out = jnp.einsum("ij,jlk,ml->imk", a, xs, b)
    return out.reshape(a.shape[0] * b.shape[0], x.shape[-1])


def _kron_entries(a: Array, b: Array, i: Array, j: Array) -> Array:
    nb = b.shape[0]
    return a[i // nb, j // nb] * b[i % nb, j % nb]


def _factor_solve(
    a: Array, b: Array, x: Array, *, lower: bool, transpose_a: bool, unit: bool
) -> Array:
    """Solve `op(a ⊗ b) y = x` for triangular factors, one factor at a time."""
    na, nb = a.shape[0], b.shape[0]
    xs = x.reshape(na, nb * x.shape[-1])
    kw = dict(lower=lower, transpose_a=transpose_a, unit_diagonal=unit)
    ys = dense_triangular_solve(a, xs, **kw)
    ys = ys.reshape(na, nb, x.shape[-1]).transpose(1, 0, 2).reshape(nb, -1)
    ys = dense_triangular_solve(b, ys, **kw)
    return ys.reshape(nb, na, x.shape[-1]).transpose(1, 0, 2).reshape(na * nb, -1)


def _pivots_of(perm: Array) -> Array:
    """The row-swap pivots (as `lax.linalg.lu` returns them) of a permutation."""
    n = perm.shape[0]

    def step(carry, i):
        cur, pos = carry  # cur[k]: row at position k; pos[r]: position of row r
        p = pos[perm[i]]
        row_i = cur[i]
        cur = cur.at[p].set(row_i).at[i].set(perm[i])
        pos = pos.at[row_i].set(p).at[perm[i]].set(i)
        return (cur, pos), p

    iota = jnp.arange(n, dtype=perm.dtype)
    _, pivots = lax.scan(step, (iota, iota), iota)
    return pivots


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
    allow_materialise: bool = eqx.field(default=False, static=True)

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

    def matmat(self, x: Array) -> Array:
        return _kron_apply(*self.factors(), x)

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        return _kron_entries(
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

    def lu(self) -> tuple["KroneckerLU", Array, Array]:
        left, right = self.factors()
        la, _, perm_a = lax.linalg.lu(left)
        lb, _, perm_b = lax.linalg.lu(right)
        nb = self.right.shape[0]
        perm = (perm_a[:, None] * nb + perm_b[None, :]).reshape(-1)
        return KroneckerLU(la, lb, self.allow_materialise), _pivots_of(perm), perm

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
            return _factor_solve(
                *self.factors(), b, lower=lower, transpose_a=transpose_a, unit=False
            )
        # The other triangle of a triangular Kronecker product is its diagonal.
        if unit_diagonal:
            return b
        left, right = self.factors()
        diag = jnp.kron(jnp.diagonal(left), jnp.diagonal(right))
        return b / diag[:, None]


class KroneckerLU(StructuredMatrix):
    """The packed LU factors of a `Kronecker` product: `L = L_left ⊗ L_right` below
    the diagonal (unit diagonal), `U = U_left ⊗ U_right` on and above it.

    **Fields:**

    - `left`, `right`: the packed LU factors of the two factors.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    left: Array
    right: Array
    allow_materialise: bool = eqx.field(default=False, static=True)

    linear_in_leaves = False

    def aval(self) -> jax.core.ShapedArray:
        n = self.left.shape[0] * self.right.shape[0]
        return jax.core.ShapedArray((n, n), jnp.result_type(self.left, self.right))

    def _factors(self) -> tuple[Array, Array, Array, Array]:
        def unit_lower(x: Array) -> Array:
            return jnp.tril(x, -1) + jnp.eye(x.shape[0], dtype=x.dtype)

        return (
            unit_lower(self.left),
            unit_lower(self.right),
            jnp.triu(self.left),
            jnp.triu(self.right),
        )

    def dense(self) -> Array:
        la, lb, ua, ub = self._factors()
        return jnp.tril(jnp.kron(la, lb), -1) + jnp.triu(jnp.kron(ua, ub))

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        la, lb, ua, ub = self._factors()
        upper = _kron_entries(ua, ub, i, j)
        return jnp.where(i > j, _kron_entries(la, lb, i, j), upper)

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        if lower != unit_diagonal:
            # tril with the U diagonal, or triu with a unit one: not a product.
            return None
        return _factor_solve(
            self.left,
            self.right,
            b,
            lower=lower,
            transpose_a=transpose_a,
            unit=unit_diagonal,
        )
