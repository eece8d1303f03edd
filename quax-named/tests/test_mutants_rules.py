"""Named axes: tests that kill mutants of `quax_named/_rules.py` which the other test
files let through (`scripts/mutation.sh named-rules`; docs/mutation.md lists each
surviving mutant of the sample run and the test that kills it). References are plain
NumPy on the stored arrays, and literals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_named import NamedArray


DATA = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)


def test_a_contraction_with_an_unnamed_array_keeps_the_published_message() -> None:
    # The published quax's `TypeError: Cannot contract mismatched dimensions`, at the
    # start of the message, also where the other operand has no names (mutant: the
    # message's case changed).
    x = NamedArray(jnp.ones((2, 3)), ("a", "b"))
    with pytest.raises(
        TypeError,
        match=r"^Cannot contract mismatched dimensions: a NamedArray with axes "
        r"\('a', 'b'\) meets an unnamed array of shape \(3, 4\)",
    ):
        quax.quaxify(lambda a: a @ jnp.ones((3, 4)))(x)


def test_joining_two_names_at_one_position_names_the_way_out() -> None:
    # `jnp.concatenate` lines its operands up by position: 'b' meets 'a' at position
    # 1, refused with the two ways out (mutant: the message changed).
    x = NamedArray(jnp.ones((2, 2)), ("a", "b"))
    y = NamedArray(jnp.ones((2, 2)), ("b", "a"))
    with pytest.raises(
        ValueError,
        match=r"position 1 holds axes 'b' and 'a' .*never pairs two names by "
        r"position\. Lay the operands out alike by name first "
        r"\(`quax_named\.transpose`, `quax_named\.align`\), or join by name with "
        r"`quax_named\.concatenate`\.",
    ):
        quax.quaxify(lambda a, b: jnp.concatenate([a, b], axis=0))(x, y)


def test_an_unnamed_array_read_at_named_indices_takes_their_names() -> None:
    # `table[idx]` with a plain table and named indices: the result is named as the
    # indices (mutant: the plain table read as a NamedArray).
    table = np.array([10.0, 20.0, 30.0, 40.0, 50.0], np.float32)
    idx = np.array([[3, 0], [4, 4], [1, 2]], np.int32)
    f = quax.quaxify(lambda i: jnp.asarray(table)[i])
    for run in (f, jax.jit(f)):
        out = run(NamedArray(jnp.asarray(idx), ("p", "q")))
        assert isinstance(out, NamedArray)
        assert out.names == ("p", "q")
        np.testing.assert_array_equal(out.array, table[idx])


def test_an_update_kept_by_keepdims_meets_the_indexed_axis() -> None:
    # `x.at[:, [0]].set(x.sum(axis=1, keepdims=True))`: the updates hold a broadcast
    # axis where indexing `x` gives the (resized) axis 'seq', and a broadcast axis
    # aligns with any (mutant: only two broadcast axes skipped, refused).
    x = NamedArray(jnp.asarray(DATA), ("batch", "seq", "embed"))
    f = quax.quaxify(
        lambda a: a.at[:, jnp.array([0])].set(a.sum(axis=1, keepdims=True))
    )
    want = DATA.copy()
    want[:, [0]] = DATA.sum(axis=1, keepdims=True)
    for run in (f, jax.jit(f)):
        out = run(x)
        assert isinstance(out, NamedArray)
        assert out.names == ("batch", "seq", "embed")
        np.testing.assert_array_equal(out.array, want)
