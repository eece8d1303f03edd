"""The rules shared by every structured matrix: each calls the matrix's own
structured method, or falls back to `StructuredMatrix.default` (which refuses)
when the case has no structured algorithm."""

import functools as ft
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import quax
from jax import lax
from jax.extend.core import primitives as prims
from jaxtyping import Array, ArrayLike
from quax.extend import pinv_function
from quax.zero import Zero, is_ieee_strict

from ._kernels import keep_or_scale
from ._linalg import EXPM_TYPES, eigh_of, expm_of, pinv_of, qr_of, svd_of
from ._values._banded import Banded
from ._values._base import (
    StructuredMaterialisationError,
    StructuredMatrix,
    empty_as_dense,
    holds_no_entries,
)
from ._values._composite import Sum, add, closed_sum, matmul
from ._values._determinant import DeterminantLU, HalfSolved
from ._values._diagonal import Diagonal, ScaledIdentity
from ._values._kronecker import KroneckerPlusIdentity
from ._values._lowrank import LowRank, LowRankPlusDiagonal
from ._values._tridiagonal import TridiagonalMatrix


def _fallback(primitive: Any, values: list[Any], params: dict[str, Any]) -> Any:
    return quax.fallback_rule(primitive, values)(values, params)


_F = TypeVar("_F", bound=Callable[..., Any])


def _register(primitive: Any) -> Callable[[_F], _F]:
    """`quax.register(primitive)` for the rules below: a call where a structured
    input holds no entries (`holds_no_entries`) computes on the dense, empty
    arrays instead (`empty_as_dense`), before the rule's algorithm can index,
    transform or divide over `n = 0`. The rule keeps its signature (so its
    dispatch and the params it receives are as registered)."""

    def decorate(rule: _F) -> _F:
        @ft.wraps(rule)
        def guarded(*values: Any, **params: Any) -> Any:
            if any(map(holds_no_entries, values)):
                return _fallback(primitive, empty_as_dense(values), params)
            return rule(*values, **params)

        quax.register(primitive)(guarded)
        return rule

    return decorate


def _register_function(function: Any, **options: Any) -> Callable[[_F], _F]:
    """`quax.register_function(function, **options)` for the rules below, with
    `_register`'s case first: where a structured argument holds no entries, the
    function's body runs (`call`) on the dense, empty arrays."""

    def decorate(rule: _F) -> _F:
        @ft.wraps(rule)
        def guarded(*args: Any, call: Any, **static: Any) -> Any:
            if any(map(holds_no_entries, args)):
                return call(*empty_as_dense(args))
            return rule(*args, call=call, **static)

        quax.register_function(function, **options)(guarded)
        return rule

    return decorate


# dot_general --------------------------------------------------------------------------


def _structured_product(
    s: StructuredMatrix, x: Any, s_is_lhs: bool, dimension_numbers: Any
) -> Any | None:
    """`dot_general` of a structured matrix `s` and a plain `x`, through `s.matmat`,
    or `None` when the dimension numbers are not a (batched) matrix product: one
    matrix axis of `s` contracted, and each batch axis of `s` either a batch axis
    of the product (paired with one of `x`'s) or a free axis (`x` is then the same
    for every matrix of the batch, as `jax.vmap(lambda A, v: A @ v, in_axes=(0,
    None))` binds it: `x` is broadcast along it, no dense matrix is formed)."""
    (lc, rc), (lb, rb) = dimension_numbers
    s_con, x_con, s_bat, x_bat = (lc, rc, lb, rb) if s_is_lhs else (rc, lc, rb, lb)
    nb = s.ndim - 2
    if len(s_con) != 1 or s_con[0] < nb or any(b >= nb for b in s_bat):
        return None
    op = s if s_con[0] == nb + 1 else s.transpose()
    if op is None:
        return None
    x = jnp.asarray(x)
    free = [i for i in range(x.ndim) if i not in (*x_bat, x_con[0])]
    free_shape = tuple(x.shape[i] for i in free)
    # `x` as `(*paired batch, n, k)`, the paired axes in `s`'s order, then with a
    # broadcast axis for each of `s`'s unpaired batch axes: `(*batch, n, k)`.
    order = np.argsort(np.asarray(s_bat, dtype=int))
    paired = [x_bat[i] for i in order]
    xt = jnp.transpose(x, (*paired, x_con[0], *free))
    k = int(np.prod(free_shape, dtype=int))
    xt = xt.reshape(*xt.shape[: len(paired) + 1], k)
    unpaired = [b for b in range(nb) if b not in s_bat]
    xt = jnp.expand_dims(xt, unpaired)
    xt = jnp.broadcast_to(xt, (*s.shape[:nb], s.shape[-1], k))
    out = op.matmat(xt)
    if out is None:
        return None
    out = out.reshape(*s.shape[:nb], s.shape[-1], *free_shape)
    # `dot_general`'s output order: the batch axes (in `s_bat`'s order), then the
    # lhs's free axes, then the rhs's.
    s_free = [*unpaired, nb]
    x_free = list(range(nb + 1, nb + 1 + len(free)))
    rest = s_free + x_free if s_is_lhs else x_free + s_free
    return jnp.transpose(out, (*s_bat, *rest))


def _product_with_dense(
    s: StructuredMatrix, x: Any, s_is_lhs: bool, values: list[Any], params: Any
) -> Any:
    """The `dot_general` rule for a structured `s` and a plain `x` on either side."""
    dimension_numbers = params["dimension_numbers"]
    out = _structured_product(s, x, s_is_lhs, dimension_numbers)
    if out is None:
        return _fallback(lax.dot_general_p, values, params)
    preferred = params.get("preferred_element_type")
    dtype = preferred if preferred is not None else jnp.result_type(s.dtype, x)
    return out.astype(dtype)


@_register(lax.dot_general_p)
def _(lhs: StructuredMatrix, rhs: ArrayLike, **params: Any) -> Any:
    return _product_with_dense(lhs, jnp.asarray(rhs), True, [lhs, rhs], params)


@_register(lax.dot_general_p)
def _(lhs: ArrayLike, rhs: StructuredMatrix, **params: Any) -> Any:
    return _product_with_dense(rhs, jnp.asarray(lhs), False, [lhs, rhs], params)


def _as_matrix_product(
    x: StructuredMatrix, y: StructuredMatrix, dn: Any
) -> tuple[StructuredMatrix, StructuredMatrix] | None:
    """`x` and `y` with one batch shape, where `dot_general` is their (batched)
    matrix product `x @ y`: the batch axes paired, or (what `jax.vmap(lambda A,
    B: A @ B, in_axes=(0, None))` binds) `x` batched and `y` a single matrix,
    which is broadcast over `x`'s batch. Else `None` (e.g. a batched `y` and a
    single `x`, whose product JAX lays out with the batch axis in the middle)."""
    nb = x.ndim - 2
    batch = tuple(range(nb))
    dn = tuple(map(tuple, dn))
    if y.ndim == x.ndim and dn == (((nb + 1,), (nb,)), (batch, batch)):
        return x, y
    if nb and y.ndim == 2 and dn == (((nb + 1,), (0,)), ((), ())):
        broadcast = y.broadcast_batch(x.shape[:nb])
        return None if broadcast is None else (x, broadcast)
    return None


@_register(lax.dot_general_p)
def _(lhs: StructuredMatrix, rhs: StructuredMatrix, **params: Any) -> Any:
    """`A @ B`: a closed form where the pair has one (`D @ T`, `K @ K`, ...), else a
    lazy `Product`."""
    pair = _as_matrix_product(lhs, rhs, params["dimension_numbers"])
    if pair is None:
        return _fallback(lax.dot_general_p, [lhs, rhs], params)
    return matmul(*pair)


# Structure-keeping algebra ------------------------------------------------------------


def _keep_tag(x: StructuredMatrix, out: Any, keep: bool = True) -> Any:
    """`out` tagged positive definite when `x` is and the operation keeps it."""
    if keep and x.positive_definite and isinstance(out, StructuredMatrix):
        return out.with_tags(positive_definite=True)
    return out


@_register(lax.transpose_p)
def _(x: StructuredMatrix, *, permutation: Any) -> Any:
    nb = x.ndim - 2
    out = None
    if tuple(permutation) == (*range(nb), nb + 1, nb):
        out = x.transpose()
    elif tuple(permutation) == tuple(range(x.ndim)):
        out = x
    if out is None:
        return _fallback(lax.transpose_p, [x], dict(permutation=permutation))
    return _keep_tag(x, out)


def _scalar(y: Any) -> Any | None:
    """`y` as a 0-dimensional array if it holds one number, else `None`."""
    if np.size(y) != 1:
        return None
    return jnp.reshape(y, ())


def _is_positive(s: Any) -> bool:
    """Whether the scalar `s` is known, at trace time, to be positive."""
    known = quax.known_constant(s, 1)
    return known is not None and bool(
        np.all(np.real(known) > 0) & (np.imag(known) == 0)
    )


def _scaled(primitive: Any, values: list[Any], x: StructuredMatrix, s: Any) -> Any:
    out = None if s is None else x.scaled(s.astype(x.dtype))
    if out is None:
        return _fallback(primitive, values, {})
    return _keep_tag(x, out, x.positive_definite and _is_positive(s))


@_register(lax.conj_p)
def _(x: StructuredMatrix, *, input_dtype: Any) -> Any:
    """`jnp.conj(M)`, `M.conj()`: every complex leaf conjugated, the structure kept
    (`lax.conj` of a real matrix: the leaves made complex)."""
    out = x.conjugate(jnp.result_type(x.dtype, jnp.complex64))
    if out is None:
        return _fallback(lax.conj_p, [x], dict(input_dtype=input_dtype))
    return _keep_tag(x, out)


@_register(lax.neg_p)
def _(x: StructuredMatrix) -> Any:
    return _scaled(lax.neg_p, [x], x, jnp.asarray(-1, x.dtype))


def _times_dense(x: StructuredMatrix, y: Any, *, select: bool = False) -> Any | None:
    """`x * y` for a plain `y` of `x`'s full shape: with a structure when `x.masked`
    keeps one (the structure's zeros stay zero, as `jax.experimental.sparse`
    multiplies: `y`'s entries outside the pattern are not read), else the dense
    product read through `x.entries`, which costs what the dense `y` already does
    (O(n²)): this is the masked branch of `jnp.diagonal`. With `select`,
    `jnp.where(y != 0, x, 0)` instead (see `StructuredMatrix.masked`)."""
    if np.ndim(y) != x.ndim or np.broadcast_shapes(np.shape(y), x.shape) != x.shape:
        return None
    out = x.masked(jnp.broadcast_to(y, x.shape), select=select)
    if out is not None:
        return out
    i, j = jnp.indices(x.shape[-2:])
    read = lambda m: m.entries(i, j)
    for _ in range(x.ndim - 2):  # each matrix of a batch
        read = jax.vmap(read)
    entries = read(x)
    if entries is None:
        return None
    return keep_or_scale(entries, jnp.asarray(y), select=select)


def _mul(values: list[Any], x: StructuredMatrix, y: Any) -> Any:
    s = _scalar(y)
    if s is not None:
        return _scaled(lax.mul_p, values, x, s)
    out = _times_dense(x, y)
    return _fallback(lax.mul_p, values, {}) if out is None else out


@_register(lax.mul_p)
def _(x: StructuredMatrix, y: ArrayLike) -> Any:
    return _mul([x, y], x, y)


@_register(lax.mul_p)
def _(y: ArrayLike, x: StructuredMatrix) -> Any:
    return _mul([y, x], x, y)


@_register(lax.div_p)
def _(x: StructuredMatrix, y: ArrayLike) -> Any:
    s = _scalar(y)
    return _scaled(lax.div_p, [x, y], x, None if s is None else 1 / s)


def _same_type(x: StructuredMatrix, y: StructuredMatrix) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype


@_register(lax.add_p)
def _(x: StructuredMatrix, y: StructuredMatrix) -> Any:
    """`A + B`: a closed form where the pair has one (`D + D`, `D + T`, banded
    sums, ...), else a lazy `Sum`."""
    if not _same_type(x, y):
        return _fallback(lax.add_p, [x, y], {})
    return add(x, y)


@_register(lax.sub_p)
def _(x: StructuredMatrix, y: StructuredMatrix) -> Any:
    neg = y.scaled(jnp.asarray(-1, y.dtype))
    if neg is None or not _same_type(x, y):
        return _fallback(lax.sub_p, [x, y], {})
    return add(x, neg)


def _constant_diagonal(x: StructuredMatrix, y: Any) -> tuple[Any, np.ndarray] | None:
    """The plain `y` (broadcast to `x`'s shape) as `scale * diag(d)`, where the
    program shows `y` to be a scalar times a constant whose off-diagonal entries are
    all zero: `(scale, d)`, the `scale` a number of `y`'s dtype (NumPy's one for a
    constant such as `0.1 * jnp.eye(n)`, a tracer for `noise * jnp.eye(n)` with a
    traced `noise`, see `quax.known_scaled_constant`), else `None`.

    With a traced scale, the constant's zeros stay exact zeros, as symbolic zeros
    do (`quax.zero`), whereas the dense product of an infinite or NaN scale puts
    NaN off the diagonal: such a scale is made NaN, so that solves, determinants
    and products are NaN as dense JAX's are (never the silent zero that `K + inf
    I` would solve to), though the structure's off-diagonal entries stay `x`'s.
    Inside `quax.zero.ieee_strict` a traced scale is not read (`None`)."""
    if np.ndim(y) > x.ndim:
        return None
    known = quax.known_scaled_constant(y, 2**62)
    if known is None:
        return None
    scale, constant = known
    if not isinstance(scale, np.ndarray):
        if is_ieee_strict():
            return None
        if jnp.issubdtype(scale.dtype, jnp.inexact):
            scale = jnp.where(jnp.isfinite(scale), scale, jnp.nan)
    try:
        constant = np.broadcast_to(constant, x.shape)
    except ValueError:
        return None
    off = ~np.eye(x.shape[-1], dtype=bool)
    if np.any(constant[..., off] != 0):  # NaN counts as nonzero: not diagonal
        return None
    return scale, np.diagonal(constant, axis1=-2, axis2=-1)


def _plus_diagonal(x: StructuredMatrix, scale: Any, d: np.ndarray) -> StructuredMatrix:
    """`x + scale * diag(d)`: `x + c I` (a `ScaledIdentity` of `scale * c`) where
    every entry of `d` is one finite `c` and the pair has a closed form (e.g. a
    symmetric `Kronecker`), else `x.add_diagonal(scale * d)` where the structure
    keeps one, else `x + Diagonal(scale * d)` (a closed form or a lazy `Sum`)."""
    dtype = jnp.result_type(x.dtype, d.dtype)
    scale = jnp.asarray(scale).astype(dtype)
    flat = d.reshape(-1, d.shape[-1]) if d.size else d
    if d.size and np.all(flat == flat[:, :1]) and np.all(np.isfinite(d)):
        out = closed_sum(
            x, ScaledIdentity(scale * d[..., 0].astype(dtype), x.shape[-1])
        )
        if out is not None:
            return out
    diagonal = scale * jnp.asarray(d, dtype)
    out = x.add_diagonal(diagonal)
    return add(x, Diagonal(diagonal)) if out is None else out


def _refuse_dense(values: list[Any], x: StructuredMatrix, y: Any, sign: int) -> Any:
    """The fallback of `x + y` / `x - y` (`sign`) for a plain `y` the program does
    not show to be a scalar times a constant diagonal. Where `y` is one matrix of
    `x`'s size (`noise * jnp.eye(n)` with a noise batched by `jax.vmap`,
    `jnp.diag(d)` of a `d` that is a `jit` argument or closed over by it, which
    the program shows to no rule) and `x` may not densify: a refusal that says
    which structure to write instead."""
    primitive = lax.add_p if sign == 1 else lax.sub_p
    if x.allow_materialise or jnp.shape(y) != x.shape[-2:]:
        return _fallback(primitive, values, {})
    op = "+" if sign == 1 else "-"
    name = type(x).__name__
    raise StructuredMaterialisationError(
        f"Refusing to materialise `{name}` for primitive `{primitive.name}` with a "
        f"dense `{jnp.shape(y)}` operand: {x.refusal_reason()}, and the program "
        "does not show that operand to be a scalar times a constant diagonal (as "
        "it shows `0.1 * jnp.eye(n)`, or `noise * jnp.eye(n)` with a noise traced "
        "by `jax.jit` or `jax.grad`). It cannot where the noise is batched by "
        "`jax.vmap` (a batch of noises), nor for `jnp.diag(d)` under `jax.jit` "
        "(whether `d` is an argument or a closed-over NumPy array), nor for an "
        "array passed into `jax.jit`. Write the diagonal as a structure, which "
        "stays structured for any traced, batched or closed-over values: "
        f"`M {op} quax_structured.ScaledIdentity(noise, n)` for `M {op} noise * "
        f"jnp.eye(n)` (a symmetric `Kronecker` `M` then gives a "
        "`KroneckerPlusIdentity`, one per batch member under `jax.vmap`), and "
        f"`M {op} quax_structured.Diagonal(d)` for `M {op} jnp.diag(d)`. Or: "
        + x.way_out(None)
    )


def _add_dense(values: list[Any], x: StructuredMatrix, y: Any, sign: int) -> Any:
    """`x + y` (`sign=1`) or `x - y` (`sign=-1`) for a plain `y` that is a scalar
    times a constant diagonal (`K + 0.1 * jnp.eye(n)`, or `K + noise * jnp.eye(n)`
    with a traced noise, as Gaussian-process code adds its noise): the structure
    kept; anything else refuses, naming the primitive (see `_refuse_dense`)."""
    known = _constant_diagonal(x, y)
    out = None
    if known is not None:
        scale, d = known
        out = _plus_diagonal(x, scale, sign * d)
        if out is not None and not _same_type(x, out):
            return _fallback(lax.add_p if sign == 1 else lax.sub_p, values, {})
    if out is None:
        return _refuse_dense(values, x, y, sign)
    return out


@_register(lax.add_p)
def _(x: StructuredMatrix, y: ArrayLike) -> Any:
    return _add_dense([x, y], x, y, 1)


@_register(lax.add_p)
def _(y: ArrayLike, x: StructuredMatrix) -> Any:
    return _add_dense([y, x], x, y, 1)


@_register(lax.sub_p)
def _(x: StructuredMatrix, y: ArrayLike) -> Any:
    return _add_dense([x, y], x, y, -1)


@_register(lax.sub_p)
def _(y: ArrayLike, x: StructuredMatrix) -> Any:
    """`y - x` = `-x + y`."""
    neg = x.scaled(jnp.asarray(-1, x.dtype))
    known = _constant_diagonal(x, y)
    out = None
    if known is not None and neg is not None:
        scale, d = known
        out = _plus_diagonal(neg, scale, d)
    return _fallback(lax.sub_p, [y, x], {}) if out is None else out


@_register(lax.convert_element_type_p)
def _(x: StructuredMatrix, *, new_dtype: Any, **params: Any) -> Any:
    out = None
    if new_dtype == x.dtype:
        out = x
    elif jnp.issubdtype(new_dtype, jnp.inexact):
        out = x.map_leaves(lambda leaf: leaf.astype(new_dtype))
    if out is None:
        params = dict(new_dtype=new_dtype, **params)
        return _fallback(lax.convert_element_type_p, [x], params)
    return _keep_tag(x, out)


@_register(lax.reduce_sum_p)
def _(x: StructuredMatrix, *, axes: Any, **params: Any) -> Any:
    """Row sums (`x @ 1`), column sums (`xᵀ @ 1`) or both, through products."""
    nb = x.ndim - 2
    axes = tuple(sorted(axes))
    op = {(nb,): x.transpose(), (nb + 1,): x, (nb, nb + 1): x}.get(axes)
    out = None
    if op is not None:
        ones = jnp.ones((*x.shape[:-1], 1), x.dtype)
        out = op.matmat(ones)
    if out is None:
        return _fallback(lax.reduce_sum_p, [x], dict(axes=axes, **params))
    out = out[..., 0]
    return jnp.sum(out, axis=-1) if len(axes) == 2 else out


def _is_zeros(x: Any) -> bool:
    """Whether the plain array `x` is known, at trace time, to hold only zeros (as
    the zeros `jnp.where`, `jnp.tril` and `lax.linalg.cholesky` select against)."""
    known = quax.known_constant(x, 2**62)
    return known is not None and bool(np.all(known == 0))


@_register(prims.select_n_p)
def _(which: ArrayLike, *cases: StructuredMatrix | ArrayLike) -> Any:
    """`where(mask, x, 0)` (`jnp.tril`, `jnp.trace`, the lower factor
    `lax.linalg.cholesky` returns): the structure's entries, masked."""
    out = None
    structured = [
        (i, c) for i, c in enumerate(cases) if isinstance(c, StructuredMatrix)
    ]
    if len(cases) == 2 and len(structured) == 1:
        ((i, x),) = structured
        if _is_zeros(cases[1 - i]):
            keep = jnp.asarray(which) if i == 1 else ~jnp.asarray(which)
            out = _times_dense(x, keep.astype(x.dtype), select=True)
    if out is None:
        return _fallback(prims.select_n_p, [which, *cases], {})
    return out


# Linear algebra -----------------------------------------------------------------------


def _identity_pivots(x: StructuredMatrix) -> Any:
    iota = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.broadcast_to(iota, (*x.shape[:-2], x.shape[-1]))


@_register(lax.linalg.lu_p)
def _(x: StructuredMatrix) -> Any:
    factors = x.lu()
    if factors is None:
        return _fallback(lax.linalg.lu_p, [x], {})
    if isinstance(factors, tuple):
        return list(factors)
    pivots = _identity_pivots(x)
    return [factors, pivots, pivots]


@_register(lax.linalg.triangular_solve_p)
def _(
    a: StructuredMatrix,
    b: ArrayLike,
    *,
    left_side: bool,
    lower: bool,
    transpose_a: bool,
    conjugate_a: bool,
    unit_diagonal: bool,
) -> Any:
    params = dict(
        left_side=left_side,
        lower=lower,
        transpose_a=transpose_a,
        conjugate_a=conjugate_a,
        unit_diagonal=unit_diagonal,
    )
    b = jnp.asarray(b)
    # conj(op(A)) x = b  <=>  op(A) conj(x) = conj(b): a conjugated solve (what
    # `lu_solve(..., trans=2)` binds, `Aᴴ x = b`) is the structure's own solve of
    # the conjugated right-hand side, conjugated back.
    conjugate = conjugate_a and jnp.issubdtype(a.dtype, jnp.complexfloating)
    rhs = jnp.conj(b) if conjugate else b
    if not left_side:
        # x op(A) = b  <=>  op(A)^T x^T = b^T.
        rhs = jnp.swapaxes(rhs, -1, -2)
        transpose_a = not transpose_a
    out = a.triangular_solve(
        rhs, lower=lower, transpose_a=transpose_a, unit_diagonal=unit_diagonal
    )
    if out is None:
        return _fallback(lax.linalg.triangular_solve_p, [a, b], params)
    if isinstance(out, HalfSolved):
        # The first half of a pivoted solve (see `HalfSolved`); the second half
        # takes it only left-sided.
        return out.conjugated_solve() if conjugate else out
    if conjugate:
        out = jnp.conj(out)
    return out if left_side else jnp.swapaxes(out, -1, -2)


@_register(lax.linalg.triangular_solve_p)
def _(a: StructuredMatrix, b: Zero, **params: Any) -> Any:
    """`op(A) x = 0` (`solve_triangular(A, 0)`, and the two triangular solves of
    `jnp.linalg.solve(A, 0)`): `x` is the zero the right-hand side is, a `Zero`, as
    a zero annihilates a product. Inside `quax.zero.ieee_strict` the zero is solved
    as an array (a singular `A` then gives `nan`, as dense IEEE arithmetic does)."""
    if is_ieee_strict():
        solve = lambda a, b: lax.linalg.triangular_solve_p.bind(a, b, **params)
        return quax.quaxify(solve)(a, b.materialise())
    return Zero(b.shape, jnp.result_type(a.dtype, b.dtype))


@_register(lax.linalg.triangular_solve_p)
def _(a: Zero, b: StructuredMatrix, **params: Any) -> Any:
    del params
    raise ValueError(
        f"`triangular_solve` of a `{type(b).__name__}` right-hand side by a `Zero` "
        f"matrix (shape {a.shape}): the matrix is singular, the solve has no "
        "solution (dense arithmetic gives inf and nan). Solve by a nonsingular "
        "matrix."
    )


@_register(lax.linalg.cholesky_p)
def _(x: StructuredMatrix, **params: Any) -> Any:
    out = x.cholesky()
    return _fallback(lax.linalg.cholesky_p, [x], params) if out is None else out


@_register(lax.linalg.eig_p)
def _(
    x: StructuredMatrix,
    *,
    compute_left_eigenvectors: bool,
    compute_right_eigenvectors: bool,
    **params: Any,
) -> Any:
    """`jnp.linalg.eigvals`: the eigenvalues alone, where the structure knows them."""
    out = None
    if not (compute_left_eigenvectors or compute_right_eigenvectors):
        out = x.eigenvalues()
    if out is None:
        params = dict(
            compute_left_eigenvectors=compute_left_eigenvectors,
            compute_right_eigenvectors=compute_right_eigenvectors,
            **params,
        )
        return _fallback(lax.linalg.eig_p, [x], params)
    return [out]


@_register(lax.linalg.eigh_p)
def _(x: StructuredMatrix, *, subset_by_index: Any = None, **params: Any) -> Any:
    """`jnp.linalg.eigh`/`eigvalsh`: through the structure's eigendecomposition."""
    out = None
    if subset_by_index is None or tuple(subset_by_index) == (0, x.shape[-1]):
        out = x.eigh()
    if out is None:
        params = dict(subset_by_index=subset_by_index, **params)
        return _fallback(lax.linalg.eigh_p, [x], params)
    values, vectors = out
    return [vectors, values]


# Reading entries ----------------------------------------------------------------------


def _output_axes(ndim: int, indices: Any, dn: Any) -> list[int | None]:
    """For each operand axis of a gather, the output axis it runs along (a slice's
    offset axis, or the indices' batch axis of an operand batching axis), or
    `None` for an axis read at single points."""
    rank = jnp.ndim(indices) - 1 + len(dn.offset_dims)
    index_batch_axes = [a for a in range(rank) if a not in dn.offset_dims]
    offset = iter(dn.offset_dims)
    axes: list[int | None] = []
    for d in range(ndim):
        if d in dn.operand_batching_dims:
            k = dn.start_indices_batching_dims[dn.operand_batching_dims.index(d)]
            axes.append(index_batch_axes[k])
        elif d in dn.collapsed_slice_dims:
            axes.append(None)
        else:
            axes.append(next(offset))
    return axes


def _coordinates(shape: Any, indices: Any, dn: Any, slice_sizes: Any) -> list[Any]:
    """For each operand axis of a gather, the coordinate each output element reads
    along it: an integer array broadcastable to the output's shape. Starts are
    clamped so that each slice fits, as the `clip` and `promise_in_bounds` modes
    read them."""
    indices = jnp.asarray(indices)
    rank = indices.ndim - 1 + len(dn.offset_dims)
    index_batch_axes = [a for a in range(rank) if a not in dn.offset_dims]

    def along(values: Any, axes: list[int]) -> Any:
        """`values` (one axis per entry of `axes`, in order) on those output axes."""
        sizes = [1] * rank
        for a, n in zip(axes, values.shape, strict=True):
            sizes[a] = n
        return values.reshape(sizes)

    coords = []
    output_axes = _output_axes(len(shape), indices, dn)
    for d, (size, axis) in enumerate(zip(shape, output_axes, strict=True)):
        coord: Any = jnp.zeros((1,) * rank, jnp.int32)
        if d in dn.start_index_map:
            start = indices[..., dn.start_index_map.index(d)]
            start = jnp.clip(start, 0, size - slice_sizes[d])
            coord = along(start, index_batch_axes)
        if axis is not None:
            length = size if d in dn.operand_batching_dims else slice_sizes[d]
            coord = coord + along(jnp.arange(length), [axis])
        coords.append(coord)
    return coords


def _read_entries(x: StructuredMatrix, i: Any, j: Any) -> Any | None:
    """`x.entries(i, j)` for each matrix of the batch (`i`, `j` with `x`'s batch
    axes first), or `None` where the structure cannot read entries."""

    def read(m: StructuredMatrix, i: Any, j: Any) -> Any:
        return m.entries(i, j)

    for _ in range(x.ndim - 2):
        read = jax.vmap(read)
    return read(x, i, j)


def _gather_entries(x: StructuredMatrix, indices: Any, params: Any) -> Any | None:
    """A gather that reads entries of the two matrix axes (`jnp.diagonal`,
    `x[..., i, j]`, rows `x[..., idx, :]`, columns, and the same under `vmap`),
    through `x.entries`: O(1) work per entry read, never the dense matrix. Each
    batch axis must be read whole (a full slice, or a batching axis), and one of
    the matrix axes at single points; else `None`."""
    dn, slice_sizes = params["dimension_numbers"], params["slice_sizes"]
    nb = x.ndim - 2
    axes = _output_axes(x.ndim, indices, dn)
    whole = [
        axes[d] is not None
        and (d in dn.operand_batching_dims or slice_sizes[d] == x.shape[d])
        for d in range(nb)
    ]
    if (
        params["mode"] == lax.GatherScatterMode.FILL_OR_DROP
        or not all(whole)
        or min(slice_sizes[nb], slice_sizes[nb + 1]) > 1
    ):
        return None
    coords = _coordinates(x.shape, indices, dn, slice_sizes)
    out_shape = np.broadcast_shapes(*(np.shape(c) for c in coords))
    batch_axes = [int(a) for a in axes[:nb] if a is not None]
    i, j = (
        jnp.moveaxis(jnp.broadcast_to(c, out_shape), batch_axes, list(range(nb)))
        for c in coords[nb:]
    )

    out = _read_entries(x, i, j)
    return None if out is None else jnp.moveaxis(out, list(range(nb)), batch_axes)


@_register(prims.gather_p)
def _(x: StructuredMatrix, indices: ArrayLike, **params: Any) -> Any:
    out = _gather_entries(x, indices, params)
    if out is None:
        return _fallback(prims.gather_p, [x, indices], params)
    return out


def _slice_entries(
    x: StructuredMatrix, start: Any, limit: Any, strides: Any
) -> Any | None:
    """A `slice` that keeps every batch axis whole and reads at most `n` entries of
    each matrix (single entries, a row, a column: what `jnp.linalg.det` of a
    2 x 2 or 3 x 3 matrix and `slogdet` of a 2 x 2 one bind), through `x.entries`;
    else `None`."""
    strides = strides or (1,) * x.ndim
    nb, n = x.ndim - 2, x.shape[-1]
    whole = all(
        (start[d], limit[d], strides[d]) == (0, x.shape[d], 1) for d in range(nb)
    )
    rows, cols = (range(start[d], limit[d], strides[d]) for d in (nb, nb + 1))
    if not whole or len(rows) * len(cols) > n:
        return None
    i = jnp.broadcast_to(jnp.asarray(rows, jnp.int32)[:, None], (len(rows), len(cols)))
    j = jnp.broadcast_to(jnp.asarray(cols, jnp.int32)[None, :], (len(rows), len(cols)))
    batch = x.shape[:nb]
    return _read_entries(
        x,
        jnp.broadcast_to(i, (*batch, *i.shape)),
        jnp.broadcast_to(j, (*batch, *j.shape)),
    )


@_register(lax.slice_p)
def _(
    x: StructuredMatrix, *, start_indices: Any, limit_indices: Any, strides: Any
) -> Any:
    out = _slice_entries(x, start_indices, limit_indices, strides)
    if out is None:
        params = dict(
            start_indices=start_indices, limit_indices=limit_indices, strides=strides
        )
        return _fallback(lax.slice_p, [x], params)
    return out


@_register(lax.squeeze_p)
def _(x: StructuredMatrix, *, dimensions: Any) -> Any:
    """The entry of a 1 x 1 matrix (what `slogdet` of a 1 x 1 matrix binds)."""
    nb = x.ndim - 2
    out = None
    if x.shape[-2:] == (1, 1) and tuple(sorted(dimensions)) == (nb, nb + 1):
        zero = jnp.zeros(x.shape[:nb], jnp.int32)
        out = _read_entries(x, zero, zero)
    if out is None:
        return _fallback(lax.squeeze_p, [x], dict(dimensions=dimensions))
    return out


# The pivoted solve's second half (see `HalfSolved`) ---------------------------------


@_register(lax.linalg.triangular_solve_p)
def _(
    a: DeterminantLU,
    b: HalfSolved,
    *,
    left_side: bool,
    lower: bool,
    transpose_a: bool,
    conjugate_a: bool,
    unit_diagonal: bool,
) -> Array:
    """The second of `lu_solve`'s two triangular solves of a pivoted solve (see
    `HalfSolved`): the solution the first one computed; anything else refuses."""
    return a.second_half(
        b,
        left_side=left_side,
        lower=lower,
        transpose_a=transpose_a,
        conjugate_a=conjugate_a and jnp.issubdtype(a.dtype, jnp.complexfloating),
        unit_diagonal=unit_diagonal,
    )


@_register(lax.reshape_p)
def _(x: HalfSolved, *, new_sizes: Any, dimensions: Any, **params: Any) -> HalfSolved:
    """`lu_solve` reshapes between its two triangular solves: the first's
    `HalfSolved` stays one."""
    del params
    if dimensions is not None:
        raise StructuredMaterialisationError(
            "Refusing to materialise `HalfSolved` (primitive `reshape` with "
            f"`dimensions`): {x.way_out()}"
        )
    return x.reshaped(tuple(new_sizes))


# Decompositions and matrix functions (issue 29, item 6; see `_linalg.py`) -----------
#
# `svd` (and through it `jnp.linalg.lstsq`, `pinv`, `svdvals`), `qr`, `eigh` of
# the structures the generic `eigh` rule above leaves out, and
# `jax.scipy.linalg.expm`, intercepted at its nested `jit`. Every structure
# without an algorithm refuses (`StructuredMaterialisationError`, naming the way out).


@_register(lax.linalg.svd_p)
def _(
    x: StructuredMatrix,
    *,
    full_matrices: bool,
    compute_uv: bool,
    subset_by_index: Any = None,
    **params: Any,
) -> Any:
    """`jnp.linalg.svd`, `svdvals` (`compute_uv=False`), and the `svd` inside
    `jnp.linalg.lstsq` and `pinv`: through the structure (see `_linalg.svd_of`)."""
    out = None
    whole = (0, min(x.shape[-2:]))
    if subset_by_index is None or tuple(subset_by_index) == whole:
        out = svd_of(x, compute_uv)
    if out is None:
        params = dict(
            full_matrices=full_matrices,
            compute_uv=compute_uv,
            subset_by_index=subset_by_index,
            **params,
        )
        return _fallback(lax.linalg.svd_p, [x], params)
    return out


@_register(lax.linalg.qr_p)
def _(
    x: StructuredMatrix, *, pivoting: bool, full_matrices: bool, **params: Any
) -> Any:
    """`jnp.linalg.qr` (any mode: the matrices are square): structured factors
    where the structure has them (see `_linalg.qr_of`); column pivoting refuses."""
    out = None if pivoting else qr_of(x)
    if out is None:
        params = dict(pivoting=pivoting, full_matrices=full_matrices, **params)
        return _fallback(lax.linalg.qr_p, [x], params)
    return list(out)


@_register(lax.linalg.eigh_p)
def _(
    x: LowRank | KroneckerPlusIdentity | Sum,
    *,
    subset_by_index: Any = None,
    **params: Any,
) -> Any:
    """`jnp.linalg.eigh`/`eigvalsh` of a low-rank matrix (thin QR), of `A ⊗ B + c
    I` or of a Kronecker sum `A ⊗ I + I ⊗ B` (the factors' eigendecompositions):
    see `_linalg.eigh_of`."""
    out = None
    if subset_by_index is None or tuple(subset_by_index) == (0, x.shape[-1]):
        out = eigh_of(x)
    if out is None:
        params = dict(subset_by_index=subset_by_index, **params)
        return _fallback(lax.linalg.eigh_p, [x], params)
    values, vectors = out
    return [vectors, values]


# The static arguments of `jax.scipy.linalg.expm` its rule takes: both only steer
# JAX's Padé algorithm, which the structure's exponential does not use.
_EXPM_STATIC = {"upper_triangular": (True,), "max_squarings": tuple(range(65))}


@_register_function(jsl.expm, static=_EXPM_STATIC)
def _(
    x: StructuredMatrix,
    *,
    call: Any,
    upper_triangular: bool = False,
    max_squarings: int = 16,
) -> Any:
    """`jax.scipy.linalg.expm(M)`, whose body (a Padé approximant with scaling and
    squaring, `lax.cond`, `abs` for the 1-norm) would refuse at its first
    non-structured step: the exact matrix exponential through the structure (see
    `_linalg.expm_of`), or a refusal naming `expm` and the way out. Other
    functions' nested `jit`s of structured matrices go to quax's own rule for
    `jit`, which traces their bodies with the matrices kept structured.

    `upper_triangular` and `max_squarings` (static) steer JAX's algorithm: the
    structure's exponential is exact whatever they are, where JAX's gives NaN for a
    matrix needing more than `max_squarings` squarings, and reads only the upper
    triangle with `upper_triangular=True`. So `upper_triangular=True` is taken only
    for a `Diagonal` or `ScaledIdentity`, which are upper triangular; on another
    structure JAX's answer (from the upper triangle alone) is not the exponential
    the structure gives, and the call is refused rather than answered differently.
    The dense path (`call`) runs the body JAX traced with them."""
    if upper_triangular and not isinstance(x, Diagonal | ScaledIdentity):
        if x.allow_materialise:
            return call(x.materialise())
        raise ValueError(
            "`jax.scipy.linalg.expm(M, upper_triangular=True)` declares `M` upper "
            f"triangular, and a `{type(x).__name__}` is not one: JAX's expm would "
            "then read only the upper triangle, which is not the exponential of "
            f"the `{type(x).__name__}`. Drop `upper_triangular=True` for the "
            "exact exponential through the structure."
        )
    out = expm_of(x)
    if out is not None:
        return out
    if x.allow_materialise:
        # JAX's own dense path, on the dense matrix (its intermediate products
        # would otherwise be structures that may not densify).
        return call(x.materialise())
    raise StructuredMaterialisationError(
        f"Refusing to materialise `{type(x).__name__}` for "
        "`jax.scipy.linalg.expm` (a nested `jit` named `expm`): "
        "quax-structured computes the matrix exponential of "
        f"{', '.join(EXPM_TYPES)} (a `Kronecker` when it is "
        "symmetric or one factor is a constant multiple of the identity), "
        f"not of a `{type(x).__name__}`, and {x.refusal_reason()}. " + x.way_out(None)
    )


# `jnp.linalg.solve` of a structure that solves pivoted (issue 29, item 7) ------------


@_register_function(jnp.linalg.solve)
def _(
    a: TridiagonalMatrix | Banded | LowRankPlusDiagonal, b: ArrayLike, *, call: Any
) -> Any:
    """`jnp.linalg.solve(A, b)` for a matrix with `pivoted_solve`: that solve,
    called directly. The body would factor (`lu`, whose factors such a matrix
    does not solve with, see `HalfSolved`), gather `b` by the identity
    permutation and solve each column of a matrix `b` on its own (under `vmap`,
    so that `LowRankPlusDiagonal`'s backward-error check was batched and its LU
    fallback always ran): 0.3x to 0.4x of a hand-written Woodbury solve at
    n = 256 went to that plumbing. As the body, it is a `lax.custom_linear_solve`
    (derivatives: `x' = A⁻¹ (b' - A' x)` through `matmat` and the transposed
    solve, the solve itself not differentiated). Another shape or dtype (a batch
    of matrices, a `b` that promotes `A`'s dtype) runs the body."""
    b = jnp.asarray(b)
    n = a.shape[-1]
    if (
        len(a.shape) != 2
        or b.ndim not in (1, 2)
        or b.shape[0] != n
        or jnp.result_type(a.dtype, b.dtype) != a.dtype
    ):
        return call(a, b)
    b = b.astype(a.dtype)

    def as_columns(f: Any, x: Array) -> Array:
        return f(x if x.ndim == 2 else x[:, None]).reshape(x.shape)

    def solve(transpose: bool, _: Any, x: Array) -> Array:
        return as_columns(ft.partial(a.pivoted_solve, transpose=transpose), x)

    return lax.custom_linear_solve(
        ft.partial(as_columns, a.matmat),
        b,
        solve=ft.partial(solve, False),
        transpose_solve=ft.partial(solve, True),
    )


@_register_function(jnp.linalg.slogdet)
def _(a: LowRankPlusDiagonal, *, call: Any) -> Any:
    """`jnp.linalg.slogdet(A)` of a `LowRankPlusDiagonal`: `A.slogdet()`, which
    reads `A.pivots()` (the determinant lemma where Woodbury solves a probe
    system accurately) in one reduction, where the body reads them through
    `lu` and four reductions (see `LowRankPlusDiagonal.slogdet`). Derivatives
    follow the pivots' (as the body's do). A batch of matrices runs the body."""
    if len(a.shape) != 2:
        return call(a)
    return a.slogdet()


# `jnp.linalg.pinv` as a structure (issue 29, item 6; see `_linalg.pinv_of`) ----------


@_register_function(pinv_function, static={"hermitian": (True,)})
def _(x: StructuredMatrix, *rtol: Any, call: Any, hermitian: bool = False) -> Any:
    """`jnp.linalg.pinv(M)` (the `jit` inside its `custom_jvp`), whose body
    multiplies the dense singular vectors: the pseudo-inverse as a structure (see
    `_linalg.pinv_of`), with the derivative of the structure's algorithm (see
    `_linalg.pinv_jvp_rule`). Its arguments are the matrix and `rtol` where one is
    given; `hermitian` is static, received where it is `True` (the body then
    pseudo-inverts through `eigh`, not `svd`). Other structures run the body
    under the rules (through their `svd`, a dense result)."""
    out = pinv_of(x, rtol[0] if rtol else None, hermitian)
    return call(x, *rtol) if out is None else out
