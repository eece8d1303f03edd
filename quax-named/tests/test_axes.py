"""`Axis`: named and anonymous axes, and the names and sizes an axis accepts."""

import jax.numpy as jnp
import numpy as np
import pytest
import quax_named
from quax_named import Axis, NamedArray


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
