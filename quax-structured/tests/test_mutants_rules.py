"""Tests written for mutants of `quax_structured/_rules.py` that the sampled run of
`scripts/mutation.sh structured-rules` let through (see `docs/mutation.md`): each
against dense JAX, and each failing with its mutant planted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_a_non_finite_traced_noise_gives_nan_in_every_float_dtype(dtype):
    """`K + noise * jnp.eye(n)` with a traced infinite or NaN noise solves to NaN as
    dense JAX does, in single precision as in double (mutant `_constant_diagonal`
    15 tested the scale's dtype against NumPy's default float, float64, so a float32
    noise of inf kept the structure's exact zeros off the diagonal, and the solve
    came out a silent zero)."""
    with jax.enable_x64(dtype == jnp.float64):
        key_a, key_b, key_v = jax.random.split(jax.random.PRNGKey(0), 3)
        a = jax.random.normal(key_a, (3, 3), dtype)
        b = jax.random.normal(key_b, (2, 2), dtype)
        k = qs.Kronecker(
            a @ a.T + jnp.eye(3, dtype=dtype),
            b @ b.T + jnp.eye(2, dtype=dtype),
            symmetric=True,
        )
        v = jax.random.normal(key_v, (6,), dtype)

        def fn(k, s):
            c = k + s * jnp.eye(6, dtype=dtype)
            return jnp.linalg.solve(c, v), c @ v

        run = jax.jit(quax.quaxify(fn))
        dense = k.enable_materialise().dense()
        for s in (jnp.inf, -jnp.inf, jnp.nan):
            noise = jnp.asarray(s, dtype)
            for got, want in zip(run(k, noise), fn(dense, noise), strict=True):
                assert np.all(np.isnan(want))
                assert np.all(np.isnan(got)), (dtype, s, got)
        # A finite noise gives the dense values.
        tol = 1e-4 if dtype == jnp.float32 else 1e-10
        noise = jnp.asarray(0.5, dtype)
        for got, want in zip(run(k, noise), fn(dense, noise), strict=True):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
