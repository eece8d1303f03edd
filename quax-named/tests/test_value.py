"""`NamedArray`: what its constructor checks, the materialisation policy, looking
axes up by name, and its own by-name methods (operators aligned and broadcast by
name, `rename`, `transpose`, `broadcast_to`, indexing and `.at`), against plain
JAX."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_named
import quax_named as qn
from hypothesis import given, settings, strategies as st
from quax_named import Axis, NamedArray, NamedMaterialisationError


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
    with pytest.raises(NamedMaterialisationError, match=r"primitive `top_k`.*nmap"):
        quax.quaxify(lambda x: jax.lax.top_k(x, 2))(x)
    with pytest.raises(NamedMaterialisationError, match="`bitcast_convert_type`"):
        quax.quaxify(lambda x: jax.lax.bitcast_convert_type(x, jnp.uint8))(x)
    assert issubclass(NamedMaterialisationError, RuntimeError)
    # Allowing materialisation drops the names, as in the published quax.
    out = quax.quaxify(lambda x: jax.lax.top_k(x, 2)[0])(x.enable_materialise())
    assert not isinstance(out, NamedArray)


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


def arr(names, key=0, sizes=None):
    sizes = sizes or {"batch": 2, "seq": 3, "feature": 4, "hidden": 5}
    shape = tuple(sizes[n] for n in names)
    return NamedArray(jr.normal(jr.PRNGKey(key), shape), tuple(names))


def laid_out(x, names):
    return np.transpose(np.asarray(x.array), [list(x.names).index(n) for n in names])


def test_rename_and_transpose():
    x = arr(["batch", "seq", "feature"])
    y = qn.rename(x, {"feature": "embed"})
    assert y.names == ("batch", "seq", "embed") and y.array is x.array
    t = x.transpose("feature", ...)
    assert t.names == ("feature", "batch", "seq")
    np.testing.assert_array_equal(t.array, np.transpose(x.array, (2, 0, 1)))
    assert qn.transpose(x, ["batch", "seq", "feature"]) is x
    with pytest.raises(ValueError, match=r"omits axes \('feature',\)"):
        x.transpose("seq", "batch")


@settings(max_examples=15, deadline=None)
@given(
    st.permutations(["batch", "seq", "feature"]), st.permutations(["feature", "seq"])
)
def test_binary_operators_align_by_name(p1, p2):
    x, y = arr(p1, 2), arr(p2, 3)
    got = x * y + 1.0
    want = (
        laid_out(x, ["batch", "seq", "feature"]) * laid_out(y, ["seq", "feature"])[None]
        + 1.0
    )
    np.testing.assert_allclose(
        laid_out(got, ["batch", "seq", "feature"]), want, rtol=1e-6
    )
    np.testing.assert_allclose(
        laid_out(2.0 - y, ["seq", "feature"]), 2.0 - laid_out(y, ["seq", "feature"])
    )


def test_binary_size_mismatch():
    x = arr(["batch"])
    y = NamedArray(jnp.ones(3), ("batch",))
    with pytest.raises(ValueError, match="Axis 'batch' has size 2 and 3"):
        _ = x + y
    with pytest.raises(ValueError, match=r"unnamed array of shape \(2,\)"):
        _ = x + jnp.ones(2)


def test_indexing_and_at_by_name():
    x = arr(["batch", "seq", "feature"], 8)
    got = x[{"seq": 1, "feature": slice(1, 3)}]
    assert got.names == ("batch", "feature") and got.sizes == {"batch": 2, "feature": 2}
    np.testing.assert_array_equal(got.array, x.array[:, 1, 1:3])
    idx = NamedArray(jnp.array([[0, 2], [1, 1]]), ("i", "j"))
    taken = x[{"feature": idx}]
    assert taken.names == ("batch", "seq", "i", "j")
    np.testing.assert_array_equal(taken.array, x.array[:, :, idx.array])
    row = NamedArray(jnp.arange(4.0), ("feature",))
    upd = x.at[{"batch": 0}].set(row)
    want = np.asarray(x.array).copy()
    want[0] = np.arange(4.0)[None, :]
    np.testing.assert_array_equal(upd.array, want)
    np.testing.assert_array_equal(
        x.at[{"seq": 2}].add(1.0).array, x.array.at[:, 2].add(1.0)
    )
    np.testing.assert_array_equal(x.at[{"seq": 2}].get().array, x.array[:, 2])
    with pytest.raises(TypeError, match="indexed by name"):
        _ = x[0]
    with pytest.raises(TypeError, match="unnamed array of shape"):
        x.at[{"batch": 0}].set(jnp.ones((3, 4)))


def test_broadcast_to():
    x = arr(["feature"])
    y = qn.broadcast_to(x, [Axis("batch", 2), "feature"])
    np.testing.assert_array_equal(y.array, np.broadcast_to(x.array, (2, 4)))
    with pytest.raises(ValueError, match="needs a size for new axis 'seq'"):
        qn.broadcast_to(x, ["seq", "feature"])
    with pytest.raises(ValueError, match=r"would drop axes \('feature',\)"):
        qn.broadcast_to(x, ["seq"], {"seq": 3})
