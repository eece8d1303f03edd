"""`M = A₁ ⊗ ... ⊗ A_N + c I` for real square factors not known to be symmetric
(what `K + noise * jnp.eye(n)` gives for a `Kronecker` `K` without the `symmetric`
tag): its solve, pivots, log-determinant and determinant through the factors'
eigendecompositions, `Aᵢ = Vᵢ Λᵢ Vᵢ⁻¹`, so that `M = V (Λ + c) V⁻¹` with `V = ⊗
Vᵢ`, `Λ = ⊗ Λᵢ`: O(Σ nᵢ³) for the factors and O(n Σ nᵢ) per right-hand side,
`n = Π nᵢ`. No `(n, n)` array is formed.

Which eigendecomposition is decided when the program runs, for the whole `vmap`
batch (`for_the_batch`): where every factor is symmetric up to rounding (`|Aᵢ -
Aᵢᵀ| ≤ nᵢ eps max |Aᵢ|` entrywise), `jnp.linalg.eigh` of the symmetrised factor
(orthogonal `Vᵢ`, backward stable; symmetrising moves the matrix by at most that
rounding); otherwise the general one, `jnp.linalg.eig` (complex `Λᵢ`, `Vᵢ`, and
`Vᵢ⁻¹` by an LU solve), whose accuracy depends on how far the factors are from
normal (the condition number of `Vᵢ`): its solve is checked by its backward error
and is NaN above `TOLERANCE · eps`, and its determinant is NaN where its solve of
a probe system fails that check. XLA has no `eig` on TPU: there the general branch
is NaN (`lax.platform_dependent`), never a crash.

Derivatives are written out (`jax.custom_jvp`), never through the
eigendecompositions (whose eigenvector derivatives JAX does not give for
non-symmetric matrices, and which are infinite at repeated eigenvalues): `dx =
M⁻¹ (db - dM x)` for the solve, `d log|det M| = tr(M⁻¹ dM)` (the factors' `Λⱼ`
and `diag(Vₖ⁻¹ dAₖ Vₖ)` on the grid, over `Λ + c`) for the log-determinant, and
`det M · tr(M⁻¹ dM)` for the determinant (NaN at a singular matrix)."""

import functools as ft
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array

from ._dense import for_the_batch
from ._kronecker import kron_apply, kron_diagonal


__all__ = [
    "TOLERANCE",
    "shifted_kron_determinant",
    "shifted_kron_log_determinant",
    "shifted_kron_pivots",
    "shifted_kron_solve",
]


# The largest backward error (relative to `eps`) the general route's solve is
# returned with; above it, NaN. A backward stable solve stays within a small
# multiple of `eps` (as `LowRankPlusDiagonal`'s check).
TOLERANCE = 1024


class _Spectral(NamedTuple):
    """The factors' eigendecompositions `Aᵢ = Vᵢ Λᵢ Wᵢ`, `Wᵢ = Vᵢ⁻¹`."""

    values: list[Array]
    vectors: list[Array]
    inverses: list[Array]


def _symmetric(factors: Sequence[Array]) -> Array:
    """Whether every factor is symmetric up to rounding: `|A - Aᵀ| ≤ n eps max
    |A|` entrywise (a NaN entry is not)."""
    checks = []
    for a in factors:
        eps = jnp.finfo(a.dtype).eps
        size = jnp.max(jnp.abs(a))
        checks.append(jnp.all(jnp.abs(a - a.T) <= a.shape[0] * eps * size))
    return ft.reduce(jnp.logical_and, checks)


def _by_eigh(factors: Sequence[Array]) -> _Spectral:
    pairs = [jnp.linalg.eigh((a + a.T) / 2) for a in factors]
    return _Spectral(
        [w for w, _ in pairs], [q for _, q in pairs], [q.T for _, q in pairs]
    )


def _by_eig(factors: Sequence[Array]) -> _Spectral:
    pairs = [jnp.linalg.eig(a) for a in factors]
    inverses = [
        jnp.linalg.solve(v, jnp.eye(v.shape[0], dtype=v.dtype)) for _, v in pairs
    ]
    return _Spectral([w for w, _ in pairs], [v for _, v in pairs], inverses)


def _unavailable(fn: Callable[..., Any], *args: Any) -> Any:
    """NaN of the shapes and dtypes `fn(*args)` returns (on TPU, where XLA has
    no `eig`)."""
    shapes = jax.eval_shape(fn, *args)
    return jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)


def _by_route(fn: Callable[..., Any], factors: Sequence[Array], *operands: Any) -> Any:
    """`fn(spectral, general, factors, *operands)` (`general`: whether the
    eigenvalues came from `eig`), through `eigh` where every factor is symmetric
    (for the whole `vmap` batch), else through `eig` (NaN on TPU). `fn`'s
    outputs have the same dtypes from both routes."""
    factors = list(factors)

    def symmetric_route(factors: list[Array], *operands: Any) -> Any:
        return fn(_by_eigh(factors), False, factors, *operands)

    def general(factors: list[Array], *operands: Any) -> Any:
        return fn(_by_eig(factors), True, factors, *operands)

    def general_route(factors: list[Array], *operands: Any) -> Any:
        return lax.platform_dependent(
            factors,
            *operands,
            tpu=ft.partial(_unavailable, general),
            default=general,
        )

    symmetric = for_the_batch(_symmetric(factors))
    return lax.cond(symmetric, symmetric_route, general_route, factors, *operands)


def _as(x: Array, dtype: Any) -> Array:
    """`x` in `dtype`: its real part where `dtype` is real (the imaginary parts
    of a real matrix's solve through complex eigenvectors are rounding)."""
    if not jnp.issubdtype(dtype, jnp.complexfloating):
        x = jnp.real(x)
    return x.astype(dtype)


def _pencil(spectral: _Spectral, scale: Array) -> Array:
    """`λ + c` on the grid, for the products `λ` of the factors' eigenvalues."""
    return kron_diagonal(spectral.values) + scale


def _apply(factors: Sequence[Array], scale: Array, x: Array) -> Array:
    """`M x` for `x` of shape `(n, k)`."""
    return kron_apply(factors, x) + scale * x


def _backward_error(
    factors: Sequence[Array], scale: Array, x: Array, b: Array
) -> Array:
    """`max_k ‖b_k - M x_k‖₂ / (N ‖x_k‖₂ + ‖b_k‖₂)` over the columns (`N = Π
    ‖Aᵢ‖_F + |c| ≥ ‖M‖₂`); `inf` where NaN."""
    norm = ft.reduce(jnp.multiply, [jnp.linalg.norm(a) for a in factors])
    norm = norm + jnp.abs(scale)
    residual = b - _apply(factors, scale, x)
    size = lambda y: jnp.linalg.norm(y, axis=0)
    errors = size(residual) / (norm * size(x) + size(b))
    error = jnp.max(errors) if errors.size else jnp.zeros((), errors.dtype)
    return jnp.where(jnp.isnan(error), jnp.inf, error)


def _solve_with(
    spectral: _Spectral, general: bool, factors: list[Array], scale: Array, b: Array
) -> Array:
    """`M⁻¹ b` for `b` of shape `(n, k)`; through `eig` (`general`), NaN where its
    backward error is above `TOLERANCE · eps`."""
    dtype = jnp.result_type(b, *factors, scale)
    rotated = kron_apply(spectral.inverses, b)
    x = kron_apply(spectral.vectors, rotated / _pencil(spectral, scale)[:, None])
    x = _as(x, dtype)
    if general:
        eps = jnp.finfo(dtype).eps
        accurate = _backward_error(factors, scale, x, b) <= TOLERANCE * eps
        x = jnp.where(accurate, x, jnp.nan).astype(dtype)
    return x


def _unchecked_solve(factors: list[Array], scale: Array, b: Array) -> Array:
    """`M⁻¹ b` without the check: linear in `b`, so that it transposes (the
    solve of the derivative)."""

    def fn(
        spectral: _Spectral, general: bool, factors: list[Array], scale: Array, b: Array
    ) -> Array:
        del general
        return _solve_with(spectral, False, factors, scale, b)

    return _by_route(fn, factors, scale, b)


@jax.custom_jvp
def shifted_kron_solve(factors: list[Array], scale: Array, b: Array) -> Array:
    """`(A₁ ⊗ ... ⊗ A_N + c I)⁻¹ b` for `b` of shape `(n, k)` (see the module).

    **Arguments:**

    - `factors`: the square factors `Aᵢ` (real).
    - `scale`: the scalar `c` (real).
    - `b`: the right-hand sides, shape `(n, k)`.

    **Returns:**

    `x` of shape `(n, k)`, NaN for a solve through `eig` that fails its check.
    """
    return _by_route(_solve_with, factors, scale, b)


@shifted_kron_solve.defjvp
def _(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    factors, scale, b = primals
    dfactors, dscale, db = tangents
    factors = list(factors)
    x = shifted_kron_solve(factors, scale, b)
    dm_x = dscale * x
    for k, da in enumerate(dfactors):
        dm_x = dm_x + kron_apply([*factors[:k], da, *factors[k + 1 :]], x)
    dx = _unchecked_solve(factors, scale, db - dm_x)
    # Where the solve failed its check, so does its derivative.
    return x, jnp.where(jnp.isnan(x), jnp.nan, dx).astype(x.dtype)


def _pivots_with(
    spectral: _Spectral, general: bool, factors: list[Array], scale: Array
) -> Array:
    """Real numbers whose product is `det M`: `λ + c` (through `eigh`); through
    `eig`, their moduli, the first signed with the determinant (a real matrix's
    complex eigenvalues come in conjugate pairs), NaN where the solve of a probe
    system fails the check."""
    dtype = jnp.result_type(*factors, scale)
    w = _pencil(spectral, scale)
    if not general:
        return w.astype(dtype)
    size = jnp.abs(w)
    unit = w / jnp.where(size > 0, size, 1)
    sign = jnp.sign(jnp.real(jnp.prod(unit)))
    pivots = size.at[0].multiply(sign).astype(dtype)
    n = w.shape[0]
    probe = jnp.cos(1.618 * np.arange(n)).astype(dtype)[:, None]
    x = _solve_with(spectral, True, factors, scale, probe)
    return jnp.where(jnp.any(jnp.isnan(x)), jnp.nan, pivots).astype(dtype)


def shifted_kron_pivots(factors: Sequence[Array], scale: Array) -> Array:
    """Numbers whose product is `det(A₁ ⊗ ... ⊗ A_N + c I)`, shape `(n,)`, what
    `slogdet` and `det` read (see the module; no derivative).

    **Arguments:**

    - `factors`, `scale`: as for `shifted_kron_solve`.

    **Returns:**

    The pivots, in the factors' real dtype.
    """
    return _by_route(_pivots_with, factors, scale)


def _log_determinant_tangent(
    factors: list[Array], scale: Array, dfactors: Sequence[Array], dscale: Array
) -> Array:
    """`tr(M⁻¹ dM) = Σ (dΛ + dc) / (Λ + c)` over the grid, with `dΛ = Σₖ Λ₁ ⊗ ...
    ⊗ diag(Wₖ dAₖ Vₖ) ⊗ ... ⊗ Λ_N`: linear in the tangents."""

    def fn(
        spectral: _Spectral,
        general: bool,
        factors: list[Array],
        scale: Array,
        dfactors: list[Array],
        dscale: Array,
    ) -> Array:
        del general
        dtype = jnp.result_type(*factors, scale)
        w = _pencil(spectral, scale)
        dw = dscale * jnp.ones_like(w)
        for k, da in enumerate(dfactors):
            diagonal = jnp.einsum(
                "ij,ji->i", spectral.inverses[k], da @ spectral.vectors[k]
            )
            values = list(spectral.values)
            values[k] = diagonal
            dw = dw + kron_diagonal(values)
        return _as(jnp.sum(dw / w), dtype)

    return _by_route(fn, factors, scale, list(dfactors), dscale)


@jax.custom_jvp
def shifted_kron_log_determinant(
    factors: list[Array], scale: Array
) -> tuple[Array, Array]:
    """`(sign, log |det M|)` of `M = A₁ ⊗ ... ⊗ A_N + c I` from its pivots.

    **Arguments:**

    - `factors`, `scale`: as for `shifted_kron_solve`.

    **Returns:**

    The sign and the log of the modulus of the determinant (NaN where the
    pivots are).
    """
    pivots = shifted_kron_pivots(factors, scale)
    size = jnp.abs(pivots)
    unit = pivots / jnp.where(size > 0, size, 1).astype(pivots.dtype)
    return jnp.prod(unit), jnp.sum(jnp.log(size))


@shifted_kron_log_determinant.defjvp
def _(primals: tuple, tangents: tuple) -> tuple[tuple, tuple]:
    factors, scale = primals
    dfactors, dscale = tangents
    sign, logdet = shifted_kron_log_determinant(factors, scale)
    dlogdet = _log_determinant_tangent(list(factors), scale, dfactors, dscale)
    dlogdet = jnp.where(jnp.isfinite(logdet), dlogdet, jnp.nan).astype(logdet.dtype)
    return (sign, logdet), (jnp.zeros_like(sign), dlogdet)


@jax.custom_jvp
def shifted_kron_determinant(factors: list[Array], scale: Array) -> Array:
    """`det(A₁ ⊗ ... ⊗ A_N + c I)`, the product of its pivots; its derivative `det
    M · tr(M⁻¹ dM)` (NaN at a singular matrix).

    **Arguments:**

    - `factors`, `scale`: as for `shifted_kron_solve`.

    **Returns:**

    The determinant.
    """
    return jnp.prod(shifted_kron_pivots(factors, scale))


@shifted_kron_determinant.defjvp
def _(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    factors, scale = primals
    dfactors, dscale = tangents
    det = shifted_kron_determinant(factors, scale)
    trace = _log_determinant_tangent(list(factors), scale, dfactors, dscale)
    return det, (det * trace).astype(det.dtype)
