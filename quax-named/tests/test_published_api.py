"""The published API of `quax.examples.named`, exactly, and the errors around it."""

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_named
from quax_named import Axis, NamedArray


def test_examples_alias():
    assert quax.examples.named is quax_named
    assert quax.examples.named.NamedArray is NamedArray


def test_construction_errors():
    a = Axis(3)
    with pytest.raises(ValueError, match="Axis names for `NamedArray` must be unique"):
        NamedArray(jnp.ones((3, 3)), (a, a))
    with pytest.raises(ValueError, match=r"repeated: \('x',\)"):
        NamedArray(jnp.ones((3, 3)), ("x", "x"))
    with pytest.raises(ValueError, match="`NamedArray` must have every axis be named"):
        NamedArray(jnp.ones((3, 3)), (a,))
    with pytest.raises(
        ValueError, match=r"Mismatched axis size for axis Axis\(size=4\)"
    ):
        NamedArray(jnp.ones((3,)), (Axis(4),))
    NamedArray(jnp.ones((5,)), (Axis(None),))  # None matches any size


def test_materialise_refused_and_enabled():
    x = NamedArray(jnp.arange(3.0), ("i",))
    assert x.allow_materialise is False
    with pytest.raises(RuntimeError, match="Refusing to materialise `NamedArray`"):
        x.materialise()
    with pytest.raises(RuntimeError, match="Refusing to access the shape"):
        _ = x.shape
    y = x.enable_materialise()
    assert y.allow_materialise and y.axes == x.axes and y.shape == (3,)
    np.testing.assert_array_equal(y.materialise(), [0.0, 1.0, 2.0])
    assert x.enable_materialise(False).allow_materialise is False
    assert x.sizes == {"i": 3}


def test_published_linear_example():
    linear = eqx.nn.Linear(3, 4, key=jr.PRNGKey(0))
    In, Out = Axis(3), Axis(4)
    named_linear = eqx.tree_at(
        lambda m: (m.bias, m.weight),
        linear,
        (NamedArray(linear.bias, (Out,)), NamedArray(linear.weight, (Out, In))),
    )
    v = jr.normal(jr.PRNGKey(1), (3,))
    out = quax.quaxify(named_linear)(NamedArray(v, (In,)))
    assert isinstance(out, NamedArray) and out.axes == (Out,)
    assert linear.bias is not None
    np.testing.assert_allclose(out.array, linear.weight @ v + linear.bias, rtol=1e-6)


def test_matmul_contracts_matching_axes_only():
    A, B, C = Axis(3), Axis(3), Axis(2)
    x = NamedArray(jnp.ones((2, 3)), (C, A))
    y = NamedArray(jnp.ones((3,)), (A,))
    out = quax.quaxify(lambda x, y: x @ y)(x, y)
    assert out.axes == (C,)
    with pytest.raises(TypeError, match="Cannot contract mismatched dimensions"):
        quax.quaxify(lambda x, y: x @ y)(x, NamedArray(jnp.ones((3,)), (B,)))


def test_batch_mismatch():
    x = NamedArray(jnp.ones((2, 3, 4)), ("b", "i", "j"))
    y = NamedArray(jnp.ones((2, 4, 5)), ("c", "j", "k"))
    with pytest.raises(
        TypeError, match=r"Cannot batch mismatched dimensions.*'b'.*'c'"
    ):
        quax.quaxify(jnp.matmul)(x, y)


def test_trace():
    a = jnp.arange(24.0).reshape(2, 3, 4)[:, :3, :3]
    x = NamedArray(a, ("b", "i", "j"))
    out = quax_named.trace(x, axis1="j", axis2="i", offset=1)
    assert out.names == ("b",)
    np.testing.assert_allclose(out.array, jnp.trace(a, offset=1, axis1=2, axis2=1))
    with pytest.raises(ValueError, match="same named axis"):
        quax_named.trace(x, axis1="i", axis2="i")
