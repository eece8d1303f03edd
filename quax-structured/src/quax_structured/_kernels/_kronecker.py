"""Kronecker products `a ⊗ b` applied through their factors: products, entries,
triangular solves one factor at a time."""

import jax.numpy as jnp
from jaxtyping import Array

from ._dense import dense_triangular_solve


__all__ = ["factor_solve", "kron_apply", "kron_entries"]


def kron_apply(a: Array, b: Array, x: Array) -> Array:
    """`(a ⊗ b) @ x` for `x` of shape `(na nb, k)`: `a X bᵀ` per column."""
    xs = x.reshape(a.shape[1], b.shape[1], x.shape[-1])
    out = jnp.einsum("ij,jlk,ml->imk", a, xs, b)
    return out.reshape(a.shape[0] * b.shape[0], x.shape[-1])


def kron_entries(a: Array, b: Array, i: Array, j: Array) -> Array:
    nb = b.shape[0]
    return a[i // nb, j // nb] * b[i % nb, j % nb]


def factor_solve(
    a: Array, b: Array, x: Array, *, lower: bool, transpose_a: bool, unit: bool
) -> Array:
    """Solve `op(a ⊗ b) y = x` for triangular factors, one factor at a time."""
    na, nb = a.shape[0], b.shape[0]
    xs = x.reshape(na, nb * x.shape[-1])
    kw = dict(lower=lower, transpose_a=transpose_a, unit_diagonal=unit)
    ys = dense_triangular_solve(a, xs, **kw)
    ys = ys.reshape(na, nb, x.shape[-1]).transpose(1, 0, 2).reshape(nb, -1)
    ys = dense_triangular_solve(b, ys, **kw)
    return ys.reshape(nb, na, x.shape[-1]).transpose(1, 0, 2).reshape(na * nb, -1)
