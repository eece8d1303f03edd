"""`Kronecker` products: products through reshapes, LU and Cholesky through the
factors."""

from typing import Literal

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from ._base import StructuredMatrix, dense_triangular_solve


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
        return KroneckerLU(la, lb, None, self.allow_materialise), _pivots_of(perm), perm

    def cholesky(self) -> "Kronecker | None":
        if not self.symmetric:
            return None
        left, right = self.factors()
        return Kronecker(
            lax.linalg.cholesky(left),
            lax.linalg.cholesky(right),
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
    the diagonal (unit diagonal), `U = U_left ⊗ U_right` on and above it, except
    for the last diagonal entry when `last` is set (as the derivative of
    `jnp.linalg.det` does; solved through the Sherman-Morrison formula).

    **Fields:**

    - `left`, `right`: the packed LU factors of the two factors.
    - `last`: a scalar that replaces the last diagonal entry of `U`, or `None`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    left: Array
    right: Array
    last: Array | None = None
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
        out = jnp.tril(jnp.kron(la, lb), -1) + jnp.triu(jnp.kron(ua, ub))
        return out if self.last is None else out.at[-1, -1].set(self.last)

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        la, lb, ua, ub = self._factors()
        upper = _kron_entries(ua, ub, i, j)
        if self.last is not None:
            upper = jnp.where((i == n - 1) & (j == n - 1), self.last, upper)
        return jnp.where(i > j, _kron_entries(la, lb, i, j), upper)

    def with_diagonal_entry(self, i: int, value: Array) -> "KroneckerLU | None":
        if i != self.shape[-1] - 1:
            return None
        # With a 1 x 1 factor `c`, U is `c` times the other factor's U: the entry is
        # set in that factor, exactly. This is the one case where the last pivot
        # can be zero at a matrix of rank n - 1 (the derivative of `det` there is
        # the adjugate, not zero), and where the Sherman-Morrison update below,
        # which divides by that pivot, would fail.
        if self.right.shape == (1, 1):
            left = self.left.at[-1, -1].set(value / self.right[0, 0])
            return KroneckerLU(left, self.right, None, self.allow_materialise)
        if self.left.shape == (1, 1):
            right = self.right.at[-1, -1].set(value / self.left[0, 0])
            return KroneckerLU(self.left, right, None, self.allow_materialise)
        # Else a zero last pivot `u = U_left[-1, -1] U_right[-1, -1]` makes a whole
        # factor singular: the rank is at most n - 2 and the adjugate is zero, which
        # is what `det`'s derivative returns when the update below fails.
        return KroneckerLU(self.left, self.right, value, self.allow_materialise)

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        if lower != unit_diagonal:
            # tril with the U diagonal, or triu with a unit one: not a product.
            return None

        def solve(rhs: Array) -> Array:
            return _factor_solve(
                self.left,
                self.right,
                rhs,
                lower=lower,
                transpose_a=transpose_a,
                unit=unit_diagonal,
            )

        y = solve(b)
        if lower or self.last is None:
            return y
        # With u = U[-1, -1] replaced by u', U' = U + (u' - u) e eᵀ (e the last
        # unit vector) and U'⁻¹b = y - z u (1 - u / u') y[-1] (Sherman-Morrison,
        # as eᵀz = 1 / u), for y = U⁻¹b and z = U⁻¹e (Uᵀ for both when transposed).
        e = jnp.zeros((b.shape[-2], 1), b.dtype).at[-1].set(1)
        u = self.left[-1, -1] * self.right[-1, -1]
        return y - solve(e) * u * (1 - u / self.last) * y[-1:]
