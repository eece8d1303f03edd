"""Arguments of the by-name functions that were accepted and then not read:
`broadcast_to`'s `sizes` for an axis `x` already has (or one not among `axes`) was
ignored, so `broadcast_to(x, ("b", "f"), {"f": 4})` of an `x` with `f` of size 3
returned `f` of size 3; an `Axis` with a size given to find an axis (`qn.sum(x,
Axis("f", 7))`, `qn.transpose`, ...) was matched by name alone, though an `Axis`'s
size is one every array must have along it. Both are refused now (each test failed
before: seen). References are literals and plain JAX."""

import jax.numpy as jnp
import numpy as np
import pytest
import quax_named as qn
from quax_named import Axis, NamedArray


x = NamedArray(jnp.arange(6.0).reshape(2, 3), ("b", "f"))


def test_broadcast_to_size_of_an_existing_axis_that_differs_is_refused():
    with pytest.raises(ValueError, match=r"broadcast_to got size 4 for 'f'.* size 3"):
        qn.broadcast_to(x, ("b", "f"), {"f": 4})


def test_broadcast_to_size_of_an_axis_not_asked_for_is_refused():
    # A typo: the size of "hh" would be unused, and "h" has none.
    with pytest.raises(ValueError, match=r"size for 'hh', which is not among"):
        qn.broadcast_to(x, ("b", "f", "h"), {"hh": 2, "h": 2})


def test_broadcast_to_sizes_that_agree_or_are_new():
    out = qn.broadcast_to(x, ("h", "b", "f"), {"f": 3, "h": 2})
    assert out.axes == (Axis("h"), Axis("b"), Axis("f"))
    np.testing.assert_array_equal(
        out.array, np.broadcast_to(np.asarray(x.array), (2, 2, 3))
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda axis: qn.sum(x, axis),
        lambda axis: qn.transpose(x, (axis, "b")),
        lambda axis: qn.take(x, 0, axis),
        lambda axis: x.index(axis),
    ],
    ids=["sum", "transpose", "take", "index"],
)
def test_axis_with_another_size_is_refused(call):
    with pytest.raises(ValueError, match=r"Axis\('f', size=7\) has size 7.* size 3"):
        call(Axis("f", 7))
    # The right size, or none, finds the axis.
    for axis in (Axis("f", 3), Axis("f"), "f"):
        call(axis)


def test_axis_with_its_size_sums_that_axis():
    np.testing.assert_array_equal(qn.sum(x, Axis("f", 3)).array, [3.0, 12.0])
