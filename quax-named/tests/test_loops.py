"""Loops over named arrays: `jax.lax.scan` in positional code (each slice keeps the
other names; outputs stacked under the scanned axis), `quax_named.scan` along any
named axis, and `fori_loop`/`while_loop` carries. References are plain JAX on the
stored arrays, and literals."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_named as qn
from quax_named import NamedArray


XS = np.arange(12.0, dtype=np.float32).reshape(3, 4)  # (seq=3, b=4)


def running(c, x):
    """Positional scan body: a running sum, and each step's doubled slice and sum."""
    c = c + x
    return c, (x * 2.0, jnp.sum(c))


def test_scan_slices_the_leading_axis_and_keeps_the_other_names():
    xs = NamedArray(jnp.asarray(XS), ("seq", "b"))
    init = NamedArray(jnp.zeros(4), ("b",))
    fn = quax.quaxify(lambda c, xs: jax.lax.scan(running, c, xs))
    for f in (fn, jax.jit(fn)):
        c, (doubled, sums) = f(init, xs)
        assert c.names == ("b",)
        np.testing.assert_array_equal(c.array, [12.0, 15.0, 18.0, 21.0])
        # A named output of the body is stacked under the scanned axis, by name.
        assert doubled.names == ("seq", "b")
        assert doubled.sizes == {"seq": 3, "b": 4}
        np.testing.assert_array_equal(doubled.array, XS * 2.0)
        # A plain scalar output of the body (a value with no axes left) is
        # stacked under the scanned axis too.
        assert sums.names == ("seq",)
        np.testing.assert_array_equal(sums.array, [6.0, 28.0, 66.0])
    want = jax.lax.scan(running, jnp.zeros(4), jnp.asarray(XS))
    np.testing.assert_array_equal(c.array, want[0])
    np.testing.assert_array_equal(sums.array, want[1][1])


def test_scan_slices_storage_axis_0_whatever_its_name():
    # Stored (b, seq): positional code slices b, each slice is named (seq,).
    xs = NamedArray(jnp.asarray(XS.T), ("b", "seq"))
    c, (doubled, sums) = quax.quaxify(
        lambda xs: jax.lax.scan(running, jnp.zeros(3), xs)
    )(xs)
    assert c.names == ("seq",)  # the zeros took the names the body gave them
    np.testing.assert_array_equal(c.array, XS.sum(axis=1))
    assert doubled.names == ("b", "seq")
    np.testing.assert_array_equal(doubled.array, XS.T * 2.0)
    assert sums.names == ("b",)
    np.testing.assert_array_equal(
        sums.array, np.cumsum(XS.sum(axis=0)).astype(np.float32)
    )


def rnn(wx, u, h0, xs):
    """Positional code: an elementwise-recurrent cell over a sequence."""

    def cell(h, x):
        h = jnp.tanh(x @ wx + h * u)
        return h, jnp.sum(h**2, axis=-1)

    h, ys = jax.lax.scan(cell, h0, xs)
    return jnp.sum(h) + jnp.sum(jnp.sin(ys)), ys


def rnn_inputs():
    k = jr.split(jr.PRNGKey(0), 4)
    plain = (
        jr.normal(k[0], (4, 6)) / 2,  # wx (feature, hidden)
        jr.normal(k[1], (6,)),  # u (hidden,)
        jr.normal(k[2], (3, 6)),  # h0 (batch, hidden)
        jr.normal(k[3], (5, 3, 4)),  # xs (seq, batch, feature)
    )
    names = [("feature", "hidden"), ("hidden",), ("batch", "hidden")]
    names.append(("seq", "batch", "feature"))
    named = tuple(NamedArray(a, n) for a, n in zip(plain, names, strict=True))
    return plain, named


def test_a_plain_fill_carry_used_only_with_plain_arrays_stays_plain():
    xs = NamedArray(jnp.asarray(XS), ("seq", "b"))
    m = jnp.eye(4) * 2.0

    def fn(xs):
        return jax.lax.scan(lambda c, x: (c @ m + 1.0, x * 2.0), jnp.zeros(4), xs)

    c, doubled = quax.quaxify(fn)(xs)
    assert not isinstance(c, NamedArray)
    np.testing.assert_array_equal(c, [7.0, 7.0, 7.0, 7.0])
    assert doubled.names == ("seq", "b")


def test_scan_under_jit_and_grad_against_plain_jax():
    plain, named = rnn_inputs()
    f = quax.quaxify(rnn)
    loss, ys = jax.jit(f)(*named)
    want_loss, want_ys = rnn(*plain)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    assert ys.names == ("seq", "batch")
    np.testing.assert_allclose(ys.array, want_ys, rtol=1e-5)
    loss_only = lambda *a: f(*a)[0]
    grads = jax.jit(jax.grad(loss_only, argnums=(0, 1, 2, 3)))(*named)
    want = jax.grad(lambda *a: rnn(*a)[0], argnums=(0, 1, 2, 3))(*plain)
    for g, n, ref in zip(grads, named, want, strict=True):
        assert g.names == n.names
        np.testing.assert_allclose(g.array, ref, rtol=1e-4, atol=1e-5)


def test_scan_reverse_and_lax_map():
    xs = NamedArray(jnp.asarray(XS), ("seq", "b"))
    c, (doubled, sums) = quax.quaxify(
        lambda xs: jax.lax.scan(running, jnp.zeros(4), xs, reverse=True)
    )(xs)
    want = jax.lax.scan(running, jnp.zeros(4), jnp.asarray(XS), reverse=True)
    np.testing.assert_array_equal(c.array, want[0])
    assert doubled.names == ("seq", "b")
    np.testing.assert_array_equal(doubled.array, want[1][0])
    assert sums.names == ("seq",)
    np.testing.assert_array_equal(sums.array, [66.0, 60.0, 38.0])
    np.testing.assert_array_equal(sums.array, want[1][1])
    mapped = quax.quaxify(lambda xs: jax.lax.map(lambda x: jnp.cumsum(x), xs))(xs)
    assert mapped.names == ("seq", "b")
    np.testing.assert_array_equal(mapped.array, np.cumsum(XS, axis=1))


def test_scan_without_named_inputs_stacks_under_an_anonymous_axis():
    init = NamedArray(jnp.arange(4.0), ("b",))

    def fn(c):
        return jax.lax.scan(lambda c, _: (c * 2.0, c + 1.0), c, None, length=3)

    c, ys = quax.quaxify(fn)(init)
    assert c.names == ("b",)
    np.testing.assert_array_equal(c.array, np.arange(4.0) * 8.0)
    # The stacked axis has no name: an anonymous axis of the scan's length.
    assert ys.names == (None, "b") and ys.axes[0].size == 3
    np.testing.assert_array_equal(ys.array, [[1, 2, 3, 4], [1, 3, 5, 7], [1, 5, 9, 13]])


def test_scan_nan_in_nan_out():
    data = XS.copy()
    data[1, 2] = np.nan
    xs = NamedArray(jnp.asarray(data), ("seq", "b"))
    c, (doubled, sums) = quax.quaxify(
        lambda xs: jax.lax.scan(running, jnp.zeros(4), xs)
    )(xs)
    want = jax.lax.scan(running, jnp.zeros(4), jnp.asarray(data))
    np.testing.assert_array_equal(c.array, want[0])
    assert np.isnan(c.array[2]) and np.isnan(sums.array[1]) and np.isnan(sums.array[2])
    np.testing.assert_array_equal(sums.array, want[1][1])
    np.testing.assert_array_equal(doubled.array, want[1][0])


def test_scan_refusals_name_the_axes_and_the_way_out():
    xs = NamedArray(jnp.asarray(XS), ("seq", "b"))
    ys = NamedArray(jnp.asarray(XS), ("time", "b"))
    both = quax.quaxify(
        lambda a, b: jax.lax.scan(lambda c, x: (c, x[0] + x[1]), 0.0, (a, b))
    )
    with pytest.raises(ValueError, match=r"'seq' and 'time'.*quax_named\.scan"):
        both(xs, ys)
    # A carry whose axes change from one step to the next.
    g = NamedArray(jnp.eye(4), ("d", "b"))
    with pytest.raises(ValueError, match=r"carry 0 comes in with axes \('b',\)"):
        quax.quaxify(lambda c, g: jax.lax.scan(lambda c, x: (g @ c, None), c, xs))(
            NamedArray(jnp.ones(4), ("b",)), g
        )
    # An unnamed carry that is not a constant fill meets a named slice.
    with pytest.raises(ValueError, match="mixes a NamedArray"):
        quax.quaxify(lambda xs, c: jax.lax.scan(lambda c, x: (c + x, None), c, xs))(
            xs, jnp.arange(4.0)
        )
    # `jax.lax.scan` outside quaxify slices the leaf: the names are refused, with
    # the ways out.
    match = r"quax_named\.scan\(f, init, xs, axis=\.\.\.\)"
    with pytest.raises(ValueError, match=match):
        jax.lax.scan(lambda c, x: (c, qn.sum(x, "b")), 0.0, xs)


def test_scan_by_name_along_any_axis():
    # Stored (b, seq): quax_named.scan slices `seq`, the second storage axis.
    xs = NamedArray(jnp.asarray(XS.T), ("b", "seq"))
    scales = jnp.array([1.0, -1.0, 0.5])  # a plain input, sliced alongside

    def f(c, inputs):
        x, s = inputs
        c = c + x * s
        return c, (x * 2.0, qn.sum(c, "b"))

    init = NamedArray(jnp.zeros(4), ("b",))
    for run in (qn.scan, jax.jit(qn.scan, static_argnums=(0, 3))):
        c, (doubled, sums) = run(f, init, (xs, scales), "seq")
        assert c.names == ("b",)
        want = jax.lax.scan(
            lambda c, xs: ((c := c + xs[0] * xs[1]), (xs[0] * 2.0, jnp.sum(c))),
            jnp.zeros(4),
            (jnp.asarray(XS), scales),
        )
        np.testing.assert_array_equal(c.array, want[0])
        np.testing.assert_array_equal(c.array, [0.0, 0.5, 1.0, 1.5])
        # Stacked with the scanned axis first, under its name; so is a scalar.
        assert doubled.names == ("seq", "b")
        np.testing.assert_array_equal(doubled.array, XS * 2.0)
        assert sums.names == ("seq",)
        np.testing.assert_array_equal(sums.array, [6.0, -16.0, 3.0])


def test_scan_by_name_under_grad_and_with_positional_code():
    plain, named = rnn_inputs()
    wx, u, h0, xs = named
    # The same sequence stored (batch, feature, seq): scanned by name.
    xs_last = qn.transpose(xs, ("batch", "feature", "seq"))

    def loss(wx, u, h0, xs):
        # Positional code on the slices, through quaxify.
        cell = quax.quaxify(lambda h, x, wx, u: jnp.tanh(x @ wx + h * u))

        def f(h, x):
            h = cell(h, x, wx, u)
            return h, qn.sum(h * h, "hidden")

        h, ys = qn.scan(f, h0, xs, axis="seq")
        return qn.sum(h) + qn.sum(quax.quaxify(jnp.sin)(ys))

    def plain_loss(wx, u, h0, xs):
        def cell(h, x):
            h = jnp.tanh(x @ wx + h * u)
            return h, jnp.sum(h**2, axis=-1)

        h, ys = jax.lax.scan(cell, h0, xs)
        return jnp.sum(h) + jnp.sum(jnp.sin(ys))

    np.testing.assert_allclose(
        jax.jit(loss)(wx, u, h0, xs_last), plain_loss(*plain), rtol=1e-5
    )
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(wx, u, h0, xs_last)
    want = jax.grad(plain_loss, argnums=(0, 1, 2, 3))(*plain)
    for g, n, ref in zip(grads, (wx, u, h0), want[:3], strict=False):
        assert g.names == n.names
        np.testing.assert_allclose(g.array, ref, rtol=1e-4, atol=1e-5)
    assert grads[3].names == ("batch", "feature", "seq")
    np.testing.assert_allclose(
        grads[3].array, np.transpose(want[3], (1, 2, 0)), rtol=1e-4, atol=1e-5
    )


def test_scan_by_name_errors():
    xs = NamedArray(jnp.asarray(XS), ("seq", "b"))
    with pytest.raises(ValueError, match="Axis 'time' is not an axis"):
        qn.scan(lambda c, x: (c, None), 0.0, xs, axis="time")
    with pytest.raises(ValueError, match="holds no NamedArray"):
        qn.scan(lambda c, x: (c, None), 0.0, jnp.ones(3), axis="seq")
    with pytest.raises(ValueError, match="another structure than `init`'s"):
        qn.scan(lambda c, x: ((c, c), None), 0.0, xs, axis="seq")
    # Outputs are stacked under `seq`, which this one already holds.
    seq = NamedArray(jnp.ones(3), ("seq",))
    with pytest.raises(ValueError, match="already holds"):
        qn.scan(lambda c, x: (c, seq * 1.0), 0.0, xs, axis="seq")


def test_fori_loop_and_while_loop_carries_keep_names():
    x = NamedArray(jnp.asarray(XS), ("seq", "b"))
    static, traced = quax.quaxify(
        lambda x: (
            jax.lax.fori_loop(0, 3, lambda i, c: c * 0.5 + i, x),
            jax.lax.fori_loop(0, jnp.sum(x > 5.0), lambda i, c: c * 0.5 + i, x),
        )
    )(x)
    want = XS.copy()
    for i in range(3):
        want = want * 0.5 + i
    assert static.names == ("seq", "b") and traced.names == ("seq", "b")
    np.testing.assert_allclose(static.array, want, rtol=1e-6)
    want = XS.copy()
    for i in range(6):
        want = want * 0.5 + i
    np.testing.assert_allclose(traced.array, want, rtol=1e-6)

    def halve(x):
        return jax.lax.while_loop(lambda c: jnp.max(c) > 1.0, lambda c: c * 0.5, x)

    got = jax.jit(quax.quaxify(halve))(x)
    assert got.names == ("seq", "b")
    np.testing.assert_array_equal(got.array, halve(jnp.asarray(XS)))
    np.testing.assert_array_equal(got.array, XS / 16.0)


def test_scan_over_a_1d_named_array_gives_it_back_named():
    # Each slice of a 1-D NamedArray is a plain scalar (no axes left), and the
    # stack of the body's scalars is indexed by the scanned axis: it takes its name.
    # A plain output with axes of its own stays plain, and with no named input the
    # stack of scalars stays plain (its axis would be anonymous).
    x = NamedArray(jnp.asarray([0.5, -1.0, 2.0]), ("t",))

    def body(c, row):
        new = c * 0.5 + jnp.sin(row)
        return new, (new, jnp.stack([new, 2.0 * new]))

    def prog(x):
        return jax.lax.scan(body, x[0], x)

    want_c, (want_ys, want_pairs) = prog(x.array)
    for f in (quax.quaxify(prog), jax.jit(quax.quaxify(prog))):
        c, (ys, pairs) = f(x)
        assert not isinstance(c, NamedArray)
        assert isinstance(ys, NamedArray) and ys.names == ("t",)
        np.testing.assert_allclose(ys.array, want_ys, rtol=1e-6)
        np.testing.assert_allclose(c, want_c, rtol=1e-6)
        assert not isinstance(pairs, NamedArray)
        np.testing.assert_array_equal(pairs, want_pairs)
    plain = quax.quaxify(lambda a: jax.lax.scan(body, a[0], a))(x.array)
    assert not isinstance(plain[1][0], NamedArray)
