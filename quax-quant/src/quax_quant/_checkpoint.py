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
"""

import json
import struct
from collections.abc import Sequence
from typing import Any, BinaryIO

import equinox as eqx
import jax.tree_util as jtu
import numpy as np
from jaxtyping import PyTree

from ._value import QuantisedArray, dtype_of


__all__ = ["describe", "load_quantised", "save_quantised"]

_MAGIC = b"quax_quant checkpoint\n"
_VERSION = 1
# The header's length, before it: an unsigned 64-bit little-endian integer.
_LENGTH = struct.Struct("<Q")


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

    A JSON-serialisable dict: `format` (`"int"`: integers times scales), `bits`,
    `shape`, `group_sizes` (along each axis, how many consecutive indices share a
    scale), `axis`, `group_size` and `group_axis` (the same layout in
    `quantise`'s arguments, where it is one), `scheme` (`"symmetric"`, or
    `"asymmetric"` with zero points), `float_dtype`, `storage_dtype` (of the
    stored integers), `packed_axis` (for `bits=4`), `matmul` (the product path)
    and `straight_through` (whether it holds a float `master`).
    """
    return {
        "format": "int",
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
    loaded.
    """
    if isinstance(path_or_file, str):
        with open(path_or_file, "rb") as f:
            return _read(f, like)
    return _read(path_or_file, like)


def _read(f: BinaryIO, like: PyTree) -> PyTree:
    if f.read(len(_MAGIC)) != _MAGIC:
        raise ValueError(
            "load_quantised: the file is not a quax_quant checkpoint (written by "
            "quax_quant.save_quantised); for a file written by "
            "eqx.tree_serialise_leaves use eqx.tree_deserialise_leaves."
        )
    (length,) = _LENGTH.unpack(f.read(_LENGTH.size))
    saved = json.loads(f.read(length).decode())
    if saved.get("version") != _VERSION:
        raise ValueError(
            f"load_quantised: the checkpoint has version {saved.get('version')}; "
            f"this quax_quant reads version {_VERSION}."
        )
    _check(saved, _header(like))
    return eqx.tree_deserialise_leaves(f, like)


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
