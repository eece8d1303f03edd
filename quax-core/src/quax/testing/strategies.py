"""Hypothesis strategies for testing quax families: shapes, dtypes, arrays (with
non-finite entries where asked), `lax.dot_general` dimension numbers, small random
programs, and calls that pass values as users do (aliased, sharing arrays, mixed
with plain arrays, built inside the function).

Needs `hypothesis` (`pip install quax-core[testing]`); `import quax.testing` does not
import this module until `quax.testing.strategies` is used.

```python
from hypothesis import given, settings
from quax.testing import strategies as qst

@settings(max_examples=20, deadline=None)
@given(qst.programs(ops=("neg", "scale", "matmul", "sum", "cond", "scan")), qst.data())
def test_programs(program, data):
    x = data.draw(qst.arrays(program.in_shape, program.dtype))
    quax.testing.assert_matches_dense(program, MyValue(x))
```
"""

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

from .._transform._quaxify import quaxify


__all__ = [
    "ALL_OPS",
    "CALL_KINDS",
    "Call",
    "NON_FINITE",
    "Program",
    "arrays",
    "calls",
    "data",
    "dot_general_dimension_numbers",
    "dtypes",
    "programs",
    "shapes",
]

data = st.data

NON_FINITE = (math.nan, math.inf, -math.inf, -0.0)
"""The special entries `arrays(..., non_finite=True)` draws."""

_DTYPES = {
    "float": ("float32", "float64"),
    "low": ("bfloat16", "float16"),
    "int": ("int32", "int64"),
    "bool": ("bool",),
    "complex": ("complex64", "complex128"),
}
_WIDE = {"float64", "int64", "complex128"}


def shapes(
    min_dims: int = 0, max_dims: int = 3, min_side: int = 1, max_side: int = 5
) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes.

    **Arguments:**

    - `min_dims`, `max_dims`: the range of the number of axes.
    - `min_side`, `max_side`: the range of each axis' size.

    **Returns:**

    A strategy of tuples of ints.
    """
    side = st.integers(min_side, max_side)
    return st.lists(side, min_size=min_dims, max_size=max_dims).map(tuple)


def dtypes(kinds: Sequence[str] = ("float",)) -> st.SearchStrategy[np.dtype]:
    """Dtypes of the given kinds: `"float"` (float32, and float64 when
    `jax_enable_x64` is on), `"low"` (bfloat16, float16), `"int"` (int32, int64 with
    x64), `"bool"`, `"complex"` (complex64, complex128 with x64).

    **Arguments:**

    - `kinds`: the kinds to draw from.

    **Returns:**

    A strategy of NumPy dtypes (bfloat16 is `jnp.bfloat16`'s).
    """
    x64 = bool(jax.config.read("jax_enable_x64"))
    names = []
    for kind in kinds:
        try:
            names += [n for n in _DTYPES[kind] if x64 or n not in _WIDE]
        except KeyError:
            raise ValueError(
                f"unknown dtype kind {kind!r}; choose from {sorted(_DTYPES)}"
            ) from None
    return st.sampled_from([jnp.dtype(n) for n in names])


@st.composite
def arrays(
    draw: st.DrawFn,
    shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]],
    dtype: Any | st.SearchStrategy[Any] = jnp.float32,
    *,
    min_value: float = -4.0,
    max_value: float = 4.0,
    non_finite: bool = False,
) -> jax.Array:
    """JAX arrays with entries in `[min_value, max_value]` (integers: the integers in
    that range; booleans: either), and with `non_finite`, floating-point entries
    that are also NaN, `inf`, `-inf` or `-0.0`.

    **Arguments:**

    - `shape`: a shape or a strategy of shapes.
    - `dtype`: a dtype or a strategy of dtypes.
    - `min_value`, `max_value`: the range of the finite entries.
    - `non_finite`: draw NaN, `inf`, `-inf` and `-0.0` among the floating-point
        (and complex: in either part) entries, where a rule must give what dense
        JAX gives (NaN propagated, never a silent zero; see
        [`quax.testing.assert_matches_dense`][]).

    **Returns:**

    A strategy of `jax.Array`s.
    """
    if isinstance(shape, st.SearchStrategy):
        shape = draw(shape)
    dtype = jnp.dtype(draw(dtype) if isinstance(dtype, st.SearchStrategy) else dtype)
    size = math.prod(shape)
    if dtype == jnp.bool_:
        elements = st.booleans()
    elif jnp.issubdtype(dtype, jnp.integer):
        elements = st.integers(math.ceil(min_value), math.floor(max_value))
    else:
        elements = st.floats(min_value, max_value, width=32)
        if non_finite:
            elements = st.one_of(elements, st.sampled_from(NON_FINITE))
    values = draw(st.lists(elements, min_size=size, max_size=size))
    out = np.asarray(values, dtype=np.float64 if values else None).reshape(shape)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        imag = draw(st.lists(elements, min_size=size, max_size=size))
        out = out + 1j * np.asarray(imag, dtype=np.float64).reshape(shape)
    return jnp.asarray(out, dtype=dtype)


@st.composite
def dot_general_dimension_numbers(
    draw: st.DrawFn,
    max_batch: int = 1,
    max_contract: int = 2,
    max_free: int = 2,
    max_side: int = 4,
) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    """Operand shapes and dimension numbers valid for `lax.dot_general`, with the
    batch, contracting and free axes of each operand in a random order.

    ```python
    lhs_shape, rhs_shape, dims = data.draw(qst.dot_general_dimension_numbers())
    lax.dot_general(lhs, rhs, dims)
    ```

    **Arguments:**

    - `max_batch`: the most batch axes.
    - `max_contract`: the most contracting axes.
    - `max_free`: the most free (kept) axes of each operand.
    - `max_side`: the largest axis size.

    **Returns:**

    A strategy of `(lhs_shape, rhs_shape, ((lhs_contract, rhs_contract),
    (lhs_batch, rhs_batch)))`.
    """
    side = st.integers(1, max_side)
    batch = draw(st.lists(side, max_size=max_batch))
    contract = draw(st.lists(side, max_size=max_contract))
    lhs_free = draw(st.lists(side, max_size=max_free))
    rhs_free = draw(st.lists(side, max_size=max_free))

    def place(free: list[int]) -> tuple[tuple[int, ...], list[int], list[int]]:
        labels = [("b", i) for i in range(len(batch))]
        labels += [("c", i) for i in range(len(contract))]
        labels += [("f", i) for i in range(len(free))]
        order = draw(st.permutations(labels))
        sizes = {"b": batch, "c": contract, "f": free}
        shape = tuple(sizes[kind][i] for kind, i in order)
        batch_axes = [order.index(("b", i)) for i in range(len(batch))]
        contract_axes = [order.index(("c", i)) for i in range(len(contract))]
        return shape, batch_axes, contract_axes

    lhs_shape, lhs_batch, lhs_contract = place(lhs_free)
    rhs_shape, rhs_batch, rhs_contract = place(rhs_free)
    dims = (
        (tuple(lhs_contract), tuple(rhs_contract)),
        (tuple(lhs_batch), tuple(rhs_batch)),
    )
    return lhs_shape, rhs_shape, dims


@dataclasses.dataclass(frozen=True)
class Program:
    """A small random program of `jax.numpy`/`lax` operations on one array, drawn by
    [`quax.testing.strategies.programs`][]. Call it like a function; its `repr` is
    the readable description hypothesis prints on failure.

    **Fields:**

    - `steps`: the operations, as `(description, function)` pairs, applied in turn.
    - `in_shape`, `out_shape`: the shapes of its input and output.
    - `dtype`: the dtype of its input (and output).

    `reverse_mode` says whether JAX can reverse-differentiate it (not through a
    `while_loop`): pass `grad=program.reverse_mode` to
    [`quax.testing.assert_matches_dense`][].
    """

    steps: tuple[tuple[str, Callable[[Any], Any]], ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: Any

    @property
    def reverse_mode(self) -> bool:
        """Whether `jax.grad` works on it (no `while_loop` step)."""
        return not any(d.startswith("while_loop") for d, _ in self.steps)

    def __call__(self, x: Any) -> Any:
        for _, step in self.steps:
            x = step(x)
        return x

    @property
    def description(self) -> str:
        """`x: f32[2, 3] -> sin -> matmul(W: f32[3, 4]) -> f32[2, 4]`."""
        name = jnp.dtype(self.dtype).name
        chain = [f"x: {name}{list(self.in_shape)}"]
        chain += [d for d, _ in self.steps]
        chain.append(f"{name}{list(self.out_shape)}")
        return " -> ".join(chain)

    def __repr__(self) -> str:
        return f"Program({self.description})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # What hypothesis prints for a failing example.
        del cycle
        printer.text(repr(self))


# Operations that keep shape, dtype and (for a units family) units: the only ones
# used inside `cond`, `scan` and `while_loop`, so that the branches and loop carries
# keep one type.
_KEEPING = ("neg", "scale", "sin", "tanh")
_ELEMENTWISE = ("sin", "tanh", "neg", "square", "scale", "add_const")
_SHAPED = ("matmul", "sum", "transpose", "reshape")
_CONTROL = ("cond", "scan", "while_loop")
ALL_OPS = _ELEMENTWISE + _SHAPED + _CONTROL
"""The operation names [`quax.testing.strategies.programs`][] draws from."""


def _elementwise(name: str, factor: float) -> Callable[[Any], Any]:
    if name == "sin":
        return jnp.sin
    if name == "tanh":
        return jnp.tanh
    if name == "neg":
        return lambda x: -x
    if name == "square":
        return lambda x: x * x
    if name == "scale":
        return lambda x: x * factor
    return lambda x: x + factor  # add_const


def _draw_step(
    draw: st.DrawFn,
    ops: Sequence[str],
    shape: tuple[int, ...],
    dtype: Any,
) -> tuple[str, Callable[[Any], Any], tuple[int, ...]]:
    usable = [
        op
        for op in ops
        if op in _ELEMENTWISE
        or (op in ("matmul", "sum", "scan") and len(shape) >= 1)
        or (op in ("transpose", "reshape") and len(shape) >= 2)
        or op in ("cond", "while_loop")
    ]
    op = draw(st.sampled_from(usable))
    factor = draw(st.sampled_from([0.5, 1.5, -2.0]))
    keeping = [o for o in ops if o in _KEEPING] or ["neg"]
    inner = draw(st.sampled_from(keeping))
    f = _elementwise(inner, factor)
    inner_name = f"{inner}({factor})" if inner == "scale" else inner
    if op in _ELEMENTWISE:
        name = f"{op}({factor})" if op in ("scale", "add_const") else op
        return name, _elementwise(op, factor), shape
    if op == "matmul":
        k = draw(st.integers(1, 4))
        seed = draw(st.integers(0, 2**16))
        n = shape[len(shape) - 1]
        w = jnp.asarray(np.random.default_rng(seed).standard_normal((n, k)), dtype)
        name = f"matmul(W: {jnp.dtype(dtype).name}{[n, k]}, seed {seed})"
        return name, lambda x: x @ w, (*shape[: len(shape) - 1], k)
    if op == "sum":
        axis = draw(st.integers(0, len(shape) - 1))
        out = shape[:axis] + shape[axis + 1 :]
        return f"sum(axis={axis})", lambda x: jnp.sum(x, axis=axis), out
    if op == "transpose":
        return "transpose", jnp.transpose, shape[::-1]
    if op == "reshape":
        flat = (math.prod(shape),)
        return f"reshape({flat})", lambda x: jnp.reshape(x, flat), flat
    if op == "cond":
        other = draw(st.sampled_from(keeping))
        g = _elementwise(other, factor)
        other_name = f"{other}({factor})" if other == "scale" else other
        name = f"cond(sum(x) > 0, {inner_name}, {other_name})"
        return name, lambda x: lax.cond(jnp.sum(x) > 0, f, g, x), shape
    if op == "scan":

        def scan(x: Any) -> Any:
            def body(carry: Any, row: Any) -> tuple[Any, Any]:
                new = carry * 0.5 + f(row)
                return new, new

            _, ys = lax.scan(body, x[0], x)
            return ys

        return f"scan(carry = carry * 0.5 + {inner_name}(row))", scan, shape
    n = draw(st.integers(0, 3))

    def loop(x: Any) -> Any:
        # `lax.while_loop` itself (a `fori_loop` with static bounds is a scan).
        def body(carry: tuple[Any, Any]) -> tuple[Any, Any]:
            i, c = carry
            return i + 1, f(c)

        return lax.while_loop(lambda carry: carry[0] < n, body, (0, x))[1]

    return f"while_loop({n} times, {inner_name})", loop, shape


def programs(
    in_shapes: st.SearchStrategy[tuple[int, ...]] | None = None,
    ops: Sequence[str] = ALL_OPS,
    max_ops: int = 4,
    dtype: Any = jnp.float32,
) -> st.SearchStrategy[Program]:
    """Small random programs of `jax.numpy`/`lax` operations on one array, control
    flow included.

    The operations (name: what it does): `sin`, `tanh`, `neg`, `square`,
    `scale` (times a constant), `add_const` (plus a constant), `matmul` (times a
    fixed random matrix on the last axis), `sum` (over one axis), `transpose`
    (reverses the axes), `reshape` (flattens), `cond` (`lax.cond` on `sum(x) > 0`
    between two operations), `scan` (`lax.scan` over the first axis with a carry),
    `while_loop` (`lax.while_loop`, 0 to 3 iterations). Inside `cond`, `scan` and
    `while_loop` only the chosen operations among `neg`, `scale`, `sin`, `tanh` are
    used (`neg` when there are none), so that branches and carries keep one type.

    **Arguments:**

    - `in_shapes`: a strategy of input shapes; by default 1 to 3 axes of 1 to 5.
    - `ops`: the operation names to draw from (a subset of `ALL_OPS`), e.g.
        without `sin` for a family that refuses it.
    - `max_ops`: the most operations in a program (at least one).
    - `dtype`: the input dtype.

    **Returns:**

    A strategy of [`quax.testing.strategies.Program`][]s.
    """
    unknown = set(ops) - set(ALL_OPS)
    if unknown or not ops:
        raise ValueError(f"unknown ops {sorted(unknown)}; choose from {ALL_OPS}")
    if max_ops < 1:
        raise ValueError(f"programs needs max_ops >= 1, got {max_ops}")
    if in_shapes is None:
        in_shapes = shapes(1, 3)
    return _programs(in_shapes, tuple(ops), max_ops, jnp.dtype(dtype))


@st.composite
def _programs(
    draw: st.DrawFn,
    in_shapes: st.SearchStrategy[tuple[int, ...]],
    ops: tuple[str, ...],
    max_ops: int,
    dtype: Any,
) -> Program:
    in_shape = draw(in_shapes)
    shape = in_shape
    steps = []
    for _ in range(draw(st.integers(1, max_ops))):
        name, step, shape = _draw_step(draw, ops, shape, dtype)
        steps.append((name, step))
    return Program(tuple(steps), tuple(in_shape), tuple(shape), dtype)


CALL_KINDS = ("values", "aliased", "shared arrays", "mixed", "built inside")
"""The ways [`quax.testing.strategies.calls`][] passes values to a function."""


@dataclasses.dataclass(frozen=True)
class Call:
    """A function and its arguments, drawn by [`quax.testing.strategies.calls`][]:
    check it with `assert_matches_dense(call.fn, *call.args,
    reference=call.reference)`. Its `repr` is the readable description hypothesis
    prints on failure.

    **Fields:**

    - `fn`: the function to quaxify.
    - `args`: its arguments.
    - `reference`: the same computation on the densified arguments (`fn` itself,
        but where `fn` builds the values inside).
    - `kind`: how the values are passed, one of `CALL_KINDS`.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    reference: Callable[..., Any]
    kind: str

    def __repr__(self) -> str:
        shown = ", ".join(map(_show, self.args))
        shared = len({id(a) for a in self.args}) < len(self.args)
        alias = " (one object)" if shared else ""
        name = getattr(self.fn, "__name__", "fn")
        return f"Call({self.kind}: {name}({shown}){alias})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        del cycle
        printer.text(repr(self))


def _show(x: Any) -> str:
    """An argument with its numbers: `Dense([nan, -0.0])`, `array([1.0, 2.0])`."""
    if isinstance(x, jax.Array | np.ndarray):
        return "array(" + np.array2string(np.asarray(x), separator=", ") + ")"
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(x)]
    inside = ", ".join(np.array2string(leaf, separator=", ") for leaf in leaves)
    return f"{type(x).__qualname__}({inside})"


def calls(
    fn: Callable[..., Any],
    make: Callable[[jax.Array], Any],
    arrays: st.SearchStrategy[jax.Array],
    n: int = 2,
    kinds: Sequence[str] = CALL_KINDS,
) -> st.SearchStrategy[Call]:
    """Calls of `fn` on values, passed the ways users pass them, which a rule (or a
    cache) that looks at one argument at a time can get wrong.

    ```python
    @settings(max_examples=20, deadline=None)
    @given(qst.calls(
        lambda a, b: a * b + a, MyValue, qst.arrays((3,), non_finite=True)
    ))
    def test_product(call):
        quax.testing.assert_matches_dense(
            call.fn, *call.args, reference=call.reference
        )
    ```

    The kinds (`kinds` chooses among them):

    - `"values"`: every argument a value of its own, `make(x_i)`;
    - `"aliased"`: one value passed as every argument, `fn(v, v)`;
    - `"shared arrays"`: distinct values built from one array, `fn(make(x),
        make(x))`;
    - `"mixed"`: the first argument a value, the others plain arrays;
    - `"built inside"`: plain arrays, each turned into a value inside the
        function, which runs `fn` on them (`lambda *xs:
        quax.quaxify(fn)(*map(make, xs))`), as a user builds a constant inside a
        jitted function; the reference is `fn` on the arrays.

    **Arguments:**

    - `fn`: a function of `n` arrays.
    - `make`: builds a value from an array (the value type's constructor).
    - `arrays`: the arrays the values are built from (each argument draws one).
    - `n`: how many arguments `fn` takes.
    - `kinds`: the kinds to draw from.

    **Returns:**

    A strategy of [`quax.testing.strategies.Call`][]s.
    """
    unknown = set(kinds) - set(CALL_KINDS)
    if unknown or not kinds:
        raise ValueError(f"unknown kinds {sorted(unknown)}; choose from {CALL_KINDS}")
    return _calls(fn, make, arrays, n, tuple(kinds))


@st.composite
def _calls(
    draw: st.DrawFn,
    fn: Callable[..., Any],
    make: Callable[[jax.Array], Any],
    arrays: st.SearchStrategy[jax.Array],
    n: int,
    kinds: tuple[str, ...],
) -> Call:
    kind = draw(st.sampled_from(kinds))
    xs = [draw(arrays) for _ in range(n)]
    if kind == "aliased":
        value = make(xs[0])
        return Call(fn, (value,) * n, fn, kind)
    if kind == "shared arrays":
        return Call(fn, tuple(make(xs[0]) for _ in range(n)), fn, kind)
    if kind == "mixed":
        return Call(fn, (make(xs[0]), *xs[1:]), fn, kind)
    if kind == "built inside":

        def built_inside(*arrays: Any) -> Any:
            return quaxify(fn)(*map(make, arrays))

        built_inside.__name__ = f"built_inside_{getattr(fn, '__name__', 'fn')}"
        return Call(built_inside, tuple(xs), fn, kind)
    return Call(fn, tuple(map(make, xs)), fn, kind)
