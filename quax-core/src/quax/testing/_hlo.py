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
# A computation's first line: `%name (parameters) -> type {`, `ENTRY` before the
# entry computation's.
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")

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
    return [ins for ins, _, _ in _parsed(hlo)]


def _parsed(hlo: str) -> list[tuple[HloInstruction, tuple[str, ...], str | None]]:
    """Every instruction of an HLO module's text, with the names of its operands and
    the computation it calls (`calls=`), if any."""
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
        operands, after = _result_type(tail[op.end() - 1 :])
        calls = _CALLS.search(after)
        out.append(
            (
                HloInstruction(name, op.group(1), arrays, line.strip()),
                tuple(_OPERAND.findall(operands)),
                None if calls is None else calls.group(1),
            )
        )
    return out


# An operand, `%name` (with or without its type before it), and the computation an
# instruction calls, `calls=%name`.
_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")

# Opcodes whose result is their operand's data, moved but not computed: a layout
# change and a copy between memory spaces. A TPU's compiler moves a program's input
# so before it uses it: `copy-start`/`copy-done` prefetch it into faster memory, and a
# `bitcast` (alone, or as a fusion of only that) retiles it.
_DATA_MOVES = {"bitcast", "copy", "copy-start", "copy-done"}


def _parameter_data(
    hlo: str, parsed: list[tuple[HloInstruction, tuple[str, ...], str | None]]
) -> set[str]:
    """The names of the instructions of an HLO module (its text `hlo`, `_parsed`
    as `parsed`) whose result is a parameter's data: the parameters (of every
    computation), and what moves their data without computing (`_DATA_MOVES`, a
    `bitcast` only to its operand's own shape and dtype), also as a fusion whose
    computation does only that."""
    arrays = {ins.name: ins.arrays for ins, _, _ in parsed}
    roots = {}  # a computation's name -> the name of its ROOT instruction
    computation = None
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header is not None:
            computation = header.group(1)
        match = _INSTRUCTION.match(line)
        if match is not None and line.lstrip().startswith("ROOT"):
            roots[computation] = match.group(1)
    data: set[str] = set()
    changed = True
    while changed:  # until no instruction joins (a fusion's computation comes first)
        changed = False
        for ins, operands, calls in parsed:
            if ins.name in data:
                continue
            if ins.op == "parameter":
                moved = True
            elif ins.op in _DATA_MOVES:
                moved = len(operands) == 1 and operands[0] in data
                if ins.op == "bitcast":
                    moved = moved and arrays.get(operands[0]) == ins.arrays
            elif ins.op == "fusion":
                moved = (
                    calls is not None
                    and roots.get(calls) in data
                    and all(o in data for o in operands)
                    and any(arrays.get(o) == ins.arrays for o in operands)
                )
            else:
                moved = False
            if moved:
                data.add(ins.name)
                changed = True
    return data


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
    fn: Callable[..., Any] | str,
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

    - `fn`: the function (it need not know about quax); or, for a program that is
        not `jax.jit(quax.quaxify(fn))` (a `jax.vmap` over a function that calls
        `quaxify` itself, an `eqx.filter_jit`), that program's optimised HLO text
        (`jax.jit(g).lower(...).compile().as_text()`), compiled for JAX's default
        backend, with no `args`.
    - `*args`: its arguments, arrays and [`quax.Value`][]s.
    - `shapes`: forbidden array shapes, as tuples of ints.
    - `ops`: forbidden HLO opcodes (`"dot"`, `"convolution"`, `"sort"`, ...). On a
        TPU, whose compiler rewrites every `dot` as a `convolution`, forbidding
        `"dot"` forbids `"convolution"` too.
    - `dtypes`: restrict `shapes` to arrays of these dtypes (NumPy/JAX dtypes, or
        HLO names such as `"f32"`); by default any dtype.
    - `ignore_parameters`: skip `parameter` instructions (the program's inputs, and
        those of its fused computations) when looking for `shapes`, and what only
        moves their data: a `copy`, a `bitcast` to the same shape (a layout change),
        a TPU's `copy-start`/`copy-done` (a prefetch into faster memory), or a
        fusion of only those.

    **Returns:**

    The HLO text, for further checks.

    **Raises:**

    `AssertionError` naming each offending instruction line; also when the text has
    no instruction that could be parsed (so that a change of format cannot make the
    check pass vacuously).
    """
    if isinstance(fn, str):
        if args:
            raise TypeError(
                "assert_hlo_lacks takes no arguments after a program's HLO text; "
                "pass the function and its arguments instead"
            )
        hlo, platform = fn, jax.default_backend()
    else:
        hlo, platform = _compiled(fn, *args)
    forbidden_shapes = {tuple(int(d) for d in s) for s in shapes}
    forbidden_ops = set(ops)
    rewritten = _REWRITTEN_OPS.get(platform, {})
    forbidden_ops |= {rewritten[op] for op in ops if op in rewritten}
    kinds = None if dtypes is None else {_hlo_dtype(d) for d in dtypes}
    offending = _offending(
        hlo, forbidden_shapes, forbidden_ops, kinds, ignore_parameters
    )
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


def _offending(
    hlo: str,
    shapes: set[tuple[int, ...]],
    ops: set[str],
    kinds: set[str] | None,
    ignore_parameters: bool,
) -> list[str]:
    """What `assert_hlo_lacks` reports in the HLO text `hlo`: a line per instruction
    of a forbidden opcode, or with an array of a forbidden shape (of a dtype in
    `kinds`, unless None); with `ignore_parameters`, parameters and what only moves
    their data do not count."""
    parsed = _parsed(hlo)
    if not parsed:
        raise AssertionError(f"no instruction could be parsed in the HLO:\n{hlo}")
    parameter_data = _parameter_data(hlo, parsed) if ignore_parameters else set()
    offending = []
    for ins, _, _ in parsed:
        if ins.op in ops:
            offending.append(f"op {ins.op}: {ins.line}")
            continue
        if ins.name in parameter_data:
            continue
        for dtype, shape in ins.arrays:
            if shape in shapes and (kinds is None or dtype in kinds):
                offending.append(f"array {dtype}{list(shape)}: {ins.line}")
                break
    return offending
