"""The published API of `quax.examples.named`, exactly, and the errors around it."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_named
from quax_named import Axis, NamedArray, NamedMaterialisationError


def test_examples_alias():
    assert quax.examples.named is quax_named
    assert quax.examples.named.NamedArray is NamedArray


def test_axis_forms():
    assert Axis(3).size == 3 and Axis(3).name is None
    assert Axis(None).size is None
    assert Axis(size=4).size == 4
    batch = Axis("batch", 32)
    assert (batch.name, batch.size) == ("batch", 32)
    assert Axis("batch", 32) == batch and Axis("batch") != batch
    assert Axis(3) != Axis(3)  # anonymous axes are equal only to themselves
    assert repr(Axis(4)) == "Axis(size=4)"
    with pytest.raises(ValueError, match="string name"):
        Axis(3, 4)
    with pytest.raises(AttributeError, match="immutable"):
        batch.size = 3  # pyright: ignore[reportAttributeAccessIssue]


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


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("", "Axis name must be a non-empty string, got ''"),
        ("a b", "Axis name 'a b' holds whitespace"),
        (" a", "Axis name ' a' holds whitespace"),
        ("a,b", "Axis name 'a,b' holds ','"),
        ("a->b", "Axis name 'a->b' holds '->'"),
    ],
)
def test_axis_name_is_a_non_empty_string_without_separators(name, match):
    with pytest.raises(ValueError, match=match):
        Axis(name)
    with pytest.raises(ValueError, match=match):
        Axis(name, 3)
    with pytest.raises(ValueError, match=match.replace("Axis name", "Entry 0 of .*")):
        NamedArray(jnp.ones(3), (name,))
    x = NamedArray(jnp.ones((3, 2)), ("a", "c"))
    with pytest.raises(ValueError, match=match):
        quax_named.rename(x, {"a": name})


def test_axis_size_is_an_integer():
    assert Axis("a", np.int64(3)).size == 3 and type(Axis(np.int32(4)).size) is int
    for size, match in [
        (-1, "Axis size must be >= 0, got -1"),
        (2.0, "Axis size must be an integer >= 0 or None, got float 2.0"),
        (True, "Axis size must be an integer >= 0 or None, got bool True"),
    ]:
        with pytest.raises(ValueError, match=match):
            Axis("a", size)
    for bad in (3.5, ["a"]):
        with pytest.raises(ValueError, match=r"name .* or, for an anonymous axis, a"):
            Axis(bad)  # pyright: ignore[reportArgumentType]


def test_named_array_checks_its_fields():
    """Bad inputs raise a `ValueError` naming the field at construction, not an
    error far from the cause (a string of names was read as one axis per letter)."""
    with pytest.raises(ValueError, match=r"field `axes` must be a sequence.*\('ab',\)"):
        NamedArray(jnp.ones((3, 3)), "ab")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="field `axes` must be a sequence"):
        NamedArray(jnp.ones(3), 3)  # pyright: ignore[reportArgumentType]
    for bad in (None, 3):
        with pytest.raises(ValueError, match="Entry 1 of `NamedArray` field `axes`"):
            NamedArray(jnp.ones((2, 3)), ("a", bad))  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="`array` of a `NamedArray` must be an array"):
        NamedArray([1.0, 2.0], ("a",))
    with pytest.raises(ValueError, match=r"repeated: \('a',\)"):
        NamedArray(jnp.ones((2, 2)), ("a", Axis("a", 2)))
    with pytest.raises(ValueError, match=r"Mismatched axis size for axis Axis\('b'"):
        NamedArray(jnp.ones((2, 3)), ("a", Axis("b", 2)))
    with pytest.raises(ValueError, match="Entry 0 of `nmap`'s `out_axes`"):
        quax_named.nmap(jnp.sum, "a", out_axes=("",))


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


def test_follows_the_core_materialisation_policy():
    x = NamedArray(jnp.arange(3.0), ("i",))
    assert isinstance(x, quax.GuardedValue)
    assert issubclass(NamedMaterialisationError, quax.MaterialisationError)
    with pytest.raises(quax.MaterialisationError, match="axis names \\('i',\\)"):
        x.materialise()
    assert x.enable_materialise(allow=True).allow_materialise is True
    # The published positional signature: NamedArray(array, axes, allow_materialise).
    assert NamedArray(jnp.arange(3.0), ("i",), True).allow_materialise is True
    with pytest.raises(ValueError, match="`allow_materialise` of a `NamedArray`"):
        NamedArray(jnp.arange(3.0), ("i",), "yes")  # pyright: ignore[reportArgumentType]


def test_refusal_names_primitive_and_way_out():
    x = NamedArray(jnp.ones((3, 4)), ("a", "b"))
    with pytest.raises(NamedMaterialisationError, match=r"primitive `sort`.*nmap"):
        quax.quaxify(jnp.sort)(x)
    with pytest.raises(NamedMaterialisationError, match="`bitcast_convert_type`"):
        quax.quaxify(lambda x: jax.lax.bitcast_convert_type(x, jnp.uint8))(x)
    assert issubclass(NamedMaterialisationError, RuntimeError)
    # Allowing materialisation drops the names, as in the published quax.
    out = quax.quaxify(jnp.sort)(x.enable_materialise())
    assert not isinstance(out, NamedArray)


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


def test_repr_shows_names():
    x = NamedArray(jnp.ones((2, 3), jnp.float32), (Axis("batch", 2), "feature"))
    assert repr(x) == "NamedArray(float32[batch=2, feature=3])"


def test_lookup_by_name():
    x = NamedArray(jnp.ones((2, 3)), ("batch", "feature"))
    assert x.index("feature") == 1 and x.axis("batch").name == "batch"
    with pytest.raises(
        ValueError, match=r"'seq' is not an axis.*\('batch', 'feature'\)"
    ):
        x.index("seq")
