"""Loading adapters whose dtype is not the model's adapter dtype, in peft's layout
and in quax-lora's own format alike: one the model's adapter holds exactly
(bfloat16 or float16 into float32) loads; one it would round (float32 into
bfloat16, float16 into bfloat16, float64 into float32) is refused unless
`cast=True`; one not floating, or complex into a real adapter, never loads. And
the settings of peft's `adapter_config.json` that `load_adapter` used to pass
over: each is read, checked against the model and the tensors, or refused. The
peft files are written here with `safetensors` from literals (peft itself runs
in `scripts/peft_roundtrip.sh`)."""

import contextlib
import io
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import ml_dtypes
import numpy as np
import pytest
import quax
import quax_lora
from safetensors.numpy import load_file, save_file


F64, F32, F16, BF16 = np.float64, np.float32, np.float16, ml_dtypes.bfloat16
PREFIX = "base_model.model."
# peft's lora_A (rank 1, in 3) and lora_B (out 2, rank 1): values with more
# significant bits than bfloat16 (8) or float16 (11) keep, so that any rounding
# shows.
LORA_A = np.array([[1.0 + 2.0**-12, -0.5 - 2.0**-15, 0.25 + 2.0**-14]])
LORA_B = np.array([[0.5 + 2.0**-13], [-1.0 - 2.0**-20]])
ALPHA = 2.0  # scaling alpha / r = 2
X = np.array([1.0, -2.0, 0.5])


def _config(**settings):
    return {
        "peft_type": "LORA",
        "r": 1,
        "lora_alpha": ALPHA,
        "target_modules": ["fc"],
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "bias": "none",
        "init_lora_weights": True,
        **settings,
    }


def _write(directory, tensors, **settings):
    """A peft adapter directory: `tensors` under their module names (with peft's
    prefix added), and the config."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {PREFIX + k: np.ascontiguousarray(v) for k, v in tensors.items()},
        str(directory / "adapter_model.safetensors"),
    )
    (directory / "adapter_config.json").write_text(json.dumps(_config(**settings)))
    return directory


def _lora_tensors(dtype, module="fc"):
    return {
        f"{module}.lora_A.weight": LORA_A.astype(dtype),
        f"{module}.lora_B.weight": LORA_B.astype(dtype),
    }


def _model(w_dtype, adapter_dtype=None, *, n=2, m=3, **kwargs):
    linear = eqx.nn.Linear(m, n, key=jr.key(0))
    linear = jax.tree.map(lambda t: t.astype(w_dtype) if eqx.is_array(t) else t, linear)
    return quax_lora.loraify(
        linear,
        rank=1,
        alpha=ALPHA,
        adapter_dtype=adapter_dtype,
        key=jr.key(1),
        **kwargs,
    )


def _load(directory, model, **kwargs):
    return quax_lora.load_adapter(directory, model, name_map={"": "fc"}, **kwargs)


def _dense_output(model, lora_a, lora_b, x=X):
    """torch's `W x + bias + (alpha / r) B (A x)`, in float64 from the literals
    and the model's base weight."""
    w = np.asarray(model.weight.w, np.float64)
    bias = np.asarray(model.bias, np.float64)
    return w @ x + bias + ALPHA * lora_b.astype(np.float64) @ (lora_a @ x)


# peft's layout ------------------------------------------------------------------


@pytest.mark.parametrize(
    "stored, w_dtype, adapter_dtype",
    [
        (F32, BF16, None),  # peft's float32 adapter, a bfloat16 model
        (F32, F16, None),
        (F16, BF16, None),  # neither holds the other
        (BF16, F16, None),
        (F32, F32, BF16),
    ],
)
def test_peft_narrowing_refused_unless_cast(tmp_path, stored, w_dtype, adapter_dtype):
    directory = _write(tmp_path, _lora_tensors(stored))
    model = _model(w_dtype, adapter_dtype)
    held = np.dtype(model.weight.adapter_dtype).name
    with pytest.raises(ValueError) as info:
        _load(directory, model)
    message = str(info.value)
    # The layer, both dtypes, and the two ways out.
    for part in (
        "layer ``",
        "peft module `fc`",
        "`lora_A.weight`, `lora_B.weight` are " + np.dtype(stored).name,
        f"the model's adapter is {held}",
        f"adapter_dtype=jnp.{np.dtype(stored).name}",
        "autocast_adapter_dtype=True",
        "cast=True",
    ):
        assert part in message, (part, message)
    # Cast knowingly: rounded as NumPy (ml_dtypes) rounds the literals.
    cast = _load(directory, model, cast=True)
    assert cast.weight.a.dtype == cast.weight.b.dtype == held
    np.testing.assert_array_equal(cast.weight.a, LORA_B.astype(stored).astype(held))
    np.testing.assert_array_equal(cast.weight.b, LORA_A.astype(stored).astype(held))
    # Loraified with the file's adapter dtype: the literals exactly.
    exact = _load(directory, _model(w_dtype, stored))
    np.testing.assert_array_equal(exact.weight.a, LORA_B.astype(stored))
    np.testing.assert_array_equal(exact.weight.b, LORA_A.astype(stored))


@pytest.mark.parametrize(
    "stored, w_dtype, adapter_dtype",
    [(BF16, F32, None), (F16, F32, None), (F16, BF16, F32), (BF16, BF16, F32)],
)
def test_peft_widening_loads_exactly(tmp_path, stored, w_dtype, adapter_dtype):
    directory = _write(tmp_path, _lora_tensors(stored))
    model = _model(w_dtype, adapter_dtype)
    loaded = _load(directory, model)
    assert loaded.weight.a.dtype == loaded.weight.b.dtype == F32
    # The stored values, exactly: converting to float32 rounds nothing.
    lora_a, lora_b = LORA_A.astype(stored), LORA_B.astype(stored)
    np.testing.assert_array_equal(loaded.weight.a, lora_b.astype(F32))
    np.testing.assert_array_equal(loaded.weight.b, lora_a.astype(F32))
    x = X.astype(w_dtype)
    out = quax.quaxify(loaded)(jnp.asarray(x))
    want = _dense_output(model, lora_a.astype(F64), lora_b, x.astype(F64))
    tol = 4 * float(jnp.finfo(w_dtype).eps)
    np.testing.assert_allclose(np.asarray(out, F64), want, rtol=tol, atol=tol)


def test_peft_float64_file(tmp_path):
    directory = _write(tmp_path, _lora_tensors(F64))
    # Without x64 an adapter is float32 at most: refused, as rounding.
    with pytest.raises(ValueError, match=r"are float64, and the model's adapter is "):
        _load(directory, _model(F32))
    with jax.enable_x64(True):
        with pytest.raises(ValueError, match=r"adapter_dtype=jnp\.float64"):
            _load(directory, _model(F32))
        loaded = _load(directory, _model(F32, F64))
        assert loaded.weight.a.dtype == F64
        np.testing.assert_array_equal(loaded.weight.a, LORA_B)
        np.testing.assert_array_equal(loaded.weight.b, LORA_A)
        # A float32 file into float64 adapters: exact.
        narrow = _write(tmp_path / "f32", _lora_tensors(F32))
        widened = _load(narrow, _model(F32, F64))
        np.testing.assert_array_equal(widened.weight.b, LORA_A.astype(F32))


def test_peft_dora_magnitude_narrowing_refused(tmp_path):
    magnitude = np.array([1.0 + 2.0**-12, 2.0 - 2.0**-11])
    tensors = {**_lora_tensors(BF16), "fc.lora_magnitude_vector": magnitude.astype(F32)}
    directory = _write(tmp_path, tensors, use_dora=True)
    model = _model(BF16, variant="dora")
    with pytest.raises(
        ValueError,
        match=r"the file's `lora_magnitude_vector` is float32, and the model's "
        r"adapter is bfloat16",
    ):
        _load(directory, model)
    cast = _load(directory, model, cast=True)
    np.testing.assert_array_equal(cast.weight.magnitude, magnitude.astype(BF16))
    exact = _load(directory, _model(BF16, F32, variant="dora"))
    np.testing.assert_array_equal(exact.weight.magnitude, magnitude.astype(F32))
    np.testing.assert_array_equal(exact.weight.a, LORA_B.astype(BF16).astype(F32))


@pytest.mark.parametrize(
    "stored, match",
    [
        (np.int32, "is of dtype int32, where an adapter is floating"),
        (np.complex64, "is complex.*drop the imaginary parts"),
    ],
)
def test_peft_tensors_never_loaded(tmp_path, stored, match):
    tensors = {
        "fc.lora_A.weight": np.array([[1, -2, 3]]).astype(stored),
        "fc.lora_B.weight": LORA_B.astype(F32),
    }
    directory = _write(tmp_path, tensors)
    for cast in (False, True):
        with pytest.raises(ValueError, match=match):
            _load(directory, _model(F32), cast=cast)


def test_peft_fan_in_fan_out_is_not_guessed(tmp_path):
    """A square layer loads in either layout, so a config saying the torch model
    stored `(in, out)` weights (GPT-2's Conv1D) was silently transposed into
    `eqx.nn.Linear`'s `(out, in)`."""
    lora_a = np.array([[1.0, 2.0]], F32)  # (r, in)
    lora_b = np.array([[3.0], [-1.0]], F32)  # (out, r)
    directory = _write(
        tmp_path,
        {"fc.lora_A.weight": lora_a, "fc.lora_B.weight": lora_b},
        fan_in_fan_out=True,
    )
    model = _model(F32, n=2, m=2)
    with pytest.raises(ValueError, match=r"fan_in_fan_out=true.*fan_in_fan_out=False"):
        _load(directory, model)
    # eqx.nn.Linear's (out, in): the update is B A, as torch's Linear.
    loaded = _load(directory, model, fan_in_fan_out=False)
    x = np.array([0.5, -2.0])
    np.testing.assert_allclose(
        quax.quaxify(loaded)(jnp.asarray(x, F32)),
        _dense_output(model, lora_a.astype(F64), lora_b, x),
        rtol=1e-6,
    )
    # A model whose weights are (in, out): its update is (B A)^T.
    transposed = _load(directory, model, fan_in_fan_out=True)
    np.testing.assert_array_equal(
        transposed.weight.a @ transposed.weight.b, (lora_b @ lora_a).T
    )


@pytest.mark.parametrize(
    "extra, settings, match",
    [
        (
            {"fc.bias": np.ones(2, F32)},
            {"bias": "lora_only"},
            r"`base_model\.model\.fc\.bias`.*bias='lora_only'",
        ),
        (
            {"head.weight": np.ones((2, 2), F32)},
            {"modules_to_save": ["head"]},
            r"`base_model\.model\.head\.weight`.*modules_to_save=\['head'\]",
        ),
        (
            {"fc.lora_B.bias": np.ones(2, F32)},
            {},
            r"leave unread: `base_model\.model\.fc\.lora_B\.bias`",
        ),
    ],
)
def test_peft_tensors_left_unread_are_refused(tmp_path, extra, settings, match):
    directory = _write(tmp_path, {**_lora_tensors(F32), **extra}, **settings)
    with pytest.raises(ValueError, match=match):
        _load(directory, _model(F32))


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"layer_replication": [[0, 1]]}, "layer_replication"),
        ({"init_lora_weights": "pissa"}, "changes the base weights"),
        ({"init_lora_weights": "pissa_niter_4"}, "changes the base weights"),
        ({"init_lora_weights": "olora"}, "changes the base weights"),
        ({"init_lora_weights": "loftq"}, "changes the base weights"),
        ({"init_lora_weights": "mica"}, "does not know"),
        ({"alora_invocation_tokens": [5, 6]}, "Activated LoRA"),
        ({"use_qalora": True}, "QA-LoRA"),
        ({"lora_bias": True}, "gives lora_B a bias"),
        ({"target_parameters": ["experts.w"]}, "target_parameters"),
        ({"trainable_token_indices": [3]}, "trainable_token_indices"),
        ({"use_rslora": True, "use_dora": True}, "do not combine"),
        (
            {"some_future_setting": 3},
            "some_future_setting=3, a setting this quax-lora does not know",
        ),
    ],
)
def test_peft_settings_quax_lora_cannot_reproduce(tmp_path, settings, match):
    directory = _write(tmp_path, _lora_tensors(F32), **settings)
    with pytest.raises(ValueError, match=match):
        _load(directory, _model(F32))


def test_peft_settings_that_do_not_change_the_outputs(tmp_path):
    directory = _write(
        tmp_path,
        _lora_tensors(F32),
        lora_dropout=0.1,  # training only
        task_type="CAUSAL_LM",
        base_model_name_or_path="some/model",
        inference_mode=False,
        peft_version="0.17.0",
        runtime_config={"ephemeral_gpu_offload": False},
        megatron_core="megatron.core",
        init_lora_weights="gaussian",
        bias="all",  # no bias in the file: nothing more to load
        modules_to_save=None,
        layers_to_transform=None,
        some_future_setting=None,
    )
    model = _model(F32)
    loaded = _load(directory, model)
    np.testing.assert_allclose(
        quax.quaxify(loaded)(jnp.asarray(X, F32)),
        _dense_output(model, LORA_A, LORA_B),
        rtol=1e-6,
    )


def _mlp():
    return quax_lora.loraify(
        eqx.nn.MLP(3, 3, 3, depth=1, key=jr.key(0)), rank=1, alpha=ALPHA, key=jr.key(1)
    )


# Our modules `layers.0` and `layers.1`, named as in a transformers model.
NAMES = {"layers.0": "model.layers.0.q_proj", "layers.1": "model.layers.1.q_proj"}


def _square_tensors(module):
    return {
        f"{module}.lora_A.weight": np.array([[1.0, 2.0, 3.0]], F32),
        f"{module}.lora_B.weight": np.array([[1.0], [0.0], [-1.0]], F32),
    }


@pytest.mark.parametrize(
    "settings, selected",
    [
        ({"target_modules": ["q_proj"]}, True),
        ({"target_modules": ["k_proj"]}, False),
        ({"target_modules": r".*\.q_proj"}, True),
        ({"target_modules": "q_proj"}, False),  # a string matches the whole name
        ({"target_modules": ["q_proj"], "layers_to_transform": [0, 1]}, True),
        ({"target_modules": ["q_proj"], "layers_to_transform": [0]}, False),
        (
            {
                "target_modules": ["q_proj"],
                "layers_to_transform": 1,
                "layers_pattern": "layers",
            },
            False,
        ),
        (
            {
                "target_modules": ["q_proj"],
                "exclude_modules": ["model.layers.1.q_proj"],
            },
            False,
        ),
        ({"target_modules": ["q_proj"], "modules_to_save": ["layers.1"]}, False),
    ],
)
def test_peft_modules_checked_against_target_modules(tmp_path, settings, selected):
    """A module peft's config does not select is one whose tensors peft would not
    load: its adapter would be missing from peft's outputs."""
    tensors = {
        **_square_tensors(NAMES["layers.0"]),
        **_square_tensors(NAMES["layers.1"]),
    }
    directory = _write(tmp_path, tensors, **settings)
    model = _mlp()
    if selected:
        loaded = quax_lora.load_adapter(directory, model, name_map=NAMES)
        np.testing.assert_array_equal(loaded.layers[1].weight.b, [[1.0, 2.0, 3.0]])
    else:
        with pytest.raises(
            ValueError, match=r"`model\.layers\.[01]\.q_proj`, a module"
        ):
            quax_lora.load_adapter(directory, model, name_map=NAMES)


def test_peft_alpha_pattern_read_in_peft_order(tmp_path):
    """peft takes the first key of `alpha_pattern` matching the end of a module's
    name, even where a later key equals the name: `{"0": 8, "layers.0": 4}` gives
    `layers.0` alpha 8. quax-lora preferred the equal key (alpha 4), and so loaded
    the adapter into a model whose `layers.0` scales by half of peft's."""
    tensors = {**_square_tensors("layers.0"), **_square_tensors("layers.1")}
    directory = _write(
        tmp_path,
        tensors,
        lora_alpha=4.0,
        alpha_pattern={"0": 8.0, "layers.0": 4.0},
        target_modules=["layers.0", "layers.1"],
    )
    halved = quax_lora.loraify(
        eqx.nn.MLP(3, 3, 3, depth=1, key=jr.key(0)), rank=1, alpha=4.0, key=jr.key(1)
    )
    with pytest.raises(
        ValueError,
        match=r"layer `layers\.0` has rank 1 and scaling 4\.0, .* scaling 8\.0",
    ):
        quax_lora.load_adapter(directory, halved)
    model = eqx.tree_at(
        lambda m: m.layers[0].weight, halved, halved.layers[0].weight.replace(alpha=8.0)
    )
    loaded = quax_lora.load_adapter(directory, model)
    x = np.array([1.0, 0.5, -1.0])
    hidden = np.asarray(model.layers[0].weight.w, F64) @ x + model.layers[0].bias
    hidden = hidden + 8.0 * np.array([1.0, 0.0, -1.0]) * (np.array([1.0, 2.0, 3.0]) @ x)
    hidden = np.maximum(hidden, 0.0)
    out = np.asarray(model.layers[1].weight.w, F64) @ hidden + model.layers[1].bias
    out = out + 4.0 * np.array([1.0, 0.0, -1.0]) * (np.array([1.0, 2.0, 3.0]) @ hidden)
    np.testing.assert_allclose(
        quax.quaxify(loaded)(jnp.asarray(x, F32)), out, rtol=1e-5
    )


def test_peft_conv_dora_magnitude_in_peft_shape(tmp_path):
    """peft keeps a convolution's DoRA magnitude as `(1, out, 1, 1)`, the shape of
    the norms it divides."""
    conv = eqx.nn.Conv2d(2, 3, 2, key=jr.key(0))
    model = quax_lora.loraify(
        conv, rank=1, alpha=ALPHA, filter=eqx.nn.Conv, variant="dora", key=jr.key(1)
    )
    magnitude = np.array([1.5, 0.5, 2.0], F32)
    lora_a = np.arange(8, dtype=F32).reshape(1, 2, 2, 2) / 8  # (r, in, kh, kw)
    lora_b = np.array([1.0, -1.0, 0.5], F32).reshape(3, 1, 1, 1)  # (out, r, 1, 1)
    directory = _write(
        tmp_path,
        {
            "fc.lora_A.weight": lora_a,
            "fc.lora_B.weight": lora_b,
            "fc.lora_magnitude_vector": magnitude.reshape(1, 3, 1, 1),
        },
        use_dora=True,
    )
    loaded = _load(directory, model)
    np.testing.assert_array_equal(loaded.weight.magnitude, magnitude)
    # The dense weight as peft forms it: magnitude * (W + s B A) / ||W + s B A||.
    update = (lora_b.reshape(3, 1) @ lora_a.reshape(1, 8)).reshape(3, 2, 2, 2)
    weight = np.asarray(model.weight.w, F64) + ALPHA * update
    norms = np.sqrt((weight**2).sum(axis=(1, 2, 3), keepdims=True))
    want = magnitude.reshape(3, 1, 1, 1) * weight / norms
    np.testing.assert_allclose(quax_lora.merge(loaded).weight, want, rtol=1e-5)
    # And written back in that shape.
    quax_lora.save_adapter(
        tmp_path / "ours", loaded, format="peft", name_map={"": "fc"}
    )
    written = load_file(str(tmp_path / "ours" / "adapter_model.safetensors"))
    assert written[PREFIX + "fc.lora_magnitude_vector"].shape == (1, 3, 1, 1)


# quax-lora's own format -----------------------------------------------------------


def _saved(model) -> io.BytesIO:
    f = io.BytesIO()
    quax_lora.save_adapter(f, model)
    f.seek(0)
    return f


def _legacy(model) -> io.BytesIO:
    """What `save_adapter` wrote before the settings were recorded: the leaves."""
    f = io.BytesIO()
    eqx.tree_serialise_leaves(f, eqx.filter(model, quax_lora.adapter_filter(model)))
    f.seek(0)
    return f


def _warns(write):
    """A file without settings loads with a `LegacyAdapterWarning`; one with
    them, without a warning (warnings are errors here)."""
    if write is _legacy:
        return pytest.warns(quax_lora.LegacyAdapterWarning)
    return contextlib.nullcontext()


def _tuned(w_dtype, adapter_dtype):
    model = _model(w_dtype, adapter_dtype)
    return eqx.tree_at(
        lambda m: (m.weight.a, m.weight.b),
        model,
        (jnp.asarray(LORA_B, adapter_dtype), jnp.asarray(LORA_A, adapter_dtype)),
    )


@pytest.mark.parametrize("write", [_saved, _legacy])
def test_quax_format_narrowing_refused_unless_cast(write):
    tuned = _tuned(F32, F32)
    model = _model(F32, BF16)
    with _warns(write), pytest.raises(ValueError) as info:
        quax_lora.load_adapter(write(tuned), model)
    message = str(info.value)
    for part in (
        "layer `.weight`: the file's `a`, `b` are float32, and the model's adapter "
        "is bfloat16",
        "adapter_dtype=jnp.float32",
        "cast=True",
    ):
        assert part in message, (part, message)
    with _warns(write):
        cast = quax_lora.load_adapter(write(tuned), model, cast=True)
    np.testing.assert_array_equal(cast.weight.a, LORA_B.astype(F32).astype(BF16))
    np.testing.assert_array_equal(cast.weight.b, LORA_A.astype(F32).astype(BF16))


@pytest.mark.parametrize("write", [_saved, _legacy])
def test_quax_format_widening_loads_exactly(write):
    tuned = _tuned(F32, BF16)
    model = _model(F32, F32)
    with _warns(write):
        loaded = quax_lora.load_adapter(write(tuned), model)
    assert loaded.weight.a.dtype == F32
    lora_a, lora_b = LORA_A.astype(BF16), LORA_B.astype(BF16)
    np.testing.assert_array_equal(loaded.weight.b, lora_a.astype(F32))
    out = quax.quaxify(loaded)(jnp.asarray(X, F32))
    want = _dense_output(model, lora_a.astype(F64), lora_b)
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_quax_format_legacy_shape_names_the_layer():
    other = quax_lora.loraify(
        eqx.nn.Linear(3, 2, key=jr.key(0)), rank=2, alpha=ALPHA, key=jr.key(1)
    )
    with (
        pytest.warns(quax_lora.LegacyAdapterWarning),
        pytest.raises(
            ValueError,
            match=r"layer `\.weight`: the file's `a` has shape \(2, 1\), where "
            r"the model's has \(2, 2\)",
        ),
    ):
        quax_lora.load_adapter(_legacy(_tuned(F32, F32)), other)


def test_quax_format_legacy_file_of_other_layers():
    """A file without a header records no layers: one of more layers than the
    model (each of the same shapes) loaded its first ones, silently."""
    mlp = lambda depth: quax_lora.loraify(
        eqx.nn.MLP(3, 3, 3, depth=depth, key=jr.key(0)), rank=1, key=jr.key(1)
    )
    with (
        pytest.warns(quax_lora.LegacyAdapterWarning),
        pytest.raises(
            ValueError, match=r"the file holds more arrays than the model's adapter"
        ),
    ):
        quax_lora.load_adapter(_legacy(mlp(2)), mlp(1))
    with (
        pytest.warns(quax_lora.LegacyAdapterWarning),
        pytest.raises(
            ValueError,
            match=r"layer `\.layers\[1\]\.weight`: the file ends before its `a`",
        ),
    ):
        quax_lora.load_adapter(_legacy(mlp(0)), mlp(1))
    # A file with a header may be followed by other data, left unread.
    f = _saved(mlp(1))
    f.seek(0, io.SEEK_END)
    f.write(b"more")
    f.seek(0)
    quax_lora.load_adapter(f, mlp(1))
    assert f.read() == b"more"
