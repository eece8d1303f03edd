"""`Kronecker` products of any number of factors, `A₁ ⊗ A₂ ⊗ ... ⊗ A_N`: products
through reshapes, LU and Cholesky through the factors; `KroneckerPlusIdentity`,
`A₁ ⊗ ... ⊗ A_N + σ² I` (a Gaussian process's covariance on a grid with its
noise), and `KroneckerPlusDiagonal`, `A₁ ⊗ ... ⊗ A_N + c D₁ ⊗ ... ⊗ D_N` (a
heteroscedastic noise on the grid), solved through the factors' (generalised)
eigendecompositions."""

import dataclasses
import functools as ft
from collections.abc import Sequence
from typing import Any, Literal

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array

from .._kernels import (
    factor_solve,
    failed_factorisation,
    kron_apply,
    kron_diagonal,
    kron_entries,
    nan_where,
    on_diagonal,
    shifted_kron_determinant,
    shifted_kron_log_determinant,
    shifted_kron_pivots,
    shifted_kron_solve,
)
from ._base import StructuredMaterialisationError, StructuredMatrix
from ._circulant import SolverLU
from ._determinant import DeterminantLU
from ._diagonal import Diagonal, ScaledIdentity


__all__ = [
    "Kronecker",
    "KroneckerEigenLU",
    "KroneckerLU",
    "KroneckerPlusDiagonal",
    "KroneckerPlusIdentity",
    "KroneckerSpectralLU",
]


def _symmetrised(a: Array) -> Array:
    return (a + a.T) / 2


def _outside_triangle(factor: Any, triangle: str) -> tuple[int, int] | None:
    """Where the concrete `factor` has an entry outside its promised `triangle`
    (`"lower"` or `"upper"`): the first position whose entry is more than
    `sqrt(eps)` of the factor's largest finite entry (rounding passes), or
    `None`. Non-finite entries are left to the computation (a NaN stays a NaN
    there)."""
    value = np.asarray(factor)
    outside = np.triu(value, 1) if triangle == "lower" else np.tril(value, -1)
    dtype = value.dtype if np.issubdtype(value.dtype, np.inexact) else np.float64
    finite = np.isfinite(value)
    size = np.max(np.abs(value), where=finite, initial=0.0)
    tolerance = float(np.sqrt(np.finfo(dtype).eps)) * size
    bad = np.isfinite(outside) & (np.abs(outside) > tolerance)
    if not bad.any():
        return None
    i, j = np.argwhere(bad)[0]
    return int(i), int(j)


def _checkable(
    factors: Sequence[Any], diagonal: Sequence[bool]
) -> list[tuple[int, Any]]:
    """The factors a constructor can check for the promise of a tag, with their
    positions: the concrete square arrays (not a diagonal, a `c I` or a traced
    factor, which are either kept by their structure or unknown until run time)."""
    return [
        (k, factor)
        for k, (factor, stored_diagonal) in enumerate(
            zip(factors, diagonal, strict=True)
        )
        if not stored_diagonal
        and not isinstance(factor, jax.core.Tracer | ScaledIdentity)
        and jnp.ndim(factor) == 2
    ]


def _check_triangle(
    factors: Sequence[Any], diagonal: Sequence[bool], triangle: str | None
) -> None:
    """Refuse a concrete factor with an entry outside the `triangle` it is
    promised to lie in. Triangular solves read each factor's triangle alone, and
    products the whole factor, so a false promise would make `solve_triangular`
    solve another matrix than the one `@` multiplies by. Traced factors (under
    `jit`, `grad`) cannot be checked; there the promise stands.

    **Arguments:**

    - `factors`: the stored factors of a `Kronecker`.
    - `diagonal`: which are stored as their diagonal (triangular already).
    - `triangle`: `"lower"`, `"upper"`, or `None` (no promise).

    **Returns:**

    Nothing; a `ValueError` naming the factor, the entry and the way out.
    """
    if triangle is None:
        return
    for k, factor in _checkable(factors, diagonal):
        at = _outside_triangle(factor, triangle)
        if at is not None:
            i, j = at
            raise ValueError(
                f"`Kronecker` was promised {triangle}-triangular factors "
                f"(`triangle={triangle!r}`), but `{_factor_name(factors, k)}[{i}, "
                f"{j}]` = {np.asarray(factor)[i, j].item():.6g} is outside that "
                "triangle: triangular solves would read the factor as its triangle "
                "alone, another matrix than the one given. Pass triangular factors "
                "(`jnp.tril` / `jnp.triu`), or leave `triangle` None."
            )


def _asymmetry(factor: Any, hermitian: bool) -> tuple[float, int, int] | None:
    """How far the concrete square `factor` is from its transpose (its conjugate
    transpose where `hermitian`): the largest `|A - Aᵀ|` relative to the factor's
    largest finite entry and where it is, or `None` when every finite difference
    is within `sqrt(eps)` of that entry (rounding passes). Non-finite entries are
    left to the computation."""
    value = np.asarray(factor)
    other = value.conj().T if hermitian else value.T
    dtype = value.dtype if np.issubdtype(value.dtype, np.inexact) else np.float64
    size = np.max(np.abs(value), where=np.isfinite(value), initial=0.0)
    with np.errstate(invalid="ignore"):
        difference = np.abs(value - other)
    difference = np.where(np.isfinite(difference), difference, 0.0)
    if not np.any(difference > float(np.sqrt(np.finfo(dtype).eps)) * size):
        return None
    i, j = np.unravel_index(np.argmax(difference), difference.shape)
    return float(difference[i, j] / size), int(i), int(j)


def _check_symmetric(
    factors: Sequence[Any],
    diagonal: Sequence[bool],
    symmetric: bool,
    positive_definite: bool,
) -> None:
    """Refuse a concrete factor that is not symmetric under `symmetric=True` (every
    product, solve and decomposition reads it as `(A + Aᵀ) / 2`), or not Hermitian
    under `positive_definite=True` (a Cholesky factorisation, lineax's among them,
    reads one triangle alone), since either would silently be another matrix than
    the one given. Traced factors (under `jit`, `grad`) cannot be checked; there
    `symmetric=True` reads them symmetrised, and `positive_definite` stands as
    promised.

    **Arguments:**

    - `factors`: the stored factors of a `Kronecker`.
    - `diagonal`: which are stored as their diagonal (symmetric already).
    - `symmetric`, `positive_definite`: the tags.

    **Returns:**

    Nothing; a `ValueError` naming the factor, its asymmetry and the way out.
    """
    if not (symmetric or positive_definite):
        return
    for k, factor in _checkable(factors, diagonal):
        # `symmetric` reads the transpose; `positive_definite` (when complex) the
        # conjugate transpose.
        hermitian = not symmetric
        found = _asymmetry(factor, hermitian)
        if found is None:
            continue
        relative, i, j = found
        name = _factor_name(factors, k)
        value = np.asarray(factor)
        tag = "symmetric=True" if symmetric else "positive_definite=True"
        kind = "Hermitian" if hermitian and np.iscomplexobj(value) else "symmetric"
        transpose = "A.conj().T" if kind == "Hermitian" else "A.T"
        reads = (
            "Every product, solve and decomposition would read it as `(A + Aᵀ) / 2`"
            if symmetric
            else "A Cholesky factorisation would read one triangle of it alone"
        )
        raise ValueError(
            f"`Kronecker` was tagged `{tag}`, but `{name}` is not {kind}: "
            f"`{name}[{i}, {j}]` = {value[i, j].item():.6g} and `{name}[{j}, {i}]` "
            f"= {value[j, i].item():.6g} (the largest |A - {transpose}| is "
            f"{relative:.3g} of its largest entry). {reads}, another "
            f"matrix than the one given. Pass a {kind} factor (`(A + {transpose}) "
            f"/ 2`), or drop `{tag}`."
        )


def _gather(
    name: str, positional: Sequence[Any], left: Any, right: Any, matrices: Any
) -> list[Any]:
    """The factors of a constructor call: positional, then `left`/`right` (the
    two-factor keywords of the published signature) around them, or `matrices`
    (the field, as `dataclasses.replace` passes it)."""
    factors = list(positional)
    if left is not None:
        factors.insert(0, left)
    if right is not None:
        factors.append(right)
    if matrices is not None:
        if factors:
            raise TypeError(
                f"`{name}` takes its factors either positionally (or as `left`, "
                "`right`) or as `matrices=`, not both."
            )
        factors = list(matrices)
    return factors


def _unbatched_factors(
    value: Any, field: str, shapes: Sequence[tuple[int, ...]], ndims: Sequence[int]
) -> None:
    """Refuse a structure without batch axes whose factor `field[k]` (of shape
    `shapes[k]`) has more axes than `ndims[k]`: a stack built by `jax.vmap` or
    `jax.tree.map` past the constructor's checks, which its `aval` would misread
    as one matrix."""
    for k, (shape, ndim) in enumerate(zip(shapes, ndims, strict=True)):
        if len(shape) != ndim:
            raise ValueError(
                f"`{type(value).__name__}` has no batch axes: `{field}[{k}]` must "
                f"have {ndim} axes, got shape {shape} (a stack of matrices, e.g. "
                "built by `jax.vmap` or `jax.tree.map`). Map over the stack outside "
                "the quaxified function instead: `jax.vmap(quax.quaxify(fn))`."
            )


def _stored(factor: Any) -> Array:
    """A stored factor as the kernels read it: an identity factor `c I` (a
    `ScaledIdentity`) as its diagonal, the others as they are."""
    if isinstance(factor, ScaledIdentity):
        scale = jnp.asarray(factor.scale)
        return jnp.broadcast_to(scale[..., None], _stored_shape(factor))
    return factor


def _stored_shape(factor: Any) -> tuple[int, ...]:
    """The shape of `_stored(factor)`, without computing it (as an `aval` must)."""
    if isinstance(factor, ScaledIdentity):
        return (*jnp.shape(factor.scale), factor.n)
    return jnp.shape(factor)


def _factor_name(factors: Sequence[Any], k: int) -> str:
    """How an error names factor `k`: `left`/`right` for two factors (the
    published fields), else `matrices[k]`."""
    return ("left", "right")[k] if len(factors) == 2 else f"matrices[{k}]"


def _check_square(name: str, factors: Sequence[Any]) -> None:
    for k, factor in enumerate(factors):
        shape = jnp.shape(factor)
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(
                f"`{name}` needs square 2-dimensional factors, got "
                f"`{_factor_name(factors, k)}` of shape {shape}."
            )


def _factor_property(field: str, k: int, name: str, doc: str) -> property:
    """A published two-factor field, `name`, read from the factors `field`: the
    first (`k = 0`), or the second (`k = 1`) only where there are exactly two."""

    def read(value: Any) -> Array:
        factors = getattr(value, field)
        if k == 1 and len(factors) != 2:
            raise AttributeError(
                f"`{type(value).__name__}.{name}` is the second of exactly two "
                f"factors; this one has {len(factors)}: read `.{field}` (all of them, "
                "in order)."
            )
        return factors[k]

    return property(read, doc=doc)


def _init_factors(
    value: Any,
    field: str,
    args: Sequence[Any],
    last: Any,
    *,
    left: Any = None,
    right: Any = None,
    matrices: Sequence[Array] | None = None,
    allow_materialise: bool = False,
    positive_definite: bool = False,
) -> None:
    """The constructor of a structure of factors and one more field, `field`
    (`scale`, `perm`): the factors positionally (or the published two-factor
    keywords `left=`, `right=`, or the field `matrices=`), `field` after them or
    as a keyword (`last`), and the tags."""
    name = type(value).__name__
    rest = list(args)
    if last is None:
        if not rest:
            raise TypeError(f"`{name}` needs `{field}`.")
        last = rest.pop()
    setattr(value, field, last)
    value.matrices = tuple(_gather(name, rest, left, right, matrices))
    value.allow_materialise = allow_materialise
    value.positive_definite = positive_definite


class _Factors(StructuredMatrix):
    """What the Kronecker structures share: an `(n, n)` matrix, `n = Π nᵢ`, built
    from square factors `matrices` (of sizes `nᵢ`) without batch axes, whose
    first two are readable as `left` and `right`, the published two-factor
    fields."""

    matrices: eqx.AbstractVar[tuple[Array, ...]]

    linear_in_leaves = False

    left = _factor_property(
        "matrices", 0, "left", "The first factor (the published field's name)."
    )
    right = _factor_property(
        "matrices",
        1,
        "right",
        "The second of exactly two factors (the published field's name).",
    )

    @property
    def sizes(self) -> tuple[int, ...]:
        """The factors' sizes `(n₁, ..., n_N)`."""
        return tuple(_stored_shape(m)[-1] for m in self.matrices)

    def _grid_aval(self, ndims: Sequence[int], *others: Any) -> jax.core.ShapedArray:
        """The `(n, n)` abstract value, of the factors' dtype promoted with
        `others`', after checking that factor `k` has `ndims[k]` axes (no batch)."""
        shapes = [_stored_shape(m) for m in self.matrices]
        _unbatched_factors(self, "matrices", shapes, ndims)
        n = 1
        for size in self.sizes:
            n *= size
        leaves = [
            m.scale if isinstance(m, ScaledIdentity) else m for m in self.matrices
        ]
        return jax.core.ShapedArray((n, n), jnp.result_type(*leaves, *others))


class Kronecker(_Factors):
    """`A₁ ⊗ A₂ ⊗ ... ⊗ A_N`, the Kronecker product of two or more square matrices
    (row-major, as `jnp.kron`; `Kronecker(A, B)` is `jnp.kron(A, B)`). Products
    cost O(n Σ nᵢ) through reshapes (`n = Π nᵢ`); `jnp.linalg.solve`, `det`,
    `slogdet`, `cholesky`, `eigh`, `svd`, `qr` go through the factors.

    `Kronecker(A, B, C)`, `Kronecker(Kronecker(A, B), C)` and `Kronecker(A,
    Kronecker(B, C))` are the same matrix with the same three factors (a
    `Kronecker` factor is spliced in). A `Diagonal` factor is kept as its diagonal:
    `Kronecker(Diagonal(d1), Diagonal(d2))` is a diagonal matrix stored in `n₁ +
    n₂` numbers, and a symmetric `Kronecker` plus it is a `KroneckerPlusDiagonal`.
    A `ScaledIdentity` factor `c I` is kept as it is, its scale and size: the
    structure itself knows that factor to be a multiple of the identity, also
    where its scale is traced (a `jit` argument), so that a sum of such products,
    the Kronecker sum `A ⊗ I + I ⊗ B`, has `jnp.linalg.eigh`, `svd` and
    `jax.scipy.linalg.expm` through its factors (write `Kronecker(a,
    ScaledIdentity(1.0, n))` rather than `Kronecker(a, jnp.eye(n))`, whose
    identity only a program that builds it shows).

    **Arguments:**

    - `*factors`: the square factors (arrays, `Kronecker`s, or `Diagonal`s /
        `ScaledIdentity`s without batch axes), in order. The published two-factor
        call `Kronecker(left, right, symmetric, triangle)` works as it did,
        positionally or with the keywords `left=` and `right=`.
    - `symmetric`, `triangle`, `allow_materialise`, `positive_definite`: the fields
        below (keyword or, for the first two, after the factors).

    **Fields:**

    - `matrices`: the factors in order: `(nᵢ, nᵢ)` arrays, or, where
        `diagonal[i]`, `(nᵢ,)` diagonals or `ScaledIdentity`s (one matrix each).
        `left` is `matrices[0]` and `right` `matrices[1]` (for two factors), as
        the published fields.
    - `diagonal`: which factors are stored as their diagonal (static).
    - `symmetric`: whether every factor is symmetric (static; a property tag that
        `jnp.linalg.cholesky` needs, as it symmetrises its input first). A
        concrete factor that is not symmetric (beyond `sqrt(eps)` of its largest
        entry) is refused; a traced one (under `jit`, `grad`) cannot be checked,
        and is read as `(A + Aᵀ) / 2` everywhere, the product included, so that
        the matrix is `kron` of the symmetrised factors.
    - `positive_definite`: a promise (static) that the matrix is positive
        definite, read by Cholesky factorisations (lineax's, through
        `to_lineax`), which read one triangle alone: a concrete factor that is not
        symmetric (Hermitian, when complex) is refused; a traced one is taken as
        promised.
    - `triangle`: `"lower"` or `"upper"` when every factor is triangular (static;
        set on Cholesky factors), else `None`.
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    matrices: tuple[Array, ...]
    diagonal: tuple[bool, ...] = eqx.field(static=True)
    symmetric: bool = eqx.field(default=False, static=True)
    triangle: Literal["lower", "upper"] | None = eqx.field(default=None, static=True)

    def __init__(
        self,
        *factors: Any,
        left: Any = None,
        right: Any = None,
        matrices: Sequence[Array] | None = None,
        diagonal: Sequence[bool] | None = None,
        symmetric: bool = False,
        triangle: Literal["lower", "upper"] | None = None,
        allow_materialise: bool = False,
        positive_definite: bool = False,
    ):
        args = list(factors)
        options = []
        while args and (isinstance(args[-1], bool | str) or args[-1] is None):
            options.insert(0, args.pop())
        if options:
            # The published positional form `Kronecker(left, right, symmetric,
            # triangle)`.
            if len(options) > 2 or not isinstance(options[0], bool):
                raise TypeError(
                    "`Kronecker` takes its factors positionally, then optionally "
                    "`symmetric` (a bool) and `triangle` (`'lower'`, `'upper'` or "
                    f"`None`); got the trailing arguments {options!r}."
                )
            symmetric = options[0]
            if len(options) == 2:
                triangle = options[1]
        flags = None if diagonal is None else list(diagonal)
        gathered = _gather("Kronecker", args, left, right, matrices)
        if flags is not None and len(flags) != len(gathered):
            raise ValueError(
                f"`Kronecker` got `diagonal` with {len(flags)} entries for "
                f"{len(gathered)} factors: give one per factor (True where the "
                "factor is given as its diagonal, a vector), or leave it out."
            )
        stored, is_diagonal = [], []
        for k, factor in enumerate(gathered):
            if isinstance(factor, Kronecker):
                stored.extend(
                    m if isinstance(m, ScaledIdentity) else operand
                    for m, operand in zip(
                        factor.matrices, factor._operands(), strict=True
                    )
                )
                is_diagonal.extend(factor.diagonal)
            elif isinstance(factor, ScaledIdentity | Diagonal):
                # A diagonal is stored as its vector, `c I` as it is.
                kept = factor.diag if isinstance(factor, Diagonal) else factor
                if len(_stored_shape(kept)) != 1:
                    raise ValueError(
                        f"`Kronecker` needs square factors without batch axes; factor "
                        f"{k} is a `{type(factor).__name__}` with batch axes (shape "
                        f"{factor.shape}). Map over the batch outside the quaxified "
                        "function: `jax.vmap(quax.quaxify(fn))`."
                    )
                stored.append(kept)
                is_diagonal.append(True)
            elif isinstance(factor, StructuredMatrix):
                raise ValueError(
                    f"`Kronecker` factors are arrays, `Kronecker`s, `Diagonal`s or "
                    f"`ScaledIdentity`s; factor {k} is a `{type(factor).__name__}`. "
                    "Pass its dense array (`.enable_materialise().dense()`, O(nᵢ²) "
                    "for a factor of size nᵢ)."
                )
            else:
                flag = False if flags is None else bool(flags[k])
                if flag and np.ndim(factor) != 1:
                    raise ValueError(
                        f"`Kronecker` got `diagonal[{k}]=True`, which stores factor "
                        f"{k} as its diagonal (a vector), but the factor has shape "
                        f"{np.shape(factor)}. Pass its diagonal (`jnp.diagonal`) "
                        f"where the factor is diagonal, or `diagonal[{k}]=False`."
                    )
                stored.append(factor)
                is_diagonal.append(flag)
        self.matrices = tuple(stored)
        self.diagonal = tuple(is_diagonal)
        self.symmetric = symmetric
        self.triangle = triangle
        self.allow_materialise = allow_materialise
        self.positive_definite = positive_definite

    def __check_init__(self):
        if len(self.matrices) < 2:
            raise ValueError(
                "`Kronecker` needs two or more factors (one factor is the matrix "
                f"itself); got {len(self.matrices)}."
            )
        shapes = [_stored_shape(factor) for factor in self.matrices]
        ndims = [1 if diagonal else 2 for diagonal in self.diagonal]
        if any(len(s) > n for s, n in zip(shapes, ndims, strict=True)):
            # A stack built past the constructor (`jax.tree.map`): the way out is
            # `jax.vmap` over it.
            _unbatched_factors(self, "matrices", shapes, ndims)
        for k, (factor, diagonal) in enumerate(
            zip(self.matrices, self.diagonal, strict=True)
        ):
            shape = _stored_shape(factor)
            if diagonal and len(shape) != 1:
                raise ValueError(
                    f"`Kronecker` stores a diagonal factor as its diagonal (1 axis); "
                    f"`matrices[{k}]` has shape {shape}."
                )
            if not diagonal and (len(shape) != 2 or shape[0] != shape[1]):
                raise ValueError(
                    "`Kronecker` needs square 2-dimensional factors, got "
                    f"`{_factor_name(self.matrices, k)}` of shape {shape}."
                )
        _check_triangle(self.matrices, self.diagonal, self.triangle)
        _check_symmetric(
            self.matrices, self.diagonal, self.symmetric, self.positive_definite
        )

    def aval(self) -> jax.core.ShapedArray:
        return self._grid_aval([1 if d else 2 for d in self.diagonal])

    def _operands(self) -> tuple[Array, ...]:
        """The factors as the kernels read them: diagonal ones as their diagonal,
        the others symmetrised, `(a + aᵀ) / 2`, when `symmetric`."""
        return tuple(
            m if d or not self.symmetric else _symmetrised(m)
            for m, d in zip(self._arrays(), self.diagonal, strict=True)
        )

    def _arrays(self) -> tuple[Array, ...]:
        """The stored factors, an identity factor as its diagonal."""
        return tuple(_stored(m) for m in self.matrices)

    def identity_scales(self) -> tuple[Array | None, ...]:
        """For each factor, its scale `c` where it is stored as `c I` (a
        `ScaledIdentity` factor), else `None`."""
        return tuple(
            m.scale if isinstance(m, ScaledIdentity) else None for m in self.matrices
        )

    def factors(self) -> tuple[Array, ...]:
        """The factors as square arrays; symmetrised, `(a + aᵀ) / 2`, when
        `symmetric`, so that the matrix is symmetric whatever its leaves hold (and
        under `grad`); a diagonal factor as its `(nᵢ, nᵢ)` diagonal matrix."""
        return tuple(jnp.diag(m) if m.ndim == 1 else m for m in self._operands())

    def dense(self) -> Array:
        # `aval` first: it refuses factors with batch axes, a stack that
        # `jax.vmap(quax.quaxify(fn))` returns (its leaves stacked past the
        # constructor), where `jnp.kron` of the stacked factors would give a
        # wrong array without a word (`(9, 4, 4)` for a stack of three 4 x 4).
        self.aval()
        return ft.reduce(jnp.kron, self.factors())

    def _with(self, matrices: Sequence[Array], **kw: Any) -> "Kronecker":
        fields = dict(
            diagonal=tuple(
                isinstance(m, ScaledIdentity) or jnp.ndim(m) == 1 for m in matrices
            ),
            symmetric=self.symmetric,
            triangle=self.triangle,
            allow_materialise=self.allow_materialise,
        )
        return Kronecker(matrices=tuple(matrices), **{**fields, **kw})

    def transpose(self) -> "Kronecker":
        if self.symmetric:
            return self
        flipped = {"lower": "upper", "upper": "lower", None: None}[self.triangle]
        return self._with(
            [
                m if d else m.T
                for m, d in zip(self.matrices, self.diagonal, strict=True)
            ],
            triangle=flipped,
        )

    def scaled(self, s: Array) -> "Kronecker":
        first = self.matrices[0]
        if isinstance(first, ScaledIdentity):
            first = ScaledIdentity(first.scale * s, first.n)
        else:
            first = first * s
        return self._with((first, *self.matrices[1:]))

    def add(self, other: StructuredMatrix) -> StructuredMatrix | None:
        """`A₁ ⊗ ... ⊗ A_N + c I` for real factors and a `ScaledIdentity` `c I`
        (one matrix, no batch): a `KroneckerPlusIdentity`; plus a `Kronecker` of
        diagonals of the same sizes, `D₁ ⊗ ... ⊗ D_N`: a `KroneckerPlusDiagonal`;
        both solved through the factors' (generalised) eigendecompositions, and
        symmetric where this is (`symmetric=True`), else reading the factors as
        given (see `KroneckerSpectralLU`). A `Kronecker` of diagonals plus `c I`
        or plus another: a `Diagonal`."""
        if all(self.diagonal):
            diagonal = kron_diagonal(self._arrays())
            if isinstance(other, ScaledIdentity) and jnp.ndim(other.scale) == 0:
                diagonal = diagonal + other.scale
            elif isinstance(other, Kronecker) and all(other.diagonal):
                if other.shape != self.shape:
                    return None
                diagonal = diagonal + kron_diagonal(other._arrays())
            else:
                return None
            return Diagonal(diagonal, allow_materialise=self.allow_materialise)
        if self.triangle is not None:
            return None
        if any(jnp.iscomplexobj(m) for m in self._arrays()):
            # The eigendecomposition routes are real: a complex symmetric factor
            # has no orthogonal eigendecomposition (the sum stays a lazy `Sum`).
            return None
        tags = dict(
            allow_materialise=self.allow_materialise,
            positive_definite=self.positive_definite and other.positive_definite,
            symmetric=self.symmetric,
        )
        if isinstance(other, ScaledIdentity):
            if jnp.ndim(other.scale) != 0 or jnp.iscomplexobj(other.scale):
                return None
            return KroneckerPlusIdentity(
                matrices=self.factors(), scale=other.scale, **tags
            )
        if isinstance(other, Kronecker) and all(other.diagonal):
            if other.sizes != self.sizes:
                return None
            if any(jnp.iscomplexobj(d) for d in other._arrays()):
                return None
            return KroneckerPlusDiagonal(self.factors(), other._arrays(), **tags)
        return None

    def matmat(self, x: Array) -> Array:
        return kron_apply(self._operands(), x)

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        return kron_entries(
            self._operands(), jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        )

    def product(self, other: StructuredMatrix) -> "Kronecker | None":
        """`self @ other` for a Kronecker `other` with factors of the same sizes:
        the factors' products (two diagonals: their product, still a diagonal)."""
        if not isinstance(other, Kronecker) or other.sizes != self.sizes:
            return None
        out = []
        for a, b in zip(self._operands(), other._operands(), strict=True):
            if a.ndim == 1 and b.ndim == 1:
                out.append(a * b)
            elif a.ndim == 1:
                out.append(a[:, None] * b)
            elif b.ndim == 1:
                out.append(a * b[None, :])
            else:
                out.append(a @ b)
        return Kronecker(
            matrices=out,
            diagonal=tuple(m.ndim == 1 for m in out),
            allow_materialise=self.allow_materialise,
        )

    def lu(self) -> DeterminantLU:
        """The factors' LUs with partial pivoting (LAPACK), `Pᵢ Aᵢ = Lᵢ Uᵢ`, as one
        `KroneckerLU` that applies the row permutation `P₁ ⊗ ... ⊗ P_N` itself (in
        its unit lower solve), so that `lu` returns the identity pivots: LAPACK's
        row swaps of the n-permutation (what `slogdet` would read its sign from)
        take a sequential scan over n, which made `slogdet` about 27x a
        hand-written one through the factors at n = 1,024. The diagonal (what
        `slogdet`/`det` read) is `U₁ ⊗ ... ⊗ U_N`'s, its first entry signed by
        the permutation's parity, `Πᵢ sign(Pᵢ)^(n / nᵢ)`."""
        factors = self.factors()
        n = self.shape[-1]
        lus, perm, odd = [], None, 0

        def parity(swaps: Array) -> Array:
            return jnp.sum(swaps != jnp.arange(swaps.shape[0], dtype=swaps.dtype)) % 2

        for factor in factors:
            packed, swaps, rows = lax.linalg.lu(factor)
            size = factor.shape[0]
            lus.append(packed)
            perm = rows if perm is None else (perm[:, None] * size + rows).reshape(-1)
            odd = odd + parity(swaps) * ((n // size) % 2)
        sign = jnp.where(odd % 2 == 1, -1, 1)
        pivots = kron_diagonal([jnp.diagonal(m) for m in lus])
        pivots = pivots.at[0].multiply(sign.astype(pivots.dtype))
        lu = KroneckerLU(
            matrices=lus, perm=perm, allow_materialise=self.allow_materialise
        )
        return DeterminantLU(lu, self, pivots=pivots)

    def determinant(self) -> Array:
        """`Πᵢ det(Aᵢ)^(n / nᵢ)`, through `jnp.linalg.det` of the factors (whose
        derivative is exact at a factor of rank nᵢ - 1)."""
        n = self.shape[-1]
        terms = [jnp.linalg.det(f) ** (n // f.shape[0]) for f in self.factors()]
        return ft.reduce(jnp.multiply, terms)

    def cholesky(self) -> "Kronecker | None":
        if not self.symmetric:
            return None
        factors = [lax.linalg.cholesky(f) for f in self.factors()]
        # As dense JAX: where the matrix is not positive definite (a factor is
        # not), the whole lower triangle of its factor is NaN.
        failed = ft.reduce(
            jnp.logical_or, [failed_factorisation(jnp.diagonal(f)) for f in factors]
        )
        return Kronecker(
            *(jnp.tril(nan_where(failed, f)) for f in factors),
            triangle="lower",
            allow_materialise=self.allow_materialise,
        )

    def eigh(self) -> tuple[Array, Array] | None:
        """With the `symmetric` tag: through the factors' eigendecompositions,
        `O(Σ nᵢ³)`, plus O(n²) for the eigenvector matrix (the output)."""
        if not self.symmetric:
            return None
        decompositions = [jnp.linalg.eigh(f) for f in self.factors()]
        values = kron_diagonal([w for w, _ in decompositions])
        order = jnp.argsort(values)
        vectors = ft.reduce(jnp.kron, [q for _, q in decompositions])
        return values[order], vectors[:, order]

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array | None:
        if self.triangle is None:
            return None
        if (self.triangle == "lower") == lower:
            if unit_diagonal:
                return None
            return factor_solve(
                self.factors(), b, lower=lower, transpose_a=transpose_a, unit=False
            )
        # The other triangle of a triangular Kronecker product is its diagonal.
        if unit_diagonal:
            return b
        diag = kron_diagonal([jnp.diagonal(f) for f in self.factors()])
        return b / diag[:, None]


class KroneckerLU(_Factors):
    """The packed LU factors of a `Kronecker` product's factors, `Pᵢ Aᵢ = Lᵢ Uᵢ`:
    `L = L₁ ⊗ ... ⊗ L_N` (unit diagonal) and `U = U₁ ⊗ ... ⊗ U_N`, with the row
    permutation `P = P₁ ⊗ ... ⊗ P_N` applied by the unit lower solve (`L y = P
    b`; transposed, `x = Pᵀ L⁻ᵀ c`), so that `lu` returns the identity pivots and
    `jnp.linalg.solve`'s two triangular solves (and `lu_solve(trans=1)`'s) solve
    with the matrix. Its diagonal is `U`'s; its other entries read as NaN (as a
    packed LU matrix with the identity pivots they would be wrong: `L` without
    `P`), and it never materialises.

    **Fields:**

    - `matrices`: the packed LU factors of the factors (`left`, `right`: the first
        two, as the published fields; `KroneckerLU(left, right, perm)` works).
    - `perm`: the row permutation `P` of the product, as `lax.linalg.lu`'s
        permutation output (`A[perm] = L U`).
    - `allow_materialise`: as for [`quax_structured.TridiagonalMatrix`][] (static).
    """

    conjugates_leafwise = False

    matrices: tuple[Array, ...]
    perm: Array

    def __init__(self, *args: Any, perm: Array | None = None, **kw: Any):
        _init_factors(self, "perm", args, perm, **kw)

    def __check_init__(self):
        _check_square("KroneckerLU", self.matrices)

    def aval(self) -> jax.core.ShapedArray:
        return self._grid_aval([2] * len(self.matrices))

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        upper = kron_entries([jnp.triu(m) for m in self.matrices], i, j)
        return jnp.where(i == j, upper, jnp.nan)

    def dense(self) -> Array:
        raise StructuredMaterialisationError(
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
            self.matrices,
            b,
            lower=lower,
            transpose_a=transpose_a,
            unit=unit_diagonal,
        )
        if lower and transpose_a:
            x = jnp.zeros_like(x).at[self.perm].set(x)
        return x


class _KroneckerPencil(_Factors):
    """What `KroneckerPlusIdentity` and `KroneckerPlusDiagonal` share: `M = A₁ ⊗
    ... ⊗ A_N + c D₁ ⊗ ... ⊗ D_N` for symmetric `Aᵢ` (symmetrised wherever read),
    positive diagonal `Dᵢ` (the identity for `KroneckerPlusIdentity`) and a scalar
    `c`. With `W = D^(-1/2)` (a Kronecker product of diagonals, `Wᵢ = Dᵢ^(-1/2)`)
    and the eigendecompositions `Wᵢ Aᵢ Wᵢ = Qᵢ Λᵢ Qᵢᵀ`, `M = W⁻¹ (Q (Λ + c) Qᵀ)
    W⁻¹` with `Q = ⊗ Qᵢ`, `Λ = ⊗ Λᵢ`, so that `M⁻¹ = V (Λ + c)⁻¹ Vᵀ` for `V = ⊗
    (Wᵢ Qᵢ)` and `det M = Π (λ + c) Π D`. `jnp.linalg.solve`, `slogdet` and `det`
    cost the factors' eigendecompositions, O(Σ nᵢ³), and O(n Σ nᵢ) per right-hand
    side, for `n = Π nᵢ`; products cost O(n Σ nᵢ). No `(n, n)` array is formed.
    A diagonal that is not positive gives NaN (never a wrong number).

    With `symmetric=False` (what a `Kronecker` without the `symmetric` tag gives)
    the factors are read as given, and `solve`, `slogdet` and `det` go through
    `Wᵢ Aᵢ Wᵢ`'s eigendecompositions chosen when the program runs: `eigh` where
    every factor is symmetric up to rounding, else the general `eig` (checked,
    NaN on TPU): see `KroneckerSpectralLU`."""

    matrices: eqx.AbstractVar[tuple[Array, ...]]
    scale: eqx.AbstractVar[Array]
    symmetric: eqx.AbstractVar[bool]

    def _diagonals(self) -> tuple[Array, ...] | None:
        """`(D₁, ..., D_N)` as vectors; `None` for the identity."""
        raise NotImplementedError

    def factors(self) -> tuple[Array, ...]:
        """The factors `Aᵢ`, symmetrised where `symmetric`, else as given."""
        if not self.symmetric:
            return tuple(self.matrices)
        return tuple(_symmetrised(m) for m in self.matrices)

    def _reduced(self) -> tuple[list[Array], Array, Array | None]:
        """`M = W⁻¹ (⊗ Wᵢ Aᵢ Wᵢ + c I) W⁻¹` with `W = ⊗ Wᵢ`, `Wᵢ = Dᵢ^(-1/2)`:
        the factors `Wᵢ Aᵢ Wᵢ`, `c` (of the matrix's dtype), and `W`'s diagonal
        (`None` for the identity)."""
        factors = list(self.factors())
        scale = jnp.asarray(self.scale, self.dtype)
        diagonals = self._diagonals()
        if diagonals is None:
            return factors, scale, None
        weights = [1 / jnp.sqrt(d) for d in diagonals]
        reduced = [
            w[:, None] * f * w[None, :] for f, w in zip(factors, weights, strict=True)
        ]
        return reduced, scale, kron_diagonal(weights).astype(self.dtype)

    def spectral_solve(self, b: Array, transpose: bool) -> Array:
        """`M⁻¹ b` (`M⁻ᵀ b` where `transpose`) for `b` of shape `(n, k)`, through
        `shifted_kron_solve` (the route for factors not known to be symmetric)."""
        factors, scale, weight = self._reduced()
        if transpose:
            factors = [f.T for f in factors]
        if weight is None:
            return shifted_kron_solve(factors, scale, b)
        return weight[:, None] * shifted_kron_solve(factors, scale, weight[:, None] * b)

    def spectral_pivots(self) -> Array:
        """Numbers whose product is `det M`, through `shifted_kron_pivots`."""
        factors, scale, _ = self._reduced()
        pivots = shifted_kron_pivots(factors, scale)
        diagonals = self._diagonals()
        if diagonals is not None:
            pivots = pivots * kron_diagonal(diagonals).astype(self.dtype)
        return pivots

    def _diagonal_determinant(self) -> Array:
        """`det D = Πᵢ det(Dᵢ)^(n / nᵢ)` (one for the identity)."""
        det = jnp.ones((), self.dtype)
        diagonals = self._diagonals()
        if diagonals is not None:
            n = self.shape[-1]
            for d in diagonals:
                det = det * jnp.prod(d) ** (n // d.shape[0])
        return det

    def _check_fields(self) -> None:
        name = type(self).__name__
        if len(self.matrices) < 2:
            raise ValueError(
                f"`{name}` needs two or more factors; got {len(self.matrices)}."
            )
        _check_square(name, self.matrices)
        if jnp.ndim(self.scale) != 0:
            raise ValueError(
                f"`{name}` needs a scalar `scale`; got `scale` of shape "
                f"{jnp.shape(self.scale)}."
            )
        named = [
            (_factor_name(self.matrices, k), m) for k, m in enumerate(self.matrices)
        ]
        named += [(f"diagonals[{k}]", d) for k, d in enumerate(self._diagonals() or ())]
        for field, leaf in [*named, ("scale", self.scale)]:
            if jnp.iscomplexobj(leaf):
                raise ValueError(
                    f"`{name}` needs real factors, diagonals and `scale`; got a "
                    f"complex `{field}`. Its solve diagonalises the factors with "
                    "orthogonal eigenvectors, which a complex symmetric factor does "
                    "not have: write the sum of a `Kronecker` and the other term "
                    "without the `symmetric` tag instead (a lazy `Sum`, solved with "
                    "`jax.scipy.sparse.linalg.gmres`)."
                )

    def aval(self) -> jax.core.ShapedArray:
        diagonals = self._diagonals() or ()
        return self._grid_aval([2] * len(self.matrices), *diagonals, self.scale)

    def _noise(self) -> Array:
        """The diagonal `c D₁ ⊗ ... ⊗ D_N`, shape `(n,)`."""
        diagonals = self._diagonals()
        n = self.shape[-1]
        if diagonals is None:
            return jnp.full((n,), self.scale, self.dtype)
        return (self.scale * kron_diagonal(diagonals)).astype(self.dtype)

    def dense(self) -> Array:
        product = ft.reduce(jnp.kron, self.factors()).astype(self.dtype)
        return product + on_diagonal(self._noise())

    def transpose(self) -> "_KroneckerPencil":
        if self.symmetric:
            return self
        return dataclasses.replace(self, matrices=tuple(m.T for m in self.matrices))

    def matmat(self, x: Array) -> Array:
        return kron_apply(self.factors(), x) + self._noise()[:, None] * x

    def entries(self, i: Array, j: Array) -> Array:
        n = self.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        noise = jnp.where(i == j, self._noise()[i], jnp.zeros((), self.dtype))
        return kron_entries(self.factors(), i, j) + noise

    def _eigendecompositions(self) -> tuple[list[Array], list[Array]]:
        """The eigenvalues `Λᵢ` of `Wᵢ Aᵢ Wᵢ` and the matrices `Wᵢ Qᵢ`."""
        factors = self.factors()
        diagonals = self._diagonals()
        if diagonals is None:
            pairs = [jnp.linalg.eigh(f) for f in factors]
            return [w for w, _ in pairs], [q for _, q in pairs]
        values, vectors = [], []
        for factor, d in zip(factors, diagonals, strict=True):
            weight = 1 / jnp.sqrt(d)
            w, q = jnp.linalg.eigh(weight[:, None] * factor * weight[None, :])
            values.append(w)
            vectors.append(weight[:, None] * q)
        return values, vectors

    def _pencil_values(self, values: Sequence[Array]) -> Array:
        """`λ + c` for the products `λ` of the factors' eigenvalues."""
        return (kron_diagonal(values) + self.scale).astype(self.dtype)

    def _diagonal_log_determinant(self) -> Array:
        """`log det D = Σᵢ (n / nᵢ) Σ log Dᵢ` (zero for the identity)."""
        diagonals = self._diagonals()
        if diagonals is None:
            return jnp.zeros((), self.dtype)
        n = self.shape[-1]
        terms = [(n // d.shape[0]) * jnp.sum(jnp.log(d)) for d in diagonals]
        return ft.reduce(jnp.add, terms).astype(self.dtype)

    def lu(self) -> DeterminantLU:
        """Not LU factors: a `KroneckerEigenLU`, the factors' (generalised)
        eigendecompositions, which `jnp.linalg.solve`'s two triangular solves use
        as one solve, and whose diagonal holds numbers whose product is the
        determinant (`slogdet`, `det`); without `symmetric`, a
        `KroneckerSpectralLU` (the same, decided when the program runs)."""
        if not self.symmetric:
            spectral = KroneckerSpectralLU(
                self, allow_materialise=self.allow_materialise
            )
            return DeterminantLU(spectral, self)
        values, vectors = self._eigendecompositions()
        solver = KroneckerEigenLU(
            self,
            tuple(values),
            tuple(vectors),
            allow_materialise=self.allow_materialise,
        )
        return DeterminantLU(solver, self)

    def log_determinant(self) -> tuple[Array, Array]:
        """`Σ log |λ + c| + log det D` and the sign of the product, through the
        factors' eigenvalues (differentiable: `slogdet`'s derivative is theirs;
        eigenvalues only, never the eigenvectors' derivative). Without
        `symmetric`: `shifted_kron_log_determinant` (its derivative `tr(M⁻¹
        dM)`, written out)."""
        if not self.symmetric:
            factors, scale, _ = self._reduced()
            sign, logdet = shifted_kron_log_determinant(factors, scale)
            return sign, logdet + self._diagonal_log_determinant()
        values, _ = self._eigendecompositions()
        w = self._pencil_values(values)
        logdet = jnp.sum(jnp.log(jnp.abs(w))) + self._diagonal_log_determinant()
        return jnp.prod(jnp.sign(w)), logdet

    def determinant(self) -> Array:
        if not self.symmetric:
            factors, scale, _ = self._reduced()
            det = shifted_kron_determinant(factors, scale)
        else:
            values, _ = self._eigendecompositions()
            det = jnp.prod(self._pencil_values(values))
        return det * self._diagonal_determinant()


class KroneckerPlusIdentity(_KroneckerPencil):
    """`A₁ ⊗ ... ⊗ A_N + scale · I` for symmetric factors `Aᵢ` (size `nᵢ`): the
    covariance of a Gaussian process on a grid (a product kernel) plus its noise,
    as `K + noise * jnp.eye(n)` or `K + ScaledIdentity(noise, n)` builds it from a
    symmetric `Kronecker` `K`. With `Aᵢ = Qᵢ Λᵢ Qᵢᵀ`, it is `Q (Λ + scale) Qᵀ`
    (`Q = ⊗ Qᵢ`, `Λ = ⊗ Λᵢ`): `jnp.linalg.solve`, `slogdet` and `det` cost the
    factors' eigendecompositions, O(Σ nᵢ³), and O(n Σ nᵢ) per right-hand side, for
    `n = Π nᵢ`; products cost O(n Σ nᵢ). No `(n, n)` array is formed.

    **Arguments:** `KroneckerPlusIdentity(A₁, ..., A_N, scale)` (the published
    `KroneckerPlusIdentity(left, right, scale)` works as it did), or the factors
    positionally and `scale=` as a keyword.

    **Fields:**

    - `matrices`: the factors `Aᵢ`, symmetrised (`(a + aᵀ) / 2`) wherever they
        are read (`left`, `right`: the first two, as the published fields).
    - `scale`: a scalar.
    - `symmetric`: whether the factors are symmetric (static, default `True`).
        `False` (what `K + c I` gives for a `Kronecker` `K` without the
        `symmetric` tag): the factors are read as given, not symmetrised, and
        `solve`, `slogdet`, `det` choose their eigendecompositions when the
        program runs (see `KroneckerSpectralLU`); `eigh` and `eigvals` refuse.
    - `allow_materialise`, `positive_definite`: as for every structure (static).
    """

    matrices: tuple[Array, ...]
    scale: Array
    symmetric: bool = eqx.field(default=True, static=True)

    def __init__(
        self,
        *args: Any,
        scale: Array | None = None,
        symmetric: bool = True,
        **kw: Any,
    ):
        self.symmetric = symmetric
        _init_factors(self, "scale", args, scale, **kw)

    def __check_init__(self):
        self._check_fields()

    def _diagonals(self) -> None:
        return None

    def _with(self, matrices: Sequence[Array], scale: Array) -> "KroneckerPlusIdentity":
        return KroneckerPlusIdentity(
            matrices=matrices,
            scale=scale,
            symmetric=self.symmetric,
            allow_materialise=self.allow_materialise,
        )

    def scaled(self, s: Array) -> "KroneckerPlusIdentity":
        return self._with((self.matrices[0] * s, *self.matrices[1:]), self.scale * s)

    def add(self, other: StructuredMatrix) -> "KroneckerPlusIdentity | None":
        if isinstance(other, ScaledIdentity) and jnp.ndim(other.scale) == 0:
            return self._with(self.matrices, self.scale + other.scale)
        return None

    def eigenvalues(self) -> Array | None:
        """`Π λᵢ + scale` (real), in the factors' order (`symmetric` only)."""
        if not self.symmetric:
            return None
        values, _ = self._eigendecompositions()
        return self._pencil_values(values)

    def eigh(self) -> tuple[Array, Array] | None:
        """The eigenvalues (ascending) and the eigenvectors `⊗ Qᵢ` (the dense
        `(n, n)` output), through the factors' eigendecompositions (`symmetric`
        only)."""
        if not self.symmetric:
            return None
        values, vectors = self._eigendecompositions()
        order = jnp.argsort(self._pencil_values(values))
        dense = ft.reduce(jnp.kron, vectors).astype(self.dtype)
        return self._pencil_values(values)[order], dense[:, order]


class KroneckerPlusDiagonal(_KroneckerPencil):
    """`A₁ ⊗ ... ⊗ A_N + scale · D₁ ⊗ ... ⊗ D_N` for symmetric factors `Aᵢ` and
    positive diagonals `Dᵢ` (of the same sizes `nᵢ`): a Gaussian process on a grid
    with a heteroscedastic noise whose variance is a product over the grid's axes,
    as `Kronecker(A, B, symmetric=True) + Kronecker(Diagonal(d1), Diagonal(d2))`
    builds it. Through the generalised eigendecompositions `Dᵢ^(-1/2) Aᵢ
    Dᵢ^(-1/2) = Qᵢ Λᵢ Qᵢᵀ`: `jnp.linalg.solve`, `slogdet` and `det` cost O(Σ nᵢ³)
    and O(n Σ nᵢ) per right-hand side; products cost O(n Σ nᵢ). No `(n, n)` array
    is formed. A diagonal entry that is not positive gives NaN.

    **Fields:**

    - `matrices`: the factors `Aᵢ` (symmetrised, `(a + aᵀ) / 2`, wherever read).
    - `diagonals`: the diagonals `Dᵢ`, vectors of shape `(nᵢ,)`.
    - `scale`: a scalar (1 by default).
    - `symmetric`: as for `KroneckerPlusIdentity` (static, default `True`;
        `False`: the factors read as given, solved through `Wᵢ Aᵢ Wᵢ`, `Wᵢ =
        Dᵢ^(-1/2)`, see `KroneckerSpectralLU`).
    - `allow_materialise`, `positive_definite`: as for every structure (static).
    """

    matrices: tuple[Array, ...] = eqx.field(converter=tuple)
    diagonals: tuple[Array, ...] = eqx.field(converter=tuple)
    scale: Array | float = 1.0
    symmetric: bool = eqx.field(default=True, static=True, kw_only=True)

    def __check_init__(self):
        self._check_fields()
        if len(self.diagonals) != len(self.matrices) or any(
            jnp.shape(d) != (size,)
            for d, size in zip(self.diagonals, self.sizes, strict=False)
        ):
            raise ValueError(
                "`KroneckerPlusDiagonal` needs one diagonal (a vector) per factor, "
                f"of the factor's size {self.sizes}; got shapes "
                f"{[jnp.shape(d) for d in self.diagonals]}."
            )

    def _diagonals(self) -> tuple[Array, ...]:
        return self.diagonals

    def scaled(self, s: Array) -> "KroneckerPlusDiagonal":
        return KroneckerPlusDiagonal(
            (self.matrices[0] * s, *self.matrices[1:]),
            self.diagonals,
            self.scale * s,
            symmetric=self.symmetric,
            allow_materialise=self.allow_materialise,
        )


class KroneckerEigenLU(SolverLU):
    """`lax.linalg.lu` of a `KroneckerPlusIdentity` or `KroneckerPlusDiagonal`
    (see `SolverLU`): the factors' (generalised) eigendecompositions. Its solve is
    `V (Λ + c)⁻¹ Vᵀ b` with `V = ⊗ Vᵢ`, O(n Σ nᵢ) per column (the matrix is
    symmetric: the transposed solve is the same); its pivots are `(λ + c) D`,
    whose product is the determinant.

    **Fields:**

    - `matrix`: the factored matrix.
    - `values`: the eigenvalues `Λᵢ` of each factor (`wa`, `wb` for two factors,
        as the published fields).
    - `vectors`: `Vᵢ = Dᵢ^(-1/2) Qᵢ` (for `KroneckerPlusIdentity`, the
        eigenvectors `Qᵢ`; `qa`, `qb` for two factors).
    """

    matrix: "_KroneckerPencil"
    values: tuple[Array, ...]
    vectors: tuple[Array, ...]

    wa = _factor_property("values", 0, "wa", "The first factor's eigenvalues.")
    wb = _factor_property("values", 1, "wb", "The second of two factors' eigenvalues.")
    qa = _factor_property("vectors", 0, "qa", "The first factor's `V₁`.")
    qb = _factor_property("vectors", 1, "qb", "The second of two factors' `V₂`.")

    def __check_init__(self):
        self._check_factored(_KroneckerPencil)
        sizes = self.matrix.sizes
        shapes = [jnp.shape(w) for w in self.values]
        vector_shapes = [jnp.shape(v) for v in self.vectors]
        if shapes != [(size,) for size in sizes] or vector_shapes != [
            (size, size) for size in sizes
        ]:
            raise ValueError(
                "`KroneckerEigenLU` needs, for each factor of its matrix (of sizes "
                f"{sizes}), the eigenvalues `values[k]` of shape (nₖ,) and the "
                f"vectors `vectors[k]` of shape (nₖ, nₖ), in the factors' order; "
                f"got `values` of shapes {shapes} and `vectors` of shapes "
                f"{vector_shapes}."
            )
        for k, (w, v) in enumerate(zip(self.values, self.vectors, strict=True)):
            dtypes = (jnp.result_type(w), jnp.result_type(v))
            if dtypes[0] != dtypes[1] or not jnp.issubdtype(dtypes[0], jnp.floating):
                raise ValueError(
                    "`KroneckerEigenLU` needs the real eigendecomposition of each "
                    "factor: `values[k]` and `vectors[k]` of one real floating "
                    f"dtype; got {dtypes[0]} and {dtypes[1]} for factor {k}."
                )

    def _eigenvalues(self) -> Array:
        return self.matrix._pencil_values(self.values)

    def pivots(self) -> Array:
        diagonals = self.matrix._diagonals()
        pivots = self._eigenvalues()
        if diagonals is not None:
            pivots = pivots * kron_diagonal(diagonals).astype(self.dtype)
        return pivots

    def solve(self, b: Array, transpose: bool) -> Array:
        del transpose  # symmetric
        rotated = kron_apply([v.T for v in self.vectors], b)
        return kron_apply(self.vectors, rotated / self._eigenvalues()[:, None])


class KroneckerSpectralLU(SolverLU):
    """`lax.linalg.lu` of a `KroneckerPlusIdentity` or `KroneckerPlusDiagonal`
    whose factors are not known to be symmetric (`symmetric=False`, see
    `SolverLU`): its solve and pivots go through the eigendecompositions of the
    factors `Wᵢ Aᵢ Wᵢ` (`Wᵢ = Dᵢ^(-1/2)`, the identity for
    `KroneckerPlusIdentity`), chosen when the program runs: `eigh` where every
    factor is symmetric up to rounding (`|A - Aᵀ| ≤ nᵢ eps max |A|`), else the
    general `eig` (complex eigenvectors, the solve checked by its backward
    error, NaN above `1024 eps`; NaN on TPU, which has no `eig`). O(Σ nᵢ³) for
    the factors and O(n Σ nᵢ) per column; derivatives written out, never
    through the eigenvectors (see `_kernels/_shifted_kronecker.py`).

    **Fields:**

    - `matrix`: the factored matrix.
    """

    matrix: "_KroneckerPencil"

    def __check_init__(self):
        self._check_factored(_KroneckerPencil)

    def pivots(self) -> Array:
        return self.matrix.spectral_pivots()

    def solve(self, b: Array, transpose: bool) -> Array:
        return self.matrix.spectral_solve(b, transpose)
