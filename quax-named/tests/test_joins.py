"""Joining, splitting, reshaping, indexing, sorting, shifting, padding and FFTs
along named axes: by name (`quax_named.concatenate`, ..., `quax_named.fft.*`),
whatever the storage order, and in unmodified positional code inside
`quax.quaxify`. References are plain JAX/NumPy on the stored arrays laid out by
hand, and literals; under `jax.jit` and `jax.grad`; NaN in, NaN out."""

import itertools
from collections import Counter

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_named as qn
from quax_named import Axis, NamedArray


NAMES = ("batch", "seq", "embed")
DATA = np.asarray(jr.normal(jr.PRNGKey(0), (2, 3, 4)), np.float32)
OTHER = np.asarray(jr.normal(jr.PRNGKey(1), (2, 5, 4)), np.float32)  # seq 5
ORDERS = list(itertools.permutations(NAMES))


def stored(data, order, names=NAMES):
    """`data` (laid out as `names`) stored in `order`, by plain NumPy."""
    return NamedArray(
        jnp.asarray(np.transpose(data, [names.index(n) for n in order])), order
    )


def laid_out(x, names):
    """`x.array` transposed to `names` (plain NumPy, independent of quax_named)."""
    return np.transpose(np.asarray(x.array), [list(x.names).index(n) for n in names])


def same(got, want, names, exact=True):
    assert isinstance(got, NamedArray)
    assert Counter(got.names) == Counter(names), (got.names, names)
    if exact:
        np.testing.assert_array_equal(laid_out(got, names), want)
    else:
        np.testing.assert_allclose(laid_out(got, names), want, rtol=1e-5, atol=1e-5)


# By name --------------------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS[::2])
def test_concatenate_stack_split_by_name(order):
    x = stored(DATA, NAMES)
    y = stored(OTHER, order)  # laid out otherwise: joined by name
    got = qn.concatenate([x, y], "seq")
    assert got.names == NAMES and got.sizes["seq"] == 8
    same(got, np.concatenate([DATA, OTHER], axis=1), NAMES)
    got = qn.stack([x, stored(DATA * 2, order)], "ens")
    assert got.names[0] == "ens"
    same(got, np.stack([DATA, DATA * 2]), ("ens", *NAMES))
    pieces = qn.split(stored(DATA, order), "embed", [1, 3])
    for got, want in zip(pieces, np.split(DATA, [1, 3], axis=2), strict=True):
        same(got, want, NAMES)
    assert [p.sizes["embed"] for p in pieces] == [1, 2, 1]


def test_stack_broadcasts_by_name_and_concatenate_checks():
    x = stored(DATA, NAMES)
    row = NamedArray(jnp.asarray(DATA[0, 0]), ("embed",))
    got = qn.stack([x, row], "ens")
    same(
        got, np.stack([DATA, np.broadcast_to(DATA[0, 0], DATA.shape)]), ("ens", *NAMES)
    )
    with pytest.raises(ValueError, match="holding the same axes"):
        qn.concatenate([x, row], "embed")
    with pytest.raises(ValueError, match="Axis 'seq' is not an axis"):
        qn.concatenate([row, x], "seq")
    with pytest.raises(ValueError, match="already an axis"):
        qn.stack([x, x], "seq")


@pytest.mark.parametrize("order", ORDERS)
def test_flatten_and_unflatten_by_name(order):
    x = stored(DATA, order)
    flat = qn.flatten_axes(x, ("seq", "embed"), "tokens")
    assert flat.sizes == {"batch": 2, "tokens": 12}
    same(flat, DATA.reshape(2, 12), ("batch", "tokens"))
    back = qn.unflatten_axis(flat, "tokens", (Axis("seq", 3), "embed"))
    same(back, DATA, NAMES)
    # The other order merges the other way round.
    flat = qn.flatten_axes(x, ("embed", "seq"), "tokens")
    same(flat, DATA.transpose(0, 2, 1).reshape(2, 12), ("batch", "tokens"))
    with pytest.raises(ValueError, match="multiplying to 6"):
        qn.unflatten_axis(flat, "tokens", (Axis("a", 2), Axis("b", 3)))
    with pytest.raises(ValueError, match="have no size"):
        qn.unflatten_axis(flat, "tokens", ("a", "b"))


@pytest.mark.parametrize("order", ORDERS[::2])
def test_rearrange_by_name(order):
    x = stored(DATA, order)
    heads = qn.rearrange(
        x, "batch seq (embed: heads dim) -> batch heads seq dim", heads=2
    )
    assert heads.names == ("batch", "heads", "seq", "dim")
    want = DATA.reshape(2, 3, 2, 2).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(heads.array, want)
    # And back, the left side in any order.
    back = qn.rearrange(heads, "dim seq heads batch -> batch seq (embed: heads dim)")
    np.testing.assert_array_equal(back.array, DATA)
    # An unnamed group makes (and splits) the merged axis "(heads dim)".
    merged = qn.rearrange(heads, "... heads dim -> ... (heads dim)")
    assert merged.names == ("batch", "seq", "(heads dim)")
    np.testing.assert_array_equal(merged.array, DATA)
    split = qn.rearrange(merged, "... (heads dim) -> ... dim heads")
    np.testing.assert_array_equal(split.array, want.transpose(0, 2, 3, 1))
    # Literal: a 2 x 3 array.
    small = NamedArray(jnp.arange(6.0).reshape(2, 3), ("a", "b"))
    np.testing.assert_array_equal(
        qn.rearrange(small, "a b -> (ba: b a)").array, [0, 3, 1, 4, 2, 5]
    )


def test_rearrange_errors():
    x = stored(DATA, NAMES)
    with pytest.raises(ValueError, match=r"does not list axes \('embed',\)"):
        qn.rearrange(x, "batch seq -> seq batch")
    with pytest.raises(ValueError, match="rearrange neither reduces nor drops"):
        qn.rearrange(x, "batch seq embed -> seq batch")
    with pytest.raises(ValueError, match="names 'heads', which the left side"):
        qn.rearrange(x, "... -> ... heads")
    with pytest.raises(ValueError, match="one `->`"):
        qn.rearrange(x, "batch seq embed")
    with pytest.raises(ValueError, match="cannot be split into parts"):
        qn.rearrange(x, "... (embed: h d) -> ... h d", h=3)
    with pytest.raises(ValueError, match="lists an axis twice"):
        qn.rearrange(x, "batch seq embed -> batch seq embed seq")


@pytest.mark.parametrize("order", ORDERS[::2])
def test_take_by_name(order):
    x = stored(DATA, order)
    tokens = NamedArray(jnp.array([[2, 0], [1, 1], [0, 2]]), ("p", "q"))
    got = qn.take(x, tokens, "seq")
    i = order.index("seq")
    want_names = (*order[:i], "p", "q", *order[i + 1 :])
    assert got.names == want_names
    same(
        got,
        np.take(DATA, np.asarray(tokens.array), axis=1),
        ("batch", "p", "q", "embed"),
    )
    got = qn.take(x, jnp.array([2, 2, 0, 1]), "seq")
    assert got.sizes["seq"] == 4
    same(got, np.take(DATA, [2, 2, 0, 1], axis=1), NAMES)
    got = qn.take(x, 1, "seq")
    same(got, DATA[:, 1], ("batch", "embed"))
    with pytest.raises(ValueError, match="unnamed indices of shape"):
        qn.take(x, jnp.zeros((2, 2), int), "seq")
    with pytest.raises(ValueError, match="would repeat an axis"):
        qn.take(x, NamedArray(jnp.array([0]), ("embed",)), "seq")


ALONG = {
    "sort": (lambda x, a: qn.sort(x, a), lambda d, i: np.sort(d, axis=i)),
    "sort descending": (
        lambda x, a: qn.sort(x, a, descending=True),
        lambda d, i: jnp.sort(d, axis=i, descending=True),
    ),
    "argsort": (lambda x, a: qn.argsort(x, a), lambda d, i: jnp.argsort(d, axis=i)),
    "roll": (lambda x, a: qn.roll(x, 2, a), lambda d, i: np.roll(d, 2, axis=i)),
    "pad": (
        lambda x, a: qn.pad(x, {a: (1, 2)}, constant_values=-7.0),
        lambda d, i: np.pad(
            d, [(1, 2) if k == i else (0, 0) for k in range(3)], constant_values=-7.0
        ),
    ),
    "pad reflect": (
        lambda x, a: qn.pad(x, {a: 1}, mode="reflect"),
        lambda d, i: np.pad(
            d, [(1, 1) if k == i else (0, 0) for k in range(3)], "reflect"
        ),
    ),
    "fft": (lambda x, a: qn.fft.fft(x, a), lambda d, i: np.fft.fft(d, axis=i)),
    "ifft": (lambda x, a: qn.fft.ifft(x, a), lambda d, i: np.fft.ifft(d, axis=i)),
    "rfft": (lambda x, a: qn.fft.rfft(x, a), lambda d, i: np.fft.rfft(d, axis=i)),
    "irfft": (
        lambda x, a: qn.fft.irfft(x, a, n=6),
        lambda d, i: np.fft.irfft(d, n=6, axis=i),
    ),
    "fftshift": (
        lambda x, a: qn.fft.fftshift(x, a),
        lambda d, i: np.fft.fftshift(d, axes=i),
    ),
    "cumsum": (lambda x, a: qn.cumsum(x, a), lambda d, i: np.cumsum(d, axis=i)),
}


@pytest.mark.parametrize("name", sorted(ALONG))
@pytest.mark.parametrize("axis", NAMES)
def test_along_one_named_axis(name, axis):
    by_name, reference = ALONG[name]
    i = NAMES.index(axis)
    want = reference(DATA, i)
    for order in (NAMES, ("embed", "batch", "seq")):
        got = by_name(stored(DATA, order), axis)
        assert got.names == order
        exact = name not in ("fft", "ifft", "rfft", "irfft")
        same(got, np.asarray(want, got.array.dtype), NAMES, exact=exact)


def test_fftn_by_name():
    x = stored(DATA, ("embed", "batch", "seq"))
    got = qn.fft.fftn(x, ("seq", "embed"))
    same(got, np.fft.fftn(DATA, axes=(1, 2)), NAMES, exact=False)
    got = qn.fft.rfftn(x, ("embed", "seq"))
    assert got.sizes == {"embed": 4, "batch": 2, "seq": 2}
    same(got, np.fft.rfftn(DATA, axes=(2, 1)), NAMES, exact=False)
    back = qn.fft.irfftn(got, ("embed", "seq"), s=(4, 3))
    same(back, DATA, NAMES, exact=False)


# NaN in, NaN out; jit and grad -----------------------------------------------------

NAN = DATA.copy()
NAN[1, 2, 0] = np.nan
NAN[0, 0, 3] = -np.inf

BY_NAME = {
    "concatenate": (
        lambda x: qn.concatenate([x, x * 2.0], "seq"),
        lambda d: np.concatenate([d, d * 2], axis=1),
        NAMES,
    ),
    "stack": (
        lambda x: qn.stack([x, x * 2.0], "ens"),
        lambda d: np.stack([d, d * 2]),
        ("ens", *NAMES),
    ),
    "split": (
        lambda x: qn.split(x, "seq", [1])[1],
        lambda d: d[:, 1:],
        NAMES,
    ),
    "flatten_axes": (
        lambda x: qn.flatten_axes(x, ("batch", "embed"), "be"),
        lambda d: d.transpose(0, 2, 1).reshape(8, 3),
        ("be", "seq"),
    ),
    "unflatten_axis": (
        lambda x: qn.unflatten_axis(x, "embed", ("h", Axis("d", 2))),
        lambda d: d.reshape(2, 3, 2, 2),
        ("batch", "seq", "h", "d"),
    ),
    "rearrange": (
        lambda x: qn.rearrange(x, "... (embed: h d) -> ... d h", h=2),
        lambda d: d.reshape(2, 3, 2, 2).transpose(0, 1, 3, 2),
        ("batch", "seq", "d", "h"),
    ),
    "take": (
        lambda x: qn.take(x, NamedArray(jnp.array([2, 0, 2]), ("k",)), "seq"),
        lambda d: d[:, [2, 0, 2]],
        ("batch", "k", "embed"),
    ),
    "sort": (lambda x: qn.sort(x, "seq"), lambda d: np.sort(d, axis=1), NAMES),
    "roll": (lambda x: qn.roll(x, -1, "embed"), lambda d: np.roll(d, -1, 2), NAMES),
    "pad": (
        lambda x: qn.pad(x, {"seq": (2, 0)}, mode="edge"),
        lambda d: np.pad(d, [(0, 0), (2, 0), (0, 0)], mode="edge"),
        NAMES,
    ),
    "fft": (
        lambda x: qn.fft.rfft(x, "embed"),
        lambda d: np.fft.rfft(d, axis=2),
        NAMES,
    ),
}


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_by_name_nan_in_nan_out_under_jit(name):
    fn, reference, names = BY_NAME[name]
    x = stored(NAN, ("seq", "embed", "batch"))
    want = reference(NAN)
    assert np.isnan(want).any()
    # Where NumPy's result is not finite, which non-finite number an FFT gives is
    # the platform's (a TPU's FFT gives `-inf+nanj` where NumPy's gives `-inf+0j`):
    # every entry is compared with plain JAX on the same platform, the finite ones
    # with NumPy too.
    plain = np.asarray(_jnp_reference(name, jnp.asarray(NAN)))
    finite = np.isfinite(want)
    for run in (fn, jax.jit(fn)):
        got = laid_out(run(x), names)
        np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            got[finite], np.asarray(want, got.dtype)[finite], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_by_name_gradients_against_plain_jax(name):
    fn, reference, names = BY_NAME[name]
    x = stored(DATA, ("seq", "embed", "batch"))
    weights = np.linspace(-1.0, 2.0, np.size(reference(DATA))).reshape(
        np.shape(reference(DATA))
    )

    def loss(x):
        out = fn(x)
        laid = out.array.transpose([out.names.index(n) for n in names])
        return jnp.sum(jnp.real(laid) * weights)

    grad = jax.jit(jax.grad(loss))(x)
    assert grad.names == x.names

    def plain_loss(d):
        return jnp.sum(jnp.real(_jnp_reference(name, d)) * weights)

    want = jax.grad(plain_loss)(jnp.asarray(DATA))
    np.testing.assert_allclose(laid_out(grad, NAMES), want, rtol=1e-5, atol=1e-5)


def _jnp_reference(name, d):
    """`BY_NAME[name]`'s reference in jax.numpy, to differentiate."""
    return {
        "concatenate": lambda: jnp.concatenate([d, d * 2], axis=1),
        "stack": lambda: jnp.stack([d, d * 2]),
        "split": lambda: d[:, 1:],
        "flatten_axes": lambda: d.transpose(0, 2, 1).reshape(8, 3),
        "unflatten_axis": lambda: d.reshape(2, 3, 2, 2),
        "rearrange": lambda: d.reshape(2, 3, 2, 2).transpose(0, 1, 3, 2),
        "take": lambda: d[:, jnp.array([2, 0, 2])],
        "sort": lambda: jnp.sort(d, axis=1),
        "roll": lambda: jnp.roll(d, -1, 2),
        "pad": lambda: jnp.pad(d, [(0, 0), (2, 0), (0, 0)], mode="edge"),
        "fft": lambda: jnp.fft.rfft(d, axis=2),
    }[name]()


# Positional code --------------------------------------------------------------------

X = stored(DATA, NAMES)
Y = stored(OTHER, NAMES)
TOKENS = NamedArray(jnp.array([[2, 0], [1, 1]]), ("p", "q"))

POSITIONAL = {
    # name: (fn(x, y, tokens), expected names)
    "concatenate": (lambda x, y, t: jnp.concatenate([x, y], axis=1), NAMES),
    "stack": (
        lambda x, y, t: jnp.stack([x, x * 2.0], axis=1),
        ("batch", None, "seq", "embed"),
    ),
    "unstack": (lambda x, y, t: jnp.unstack(x, axis=1)[2], ("batch", "embed")),
    "split": (lambda x, y, t: jnp.split(x, [1], axis=2)[1], NAMES),
    "merge and split back": (
        lambda x, y, t: (x.reshape(2, 12) * 2.0).reshape(2, 3, 4),
        NAMES,
    ),
    "merge": (lambda x, y, t: x.reshape(6, 4), ("(batch seq)", "embed")),
    "ravel": (lambda x, y, t: jnp.ravel(x), ("(batch seq embed)",)),
    "take plain": (lambda x, y, t: jnp.take(x, jnp.array([2, 0, 2, 1]), axis=1), NAMES),
    "index plain": (lambda x, y, t: x[:, :, jnp.array([3, 0])], NAMES),
    "take named": (
        lambda x, y, t: jnp.take(x, t, axis=1),
        ("batch", "p", "q", "embed"),
    ),
    "index named": (lambda x, y, t: x[:, t], ("batch", "p", "q", "embed")),
    "take_along_axis": (
        lambda x, y, t: jnp.take_along_axis(x, jnp.argsort(x, axis=1), axis=1),
        NAMES,
    ),
    "dynamic index": (lambda x, y, t: x[jnp.argmax(jnp.sum(x))], ("seq", "embed")),
    "dynamic_slice": (
        lambda x, y, t: jax.lax.dynamic_slice_in_dim(x, jnp.argmin(t.sum()), 2, axis=1),
        NAMES,
    ),
    "dynamic_update_slice": (
        lambda x, y, t: jax.lax.dynamic_update_slice_in_dim(
            x, x[:, :1] * 10.0, jnp.argmin(t.sum()) + 1, axis=1
        ),
        NAMES,
    ),
    "at set": (lambda x, y, t: x.at[1].set(0.0), NAMES),
    "at set traced": (lambda x, y, t: x.at[:, jnp.argmin(t.sum())].set(-1.0), NAMES),
    "at set indices": (lambda x, y, t: x.at[:, jnp.array([0, 2])].set(9.0), NAMES),
    "at add named": (lambda x, y, t: x.at[:, t].add(x[:, t] * 2.0), NAMES),
    "at multiply named": (
        lambda x, y, t: x.at[:, :, jnp.array([3, 1])].multiply(x[:, :, 1:3]),
        NAMES,
    ),
    "sort": (lambda x, y, t: jnp.sort(x, axis=1), NAMES),
    "argsort": (lambda x, y, t: jnp.argsort(-x, axis=2), NAMES),
    "roll": (lambda x, y, t: jnp.roll(x, 1, axis=1), NAMES),
    "roll traced": (lambda x, y, t: jnp.roll(x, jnp.argmax(t.sum()), axis=2), NAMES),
    "pad": (lambda x, y, t: jnp.pad(x, ((0, 0), (1, 2), (0, 0))), NAMES),
    "pad edge": (
        lambda x, y, t: jnp.pad(x, ((0, 0), (1, 2), (0, 1)), mode="edge"),
        NAMES,
    ),
    "pad wrap": (
        lambda x, y, t: jnp.pad(x, ((1, 0), (2, 2), (0, 0)), mode="wrap"),
        NAMES,
    ),
    "flip": (lambda x, y, t: jnp.flip(x, axis=1), NAMES),
    "fft": (lambda x, y, t: jnp.fft.fft(x, axis=1), NAMES),
    "rfft": (lambda x, y, t: jnp.fft.rfft(x, axis=2), NAMES),
    "irfft": (
        lambda x, y, t: jnp.fft.irfft(jnp.fft.rfft(x, axis=1), n=3, axis=1),
        NAMES,
    ),
    "fft2": (lambda x, y, t: jnp.fft.fft2(x), NAMES),
    "fftshift": (lambda x, y, t: jnp.fft.fftshift(x, axes=1), NAMES),
}


def unwrap(out):
    return out.array if isinstance(out, NamedArray) else out


@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_positional_code_against_plain_jax(name):
    fn, names = POSITIONAL[name]
    want = fn(X.array, Y.array, TOKENS.array)
    f = quax.quaxify(fn)
    for run in (f, jax.jit(f)):
        got = run(X, Y, TOKENS)
        assert isinstance(got, NamedArray)
        assert got.names == names, got.axes
        np.testing.assert_allclose(got.array, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_positional_code_nan_in_nan_out(name):
    fn, _ = POSITIONAL[name]
    x = stored(NAN, NAMES)
    want = fn(x.array, Y.array, TOKENS.array)
    got = quax.quaxify(fn)(x, Y, TOKENS)
    np.testing.assert_allclose(got.array, want, rtol=1e-5, atol=1e-5)
    assert (
        np.isnan(np.asarray(got.array, np.complex64)).sum()
        == np.isnan(np.asarray(want, np.complex64)).sum()
    )


@pytest.mark.parametrize(
    "name",
    # Not argsort (integers); not `.at[].multiply`, which JAX itself does not
    # differentiate without unique indices (plain arrays raise the same).
    [n for n in sorted(POSITIONAL) if n not in ("argsort", "at multiply named")],
)
def test_positional_code_gradients(name):
    fn, _ = POSITIONAL[name]

    def loss(x, y, t):
        return jnp.sum(jnp.real(unwrap(fn(x, y, t))) ** 2)

    grad = jax.jit(jax.grad(quax.quaxify(loss)))(X, Y, TOKENS)
    assert grad.names == NAMES
    want = jax.grad(lambda d: jnp.sum(jnp.real(fn(d, Y.array, TOKENS.array)) ** 2))(
        X.array
    )
    np.testing.assert_allclose(grad.array, want, rtol=1e-4, atol=1e-4)


def test_positional_refusals_name_the_axes_and_the_way_out():
    x = stored(DATA, NAMES)
    # Names at one position that differ: never paired by position.
    swapped = NamedArray(
        jnp.asarray(DATA.transpose(0, 2, 1)[:, :3, :3]), ("batch", "embed", "seq")
    )
    square = NamedArray(jnp.asarray(DATA[:, :, :3]), NAMES)
    with pytest.raises(ValueError, match=r"position 1 holds axes 'seq' and 'embed'"):
        quax.quaxify(lambda a, b: jnp.concatenate([a, b], axis=0))(square, swapped)
    with pytest.raises(ValueError, match=r"quax_named\.concatenate"):
        quax.quaxify(lambda a, b: jnp.concatenate([a, b], axis=0))(square, swapped)
    # Joining two differently named axes.
    other = NamedArray(jnp.asarray(OTHER), ("batch", "time", "embed"))
    with pytest.raises(ValueError, match=r"joins axes \('seq', 'time'\)"):
        quax.quaxify(lambda a, b: jnp.concatenate([a, b], axis=1))(x, other)
    with pytest.raises(ValueError, match="position 1 holds axes 'seq' and 'embed'"):
        quax.quaxify(lambda a, b: jnp.stack([a, b]))(square, swapped)
    # An unnamed operand that is not one value repeated.
    with pytest.raises(ValueError, match=r"unnamed array of shape \(2, 1, 4\)"):
        quax.quaxify(lambda a: jnp.concatenate([a, jnp.asarray(DATA[:, :1])], axis=1))(
            x
        )
    # Splitting an axis into pieces without names.
    with pytest.raises(ValueError, match="splits axis 'embed' into sizes"):
        quax.quaxify(lambda a: a.reshape(2, 3, 2, 2))(x)
    # Unnamed index arrays of two axes.
    with pytest.raises(ValueError, match=r"unnamed indices of shape \(2, 2\)"):
        quax.quaxify(lambda a: a[:, jnp.array([[0, 1], [1, 2]])])(x)
    # Indexed updates: unnamed updates, and updates named otherwise than the
    # indexed window.
    with pytest.raises(
        ValueError, match=r"writes an unnamed array of shape \(2, 2, 4\)"
    ):
        quax.quaxify(
            lambda a: a.at[:, jnp.array([0, 2])].add(jnp.asarray(DATA[:, :2]))
        )(x)
    other = NamedArray(jnp.asarray(DATA[:, :2]), ("batch", "time", "embed"))
    with pytest.raises(ValueError, match="position 1 holds 'time' in one and 'seq'"):
        quax.quaxify(lambda a, u: a.at[:, jnp.array([0, 2])].add(u))(x, other)
    # A constant fill joins any names (jnp.pad's pieces, a zeros block).
    got = quax.quaxify(lambda a: jnp.concatenate([a, jnp.zeros((2, 1, 4))], axis=1))(x)
    assert got.names == NAMES
    np.testing.assert_array_equal(got.array[:, 3], 0.0)
