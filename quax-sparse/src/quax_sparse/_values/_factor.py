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

from .._cusolver import resolve_route, solve as device_solve
from .._kernels import dot_sparse_dense
from .._superlu import factor as host_factor, solve as host_solve
from ._bcoo import BCOO, SparseMaterialisationError
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


def _backward_error_ok(
    data: Array, indices: Array, n: int, x: Array, b: Array, trans: int
) -> Array:
    """Per column of `x`, whether `op(A) x = b` holds to a backward error of
    `sqrt(eps)`: `|op(A) x - b| <= sqrt(eps) (|op(A)| |x| + |b|)` in the max norm
    (`|op(A)|` its largest row sum). A backward-stable solve (QR) is far inside
    it; the numbers a solver returns for a singular matrix are not. No gradient
    flows through the check."""
    data, x, b = (lax.stop_gradient(v) for v in (data, x, b))
    residual = _product(data, indices, n, x, trans) - b
    ones = jnp.ones((n, 1), jnp.abs(data).dtype)
    norm_a = jnp.max(_product(jnp.abs(data), indices, n, ones, min(trans, 1)))
    eps = jnp.finfo(x.dtype).eps
    scale = norm_a * jnp.max(jnp.abs(x), axis=0) + jnp.max(jnp.abs(b), axis=0)
    return jnp.max(jnp.abs(residual), axis=0) <= jnp.sqrt(eps) * scale


def apply_inverse(factor: "SparseLU", b: Array, trans: int) -> Array:
    """`A⁻¹ b` (`trans=0`), `A⁻ᵀ b` (1) or `A⁻ᴴ b` (2) by `factor`, differentiable
    with respect to `b` and to the matrix's stored values (`factor.data`).

    A `lax.custom_linear_solve` whose `matvec` is the sparse product with the
    stored values and whose solves are the factor's route's (SuperLU's on the host,
    or `spsolve`'s on the device): the derivative with respect to the values is the
    adjoint solve and the sparse product (one value per stored entry), never a
    dense matrix. On the `"cusolver"` route, whose solver reports no singularity, a
    column whose backward error is above `sqrt(eps)` is NaN
    (`_backward_error_ok`), as SuperLU's singular solves are.

    **Arguments:**

    - `factor`: the factorisation.
    - `b`: shape `(n,)` or `(n, k)`.
    - `trans`: which system.

    **Returns:**

    An array of `b`'s shape, of the dtype of `b` and the matrix together: NaN in
    every element where the matrix is singular (SuperLU's singular factorisation,
    or the backward-error check), where dense `jnp.linalg.solve` gives `±inf` in
    some elements.
    """
    if factor.batch_shape:
        return factor.each(lambda f, b: apply_inverse(f, b, trans), b)
    vector = b.ndim == 1
    dtype = jnp.result_type(factor.data.dtype, b.dtype)
    rhs = (b[:, None] if vector else b).astype(dtype)
    data, indices, n = factor.data, factor.indices, factor.n
    handle, spd = factor.handle, factor.spd
    if trans == 2 and not jnp.issubdtype(dtype, jnp.complexfloating):
        trans = 1

    def inverse(which: int) -> Any:
        def run(_: Any, x: Array) -> Array:
            if factor.route == "cusolver":
                return device_solve(data, indices, x, trans=which)
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
    valid = factor.valid
    if factor.route == "cusolver":
        valid = valid & _backward_error_ok(data, indices, n, x, rhs, trans)
    x = jnp.where(valid, x, jnp.nan)
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

    - `data`, `indices`: the stored entries of `A` (shapes `(*batch, nse)`,
        `(*batch, nse, 2)`; padding at index `n`): the solves differentiate through
        them. A batch of matrices (from a `BCOO` with batch dimensions) is factored
        and solved one member at a time.
    - `handle`: the host's factorisation (`int32`, shape `batch`; a solve factors
        `A` again if the host no longer holds it).
    - `pivots`: `U`'s diagonal, signed as above (shape `(*batch, n)`).
    - `n`: the size of `A`.
    - `spd`: whether `A` was factored as symmetric positive definite
        (`cholesky`: SuperLU's symmetric mode).
    - `valid`: a boolean (a scalar, or of shape `batch`), false where a check
        made under `jit` failed (a mask that `cholesky`'s `jnp.tril` applied was
        not the lower triangle): then every solve and pivot is NaN rather than a
        wrong number.
    - `orientation`: `"lu"` (JAX's packed `L` and `U`), `"lower"` (a Cholesky
        factor `L`) or `"upper"` (its conjugate transpose, as `cho_factor` with
        `lower=False` returns).
    - `route`: `"superlu"` (the solves reuse the host's factorisation `handle`)
        or `"cusolver"` (each solve is `jax.experimental.sparse.linalg.spsolve`,
        which factors `A` again; nothing is factored until `diagonal` is read,
        which factors `A` on the host: `handle` and `pivots` are unused
        placeholders). See [`quax_sparse.solver_route`][].
    """

    data: Array
    indices: Array
    handle: Array
    pivots: Array
    valid: Array
    n: int = eqx.field(static=True)
    spd: bool = eqx.field(static=True)
    orientation: str = eqx.field(static=True)
    route: str = eqx.field(static=True, default="superlu")

    linear_in_leaves: ClassVar[bool] = False
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        SparseMaterialisationError
    )

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(
            (*self.data.shape[:-1], self.n, self.n), self.data.dtype
        )

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The batch dimensions: `()` for one matrix."""
        return tuple(self.data.shape[:-1])

    def each(self, fn: Any, *args: Any) -> Any:
        """`fn(member, *member_args)` over the batch members (nested `jax.vmap`
        over the batch dimensions of the factor and of `args`): the host's
        callbacks receive the batch at once and loop over it."""
        batch = self.batch_shape
        valid = jnp.broadcast_to(self.valid, batch)
        factor = SparseLU(
            self.data,
            jnp.broadcast_to(self.indices, (*batch, *self.indices.shape[-2:])),
            jnp.broadcast_to(self.handle, batch),
            self.pivots,
            valid,
            self.n,
            self.spd,
            self.orientation,
            self.route,
        )
        for _ in batch:
            fn = jax.vmap(fn)
        return fn(factor, *args)

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
        if self.batch_shape:
            return self.each(lambda member: member.diagonal())
        pivots = self.pivots
        if self.route == "cusolver":
            # cuSolver's QR solve keeps no factor to read: SuperLU's, on the host.
            _, pivots = host_factor(self.data, self.indices, self.n, spd=self.spd)
        pivots = _read_pivots(self.data, pivots)
        return jnp.where(self.valid, pivots, jnp.nan)

    def solve(self, b: ArrayLike, trans: int = 0) -> Array:
        """`A⁻¹ b` (`trans=0`), `A⁻ᵀ b` (1) or `A⁻ᴴ b` (2), differentiable with
        respect to `b` and to `A`'s stored values (the adjoint solve, restricted to
        the stored pattern).

        **Arguments:**

        - `b`: shape `(*batch, n)` or `(*batch, n, k)` (`batch` the factor's batch
            dimensions: `(n,)` or `(n, k)` for one matrix).
        - `trans`: 0, 1 or 2, as in `jax.scipy.linalg.lu_solve`.

        **Returns:**

        An array of `b`'s shape. NaN in every element where `A` is singular (dense
        `jnp.linalg.solve` gives `±inf` in some elements there).
        """
        b = jnp.asarray(b)
        batch = self.batch_shape
        nb = len(batch)
        if b.ndim not in (nb + 1, nb + 2) or b.shape[: nb + 1] != (*batch, self.n):
            raise ValueError(
                f"`SparseLU.solve` needs `b` of shape {(*batch, self.n)} or "
                f"{(*batch, self.n, 'k')} (the factor's batch dimensions, then "
                f"{self.n} rows); got {b.shape}."
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
        SparseMaterialisationError
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
    """Why `x` cannot be factored, or `None`: a square matrix, or a batch of them
    (batch dimensions, then two sparse ones), of a floating-point or complex
    dtype."""
    if x.n_dense:
        return (
            f"this BCOO has n_dense={x.n_dense} dense dimensions (blocks of shape "
            f"{x.dense_shape}): factor a matrix of scalar entries "
            "(`x.update_layout(n_dense=0)`)"
        )
    if x.ndim != x.n_batch + 2:
        return (
            "quax-sparse factors a matrix, or a batch of matrices (a BCOO whose "
            f"batch dimensions are followed by two sparse ones), and this BCOO of "
            f"shape {x.shape} has {x.ndim - x.n_batch} sparse dimensions after its "
            f"{x.n_batch} batch dimensions: reshape it to a matrix first"
        )
    if x.shape[-2] != x.shape[-1]:
        return f"the matrix of shape {x.shape[-2:]} is not square"
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return (
            f"its dtype is {x.dtype}: convert it to a floating-point or complex "
            "dtype first (`a.astype(jnp.float64)`)"
        )
    return None


def factorise(
    x: BCOO, *, spd: bool, orientation: str, route: str | None = None
) -> SparseLU:
    """The factorisation of `x` (checked by `unfactorable` first) as a `SparseLU`
    with the given `orientation`, on `route` (`None`: the current
    [`quax_sparse.solver_route`][]): SuperLU's on the host, or, on the `"cusolver"`
    route, none yet (each solve factors `x`)."""
    n = x.shape[-1]
    batch = x.shape[: x.n_batch]
    route = resolve_route(route)
    indices = jnp.broadcast_to(x.indices, (*batch, *x.indices.shape[-2:]))
    data = jnp.broadcast_to(x.data, (*batch, x.data.shape[-1]))
    if route == "cusolver":
        handle = jnp.zeros(batch, jnp.int32)
        pivots = jnp.full((*batch, n), jnp.nan, x.dtype)
    else:

        def member(data: Array, indices: Array) -> tuple[Array, Array]:
            return host_factor(data, indices, n, spd=spd)

        for _ in batch:  # the callback receives the batch, and loops over it
            member = jax.vmap(member)
        handle, pivots = member(data, indices)
    valid = jnp.asarray(True)
    return SparseLU(data, indices, handle, pivots, valid, n, spd, orientation, route)


def _factor_of(name: str, a: Any, spd: bool, route: str | None) -> SparseLU:
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
    orientation = "lu" if not spd else "lower"
    return factorise(a, spd=spd, orientation=orientation, route=route)


def lu_factor(a: Any, *, route: str | None = None) -> SparseLU:
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
    - `route`: `"auto"`, `"superlu"` or `"cusolver"` (see
        [`quax_sparse.solver_route`][]); `None`, the current `solver_route`. On the
        `"cusolver"` route nothing is factored here: each `solve` factors `a` again
        (`jax.experimental.sparse.linalg.spsolve` keeps no factor).

    **Returns:**

    A [`quax_sparse.SparseLU`][]. Works under `jit` and `vmap` (over `a`'s leaves).
    A singular `a` is not an error: every solve with its factor is NaN (dense
    `jnp.linalg.solve` gives `±inf` in some elements there).
    """
    return _factor_of("lu_factor", a, spd=False, route=route)


def cho_factor(a: Any, *, route: str | None = None) -> SparseLU:
    """Factor a symmetric (Hermitian) positive definite sparse matrix once
    (SuperLU's symmetric mode on the host: CHOLMOD has no wheels on PyPI), to solve
    with it many times (`factor.solve(b)`).

    Inside [`quax.quaxify`][], `jax.scipy.linalg.cho_factor(a)` returns the same
    factor, for `jax.scipy.linalg.cho_solve`. The matrix is taken as it is (not
    symmetrised); it is not checked to be positive definite.

    **Arguments:**

    - `a`, `route`: as for [`quax_sparse.lu_factor`][] (the `"cusolver"` route
        solves by QR, symmetric or not).

    **Returns:**

    A [`quax_sparse.SparseLU`][] (`spd=True`, `orientation="lower"`); for a
    singular `a`, every solve with it is NaN, as for `lu_factor`.
    """
    return _factor_of("cho_factor", a, spd=True, route=route)
