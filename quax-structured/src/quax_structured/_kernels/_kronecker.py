"""Kronecker products `A₁ ⊗ A₂ ⊗ ... ⊗ A_N` (row-major, as `jnp.kron`) applied
through their factors: products, entries, triangular solves one factor at a time.

A factor is a square `(nᵢ, nᵢ)` array, or a vector of shape `(nᵢ,)` standing for
the diagonal matrix `diag(dᵢ)` (applied without forming it)."""

import functools as ft
from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import Array

from ._dense import dense_triangular_solve


__all__ = [
    "factor_solve",
    "kron_apply",
    "kron_diagonal",
    "kron_entries",
    "kron_sum_eigh",
]


def _along(factor: Array, xs: Array, axis: int) -> Array:
    """`factor` applied to axis `axis` of `xs` (a vector factor: a scaling)."""
    if factor.ndim == 1:
        shape = [1] * xs.ndim
        shape[axis] = factor.shape[0]
        return xs * factor.reshape(shape)
    return jnp.moveaxis(jnp.tensordot(factor, xs, axes=(1, axis)), 0, axis)


def kron_apply(factors: Sequence[Array], x: Array) -> Array:
    """`(A₁ ⊗ ... ⊗ A_N) @ x` for `x` of shape `(n, k)`, `n = Π nᵢ`: `x` read as an
    `(n₁, ..., n_N, k)` grid and each factor applied along its own axis, O(n Σ nᵢ)
    per column (a vector factor: O(n))."""
    k = x.shape[-1]
    xs = x.reshape(*(f.shape[-1] for f in factors), k)
    for axis, factor in enumerate(factors):
        xs = _along(factor, xs, axis)
    return xs.reshape(-1, k)


def kron_diagonal(vectors: Sequence[Array]) -> Array:
    """`v₁ ⊗ ... ⊗ v_N` for vectors (the diagonal of a Kronecker product of
    diagonal matrices, or its eigenvalues from the factors'), O(n)."""
    out = vectors[0]
    for v in vectors[1:]:
        out = (out[:, None] * v[None, :]).reshape(-1)
    return out


def kron_sum_eigh(sides: Sequence[Array]) -> tuple[Array, Array]:
    """The eigenvalues (ascending) and orthonormal eigenvectors (the dense `(n, n)`
    output, as columns) of the Kronecker sum `A₁ ⊕ ... ⊕ A_N = Σᵢ I ⊗ ... ⊗ Aᵢ ⊗
    ... ⊗ I` of Hermitian `Aᵢ = Qᵢ Λᵢ Qᵢᴴ`: the sums `λ₁ + ... + λ_N` of the
    factors' eigenvalues, with the eigenvectors `Q₁ ⊗ ... ⊗ Q_N`; O(Σ nᵢ³) for
    the factors, O(n²) for the output."""
    pairs = [jnp.linalg.eigh(side) for side in sides]
    values = pairs[0][0]
    for w, _ in pairs[1:]:
        values = (values[:, None] + w[None, :]).reshape(-1)
    order = jnp.argsort(values)
    vectors = ft.reduce(jnp.kron, [q for _, q in pairs])
    return values[order], vectors[:, order]


def kron_entries(factors: Sequence[Array], i: Array, j: Array) -> Array:
    """The entries `(A₁ ⊗ ... ⊗ A_N)[i, j]`: the product of the factors' entries
    at the digits of `i` and `j` in the grid's mixed radix."""
    entries = []
    for factor in reversed(factors):
        size = factor.shape[-1]
        ik, jk = i % size, j % size
        i, j = i // size, j // size
        if factor.ndim == 1:
            entries.append(jnp.where(ik == jk, factor[ik], jnp.zeros((), factor.dtype)))
        else:
            entries.append(factor[ik, jk])
    return ft.reduce(jnp.multiply, entries)


def factor_solve(
    factors: Sequence[Array], x: Array, *, lower: bool, transpose_a: bool, unit: bool
) -> Array:
    """Solve `op(A₁ ⊗ ... ⊗ A_N) y = x` for triangular factors, one factor at a
    time along its own axis of `x`'s grid (`op(A₁ ⊗ A₂)⁻¹ = op(A₁)⁻¹ ⊗ op(A₂)⁻¹`),
    O(n Σ nᵢ) per column."""
    k = x.shape[-1]
    sizes = [f.shape[0] for f in factors]
    xs = x.reshape(*sizes, k)
    kw = dict(lower=lower, transpose_a=transpose_a, unit_diagonal=unit)
    for axis, factor in enumerate(factors):
        moved = jnp.moveaxis(xs, axis, 0)
        rest = moved.shape[1:]
        solved = dense_triangular_solve(factor, moved.reshape(sizes[axis], -1), **kw)
        xs = jnp.moveaxis(solved.reshape(sizes[axis], *rest), 0, axis)
    return xs.reshape(-1, k)
