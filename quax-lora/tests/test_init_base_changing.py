"""PiSSA, OLoRA and LoftQ (`loraify(init=...)`), each against a NumPy reference
written from its definition (peft's `pissa_init`, `olora_init`, `loftq_init`);
their peft files, and the conversion of PiSSA/OLoRA into a plain LoRA."""

import json

import equinox as eqx
import jax.core
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest
import quax
import quax_lora
from lora_helpers import normal
from quax_lora._init_base_changing import NF4_LEVELS, svd_lowrank
from scipy.stats import norm


OUT, IN, RANK, ALPHA = 24, 40, 4, 6.0
S = ALPHA / RANK  # peft's scaling, not 1, so that its conventions show


def _linear(seed=0, out=OUT, inp=IN):
    layer = eqx.nn.Linear(inp, out, key=jr.key(seed))
    weight = normal(seed + 100, (out, inp))
    return eqx.tree_at(lambda layer: layer.weight, layer, weight)


def _adapted(init, layer=None, **kwargs):
    layer = _linear() if layer is None else layer
    kwargs = {"rank": RANK, "alpha": ALPHA, "key": jr.key(3), **kwargs}
    return quax_lora.loraify(layer, init=init, **kwargs).weight


def _truncated_svd(w, rank):
    u, s, vh = np.linalg.svd(np.asarray(w, np.float64), full_matrices=False)
    return u[:, :rank], s[:rank], vh[:rank]


def _close(x, y, rtol=2e-5):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = max(np.abs(y).max(), 1e-30)
    np.testing.assert_allclose(x / scale, y / scale, atol=rtol)


def test_pissa_against_the_svd():
    w = np.asarray(_linear().weight)
    lora = _adapted("pissa")
    u, s, vh = _truncated_svd(w, RANK)
    principal = u @ np.diag(s) @ vh
    a, b = np.asarray(lora.a, np.float64), np.asarray(lora.b, np.float64)
    # peft: lora_B = U_r sqrt(S_r / s) (our a), lora_A = sqrt(S_r / s) V_r^T (our b)
    _close(S * a @ b, principal)
    _close(a.T @ a, np.diag(s / S))
    _close(b @ b.T, np.diag(s / S))
    _close(lora.w, w - principal)
    # The base became the residual, so the model computes what it did.
    _close(lora.dense(), w, rtol=1e-6)
    assert lora.init == "pissa"


def _numpy_svd_lowrank(t, rank, niter, omega):
    """torch.svd_lowrank's algorithm (Halko et al. 2009, algorithm 5), in NumPy."""
    wide = t.shape[0] < t.shape[1]
    a = t.T if wide else t
    q = np.linalg.qr(a @ omega)[0]
    for _ in range(niter):
        q = np.linalg.qr(a.T @ q)[0]
        q = np.linalg.qr(a @ q)[0]
    u, s, vh = np.linalg.svd(q.T @ a, full_matrices=False)
    u = q @ u
    return (vh.T, s, u.T) if wide else (u, s, vh)


@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
def test_randomised_svd_against_numpy(shape):
    t = np.asarray(normal(1, shape), np.float64)
    omega = np.asarray(normal(2, (min(shape), RANK)), np.float64)
    ours = svd_lowrank(
        jnp.asarray(t, jnp.float32), RANK, 2, jnp.asarray(omega, jnp.float32)
    )
    u, s, vh = _numpy_svd_lowrank(t, RANK, 2, omega)
    _close(np.asarray(ours[0]) * ours[1][None] @ ours[2], u * s @ vh, rtol=1e-4)
    _close(ours[1], s, rtol=1e-4)


def test_pissa_niter_is_exact_and_close_to_pissa():
    # A spectrum that decays, as trained weights' do (a Gaussian matrix's is
    # flat, and a sketch of exactly `rank` columns does not single out its top).
    u = np.linalg.qr(np.asarray(normal(1, (OUT, OUT))))[0]
    v = np.linalg.qr(np.asarray(normal(2, (IN, OUT))))[0]
    w = (u * 0.5 ** np.arange(OUT) @ v.T).astype(np.float32)
    layer = eqx.tree_at(lambda layer: layer.weight, _linear(), jnp.asarray(w))
    fast = _adapted("pissa_niter_4", layer)
    # The residual is taken from the factors found: w_res + s a b is w exactly.
    _close(fast.dense(), w, rtol=1e-6)
    u, s, vh = _truncated_svd(w, RANK)
    _close(S * np.asarray(fast.a) @ np.asarray(fast.b), u @ np.diag(s) @ vh, 1e-3)
    assert fast.init == "pissa_niter_4"


def test_olora_against_the_qr_factorisation():
    w = np.asarray(_linear().weight)
    lora = _adapted("olora")
    q, r = np.linalg.qr(np.asarray(w, np.float64))
    q, r = q[:, :RANK], r[:RANK]
    # QR is unique up to the signs of R's diagonal: compare with them positive.
    d = np.sign(np.diag(r))
    d_ours = np.sign(np.diag(np.asarray(lora.b)[:, :RANK]))
    # peft: lora_B = Q_r (our a), lora_A = R_r (our b), not divided by s.
    _close(np.asarray(lora.a) * d_ours, q * d)
    _close(d_ours[:, None] * np.asarray(lora.b), d[:, None] * r)
    _close(lora.w, w - S * q @ r)
    _close(lora.dense(), w, rtol=1e-6)


def _nf4_levels_from_their_definition():
    """QLoRA's NF4 (bitsandbytes' `create_normal_map(0.9677083)`): 8 positive
    and 7 negative quantiles of N(0, 1), and zero, scaled to [-1, 1]."""
    offset = 0.9677083
    positive = norm.ppf(np.linspace(offset, 0.5, 9)[:-1])
    negative = -norm.ppf(np.linspace(offset, 0.5, 8)[:-1])
    levels = np.sort(np.concatenate([positive, [0.0], negative]))
    return levels / np.abs(levels).max()


def test_nf4_levels():
    # bitsandbytes' table, within a unit of float32's last place of the levels
    # recomputed from their definition.
    np.testing.assert_allclose(
        NF4_LEVELS, _nf4_levels_from_their_definition(), rtol=0, atol=2.5e-7
    )


def _numpy_quantise(t, bits, format):
    """LoftQ's quantiser written from its definition: absmax per block of 64
    (flattened (out, in)) rounded to the nearest NF4 level or k / 7; for 8 bits
    absmax per row rounded to k / 127."""
    if bits == 8:
        absmax = np.abs(t).max(axis=1, keepdims=True)
        return np.round(t / absmax * 127) * absmax / 127
    flat = t.ravel()
    out = np.empty_like(flat)
    for start in range(0, flat.size, 64):
        block = flat[start : start + 64]
        absmax = np.abs(block).max()
        x = block / absmax
        if format == "nf4":
            levels = _nf4_levels_from_their_definition()
            q = levels[np.abs(x[:, None] - levels[None]).argmin(axis=1)]
        else:
            q = np.round(x * 7) / 7
        out[start : start + 64] = q * absmax
    return out.reshape(t.shape)


def _numpy_loftq(w, rank, scaling, bits, format, iters):
    residual = w
    for i in range(iters):
        q = _numpy_quantise(residual, bits, format)
        u, s, vh = np.linalg.svd(w - q, full_matrices=False)
        low = u[:, :rank] * s[:rank] @ vh[:rank]  # s * B A
        if i + 1 < iters:
            residual = w - low
    return q, low


@pytest.mark.parametrize(
    "bits, format, iters", [(4, "nf4", 1), (4, "nf4", 3), (4, "int", 2), (8, "int", 2)]
)
def test_loftq_against_numpy(bits, format, iters):
    w = np.asarray(_linear().weight, np.float64)
    lora = _adapted("loftq", loftq_bits=bits, loftq_format=format, loftq_iters=iters)
    q, low = _numpy_loftq(w, RANK, S, bits, format, iters)
    # A level chosen differently (a tie, or float32 against float64 rounding)
    # moves one entry by a level's width: allow one in a thousand.
    differ = np.abs(np.asarray(lora.w) - q) > 1e-5 * np.abs(w).max()
    assert differ.mean() < 1e-3
    _close(
        S * np.asarray(lora.a, np.float64) @ np.asarray(lora.b, np.float64), low, 1e-3
    )
    assert dict(lora.init_settings) == {
        "bits": bits,
        "iters": iters,
        "quantiser": format,
    }


@pytest.mark.parametrize("bits, format", [(4, "nf4"), (4, "int"), (8, "int")])
def test_loftq_error_below_zero_initialised_qlora(bits, format):
    layer = _linear(5, 64, 128)
    w = np.asarray(layer.weight, np.float64)
    lora = _adapted(
        "loftq",
        layer,
        rank=8,
        alpha=8.0,
        loftq_bits=bits,
        loftq_format=format,
        loftq_iters=5,
    )
    # QLoRA: the base quantised, b = 0.
    qlora = np.linalg.norm(w - _numpy_quantise(w, bits, format))
    loftq = np.linalg.norm(w - np.asarray(lora.dense(), np.float64))
    assert loftq < 0.95 * qlora, (loftq, qlora)


def test_loftq_with_a_quantiser_of_the_users():
    calls = []

    def quantiser(x):
        calls.append(x.shape)
        return jnp.round(x * 4) / 4  # a coarse uniform grid, as an array

    w = np.asarray(_linear().weight, np.float64)
    lora = _adapted("loftq", loftq_quantiser=quantiser, loftq_iters=2)
    assert calls == [(OUT, IN), (OUT, IN)]
    q = np.round(w * 4) / 4
    u, s, vh = _truncated_svd(w - q, RANK)
    low = u * s @ vh
    q = np.round((w - low) * 4) / 4
    u, s, vh = _truncated_svd(w - q, RANK)
    _close(lora.w, q)
    _close(S * np.asarray(lora.a) @ np.asarray(lora.b), u * s @ vh, 1e-3)
    assert dict(lora.init_settings)["quantiser"] == "custom"


class _Dequantised(quax.ArrayValue):
    """A stand-in for a quantised weight (say quax-quant's): it only holds its
    dequantised array, and says so through `.dequantise()`."""

    array: jnp.ndarray

    def aval(self):
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self):
        return self.array

    def dequantise(self):
        return self.array


def _with_weights(model, weights):
    """`model` with its `eqx.nn.Linear` weights replaced, in order, by `weights`."""
    layers = iter(weights)
    return quax.map_selected(
        lambda layer: eqx.tree_at(lambda layer: layer.weight, layer, next(layers)),
        model,
        filter=eqx.nn.Linear,
    )


def _linears(model):
    is_linear = lambda x: isinstance(x, eqx.nn.Linear)
    return [x for x in jtu.tree_leaves(model, is_leaf=is_linear) if is_linear(x)]


def test_loftq_on_a_given_base_against_numpy():
    """`loftq_base=`: the model quantised elsewhere (a GPTQ result, say) is each
    layer's base as it is, and `s B A` the rank-r SVD of `W - Q`, written here
    in NumPy from LoftQ's definition."""
    model = eqx.nn.MLP(IN, OUT, 32, depth=2, key=jr.key(11))
    floats = [np.asarray(layer.weight, np.float64) for layer in _linears(model)]
    # A quantisation of each weight that quax-lora's own LoftQ quantiser does not
    # make: a uniform grid of 1/8, one as an array, the others as values.
    grids = [np.round(w * 8) / 8 for w in floats]
    given = [jnp.asarray(grids[0], jnp.float32)] + [
        _Dequantised(jnp.asarray(q, jnp.float32)) for q in grids[1:]
    ]
    quantised = _with_weights(model, given)
    lora = quax_lora.loraify(
        model, rank=RANK, alpha=ALPHA, init="loftq", loftq_base=quantised, key=jr.key(3)
    )
    for layer, w, q, base in zip(_linears(lora), floats, grids, given, strict=True):
        adapter = layer.weight
        # The given base, not a requantisation.
        assert type(adapter.w) is type(base)
        np.testing.assert_array_equal(
            jtu.tree_leaves(adapter.w)[0], jtu.tree_leaves(base)[0]
        )
        u, s, vh = _truncated_svd(w - q, RANK)
        _close(
            S * np.asarray(adapter.a, np.float64) @ np.asarray(adapter.b), u * s @ vh
        )
        assert dict(adapter.init_settings) == {
            "bits": 4,
            "iters": 1,
            "quantiser": "custom",
        }
        # Closer to W than the base alone (QLoRA's zero-initialised adapter).
        loftq = np.linalg.norm(w - q - S * np.asarray(adapter.a @ adapter.b))
        assert loftq < 0.9 * np.linalg.norm(w - q)
    # The loraified model runs on the given bases plus the adapters.
    want = X
    for i, (layer, q) in enumerate(zip(_linears(lora), grids, strict=True)):
        want = (q + S * np.asarray(layer.weight.a @ layer.weight.b)) @ want
        want = want + np.asarray(layer.bias)
        if i < 2:
            want = np.maximum(want, 0)
    _close(quax.quaxify(lora)(jnp.asarray(X)), want, 1e-5)


def test_loftq_base_refusals():
    model = eqx.nn.MLP(IN, OUT, 32, depth=1, key=jr.key(11))
    rounded = [jnp.round(layer.weight * 8) / 8 for layer in _linears(model)]
    quantised = _with_weights(model, rounded)
    kwargs = {"rank": RANK, "key": jr.key(0), "loftq_base": quantised}
    for extra, match in [
        ({}, "init='loftq', and init=None"),
        ({"init": "pissa"}, "init='pissa'"),
        (
            {"init": "loftq", "loftq_quantiser": lambda w: w},
            "loftq_quantiser= is given too",
        ),
        ({"init": "loftq", "loftq_iters": 2}, "loftq_iters=2"),
    ]:
        with pytest.raises(ValueError, match=match):
            quax_lora.loraify(model, **kwargs, **extra)
    # A base that changed more than the weights: its bias (as AWQ's folded
    # scales change the layers before the quantised ones).
    moved = eqx.tree_at(
        lambda m: m.layers[0].bias, quantised, 2 * quantised.layers[0].bias
    )
    kwargs = {"rank": RANK, "key": jr.key(0), "init": "loftq"}
    with pytest.raises(ValueError, match=r"leaf at \.layers\[0\]\.bias differs"):
        quax_lora.loraify(model, **kwargs, loftq_base=moved)
    # Another model: other layers.
    with pytest.raises(ValueError, match="not the same model"):
        quax_lora.loraify(
            model, **kwargs, loftq_base=eqx.nn.MLP(IN, OUT, 32, depth=2, key=jr.key(11))
        )
    # A weight of another shape, and a layer without one.
    wrong = eqx.tree_at(lambda m: m.layers[1].weight, quantised, rounded[1].T)
    with pytest.raises(ValueError, match=r"layer 1 has shape \(32, 24\)"):
        quax_lora.loraify(model, **kwargs, loftq_base=wrong)
    none = eqx.tree_at(
        lambda m: m.layers[1].weight, quantised, None, is_leaf=lambda x: x is None
    )
    with pytest.raises(ValueError, match="layer 1 has no weight"):
        quax_lora.loraify(model, **kwargs, loftq_base=none)
    # Under jax.jit the two models' leaves cannot be compared: said, not skipped.
    with pytest.raises(ValueError, match="traced"):
        eqx.filter_jit(lambda m, q: quax_lora.loraify(m, **kwargs, loftq_base=q))(
            model, quantised
        )


def _moved(model, seed):
    """`model` with its adapters moved, as training would."""

    def leaf(x):
        if isinstance(x, quax_lora.LoraArray):
            return x.replace(
                a=x.a + 0.1 * normal(seed, x.a.shape),
                b=x.b + 0.1 * normal(seed + 1, x.b.shape),
            )
        return x

    return jtu.tree_map(leaf, model, is_leaf=quax_lora.is_lora)


def _mlp():
    return eqx.nn.MLP(IN, OUT, 32, depth=1, key=jr.key(11))


X = np.asarray(normal(12, (IN,)))


@pytest.mark.parametrize("init", ["pissa", "olora", "loftq"])
def test_peft_round_trip_and_refusals(tmp_path, init):
    kwargs = {"rank": RANK, "alpha": ALPHA, "init": init, "key": jr.key(0)}
    tuned = _moved(quax_lora.loraify(_mlp(), **kwargs), 1)
    quax_lora.save_adapter(tmp_path / "peft", tuned, format="peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["init_lora_weights"] == init
    want = {"loftq_bits": 4, "loftq_iter": 1} if init == "loftq" else {}
    assert config["loftq_config"] == want
    fresh = quax_lora.loraify(_mlp(), **kwargs)
    loaded = quax_lora.load_adapter(tmp_path / "peft", fresh)
    np.testing.assert_allclose(
        quax.quaxify(loaded)(X), quax.quaxify(tuned)(X), rtol=1e-6, atol=1e-6
    )
    # Into a model whose base was not changed: refused, and the reverse too.
    plain = quax_lora.loraify(_mlp(), rank=RANK, alpha=ALPHA, key=jr.key(0))
    with pytest.raises(ValueError, match="changes the base weights"):
        quax_lora.load_adapter(tmp_path / "peft", plain)
    quax_lora.save_adapter(tmp_path / "plain", plain, format="peft")
    with pytest.raises(ValueError, match="leaves the base weights unchanged"):
        quax_lora.load_adapter(tmp_path / "plain", fresh)
    # quax-lora's own format records it too.
    quax_lora.save_adapter(tmp_path / "ours", tuned)
    np.testing.assert_allclose(
        quax.quaxify(quax_lora.load_adapter(tmp_path / "ours", fresh))(X),
        quax.quaxify(tuned)(X),
        rtol=1e-6,
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="init="):
        quax_lora.load_adapter(tmp_path / "ours", plain)


def test_peft_loftq_settings_must_agree(tmp_path):
    kwargs = {"rank": RANK, "alpha": ALPHA, "init": "loftq", "key": jr.key(0)}
    quax_lora.save_adapter(tmp_path, quax_lora.loraify(_mlp(), **kwargs), format="peft")
    other = quax_lora.loraify(_mlp(), **kwargs, loftq_iters=2)
    with pytest.raises(ValueError, match="loftq_iter=1"):
        quax_lora.load_adapter(tmp_path, other)
    int4 = quax_lora.loraify(_mlp(), **kwargs, loftq_format="int")
    with pytest.raises(ValueError, match="'int' quantiser"):
        quax_lora.load_adapter(tmp_path, int4)


@pytest.mark.parametrize("init, variant", [("pissa", "lora"), ("olora", "rslora")])
def test_convert_to_lora(tmp_path, init, variant):
    model = _mlp()
    kwargs = {"rank": RANK, "alpha": ALPHA, "variant": variant, "key": jr.key(0)}
    initial = quax_lora.loraify(model, init=init, **kwargs)
    tuned = _moved(initial, 3)
    plain = quax_lora.convert_to_lora(tuned, initial)
    for layer, original in zip(plain.layers, model.layers, strict=True):
        assert layer.weight.init is None and layer.weight.rank == 2 * RANK
        _close(layer.weight.w, original.weight, rtol=1e-6)
    np.testing.assert_allclose(
        quax.quaxify(plain)(X), quax.quaxify(tuned)(X), rtol=1e-5, atol=1e-6
    )
    # Saved as peft's conversion writes it: twice the rank and alpha, plain init.
    quax_lora.save_adapter(tmp_path, plain, format="peft")
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    factor = 2**0.5 if variant == "rslora" else 2
    assert config["r"] == 2 * RANK and config["init_lora_weights"] is True
    assert config["lora_alpha"] == pytest.approx(ALPHA * factor)
    target = quax_lora.loraify(
        model, **{**kwargs, "rank": 2 * RANK, "alpha": ALPHA * factor}
    )
    loaded = quax_lora.load_adapter(tmp_path, target)
    np.testing.assert_allclose(
        quax.quaxify(loaded)(X), quax.quaxify(tuned)(X), rtol=1e-5, atol=1e-6
    )


def test_convert_to_lora_refusals():
    loftq = quax_lora.loraify(_mlp(), rank=RANK, init="loftq", key=jr.key(0))
    with pytest.raises(ValueError, match="only PiSSA and OLoRA"):
        quax_lora.convert_to_lora(loftq, loftq)
    pissa = quax_lora.loraify(_mlp(), rank=RANK, init="pissa", key=jr.key(0))
    olora = quax_lora.loraify(_mlp(), rank=RANK, init="olora", key=jr.key(0))
    with pytest.raises(ValueError, match="pass the model loraify returned"):
        quax_lora.convert_to_lora(pissa, olora)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"init": "svd"}, "init=None"),
        ({"init": "loftq", "loftq_bits": 3}, "loftq_bits=4 or 8"),
        ({"init": "loftq", "loftq_iters": 0}, "loftq_iters >= 1"),
        ({"init": "loftq", "loftq_bits": 8, "loftq_format": "nf4"}, "4 bits only"),
        ({"init": "pissa", "variant": "dora"}, "variant='dora'"),
        ({"init": "olora", "filter": eqx.nn.Embedding}, "embeddings"),
    ],
)
def test_init_errors(kwargs, match):
    model = eqx.nn.Sequential([eqx.nn.Embedding(10, IN, key=jr.key(0)), _linear()])
    with pytest.raises(ValueError, match=match):
        quax_lora.loraify(model, rank=RANK, key=jr.key(1), **kwargs)


def test_init_needs_a_dense_base():
    class Held(quax.ArrayValue):
        array: jnp.ndarray

        def aval(self):
            return jax.core.ShapedArray(self.array.shape, self.array.dtype)

        def materialise(self):
            return self.array

    layer = _linear()
    layer = eqx.tree_at(lambda layer: layer.weight, layer, Held(layer.weight))
    with pytest.raises(ValueError, match="computes the adapter from the dense base"):
        quax_lora.loraify(layer, rank=RANK, init="pissa", key=jr.key(1))


def test_stacking_refuses_adapters_of_other_bases():
    pissa = quax_lora.loraify(_mlp(), rank=RANK, init="pissa", key=jr.key(0))
    plain = quax_lora.loraify(_mlp(), rank=RANK, key=jr.key(0))
    with pytest.raises(ValueError, match="init"):
        quax_lora.stack_adapters([pissa, plain])
