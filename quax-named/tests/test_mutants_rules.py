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


# The second sample (seed 46).


def test_two_names_at_one_position_are_refused_with_the_way_out() -> None:
    # `a + b` with axes 'a' and 'b' of one size: positional code would put both at
    # position 0, and names never pair by position; the message says why and what
    # to do instead (mutant `_layout` 35: the sentence changed).
    a = NamedArray(jnp.arange(3.0), ("a",))
    b = NamedArray(jnp.arange(3.0), ("b",))
    with pytest.raises(
        ValueError,
        match=r"their axes \('a',\) and \('b',\) together have more axes than the "
        r"result's positional shape \(3,\) can hold \(quax_named never aligns "
        r"different names by position\)\. Broadcast explicitly by name "
        r"\(`quax_named\.broadcast_to`, the NamedArray operators\) or use "
        r"`quax_named\.nmap`\.",
    ):
        quax.quaxify(lambda a, b: a + b)(a, b)


def test_an_unnamed_array_meets_a_named_one_densely_where_allowed() -> None:
    # `x + v` with `v` an unnamed array that is not one value: where the NamedArray
    # allows materialising, the sum is the dense one, broadcast by position
    # (mutant `_elementwise` 61: the fallback given `None` for its operands).
    x = NamedArray(jnp.asarray(DATA[0]), ("a", "b")).enable_materialise()
    v = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
    f = quax.quaxify(lambda a: a + jnp.asarray(v))
    for run in (f, jax.jit(f)):
        np.testing.assert_array_equal(run(x), DATA[0] + v)


def test_broadcast_axes_merged_and_split_keep_their_sizes() -> None:
    # A vector broadcast along two axes and reshaped: the broadcast axes merge into
    # one of size 20, and one of size 20 splits into two of sizes 4 and 5, each
    # holding its size (mutant `_regroup` 96: the new broadcast axes of size None).
    v = NamedArray(jnp.array([1.0, 2.0, 3.0]), ("a",))
    merged = quax.quaxify(
        lambda v: jnp.broadcast_to(v[:, None, None], (3, 4, 5)).reshape(3, 20)
    )
    split = quax.quaxify(
        lambda v: jnp.broadcast_to(v[:, None], (3, 20)).reshape(3, 4, 5)
    )
    for fn, sizes in ((merged, [20]), (split, [4, 5])):
        for run in (fn, jax.jit(fn)):
            out = run(v)
            assert isinstance(out, NamedArray)
            assert out.names[0] == "a"
            assert [axis.size for axis in out.axes[1:]] == sizes
            want = np.broadcast_to(np.array([1.0, 2.0, 3.0])[:, None], (3, 20))
            np.testing.assert_array_equal(out.array, want.reshape(out.array.shape))


def test_reading_along_an_axis_pairs_the_batched_axes_by_name() -> None:
    # `jnp.take_along_axis(x, idx, axis=1)` is a gather batched along axis 0: with
    # plain indices the result keeps `x`'s names; with named ones, the batched axes
    # must have one name, and 'a' against 'c' is refused (mutant `_gather_axes` 58:
    # plain indices crashed, and 'a' was paired with 'c' silently).
    x = NamedArray(jnp.arange(12.0).reshape(3, 4), ("a", "b"))
    idx = np.array([[0, 3], [1, 1], [2, 0]], np.int32)
    want = np.take_along_axis(np.arange(12.0).reshape(3, 4), idx, axis=1)
    take = quax.quaxify(lambda x, i: jnp.take_along_axis(x, i, axis=1))
    for run in (take, jax.jit(take)):
        out = run(x, jnp.asarray(idx))
        assert isinstance(out, NamedArray)
        assert out.names == ("a", "b")
        np.testing.assert_array_equal(out.array, want)
        out = run(x, NamedArray(jnp.asarray(idx), ("a", "d")))
        assert out.names == ("a", "d")
        np.testing.assert_array_equal(out.array, want)
        with pytest.raises(
            ValueError,
            match=r"with operand axis 'a' batched with index axis 'c': quax_named "
            r"never pairs two names by position",
        ):
            run(x, NamedArray(jnp.asarray(idx), ("c", "d")))


# The registered rules, a first sample (seed 48, `--decorated`).


def test_an_unnamed_array_joined_to_a_named_one_densely_where_allowed() -> None:
    # `jnp.concatenate` of a NamedArray and an unnamed array that is not one value:
    # where the NamedArray allows materialising, the dense concatenation (mutant
    # `_concatenate` 10: the fallback given `None` for its operands).
    x = NamedArray(jnp.asarray(DATA[0]), ("a", "b")).enable_materialise()
    v = np.array([[1.0, -2.0, 0.5, 4.0]], np.float32)
    f = quax.quaxify(lambda a: jnp.concatenate([a, jnp.asarray(v)], axis=0))
    for run in (f, jax.jit(f)):
        np.testing.assert_array_equal(run(x), np.concatenate([DATA[0], v], axis=0))


def test_an_unnamed_update_written_densely_where_allowed() -> None:
    # `lax.dynamic_update_slice` of a NamedArray by an unnamed update that is not one
    # value: where the NamedArray allows materialising, the dense update (mutant
    # `_dynamic_update_slice` 19: the fallback given `None` for its params).
    x = NamedArray(jnp.asarray(DATA[0]), ("a", "b")).enable_materialise()
    u = np.array([[7.0, -1.0], [2.5, 9.0]], np.float32)
    f = quax.quaxify(lambda a: jax.lax.dynamic_update_slice(a, jnp.asarray(u), (1, 2)))
    want = DATA[0].copy()
    want[1:3, 2:4] = u
    for run in (f, jax.jit(f)):
        np.testing.assert_array_equal(run(x), want)


# The registered rules, a second sample (seed 49, `--decorated`).


def test_an_unnamed_array_times_a_named_one_is_refused_or_dense() -> None:
    # `v @ x` with the unnamed array on the left: refused, naming the NamedArray's
    # axes and the unnamed array's shape; where the NamedArray allows materialising,
    # the dense product (mutant `_dot_general_rhs` 6: the unnamed operand left out
    # of the call, a `TypeError` of Python's in both cases).
    v = np.array([[1.0, -2.0], [0.5, 3.0], [4.0, 1.0]], np.float32)
    f = quax.quaxify(lambda a: jnp.asarray(v) @ a)
    x = NamedArray(jnp.asarray(DATA[0, :2]), ("a", "b"))
    with pytest.raises(
        TypeError,
        match=r"^Cannot contract mismatched dimensions: a NamedArray with axes "
        r"\('a', 'b'\) meets an unnamed array of shape \(3, 2\) in `dot_general`",
    ):
        f(x)
    for run in (f, jax.jit(f)):
        np.testing.assert_allclose(
            run(x.enable_materialise()), v @ DATA[0, :2], rtol=1e-6
        )


def test_stacking_a_named_and_an_unnamed_array_names_the_way_out() -> None:
    # `jnp.stack` of a NamedArray and an unnamed array that is not one value:
    # refused, with the way out of stacking by name (mutant `_stack` 1: the way out
    # `None`, printed as "None" in the message).
    x = NamedArray(jnp.asarray(DATA[0]), ("a", "b"))
    with pytest.raises(
        ValueError,
        match=r"Wrap the other operand as `NamedArray\(array, axes\)`, or stack by "
        r"name with `quax_named\.stack`\.$",
    ):
        quax.quaxify(lambda a: jnp.stack([a, jnp.asarray(DATA[1])]))(x)


def test_a_join_that_would_hold_one_name_twice_is_refused() -> None:
    # `x[:, None]` (axes 'a' and a broadcast axis) joined along position 1 to `x`
    # broadcast along position 0 (a broadcast axis and 'a'): position 0 holds 'a',
    # and the joined axis is 'a' too. Refused, naming the axis and both operands
    # (mutant `_concatenate` 80: the operands `None`, a `TypeError` of Python's).
    x = NamedArray(jnp.arange(3.0), ("a",))
    f = quax.quaxify(
        lambda x: jnp.concatenate(
            [x[:, None], jnp.broadcast_to(x[None, :], (3, 3))], axis=1
        )
    )
    with pytest.raises(
        ValueError,
        match=r"^`concatenate` would hold axis 'a' twice \(operands \('a', '<broadcast "
        r"1>'\) and \('<broadcast 3>', 'a'\)\): a NamedArray holds each axis once\. "
        r"Rename one of them first \(`quax_named\.rename`\)\.$",
    ):
        f(x)


def test_an_update_of_another_rank_is_refused_as_jax_refuses_it() -> None:
    # Plain JAX raises `TypeError: dynamic_update_slice update must have the same rank
    # as operand`; so does the rule, naming the axes, where it once let `zip` raise a
    # bare `ValueError` (mutant: the `zip`'s `strict=True` dropped).
    x = NamedArray(jnp.ones((4, 3)), ("a", "b"))
    update = NamedArray(jnp.ones((2,)), ("a",))
    with pytest.raises(
        TypeError,
        match=r"^dynamic_update_slice update must have the same rank as operand, got "
        r"an update with axes \('a',\) for a NamedArray with axes \('a', 'b'\)\.$",
    ):
        quax.quaxify(lambda x, u: jax.lax.dynamic_update_slice(x, u, (0, 0)))(x, update)


def test_an_update_laid_out_by_other_names_names_the_update_by_name() -> None:
    # An update whose names lie in another order than the array's is refused, and
    # the message ends with the way out: `x.at[{...}].set(update)`, exactly as
    # written (mutants: the way out `None`, or its case changed).
    x = NamedArray(jnp.ones((3, 3)), ("a", "b"))
    update = NamedArray(jnp.ones((2, 2)), ("b", "a"))
    with pytest.raises(
        ValueError,
        match=r"^`dynamic_update_slice` writes an update with axes \('b', 'a'\) into "
        r"a NamedArray with axes \('a', 'b'\), and position 0 holds 'b' in one and "
        r"'a' in the other: quax_named never pairs two names by position\. Lay the "
        r"update out as the array, or update by name with "
        r"`x\.at\[\{\.\.\.\}\]\.set\(update\)`\.$",
    ):
        quax.quaxify(lambda x, u: jax.lax.dynamic_update_slice(x, u, (0, 0)))(x, update)


def test_stacks_joined_along_their_anonymous_axis_keep_its_size() -> None:
    # Two stacks of a NamedArray (an anonymous leading axis each, of 2 and 3 pieces)
    # joined along it: one anonymous axis of 5 (mutant: its size dropped to `None`,
    # which matches any size).
    x = NamedArray(jnp.asarray(DATA[0]), ("a", "b"))
    f = quax.quaxify(lambda x: jnp.concatenate([jnp.stack([x, x]), jnp.stack([x] * 3)]))
    for run in (f, jax.jit(f)):
        out = run(x)
        assert out.axes[0].name is None and out.axes[0].size == 5
        assert out.names[1:] == ("a", "b") and out.array.shape == (5, 3, 4)
        np.testing.assert_array_equal(out.array, np.stack([DATA[0]] * 5))


def test_mismatched_batch_axes_are_named_on_both_sides() -> None:
    # The refusal names each operand's axes (mutant: the right-hand side's dropped).
    p = NamedArray(jnp.ones((2, 3, 4)), ("b", "i", "j"))
    q = NamedArray(jnp.ones((2, 4, 5)), ("c", "j", "k"))
    with pytest.raises(
        TypeError,
        match=r"^Cannot batch mismatched dimensions: lhs axis 'b' \(of \('b', 'i', "
        r"'j'\)\) with rhs axis 'c' \(of \('c', 'j', 'k'\)\)\. If they are the same "
        r"axis",
    ):
        quax.quaxify(
            lambda p, q: jax.lax.dot_general(p, q, (((2,), (1,)), ((0,), (0,))))
        )(p, q)


# The registered rules against the whole suite (seed 51, `--suite --decorated`).


def test_joining_two_differently_named_axes_names_the_way_out() -> None:
    # `seq` joined to `time` by position: refused, with the reason and both ways
    # out whole (mutant `_concatenate` 64: the first way out changed).
    x = NamedArray(jnp.asarray(DATA), ("batch", "seq", "embed"))
    y = NamedArray(jnp.asarray(DATA[:, :2]), ("batch", "time", "embed"))
    with pytest.raises(
        ValueError,
        match=r"^`concatenate` joins axes \('seq', 'time'\) along position 1 "
        r"\(\('batch', 'seq', 'embed'\) and \('batch', 'time', 'embed'\)\): a "
        r"joined axis is one axis, and quax_named never pairs two names by "
        r"position\. Give the pieces one name \(`quax_named\.rename`\), or join by "
        r"name with `quax_named\.concatenate`\.$",
    ):
        quax.quaxify(lambda a, b: jnp.concatenate([a, b], axis=1))(x, y)


# Named's undecorated functions against the whole suite (seed 51, `--suite`).


def test_a_broadcast_axis_of_the_results_size_is_the_one_kept() -> None:
    # `v[:, None] + jnp.broadcast_to(v[:, None], (3, 4))`: at position 1 one operand
    # holds a broadcast axis of size 1 and the other one of size 4, and no name; the
    # result keeps the one of its own size, 4 (mutant `_same_layout` 38: the one of
    # size 1 kept, an axis of size 1 over 4 entries).
    v = NamedArray(jnp.array([1.0, 2.0, 3.0]), ("x",))
    f = quax.quaxify(lambda v: v[:, None] + jnp.broadcast_to(v[:, None], (3, 4)))
    want = np.broadcast_to(2.0 * np.array([1.0, 2.0, 3.0])[:, None], (3, 4))
    for run in (f, jax.jit(f)):
        out = run(v)
        assert isinstance(out, NamedArray)
        assert out.names == ("x", None)
        assert out.axes[1].size == 4
        np.testing.assert_array_equal(out.array, want)


def test_a_name_met_at_a_taken_position_takes_the_first_free_one_of_its_size() -> None:
    # Two vectors broadcast alike to (3, 3, 3) and added: positional code puts 'x'
    # and 'y' both at position 0, and aligning by name moves 'y' to the first free
    # position of its size, 1, leaving the broadcast axis at 2; the entries are
    # v[i] + w[j] (mutant `_layout` 44: 'y' laid out at position 2).
    v = NamedArray(jnp.array([1.0, 2.0, 3.0]), ("x",))
    w = NamedArray(jnp.array([10.0, 20.0, 30.0]), ("y",))

    def spread(a):
        return jnp.broadcast_to(a[:, None, None], (3, 3, 3))

    f = quax.quaxify(lambda v, w: spread(v) + spread(w))
    sums = np.array([1.0, 2.0, 3.0])[:, None] + np.array([10.0, 20.0, 30.0])[None, :]
    want = np.broadcast_to(sums[:, :, None], (3, 3, 3))
    for run in (f, jax.jit(f)):
        out = run(v, w)
        assert isinstance(out, NamedArray)
        assert out.names == ("x", "y", None)
        np.testing.assert_array_equal(out.array, want)


# Named's registered rules against the whole suite (seed 52, `--suite --decorated`).


def test_contracting_unequal_numbers_of_axes_is_refused_as_jax_refuses_it() -> None:
    # `lax.dot_general` binds its dimension numbers unchecked, and JAX's shape rule
    # refuses two contracting axes against one with a `TypeError`; so does the rule,
    # naming the axes, where it used to fail inside `zip` (mutant `_dot_general` 7:
    # the pairs zipped loosely, the second axis of 'a', 'b' never checked).
    x = NamedArray(jnp.ones((2, 3)), ("a", "b"))
    y = NamedArray(jnp.ones((2, 4)), ("a", "c"))
    dimension_numbers = (((0, 1), (0,)), ((), ()))
    with pytest.raises(TypeError, match="dot_general"):
        jax.lax.dot_general(jnp.ones((2, 3)), jnp.ones((2, 4)), dimension_numbers)
    with pytest.raises(
        TypeError,
        match=r"^dot_general requires as many contracting dimensions, and as many "
        r"batch dimensions, on each side, got .* for operands with axes "
        r"\('a', 'b'\) and \('a', 'c'\)\. Contract by name",
    ):
        quax.quaxify(lambda x, y: jax.lax.dot_general(x, y, dimension_numbers))(x, y)


def test_an_updated_slice_keeps_the_arrays_permission_to_materialise() -> None:
    # `lax.dynamic_update_slice` of a NamedArray keeps its names and its
    # `allow_materialise`, as every positional rule does (mutant
    # `_dynamic_update_slice` 56: the permission dropped, `None`).
    data = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    update = NamedArray(jnp.ones((1, 2)), ("a", "b"))
    want = data.copy()
    want[1:, 1:] = 1.0
    f = quax.quaxify(lambda x, u: jax.lax.dynamic_update_slice(x, u, (1, 1)))
    for allowed in (True, False):
        x = NamedArray(jnp.asarray(data), ("a", "b"))
        x = x.enable_materialise() if allowed else x
        for run in (f, jax.jit(f)):
            out = run(x, update)
            assert out.names == ("a", "b")
            assert out.allow_materialise is allowed
            np.testing.assert_array_equal(out.array, want)


def test_a_reshape_that_also_transposes_is_dense_where_allowed() -> None:
    # `lax.reshape` with `dimensions` transposes and regroups at once: refused with
    # the way out, and where materialising is allowed the plain array NumPy gives
    # (mutants `_reshape` 21: the fallback without its `dimensions`, no transpose;
    # `_reshape` 31: the fallback rule asked for without its primitive).
    data = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    f = quax.quaxify(lambda x: jax.lax.reshape(x, (3, 2), dimensions=(1, 0)))
    want = np.reshape(np.transpose(data), (3, 2))
    x = NamedArray(jnp.asarray(data), ("a", "b"))
    with pytest.raises(ValueError, match=r"`reshape` with `dimensions=\(1, 0\)`"):
        f(x)
    for run in (f, jax.jit(f)):
        out = run(x.enable_materialise())
        assert not isinstance(out, NamedArray)
        np.testing.assert_array_equal(out, want)


def test_sorting_operands_laid_out_apart_names_the_ways_out() -> None:
    # `lax.sort` of two NamedArrays whose names differ by position: refused with both
    # ways out, the second `quax_named.sort`/`quax_named.argsort` (mutants `_sort`
    # 14, 15, 16: that way out `None`, or its text changed).
    x = NamedArray(jnp.arange(6.0).reshape(2, 3), ("a", "b"))
    y = NamedArray(jnp.arange(6.0).reshape(2, 3), ("b", "a"))
    with pytest.raises(
        ValueError,
        match=r"^`sort` lines up its operands position by position, and position 0 "
        r"holds axes 'a' and 'b' .*: quax_named never pairs two names by position\. "
        r"Lay the operands out alike by name first \(`quax_named\.transpose`, "
        r"`quax_named\.align`\), or sort by name with "
        r"`quax_named\.sort`/`quax_named\.argsort`\.$",
    ):
        quax.quaxify(lambda x, y: jax.lax.sort((x, y), num_keys=1))(x, y)


def _scan_rows(x):
    return jax.lax.scan(lambda c, row: (c + row, 2.0 * row), jnp.zeros(3), x)[1]


_INDICES = jnp.array([1, 0])

# One program per positional rule of `quax_named/_rules.py`, each taking a (2, 3)
# NamedArray 'a', 'b' (and `y`, the same axes) to NamedArrays.
_KEEPING_PERMISSION = {
    "elementwise": lambda x, y: jnp.sin(x) + y,
    "dot_general": lambda x, y: jnp.einsum("ab,ab->a", x, y),
    "reduction": lambda x, y: jnp.sum(x, axis=1),
    "cumulative": lambda x, y: jnp.cumsum(x, axis=1),
    "transpose": lambda x, y: x.T,
    "broadcast_in_dim": lambda x, y: jnp.broadcast_to(x, (4, 2, 3)),
    "squeeze": lambda x, y: jnp.squeeze(x[:, None, :], axis=1),
    "reshape": lambda x, y: jnp.reshape(x, (2, 3, 1)),
    "slice": lambda x, y: x[:, 1:],
    "rev": lambda x, y: jnp.flip(x, axis=1),
    "scan": lambda x, y: _scan_rows(x),
    "concatenate": lambda x, y: jnp.concatenate([x, y], axis=1),
    "stack": lambda x, y: jnp.stack([x, y]),
    "unstack": lambda x, y: jax.lax.unstack(x)[0],
    "split": lambda x, y: jnp.split(x, [1], axis=1)[1],
    "pad": lambda x, y: jnp.pad(x, ((0, 0), (1, 1))),
    "dynamic_slice": lambda x, y: jax.lax.dynamic_slice(x, (0, 1), (2, 2)),
    "dynamic_update_slice": lambda x, y: jax.lax.dynamic_update_slice(
        x, y[:, :1], (0, 1)
    ),
    "sort": lambda x, y: jnp.sort(x, axis=1),
    "fft": lambda x, y: jnp.fft.fft(x).real,
    "gather": lambda x, y: x[_INDICES],
    "scatter": lambda x, y: x.at[_INDICES].set(y),
}


@pytest.mark.parametrize("allowed", [True, False])
@pytest.mark.parametrize("op", sorted(_KEEPING_PERMISSION))
def test_every_positional_rule_keeps_the_permission_to_materialise(
    op: str, allowed: bool
) -> None:
    # Each rule's result carries its operands' `allow_materialise`, so that a
    # program that allowed materialising keeps it after any positional step, and
    # one that did not still refuses later (mutants: a rule's result made with the
    # permission `None`, or another operand's, as `_dynamic_update_slice` 56 did).
    def named(x):
        x = NamedArray(jnp.asarray(x, jnp.float32), ("a", "b"))
        return x.enable_materialise() if allowed else x

    x = named(np.arange(6.0).reshape(2, 3))
    y = named(np.ones((2, 3)))
    out = quax.quaxify(_KEEPING_PERMISSION[op])(x, y)
    assert isinstance(out, NamedArray)
    assert out.allow_materialise is allowed


_OTHER = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
_ROWS, _COLUMNS = jnp.array([1, 0]), jnp.array([2, 0])

# One program per fallback of `quax_named/_rules.py`: each meets a (2, 3) NamedArray
# with an unnamed array it cannot line up by name (or regroups it by position), and
# so is refused unless materialising is allowed.
_FALLING_BACK = {
    "elementwise": lambda x: x + jnp.asarray(_OTHER),
    "dot_general": lambda x: x @ jnp.arange(12.0).reshape(3, 4),
    "reshape": lambda x: jnp.reshape(x, (3, 2)),
    "concatenate": lambda x: jnp.concatenate([x, jnp.asarray(_OTHER)], axis=0),
    "stack": lambda x: jnp.stack([x, jnp.asarray(_OTHER)]),
    "dynamic_update_slice": lambda x: jax.lax.dynamic_update_slice(
        x, jnp.asarray(_OTHER)[:, :2], (0, 1)
    ),
    "gather": lambda x: x[_ROWS, _COLUMNS],
    "scatter": lambda x: x.at[_ROWS, _COLUMNS].set(jnp.array([7.0, 8.0])),
    "scatter_add": lambda x: x.at[_ROWS].add(jnp.asarray(_OTHER)),
}


@pytest.mark.parametrize("op", sorted(_FALLING_BACK))
def test_every_fallback_is_the_dense_computation_where_allowed(op: str) -> None:
    # Where materialising is allowed, each refused program gives what plain JAX
    # gives on the stored array, eagerly and under `jit`; otherwise it is refused
    # (mutants: a fallback called with its params or values spoiled, or without
    # its primitive, as `_reshape` 21 and 31 were).
    f = _FALLING_BACK[op]
    data = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    want = np.asarray(f(jnp.asarray(data)))
    x = NamedArray(jnp.asarray(data), ("a", "b"))
    with pytest.raises((TypeError, ValueError)):
        quax.quaxify(f)(x)
    g = quax.quaxify(f)
    for run in (g, jax.jit(g)):
        out = run(x.enable_materialise())
        assert not isinstance(out, NamedArray)
        np.testing.assert_allclose(out, want, rtol=1e-6)
