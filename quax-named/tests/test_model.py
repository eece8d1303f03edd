"""The by-name functions (reductions, `argmax`, `softmax`, cumulative sums, `dot`,
`einsum`, `where`), against literals and plain JAX."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax_named as qn
from hypothesis import given, settings, strategies as st
from quax_named import Axis, NamedArray


def arr(names, key=0, sizes=None):
    sizes = sizes or {"batch": 2, "seq": 3, "feature": 4, "hidden": 5}
    shape = tuple(sizes[n] for n in names)
    return NamedArray(jr.normal(jr.PRNGKey(key), shape), tuple(names))


def laid_out(x, names):
    return np.transpose(np.asarray(x.array), [list(x.names).index(n) for n in names])


@pytest.mark.parametrize(
    "fn", ["sum", "mean", "max", "min", "prod", "var", "std", "logsumexp"]
)
def test_reductions_by_name(fn):
    x = arr(["batch", "seq", "feature"])
    ref = getattr(jnp, fn, None) or jax.nn.logsumexp
    got = getattr(qn, fn)(x, "seq")
    assert got.names == ("batch", "feature")
    np.testing.assert_allclose(got.array, ref(x.array, axis=1), rtol=1e-5)
    got = getattr(qn, fn)(x, ("feature", Axis("batch")))
    np.testing.assert_allclose(got.array, ref(x.array, axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(getattr(qn, fn)(x), ref(x.array), rtol=1e-5)


@pytest.mark.parametrize(
    "fn", ["argmax", "argmin", "softmax", "log_softmax", "cumsum", "cumprod"]
)
def test_along_one_axis(fn):
    x = arr(["batch", "seq", "feature"], 1)
    ref = getattr(jnp, fn, None) or getattr(jax.nn, fn)
    got = getattr(qn, fn)(x, "feature")
    np.testing.assert_allclose(got.array, ref(x.array, axis=2), rtol=1e-5, atol=1e-6)
    keeps = fn not in ("argmax", "argmin")
    assert got.names == (("batch", "seq", "feature") if keeps else ("batch", "seq"))


def test_missing_axis_error():
    with pytest.raises(ValueError, match=r"'hidden' is not an axis.*'batch', 'seq'"):
        qn.sum(arr(["batch", "seq"]), "hidden")


# A 4 x 4 array (square: an axis confused with the other keeps the shape), named
# ("a", "b"), and every by-name reduction along the first axis alone and the last
# axis alone. Literal references where they are short; plain JAX otherwise.
SQUARE = np.arange(16.0, dtype=np.float32).reshape(4, 4)


LITERAL = {
    ("sum", "a"): [24.0, 28.0, 32.0, 36.0],
    ("sum", "b"): [6.0, 22.0, 38.0, 54.0],
    ("mean", "a"): [6.0, 7.0, 8.0, 9.0],
    ("mean", "b"): [1.5, 5.5, 9.5, 13.5],
    ("max", "a"): [12.0, 13.0, 14.0, 15.0],
    ("max", "b"): [3.0, 7.0, 11.0, 15.0],
    ("min", "a"): [0.0, 1.0, 2.0, 3.0],
    ("min", "b"): [0.0, 4.0, 8.0, 12.0],
    ("prod", "a"): [0.0, 585.0, 1680.0, 3465.0],
    ("prod", "b"): [0.0, 840.0, 7920.0, 32760.0],
    ("var", "a"): [20.0, 20.0, 20.0, 20.0],
    ("var", "b"): [1.25, 1.25, 1.25, 1.25],
    ("cumsum", "a"): [[0, 1, 2, 3], [4, 6, 8, 10], [12, 15, 18, 21], [24, 28, 32, 36]],
    ("cumsum", "b"): [[0, 1, 3, 6], [4, 9, 15, 22], [8, 17, 27, 38], [12, 25, 39, 54]],
}


# Every row and column of `SQUARE` increases, so its arg-reductions are the same
# along both axes: they run on a Latin square, whose are not.
LATIN = np.array([[3, 0, 2, 1], [1, 2, 0, 3], [0, 3, 1, 2], [2, 1, 3, 0]], np.float32)


LATIN_LITERAL = {
    ("argmax", "a"): [0, 2, 3, 1],
    ("argmax", "b"): [0, 3, 1, 2],
    ("argmin", "a"): [2, 0, 1, 3],
    ("argmin", "b"): [1, 2, 0, 3],
}


PLAIN = {
    "std": jnp.std,
    "logsumexp": jax.nn.logsumexp,
    "softmax": jax.nn.softmax,
    "log_softmax": jax.nn.log_softmax,
    "cumprod": jnp.cumprod,
}


BY_NAME = [*sorted({fn for fn, _ in LITERAL}), *PLAIN, "argmax", "argmin"]


@pytest.mark.parametrize("fn", BY_NAME)
@pytest.mark.parametrize("axis", ["a", "b"])
@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_by_name_reductions_on_the_first_and_last_axes_alone(fn, axis, order):
    position = {"a": 0, "b": 1}[axis]
    data = LATIN if fn in ("argmax", "argmin") else SQUARE
    x = NamedArray(jnp.asarray(data), ("a", "b"))
    if order != x.names:  # the same named array, stored the other way round
        x = NamedArray(jnp.asarray(data.T), order)
    got = getattr(qn, fn)(x, axis)
    keeps = fn in ("softmax", "log_softmax", "cumsum", "cumprod")
    assert got.names == (order if keeps else tuple(n for n in "ab" if n != axis))
    if (fn, axis) in LITERAL:
        want = np.array(LITERAL[fn, axis], np.float32)
    elif (fn, axis) in LATIN_LITERAL:
        want = np.array(LATIN_LITERAL[fn, axis])
    else:
        want = np.asarray(PLAIN[fn](jnp.asarray(SQUARE), axis=position))
    if keeps and order != ("a", "b"):
        want = want.T
    np.testing.assert_allclose(got.array, want, rtol=1e-6, atol=1e-6)
    # The same axis given as an `Axis`, and (for reductions over sets of axes) as
    # a one-element sequence.
    again = getattr(qn, fn)(x, Axis(axis))
    np.testing.assert_array_equal(again.array, got.array)
    if not keeps and fn not in ("argmax", "argmin"):
        again = getattr(qn, fn)(x, [axis])
        np.testing.assert_array_equal(again.array, got.array)


@settings(max_examples=10, deadline=None)
@given(
    st.permutations(["batch", "seq", "feature"]), st.permutations(["feature", "hidden"])
)
def test_dot_and_einsum_by_name(p1, p2):
    x, w = arr(p1, 4), arr(p2, 5)
    want = np.einsum(
        "bsf,fh->bsh",
        laid_out(x, ["batch", "seq", "feature"]),
        laid_out(w, ["feature", "hidden"]),
    )
    got = qn.dot(x, w, axis="feature")
    np.testing.assert_allclose(
        laid_out(got, ["batch", "seq", "hidden"]), want, rtol=1e-4, atol=1e-5
    )
    got = qn.einsum("batch seq feature, feature hidden -> hidden batch seq", x, w)
    assert got.names == ("hidden", "batch", "seq")
    np.testing.assert_allclose(
        laid_out(got, ["batch", "seq", "hidden"]), want, rtol=1e-4, atol=1e-5
    )


def test_dot_batches_shared_axes_and_errors():
    q, k = arr(["batch", "seq", "feature"], 6), arr(["batch", "feature", "hidden"], 7)
    got = qn.dot(q, k, axis="feature")
    assert got.names == ("batch", "seq", "hidden")
    np.testing.assert_allclose(
        got.array, jnp.einsum("bsf,bfh->bsh", q.array, k.array), rtol=1e-5
    )
    with pytest.raises(ValueError, match="'nope' to contract is in none"):
        qn.dot(q, k, axis="nope")
    with pytest.raises(ValueError, match="does not name the axes"):
        qn.einsum("batch seq, feature hidden -> batch", q, k)
    with pytest.raises(ValueError, match="axis 'seq' has size 3 in one operand and 5"):
        qn.dot(q, NamedArray(jnp.ones(5), ("seq",)), axis=None)


def test_where_and_comparisons_by_name():
    x, y = arr(["batch", "feature"], 10), arr(["feature", "batch"], 11)
    got = qn.where(x > y, x, 0.0)
    yt = laid_out(y, ["batch", "feature"])
    want = np.where(np.asarray(x.array) > yt, x.array, 0.0)
    np.testing.assert_array_equal(laid_out(got, ["batch", "feature"]), want)
    assert (x <= 0.0).names == ("batch", "feature")


NAN = np.array([[1.0, np.nan, -2.0], [np.inf, 0.5, -0.0]], np.float32)


@pytest.mark.parametrize("fn", ["sum", "max", "mean", "softmax", "cumsum", "argmax"])
def test_non_finite_entries_by_name(fn):
    x = NamedArray(jnp.asarray(NAN), ("a", "b"))
    ref = getattr(jnp, fn, None) or getattr(jax.nn, fn)
    for axis, position in (("a", 0), ("b", 1)):
        got = getattr(qn, fn)(x, axis).array
        np.testing.assert_array_equal(got, ref(jnp.asarray(NAN), axis=position))
