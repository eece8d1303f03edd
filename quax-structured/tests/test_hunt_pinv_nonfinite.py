"""`jnp.linalg.pinv` of a `Diagonal`, `ScaledIdentity` or `Circulant` holding a
NaN: dense JAX's pseudo-inverse is NaN everywhere; the structure's was a zero
matrix (the NaN largest singular value made the cutoff NaN, so every value was
dropped). Every stored value is now NaN; the finite entries of a batch's other
matrices are unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_structured import Circulant, Diagonal, ScaledIdentity


def _dense(m):
    return np.asarray(m.enable_materialise().materialise())


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("hermitian", [False, True])
@pytest.mark.parametrize(
    "m",
    [
        Diagonal(jnp.array([jnp.nan, 1.0, 2.0])),
        Diagonal(jnp.array([0.5, 1.0, jnp.nan])),
        ScaledIdentity(jnp.array(jnp.nan), 3),
        Circulant(jnp.array([jnp.nan, 1.0, 2.0])),
        Circulant(jnp.array([1.0, 0.5, jnp.nan])),
    ],
)
def test_pinv_of_a_nan_structure_is_nan(m, jit, hermitian):
    pinv = quax.quaxify(lambda m: jnp.linalg.pinv(m, hermitian=hermitian))
    got = (jax.jit(pinv) if jit else pinv)(m)
    assert type(got) is type(m)
    assert np.isnan(np.asarray(jnp.linalg.pinv(_dense(m), hermitian=hermitian))).all()
    stored = {Diagonal: "diag", ScaledIdentity: "scale", Circulant: "column"}
    assert np.isnan(np.asarray(getattr(got, stored[type(m)]))).all()


def test_pinv_of_a_batch_keeps_the_finite_matrices():
    d = jnp.array([[jnp.nan, 1.0, 2.0], [4.0, 0.0, 0.5]])
    got = quax.quaxify(jnp.linalg.pinv)(Diagonal(d))
    assert np.isnan(np.asarray(got.diag[0])).all()
    np.testing.assert_allclose(got.diag[1], [0.25, 0.0, 2.0])
    np.testing.assert_allclose(_dense(got)[1], np.linalg.pinv(np.diag(d[1])))
