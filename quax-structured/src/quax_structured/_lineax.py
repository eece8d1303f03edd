"""Conversion to and from lineax operators (lineax is imported only here, lazily)."""

from typing import Any

import jax.numpy as jnp

from ._values._base import StructuredMatrix
from ._values._diagonal import Diagonal, ScaledIdentity
from ._values._triangular import LowerTriangular, UpperTriangular
from ._values._tridiagonal import TridiagonalMatrix


__all__ = ["from_lineax", "to_lineax"]


def to_lineax(matrix: StructuredMatrix, tags: Any = ()) -> Any:
    """A lineax operator for an unbatched structured matrix.

    `TridiagonalMatrix` becomes a `lineax.TridiagonalLinearOperator`, `Diagonal` a
    `lineax.DiagonalLinearOperator`, `ScaledIdentity` a scaled
    `lineax.IdentityLinearOperator`; every other structure a
    `lineax.FunctionLinearOperator` whose matrix-vector product is the structure's
    own. The tags carry over: `lineax.symmetric_tag` where the structure is known
    symmetric, `lineax.positive_semidefinite_tag` where it is tagged
    `positive_definite` (lineax's `CG` and `Cholesky` need it), wrapping the first
    three in a `lineax.TaggedLinearOperator`.

    **Arguments:**

    - `matrix`: a structured matrix without batch axes.
    - `tags`: extra lineax tags for a `FunctionLinearOperator` (e.g.
        `lineax.positive_semidefinite_tag`, which `lineax.CG` needs).

    **Returns:**

    A `lineax.AbstractLinearOperator`.
    """
    import jax
    import lineax as lx

    if matrix.ndim != 2:
        raise ValueError(
            f"to_lineax needs an unbatched matrix, got shape {matrix.shape}: convert "
            "each matrix of the batch (e.g. under jax.vmap)."
        )
    tags = list(tags)
    if matrix.symmetric:
        tags.append(lx.symmetric_tag)
    if matrix.positive_definite:
        tags.append(lx.positive_semidefinite_tag)
    own = None
    if isinstance(matrix, TridiagonalMatrix):
        own = lx.TridiagonalLinearOperator(
            matrix.main_diag, matrix.lower_diag, matrix.upper_diag
        )
    elif isinstance(matrix, Diagonal):
        own = lx.DiagonalLinearOperator(matrix.diag)
    elif isinstance(matrix, ScaledIdentity):
        structure = jax.ShapeDtypeStruct((matrix.n,), matrix.dtype)
        own = matrix.scale * lx.IdentityLinearOperator(structure)
    if own is not None:
        return lx.TaggedLinearOperator(own, tuple(tags)) if tags else own
    if isinstance(matrix, LowerTriangular):
        tags.append(lx.lower_triangular_tag)
    if isinstance(matrix, UpperTriangular):
        tags.append(lx.upper_triangular_tag)
    structure = jax.ShapeDtypeStruct((matrix.shape[-1],), matrix.dtype)
    if matrix.matmat(jnp.zeros((matrix.shape[-1], 1), matrix.dtype)) is None:
        raise TypeError(f"to_lineax: `{type(matrix).__name__}` has no product.")

    def matvec(v: Any) -> Any:
        out = matrix.matmat(v[:, None])
        assert out is not None
        return out[:, 0]

    return lx.FunctionLinearOperator(matvec, structure, tags)


def from_lineax(operator: Any) -> StructuredMatrix:
    """The structured matrix of a lineax operator that has one.

    `TridiagonalLinearOperator` -> `TridiagonalMatrix`, `DiagonalLinearOperator` ->
    `Diagonal`, `IdentityLinearOperator` -> `ScaledIdentity`, a
    `MatrixLinearOperator` tagged lower (upper) triangular -> `LowerTriangular`
    (`UpperTriangular`).

    **Arguments:**

    - `operator`: a `lineax.AbstractLinearOperator`.

    **Returns:**

    A structured matrix (with `allow_materialise=False`), tagged
    `positive_definite` when lineax tags the operator positive semidefinite (a
    `lineax.TaggedLinearOperator` around one of the above is unwrapped).

    **Raises:**

    `TypeError` for an operator without a structure here (e.g. a
    `FunctionLinearOperator`, whose matrix only its function knows).
    """
    import lineax as lx

    # lineax's positive semidefinite tag is what its Cholesky solver asks for: read
    # as the `positive_definite` tag.
    tag = dict(positive_definite=lx.is_positive_semidefinite(operator))
    if isinstance(operator, lx.TaggedLinearOperator):
        operator = operator.operator
    if isinstance(operator, lx.TridiagonalLinearOperator):
        return TridiagonalMatrix(
            operator.lower_diagonal, operator.diagonal, operator.upper_diagonal, **tag
        )
    if isinstance(operator, lx.DiagonalLinearOperator):
        return Diagonal(lx.diagonal(operator), **tag)
    if isinstance(operator, lx.IdentityLinearOperator):
        n = operator.in_size()
        dtype = operator.in_structure().dtype
        return ScaledIdentity(jnp.ones((), dtype), n, **tag)
    if isinstance(operator, lx.MatrixLinearOperator):
        if lx.is_lower_triangular(operator):
            return LowerTriangular(operator.as_matrix(), **tag)
        if lx.is_upper_triangular(operator):
            return UpperTriangular(operator.as_matrix(), **tag)
    raise TypeError(
        f"from_lineax: no structured matrix for a {type(operator).__name__}; "
        "quax_structured converts tridiagonal, diagonal, identity and "
        "triangular-tagged matrix operators."
    )
