"""The optimised HLO of a quaxified function, and checks that it never densifies."""

import dataclasses
import re
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from .._transform._quaxify import quaxify


__all__ = [
    "HloInstruction",
    "assert_hlo_lacks",
    "compiled_hlo",
    "hlo_instructions",
    "hlo_ops",
    "hlo_shapes",
]

# `name = type op(operands), attributes`, optionally `ROOT`, the name with or without
# a leading `%`.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
# An array type: `f32[1024,512]{1,0}`, `pred[]`, `s32[<=8]`.
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([^\]]*)\]")
_OP = re.compile(r"\s*([\w\-]+)\(")

_HLO_DTYPES = {
    "bool": "pred",
    "int4": "s4",
    "int8": "s8",
    "int16": "s16",
    "int32": "s32",
    "int64": "s64",
    "uint4": "u4",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "complex64": "c64",
    "complex128": "c128",
}


@dataclasses.dataclass(frozen=True)
class HloInstruction:
    """One instruction of an HLO module's text.

    **Fields:**

    - `name`: the instruction's name (`dot.3`).
    - `op`: its opcode (`dot`, `fusion`, `parameter`, ...).
    - `arrays`: the `(dtype, shape)` of each array in its result type (several for
        a tuple), e.g. `("f32", (1024, 512))`.
    - `line`: the text line.
    """

    name: str
    op: str
    arrays: tuple[tuple[str, tuple[int, ...]], ...]
    line: str


def compiled_hlo(fn: Callable[..., Any], *args: Any) -> str:
    """The optimised HLO of `jax.jit(quax.quaxify(fn))` on `args`: what XLA runs.

    **Arguments:**

    - `fn`: the function (it need not know about quax).
    - `*args`: its arguments, arrays and [`quax.Value`][]s.

    **Returns:**

    The compiled module as text (`jax.jit(...).lower(*args).compile().as_text()`),
    fused computations included.
    """
    return _compiled(fn, *args)[0]


def _compiled(fn: Callable[..., Any], *args: Any) -> tuple[str, str]:
    """The optimised HLO text of `jax.jit(quax.quaxify(fn))` on `args`, and the
    platform (`"cpu"`, `"tpu"`, ...) it was compiled for."""
    compiled = jax.jit(quaxify(fn)).lower(*args).compile()
    text = compiled.as_text()
    if text is None:
        raise RuntimeError("this JAX backend gives no text for compiled programs")
    shardings = jax.tree.leaves(compiled.input_shardings)
    if shardings:
        platform = next(iter(shardings[0].device_set)).platform
    else:
        platform = jax.default_backend()
    return text, platform


# Opcodes that a backend's compiler gives for another: XLA's TPU compiler rewrites
# every `dot` as a `convolution`, so that forbidding `dot` there forbids those too.
_REWRITTEN_OPS = {"tpu": {"dot": "convolution"}}


def _result_type(rest: str) -> tuple[str, str]:
    """Split `type op(...)` into the type and what follows it."""
    if rest.startswith("("):
        depth = 0
        for i, c in enumerate(rest):
            depth += c == "("
            depth -= c == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1 :]
    head, _, tail = rest.partition(" ")
    return head, " " + tail


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d.lstrip("<=")) for d in text.split(",") if d.strip())


def hlo_instructions(hlo: str) -> list[HloInstruction]:
    """Parse every instruction of an HLO module's text, in every computation.

    **Arguments:**

    - `hlo`: the text, e.g. from [`quax.testing.compiled_hlo`][].

    **Returns:**

    A list of [`quax.testing.HloInstruction`][].
    """
    out = []
    for line in hlo.splitlines():
        if line.lstrip().startswith(("HloModule", "//", "ENTRY")):
            continue
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        name, rest = match.groups()
        typ, tail = _result_type(rest)
        op = _OP.match(tail)
        if op is None:
            continue
        arrays = tuple((d, _dims(s)) for d, s in _ARRAY.findall(typ))
        out.append(HloInstruction(name, op.group(1), arrays, line.strip()))
    return out


def hlo_shapes(hlo: str) -> set[tuple[str, tuple[int, ...]]]:
    """The `(dtype, shape)` of every array an HLO module's instructions produce
    (parameters, fused computations and tuple elements included), e.g.
    `{("f32", (1024, 512)), ("s32", ())}`; dtypes are HLO's names (`f32`, `bf16`,
    `s8`, `pred`).

    **Arguments:**

    - `hlo`: the text, e.g. from [`quax.testing.compiled_hlo`][].

    **Returns:**

    A set of `(dtype, shape)` pairs.
    """
    return {a for ins in hlo_instructions(hlo) for a in ins.arrays}


def hlo_ops(hlo: str) -> set[str]:
    """The opcodes of an HLO module's instructions (`dot`, `fusion`, `reduce`, ...).

    **Arguments:**

    - `hlo`: the text, e.g. from [`quax.testing.compiled_hlo`][].

    **Returns:**

    A set of opcode names.
    """
    return {ins.op for ins in hlo_instructions(hlo)}


def _hlo_dtype(dtype: Any) -> str:
    if isinstance(dtype, str) and dtype not in _HLO_DTYPES:
        return dtype
    return _HLO_DTYPES[np.dtype(dtype).name]


def assert_hlo_lacks(
    fn: Callable[..., Any],
    *args: Any,
    shapes: Iterable[tuple[int, ...]] = (),
    ops: Iterable[str] = (),
    dtypes: Iterable[Any] | None = None,
    ignore_parameters: bool = False,
) -> str:
    """Assert that the compiled program of `jax.jit(quax.quaxify(fn))(*args)` holds
    no array of any of `shapes` and no instruction of any of `ops`: e.g. that a
    sparse or structured matrix is never densified.

    ```python
    quax.testing.assert_hlo_lacks(lambda a, x: a @ x, sparse, x, shapes=[(n, n)])
    ```

    Every instruction counts, in every computation of the optimised module:
    parameters, intermediate results inside fusions, tuple elements. Where a leaf
    of an input has the forbidden shape (a LoRA weight `w` has the shape of the
    dense `w + a @ b`), pass `ignore_parameters=True`: then only arrays the program
    computes count.

    **Arguments:**

    - `fn`: the function (it need not know about quax).
    - `*args`: its arguments, arrays and [`quax.Value`][]s.
    - `shapes`: forbidden array shapes, as tuples of ints.
    - `ops`: forbidden HLO opcodes (`"dot"`, `"convolution"`, `"sort"`, ...). On a
        TPU, whose compiler rewrites every `dot` as a `convolution`, forbidding
        `"dot"` forbids `"convolution"` too.
    - `dtypes`: restrict `shapes` to arrays of these dtypes (NumPy/JAX dtypes, or
        HLO names such as `"f32"`); by default any dtype.
    - `ignore_parameters`: skip `parameter` instructions (the program's inputs, and
        those of its fused computations) when looking for `shapes`.

    **Returns:**

    The HLO text, for further checks.

    **Raises:**

    `AssertionError` naming each offending instruction line; also when the text has
    no instruction that could be parsed (so that a change of format cannot make the
    check pass vacuously).
    """
    hlo, platform = _compiled(fn, *args)
    instructions = hlo_instructions(hlo)
    if not instructions:
        raise AssertionError(f"no instruction could be parsed in the HLO:\n{hlo}")
    forbidden_shapes = {tuple(int(d) for d in s) for s in shapes}
    forbidden_ops = set(ops)
    rewritten = _REWRITTEN_OPS.get(platform, {})
    forbidden_ops |= {rewritten[op] for op in ops if op in rewritten}
    kinds = None if dtypes is None else {_hlo_dtype(d) for d in dtypes}
    offending = []
    for ins in instructions:
        if ins.op in forbidden_ops:
            offending.append(f"op {ins.op}: {ins.line}")
            continue
        if ignore_parameters and ins.op == "parameter":
            continue
        for dtype, shape in ins.arrays:
            if shape in forbidden_shapes and (kinds is None or dtype in kinds):
                offending.append(f"array {dtype}{list(shape)}: {ins.line}")
                break
    if offending:
        shown = "\n  ".join(offending[:20])
        more = f"\n  ... and {len(offending) - 20} more" if len(offending) > 20 else ""
        raise AssertionError(
            f"the compiled program holds {len(offending)} forbidden instruction(s) "
            f"(shapes {sorted(forbidden_shapes)}, ops {sorted(forbidden_ops)}"
            f"{'' if kinds is None else f', dtypes {sorted(kinds)}'}):\n  "
            f"{shown}{more}"
        )
    return hlo
