"""Eager quax: library code on values runs as one compiled program per call.

Outside any `jit`, plain JAX runs each `jax.numpy` function as one compiled, cached
program. Quax, run eagerly, would bind the function's equations one by one, each an
op-by-op dispatch. Instead, library code called on values eagerly (an inlined `jit`,
a Python operator on a traced value, `quax.quaxify` of a jitted function or of an
`operator` function) runs as the compiled program of its quaxified body, cached by
the code, the values' types and static fields (strictly: each program sees one text
of them and fields equal by `==`, as a type may make their equality loose, or
stricter than their text, as an object equal only to itself), which inputs and
leaves are one object (a rule may give `K + K` a closed form that `K + K2` has
not: the program then takes each leaf once, and rebuilds each value once), the
plain inputs, and the context of every cache's key (see `quax._caching._keys`: the
settings that rules read, such as `quax.zero.ieee_strict`, JAX's trace context,
the debug-check flag and the registry's generation).

In a compiled program, rules see the leaves of values as tracers, where equation by
equation they see concrete arrays. So that no rule answers otherwise there, the
first call of each code and structure runs equation by equation only and leaves the
structure of its output. Compiling costs tens of milliseconds, where a later call
equation by equation costs tenths of one (a doctest, a notebook cell or a test
calls a function once or twice), so the calls after the first run equation by
equation too until, together, they have taken as long as compiling a program takes
(the mean time this process took to compile the programs it compiled,
`COMPILE_AFTER_AT_FIRST` seconds before the first; `QUAX_EAGER_COMPILE_AFTER=s` in
the environment, or `COMPILE_AFTER`, fixes it at `s` seconds, `0` compiling on a
key's second call): a call repeated for a
while then pays for its compile with what it saves, and calls made a few times pay
at most about twice what the cheaper of the two ways would have cost. The call that
crosses it traces the program and keeps it when it gives the first call's output
structure (types, static fields equal and alike in text, shapes and dtypes); from
then on calls replay it. The results are the same bits whichever call switches:
the time decides only when, as the program rounds as the equations run one by one
do, bit for bit: optimisation barriers between its top-level equations keep XLA from
fusing them (and so from contracting a multiply and an add into one fused
multiply-add), see `_rounding_each_step`. The code runs equation by equation from
then on when the structure differs, or when tracing fails for any reason (a rule
needing a concrete leaf, a refusal, an error), or when a rule asks
[`quax.known_constant`][] for the value of a leaf of the program (equation by
equation it would be known). A rule
that reads concrete leaves must do so through `quax.known_constant`: the output
check only sees the first call. On by default; [`quax.set_eager_compilation`][] (or
`QUAX_EAGER_COMPILE=0` in the environment) turns it off.

Plain inputs stay constants of the program, as they are when the code runs equation
by equation (rules may need their values: an exponent, a known fill), so they are
part of the cache key: only small ones (`quax._caching._keys.MAX_CONSTANT_SIZE`
elements). At most `MAX_PROGRAMS` programs are kept (one per code, value
structure, leaf shapes and plain inputs, with the keys not compiled yet), the
oldest dropped first; while materialisations are tracked (the report names each
primitive as it runs), the code runs equation by equation as before. Only library
code runs this way: the user's own Python between calls runs as written, with its
side effects.
"""

import contextlib
import contextvars
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from .._compat import (
    Tracer,
    current_trace,
    eager_program,
    typeof,
)
from .._dispatch._known import ConcreteNeeded
from .._foundation import _caches
from .._foundation._rounding import KEEP_BARRIERS, eval_rounding_each_step
from .._values import _value
from .._values._value import is_value, value_classes
from . import _keys
from ._keys import ARRAY_LEAVES, MAX_CONSTANT_SIZE, ConstKey, value_structure


__all__ = [
    "COMPILE_AFTER",
    "COMPILE_AFTER_AT_FIRST",
    "MAX_PROGRAMS",
    "call_compiled",
    "environment_setting",
    "programs_traced",
    "set_eager_compilation",
]

MAX_PROGRAMS = 2048
# Seconds that the calls of a key after its first spend equation by equation before
# it compiles: what compiling a program costs, the mean of the compiles measured so
# far (`_compiled`), `COMPILE_AFTER_AT_FIRST` before the first; or `COMPILE_AFTER`
# where it is set (from `QUAX_EAGER_COMPILE_AFTER`). The compile of a `jax.numpy`
# function on a value took 60-80 ms on a CPU, where a later call took 0.1-0.5 ms
# equation by equation and 0.02 ms compiled: about a thousand calls pay for it
# (`python benchmarks/core.py --calls`).
COMPILE_AFTER_AT_FIRST = 0.05
_after = os.environ.get("QUAX_EAGER_COMPILE_AFTER")
COMPILE_AFTER: float | None = None if _after is None else float(_after)
_compile_seconds = COMPILE_AFTER_AT_FIRST


def environment_setting() -> bool:
    """The setting at import: on, unless the environment has `QUAX_EAGER_COMPILE=0`."""
    return os.environ.get("QUAX_EAGER_COMPILE", "1") != "0"


# Whether eager library code runs compiled, in each context (a thread starts from
# the environment's setting).
_AT_IMPORT = environment_setting()
_compiling = contextvars.ContextVar("quax_eager_compilation", default=_AT_IMPORT)


def set_eager_compilation(enabled: bool) -> bool:
    """Run library code called eagerly on values (every `jax.numpy` function, Python
    operators, `quax.quaxify` of a jitted function) as one compiled, cached program
    per code and value structure, instead of equation by equation. On by default
    (off with the environment variable `QUAX_EAGER_COMPILE=0`).

    Results are the same either way, and the user's own Python (side effects,
    `jax.debug` calls) runs as written. The first call of each code and structure
    runs equation by equation only, and so do the calls after it until together
    they have taken as long as a compile takes (tens of milliseconds), so calls
    made a few times compile nothing; the next traces and compiles its program,
    which is kept only if it gives the first call's output structure, and later
    calls replay it. Code whose rules need a
    concrete leaf (through [`quax.known_constant`][], or a JAX concretization
    error) keeps running equation by equation.

    The setting belongs to the context that sets it, as NumPy's `np.seterr` does
    (a `contextvars.ContextVar`): this thread, and the asyncio tasks it starts
    afterwards. Other threads keep their own; a new thread starts from the
    environment's setting.

    **Arguments:**

    - `enabled`: whether eager library code runs compiled.

    **Returns:**

    The previous setting of this context, to restore it
    (`quax.set_eager_compilation(previous)`). Compiled programs are dropped
    whenever the setting is set.
    """
    previous = _compiling.get()
    _compiling.set(bool(enabled))
    _programs.clear()
    return previous


# In a program table: this code and structure run equation by equation.
_BY_EQUATION: Any = object()


class _State(threading.local):
    # Whether this thread runs a first call equation by equation: code inside it
    # runs equation by equation too.
    checking: bool = False


_state = _State()

# The programs, by code (its `id`: a `WeakKeyDictionary` would compare codes with
# `__eq__`, which `jax.numpy`'s ufuncs make slow) and key, each dropped with its
# code, and all when a rule is registered (they may dispatch otherwise now): a
# program, `_BY_EQUATION`, or for a key not compiled yet the output structure of its
# first call (`_FirstOutput`).
_programs = _caches.Table("compiled eager programs", MAX_PROGRAMS)


def call_compiled(
    code: Any,
    quaxified: Callable[[], Callable[..., Any]],
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
) -> tuple[bool, Any]:
    """Run `quaxified()(*args, **kwargs)` as one compiled program, if it can.

    **Arguments:**

    - `code`: what the program is cached under (a jaxpr, a library function).
    - `quaxified`: builds the quaxified function (called on each call of a key
        that runs it equation by equation, and on the one that compiles it).
    - `args`, `kwargs`: its inputs: values, plain arrays or Python scalars, and
        pytrees of them.

    **Returns:**

    `(True, output)`, or `(False, None)` when the call must run as before
    (materialisations tracked, no value, a large or traced plain input, code that
    cannot be held weakly, or code that runs equation by equation).
    """
    global programs_traced
    if (
        not _compiling.get()
        or not _caches.is_enabled()
        or _state.checking
        or _value._state.reports
    ):
        return False, None
    inputs: Sequence[Any] = args
    treedef: Any = len(args)
    found = None if kwargs else _program_key(code, args, treedef)
    if found is _PYTREES or kwargs:
        inputs, treedef = jtu.tree_flatten((tuple(args), kwargs), is_leaf=is_value)
        found = _program_key(code, inputs, treedef)
    if found is None or found is _PYTREES:
        return False, None
    key, leaves, positions, parts = found
    try:
        program = _programs.get(key)
    except TypeError:  # a pytree node of the inputs that cannot be hashed
        return False, None
    if program is None or type(program) is _FirstOutput:
        if program is None or program.spent < (
            _compile_seconds if COMPILE_AFTER is None else COMPILE_AFTER
        ):
            # The first call (and those after it, until they have taken as long as
            # a compile) runs equation by equation only, as does code inside it;
            # the first leaves the structure of its output to check the program.
            _state.checking = True
            start = time.perf_counter()
            try:
                out = quaxified()(*args, **(kwargs or {}))
            finally:
                _state.checking = False
            if program is not None:
                program.spent += time.perf_counter() - start
                return True, out
            # Code that cannot be held weakly is not kept (`TypeError`).
            with contextlib.suppress(TypeError):
                _programs.put(key, _FirstOutput(out), code)
            return True, out
        # This call traces and checks the program, and runs it if kept.
        start = time.perf_counter()
        program = _checked_program(
            quaxified(), inputs, treedef, leaves, program, positions
        )
        _programs.put(key, program, code)
        programs_traced += 1
        if program is not _BY_EQUATION:
            out = program(*leaves)
            _compiled(time.perf_counter() - start)
            if _caches.verifying:
                made = _staged(quaxified(), inputs, treedef, leaves, positions)
                _caches.made_with(_programs.name, key, parts, made, code)
            return True, out
    elif _caches.verifying and program is not _BY_EQUATION:
        now = _staged(quaxified(), inputs, treedef, leaves, positions)
        what = "its staged program or its outputs"
        _caches.check(_programs.name, key, _keys.PROGRAM, parts, now, what)
    if program is _BY_EQUATION:
        return False, None
    return True, program(*leaves)


def _staged(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    treedef: Any,
    leaves: list[Any],
    positions: tuple[int, ...] | None,
) -> str:
    """What the program of `fn` on `inputs` stages and gives, as text (see
    `quax._foundation._caches.staged`), traced afresh."""
    return _caches.staged(_compile(fn, inputs, treedef, positions).trace(*leaves))


# What `_program_key` answers for inputs that hold pytrees of inputs.
_PYTREES: Any = object()


def _program_key(code: Any, inputs: Sequence[Any], treedef: Any) -> Any:
    """The key of a program of `code` on `inputs` (values, small plain arrays and
    scalars; as the leaves of `treedef`), the distinct leaves of its inputs, where
    each leaf is among them (`None` when each is there once, in order) and the
    key's components; `_PYTREES` when an input is a pytree of them, `None` when
    there is no program for them."""
    leaves: list[Any] = []
    constants: list[Any] = []
    key: list[Any] = [treedef]
    values = False
    seen: dict[int, int] = {}  # the values by `id`, and their input's index
    for i, x in enumerate(inputs):
        if type(x) in value_classes or is_value(x):
            if id(x) in seen:
                # The same value twice (`K + K`): rules may see that, so the key
                # holds it, and the program rebuilds the value once.
                key.append(("is", seen[id(x)]))
                continue
            seen[id(x)] = i
            structure, value_leaves, avals = value_structure(x)
            if structure is None:
                return None
            key.append(structure)
            key += avals  # a program is checked for one shape of each leaf
            leaves += value_leaves
            values = True
        elif isinstance(x, ARRAY_LEAVES):
            if isinstance(x, Tracer) or np.size(x) > MAX_CONSTANT_SIZE:
                return None
            key.append(ConstKey(x))
            constants.append(x)
        elif isinstance(treedef, int):
            return _PYTREES
        else:
            return None
    if not values:
        return None
    # A leaf twice (`K + K`, or a value built on one array twice): rules may see
    # that (a closed form for a sum of one matrix with itself), so the key holds
    # which leaves are one object (its aliasing), and the program gets each once.
    found, parts = _keys.program_key(id(code), tuple(key), leaves)
    positions = parts[_ALIASING]
    if positions is not None:
        leaves = list({id(t): t for t in leaves}.values())
    if constants and {id(c) for c in constants} & {id(t) for t in leaves}:
        return None  # a leaf that is also a plain input: one object, two roles
    return found, leaves, positions, parts


# Where a program key's components hold its aliasing.
_ALIASING = _keys.PROGRAM.index("aliasing")


class _FirstOutput:
    """What a first call gave equation by equation: its output's treedef and its
    leaves' shapes, dtypes and weak types."""

    __slots__ = ("avals", "spent", "treedef")

    def __init__(self, out: Any) -> None:
        # The seconds that the calls after the first spent equation by equation.
        self.spent = 0.0
        leaves, self.treedef = jtu.tree_flatten(out)
        try:
            self.avals = [_shape_dtype(x) for x in leaves]
        except TypeError:  # a leaf that is not an array: no program
            self.avals = None

    def matches(self, out_info: Any) -> bool:
        """Whether a program's `out_info` has this structure (equal treedefs, by
        `==` and by text, and the same shapes, dtypes and weak types)."""
        got, got_tree = jtu.tree_flatten(out_info)
        avals = [(g.shape, g.dtype, g.weak_type) for g in got]
        return _caches.alike(got_tree, self.treedef) and avals == self.avals


# How many programs were traced: a one-off call traces none.
programs_traced = 0
# How many compiles `_compile_seconds` is the mean of.
_compiles = 0


def _compiled(seconds: float) -> None:
    """Count a compile that took `seconds` (tracing, compiling and the first run of
    the program) into `_compile_seconds`, the mean of the compiles so far."""
    global _compile_seconds, _compiles
    _compiles += 1
    _compile_seconds += (seconds - _compile_seconds) / _compiles


def _checked_program(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    treedef: Any,
    leaves: list[Any],
    first: _FirstOutput,
    positions: tuple[int, ...] | None,
) -> Any:
    """The compiled program of `fn` on `inputs` (the values among them are given as
    their distinct leaves, `leaves`, each leaf's place among them in `positions`),
    if tracing it on `leaves` gives the output structure of the first call,
    `first`; else `_BY_EQUATION`."""
    program = _compile(fn, inputs, treedef, positions)
    try:
        traced = program.trace(*leaves)
    except (ConcreteNeeded, Exception):
        # A rule needed a concrete leaf or refused: equation by equation, it ran.
        return _BY_EQUATION
    if not first.matches(traced.out_info):
        return _BY_EQUATION
    return _rounding_each_step(traced, leaves)


def _rounding_each_step(traced: Any, leaves: Sequence[Any]) -> Any:
    """The program that `traced` (a traced `jax.jit`) stages, compiled so that it
    rounds as running its equations one by one does; `_BY_EQUATION` where the
    backend that runs it (that of `leaves`) cannot keep that promise.

    Equation by equation (a key's first call), each primitive a rule binds runs as
    a program of its own, which rounds its outputs; compiled whole, XLA would fuse
    neighbouring equations and contract a multiply and an add into one fused
    multiply-add, rounding once (`x * 10 - y` gives 1.5e-8 where the equations give
    0 for `x = 0.1`, `y = 1` in float32). Barriers between the equations keep each
    equation's rounding, so a call gives the same bits on its first and later
    runs; the program is still one dispatch. `_barriers_hold` checks once per
    backend that XLA keeps them: a backend without the barrier (the TPU runtime,
    which answers `UNIMPLEMENTED: HLO opt-barrier`) or whose compiler drops it
    runs every call equation by equation, as the first, so that its calls still
    give the same bits."""
    if not _barriers_hold(_platform(leaves)):
        return _BY_EQUATION
    closed, out_tree = traced.jaxpr, traced.out_tree

    def run(*leaves: Any) -> Any:
        outs = eval_rounding_each_step(closed.jaxpr, closed.consts, *leaves)
        return jtu.tree_unflatten(out_tree, outs)

    run.__name__ = run.__qualname__ = traced.fun_name
    return jax.jit(run, compiler_options=KEEP_BARRIERS)


def _platform(leaves: Sequence[Any]) -> str:
    """The platform (`"cpu"`, `"tpu"`, ...) that a program of `leaves` runs on: that
    of the first leaf committed to a device, else JAX's default backend."""
    for leaf in leaves:
        if isinstance(leaf, jax.Array) and getattr(leaf, "committed", False):
            return next(iter(leaf.devices())).platform
    return jax.default_backend()


# Per platform: whether its compiler keeps `eval_rounding_each_step`'s barriers.
_barriers_checked: dict[str, bool] = {}


def _barriers_hold(platform: str) -> bool:
    """Whether the XLA of `platform` keeps the barriers of
    `eval_rounding_each_step`: a multiply and a subtract that it would contract
    into a fused multiply-add round as two programs do (checked once per platform
    and process). A backend that cannot compile or run the barrier at all (the
    TPU runtime raises `UNIMPLEMENTED`) does not keep them: the check never raises
    into a user's call."""
    held = _barriers_checked.get(platform)
    if held is None:
        try:
            held = _barriers_kept_on(jax.devices(platform)[0])
        except Exception:  # any failure means: not on this backend
            held = False
        _barriers_checked[platform] = held
    return held


def _barriers_kept_on(device: Any) -> bool:
    """Whether a program with `eval_rounding_each_step`'s barriers, on `device`,
    rounds a multiply and a subtract as two programs do. Raises what the backend
    raises where it cannot compile or run the barrier."""
    x = jax.device_put(np.full(8, 0.1, np.float32), device)
    y = jax.device_put(np.ones(8, np.float32), device)
    ten = np.float32(10.0)
    closed = jax.make_jaxpr(lambda x, y: x * ten - y)(x, y)
    program = jax.jit(
        lambda x, y: eval_rounding_each_step(closed.jaxpr, closed.consts, x, y),
        compiler_options=KEEP_BARRIERS,
    )
    steps = jax.lax.sub(jax.lax.mul(x, ten), y)
    return bool(np.array_equal(np.asarray(program(x, y)[0]), np.asarray(steps)))


def _shape_dtype(x: Any) -> tuple[Any, ...]:
    aval = typeof(x)
    return aval.shape, aval.dtype, aval.weak_type


def _compile(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    treedef: Any,
    positions: tuple[int, ...] | None = None,
) -> Any:
    """`fn` on `inputs` as a jitted function of the distinct leaves of the values
    among them (the other inputs are constants of the program): each leaf is the
    argument at its place in `positions` (`None`: each leaf is its own argument),
    so that leaves that were one object are one tracer."""
    # Per input: its treedef and leaf count, or the constant itself (count -1), or
    # the index of the earlier input that is the same value (count -2).
    slots: list[tuple[Any, int]] = []
    seen: dict[int, int] = {}
    for i, x in enumerate(inputs):
        if is_value(x) and id(x) in seen:
            slots.append((seen[id(x)], -2))
        elif is_value(x):
            seen[id(x)] = i
            value_leaves, value_treedef = jtu.tree_flatten(x)
            slots.append((value_treedef, len(value_leaves)))
        else:
            slots.append((x, -1))

    def body(*distinct: Any) -> Any:
        leaves = distinct if positions is None else [distinct[p] for p in positions]
        rebuilt = []
        start = 0
        for x, count in slots:
            if count == -2:
                rebuilt.append(rebuilt[x])
            elif count < 0:
                rebuilt.append(x)
            else:
                rebuilt.append(jtu.tree_unflatten(x, leaves[start : start + count]))
                start += count
        if isinstance(treedef, int):
            args, kwargs = rebuilt, {}
        else:
            args, kwargs = jtu.tree_unflatten(treedef, rebuilt)
        outer = eager_program.trace
        eager_program.trace = current_trace()
        try:
            return fn(*args, **kwargs)
        finally:
            eager_program.trace = outer

    body.__name__ = body.__qualname__ = getattr(fn, "__name__", "quaxified")
    return jax.jit(body)
