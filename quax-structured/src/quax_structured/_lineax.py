"""Conversion to and from lineax operators (lineax is imported only here, lazily)."""

from typing import Any

import jax.numpy as jnp

from ._base import StructuredMatrix
from ._diagonal import Diagonal, ScaledIdentity
from ._triangular import LowerTriangular, UpperTriangular
from ._tridiagonal import TridiagonalMatrix


__all__ = ["from_lineax", "to_lineax"]


def to_lineax(matrix: StructuredMatrix, tags: Any = ()) -> Any:
    """A lineax operator for an unbatched structured matrix.

    `TridiagonalMatrix` becomes a `lineax.TridiagonalLinearOperator`, `Diagonal` a
    `lineax.DiagonalLinearOperator`, `ScaledIdentity` a scaled
    `lineax.IdentityLinearOperator`; every other structure a
    `lineax.FunctionLinearOperator` whose matrix-vector product is the structure's
    own, tagged symmetric where the structure is.

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
    if isinstance(matrix, TridiagonalMatrix):
        return lx.TridiagonalLinearOperator(
            matrix.main_diag, matrix.lower_diag, matrix.upper_diag
        )
    if isinstance(matrix, Diagonal):
        return lx.DiagonalLinearOperator(matrix.diag)
    if isinstance(matrix, ScaledIdentity):
        structure = jax.ShapeDtypeStruct((matrix.n,), matrix.dtype)
        return matrix.scale * lx.IdentityLinearOperator(structure)
    tags = list(tags)
    if getattr(matrix, "symmetric", False):
        tags.append(lx.symmetric_tag)
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

    A structured matrix (with `allow_materialise=False`).

    **Raises:**

    `TypeError` for an operator without a structure here (e.g. a
    `FunctionLinearOperator`, whose matrix only its function knows).
    """
    import lineax as lx

    if isinstance(operator, lx.TridiagonalLinearOperator):
        return TridiagonalMatrix(
            operator.lower_diagonal, operator.diagonal, operator.upper_diagonal
        )
    if isinstance(operator, lx.DiagonalLinearOperator):
        return Diagonal(lx.diagonal(operator))
    if isinstance(operator, lx.IdentityLinearOperator):
        n = operator.in_size()
        dtype = operator.in_structure().dtype
        return ScaledIdentity(jnp.ones((), dtype), n)
    if isinstance(operator, lx.MatrixLinearOperator):
        if lx.is_lower_triangular(operator):
            return LowerTriangular(operator.as_matrix())
        if lx.is_upper_triangular(operator):
            return UpperTriangular(operator.as_matrix())
    raise TypeError(
        f"from_lineax: no structured matrix for a {type(operator).__name__}; "
        "quax_structured converts tridiagonal, diagonal, identity and "
        "triangular-tagged matrix operators."
    )
