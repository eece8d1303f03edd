"""Mixed precision: a `LoraArray` whose adapter (`a`, `b`, DoRA's `magnitude`) is
in another floating dtype than its weight `w`, as peft keeps a float32 adapter on
a bfloat16 base. Every result is checked against the dense weight formed in
float64 by NumPy from the fields and used by plain JAX in float32, within the
rounding of the lowest precision involved, and its dtype against what dense JAX
gives for the merged weight in `w`'s dtype."""

import equinox as eqx
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import jax.random as jr
import ml_dtypes
import numpy as np
import optax
import pytest
import quax
import quax.testing as qt
import quax_lora
from hypothesis import given, settings
from jax import lax
from lora_helpers import normal


BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32
# (w's dtype, the adapter's): peft's float32 adapter on a low-precision base, and
# the reverse (a low-precision adapter on a float32 base).
PAIRS = [(BF16, F32), (F16, F32), (F32, BF16)]
ALL_PAIRS = [(w, a) for w in (BF16, F16, F32) for a in (F32, BF16)]


def _lora(w_dtype, adapter_dtype, shape=(6, 5), *, seed=0, **kwargs):
    w = normal(seed, shape, w_dtype)
    lora = quax_lora.LoraArray(
        w,
        rank=2,
        alpha=3.0,
        adapter_dtype=adapter_dtype,
        key=jr.key(seed),
        **kwargs,
    )
    # A trained `b` (it starts at zero), so that the update shows in every result;
    # of the size of `w`'s entries, so that rounding either term would show.
    b = normal(seed + 1, lora.b.shape, adapter_dtype)
    a = (lora.a / 0.01).astype(adapter_dtype)  # entries of size 1 too
    return eqx.tree_at(lambda v: (v.a, v.b), lora, (a, b))


def _dense64(lora) -> np.ndarray:
    """The dense weight from the fields, in float64 by NumPy (of the adapter
    `index` selects, when it stacks several)."""
    lora = lora.selected()
    w, a, b = (np.asarray(x, np.float64) for x in (lora.w, lora.a, lora.b))
    nb = lora.batch_ndim
    # The columns of a kernel (`b` of shape `(rank, in, *window)`) as one axis.
    b = b.reshape(*b.shape[: nb + 1], -1)
    update = np.einsum("...nr,...rm->...nm", a, b).reshape(w.shape)
    full = w + lora.scaling * update
    if lora.magnitude is not None:
        norm = np.sqrt(np.sum(full**2, axis=tuple(range(nb + 1, full.ndim))))
        full = full * (np.asarray(lora.magnitude, np.float64) / norm)[..., None]
    return full


def _eps(*dtypes) -> float:
    return max(float(jnp.finfo(d).eps) for d in dtypes)


def _check(fn, lora, x, *, k: int):
    """`quax.quaxify(fn)(lora, x)` against `fn` of the dense weight in float32
    (plain JAX), within `(k + 4) * eps * |fn|(|W|, |x|)` for the lowest precision
    `eps` among `w`, the adapter and `x` (`k` the length of the longest sum); the
    result's dtype that of `fn` on the merged weight in `w`'s dtype."""
    out = quax.quaxify(fn)(lora, x)
    merged = jnp.asarray(_dense64(lora).astype(lora.dtype))
    assert out.dtype == fn(merged, x).dtype
    dense = jnp.asarray(_dense64(lora), F32)
    x32 = jnp.asarray(x, F32)
    want = np.asarray(fn(dense, x32), np.float64)
    bound = np.abs(np.asarray(fn(jnp.abs(dense), jnp.abs(x32)), np.float64))
    eps = _eps(lora.w.dtype, lora.a.dtype, x.dtype)
    err = np.abs(np.asarray(out, np.float64) - want)
    assert np.all(err <= (k + 4) * eps * bound + 1e-30), (err.max(), bound.max())
    return out


PROGRAMS = {
    "lora @ x.T": lambda v, x: v @ x.T,
    "x @ lora.T": lambda v, x: x @ v.T,
    "einsum": lambda v, x: jnp.einsum("nm,km->kn", v, x),
    "rows contracted": lambda v, x: (x @ v.T) @ v,
    "neg": lambda v, x: (-v) @ x.T,
    "scalar mul": lambda v, x: (2.5 * v) @ x.T,
    "mul by scalar": lambda v, x: (v * jnp.asarray(-1.5, v.dtype)) @ x.T,
    "flip": lambda v, x: jnp.flip(v, (0, 1)) @ x.T,
    "astype float32": lambda v, x: v.astype(F32) @ x.T.astype(F32),
    "astype bfloat16": lambda v, x: v.astype(BF16) @ x.T.astype(BF16),
    "gather": lambda v, x: v[jnp.array([0, 3, 5])] @ x.T,
    "dynamic_slice": lambda v, x: lax.dynamic_slice(v, (2, 0), (3, 5)) @ x.T,
}


@pytest.mark.parametrize(
    "pair", PAIRS, ids=lambda p: f"{p[0].__name__}-{p[1].__name__}"
)
@pytest.mark.parametrize("program", PROGRAMS)
def test_rules_against_dense(program, pair):
    w_dtype, adapter_dtype = pair
    lora = _lora(w_dtype, adapter_dtype)
    x = normal(7, (4, 5), w_dtype)
    with quax.track_materialisation() as report:
        _check(PROGRAMS[program], lora, x, k=12)
    assert not report


@pytest.mark.parametrize(
    "pair", PAIRS, ids=lambda p: f"{p[0].__name__}-{p[1].__name__}"
)
@pytest.mark.parametrize(
    "program, x_shape",
    [
        (lambda v, x: v @ x.T, (4, 5)),  # DoRA's factor scales the output
        (lambda v, x: x @ v, (4, 6)),  # the rows contracted: it scales `w`
        (lambda v, x: (2.5 * v) @ x.T, (4, 5)),
    ],
    ids=["rows in output", "rows contracted", "scalar mul"],
)
def test_dora_against_dense(program, x_shape, pair):
    w_dtype, adapter_dtype = pair
    lora = _lora(w_dtype, adapter_dtype, variant="dora")
    assert lora.magnitude is not None and lora.magnitude.dtype == adapter_dtype
    x = normal(7, x_shape, w_dtype)
    # DoRA's norm takes `b` in `w`'s dtype (`w b^T`, see `_factored_row_norms_sq`):
    # one more rounding of the lowest precision.
    _check(program, lora, x, k=16)


@settings(max_examples=12, deadline=None)
@given(
    pair=st.sampled_from(ALL_PAIRS),
    batch=st.sampled_from([(), (2,)]),
    lora_is_lhs=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_products_property(pair, batch, lora_is_lhs, seed):
    w_dtype, adapter_dtype = pair
    lora = _lora(w_dtype, adapter_dtype, (*batch, 6, 5), seed=seed)
    if lora_is_lhs:
        x = normal(seed + 2, (*batch, 5, 3), w_dtype)
        fn = lambda v, x: v @ x
    else:
        x = normal(seed + 2, (*batch, 3, 6), w_dtype)
        fn = lambda v, x: x @ v
    _check(fn, lora, x, k=8)


@pytest.mark.parametrize(
    "pair", PAIRS, ids=lambda p: f"{p[0].__name__}-{p[1].__name__}"
)
def test_two_lora_arrays(pair):
    """`dot_general` of two `LoraArray`s (the left one factored, its products
    with the right one dispatched to the rule again)."""
    w_dtype, adapter_dtype = pair
    left = _lora(w_dtype, adapter_dtype)
    right = _lora(w_dtype, adapter_dtype, (5, 4), seed=4)
    out = quax.quaxify(lambda p, q: p @ q)(left, right)
    merged = [jnp.asarray(_dense64(v).astype(v.dtype)) for v in (left, right)]
    assert out.dtype == (merged[0] @ merged[1]).dtype
    dense = [_dense64(v) for v in (left, right)]
    bound = np.abs(dense[0]) @ np.abs(dense[1])
    err = np.abs(np.asarray(out, np.float64) - dense[0] @ dense[1])
    assert np.all(err <= 16 * _eps(*pair) * bound)


def test_peft_forward_semantics():
    """peft's `Linear.forward` on a bfloat16 base with a float32 adapter, written
    with NumPy and ml_dtypes: the base result in bfloat16, the adapter's with
    the input cast to float32, summed in float32 and cast back once."""
    lora = _lora(BF16, F32)
    x = normal(7, (4, 5), BF16)
    out = quax.quaxify(lambda v, x: x @ v.T)(lora, x)
    assert out.dtype == BF16
    w, a, b = (np.asarray(t, np.float32) for t in (lora.w, lora.a, lora.b))
    x32 = np.asarray(x, np.float32)
    base = (x32 @ w.T).astype(ml_dtypes.bfloat16)  # F.linear in bfloat16
    adapter = (x32 @ b.T @ a.T) * np.float32(lora.scaling)  # lora_B(lora_A(x))
    want = (base.astype(np.float32) + adapter).astype(ml_dtypes.bfloat16)
    # The base product's float32 sum may be ordered otherwise: one bfloat16 ulp.
    np.testing.assert_allclose(
        np.asarray(out, np.float32), want.astype(np.float32), rtol=2**-7, atol=0
    )
    # A float32 adapter changes the result where a bfloat16 one would round it
    # away: the adapter's term is not rounded to bfloat16 before the sum.
    rounded = lora.replace(a=lora.a.astype(BF16), b=lora.b.astype(BF16))
    low = quax.quaxify(lambda v, x: x @ v.T)(rounded, x)
    assert not np.array_equal(np.asarray(low, np.float32), np.asarray(out, np.float32))


@pytest.mark.parametrize(
    "pair", PAIRS, ids=lambda p: f"{p[0].__name__}-{p[1].__name__}"
)
def test_materialise_and_merge(pair):
    w_dtype, adapter_dtype = pair
    for variant in ("lora", "dora"):
        lora = _lora(w_dtype, adapter_dtype, variant=variant)
        # Rounded once to `w`'s dtype from the sum in float32: within half an ulp
        # of `w`'s dtype plus the float32 (or adapter's) products.
        want = _dense64(lora)
        tol = float(jnp.finfo(w_dtype).eps) + 8 * _eps(F32, adapter_dtype)
        for dense in (
            quax_lora.merge(lora),
            quax.quaxify(lambda v: v.enable_materialise().materialise())(lora),
        ):
            assert dense.dtype == w_dtype
            np.testing.assert_allclose(
                np.asarray(dense, np.float64), want, rtol=tol, atol=tol
            )


def test_float32_input_promotes_as_dense_jax():
    """A float32 input meets a bfloat16 `LoraArray` as it would the bfloat16
    dense weight: `jnp.matmul` converts the weight (`w`) to float32, the
    adapter keeps float32, and the result is float32."""
    lora = _lora(BF16, F32)
    x = normal(7, (4, 5), F32)
    out = _check(lambda v, x: x @ v.T, lora, x, k=12)
    assert out.dtype == F32
    # Then nothing is rounded to bfloat16: within float32 (and w's exact values).
    want = x @ jnp.asarray(_dense64(lora), F32).T
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_convert_keeps_adapter_precision():
    lora = _lora(F32, F32)
    down = quax.quaxify(lambda v: v.astype(BF16))(lora)
    assert down.dtype == down.w.dtype == BF16 and down.a.dtype == F32
    np.testing.assert_array_equal(down.a, lora.a)
    up = quax.quaxify(lambda v: v.astype(F32))(_lora(BF16, BF16))
    assert up.w.dtype == up.a.dtype == up.b.dtype == F32
    to_complex = quax.quaxify(lambda v: v.astype(jnp.complex64))(_lora(BF16, F32))
    assert to_complex.w.dtype == to_complex.a.dtype == jnp.complex64


@pytest.mark.parametrize(
    "layer",
    ["conv", "embedding"],
)
def test_layers_against_dense(layer):
    """`eqx.nn.Conv` (the convolution rule) and `eqx.nn.Embedding` (a gather of
    rows) in bfloat16, adapted with a float32 adapter."""
    key = jr.key(3)
    if layer == "conv":
        model = eqx.nn.Conv2d(3, 4, 3, key=key)
        x = normal(4, (3, 7, 7), BF16)
        filter_ = eqx.nn.Conv2d
    else:
        model = eqx.nn.Embedding(10, 6, key=key)
        x = jnp.array(4)
        filter_ = eqx.nn.Embedding
    model = jax.tree.map(lambda t: t.astype(BF16) if eqx.is_array(t) else t, model)
    lora_model = quax_lora.loraify(
        model, rank=2, filter=filter_, adapter_dtype=F32, key=jr.key(5)
    )
    lora = lora_model.weight
    lora = eqx.tree_at(lambda v: v.b, lora, normal(6, lora.b.shape, F32))
    lora_model = eqx.tree_at(lambda m: m.weight, lora_model, lora)
    out = quax.quaxify(lora_model)(x)
    merged = quax_lora.merge(lora_model)
    assert out.dtype == merged(x).dtype == BF16
    dense = eqx.tree_at(lambda m: m.weight, model, jnp.asarray(_dense64(lora), F32))
    dense = jax.tree.map(lambda t: t.astype(F32) if eqx.is_array(t) else t, dense)
    want = np.asarray(dense(x.astype(F32) if layer == "conv" else x), np.float64)
    np.testing.assert_allclose(
        np.asarray(out, np.float64), want, rtol=3 * 2**-8, atol=3e-2
    )


# Refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "w_dtype, adapter_dtype, match",
    [
        (BF16, jnp.int32, "must be floating"),
        (F32, bool, "must be floating"),
        (F32, jnp.complex64, "complex adapter needs a complex `w`"),
        (jnp.complex64, F32, "complex adapter needs a complex `w`"),
    ],
)
def test_refused_adapter_dtypes(w_dtype, adapter_dtype, match):
    w = jnp.ones((3, 4), w_dtype)
    with pytest.raises(ValueError, match=match) as info:
        quax_lora.LoraArray(w, rank=2, adapter_dtype=adapter_dtype, key=jr.key(0))
    assert "adapter_dtype=" in str(info.value)


def test_stack_adapters_of_other_dtypes_refused():
    with pytest.raises(ValueError, match="adapter dtype"):
        quax_lora.stack_adapters([_lora(BF16, F32), _lora(BF16, BF16)])
    first, other = _lora(BF16, F32), _lora(BF16, F32, seed=3)
    second = eqx.tree_at(lambda v: (v.a, v.b), first, (other.a, other.b))
    stacked = quax_lora.stack_adapters([first, second])
    x = normal(7, (4, 5), BF16)
    one = quax_lora.select_adapter(stacked, 1)
    out = _check(lambda v, x: v @ x.T, one, x, k=12)
    np.testing.assert_array_equal(out, quax.quaxify(lambda v, x: v @ x.T)(second, x))


def test_save_and_load_record_the_adapter_dtype(tmp_path):
    mlp = eqx.nn.MLP(4, 2, 8, depth=1, key=jr.key(0))
    mlp = jax.tree.map(lambda t: t.astype(BF16) if eqx.is_array(t) else t, mlp)
    model = quax_lora.loraify(mlp, rank=2, adapter_dtype=F32, key=jr.key(1))
    quax_lora.save_adapter(tmp_path / "adapter", model)
    like = quax_lora.loraify(mlp, rank=2, adapter_dtype=F32, key=jr.key(2))
    loaded = quax_lora.load_adapter(tmp_path / "adapter", like)
    arrays = lambda m: jax.tree.leaves(eqx.filter(m, eqx.is_array))
    for got, want in zip(arrays(loaded), arrays(model), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    # Into a model with bfloat16 adapters: refused, naming the dtypes and the
    # ways out (tests/test_adapter_dtypes.py checks the rules).
    plain = quax_lora.loraify(mlp, rank=2, key=jr.key(2))
    with pytest.raises(
        ValueError,
        match=r"are float32, and the model's adapter is bfloat16.*"
        r"adapter_dtype=jnp\.float32.*cast=True",
    ):
        quax_lora.load_adapter(tmp_path / "adapter", plain)


# No dense float32 copy of `w` ---------------------------------------------------------


def _f32_copies(fn, *args, shapes) -> int:
    """How many instructions of the compiled program of `fn` (besides its
    parameters) hold a float32 array of one of `shapes`."""
    hlo = qt.compiled_hlo(fn, *args)
    return sum(
        ins.op != "parameter"
        and any(d == "f32" and shape in shapes for d, shape in ins.arrays)
        for ins in qt.hlo_instructions(hlo)
    )


@pytest.mark.parametrize(
    "program",
    ["lora @ x.T", "x @ lora.T", "rows contracted", "neg", "scalar mul", "gather"],
)
def test_no_float32_copy_of_w(program):
    """A rule that promises not to materialise never casts `w` to the adapter's
    float32: the program quax-lora traces holds no float32 array of `w`'s shape
    (only the adapter's and the output's are float32), and the compiled one no
    more than XLA makes of the dense bfloat16 program itself (XLA's CPU backend
    computes a bfloat16 `dot` in float32, converting its operands; a GPU does
    not)."""
    fn = PROGRAMS[program]
    lora = _lora(BF16, F32, (24, 20))
    x = normal(7, (4, 20), BF16)
    jaxpr = str(jax.make_jaxpr(quax.quaxify(fn))(lora, x))
    assert "f32[24,20]" not in jaxpr and "f32[20,24]" not in jaxpr, jaxpr
    shapes = [(24, 20), (20, 24)]
    dense = jnp.asarray(_dense64(lora), BF16)
    assert _f32_copies(fn, lora, x, shapes=shapes) <= _f32_copies(
        fn, dense, x, shapes=shapes
    )


# Gradients and training ---------------------------------------------------------------


def _loss(ab, lora, x):
    v = eqx.tree_at(lambda v: (v.a, v.b), lora, ab)
    y = quax.quaxify(lambda v, x: x @ v.T)(v, x)
    return jnp.sum(jnp.square(y.astype(F32)))


def _dense_loss(ab, lora, x):
    a, b = ab
    weight = lora.w.astype(F32) + lora.scaling * a @ b
    return jnp.sum(jnp.square(x.astype(F32) @ weight.T))


@pytest.mark.parametrize("transform", ["plain", "jit", "vmap"])
def test_grad_in_adapter_dtype(transform):
    lora = _lora(BF16, F32)
    x = normal(7, (3, 4, 5), BF16)
    ab = (lora.a, lora.b)
    grad, dense_grad = jax.grad(_loss), jax.grad(_dense_loss)
    if transform == "jit":
        grad = jax.jit(grad)
    if transform == "vmap":
        got = jax.vmap(grad, in_axes=(None, None, 0))(ab, lora, x)
        want = jax.vmap(dense_grad, in_axes=(None, None, 0))(ab, lora, x)
    else:
        got, want = grad(ab, lora, x), dense_grad(ab, lora, x)
    for g, d in zip(got, want, strict=True):
        assert g.dtype == F32
        # The forward pass rounds its output to bfloat16: relative to the norm.
        scale = float(jnp.max(jnp.abs(d)))
        np.testing.assert_allclose(g, d, rtol=0, atol=4 * 2**-8 * scale)


def test_adam_finetune_bf16_base():
    """An Equinox MLP in bfloat16 with float32 adapters, trained by Adam: the loss
    falls, the adapter stays float32 and `w` bfloat16, and the losses follow a
    dense reference trained the same way (the weight formed in float32 from the
    same adapter, then plain JAX) within bfloat16's rounding."""
    kmodel, kdata, klora, ktarget = jr.split(jr.key(0), 4)
    mlp = eqx.nn.MLP(4, 1, 16, depth=2, key=kmodel)
    mlp = jax.tree.map(lambda t: t.astype(BF16) if eqx.is_array(t) else t, mlp)
    target = eqx.nn.MLP(4, 1, 8, depth=1, activation=jnp.tanh, key=ktarget)
    xs = normal(kdata, (64, 4))
    ys = jax.vmap(target)(xs)
    xs = xs.astype(BF16)
    model = quax_lora.loraify(mlp, rank=2, alpha=4.0, adapter_dtype=F32, key=klora)
    params, frozen = eqx.partition(model, quax_lora.trainable_filter(model))
    optimiser = optax.adam(1e-2)

    def quax_loss(params):
        y = jax.vmap(quax.quaxify(eqx.combine(params, frozen)))(xs)
        return jnp.mean((y.astype(F32) - ys) ** 2)

    def dense_loss(params):
        def dense(v):
            if not quax_lora.is_lora(v):
                return v.astype(F32) if eqx.is_inexact_array(v) else v
            return v.w.astype(F32) + v.scaling * v.a @ v.b

        full = jax.tree.map(
            dense, eqx.combine(params, frozen), is_leaf=quax_lora.is_lora
        )
        return jnp.mean((jax.vmap(full)(xs.astype(F32)) - ys) ** 2)

    def train(loss):
        @jax.jit
        def step(p, state):
            value, grads = jax.value_and_grad(loss)(p)
            updates, state = optimiser.update(grads, state, p)
            return optax.apply_updates(p, updates), state, value

        p, state, losses = params, optimiser.init(params), []
        for _ in range(30):
            p, state, value = step(p, state)
            losses.append(float(value))
        return p, np.array(losses)

    tuned, losses = train(quax_loss)
    _, dense_losses = train(dense_loss)
    assert losses[-1] < 0.5 * losses[0]
    np.testing.assert_allclose(losses, dense_losses, rtol=0.05)
    for v in jax.tree.leaves(eqx.combine(tuned, frozen), is_leaf=quax_lora.is_lora):
        if quax_lora.is_lora(v):
            assert v.w.dtype == BF16 and v.a.dtype == v.b.dtype == F32


def test_float64_adapter_under_x64():
    with jax.enable_x64(True):
        lora = _lora(F32, jnp.float64)
        x = normal(7, (4, 5), F32)
        out = _check(lambda v, x: v @ x.T, lora, x, k=12)
        assert out.dtype == F32
        grads = jax.grad(_loss)((lora.a, lora.b), lora, x)
        assert all(g.dtype == jnp.float64 for g in grads)
