"""Rules for JAX's control-flow primitives other than loops: the body of a nested
`jit` (whose rule, in `_functions.py`, runs a `quax.register_function` rule where one
matches, and this body otherwise), `cond`/`switch`, `checkpoint` and
`custom_linear_solve` (the loops' rules are in `_loops.py`).

Each rule re-traces the primitive's inner jaxpr(s) under a fresh quax trace with the
values as inputs, and hands the result to JAX's public API (`jax.jit`, `lax.switch`,
`lax.custom_linear_solve`, ...), so that every value stays structured through the
body. Branch outputs and right-hand sides whose type changes are joined (see
`_joins.py`): the differing parts are lifted or materialised (the family may refuse,
giving an error that names the output) and the body re-traced, until the types are
stable.
"""

import functools as ft
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from .._caching import _keys
from .._caching._eager import MAX_CONSTANT_SIZE, ConstKey, value_structure
from .._compat import (
    ClosedJaxpr,
    DynamicJaxprTracer,
    Jaxpr,
    Literal,
    Tracer,
    cond_p,
    current_trace,
    is_unspecified,
    jit_p,
    linear_solve_p,
    release_traces,
    remat_p,
    scan_p,
    staged_atom,
    staged_since,
    staging,
    typeof,
    while_p,
)
from .._dispatch._known import (
    ValueAsked,
    known_constant,
    stand_in_token,
    standing_in,
)
from .._dispatch._registry import register
from .._foundation import _caches
from .._foundation._caches import JaxprTable
from .._transform import _trace
from .._values._value import Value, ValueLike, is_value
from . import _loops as _loops  # `_loops`: the loops' rules
from ._bodies import decision, quaxified_jaxpr
from ._joins import (
    BodyFailed,
    Join,
    Rejoined,
    catching,
    join_until_stable,
    materialise_rhs,
    skeleton,
    trying,
)


__all__: list[str] = []


def _jit_body(
    *args: ValueLike,
    jaxpr: Any,
    inline: Any,
    name: str,
    donated_invars: tuple[bool, ...],
    in_shardings: tuple[Any, ...],
    out_shardings: tuple[Any, ...],
    keep_unused: bool,
    **params: Any,
) -> list[Any]:
    # An inlined `jit` reaches this rule only where `quax.register_function` has
    # rules for its function (`QuaxTrace` binds any other's equations) and none of
    # them ran: the call is then kept, its body quaxified as any other's.
    del inline, out_shardings  # outputs' types are only known after tracing the body
    # Plain arguments known now (Python and NumPy scalars, concrete arrays) up to
    # `MAX_CONSTANT_SIZE` elements stay constants of the body, keyed by value, as
    # they would be without the `jit`: rules may need their values (an exponent, a
    # constant of NaNs). Larger ones are passed in as arguments, as JAX passes
    # them, and the body is keyed by their avals: an eager loop calling a jitted
    # library function on fresh data compiles it once. A rule that asks
    # `known_constant` for one of those would get its value without the `jit`:
    # the body then runs again with that argument as a constant too, keyed by
    # value (see `ConstKey`: a NumPy array by its bytes), from then on for this
    # jaxpr. Only the arguments rules asked about are keyed so: hashing the bytes
    # of every large array on every call would cost what the cache saves.
    known = [not is_value(a) and not isinstance(a, Tracer) for a in args]
    large = [
        k and typeof(a).size > MAX_CONSTANT_SIZE
        for a, k in zip(args, known, strict=True)
    ]
    common = (
        name,
        keep_unused,
        tuple(
            None if is_unspecified(s) or is_value(a) or k else s
            for s, a, k in zip(in_shardings, args, known, strict=True)
        ),
    )
    # The large arguments that rules asked about, by position: kept per jaxpr and
    # arguments' structures (in verify mode, found afresh and compared).
    asked: frozenset[int] = frozenset()
    hint = None
    if any(large) and _caches.is_enabled():
        hint = _keys.program_key(
            (id(jaxpr), *common),
            tuple(_structure(a) if is_value(a) else typeof(a) for a in args),
            None,
        )
        kept = _by_value.get(hint[0])
        if kept is not None and not _caches.verifying:
            asked = kept
    while True:
        slots = tuple(
            (ConstKey(a) if not g or i in asked else typeof(a)) if k else None
            for i, (a, k, g) in enumerate(zip(args, known, large, strict=True))
        )
        # A token for each concrete argument passed in by its aval.
        tokens = {
            i: object()
            for i, s in enumerate(slots)
            if s is not None and type(s) is not ConstKey
        }
        try:
            out = _call(jaxpr, common, donated_invars, slots, args, tokens)
        except ValueAsked as e:
            i = next((i for i, t in tokens.items() if t is e.token), None)
            if i is None:
                raise  # an enclosing `jit`'s argument
            release_traces(e)
            asked |= {i}
            continue
        if hint is not None:
            key, parts = hint
            kept = _by_value.get(key)
            if kept is None or (kept != asked and not _caches.verifying):
                _by_value.put(key, asked, jaxpr)
                _caches.made_with(_by_value.name, key, parts, asked, jaxpr)
            elif _caches.verifying:
                what = "the plain arguments whose values rules ask for"
                _caches.check(_by_value.name, key, _keys.PROGRAM, parts, asked, what)
        return out


# The jitted quaxified bodies, by `program_key` (the code: the jaxpr's `id`, the
# `jit`'s name, `keep_unused`, shardings and donated arguments; the inputs: the
# plain arguments' slots and the values' structures); and, per jaxpr and arguments'
# structures, the large plain arguments whose value rules asked for (the body takes
# them by value). Each entry goes with its jaxpr, and so with the function whose
# `jit` made it (a compiled body holds megabytes), as well as beyond the bound.
MAX_NESTED_JITS = 256
_nested = JaxprTable("nested jit bodies", MAX_NESTED_JITS)
_by_value = JaxprTable("nested jits taking plain arguments by value", MAX_NESTED_JITS)


def _call(
    jaxpr: Any,
    common: tuple[Any, ...],
    donated_invars: tuple[bool, ...],
    slots: tuple[Any, ...],
    args: Sequence[Any],
    tokens: dict[int, object],
) -> Any:
    """Call the jitted body of `jaxpr` on `args`: each slot is a constant (a
    `ConstKey`), or the aval of a concrete argument passed in (whose value the
    call with its token in `tokens` knows), or `None` for a traced or value
    argument."""
    dynamic = [i for i, c in enumerate(slots) if not isinstance(c, ConstKey)]
    # Concrete arguments are never donated: they stay the caller's.
    donate = tuple(
        j for j, i in enumerate(dynamic) if donated_invars[i] and slots[i] is None
    )
    stand_ins = [
        tokens[i] if slots[i] is not None else stand_in_token(args[i]) for i in dynamic
    ]
    passed = [args[i] for i in dynamic]
    # JAX keys the body's trace by the values' treedefs, whose static fields may
    # compare loosely (quax-units' display units): each text has its own body.
    structures = tuple(
        _structure(args[i]) if slots[i] is None and is_value(args[i]) else None
        for i in dynamic
    )
    # The settings rules read while the body traces, and the rest of the context.
    key, parts = _keys.program_key(
        (id(jaxpr), *common, donate), (slots, structures), None
    )
    caching = _caches.is_enabled()
    verifying = caching and _caches.verifying
    jitted = _nested.get(key) if caching else None
    made = fresh = None
    staged: dict[str, str] = {}  # what the fresh body staged, in verify mode
    if jitted is None:
        record = None
        if verifying:  # the jaxpr held weakly: the body kept keeps `record`
            record = ft.partial(_keep_program, weakref.ref(jaxpr), key, parts)
        jitted = made = _jitted(jaxpr, common, donate, slots, record)
    elif verifying:
        # Traced afresh: the rules run, and what the body stages is recorded.
        fresh = _jitted(jaxpr, common, donate, slots, staged.__setitem__)
    previous = _pending.tokens
    _pending.tokens = stand_ins
    try:
        out = jitted(*passed)
        if fresh is not None:
            fresh(*passed)
    finally:
        _pending.tokens = previous
    # Verify mode: the fresh body must give the outputs and stage the program the
    # kept one did, for the structure of these arguments.
    what = "its outputs' types or the program it stages"
    for structure, program in staged.items():
        entry = (key, structure)
        _caches.check(_nested.name, entry, _keys.PROGRAM, parts, program, what)
    if made is not None and caching:  # kept once a call went through
        _nested.put(key, made, jaxpr)
    return out


def _keep_program(
    jaxpr: Any, key: Any, parts: tuple[Any, ...], structure: str, program: str
) -> None:
    """Verify mode: keep the `program` (its outputs' types and what it stages) a
    body made under `key` gave for the `structure` of its arguments (JAX traces a
    body once per structure), while its jaxpr (held by the `weakref.ref` `jaxpr`)
    lives."""
    code = jaxpr()
    if code is not None:
        _caches.made_with(_nested.name, (key, structure), parts, program, code)


# An object's address in its text (`<function f at 0x7f...>`): another trace of the
# same body makes other objects.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _staged_program(trace: Any, inputs: Any, out: Any) -> str:
    """What the staging `trace` (a `jit` body's, on the tracers `inputs`) staged for
    its outputs `out`, as text (see `_program`). A program with an equation of its
    own staging rule (which JAX stages otherwise) gives no text."""
    eqns = staged_since(trace, 0)
    if eqns is None:
        return ""

    def atom(t: Any) -> Any:
        if type(t) is not DynamicJaxprTracer or t._trace is not trace:
            return "value", t
        kind, a = staged_atom(trace, t)
        return a if kind == "var" else (kind, a)

    steps = [
        (e.primitive, e.params, [atom(t) for t in e.in_tracers], e.outvars, e.effects)
        for e in eqns
    ]
    leaves = [atom(t) for t in jtu.tree_leaves(inputs)]
    return _ADDRESS.sub(
        "", repr(_program(steps, leaves, map(atom, jtu.tree_leaves(out))))
    )


def _program(
    eqns: Sequence[tuple[Any, dict[str, Any], list[Any], list[Any], Any]],
    inputs: Iterable[Any],
    outputs: Iterable[Any],
) -> list[Any]:
    """A program comparable across traces: its equations (primitive, params,
    inputs, outputs), each given as `(primitive, params, inputs, outvars, effects)`
    with inputs a variable or a `(kind, value)` pair (a literal, a constant), and
    variables by number (`inputs` first, then in order of appearance), inner jaxprs
    among the params alike. Equations whose outputs nothing reads and that have no
    effect are left out: whether a trace still holds them depends on when the
    garbage collector ran, and verify mode itself runs rules whose equations it
    drops."""
    outputs = list(outputs)
    producers = {id(v): i for i, e in enumerate(eqns) for v in e[3]}
    live: set[int] = set()
    pending = list(outputs)
    while pending:
        i = producers.get(id(pending.pop()))
        if i is not None and i not in live:
            live.add(i)
            pending += eqns[i][2]
    numbers: dict[int, int] = {}

    def name(a: Any) -> Any:
        return a if type(a) is tuple else numbers.setdefault(id(a), len(numbers))

    for a in inputs:
        name(a)
    program: list[Any] = [
        (
            primitive,
            {k: _param(v) for k, v in params.items()},
            [name(a) for a in ins],
            [(name(v), v.aval) for v in outs],
        )
        for i, (primitive, params, ins, outs, effects) in enumerate(eqns)
        if i in live or effects
    ]
    program.append([name(a) for a in outputs])
    return program


def _param(p: Any) -> Any:
    """A primitive's param as `_program` compares it: inner jaxprs as programs."""
    if isinstance(p, ClosedJaxpr):
        return _param(p.jaxpr), p.consts
    if isinstance(p, Jaxpr):

        def atom(a: Any) -> Any:
            return ("literal", a.val) if type(a) is Literal else a

        steps = [
            (e.primitive, e.params, [atom(a) for a in e.invars], e.outvars, e.effects)
            for e in p.eqns
        ]
        inputs = [*p.constvars, *p.invars]
        return "jaxpr", _program(steps, inputs, map(atom, p.outvars))
    if isinstance(p, tuple):  # also a named tuple of jaxprs (`linear_solve`'s)
        return type(p).__name__, tuple(map(_param, p))
    return p


def _structure(x: Any) -> Any:
    """The strict structure of the value `x`: its type and static fields, equal
    only for the same text (see `quax._caching._eager.value_structure`)."""
    structure = value_structure(x)[0]
    return repr(jtu.tree_structure(x)) if structure is None else structure


def _outline(out: Any) -> str:
    """The types, static fields (by text) and avals of the outputs `out`."""
    leaves, treedef = jtu.tree_flatten(out)
    return repr((treedef, [typeof(x) for x in leaves]))


class _Pending(threading.local):
    # Per argument of the `jit` call being made: the token of the call that knows
    # its value, when it stands in for a concrete plain array (see `standing_in`).
    tokens: list[Any]

    def __init__(self) -> None:
        self.tokens = []


_pending = _Pending()


def _jitted(
    jaxpr: Any,
    common: tuple[Any, ...],
    donate: tuple[int, ...],
    slots: tuple[Any, ...],
    record: Callable[[str, str], None] | None = None,
) -> Callable[..., Any]:
    """`jax.jit` of the quaxified `jaxpr`, with the constants among `slots` (see
    `_call`) closed over, named, sharded and donating as `common` and `donate` say.
    Cached (see `_call`), so that JAX's own cache hits when the same nested `jit`
    comes back. Each time JAX traces it, `record` (if given) gets the structure of
    its arguments, and its outputs' types and the program it staged, as text (see
    `_outline`, `_staged_program`), for verify mode."""
    name, keep_unused, shardings = common
    fn = quaxified_jaxpr(jaxpr)

    def body(*dynamic: Any) -> Any:
        # While JAX traces it: `known_constant` asked about an argument standing in
        # for a concrete one raises for the call that knows its value.
        tokens = _pending.tokens
        marked = [i for i, t in enumerate(tokens) if t is not None]
        with standing_in([dynamic[i] for i in marked], [tokens[i] for i in marked]):
            it = iter(dynamic)
            out = fn(*[c.value if isinstance(c, ConstKey) else next(it) for c in slots])
        if record is not None:
            staged = _staged_program(current_trace(), dynamic, out)
            record(_outline(dynamic), _outline(out) + staged)
        return out

    body.__name__ = body.__qualname__ = name
    kwargs: dict[str, Any] = {}
    if not all(s is None for s in shardings):
        kept = zip(shardings, slots, strict=True)
        kwargs["in_shardings"] = tuple(
            s for s, c in kept if not isinstance(c, ConstKey)
        )
    return jax.jit(body, donate_argnums=donate, keep_unused=keep_unused, **kwargs)


# cond / switch ------------------------------------------------------------------------


@register(cond_p)
def _cond(
    index: ValueLike, *ops: ValueLike, branches: Sequence[Any], **params: Any
) -> list[Any]:
    del params
    index = decision(index, "the index of a `cond`/`switch` (`lax.cond`, `lax.switch`)")
    fns = [quaxified_jaxpr(b) for b in branches]
    join = Join(lambda i: f"output {i} of a cond/switch")
    seen: list[Any] = []

    def branch(fn: Callable[..., Any], *operands: Any) -> Any:
        out = join.outputs(fn(*operands))
        seen.append([skeleton(o) for o in out])
        return out

    def attempt() -> Any:
        seen.clear()
        return lax.switch(index, [ft.partial(branch, fn) for fn in fns], *ops)

    def rejoin() -> bool:
        return len(seen) == len(fns) and join.update_branches(seen)

    try:
        return join_until_stable(
            attempt, rejoin, limit=2 * len(branches[0].out_avals) + 1
        )
    except TypeError:
        chosen = _known_index(index)
        if chosen is None:
            raise
    # The branches' types do not join, but the branch is a constant of the program
    # (`lax.cond(True, ...)` under `jit`, as a solver writes for a static option):
    # only it ever runs, so its outputs are the cond's.
    return _as_cond_outputs(fns[chosen](*ops), branches)


def _known_index(index: Any) -> int | None:
    """The branch index of a `cond` when it is a constant of a staged program (a
    literal, or a constant under `jit`), else `None`. In eager mode the index is a
    run-time value: with another one the other branch would run, so the branches
    must still join. That includes library code run eagerly as one compiled
    program (`quax._caching._eager`), which must answer as it would equation by
    equation: its index is not read there."""
    if not staging():
        return None
    known = known_constant(index, 1)
    return None if known is None else int(known)


def _as_cond_outputs(outs: Sequence[Any], branches: Sequence[Any]) -> list[Any]:
    """One branch's outputs as the `cond`'s: a plain output is weakly typed only
    where every branch's is, as JAX joins them."""
    joined = []
    for i, out in enumerate(outs):
        weak = all(b.out_avals[i].weak_type for b in branches)
        if not isinstance(out, Value) and typeof(out).weak_type and not weak:
            out = lax.convert_element_type(out, typeof(out).dtype)
        joined.append(out)
    return joined


# checkpoint ---------------------------------------------------------------------------


@register(remat_p)
def _remat(
    *args: ValueLike, jaxpr: Any, prevent_cse: bool, policy: Any, **params: Any
) -> list[Any]:
    del params
    return jax.checkpoint(
        quaxified_jaxpr(jaxpr), prevent_cse=prevent_cse, policy=policy
    )(*args)


# custom_linear_solve ------------------------------------------------------------------


@register(linear_solve_p)
def _linear_solve(*args: ValueLike, const_lengths: Any, jaxprs: Any) -> list[Any]:
    ends = np.cumsum(list(const_lengths))
    starts = ends - np.asarray(list(const_lengths))
    matvec_c, _vecmat_c, solve_c, tr_solve_c = (
        args[s:e] for s, e in zip(starts, ends, strict=True)
    )
    b = list(args[int(ends[-1]) :])
    aux_avals = jaxprs.solve.out_avals[len(b) :]
    # `matvec`, `solve` and `transpose_solve` all map vectors of `b`'s types to
    # vectors of `b`'s types: join those like a loop's carry.
    join = Join(lambda i: f"leaf {i} of the right-hand side of a custom_linear_solve")
    seen: list[list[Any]] = []
    # The first error that `matvec` or a solve raised, caught inside its trace (a
    # trace left by an exception keeps the tracers it closed over alive); and the
    # error after which the right-hand side is solved on its dense array.
    failure: list[str | None] = [None]
    dense_rhs: list[str | None] = [None]

    def joined(out: Sequence[Any]) -> list[Any]:
        out = join.outputs(out)
        seen.append([skeleton(o) for o in out])
        return out

    def guarded(fn: Callable[[], Any], stand_in: Callable[[], Any], catch: bool) -> Any:
        if not catch:
            return fn()
        try:
            with catching():
                return fn()
        except Exception as e:
            release_traces(e)
            failure[0] = failure[0] or f"{type(e).__name__}: {e}"
            return stand_in()

    def linear_solve(catch: bool) -> Any:
        def matvec(x: list[Any]) -> list[Any]:
            run = lambda: joined(quaxified_jaxpr(jaxprs.matvec)(*matvec_c, *x))
            return guarded(run, lambda: list(x), catch)

        def call(jaxpr: Any, consts: Sequence[Any]) -> Callable[..., Any]:
            fn = quaxified_jaxpr(jaxpr)

            def solve(_: Any, x: list[Any]) -> Any:
                def run() -> Any:
                    out = fn(*consts, *x)
                    if aux_avals:
                        return joined(out[: len(b)]), out[len(b) :]
                    return joined(out)

                def stand_in() -> Any:
                    if aux_avals:
                        return list(x), [jnp.zeros(a.shape, a.dtype) for a in aux_avals]
                    return list(x)

                return guarded(run, stand_in, catch)

            return solve

        transpose_solve = jaxprs.transpose_solve
        return lax.custom_linear_solve(
            matvec,
            b,
            call(jaxprs.solve, solve_c),
            None if transpose_solve is None else call(transpose_solve, tr_solve_c),
            symmetric=jaxprs.vecmat is jaxprs.matvec,
            has_aux=bool(aux_avals),
        )

    def attempt() -> list[Any]:
        seen.clear()
        failure[0] = None
        b[:] = (
            join.inputs(b) if dense_rhs[0] is None else materialise_rhs(b, dense_rhs[0])
        )
        out = linear_solve(catch=True)
        if failure[0] is not None:
            if dense_rhs[0] is None and any(isinstance(x, Value) for x in b):
                # The solve failed on a value right-hand side (no rule for it, or
                # its matrix refuses it): solve on the dense array instead.
                dense_rhs[0] = failure[0]
                raise Rejoined
            if trying():
                raise BodyFailed  # inside a body that an enclosing loop is trying
            out = linear_solve(catch=False)  # raise the error
        if aux_avals:
            x, aux = out
            return [*x, *aux]
        return list(out)

    def rejoin() -> bool:
        return bool(seen) and join.update(b, seen[-1])

    return join_until_stable(
        attempt, rejoin, limit=3 * len(b) + 2, errors=(TypeError, ValueError)
    )


# Higher-order primitives (the loops' too): their rules' outputs are not checked
# against the primitive's abstract evaluation (see `QuaxTrace`).
_trace.unchecked_primitives.update(
    {jit_p, cond_p, while_p, scan_p, remat_p, linear_solve_p}
)
_trace.staging_primitives.update(
    {jit_p, cond_p, while_p, scan_p, remat_p, linear_solve_p}
)
