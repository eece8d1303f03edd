"""`nmap`: positional code over chosen named axes, vectorised over the others,
against `jax.vmap` of the plain code."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax_named as qn
from quax_named import NamedArray


def arr(names, key=0, sizes=None):
    sizes = sizes or {"batch": 2, "seq": 3, "feature": 4, "hidden": 5}
    shape = tuple(sizes[n] for n in names)
    return NamedArray(jr.normal(jr.PRNGKey(key), shape), tuple(names))


def laid_out(x, names):
    return np.transpose(np.asarray(x.array), [list(x.names).index(n) for n in names])


def test_nmap_unmodified_mlp():
    mlp = eqx.nn.MLP(4, 3, 8, 2, key=jr.PRNGKey(0))
    x = arr(["batch", "seq", "feature"], 9)
    y = qn.nmap(mlp, "feature", out_axes=("logit",))(x)
    assert y.names == ("batch", "seq", "logit")
    np.testing.assert_allclose(
        y.array, jax.vmap(jax.vmap(mlp))(x.array), rtol=1e-5, atol=1e-6
    )
    # Storage order does not matter: `feature` first gives the same named result.
    y2 = qn.nmap(mlp, "feature", out_axes=("logit",))(
        x.transpose("feature", "seq", "batch")
    )
    np.testing.assert_allclose(
        laid_out(y2, ["batch", "seq", "logit"]), y.array, rtol=1e-5, atol=1e-6
    )
    # Under jit and grad too.
    g = jax.jit(
        jax.grad(lambda x: qn.sum(qn.nmap(mlp, "feature", out_axes=("logit",))(x)))
    )(x)
    assert g.names == x.names


def test_nmap_broadcasts_arguments_and_errors():
    x, b = arr(["batch", "feature"], 1), arr(["seq", "feature"], 2)
    out = qn.nmap(lambda u, v: u @ v, "feature")(x, b)
    assert out.names == ("batch", "seq")
    np.testing.assert_allclose(out.array, x.array @ b.array.T, rtol=1e-5)
    with pytest.raises(ValueError, match="name its axes with `out_axes=`"):
        qn.nmap(lambda u: jnp.concatenate([u, u]), "feature")(x)
    with pytest.raises(ValueError, match="must be unique; repeated: \\('batch',\\)"):
        qn.nmap(lambda u: u, "feature", out_axes=("batch",))(x)
    with pytest.raises(ValueError, match=r"axes \['nope'\] are in none"):
        qn.nmap(jnp.sum, "nope")(x)
