"""The value types of a sparse direct solve: `SparseLU`, the factorisation of a
sparse matrix (SuperLU on the host), and `PendingSolve`, the right-hand side
between the two triangular solves that JAX's `lu_solve` and `cho_solve` bind."""

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import quax
from jax import lax
from jax.extend.core import Primitive
from jaxtyping import Array, ArrayLike

from .._kernels import dot_sparse_dense
from .._superlu import factor as host_factor, solve as host_solve
from ._bcoo import BCOO, MaterialisationError
from ._csr import CSR


__all__ = [
    "PendingSolve",
    "SparseLU",
    "apply_inverse",
    "cho_factor",
    "factorise",
    "lu_factor",
    "unfactorable",
]


@jax.custom_jvp
def _read_pivots(data: Array, pivots: Array) -> Array:
    return pivots


@_read_pivots.defjvp
def _(primals: Any, tangents: Any) -> Any:
    raise NotImplementedError(
        "The pivots of a `quax_sparse.SparseLU` (the diagonal that "
        "`jnp.diagonal(lu)` reads) have no derivative with respect to the matrix's "
        "stored values: SuperLU pivots rows and columns by the values. "
        "Differentiate `jnp.linalg.slogdet(A)` or `jnp.linalg.det(A)` of the sparse "
        "matrix itself (their derivatives are `trace(A⁻¹ dA)` on the stored "
        "pattern), or solve with `jnp.linalg.solve(A, b)`."
    )


def _product(data: Array, indices: Array, n: int, x: Array, trans: int) -> Array:
    """`A x` (`trans=0`), `Aᵀ x` (1) or `Aᴴ x` (2) for the `n x n` matrix of the
    entries, `x` of shape `(n, k)`."""
    if trans == 2:
        data = jnp.conj(data)
    contract = 1 if trans == 0 else 0
    dtype = jnp.result_type(data.dtype, x.dtype)
    return dot_sparse_dense(
        data,
        indices,
        (n, n),
        x,
        (((contract,), (0,)), ((), ())),
        sparse_is_lhs=True,
        out_dtype=dtype,
        indices_sorted=False,
    ).astype(x.dtype)


def apply_inverse(factor: "SparseLU", b: Array, trans: int) -> Array:
    """`A⁻¹ b` (`trans=0`), `A⁻ᵀ b` (1) or `A⁻ᴴ b` (2) by `factor`, differentiable
    with respect to `b` and to the matrix's stored values (`factor.data`).

    A `lax.custom_linear_solve` whose `matvec` is the sparse product with the
    stored values and whose solves are SuperLU's on the host: the derivative with
    respect to the values is the adjoint solve and the sparse product (one value
    per stored entry), never a dense matrix.

    **Arguments:**

    - `factor`: the factorisation.
    - `b`: shape `(n,)` or `(n, k)`.
    - `trans`: which system.

    **Returns:**

    An array of `b`'s shape, of the dtype of `b` and the matrix together.
    """
    vector = b.ndim == 1
    dtype = jnp.result_type(factor.data.dtype, b.dtype)
    rhs = (b[:, None] if vector else b).astype(dtype)
    data, indices, n = factor.data, factor.indices, factor.n
    handle, spd = factor.handle, factor.spd
    if trans == 2 and not jnp.issubdtype(dtype, jnp.complexfloating):
        trans = 1

    def inverse(which: int) -> Any:
        def run(_: Any, x: Array) -> Array:
            return host_solve(handle, data, indices, x, spd=spd, trans=which)

        return run

    def conjugated(_: Any, x: Array) -> Array:
        # The transpose of `x -> A⁻ᴴ x` is `x -> conj(A)⁻¹ x = conj(A⁻¹ conj(x))`.
        return jnp.conj(inverse(0)(None, jnp.conj(x)))

    transpose = {0: inverse(1), 1: inverse(0), 2: conjugated}[trans]
    x = lax.custom_linear_solve(
        lambda x: _product(data, indices, n, x, trans),
        rhs,
        solve=inverse(trans),
        transpose_solve=transpose,
    )
    x = jnp.where(factor.valid, x, jnp.nan)
    return x[:, 0] if vector else x


class SparseLU(quax.GuardedValue):
    """The factorisation of a sparse square matrix `A` by SciPy's SuperLU, kept on
    the host: what `lax.linalg.lu` (so `jax.scipy.linalg.lu_factor`) and
    `lax.linalg.cholesky` (so `jax.scipy.linalg.cho_factor`) return inside
    [`quax.quaxify`][] for a [`quax_sparse.BCOO`][] or [`quax_sparse.CSR`][] matrix,
    and what [`quax_sparse.lu_factor`][] returns outside it.

    It stands in the program for JAX's packed factor: the pair of triangular solves
    that `jax.scipy.linalg.lu_solve` (or `cho_solve`) binds with it is one SuperLU
    solve with `A` (`Pr A Pc = L U`; no dense triangle ever exists), so repeated
    solves reuse one factorisation. The diagonal that `jnp.diagonal(lu)` reads is
    `U`'s, with the sign of SuperLU's row and column permutations folded into its
    first element, so that `jnp.linalg.slogdet` and `det` read the determinant from
    it as from JAX's factor; the pivots returned beside it are the identity. One
    triangular solve alone, or any other operation, is refused: the triangles are
    not JAX's.

    **Fields:**

    - `data`, `indices`: the stored entries of `A` (shapes `(nse,)`, `(nse, 2)`;
        padding at index `n`): the solves differentiate through them.
    - `handle`: the host's factorisation (an `int32`; a solve factors `A` again if
        the host no longer holds it).
    - `pivots`: `U`'s diagonal, signed as above.
    - `n`: the size of `A`.
    - `spd`: whether `A` was factored as symmetric positive definite
        (`cholesky`: SuperLU's symmetric mode).
    - `valid`: a boolean scalar, false where a check made under `jit` failed (a
        mask that `cholesky`'s `jnp.tril` applied was not the lower triangle):
        then every solve and pivot is NaN rather than a wrong number.
    - `orientation`: `"lu"` (JAX's packed `L` and `U`), `"lower"` (a Cholesky
        factor `L`) or `"upper"` (its conjugate transpose, as `cho_factor` with
        `lower=False` returns).
    """

    data: Array
    indices: Array
    handle: Array
    pivots: Array
    valid: Array
    n: int = eqx.field(static=True)
    spd: bool = eqx.field(static=True)
    orientation: str = eqx.field(static=True)

    linear_in_leaves: ClassVar[bool] = False
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        MaterialisationError
    )

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(
            (*self.data.shape[:-1], self.n, self.n), self.data.dtype
        )

    def dense(self) -> Array:
        # Never formed, whatever `allow_materialise` says (see the class docstring).
        raise self.refusal()

    def refusal_reason(self) -> str:
        return (
            f"it is SuperLU's factorisation of a {self.n} x {self.n} sparse matrix, "
            "held on the host, whose triangles are not JAX's packed factor"
        )

    def way_out(self, primitive: Primitive | None = None) -> str:
        return (
            "Solve with it through `jax.scipy.linalg.lu_solve((lu, piv), b)` "
            "(`cho_solve((c, lower), b)` for a Cholesky factor) or `factor.solve(b)`, "
            "read `jnp.diagonal(lu)` for the determinant, or factor the dense matrix "
            "(`A.todense()`) instead."
        )

    def diagonal(self) -> Array:
        """The pivots (`U`'s diagonal, the permutations' sign folded into the first):
        their product is `det A`. Not differentiable (see the class docstring)."""
        pivots = _read_pivots(self.data, self.pivots)
        return jnp.where(self.valid, pivots, jnp.nan)

    def solve(self, b: ArrayLike, trans: int = 0) -> Array:
        """`A⁻¹ b` (`trans=0`), `A⁻ᵀ b` (1) or `A⁻ᴴ b` (2), differentiable with
        respect to `b` and to `A`'s stored values (the adjoint solve, restricted to
        the stored pattern).

        **Arguments:**

        - `b`: shape `(n,)` or `(n, k)`.
        - `trans`: 0, 1 or 2, as in `jax.scipy.linalg.lu_solve`.

        **Returns:**

        An array of `b`'s shape.
        """
        b = jnp.asarray(b)
        if b.ndim not in (1, 2) or b.shape[0] != self.n:
            raise ValueError(
                f"`SparseLU.solve` needs `b` of shape ({self.n},) or ({self.n}, k); "
                f"got {b.shape}."
            )
        if trans not in (0, 1, 2):
            raise ValueError(f"`trans` must be 0, 1 or 2; got {trans!r}.")
        return apply_inverse(self, b, trans)


class PendingSolve(quax.GuardedValue):
    """A right-hand side after the first of the two triangular solves that
    `jax.scipy.linalg.lu_solve` and `cho_solve` bind with a [`quax_sparse.SparseLU`][]:
    the second one, with the same factor, finishes the solve with `A` at once.
    Anything else is refused (the intermediate vector, `L⁻¹ P b`, is never formed:
    SuperLU's triangles are not JAX's).

    **Fields:**

    - `rhs`: the right-hand side as given to the first solve, shape `(n, k)`.
    - `factor`: the factor.
    - `first`: the first solve's `(lower, transpose_a, conjugate_a, unit_diagonal)`.
    """

    rhs: Array
    factor: SparseLU
    first: tuple[bool, bool, bool, bool] = eqx.field(static=True)

    linear_in_leaves: ClassVar[bool] = False
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        MaterialisationError
    )

    def aval(self) -> jax.core.ShapedArray:
        dtype = jnp.result_type(self.rhs.dtype, self.factor.data.dtype)
        return jax.core.ShapedArray(self.rhs.shape, dtype)

    def dense(self) -> Array:
        # Never formed, whatever `allow_materialise` says (see the class docstring).
        raise self.refusal()

    def refusal_reason(self) -> str:
        return (
            "it is a right-hand side halfway through a solve with a sparse factor "
            "(`SparseLU`): quax-sparse solves with both triangles at once, so the "
            "vector after one triangular solve is never formed"
        )

    def way_out(self, primitive: Primitive | None = None) -> str:
        return (
            "Follow the first triangular solve with the second (as "
            "`jax.scipy.linalg.lu_solve` and `cho_solve` do), use `factor.solve(b)`, "
            "or factor the dense matrix (`A.todense()`) to solve with one triangle."
        )


def unfactorable(x: BCOO) -> str | None:
    """Why the host cannot factor `x`, or `None`: one square matrix (no batch
    dimensions) of a floating-point or complex dtype."""
    if x.n_dense:
        return (
            f"this BCOO has n_dense={x.n_dense} dense dimensions (blocks of shape "
            f"{x.dense_shape}): factor a matrix of scalar entries "
            "(`x.update_layout(n_dense=0)`)"
        )
    if x.ndim != 2 or x.n_batch != 0:
        return (
            f"quax-sparse factors one matrix at a time, and this BCOO has shape "
            f"{x.shape} with {x.n_batch} batch dimensions: map over the matrices "
            "with `jax.vmap` over the BCOO's leaves (`data`, `indices`) instead"
        )
    if x.shape[0] != x.shape[1]:
        return f"the matrix of shape {x.shape} is not square"
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return (
            f"its dtype is {x.dtype}: convert it to a floating-point or complex "
            "dtype first (`a.astype(jnp.float64)`)"
        )
    return None


def factorise(x: BCOO, *, spd: bool, orientation: str) -> SparseLU:
    """SuperLU's factorisation of `x` (checked by `unfactorable` first) as a
    `SparseLU` with the given `orientation`."""
    n = x.shape[0]
    handle, pivots = host_factor(x.data, x.indices, n, spd=spd)
    valid = jnp.asarray(True)
    return SparseLU(x.data, x.indices, handle, pivots, valid, n, spd, orientation)


def _factor_of(name: str, a: Any, spd: bool) -> SparseLU:
    if isinstance(a, CSR):
        a = a.to_bcoo()
    if not isinstance(a, BCOO):
        raise ValueError(
            f"`quax_sparse.{name}` factors a `BCOO` or `CSR` matrix; got "
            f"{type(a).__name__}. For a dense matrix use `jax.scipy.linalg.{name}`."
        )
    why = unfactorable(a)
    if why is not None:
        raise ValueError(f"`quax_sparse.{name}` cannot factor this matrix: {why}.")
    return factorise(a, spd=spd, orientation="lu" if not spd else "lower")


def lu_factor(a: Any) -> SparseLU:
    """Factor a sparse matrix once (SuperLU on the host), to solve with it many times.

    ```python
    lu = quax_sparse.lu_factor(a)
    x = lu.solve(b)  # differentiable in `b` and in `a.data`
    ```

    Inside [`quax.quaxify`][], `jax.scipy.linalg.lu_factor(a)` returns the same
    factor, for `jax.scipy.linalg.lu_solve`.

    **Arguments:**

    - `a`: a square [`quax_sparse.BCOO`][] (no batch dimensions) or
        [`quax_sparse.CSR`][] matrix of a floating-point or complex dtype.

    **Returns:**

    A [`quax_sparse.SparseLU`][]. Works under `jit` and `vmap` (over `a`'s leaves).
    """
    return _factor_of("lu_factor", a, spd=False)


def cho_factor(a: Any) -> SparseLU:
    """Factor a symmetric (Hermitian) positive definite sparse matrix once
    (SuperLU's symmetric mode on the host: CHOLMOD has no wheels on PyPI), to solve
    with it many times (`factor.solve(b)`).

    Inside [`quax.quaxify`][], `jax.scipy.linalg.cho_factor(a)` returns the same
    factor, for `jax.scipy.linalg.cho_solve`. The matrix is taken as it is (not
    symmetrised); it is not checked to be positive definite.

    **Arguments:**

    - `a`: as for [`quax_sparse.lu_factor`][].

    **Returns:**

    A [`quax_sparse.SparseLU`][] (`spd=True`, `orientation="lower"`).
    """
    return _factor_of("cho_factor", a, spd=True)
