"""The quax rules for `Quantity` in linear algebra and Fourier transforms.

A `Quantity` matrix holds one unit for all its elements, so a factorisation splits
it into dimensionless factors (unitary or unit-triangular matrices, eigenvectors)
and factors that carry its units (triangular factors, eigenvalues, singular values),
and a solve divides the units of the right-hand side by those of the matrix.
"""

from fractions import Fraction
from typing import Any

import jax
import numpy as np
import quax
from jax import lax
from jax.extend.core import jaxpr_as_fun
from jax.lax import linalg
from jaxtyping import ArrayLike

from .._dimensions import UnitError, dimensionless
from .._value import Quantity, describe
from ._arrays import _array, _dims, _shown, _wrap


_Operand = Quantity | ArrayLike


def _dimensionless_factor(x: Any) -> Quantity:
    """A dimensionless factor (orthogonal matrix, eigenvectors)."""
    return _wrap(x, dimensionless, None)


@quax.register(lax.fft_p)
def _fft(x: Quantity, **params: Any) -> Quantity:
    # The transform is linear: each output element is a sum of the inputs times
    # dimensionless phases.
    return _wrap(lax.fft_p.bind(x.array, **params), x.units, _shown(x))


@quax.register(linalg.lu_p)
def _lu(a: Quantity) -> list[Any]:
    # `A = P L U` with `L` unit lower-triangular, so `U` carries the units of `A`.
    # The packed output holds `U` on and above the diagonal and `L` below it, in one
    # unit: that of `U`. Solves read `L` with a unit-diagonal triangular solve, which
    # takes it as dimensionless (see `_triangular_solve`); unpacking `L` as a matrix
    # (`jax.scipy.linalg.lu` adds the identity to its triangle) is a unit error.
    lu, pivots, permutation = linalg.lu_p.bind(a.array)
    return [_wrap(lu, a.units, _shown(a)), pivots, permutation]


@quax.register(linalg.triangular_solve_p)
def _triangular_solve(a: _Operand, b: _Operand, **params: Any) -> Quantity:
    # `a x = b` (or `x a = b`): `x` has the units of `b / a`. With a unit diagonal,
    # the matrix solved with has ones on its diagonal, so it is dimensionless, and
    # `x` has the units of `b`: `a` is then the packed LU factorisation, whose
    # strict lower triangle is the dimensionless `L` although it carries the units
    # of `U`.
    out = linalg.triangular_solve_p.bind(_array(a), _array(b), **params)
    if params["unit_diagonal"]:
        return _wrap(out, _dims(b), _shown(b))
    return _wrap(out, _dims(b) / _dims(a), _shown(b) / _shown(a))


@quax.register(linalg.cholesky_p)
def _cholesky(a: Quantity, **params: Any) -> Quantity:
    # `A = L L^H`: `L` has the units of the square root of `A`.
    half = Fraction(1, 2)
    return _wrap(
        linalg.cholesky_p.bind(a.array, **params), a.units**half, _shown(a) ** half
    )


@quax.register(linalg.eigh_p)
def _eigh(a: Quantity, **params: Any) -> list[Quantity]:
    # `A v = w v`: the eigenvalues have the units of `A`.
    v, w = linalg.eigh_p.bind(a.array, **params)
    return [_dimensionless_factor(v), _wrap(w, a.units, _shown(a))]


@quax.register(linalg.eig_p)
def _eig(a: Quantity, **params: Any) -> list[Quantity]:
    # As for `eigh`; the left and right eigenvectors (if computed) follow `w`.
    w, *vectors = linalg.eig_p.bind(a.array, **params)
    return [_wrap(w, a.units, _shown(a)), *map(_dimensionless_factor, vectors)]


@quax.register(linalg.svd_p)
def _svd(a: Quantity, **params: Any) -> list[Quantity]:
    # `A = U diag(s) V^H` with `U`, `V` unitary: the singular values carry the units.
    s, *vectors = linalg.svd_p.bind(a.array, **params)
    return [_wrap(s, a.units, _shown(a)), *map(_dimensionless_factor, vectors)]


@quax.register(linalg.qr_p)
def _qr(a: Quantity, **params: Any) -> list[Any]:
    # `A = Q R` (`A P = Q R` with pivoting) with `Q` unitary: `R` carries the units.
    q, r, *permutation = linalg.qr_p.bind(a.array, **params)
    return [_dimensionless_factor(q), _wrap(r, a.units, _shown(a)), *permutation]


@quax.register(lax.linear_solve_p)
def _linear_solve(*args: _Operand, const_lengths: Any, jaxprs: Any) -> list[Any]:
    # `lax.custom_linear_solve` (`jnp.linalg.solve`, `inv`) finds `x` with
    # `matvec(x) = b`. `x` has the units its `solve` function gives for `b` (those of
    # `b / A` for a matrix `A`), which `matvec` must map back to those of `b`.
    ends = np.cumsum(list(const_lengths))
    matvec_consts, solve_consts = args[: ends[0]], args[ends[1] : ends[2]]
    b = args[ends[-1] :]
    solved = _units_of(jaxprs.solve, *solve_consts, *b)
    x = solved[: len(b)]  # the rest are auxiliary outputs
    image = _units_of(jaxprs.matvec, *matvec_consts, *x)
    for bi, xi, yi in zip(b, x, image, strict=True):
        if _dims(yi) != _dims(bi):
            raise UnitError(
                f"`{lax.linear_solve_p.name}` solves `matvec(x) = b` for `b` in "
                f"{describe(bi)}, but its `solve` gives `x` in [{_dims(xi)}], which "
                f"`matvec` maps to [{_dims(yi)}]. Make `solve` invert `matvec`: `x` "
                "must have the units of `b` divided by those of the operator."
            )
    # The units are settled, so the solve runs as the plain one on the SI arrays.
    outs = lax.linear_solve_p.bind(
        *map(_array, args), const_lengths=const_lengths, jaxprs=jaxprs
    )
    return [
        _wrap(out, s.units, s.unit) if isinstance(s, Quantity) else out
        for out, s in zip(outs, solved, strict=True)
    ]


def _units_of(jaxpr: Any, *args: Any) -> list[Any]:
    """The outputs of `jaxpr` on `args` under the rules, as shapes: their units are
    decided (and checked) at trace time, and nothing is computed."""
    return jax.eval_shape(quax.quaxify(jaxpr_as_fun(jaxpr)), *args)
