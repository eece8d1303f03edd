"""`quax.known_scaled_constant` at the edges: patterns that are not a scalar times
the identity (a shifted or reversed identity, an offset, a vector or a batched
scale) under `linearize`, `scan`, `cond`, `vmap` and second derivatives. Wherever it
answers, `scale * constant` must be the operand, and a program that uses it in
place of the operand must have the operand's value and derivatives (against the
same program in plain JAX)."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax


N = 3
V = jnp.array([1.0, 2.0, 3.0])
W = jnp.arange(1.0, 1.0 + N * N).reshape(N, N)

PATTERNS: dict[str, Callable[[Any], Any]] = {
    "s * eye(k=1)": lambda s: jnp.eye(N, k=1) * s,
    "s * eye[::-1]": lambda s: jnp.eye(N)[::-1] * s,
    "s * eye + 1": lambda s: jnp.eye(N) * s + 1.0,
    "v * eye": lambda s: V[:, None] * jnp.eye(N),
    "s * s * eye / s": lambda s: s * s * jnp.eye(N) / s,
    "where(s > 0, eye, 0) * s": lambda s: jnp.where(s > 0, jnp.eye(N), 0.0) * s,
    "s * cumsum(eye)": lambda s: s * jnp.cumsum(jnp.eye(N), axis=0),
}


def _rebuilt(x: Any) -> Any:
    out = quax.known_scaled_constant(x)
    return x if out is None else out[0] * out[1]


def _loss(make: Callable[[Any], Any], read: bool) -> Callable[[Any], Any]:
    def loss(s: Any) -> Any:
        x = make(s)
        return jnp.sum(jnp.sin(_rebuilt(x) if read else x) * W)

    return loss


CONTEXTS: dict[str, Callable[[Callable[[Any], Any]], Callable[[Any], Any]]] = {
    "jit": jax.jit,
    "linearize": lambda f: lambda s: jax.linearize(f, s)[1](np.float32(1.0)),
    "jit(linearize)": lambda f: jax.jit(
        lambda s: jax.linearize(f, s)[1](np.float32(1.0))
    ),
    "grad(grad)": lambda f: jax.grad(jax.grad(f)),
    "vmap (a batched scale)": lambda f: lambda s: jax.vmap(f)(jnp.stack([s, 2 * s])),
    "vmap(grad)": lambda f: lambda s: jax.vmap(jax.grad(f))(jnp.stack([s, -s])),
    "grad(scan)": lambda f: jax.grad(
        lambda s: lax.scan(lambda c, _: (c + f(0.5 * c), None), s, None, length=3)[0]
    ),
    "cond": lambda f: lambda s: lax.cond(s > 0, f, lambda s: 0.0 * s, s),
}


@pytest.mark.parametrize("context", CONTEXTS)
def test_programs_reading_a_scaled_constant_keep_values_and_derivatives(
    context: str,
) -> None:
    s = np.float32(0.7)
    for name, make in PATTERNS.items():
        transform = CONTEXTS[context]
        got = transform(_loss(make, read=True))(s)
        want = transform(_loss(make, read=False))(s)
        np.testing.assert_allclose(
            got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} under {context}"
        )


def test_which_patterns_are_read() -> None:
    # So that the test above compares programs that use what was read where it
    # was read: a shifted or reversed identity, a quotient of traced scales, a
    # concrete `v * eye`. Not an offset, a selection on the scale (`s > 0`), or a
    # `cumsum` (computed by an inner jaxpr, which `known_constant` does not run).
    read = {}

    def f(s: Any) -> Any:
        for name, make in PATTERNS.items():
            read[name] = quax.known_scaled_constant(make(s)) is not None
        return s

    jax.jit(f)(np.float32(0.7))
    unread = {"s * eye + 1", "where(s > 0, eye, 0) * s", "s * cumsum(eye)"}
    assert read == {name: name not in unread for name in PATTERNS}
