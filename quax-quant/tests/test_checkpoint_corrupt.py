"""`load_quantised` on a checkpoint cut short or changed: a `ValueError` that
says the checkpoint is corrupt and names the file and the field (a leaf whose
stored shape was changed is named itself, not the leaf after it), with every
length checked against the file's size before it is read and nothing unpickled."""

import io
import json
import pathlib
import pickle

import equinox as eqx
import jax
import jax.random as jr
import numpy as np
import pytest
import quax_quant as qq


MAGIC = b"quax_quant checkpoint\n"


def _model(**kwargs):
    return qq.quantise_model(eqx.nn.MLP(8, 3, 16, depth=2, key=jr.key(0)), **kwargs)


@pytest.fixture
def saved(tmp_path):
    """The bytes of a saved int8 model, and where to write a changed copy."""
    path = tmp_path / "model.qq"
    qq.save_quantised(str(path), _model(bits=8))
    return path.read_bytes(), path


def _arrays(model):
    return jax.tree.leaves(eqx.filter(model, eqx.is_array))


def _refused(path, *fields):
    with pytest.raises(ValueError) as info:
        qq.load_quantised(str(path), _model(bits=8))
    message = str(info.value)
    assert "is corrupt" in message and f"`{path}`" in message, message
    for field in fields:
        assert field in message, message


def _npy_header(data, index):
    """(start, end) of the NumPy header of leaf `index` in `data`."""
    at = data.find(b"\x93NUMPY")
    for _ in range(index):
        at = data.find(b"\x93NUMPY", at + 1)
    return at, data.index(b"\n", at) + 1


def _reshaped(data, index, old, new):
    """`data` with leaf `index`'s stored shape `old` changed to `new` (text),
    its header padded to the same length."""
    start, end = _npy_header(data, index)
    text = data[start + 10 : end - 1]
    changed = text.rstrip().replace(old.encode(), new.encode()).ljust(len(text))
    assert changed != text and len(changed) == len(text)
    return data[: start + 10] + changed + data[end - 1 :]


@pytest.mark.parametrize("new", ["(15, 8)", "(17, 8)", "(16, 8000000000)"])
def test_changed_npy_shape_names_its_leaf(saved, new):
    """Leaf 0 is the int8 values of `.layers[0].weight`, shape (16, 8). Before,
    the reader took the stored shape, read too few or too many bytes, and the
    error named the next leaf, `.layers[0].weight.scale`."""
    data, path = saved
    path.write_bytes(_reshaped(data, 0, "(16, 8)", new))
    _refused(path, "leaf .layers[0].weight.values", f"shape {new}", "shape (16, 8)")


def test_changed_npy_dtype_names_its_leaf(saved):
    data, path = saved
    start, end = _npy_header(data, 0)
    path.write_bytes(
        data[:start] + data[start:end].replace(b"|i1", b"<i2") + data[end:]
    )
    _refused(path, "leaf .layers[0].weight.values", "'<i2'", "int8 (stored as '|i1')")


def test_truncated_checkpoint_names_the_leaf(saved):
    data, path = saved
    path.write_bytes(data[:-6])  # inside the last leaf's data
    _refused(path, "leaf .layers[2].bias", "needs 12 bytes, and 6 are left")
    # Cut inside the last leaf's header.
    last, _ = _npy_header(data, len(_arrays(_model(bits=8))) - 1)
    path.write_bytes(data[: last + 40])
    _refused(path, "leaf .layers[2].bias", "header longer than what is left")


@pytest.mark.parametrize("length", [2**62, 2**31])
def test_header_length_beyond_the_file(saved, length):
    data, path = saved
    rest = data[len(MAGIC) + 8 :]
    path.write_bytes(MAGIC + length.to_bytes(8, "little") + rest)
    _refused(path, "header length", f"says {length} bytes, and {len(rest)} follow")


def test_header_that_is_no_header(saved):
    data, path = saved
    length = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    rest = data[len(MAGIC) + 8 + length :]
    cases = {
        b'{"version": 1, ': ("header", "is not JSON"),
        b'{"version": 1, "\xff": 0}': ("header", "is not JSON"),
        b"[1]": ("header", "is list, not an object"),
        b'{"version": 1, "quantised": {}}': ("header's `arrays`", "not an object"),
        b'{"version": 1, "quantised": {".a": 1}, "arrays": {}}': (
            "header's `quantised`",
            "one object per path",
        ),
    }
    for header, (field, problem) in cases.items():
        path.write_bytes(MAGIC + len(header).to_bytes(8, "little") + header + rest)
        _refused(path, field, problem)


class _Boom:
    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path("never-run"),))


def test_objects_are_never_unpickled(saved, tmp_path, monkeypatch):
    data, path = saved
    monkeypatch.chdir(tmp_path)
    start, end = _npy_header(data, 0)
    header = data[start:end].replace(b"'|i1'", b"'|O' ")
    pickled = pickle.dumps(np.array([_Boom()] * 128, dtype=object).reshape(16, 8))
    path.write_bytes(data[:start] + header + pickled)
    _refused(path, "leaf .layers[0].weight.values", "object")
    assert not (tmp_path / "never-run").exists()


@pytest.mark.parametrize("format", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_checkpoints_load(format):
    """`np.save` writes float8 values with descriptions NumPy does not read
    back as those dtypes (`<V1`, `<f1`): the reader compares them as written
    and reads the recorded dtype (before, the values came back as raw bytes,
    or not at all, and loading failed)."""
    model = _model(format=format)
    f = io.BytesIO()
    qq.save_quantised(f, model)
    f.seek(0)
    loaded = qq.load_quantised(f, _model(format=format))
    for a, b in zip(_arrays(loaded), _arrays(model), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(
            np.asarray(a, np.float32), np.asarray(b, np.float32)
        )


def test_intact_checkpoint_loads(saved):
    data, path = saved
    like = _model(bits=8)
    header = json.loads(data[len(MAGIC) + 8 :].split(b"\x93NUMPY")[0])
    assert header["version"] == 1
    loaded = qq.load_quantised(str(path), like)
    for a, b in zip(_arrays(loaded), _arrays(_model(bits=8)), strict=True):
        np.testing.assert_array_equal(a, b)
