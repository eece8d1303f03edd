"""Adapter files cut short or changed: `load_adapter` raises a
`CorruptAdapterError` that says the file is corrupt and names the file and the
field, checks every length against the file's size before reading it, and never
unpickles (so never runs) anything in the file. quax-lora's own format and
peft's directory (its `adapter_config.json` and safetensors file)."""

import json
import pathlib
import pickle

import equinox as eqx
import jax.random as jr
import numpy as np
import pytest
import quax_lora


MLP = eqx.nn.MLP(4, 3, 5, depth=1, key=jr.key(0))
MAGIC = b"quax-lora adapter\n"


@pytest.fixture
def model(perturb):
    return perturb(quax_lora.loraify(MLP, rank=2, key=jr.key(1)), jr.key(2))


@pytest.fixture
def saved(model, tmp_path):
    """The bytes of the model's adapter in quax-lora's format, the length of
    its header, and where the file is to be written."""
    path = tmp_path / "adapter.eqx"
    quax_lora.save_adapter(path, model)
    data = path.read_bytes()
    length = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    return data, length, path


def _refused(path, model, *fields):
    """`load_adapter(path, model)` raises a `CorruptAdapterError` (a
    `ValueError`) naming the file and each of `fields`."""
    with pytest.raises(quax_lora.CorruptAdapterError) as info:
        quax_lora.load_adapter(path, model)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "is corrupt" in message and f"`{path}`" in message, message
    for field in fields:
        assert field in message, message
    return message


def _header_swapped(data, length, header):
    """The file `data` with `header` (bytes) in place of its header."""
    rest = data[len(MAGIC) + 8 + length :]
    return MAGIC + len(header).to_bytes(8, "little") + header + rest


def test_truncated_file_names_the_leaf(model, saved):
    data, _, path = saved
    path.write_bytes(data[:-20])
    message = _refused(path, model, "`b` of layer `.layers[1].weight`")
    assert "40 bytes" in message and "only 20 byte(s)" in message
    # Cut between two arrays: the next one is missing.
    last = data.rindex(b"\x93NUMPY")
    path.write_bytes(data[:last])
    _refused(path, model, "`b` of layer `.layers[1].weight`", "is missing")


@pytest.mark.parametrize("length", [2**62, 2**31, 2**64 - 1])
def test_header_length_beyond_the_file(model, saved, length):
    data, _, path = saved
    path.write_bytes(MAGIC + length.to_bytes(8, "little") + data[len(MAGIC) + 8 :])
    message = _refused(path, model, "header length", f"says {length} bytes")
    assert f"only {len(data) - len(MAGIC) - 8} byte(s) follow it" in message


def test_header_cut_inside_its_length(model, saved):
    data, _, path = saved
    path.write_bytes(data[: len(MAGIC) + 3])
    _refused(path, model, "header length", "3 of 8 bytes")


@pytest.mark.parametrize(
    ("header", "field", "problem"),
    [
        (b'{"version": 3, "layers": {', "header", "is not JSON"),
        (b'{"version": 3, "la\xffyers": {}}', "header", "is not UTF-8 (byte 18)"),
        (b"[1, 2]", "header", "is a JSON array, not an object"),
        (b'{"version": 3}', "header's `layers`", "is a JSON null"),
        (b'{"version": 3, "layers": [1]}', "header's `layers`", "is a JSON array"),
        (
            b'{"version": 3, "layers": {".layers[0].weight": 5}}',
            "settings of layer `.layers[0].weight`",
            "are a JSON number",
        ),
        (
            b'{"version": 3, "layers": {".layers[0].weight": {"shape": [5, 4]}}}',
            "settings of layer `.layers[0].weight`",
            "lack 'dtype'",
        ),
    ],
)
def test_header_that_is_no_header(model, saved, header, field, problem):
    data, length, path = saved
    path.write_bytes(_header_swapped(data, length, header))
    _refused(path, model, field, problem)


def test_settings_of_another_type(model, saved):
    data, length, path = saved
    header = json.loads(data[len(MAGIC) + 8 : len(MAGIC) + 8 + length])
    for key, value in (("shape", 5), ("scaling", "1.0")):
        bad = json.loads(json.dumps(header))
        bad["layers"][".layers[1].weight"][key] = value
        path.write_bytes(_header_swapped(data, length, json.dumps(bad).encode()))
        _refused(path, model, "layer `.layers[1].weight`", f"`{key}`", repr(value))


def _npy_headers(data):
    """(start, end) of each array's NumPy header in `data`."""
    starts, at = [], data.find(b"\x93NUMPY")
    while at >= 0:
        starts.append((at, data.index(b"\n", at) + 1))
        at = data.find(b"\x93NUMPY", at + 1)
    return starts


def _with_npy_header(data, index, change):
    """`data` with the NumPy header of array `index` changed by `change` (on its
    text), padded to its length."""
    start, end = _npy_headers(data)[index]
    text = data[start + 10 : end - 1].decode("latin1")
    new = change(text.rstrip()).ljust(end - 1 - start - 10).encode("latin1")
    assert len(new) == end - 1 - start - 10
    return data[: start + 10] + new + data[end - 1 :]


def test_changed_shape_names_that_leaf(model, saved):
    data, _, path = saved
    # Array 0 is `a` of `.layers[0].weight`, shape (5, 2): fewer rows reads
    # fewer bytes, and the next array would start inside this one's data.
    path.write_bytes(_with_npy_header(data, 0, lambda t: t.replace("(5, 2)", "(4, 2)")))
    _refused(path, model, "`a` of layer `.layers[0].weight`", "(4, 2)", "(5, 2)")
    # A shape whose data would be far larger than the file.
    path.write_bytes(
        _with_npy_header(data, 0, lambda t: t.replace("(5, 2)", "(500000, 20000)"))
    )
    _refused(
        path, model, "`a` of layer `.layers[0].weight`", "40000000000 bytes", "left"
    )
    path.write_bytes(_with_npy_header(data, 1, lambda t: t.replace("{", "(")))
    _refused(path, model, "`b` of layer `.layers[0].weight`", "np.save")


class _Boom:
    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path("never-run"),))


def test_objects_are_never_unpickled(model, saved, tmp_path, monkeypatch):
    data, _, path = saved
    monkeypatch.chdir(tmp_path)
    start, end = _npy_headers(data)[0]
    header = data[start:end].replace(b"'<f4'", b"'|O' ")
    assert b"'|O' " in header
    pickled = pickle.dumps(np.array([_Boom()] * 10, dtype=object).reshape(5, 2))
    path.write_bytes(data[:start] + header + pickled)
    _refused(path, model, "`a` of layer `.layers[0].weight`", "object")
    assert not (tmp_path / "never-run").exists()


def test_legacy_file_cut_short(model, tmp_path):
    path = tmp_path / "legacy.eqx"
    eqx.tree_serialise_leaves(path, eqx.filter(model, quax_lora.adapter_filter(model)))
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.warns(quax_lora.LegacyAdapterWarning):
        _refused(path, model, "`b` of layer `.layers[1].weight`")


# peft's directory ---------------------------------------------------------------


@pytest.fixture
def peft_dir(model, tmp_path):
    directory = tmp_path / "peft"
    quax_lora.save_adapter(directory, model, format="peft")
    return directory


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("[1, 2]", "text", "is a JSON array, not an object"),
        ('{"r": 2,', "text", "is not JSON"),
        (b'{"r": \xff}', "text", "is not UTF-8"),
        ({"r": "two"}, "`r`", '"two", a JSON string, where peft writes a positive'),
        ({"r": 0}, "`r`", "a positive integer"),
        ({"lora_alpha": None}, "`lora_alpha`", "null"),
        ({"use_dora": "false"}, "`use_dora`", "true or false"),
        ({"rank_pattern": [1]}, "`rank_pattern`", "an object of positive integers"),
        ({"target_modules": [1]}, "`target_modules`", "a string or strings"),
        ({"layers_to_transform": "0"}, "`layers_to_transform`", "an integer"),
        ({"modules_to_save": "head"}, "`modules_to_save`", "an array of strings"),
    ],
)
def test_peft_config_that_is_no_config(model, peft_dir, text, field, problem):
    config_path = peft_dir / "adapter_config.json"
    if isinstance(text, dict):
        text = json.dumps({**json.loads(config_path.read_text()), **text})
    if isinstance(text, str):
        text = text.encode()
    config_path.write_bytes(text)
    _refused_peft(peft_dir, model, config_path, field, problem)


def test_peft_config_without_r(model, peft_dir):
    config_path = peft_dir / "adapter_config.json"
    config = json.loads(config_path.read_text())
    del config["r"]
    config_path.write_text(json.dumps(config))
    _refused_peft(peft_dir, model, config_path, "`r`", "is missing")


def _refused_peft(directory, model, file, *fields):
    with pytest.raises(quax_lora.CorruptAdapterError) as info:
        quax_lora.load_adapter(directory, model)
    message = str(info.value)
    assert "is corrupt" in message and f"`{file}`" in message, message
    for field in fields:
        assert field in message, message


@pytest.mark.parametrize("length", [2**62, 2**31])
def test_safetensors_header_length_beyond_the_file(model, peft_dir, length):
    weights = peft_dir / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(length.to_bytes(8, "little") + data[8:])
    _refused_peft(peft_dir, model, weights, "header length", f"says {length} bytes")


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        (lambda d: d[:8] + b"[" + d[9:], "header", "is not JSON"),
        (lambda d: d[:8] + b"\xff" + d[9:], "header", "is not UTF-8"),
        (
            lambda d: d[:-10],
            "tensor `base_model.model.layers.1.lora_B.weight`",
            "lies at",
        ),
        (lambda d: d[:5], "header length", "5 of 8 bytes"),
    ],
)
def test_safetensors_file_that_is_no_file(model, peft_dir, change, field, problem):
    weights = peft_dir / "adapter_model.safetensors"
    weights.write_bytes(change(weights.read_bytes()))
    _refused_peft(peft_dir, model, weights, field, problem)


def test_safetensors_shape_changed(model, peft_dir):
    """A shape that no longer fits its bytes: safetensors refuses it, and the
    error names the file."""
    weights = peft_dir / "adapter_model.safetensors"
    data = weights.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + length].replace(b'"shape":[2,4]', b'"shape":[3,4]', 1)
    assert header != data[8 : 8 + length]
    weights.write_bytes(data[:8] + header + data[8 + length :])
    _refused_peft(peft_dir, model, weights, "safetensors")


def test_intact_files_still_load(model, saved, peft_dir):
    *_, path = saved
    for loaded in (
        quax_lora.load_adapter(path, model),
        quax_lora.load_adapter(peft_dir, model),
    ):
        np.testing.assert_array_equal(
            loaded.layers[1].weight.b, model.layers[1].weight.b
        )
