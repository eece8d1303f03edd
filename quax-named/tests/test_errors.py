"""Error paths that no other test reaches: each raises the documented type with a
message naming the field, the axes or the way out."""

import jax
import jax.numpy as jnp
import pytest
import quax
import quax_named as qn
from quax_named import Axis, NamedArray


def test_axis_refuses_a_name_that_is_not_a_string():
    with pytest.raises(ValueError, match=r"Axis\(name, size\) needs a string name"):
        Axis(3, 4)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"Axis takes a name \(a string\).*float 2.5"):
        Axis(2.5)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"Axis takes a name \(a string\).*bool True"):
        Axis(True)  # pyright: ignore[reportArgumentType]


def test_by_name_functions_refuse_malformed_arguments():
    x = NamedArray(jnp.ones((2, 3)), ("a", "b"))
    with pytest.raises(ValueError, match="einsum needs an explicit output"):
        qn.einsum("a b", x)
    with pytest.raises(ValueError, match="rearrange: an empty group"):
        qn.rearrange(x, "a () b -> a b")
    with pytest.raises(ValueError, match="concatenate needs at least one array"):
        qn.concatenate([], "a")
    with pytest.raises(ValueError, match="stack needs at least one array"):
        qn.stack([], "new")
    with pytest.raises(ValueError, match=r"nmap: axes \['c'\] are in none"):
        qn.nmap(jnp.sum, "c")(x)


def test_indexing_by_name_refuses_ambiguous_array_indices():
    x = NamedArray(jnp.arange(6.0).reshape(2, 3), ("a", "b"))
    i = NamedArray(jnp.array([0, 1]), ("k",))
    j = NamedArray(jnp.array([1, 2]), ("m",))
    with pytest.raises(TypeError, match="at most one NamedArray index"):
        x[{"a": i, "b": j}]
    with pytest.raises(TypeError, match="combines only with slices"):
        x[{"a": i, "b": 0}]


def test_a_mesh_axis_shards_one_array_axis():
    with pytest.raises(ValueError, match="a mesh axis can shard one array axis only"):
        qn.partition_spec(("a", "b"), {"a": "data", "b": "data"})


def test_positional_reshapes_without_names_are_refused():
    """A reshape that would merge an anonymous axis, or split a merged axis into
    other sizes, has no names to give: refused with the way out."""
    x = NamedArray(jnp.ones((2, 3)), (Axis(2), "b"))
    with pytest.raises(ValueError, match="no name to give the merged axis"):
        quax.quaxify(lambda x: x.reshape(6))(x)
    y = NamedArray(jnp.ones((2, 3, 4)), ("a", "b", "c"))
    with pytest.raises(ValueError, match="pieces have no names"):
        quax.quaxify(lambda y: y.reshape(2, 12).reshape(2, 4, 3))(y)
    with pytest.raises(ValueError, match=r"whose pieces have no names.*unflatten_axis"):
        quax.quaxify(lambda y: jax.lax.reshape(y, (2, 3, 2, 2)))(y)


def test_partition_spec_takes_a_named_array_as_named_sharding_does():
    x = NamedArray(jnp.ones((2, 3)), ("batch", "feature"))
    mapping = {"feature": "model"}
    assert qn.partition_spec(x, mapping) == qn.partition_spec(x.axes, mapping)
    assert qn.partition_spec(x, mapping) == jax.sharding.PartitionSpec(None, "model")
    with qn.axis_mapping(mapping):
        assert qn.partition_spec(x) == jax.sharding.PartitionSpec(None, "model")
    with pytest.raises(TypeError, match=r"partition_spec needs a NamedArray .*int 1"):
        qn.partition_spec([1, 2])


def test_take_with_axis_and_indices_swapped_says_which_is_which():
    x = NamedArray(jnp.arange(6.0).reshape(2, 3), ("a", "b"))
    indices = jnp.array([0, 2])
    for swapped in (indices, 1):
        with pytest.raises(
            TypeError,
            match=r"take\(x, indices, axis\) takes the indices before the axis: got "
            r"the axis 'b' as `indices`.*quax_named.take\(x, indices, 'b'\)",
        ):
            qn.take(x, "b", swapped)  # pyright: ignore[reportArgumentType]
    # An axis that is a number, wherever an axis is asked for.
    with pytest.raises(TypeError, match=r"is named: .*got int 3.*\('a', 'b'\)"):
        qn.take(x, indices, 3)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"got an array of shape \(2,\)"):
        x.index(indices)  # pyright: ignore[reportArgumentType]
    out = qn.take(x, indices, "b")
    assert out.axes == x.axes
    assert (out.array == jnp.array([[0.0, 2.0], [3.0, 5.0]])).all()
