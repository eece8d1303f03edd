"""Scanning over a value whose leaves, sliced one by one, are no value of its type
at all (a diagonal matrix's `diag` loses the axis its `aval` reads the size from):
quax joins it as any value that does not slice leafwise (it materialises, or its
refusal names the scanned-over input), instead of the slice's own error."""

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jax.core import ShapedArray
from jaxtyping import Array


class Diag(quax.ArrayValue):
    """`diag(d)`, for `d` of shape `(*batch, n)`."""

    d: Array

    def aval(self) -> ShapedArray:
        *batch, n = self.d.shape  # a 0-d `d` is no `Diag`
        return ShapedArray((*batch, n, n), self.d.dtype)

    def materialise(self) -> Array:
        return self.d[..., None] * jnp.eye(self.d.shape[-1], dtype=self.d.dtype)


class RefusingDiag(Diag):
    def materialise(self) -> Array:
        raise quax.MaterialisationError("RefusingDiag never materialises")


d = jnp.array([1.0, 2.0, 3.0])
w = jnp.array([[1.0, -1.0], [0.5, 2.0], [3.0, 0.0]])


def _rows_times_w(m: Any) -> Any:
    return lax.scan(lambda c, row: (c + row @ w, c), jnp.zeros(2), m)[0]


def test_a_value_whose_slices_are_no_values_is_materialised() -> None:
    # Before: `ValueError: not enough values to unpack` from the slice's `aval`.
    out = quax.quaxify(_rows_times_w)(Diag(d))
    np.testing.assert_allclose(out, _rows_times_w(jnp.diag(d)))


def test_its_refusal_names_the_scanned_over_input() -> None:
    with pytest.raises(quax.JoinError, match="scanned-over input 0"):
        quax.quaxify(_rows_times_w)(RefusingDiag(d))
