"""Saving and loading quantised models: `save_quantised` and `load_quantised`.

`eqx.tree_serialise_leaves` alone writes the integers and the scales but not how to
read them: the bit width, the packing and the block layout are static fields of a
`QuantisedArray`, taken on loading from the model loaded into. An int8 file loaded
into an int4 model reads each byte as two integers, and a symmetric file loaded
into a model with zero points reads the next array's scales as zero points; both
silently. So a file written here starts with a header that records, for every
`QuantisedArray`, what reproduces its outputs (its format, bits, block layout,
scheme, dtypes, packing and product path), and the shape and dtype of every other
array; loading checks the model loaded into against it before reading a byte of
the leaves.

`from_gptq` reads a layer of a GPTQ or AWQ int4 checkpoint (its `qweight`,
`qzeros`, `scales`, `g_idx`) into a `QuantisedArray`, repacking the integers
without dequantising; `to_gptq` writes one back, bit for bit.
"""

import ast
import io
import json
import math
import struct
from collections.abc import Sequence
from typing import Any, BinaryIO

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, PyTree

from ._kernels import pack_nibbles, unpack_int4
from ._value import QuantisedArray, dtype_of


__all__ = [
    "AWQ_ORDER",
    "GPTQ_FORMATS",
    "describe",
    "from_gptq",
    "gptq_array",
    "load_quantised",
    "save_quantised",
    "to_gptq",
]

_MAGIC = b"quax_quant checkpoint\n"
_VERSION = 1
# The header's length, before it: an unsigned 64-bit little-endian integer.
_LENGTH = struct.Struct("<Q")
# What `np.save` writes first, before the format's version (two bytes).
_NPY_MAGIC = b"\x93NUMPY"


def _layout(shape: Sequence[int], group_sizes: Sequence[int]) -> dict[str, Any]:
    """`quantise`'s arguments for a block layout, where they describe it: the axes
    with one scale per index (`axis`), or one axis in groups (`group_size`,
    `group_axis`); per tensor is `axis=None` and no groups."""
    per_index = [
        a for a, (d, g) in enumerate(zip(shape, group_sizes, strict=True)) if g == 1 < d
    ]
    grouped = [
        a for a, (d, g) in enumerate(zip(shape, group_sizes, strict=True)) if 1 < g < d
    ]
    if len(grouped) == 1:
        (axis,) = grouped
        return {"axis": None, "group_size": group_sizes[axis], "group_axis": axis}
    return {"axis": per_index or None, "group_size": None, "group_axis": None}


def describe(x: QuantisedArray) -> dict[str, Any]:
    """What reproduces the outputs of `x`, as a checkpoint records it.

    **Arguments:**

    - `x`: a [`quax_quant.QuantisedArray`][].

    **Returns:**

    A JSON-serialisable dict: `format` (`"int"`: integers times scales;
    `"nf4"`: NF4 code indices; `"float8_e4m3fn"` / `"float8_e5m2"`), `bits`,
    `shape`, `group_sizes` (along each axis, how many consecutive indices share a
    scale), `axis`, `group_size` and `group_axis` (the same layout in
    `quantise`'s arguments, where it is one), `scheme` (`"symmetric"`, or
    `"asymmetric"` with zero points), `float_dtype`, `storage_dtype` (of the
    stored integers), `packed_axis` (for `bits=4`), `matmul` (the product path)
    `straight_through` (whether it holds a float `master`), `double_quant`
    (whether the scales are a [`quax_quant.QuantisedScale`][], and its block
    size), `calibrated` (whether it holds a static activation scale from
    [`quax_quant.calibrate`][]) and `act_order` (whether it holds its last axis
    permuted, an `input_order`, as an act-order GPTQ layer does).
    """
    scale = x.scale
    double = getattr(scale, "block_size", None)
    return {
        "format": x.format,
        "bits": x.bits,
        "shape": list(x.shape),
        "group_sizes": list(x.group_sizes),
        **_layout(x.shape, x.group_sizes),
        "scheme": "symmetric" if x.zero_point is None else "asymmetric",
        "float_dtype": np.dtype(x.float_dtype).name,
        "storage_dtype": dtype_of(x.values).name,
        "packed_axis": x.packed_axis,
        "matmul": x.matmul,
        "straight_through": x.master is not None,
        "double_quant": double,
        "calibrated": x.act_scale is not None,
        "act_order": x.input_order is not None,
    }


def _header(model: PyTree) -> dict[str, Any]:
    quantised: dict[str, Any] = {}
    arrays: dict[str, Any] = {}
    leaves = jtu.tree_flatten_with_path(
        model, is_leaf=lambda x: isinstance(x, QuantisedArray)
    )[0]
    for path, leaf in leaves:
        if isinstance(leaf, QuantisedArray):
            quantised[jtu.keystr(path)] = describe(leaf)
        elif eqx.is_array(leaf):
            arrays[jtu.keystr(path)] = {
                "shape": list(np.shape(leaf)),
                "dtype": dtype_of(leaf).name,
            }
    return {
        "format": "quax_quant",
        "version": _VERSION,
        "quantised": quantised,
        "arrays": arrays,
    }


def save_quantised(path_or_file: str | BinaryIO, model: PyTree) -> None:
    """Save `model` (holding [`quax_quant.QuantisedArray`][]s) with what reproduces
    its outputs: a header recording each quantised array's format, bits, block
    layout (group size and axis), scheme, dtypes, packing and product path (see
    [`quax_quant.describe`][]) and every other array's shape and dtype, then every
    leaf, as `eqx.tree_serialise_leaves` writes them.

    ```python
    quax_quant.save_quantised("model.qq", quax_quant.quantise_model(model, bits=4))
    like = quax_quant.quantise_model(model, bits=4)  # the same arguments
    loaded = quax_quant.load_quantised("model.qq", like)
    ```

    **Arguments:**

    - `path_or_file`: a file name or a binary file object.
    - `model`: any PyTree.

    **Returns:**

    Nothing.
    """
    header = json.dumps(_header(model), sort_keys=True).encode()
    if isinstance(path_or_file, str):
        with open(path_or_file, "wb") as f:
            _write(f, header, model)
    else:
        _write(path_or_file, header, model)


def _write(f: BinaryIO, header: bytes, model: PyTree) -> None:
    f.write(_MAGIC)
    f.write(_LENGTH.pack(len(header)))
    f.write(header)
    eqx.tree_serialise_leaves(f, model)


def load_quantised(path_or_file: str | BinaryIO, like: PyTree) -> PyTree:
    """Load a model saved by [`quax_quant.save_quantised`][] into `like`, a model
    of the same structure quantised the same way (build it with the same
    `quantise_model` arguments; its leaves' values do not matter).

    **Arguments:**

    - `path_or_file`: a file name or a binary file object.
    - `like`: the model to load into; its static parts (layer types, activation
        functions, the quantised arrays' bits and layouts) are kept.

    **Returns:**

    A copy of `like` with the saved leaves.

    **Raises:**

    `ValueError` when the file is not a quax_quant checkpoint, or when `like`
    differs from the saved model: a quantised array missing on either side, or
    one with another format, bits, block layout, scheme, dtype, packing or
    product path, or another array of a different shape or dtype. The message
    names the array by its path and the field, with the saved value; nothing is
    loaded. Also a `ValueError` saying the checkpoint is corrupt, naming the file
    and the field, when the file is not as `save_quantised` wrote it (cut
    short, or changed since): a header length beyond the file, a header that is
    not a JSON object of the recorded fields, a leaf whose stored shape or dtype
    is not the one its header records (checked before its data is read, so the
    error names that leaf, not the next one), or whose data the file does not
    hold. Every length is checked against the file's size before it is read,
    and nothing in the file is unpickled or run.
    """
    if isinstance(path_or_file, str):
        with open(path_or_file, "rb") as f:
            return _read(f, like)
    return _read(path_or_file, like)


def _read(f: BinaryIO, like: PyTree) -> PyTree:
    name = getattr(f, "name", None)
    file = f"`{name}`" if isinstance(name, str) else "(a file object)"
    if not f.seekable():
        # A stream: lengths are checked against the file's size, read first.
        f = io.BytesIO(f.read())
    if f.read(len(_MAGIC)) != _MAGIC:
        raise ValueError(
            "load_quantised: the file is not a quax_quant checkpoint (written by "
            "quax_quant.save_quantised); for a file written by "
            "eqx.tree_serialise_leaves use eqx.tree_deserialise_leaves."
        )
    raw = f.read(_LENGTH.size)
    if len(raw) < _LENGTH.size:
        raise _corrupt(file, "header length", f"is cut short ({len(raw)} of 8 bytes)")
    (length,) = _LENGTH.unpack(raw)
    if length > _left(f):
        raise _corrupt(
            file, "header length", f"says {length} bytes, and {_left(f)} follow it"
        )
    try:
        saved = json.loads(f.read(length).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _corrupt(file, "header", f"is not JSON text ({e})") from e
    if not isinstance(saved, dict):
        raise _corrupt(file, "header", f"is {type(saved).__name__}, not an object")
    if saved.get("version") != _VERSION:
        raise ValueError(
            f"load_quantised: the checkpoint has version {saved.get('version')}; "
            f"this quax_quant reads version {_VERSION}."
        )
    for kind in ("quantised", "arrays"):
        entries = saved.get(kind)
        if not isinstance(entries, dict) or not all(
            isinstance(entry, dict) for entry in entries.values()
        ):
            raise _corrupt(
                file, f"header's `{kind}`", "is not an object of one object per path"
            )
    _check(saved, _header(like))
    leaves, treedef = jtu.tree_flatten_with_path(like)
    return jtu.tree_unflatten(
        treedef, [_read_leaf(f, file, jtu.keystr(path), x) for path, x in leaves]
    )


def _left(f: BinaryIO) -> int:
    """How many bytes of the seekable `f` follow its position."""
    position = f.tell()
    end = f.seek(0, io.SEEK_END)
    f.seek(position)
    return end - position


def _corrupt(file: str, field: str, problem: str) -> ValueError:
    return ValueError(
        f"load_quantised: the checkpoint {file} is corrupt: its {field} {problem}. "
        "It is not as quax_quant.save_quantised wrote it (cut short, or changed "
        "since): save the model again, or load an intact copy."
    )


def _read_leaf(f: BinaryIO, file: str, path: str, x: Any) -> Any:
    """The leaf at `path` of the model, read from `f` as
    `eqx.tree_serialise_leaves` wrote it (`np.save` for an array or a number),
    in place of `like`'s `x`. The stored array's header must describe `x`'s
    shape and dtype (the header's check made them the saved model's) before its
    data is read, and its data must lie in the file; the header is read as a
    Python literal (`ast.literal_eval`, as NumPy reads it), so nothing is run,
    and no dtype but `x`'s is read, so nothing is unpickled."""
    if isinstance(x, jax.Array | np.ndarray):
        shape, dtype = tuple(x.shape), np.dtype(x.dtype)
    elif eqx.is_array_like(x):  # a number; `np.save` wrote it as an array of ()
        shape, dtype = (), np.asarray(x).dtype
    else:
        return x
    field = f"leaf {path}"
    # What `np.save` writes for `dtype`, compared as text: the dtypes NumPy does
    # not know are written as it can (bfloat16 as `<V2`, float8_e5m2 as `<f1`),
    # not always as it can read back.
    descr = np.lib.format.dtype_to_descr(dtype)
    start = f.read(len(_NPY_MAGIC) + 2)
    if len(start) < len(_NPY_MAGIC) + 2 or not start.startswith(_NPY_MAGIC):
        raise _corrupt(file, field, "does not start as np.save starts an array")
    major = start[len(_NPY_MAGIC)]
    if major not in (1, 2):
        raise _corrupt(file, field, f"is in NumPy's format version {major}, not 1 or 2")
    length_field = f.read(2 if major == 1 else 4)
    length = int.from_bytes(length_field, "little")
    if len(length_field) < (2 if major == 1 else 4) or length > _left(f):
        raise _corrupt(file, field, "has a header longer than what is left of the file")
    try:
        stored = ast.literal_eval(f.read(length).decode("latin1"))
    except Exception as e:  # whatever the parser of a literal raises
        raise _corrupt(file, field, f"has a header that is no literal ({e!r})") from e
    if not isinstance(stored, dict) or stored.get("fortran_order") not in (True, False):
        raise _corrupt(file, field, f"has a header {stored!r}, not np.save's")
    if stored.get("descr") != descr or stored.get("shape") != shape:
        raise _corrupt(
            file,
            field,
            f"is stored as {stored.get('descr')!r} of shape {stored.get('shape')}, "
            f"where the header records {dtype} (stored as {descr!r}) of shape "
            f"{shape}",
        )
    size = math.prod(shape) * dtype.itemsize
    if size > _left(f):
        raise _corrupt(
            file, field, f"needs {size} bytes, and {_left(f)} are left in the file"
        )
    value = np.frombuffer(f.read(size), dtype=dtype)
    value = value.reshape(shape, order="F" if stored["fortran_order"] else "C")
    if isinstance(x, jax.Array):
        return jnp.asarray(value)
    if isinstance(x, np.ndarray):
        return value.copy()
    return type(x)(value.item())


def _check(saved: dict[str, Any], have: dict[str, Any]) -> None:
    """Raise naming the first difference between the saved header and `like`'s."""
    for kind, what in (("quantised", "QuantisedArray"), ("arrays", "array")):
        for path in sorted(set(saved[kind]) | set(have[kind])):
            if path not in have[kind]:
                raise ValueError(
                    f"load_quantised: the checkpoint holds a {what} at {path}, "
                    f"`like` has none there ({saved[kind][path]}): build `like` as "
                    "the saved model was built (the same layers, quantised with "
                    "the same quantise_model arguments)."
                )
            if path not in saved[kind]:
                raise ValueError(
                    f"load_quantised: `like` holds a {what} at {path} "
                    f"({have[kind][path]}), the checkpoint has none there: build "
                    "`like` as the saved model was built (the same layers, "
                    "quantised with the same quantise_model arguments)."
                )
            for field, value in saved[kind][path].items():
                if have[kind][path].get(field) != value:
                    raise ValueError(
                        f"load_quantised: the {what} at {path} was saved with "
                        f"{field}={value!r}, but `like` has "
                        f"{field}={have[kind][path].get(field)!r}: loading would "
                        "read the saved leaves in another layout. Build `like` "
                        "with the arguments that made the saved model (saved: "
                        f"{saved[kind][path]})."
                    )


# GPTQ / AWQ int4 checkpoints ----------------------------------------------------------

GPTQ_FORMATS = ("gptq", "gptq_v2", "awq")

# AutoAWQ's GEMM layout stores the eight 4-bit values of output columns
# `8 j .. 8 j + 7` in the nibbles of `qweight[:, j]` in this order: nibble `k`
# (bits `4 k` to `4 k + 3`) holds column `8 j + AWQ_ORDER[k]`.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _nibbles(packed: Array, axis: int, order: Sequence[int]) -> Array:
    """The eight unsigned 4-bit values of each `int32` of `packed`, unpacked along
    `axis` (which grows eightfold): value `8 i + order[k]` is nibble `k` of entry
    `i`. Integer shifts only, as `uint32`; the result is `int8` in `[0, 15]`."""
    bits = lax.bitcast_convert_type(packed, jnp.uint32)
    shifts = jnp.arange(0, 32, 4, dtype=jnp.uint32)
    nibbles = (bits[..., None] >> shifts) & jnp.uint32(0xF)  # (..., 8): nibble k
    # Put nibble k at position order[k] within each group of eight.
    nibbles = nibbles[..., np.argsort(np.asarray(order))]
    nibbles = jnp.moveaxis(nibbles, -1, axis + 1 if axis >= 0 else axis)
    shape = list(packed.shape)
    shape[axis] *= 8
    return nibbles.reshape(shape).astype(jnp.int8)


def _check_gptq(
    qweight: Any, qzeros: Any, scales: Any, g_idx: Any, format: str
) -> tuple[int, int, int, np.ndarray | None]:
    """`(in_features, out_features, group_size, order)` of a GPTQ/AWQ layer, or a
    `ValueError` naming the field that does not fit the layout. `order` is `None`
    when the groups are contiguous (`g_idx[i] = i // group_size`); for an
    act-order layer, the input features sorted by group (stably), in which
    order they are."""
    if format not in GPTQ_FORMATS:
        raise ValueError(
            f"from_gptq: format must be one of {GPTQ_FORMATS}, got {format!r}."
        )
    for field, leaf in (("qweight", qweight), ("qzeros", qzeros)):
        if dtype_of(leaf) != np.int32 or np.ndim(leaf) != 2:
            raise ValueError(
                f"from_gptq: {field} must be a 2-D int32 array (eight 4-bit values "
                f"per entry), got {dtype_of(leaf)} of shape {np.shape(leaf)}."
            )
    if not jnp.issubdtype(dtype_of(scales), jnp.floating) or np.ndim(scales) != 2:
        raise ValueError(
            "from_gptq: scales must be a 2-D float array (groups, out_features), got "
            f"{dtype_of(scales)} of shape {np.shape(scales)}."
        )
    groups, out_features = np.shape(scales)
    rows, cols = np.shape(qweight)
    awq = format == "awq"
    in_features = rows if awq else 8 * rows
    if (8 * cols if awq else cols) != out_features:
        layout = "(in_features, out_features / 8)" if awq else "(in / 8, out)"
        raise ValueError(
            f"from_gptq: qweight has shape {np.shape(qweight)}, which for format "
            f"{format!r} is {layout}, but scales have {out_features} output columns."
        )
    if np.shape(qzeros) != (groups, out_features // 8):
        raise ValueError(
            f"from_gptq: qzeros must have shape ({groups}, {out_features // 8}) "
            "(groups, out_features / 8: eight zero points per int32), got "
            f"{np.shape(qzeros)}."
        )
    if groups < 1 or in_features % groups:
        raise ValueError(
            f"from_gptq: scales have {groups} groups, which does not divide the "
            f"{in_features} input features."
        )
    group_size = in_features // groups
    if g_idx is not None:
        if np.shape(g_idx) != (in_features,) or not jnp.issubdtype(
            dtype_of(g_idx), jnp.integer
        ):
            raise ValueError(
                f"from_gptq: g_idx must be an integer array of shape ({in_features},) "
                f"(the group of each input feature), got {dtype_of(g_idx)} of shape "
                f"{np.shape(g_idx)}."
            )
        g_idx = np.asarray(g_idx)
        if not np.array_equal(g_idx, np.arange(in_features) // group_size):
            # Act-order (`desc_act=True`): each group must still hold group_size
            # features, contiguous once the features are sorted by group.
            counts = np.bincount(np.clip(g_idx, 0, groups - 1), minlength=groups)
            if g_idx.min() < 0 or g_idx.max() >= groups or np.any(counts != group_size):
                raise ValueError(
                    f"from_gptq: g_idx must give each input feature one of the "
                    f"{groups} groups of scales, each group holding {group_size} "
                    f"features (as GPTQ writes it, with or without act-order); got "
                    f"groups in [{g_idx.min()}, {g_idx.max()}] with "
                    f"{sorted(set(counts.tolist()))} features each. The layer is "
                    "not in GPTQ's layout: dequantise it yourself."
                )
            return (
                in_features,
                out_features,
                group_size,
                np.argsort(g_idx, kind="stable").astype(np.int32),
            )
    return in_features, out_features, group_size, None


def from_gptq(
    qweight: ArrayLike,
    qzeros: ArrayLike,
    scales: ArrayLike,
    g_idx: ArrayLike | None = None,
    *,
    format: str = "gptq",
    float_dtype: Any = None,
    allow_materialise: bool = False,
    matmul: str = "auto",
) -> QuantisedArray:
    """A GPTQ- or AWQ-packed int4 linear layer as a [`quax_quant.QuantisedArray`][],
    without dequantising: the 4-bit integers are repacked (integer shifts only)
    and the scales and zero points kept per group.

    ```python
    tensors = safetensors.numpy.load_file("model.safetensors")
    p = "model.layers.0.self_attn.q_proj"
    w = quax_quant.from_gptq(
        tensors[f"{p}.qweight"], tensors[f"{p}.qzeros"], tensors[f"{p}.scales"],
        tensors[f"{p}.g_idx"],
    )
    linear = eqx.tree_at(lambda l: l.weight, linear, w)  # (out, in), as eqx's
    ```

    The layouts (4 bits, `in_features = I`, `out_features = O`, `G` groups):

    - `"gptq"` (AutoGPTQ): `qweight` int32 `(I / 8, O)`, input features `8 i`
        to `8 i + 7` in the nibbles of row `i` (lowest bits first); `qzeros`
        int32 `(G, O / 8)`, packed the same way along the output axis, storing
        each zero point minus one; `scales` `(G, O)`; `g_idx` int32 `(I,)`, the
        group of each input feature. `W[i, o] = s[g, o] * (q[i, o] - (z[g, o]
        + 1))` with `g = g_idx[i]`.
    - `"gptq_v2"` (GPTQModel's format): as `"gptq"`, zero points stored as they
        are (no `+ 1`).
    - `"awq"` (AutoAWQ's GEMM): `qweight` int32 `(I, O / 8)`, packed along the
        output axis in the order `AWQ_ORDER` (nibble `k` of column `j` is output
        `8 j + AWQ_ORDER[k]`); `qzeros` likewise; `scales` `(G, O)`; no `g_idx`.
        `W[i, o] = s[g, o] * (q[i, o] - z[g, o])`.

    **Arguments:**

    - `qweight`, `qzeros`, `scales`, `g_idx`: the layer's tensors.
    - `format`: `"gptq"`, `"gptq_v2"` or `"awq"`.
    - `float_dtype`: the dtype of the dequantised array; by default the scales'.
    - `allow_materialise`, `matmul`: as for [`quax_quant.quantise`][].

    **Returns:**

    An asymmetric int4 `QuantisedArray` of shape `(O, I)` (the transpose of `W`:
    `eqx.nn.Linear`'s weight layout), one scale and zero point per output feature
    and group of `I / G` input features.

    An act-order checkpoint (`desc_act=True`: `g_idx` is not `i // (I / G)`,
    its groups are not contiguous along the inputs) is read too: the input
    features are stored sorted by group (stably), which makes each group's
    contiguous, and the permutation is kept as the array's `input_order`. A
    product contracting the inputs (`weight @ x`, `eqx.nn.Linear`) gathers `x`'s
    features in that order (`I` indices, a gather of the activations, never of
    the weight); operations that would move that axis (`weight.T`, reshapes,
    slices) refuse, naming it.

    **Raises:**

    `ValueError` naming the field for a dtype or shape that does not fit the
    layout, and for a `g_idx` whose groups do not each hold `I / G` features.
    """
    _, _, _, features = _check_gptq(qweight, qzeros, scales, g_idx, format)
    qweight, qzeros = jnp.asarray(qweight), jnp.asarray(qzeros)
    scales = jnp.asarray(scales)
    dtype = np.dtype(float_dtype or scales.dtype)
    awq = format == "awq"
    order = AWQ_ORDER if awq else tuple(range(8))
    # Unsigned integers (I, O) and zero points (G, O), in [0, 15].
    q = _nibbles(qweight, 1 if awq else 0, order)
    z = _nibbles(qzeros, 1, order).astype(jnp.int32)
    if format == "gptq":
        z = z + 1
    return gptq_array(
        q,
        z,
        scales.astype(dtype),
        features,
        allow_materialise=allow_materialise,
        matmul=matmul,
    )


def gptq_array(
    q: Array,
    z: Array,
    scales: Array,
    features: Any,
    *,
    allow_materialise: bool = False,
    matmul: str = "auto",
) -> QuantisedArray:
    """The `QuantisedArray` of a layer in GPTQ's terms: unsigned integers `q`
    `(I, O)` in `[0, 15]` (input features in their own order), zero points `z`
    `(G, O)` and `scales` `(G, O)` (their dtype the array's), and for act-order
    `features`, the input features sorted by group (else `None`). What
    `from_gptq` reads and `quax_quant.gptq` computes."""
    in_features = q.shape[0]
    if features is not None:
        # Act-order: the features sorted by group, so that each group's are
        # contiguous; the array keeps the order and gathers activations by it.
        q = q[features]
    # Signed 4-bit integers `q - 8` (the difference `q - z` unchanged), laid out
    # (O, I) and packed two per byte along I.
    values = pack_nibbles(jnp.transpose(q.astype(jnp.int8) - jnp.int8(8)))
    return QuantisedArray(
        values,
        jnp.transpose(scales),
        jnp.transpose(z - 8).astype(scales.dtype),
        None,
        bits=4,
        float_dtype=scales.dtype,
        odd=in_features % 2 == 1,
        allow_materialise=allow_materialise,
        matmul=matmul,
        input_order=None if features is None else jnp.asarray(features, jnp.int32),
    )


def _pack_eight(values: np.ndarray, axis: int, order: Sequence[int]) -> np.ndarray:
    """The inverse of `_nibbles`: eight unsigned 4-bit values per `int32` along
    `axis` (which shrinks eightfold), value `8 i + order[k]` in nibble `k` of
    entry `i`."""
    eights = np.moveaxis(np.asarray(values, np.uint32), axis, -1)
    eights = eights.reshape(*eights.shape[:-1], -1, 8)[..., list(order)]
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    packed = np.bitwise_or.reduce(eights << shifts, axis=-1)
    return np.moveaxis(packed.view(np.int32), -1, axis)


def to_gptq(weight: QuantisedArray, *, format: str = "gptq") -> dict[str, np.ndarray]:
    """A `QuantisedArray` int4 layer in GPTQ's or AWQ's packed layout: the inverse
    of [`quax_quant.from_gptq`][], bit for bit both ways.

    ```python
    tensors = quax_quant.to_gptq(qmodel.layers[0].weight, format="gptq_v2")
    again = quax_quant.from_gptq(**tensors, format="gptq_v2")  # the same leaves
    ```

    **Arguments:**

    - `weight`: an int4 `QuantisedArray` of format `"int"` and shape `(O, I)`
        (`eqx.nn.Linear`'s layout, as `from_gptq` and [`quax_quant.gptq`][]
        give), with one scale per output feature and group of inputs (or one
        per output feature). A symmetric array exports with every zero point 8.
    - `format`: `"gptq"` (AutoGPTQ, zero points stored minus one), `"gptq_v2"`
        (GPTQModel, zero points as they are) or `"awq"` (AutoAWQ's GEMM layout;
        no act-order).

    **Returns:**

    A dict of NumPy arrays: `qweight` and `qzeros` (`int32`), `scales` `(G, O)`
    (the array's scale dtype), and for the GPTQ formats `g_idx` (`int32`, the
    group of each input feature), as the layouts in `from_gptq` describe.
    Cast `scales` to `float16` yourself where a loader wants it (that rounds).

    **Raises:**

    `ValueError` naming what does not fit the layout: another format or bit
    width, a double-quantised scale, a layout other than groups along the
    inputs, `O` (or `I` for the GPTQ formats) not a multiple of 8, a zero point
    that is not an integer the format can store (AutoGPTQ's `"gptq"` stores
    `z - 1` in four bits, so `z` must lie in `[1, 16]`: a zero point of 0 needs
    `"gptq_v2"`), an act-order array asked for `"awq"`.
    """
    if format not in GPTQ_FORMATS:
        raise ValueError(
            f"to_gptq: format must be one of {GPTQ_FORMATS}, got {format!r}."
        )
    if (
        not isinstance(weight, QuantisedArray)
        or weight.format != "int"
        or weight.bits != 4
    ):
        raise ValueError(
            "to_gptq: weight must be an int4 QuantisedArray of format 'int', got "
            f"{type(weight).__name__}"
            + (
                f" (format {weight.format!r}, bits={weight.bits})"
                if isinstance(weight, QuantisedArray)
                else ""
            )
            + "."
        )
    if weight.ndim != 2 or weight.packed_axis != -1:
        raise ValueError(
            "to_gptq: weight must be 2-D (out_features, in_features), packed along "
            f"its inputs; got shape {weight.shape}, packed_axis {weight.packed_axis}."
        )
    if not isinstance(weight.scale, jax.Array | np.ndarray):
        raise ValueError(
            "to_gptq: the weight's scale is double-quantised (a QuantisedScale), "
            "which GPTQ's layout has no place for; quantise without double_quant."
        )
    out_features, in_features = weight.shape
    scale_rows, groups = np.shape(weight.scale)
    if scale_rows not in (1, out_features) or in_features % groups:
        raise ValueError(
            f"to_gptq: GPTQ stores one scale per output feature and group of inputs; "
            f"the weight's scale has shape {np.shape(weight.scale)} for shape "
            f"{weight.shape}."
        )
    awq = format == "awq"
    if out_features % 8 or (not awq and in_features % 8):
        raise ValueError(
            f"to_gptq: format {format!r} packs eight 4-bit values per int32 along "
            f"the outputs{'' if awq else ' and the inputs'}; shape {weight.shape} "
            "does not divide."
        )
    if awq and weight.input_order is not None:
        raise ValueError(
            "to_gptq: an act-order weight (`input_order`) has no AWQ layout (AWQ "
            "has no g_idx); export it as 'gptq' or 'gptq_v2'."
        )
    scales = np.broadcast_to(np.asarray(weight.scale), (out_features, groups)).T
    if weight.zero_point is None:
        zeros = np.full((groups, out_features), 8, np.int64)
    else:
        z = np.broadcast_to(np.asarray(weight.zero_point), (out_features, groups)).T
        zeros = z.astype(np.int64) + 8
        low, high = (1, 16) if format == "gptq" else (0, 15)
        if not np.array_equal(zeros - 8, z) or zeros.min() < low or zeros.max() > high:
            raise ValueError(
                f"to_gptq: format {format!r} stores zero points that are integers in "
                f"[{low}, {high}]; the weight's are in [{z.min() + 8}, {z.max() + 8}]"
                + (
                    " (AutoGPTQ's 'gptq' stores z - 1: a zero point of 0 needs "
                    "'gptq_v2')."
                    if format == "gptq"
                    else "."
                )
            )
    # Unsigned integers (I, O) in the features' own order.
    stored = np.asarray(unpack_int4(weight.values, in_features)).astype(np.int64) + 8
    q = np.empty_like(stored.T)
    group_size = in_features // groups
    g_idx = np.arange(in_features) // group_size
    if weight.input_order is None:
        q[...] = stored.T
    else:
        order = np.asarray(weight.input_order)
        q[order] = stored.T
        g_idx[order] = np.arange(in_features) // group_size
    order8 = AWQ_ORDER if awq else tuple(range(8))
    tensors = {
        "qweight": _pack_eight(q, 1 if awq else 0, order8),
        "qzeros": _pack_eight(zeros - 1 if format == "gptq" else zeros, 1, order8),
        "scales": np.ascontiguousarray(scales),
    }
    if not awq:
        tensors["g_idx"] = g_idx.astype(np.int32)
    return tensors
