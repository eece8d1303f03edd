"""The base of every structured matrix: materialisation policy and refusals."""

import dataclasses
import functools as ft
import operator
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import quax
from jaxtyping import Array


__all__ = [
    "FUNCTION_JVP_RULES",
    "StructuredMaterialisationError",
    "StructuredMatrix",
    "empty_as_dense",
    "holds_no_entries",
    "is_size",
    "sequence_as_array",
    "unbatched",
]


def is_size(x: Any) -> bool:
    """Whether `x` is a non-negative integer (a Python or NumPy int, not a bool): a
    valid matrix size or bandwidth."""
    if isinstance(x, bool | np.bool_):
        return False
    try:
        return operator.index(x) >= 0
    except TypeError:
        return False


# JVP rules for custom-JVP functions by name, which modules that the structures do
# not import add (`_linalg` adds `jnp.linalg.pinv`'s, `"_pinv"`): each takes the
# function (on values) and the structured input, and returns a rule or `None`
# (see `StructuredMatrix.custom_jvp_rule`).
FUNCTION_JVP_RULES: dict[str, Callable[[Any, Any], Any]] = {}


def sequence_as_array(x: Any) -> Any:
    """A list or tuple of numbers or arrays (what `jnp.asarray` stacks) as an
    array, as the constructors of NumPy and lineax accept one; anything else as
    it is (an array, a tracer, or what the constructor's checks reject)."""
    return jnp.asarray(x) if isinstance(x, list | tuple) else x


def unbatched(value: Any, field: str, ndim: int) -> None:
    """Refuse a structure without batch axes (`LowRank`, `LowRankPlusDiagonal`,
    `Kronecker`, ...) whose leaf `field` has more than `ndim` axes: a stack built
    by `jax.vmap` or `jax.tree.map` past the constructor's checks, which its
    `aval` would misread as one matrix."""
    shape = jnp.shape(getattr(value, field))
    if len(shape) != ndim:
        raise ValueError(
            f"`{type(value).__name__}` has no batch axes: `{field}` must have "
            f"{ndim} axes, got shape {shape} (a stack of matrices, e.g. built by "
            "`jax.vmap` or `jax.tree.map`). Map over the stack outside the "
            "quaxified function instead: `jax.vmap(quax.quaxify(fn))`."
        )


def _is_float(leaf: Array) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def jvp_over_leaves(fn: Callable[[Any], Any], x: Any, dot: Any) -> tuple[Any, Any]:
    """`jax.jvp` of `fn(x)` over the floating-point leaves of `x` (a pytree), in
    the direction of `dot`'s (the same structure); other leaves stay fixed."""
    leaves, treedef = jtu.tree_flatten(x)
    dots = jtu.tree_leaves(dot)
    floats = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]

    def of(float_leaves: list[Array]) -> Any:
        full = list(leaves)
        for i, leaf in zip(floats, float_leaves, strict=True):
            full[i] = leaf
        return fn(jtu.tree_unflatten(treedef, full))

    primals = [leaves[i] for i in floats]
    return jax.jvp(of, (primals,), ([dots[i] for i in floats],))


def _lu_pivots(m: Any) -> tuple[Array, Array | None]:
    """The pivots of `m.lu()` (numbers whose product is `det m` up to the sign of
    the row swaps) and whether the swaps are odd (`None`: no swaps). Nothing else
    of the factors is computed: the derivative of an unused factor can be NaN
    where a pivot is zero, which reverse mode would spread."""
    out = m.lu()
    if not isinstance(out, tuple):
        return out.main_diagonal(), None
    factors, swaps = out[0], out[1]
    iota = jnp.arange(swaps.shape[-1], dtype=swaps.dtype)
    return factors.main_diagonal(), jnp.sum(swaps != iota, axis=-1) % 2 == 1


def _pivot_product(m: Any) -> Array:
    """`det m` as the signed product of `lu`'s pivots (no division beyond the
    factorisation's)."""
    pivots, odd = _lu_pivots(m)
    det = jnp.prod(pivots, axis=-1)
    return det if odd is None else jnp.where(odd, -det, det)


def _log_pivot_product(m: Any) -> tuple[Array, Array]:
    """`(sign, log |det m|)` from `lu`'s pivots, as `jnp.linalg.slogdet` reads
    them."""
    pivots, odd = _lu_pivots(m)
    size = jnp.abs(pivots)
    unit = pivots / jnp.where(size > 0, size, 1).astype(pivots.dtype)
    sign = jnp.prod(unit, axis=-1)
    if odd is not None:
        sign = jnp.where(odd, -sign, sign)
    return sign, jnp.sum(jnp.log(size), axis=-1)


def _det_rule(fun: Any, primals: list[Any], tangents: list[Any]) -> tuple:
    """The JVP of `jnp.linalg.det`: the derivative of the structure's
    `determinant`, else of the product of `lu`'s pivots."""
    (m,), (dot,) = primals, tangents
    (det,) = fun(m)
    if holds_no_entries(m):
        # No entry, so nothing the determinant depends on (1 for `n = 0`).
        return [det], [jnp.zeros_like(det)]
    own = type(m).determinant is not StructuredMatrix.determinant
    of = (lambda x: x.determinant()) if own else _pivot_product
    derivative = jvp_over_leaves(of, m, dot)[1]
    return [det], [derivative.astype(det.dtype)]


def _slogdet_rule(fun: Any, primals: list[Any], tangents: list[Any]) -> tuple:
    """The JVP of `jnp.linalg.slogdet`: the derivative of the structure's
    `log_determinant`, else of the logs of `lu`'s pivots. At a singular matrix
    (`log |det| = -inf`) the derivative is NaN, as dense JAX's is."""
    (m,), (dot,) = primals, tangents
    sign, logdet = fun(m)
    if holds_no_entries(m):
        return [sign, logdet], [jnp.zeros_like(sign), jnp.zeros_like(logdet)]
    own = type(m).log_determinant is not StructuredMatrix.log_determinant
    of = (lambda x: x.log_determinant()) if own else _log_pivot_product
    _, (sign_dot, logdet_dot) = jvp_over_leaves(of, m, dot)
    singular = jnp.where(jnp.isneginf(logdet), jnp.nan, 1).astype(logdet.dtype)
    return [sign, logdet], [sign_dot.astype(sign.dtype), logdet_dot * singular]


class StructuredMaterialisationError(quax.MaterialisationError):
    """A structured matrix with `allow_materialise=False` met an operation that has
    no structured rule and would need its dense `(n, n)` array."""


class StructuredMatrix(quax.GuardedValue):
    """A square matrix (with leading batch axes) stored by its structure.

    Subclasses store their leaves, implement `dense()` (the dense array, used only
    when materialising is allowed), `aval()`, and the structured operations the
    rules call (`matmat`, `transpose`, ...). The materialisation policy is
    `quax.GuardedValue`'s: the keyword-only static field `allow_materialise`
    (default `False`), `enable_materialise()`, and a refusal naming the primitive
    (a `quax_structured.StructuredMaterialisationError`) for every operation without a
    rule, unless `allow_materialise=True`.
    """

    # A property tag: the user's declaration that the matrix (each one of the batch)
    # is symmetric positive definite. Not checked, as lineax's
    # `positive_semidefinite_tag`; the rules keep it where it stays true (transpose,
    # sums of tagged matrices, positive scalar multiples) and drop it elsewhere.
    positive_definite: bool = eqx.field(default=False, static=True, kw_only=True)
    # Whether the dense array is a linear function of the float leaves.
    linear_in_leaves: ClassVar[bool] = True
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        StructuredMaterialisationError
    )
    # Whether the dense array is a polynomial in the leaves with real coefficients
    # (entries placed, summed, multiplied), so that conjugating every leaf
    # conjugates the matrix. False for the factor types the rules return (solvers
    # whose leaves are not the matrix's entries).
    conjugates_leafwise: ClassVar[bool] = True
    # Whether every leaf carries the matrix's batch axes first (the types with
    # batch axes), so that broadcasting each leaf broadcasts the batch.
    batch_leading: ClassVar[bool] = False

    @property
    def symmetric(self) -> bool:
        """Whether the matrix is known to be symmetric: by its structure, or by the
        `positive_definite` tag."""
        return self.positive_definite

    def with_tags(self, *, positive_definite: bool) -> "StructuredMatrix":
        """A copy of this matrix with the `positive_definite` tag set as given."""
        return dataclasses.replace(self, positive_definite=positive_definite)

    # The structured operations the rules call. Each returns `None` where the
    # structure has no algorithm for it; the rule then refuses (see `default`).

    def transpose(self) -> "StructuredMatrix | None":
        """The transposed matrix (of each matrix in the batch)."""
        return None

    def map_leaves(self, fn: Callable[[Array], Array]) -> "StructuredMatrix | None":
        """The matrix with `fn` applied to every leaf (types linear in their leaves)."""
        return None

    def conjugate(self, dtype: Any) -> "StructuredMatrix | None":
        """The complex conjugate (`jnp.conj`) in the complex `dtype`: every
        floating-point leaf converted to `dtype` and conjugated. The structure and
        the `positive_definite` tag are kept (the conjugate of a Hermitian positive
        definite matrix is one). `None` for the factor types (see
        `conjugates_leafwise`)."""
        if not type(self).conjugates_leafwise:
            return None

        def conj(leaf: Any) -> Any:
            if not _is_float(leaf):
                return leaf
            return jnp.conj(jnp.asarray(leaf).astype(dtype))

        return jtu.tree_map(conj, self)

    def broadcast_batch(self, batch: tuple[int, ...]) -> "StructuredMatrix | None":
        """This matrix (without batch axes) repeated over the batch axes `batch`:
        each leaf broadcast, no copy under `jit`; `None` where the structure has
        no batch axes (see `batch_leading`)."""
        if self.ndim != 2 or not self.batches():
            return None
        grow = lambda leaf: jnp.broadcast_to(leaf, (*batch, *jnp.shape(leaf)))
        return jtu.tree_map(grow, self)

    def batches(self) -> bool:
        """Whether this matrix can carry batch axes (see `batch_leading`)."""
        return type(self).batch_leading

    def scaled(self, s: Array) -> "StructuredMatrix | None":
        """`s * self` for a scalar `s`."""
        if type(self).linear_in_leaves:
            return self.map_leaves(lambda leaf: leaf * s)
        return None

    def matmat(self, x: Array) -> Array | None:
        """`self @ x` for `x` of shape `(*batch, n, k)`."""
        return None

    def entries(self, i: Array, j: Array) -> Array | None:
        """The entries `self[i, j]` for integer arrays `i`, `j` (no batch axes)."""
        return None

    def main_diagonal(self) -> Array:
        """The main diagonal, shape `(*batch, n)`, through `entries`."""
        index = jnp.arange(self.shape[-1])

        def read(m: StructuredMatrix) -> Array:
            out = m.entries(index, index)
            assert out is not None
            return out

        for _ in range(self.ndim - 2):
            read = jax.vmap(read)
        return read(self)

    def masked(self, y: Array, *, select: bool = False) -> "StructuredMatrix | None":
        """`self * y` (elementwise) for a dense `y` of the full shape, keeping the
        structure's pattern of zeros (as `jax.experimental.sparse` multiplies: an
        entry of `y` outside the pattern is never read, so an infinite or NaN one
        there gives zero, not NaN). With `select`, `jnp.where(y != 0, self, 0)`
        instead: the stored entries where `y` is nonzero are kept as they are (a
        NaN where `y` is zero is dropped, not multiplied by zero into NaN)."""
        return None

    def add(self, other: "StructuredMatrix") -> "StructuredMatrix | None":
        """`self + other`, keeping a structure."""
        return None

    def add_diagonal(self, d: Array) -> "StructuredMatrix | None":
        """`self + diag(d)`, keeping a structure."""
        return None

    def row_scaled(self, d: Array) -> "StructuredMatrix | None":
        """`diag(d) @ self`, keeping the structure. By default `self * d[:, None]`
        through `masked` (scaling rows keeps every pattern of zeros), which reads
        a broadcast `(n, n)` array of scales: the structures stored in less
        override it."""
        return self._masked_by(d[..., :, None])

    def col_scaled(self, d: Array) -> "StructuredMatrix | None":
        """`self @ diag(d)`, keeping the structure; by default through `masked`, as
        `row_scaled`."""
        return self._masked_by(d[..., None, :])

    def _masked_by(self, scales: Array) -> "StructuredMatrix | None":
        shape = jnp.broadcast_shapes(scales.shape, self.shape)
        if shape != self.shape:
            return None
        return self.masked(jnp.broadcast_to(scales, shape).astype(self.dtype))

    def product(self, other: "StructuredMatrix") -> "StructuredMatrix | None":
        """`self @ other`, keeping a structure."""
        return None

    def lu(self) -> Any:
        """The packed LU factors as `lax.linalg.lu` defines them: a structured
        matrix (no pivoting), or `(factors, pivots, permutation)`."""
        return None

    def cholesky(self) -> "StructuredMatrix | None":
        """The lower Cholesky factor, read from the lower triangle."""
        return None

    def eigenvalues(self) -> Array | None:
        """The eigenvalues (complex, in any order, as `jnp.linalg.eigvals` returns
        them)."""
        return None

    def eigh(self) -> tuple[Array, Array] | None:
        """The eigenvalues in ascending order and the orthonormal eigenvectors (as
        columns, a dense `(n, n)` array: the output `jnp.linalg.eigh` asks for) of
        this matrix, which `jnp.linalg.eigh` has made symmetric."""
        return None

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        """Solve `op(A) x = b` for `b` of shape `(*batch, n, k)`, with `A` the lower
        (`lower=True`) or upper triangle of this matrix and `op` a transpose when
        `transpose_a`; a unit diagonal replaces `A`'s when `unit_diagonal`."""
        return None

    def determinant(self) -> Array:
        """The determinant by a formula without division (a polynomial in the
        leaves, e.g. the product of a diagonal), where the structure overrides
        this method: `jnp.linalg.det`'s derivative is this formula's, exact at
        singular matrices (the adjugate, not zero, at rank n - 1). Without it,
        the derivative is that of the product of `lu`'s pivots: exact where no
        pivot but the last is zero, NaN where one is."""
        raise NotImplementedError

    def log_determinant(self) -> tuple[Array, Array]:
        """The sign and the log of the absolute value of the determinant by the
        structure's own algorithm, differentiable, where the structure overrides
        this method: `jnp.linalg.slogdet`'s derivative is this algorithm's.
        Without it, the derivative is that of the logs of `lu`'s pivots."""
        raise NotImplementedError

    @staticmethod
    def custom_jvp_rule(name: str, fun: Any, values: Any) -> Any:
        """`jnp.linalg.slogdet` and `det` (JAX's `_slogdet_lu` and `_det`) of a
        structure that factors (`lu`), and `jnp.linalg.pinv` (`_pinv`) of one
        that `_linalg.pinv_of` pseudo-inverts, take their derivative from the
        structure's own algorithm (see `quax.Value.custom_jvp_rule`), in its
        cost, rather than from JAX's rules, which work on the whole `(n, n)`
        tangent."""
        if len(values) != 1 or not isinstance(values[0], StructuredMatrix):
            return None
        if name in FUNCTION_JVP_RULES:
            return FUNCTION_JVP_RULES[name](fun, values[0])
        if type(values[0]).lu is StructuredMatrix.lu:
            return None
        if name == "_slogdet_lu":
            return ft.partial(_slogdet_rule, fun)
        if name == "_det":
            return ft.partial(_det_rule, fun)
        return None

    def tangent(self, dot: "StructuredMatrix") -> Array:
        """The dense tangent of `dense()` for the leaves' tangents in `dot` (see
        `quax.Value.tangent`): what custom derivatives receive beside the matrix
        itself, which stays structured. It costs O(n²) memory; `slogdet` and
        `det` never build it (see `custom_jvp_rule`)."""
        return jvp_over_leaves(lambda x: x.dense(), self, dot)[1]

    def way_out(self, primitive: Any = None) -> str:
        """The base's way out; for `add`/`sub` (the only way a structure meets a
        dense operand there) also how to add a diagonal that stays structured."""
        way_out = super().way_out(primitive)
        if primitive is None or primitive.name not in ("add", "sub"):
            return way_out
        return (
            "A dense operand stays structured only where the program shows it to "
            "be a scalar (a literal or traced) times a constant with no entry off "
            "the diagonal (`0.1 * jnp.eye(n)`, `noise * jnp.eye(n)`; not an array "
            "that is an argument of `jax.jit`, nor one computed from one, nor a "
            "noise batched by `jax.vmap`, nor a traced noise inside "
            "`quax.zero.ieee_strict`): write it "
            "`quax_structured.ScaledIdentity(noise, n)` (or `Diagonal(d)`), which "
            "any traced `noise` keeps structured (a symmetric `Kronecker` plus it is "
            "a `KroneckerPlusIdentity`). Or: " + way_out
        )

    def refusal_reason(self) -> str:
        """Why the matrix refuses to densify: the cost of its dense array."""
        return f"the dense array (shape {self.shape}) costs O(n^2) memory"

    def aval(self) -> jax.core.ShapedArray:
        raise NotImplementedError


def holds_no_entries(x: Any) -> bool:
    """Whether `x` is a structured matrix with a 0 in its shape (`n = 0`, or a
    batch of no matrices): it has no entries, so its dense array is an empty
    array of its shape and dtype, which costs nothing to form."""
    # `type(x).aval(x)`, not `x.aval()`: reading a method off an Equinox module
    # builds a bound-method pytree (tens of µs), and this runs before every rule.
    return isinstance(x, StructuredMatrix) and 0 in type(x).aval(x).shape


def empty_as_dense(values: Any) -> list[Any]:
    """`values` with each structured matrix that holds no entries replaced by its
    dense array (`jnp.zeros` of its shape and dtype: there are no entries to
    place).

    The rules compute such a matrix densely (`_rules.py`'s `_register`),
    whatever `allow_materialise` says: the structures' algorithms index rows, divide by
    `n` and transform over it, which `n = 0` breaks (an FFT of length 0, a
    first row that is not there, a Kronecker factor's size of 0 in a modulo),
    while dense JAX answers every operation on an empty matrix (`slogdet` is
    `(1, 0)`, a solve is empty), and forming the dense array saves nothing to
    refuse for. The results are then plain (empty) arrays, not structures. A
    primitive without a rule refuses as for any matrix (`quax.GuardedValue`'s
    `default`, which every guarded family shares: one type overriding it would
    leave quax no fallback for a structure beside another family's value)."""
    out = []
    for x in values:
        if holds_no_entries(x):
            aval = x.aval()
            x = jnp.zeros(aval.shape, aval.dtype)
        out.append(x)
    return out
