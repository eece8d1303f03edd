"""Rules for JAX's higher-order primitives: nested `jit`, `cond`, `while`, `scan`,
`checkpoint`, `custom_linear_solve`, callbacks, and primitives that act on every leaf
of any value alike.

Each rule re-traces the primitive's inner jaxpr(s) under a fresh quax trace with the
values as inputs, and hands the result to JAX's public API (`jax.jit`, `lax.switch`,
`lax.while_loop`, ...), so that every value stays structured through the body. Loop
carries and branch outputs whose type changes are joined: the differing parts are
materialised (the family may refuse, giving an error that names the carry) and the
body re-traced, until the types are stable.
"""

import contextlib
import functools as ft
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.extend.core import primitives as _prims

from ._compat import (
    AdZero,
    ClosedJaxpr,
    FlatTree,
    Jaxpr,
    Primitive,
    SymbolicZero,
    Tracer,
    TraceTag,
    bind_custom_jvp,
    bind_custom_vjp,
    body_arg_names,
    body_source,
    bwd_result,
    bwd_split,
    call_fresh,
    callback_module,
    cond_p,
    debug_callback_p,
    debug_print_p,
    eval_jaxpr_folding,
    io_callback_p,
    is_unspecified,
    jit_p,
    known_constant,
    linear_solve_p,
    optimization_barrier_p,
    pure_callback_p,
    pvary_to_spec,
    remat_p,
    run_debug_on_host,
    scan_counts,
    scan_p,
    set_current_trace,
    staging,
    take_current_trace,
    typeof,
    while_p,
    wrap_init,
)
from ._registry import fallback_rule, register
from ._values import Value, ValueLike, is_value


__all__ = [
    "HIGHER_ORDER",
    "JoinError",
    "custom_jvp_call",
    "custom_vjp_call",
    "shard_map_call",
]


class JoinError(TypeError):
    """A loop carry or branch output changes type and cannot be joined."""


# Evaluating a jaxpr on values ---------------------------------------------------------

_eval_cache: "weakref.WeakKeyDictionary[Any, Callable[..., list[Any]]]" = (
    weakref.WeakKeyDictionary()
)


def _quaxified(jaxpr: Any) -> Callable[..., list[Any]]:
    """A quaxified function evaluating `jaxpr` (closed or open), cached per jaxpr so
    that JAX's own tracing caches hit when the same jaxpr comes back."""
    try:
        return _eval_cache[jaxpr]
    except (KeyError, TypeError):
        pass
    from ._quaxify import quaxify

    if isinstance(jaxpr, ClosedJaxpr):
        fn = ft.partial(eval_quaxified, jaxpr.jaxpr, jaxpr.consts)
    else:
        fn = ft.partial(eval_quaxified, jaxpr, ())
    out = quaxify(fn)
    with contextlib.suppress(TypeError):  # unhashable jaxprs are not cached
        _eval_cache[jaxpr] = out
    return out


# Equations on constants only, with outputs this small, are computed at trace time.
_FOLD_MAX_SIZE = 1024


_TRACED = (Value, Tracer)


def _is_constant(x: Any) -> bool:
    return not isinstance(x, _TRACED)


def _foldable(
    primitive: Primitive, inputs: Sequence[Any], params: dict[str, Any]
) -> bool:
    """Whether to compute an equation of a jaxpr now: its inputs are all constants
    and it calls no sub-jaxpr and no host callback. Otherwise under an enclosing
    `jit` the constants a jaxpr computes (`convert_element_type(1.5)`, a `full` of
    NaNs) would reach the rules as tracers, whereas the Python program gave them as
    numbers."""
    return (
        primitive not in _CALLBACKS
        and all(map(_is_constant, inputs))
        and not any(isinstance(p, ClosedJaxpr | Jaxpr) for p in params.values())
    )


# Host code runs when the program does, never at trace time (`eqx.error_if`'s error
# branch raises from a `pure_callback` on constant inputs).
_CALLBACKS = frozenset(
    {pure_callback_p, io_callback_p, debug_callback_p, debug_print_p}
)


def eval_quaxified(jaxpr: Any, consts: Sequence[Any], *args: Any) -> list[Any]:
    """Evaluate `jaxpr` at the current trace, computing equations on small constants
    now (see `_foldable`). Under a quax trace, every equation is dispatched."""
    return eval_jaxpr_folding(
        jaxpr, consts, *args, fold=_foldable, max_size=_FOLD_MAX_SIZE
    )


def _structure(tree: Any) -> Any:
    """What must agree between loop iterations or branches: the pytree structure
    (value types and static metadata included) and each leaf's shape and dtype."""
    leaves, treedef = jtu.tree_flatten(tree)
    return treedef, tuple((np.shape(x), jnp.result_type(x)) for x in leaves)


def _skeleton(x: Any) -> Any:
    """`x` with every leaf a `jax.ShapeDtypeStruct`: its type and static metadata,
    without the (possibly traced) arrays, so it may outlive the trace it came from."""
    return jtu.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf)), x
    )


def _describe(x: Any) -> str:
    if isinstance(x, Value):
        return f"{type(x).__qualname__} {x.aval().str_short()}"
    if isinstance(x, jax.ShapeDtypeStruct):
        return f"array {x.dtype.name}{list(x.shape)}"
    return f"array {typeof(x).str_short()}"


def _materialise(x: Any, where: str) -> Any:
    if not isinstance(x, Value):
        return x
    try:
        return x.materialise()
    except Exception as e:
        raise JoinError(
            f"{where}: its type changes, so quax must join the types by materialising "
            f"the {_describe(x)}, and that failed: {e}\nKeep the type stable in the "
            "body (return the same kind of value it receives), give the type a `lift` "
            "classmethod that turns the plain array into one, allow the value to "
            "materialise, or register a rule for the primitive."
        ) from e


def _lift(x: Any, like: Any) -> Any:
    """The plain array `x` as a value of `like`'s type, when the type says how.

    Calls the value type's `quax.Value.lift` (see there), also with the known value
    of a tracer that JAX built from a constant.

    **Returns:**

    The lifted value, or `None` when the type's `lift` declines or returns a
    value of another structure than `like`.
    """
    if isinstance(x, _Fill):
        x = x.materialise()
    if isinstance(x, Value):
        return None
    lift = type(like).lift
    out = lift(x, like)
    if out is None:
        # Under `jit`, a constant JAX made (the zero a reverse-mode loop starts its
        # cotangent carry with) is a tracer: offer the type its known value.
        known = known_constant(x, _FOLD_MAX_SIZE)
        out = None if known is None else lift(known, like)
    if out is None and _raised_by_equinox(x):
        out = _lift_fill(x, _Fill(np.nan, *_shape_dtype(x)), like, keep=True)
    if out is None or _structure(out) != _structure(like):
        return None
    return out


def _raised_by_equinox(x: Any) -> bool:
    """Whether `x` is the output of `eqx.error_if`'s error branch: a host callback
    that raises (or, on TPU, returns NaNs). Equinox builds that output from the
    guarded value's shape alone (equinox issue 1257), so it is plain where the other
    branch returns the value; quax joins it as a NaN fill of the value's type."""
    module = callback_module(x)
    return module is not None and module.split(".")[0] == "equinox"


def _shape_dtype(x: Any) -> tuple[tuple[int, ...], Any]:
    return np.shape(x), jnp.result_type(x)


class _Join:
    """The joins decided so far for a function whose outputs must have the types of
    its inputs (a loop body, a linear operator) or of each other (branches).

    At a position whose types differ, quax tries, in order: lifting a plain input to
    the output's value type (`_lift`), lifting a plain output to the input's (or the
    other branches') value type in the body, and materialising both sides. Each step
    is taken once per position, so the joins settle after a few re-traces.
    """

    def __init__(self, where: Callable[[int], str]) -> None:
        self.where = where
        self.dense: set[int] = set()
        self.lift_out: dict[int, Any] = {}

    def outputs(self, out: Sequence[Any]) -> list[Any]:
        """The body's outputs with the joins applied (inside the body's trace)."""
        out = list(out)
        for i, like in self.lift_out.items():
            lifted = _lift(out[i], like)
            if lifted is not None:
                out[i] = lifted
        return _materialise_at(out, self.dense, self.where)

    def inputs(self, xs: Sequence[Any]) -> list[Any]:
        return _materialise_at(xs, self.dense, self.where)

    def update(self, xs: list[Any], outs: Sequence[Any]) -> bool:
        """Join the inputs `xs` (updated in place) with the skeletons `outs` of what
        the body returned for them. Whether anything changed."""
        changed = False
        for i, (x, o) in enumerate(zip(xs, outs, strict=True)):
            if i in self.dense or _structure(x) == _structure(o):
                continue
            lifted = _lift(x, o) if isinstance(o, Value) else None
            if lifted is not None:
                xs[i] = lifted
            elif (
                isinstance(x, Value)
                and not isinstance(o, Value)
                and (i not in self.lift_out)
            ):
                self.lift_out[i] = _skeleton(x)
            else:
                self.dense.add(i)
            changed = True
        return changed

    def update_branches(self, outs: Sequence[Sequence[Any]]) -> bool:
        """Join the skeletons `outs[k]` of each branch's outputs with each other.
        Whether anything changed."""
        changed = False
        for i, column in enumerate(zip(*outs, strict=True)):
            if i in self.dense or len({_structure(o) for o in column}) == 1:
                continue
            values = {_structure(o): o for o in column if isinstance(o, Value)}
            if len(values) == 1 and i not in self.lift_out:
                (self.lift_out[i],) = values.values()
            else:
                self.dense.add(i)
            changed = True
        return changed


def _materialise_at(
    xs: Sequence[Any], indices: set[int], where: Callable[[int], str]
) -> list[Any]:
    return [_materialise(x, where(i)) if i in indices else x for i, x in enumerate(xs)]


def _carry_names(jaxpr: Any, first: int, what: str) -> Callable[[int], str]:
    """How an error names loop carry `i` (JAX's numbering): by the body's argument as
    the user wrote it (`c[0]`), and where the body is defined, when JAX recorded it."""
    names = body_arg_names(jaxpr)
    source = body_source(jaxpr)

    def where(i: int) -> str:
        name = names[first + i] if names and first + i < len(names) else ""
        if not name:
            return (
                f"carry {i} of a {what} (counted over JAX's loop state, which for a "
                "fori_loop starts with the counter)"
            )
        at = f" (body {source})" if source else ""
        return f"loop carry `{name}` of a {what}{at}"

    return where


# jit ----------------------------------------------------------------------------------


@register(jit_p)
def _jit(
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
    # An inlined `jit` never reaches this rule (`QuaxTrace` binds its equations), so
    # the call is kept.
    del inline, out_shardings  # outputs' types are only known after tracing the body
    # Plain arguments known now (Python and NumPy scalars, concrete arrays) stay
    # constants of the body, as they would be without the `jit`: rules may need
    # their values (an exponent, a constant of NaNs).
    known = [not is_value(a) and not isinstance(a, Tracer) for a in args]
    dynamic = [i for i, k in enumerate(known) if not k]
    key = (
        name,
        tuple(j for j, i in enumerate(dynamic) if donated_invars[i]),
        keep_unused,
        tuple(
            None if is_unspecified(s) or is_value(a) else s
            for s, a, k in zip(in_shardings, args, known, strict=True)
            if not k
        ),
        tuple(_ConstKey(a) if k else None for a, k in zip(args, known, strict=True)),
    )
    return _jitted(jaxpr, key)(*[args[i] for i in dynamic])


class _ConstKey:
    """A constant argument of a nested `jit` as part of a cache key: equal to another
    for the same object, or for an equal small array of the same type."""

    __slots__ = ("aval", "data", "value")

    def __init__(self, value: Any) -> None:
        self.value = value  # kept alive, so that its `id` is not reused
        self.aval = typeof(value)
        array = np.asarray(value)
        self.data = array.tobytes() if array.size <= 64 else id(value)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _ConstKey)
            and self.aval == other.aval
            and self.data == other.data
        )

    def __hash__(self) -> int:
        return hash((self.aval, self.data))


_jit_cache: "weakref.WeakKeyDictionary[Any, dict[Any, Callable[..., Any]]]" = (
    weakref.WeakKeyDictionary()
)


def _jitted(jaxpr: Any, key: tuple[Any, ...]) -> Callable[..., Any]:
    """`jax.jit` of the quaxified `jaxpr`, with the constants in `key` closed over,
    cached so that JAX's own cache hits when the same nested `jit` comes back."""
    per_jaxpr = _jit_cache.setdefault(jaxpr, {})
    try:
        return per_jaxpr[key]
    except KeyError:
        pass
    name, donate, keep_unused, shardings, consts = key
    fn = _quaxified(jaxpr)

    def body(*dynamic: Any) -> Any:
        it = iter(dynamic)
        return fn(*[next(it) if c is None else c.value for c in consts])

    body.__name__ = body.__qualname__ = name
    kwargs: dict[str, Any] = {}
    if not all(s is None for s in shardings):
        kwargs["in_shardings"] = shardings
    out = jax.jit(body, donate_argnums=donate, keep_unused=keep_unused, **kwargs)
    per_jaxpr[key] = out
    return out


# cond / switch ------------------------------------------------------------------------


@register(cond_p)
def _cond(
    index: ValueLike, *ops: ValueLike, branches: Sequence[Any], **params: Any
) -> list[Any]:
    del params
    if isinstance(index, Value):
        index = index.materialise()
    fns = [_quaxified(b) for b in branches]
    join = _Join(lambda i: f"output {i} of a cond/switch")
    for _ in range(2 * len(branches[0].out_avals) + 1):
        seen: list[Any] = []

        def branch(fn: Callable[..., Any], *operands: Any) -> Any:
            out = join.outputs(fn(*operands))
            seen.append([_skeleton(o) for o in out])  # noqa: B023
            return out

        try:
            return lax.switch(index, [ft.partial(branch, fn) for fn in fns], *ops)
        except TypeError:
            if len(seen) == len(fns) and join.update_branches(seen):
                continue
            chosen = _known_index(index)
            if chosen is None:
                raise
        # The branches' types do not join, but the branch is a constant of the
        # program (`lax.cond(True, ...)` under `jit`, as a solver writes for a
        # static option): only it ever runs, so its outputs are the cond's.
        return _as_cond_outputs(fns[chosen](*ops), branches)
    raise AssertionError("unreachable")


def _known_index(index: Any) -> int | None:
    """The branch index of a `cond` when it is a constant of a staged program (a
    literal, or a constant under `jit`), else `None`. In eager mode the index is a
    run-time value: with another one the other branch would run, so the branches
    must still join."""
    if isinstance(index, Tracer):
        known = known_constant(index, 1)
    elif staging():
        known = np.asarray(index)
    else:
        return None
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


# while / fori -------------------------------------------------------------------------


@register(while_p)
def _while(
    *args: ValueLike,
    cond_jaxpr: Any,
    body_jaxpr: Any,
    cond_nconsts: int,
    body_nconsts: int,
) -> list[Any]:
    cond_consts = args[:cond_nconsts]
    body_consts = args[cond_nconsts : cond_nconsts + body_nconsts]
    carry = list(args[cond_nconsts + body_nconsts :])
    cond_fn = _quaxified(cond_jaxpr)
    body_fn = _quaxified(body_jaxpr)
    fori = (body_source(cond_jaxpr) or "").startswith("_fori_cond_fun")
    what = "fori_loop" if fori else "while_loop"

    def cond(c: list[Any]) -> Any:
        (pred,) = cond_fn(*cond_consts, *c)
        return pred.materialise() if isinstance(pred, Value) else pred

    return _stable_loop(
        carry,
        lambda c: body_fn(*body_consts, *c),
        lambda body, c: lax.while_loop(cond, body, c),
        _carry_names(body_jaxpr, body_nconsts, what),
    )


def _stable_loop(
    carry: list[Any],
    body: Callable[[list[Any]], list[Any]],
    run: Callable[[Callable[[list[Any]], list[Any]], list[Any]], Any],
    where: Callable[[int], str],
    num_carry: int | None = None,
    xs: Sequence[Any] = (),
) -> Any:
    """Run a loop whose body maps `carry` (and, for scan, one slice of each of `xs`)
    to a new carry (and, for scan, outputs after the first `num_carry`), joining
    carry types until they are stable."""
    n = len(carry) if num_carry is None else num_carry
    join = _Join(where)
    for _ in range(3 * n + 1):
        seen: list[list[Any]] = []
        # Whether the body failed; and whether to catch that, letting the loop's
        # trace end normally (a trace left by an exception keeps the tracers it
        # closed over alive, which the leak checker reports once quax recovers).
        failed, catch = [False], [True]

        def stable_body(c: list[Any]) -> list[Any]:
            if catch[0]:  # noqa: B023
                try:
                    with _Catching():
                        out = list(body(c))
                        out[:n] = join.outputs(out[:n])
                except Exception:
                    failed[0] = True  # noqa: B023
                    return list(c)
            else:
                out = list(body(c))
                out[:n] = join.outputs(out[:n])
            seen.append([_skeleton(o) for o in out[:n]])  # noqa: B023
            return out

        carry = join.inputs(carry)
        try:
            result = run(stable_body, carry)
        except TypeError:  # the body ran, and its outputs disagree with the carry
            if not seen or not join.update(carry, seen[-1]):
                raise
            continue
        if not failed[0]:
            return result
        # The body failed, perhaps on a plain carry that starts as a constant fill.
        if not _join_fills(carry, body, n, xs):
            if _Catching.depth:
                # Inside a body that an enclosing loop is trying: let it retry.
                raise _BodyFailed
            # Raise the body's error. A new function, so that JAX's tracing cache
            # cannot answer with the stand-in body traced above.
            catch[0] = False
            return run(lambda c: stable_body(c), carry)
    raise AssertionError("unreachable")


class _BodyFailed(Exception):
    """A nested loop's body failed inside a body that quax is trying."""


class _Catching:
    """Counts the loop bodies being tried (their errors caught). A nested loop
    whose body fails there only signals it: re-tracing its body to raise the error
    would leave a trace holding the enclosing body's tracers."""

    depth = 0

    def __enter__(self) -> None:
        type(self).depth += 1

    def __exit__(self, *exc: object) -> None:
        type(self).depth -= 1


# A loop carry that starts as a plain constant fill (the zeros or NaNs a solver
# writes its results into) and is then given values: its type is known only once
# the body has run, and the body may fail on the plain array (a unit error on
# `buffer.at[i].set(quantity)`). Quax then traces the first iteration abstractly,
# with such carries as `_Fill`s that take the type of whatever value they meet, and
# lifts the carries' starts into the types found.


class _Fill(Value):
    """A plain array whose every element is `fill`, standing for a loop carry's
    constant start while quax finds the carry's type. It holds no array, so it stays
    static (known) through tracing."""

    fill: Any = eqx.field(static=True)
    shape: tuple[int, ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)

    # Settle this type's inputs before any other type's `default` (see
    # `quax._registry`): it only stands in for a plain array.
    settles_first: ClassVar[bool] = True

    @classmethod
    def of(cls, x: Any) -> "_Fill | None":
        """`x` as a `_Fill`, when it is a plain array known to be a constant fill."""
        if isinstance(x, Value):
            return None
        aval = typeof(x)
        known = (
            known_constant(x, _FILL_MAX_SIZE)
            if isinstance(x, Tracer)
            else np.asarray(x, aval.dtype)
        )
        if known is None or known.size == 0:
            return None
        first = known.flat[0]
        same = known == first
        if np.issubdtype(known.dtype, np.inexact):
            same |= np.isnan(known) & np.isnan(first)
        if not np.all(same):
            return None
        return cls(first.item(), aval.shape, aval.dtype)

    @property
    def key(self) -> tuple[Any, ...]:
        """Equal for fills of the same array (NaN included)."""
        return repr(self.fill), self.shape, self.dtype

    def aval(self) -> Any:
        return jax.core.ShapedArray(self.shape, self.dtype)

    def materialise(self) -> Any:
        with jax.ensure_compile_time_eval():  # a known array, also inside a trace
            return jnp.full(self.shape, self.fill, self.dtype)

    @staticmethod
    def default(
        primitive: Primitive, values: Sequence[Any], params: dict[str, Any]
    ) -> Any:
        """Compute on the known arrays where every input is known; else bind on the
        plain arrays (a family may accept a known constant of zeros or NaNs, as
        quax-units does); where that fails, lift fills to the other inputs' types."""
        from ._quaxify import quaxify

        cases = values[1:]
        if primitive is lax.select_n_p and all(
            isinstance(c, _Fill) and c.key == cases[0].key for c in cases
        ):
            return cases[0]  # the same fill whichever case is selected
        dense = [v.materialise() if isinstance(v, _Fill) else v for v in values]
        if not any(isinstance(v, Value | Tracer) for v in dense):
            with jax.ensure_compile_time_eval():
                out = primitive.bind(*dense, **params)
            if primitive.multiple_results:
                return [_Fill.of(o) or o for o in out]
            return _Fill.of(out) or out
        bind = quaxify(lambda *vs: primitive.bind(*vs, **params))
        if primitive in _ANNIHILATED and any(
            isinstance(v, _Fill) and v.fill == 0 for v in values
        ):
            # Products with zeros are zeros: what the body's types may hinge on
            # (`dt * f0` with `f0` zeros is added to a quantity). Only types are
            # taken from this trace, so the zero need not hold for a NaN factor.
            out = bind(*dense)
            if not isinstance(out, Value):
                return _Fill(0, out.shape, out.dtype)
            return out
        try:
            return bind(*dense)
        except Exception as e:
            error = e
        fills = [i for i, v in enumerate(values) if isinstance(v, _Fill)]
        likes = [v for v in values if isinstance(v, Value) and not isinstance(v, _Fill)]
        for like in likes:
            for chosen in [*([i] for i in fills), fills]:
                lifted = list(dense)
                for i in chosen:
                    lifted[i] = _lift_fill(dense[i], values[i], _skeleton(like))
                if any(v is None for v in lifted):
                    continue
                with contextlib.suppress(Exception):
                    return bind(*lifted)
        raise error


# Primitives whose output is zero when an input is.
_ANNIHILATED = frozenset({lax.mul_p, lax.dot_general_p})

# Largest carry recognised as a constant fill (the known value is a broadcast view).
_FILL_MAX_SIZE = 2**26


def _lift_fill(x: Any, fill: _Fill, like: Any, keep: bool = False) -> Any:
    """The plain array `x`, known to equal `fill`, lifted to `like`'s type (of any
    shape), or `None` when the type declines, or when `keep` and the lifted value
    does not hold `x` itself."""
    dense = fill.materialise()
    out = type(like).lift(dense, like)
    if not isinstance(out, Value) or out.aval().shape != fill.shape:
        return None
    # Keep `x` itself (traced, cheap; and what computes it stays in the program)
    # where the type stored the array unchanged, rather than a constant.
    leaves, treedef = jtu.tree_flatten(out)
    if keep and not any(leaf is dense for leaf in leaves):
        return None
    kept = [x if leaf is dense else leaf for leaf in leaves]
    return jtu.tree_unflatten(treedef, kept)


def _join_fills(
    carry: list[Any],
    body: Callable[[list[Any]], list[Any]],
    n: int,
    xs: Sequence[Any],
) -> bool:
    """After the body failed on `carry`: trace its first iteration abstractly with
    the plain constant-fill carries as `_Fill`s, and lift those carries (updated in
    place) to the value types the body gives them. Whether anything changed."""
    fills = {i: f for i, x in enumerate(carry) if (f := _Fill.of(x)) is not None}
    if not fills:
        return False
    trial = [fills.get(i, x) for i, x in enumerate(carry)]

    def first(c: list[Any], xs: Sequence[Any]) -> list[Any] | None:
        try:
            with _Catching():
                step = [jtu.tree_map(lambda leaf: leaf[0], x) for x in xs]
                return list(body([*c, *step]))[:n]
        except Exception:  # caught inside, so that the trace ends normally
            return None

    found = jax.eval_shape(first, trial, list(xs))
    if found is None:
        return False
    changed = False
    for i, fill in fills.items():
        like = found[i]
        if not isinstance(like, Value) or isinstance(like, _Fill):
            continue
        lifted = _lift_fill(carry[i], fill, like)
        if lifted is not None and _structure(lifted) == _structure(like):
            carry[i] = lifted
            changed = True
    return changed


# scan / map / fori_loop ---------------------------------------------------------------


@register(scan_p)
def _scan(
    *args: ValueLike,
    jaxpr: Any,
    length: int,
    reverse: bool,
    unroll: Any,
    **params: Any,
) -> list[Any]:
    num_consts, num_carry = scan_counts(params)
    consts = args[:num_consts]
    carry = list(args[num_consts : num_consts + num_carry])
    xs = [
        x if _slices_leafwise(x, length) else _materialise(x, f"scanned-over input {i}")
        for i, x in enumerate(args[num_consts + num_carry :])
    ]
    body_fn = _quaxified(jaxpr)
    # Outputs stacked leafwise must still describe the stacked value; those that
    # would not are materialised in the body.
    dense_ys: set[int] = set()
    step_shapes: dict[int, tuple[int, ...]] = {}

    def body(c: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        out = body_fn(*consts, *c, *x)
        ys = [
            _materialise(y, f"scan output {i}") if i in dense_ys else y
            for i, y in enumerate(out[num_carry:])
        ]
        step_shapes.update(
            (i, y.aval().shape) for i, y in enumerate(ys) if isinstance(y, Value)
        )
        return list(out[:num_carry]), ys

    def run(stable_body: Callable[[list[Any]], list[Any]], c: list[Any]) -> Any:
        def step(c: list[Any], x: list[Any]) -> Any:
            out = stable_body([*c, *x])
            return out[:num_carry], out[num_carry:]

        return lax.scan(step, c, xs, length=length, reverse=reverse, unroll=unroll)

    for _ in range(2):
        carry_out, ys = _stable_loop(
            carry,
            lambda cx: _flat_body(body, cx, num_carry),
            run,
            _carry_names(jaxpr, num_consts, "scan" if xs else "scan or fori_loop"),
            num_carry=num_carry,
            xs=xs,
        )
        bad = {
            i
            for i, y in enumerate(ys)
            if isinstance(y, Value) and y.aval().shape != (length, *step_shapes[i])
        }
        if not bad:
            return [*carry_out, *ys]
        dense_ys |= bad
    raise AssertionError("unreachable")


def _flat_body(body: Callable[..., Any], cx: list[Any], num_carry: int) -> list[Any]:
    c, ys = body(cx[:num_carry], cx[num_carry:])
    return [*c, *ys]


def _slices_leafwise(x: Any, length: int) -> bool:
    """Whether scanning `x` leaf by leaf gives the slices of the value it represents."""
    if not isinstance(x, Value):
        return True
    leaves = jtu.tree_leaves(x)
    if not all(np.ndim(leaf) >= 1 and np.shape(leaf)[0] == length for leaf in leaves):
        return False
    sliced = jax.eval_shape(lambda v: jtu.tree_map(lambda leaf: leaf[0], v), x)
    expected = x.aval()
    got = sliced.aval()
    return got.shape == expected.shape[1:] and got.dtype == expected.dtype


# checkpoint ---------------------------------------------------------------------------


@register(remat_p)
def _remat(
    *args: ValueLike, jaxpr: Any, prevent_cse: bool, policy: Any, **params: Any
) -> list[Any]:
    del params
    return jax.checkpoint(_quaxified(jaxpr), prevent_cse=prevent_cse, policy=policy)(
        *args
    )


# custom_linear_solve ------------------------------------------------------------------


@register(linear_solve_p)
def _linear_solve(*args: ValueLike, const_lengths: Any, jaxprs: Any) -> list[Any]:
    ends = np.cumsum(list(const_lengths))
    starts = ends - np.asarray(list(const_lengths))
    matvec_c, _vecmat_c, solve_c, tr_solve_c = (
        args[s:e] for s, e in zip(starts, ends, strict=True)
    )
    b = list(args[int(ends[-1]) :])
    num_aux = len(jaxprs.solve.out_avals) - len(jaxprs.matvec.out_avals)
    # `matvec`, `solve` and `transpose_solve` all map vectors of `b`'s types to
    # vectors of `b`'s types: join those like a loop's carry.
    join = _Join(lambda i: f"leaf {i} of the right-hand side of a custom_linear_solve")
    seen: list[list[Any]] = []

    def joined(out: Sequence[Any]) -> list[Any]:
        out = join.outputs(out)
        seen.append([_skeleton(o) for o in out])
        return out

    def call(jaxpr: Any, consts: Sequence[Any]) -> Callable[..., Any]:
        fn = _quaxified(jaxpr)

        def f(_: Any, x: list[Any]) -> Any:
            out = fn(*consts, *x)
            if num_aux:
                return joined(out[: len(b)]), out[len(b) :]
            return joined(out)

        return f

    def matvec(x: list[Any]) -> list[Any]:
        return joined(_quaxified(jaxprs.matvec)(*matvec_c, *x))

    symmetric = jaxprs.vecmat is jaxprs.matvec
    transpose_solve = (
        None
        if jaxprs.transpose_solve is None
        else call(jaxprs.transpose_solve, tr_solve_c)
    )
    for _ in range(3 * len(b) + 1):
        seen.clear()
        b = join.inputs(b)
        try:
            out = lax.custom_linear_solve(
                matvec,
                b,
                call(jaxprs.solve, solve_c),
                transpose_solve,
                symmetric=symmetric,
                has_aux=bool(num_aux),
            )
        except TypeError:
            if not seen or not join.update(b, seen[-1]):
                raise
            continue
        if num_aux:
            x, aux = out
            return [*x, *aux]
        return list(out)
    raise AssertionError("unreachable")


# callbacks ----------------------------------------------------------------------------


@register(pure_callback_p)
def _pure_callback(*args: ValueLike, **params: Any) -> Any:
    # The callback is host code written for arrays: it gets the dense arrays,
    # materialised at trace time so that a value that refuses says so now.
    dense = [_materialise_for(pure_callback_p, x) for x in args]
    return pure_callback_p.bind(*dense, **params)


def _materialise_for(primitive: Primitive, x: Any) -> Any:
    if not isinstance(x, Value):
        return x
    try:
        return x.materialise()
    except Exception as e:
        raise TypeError(
            f"`{primitive.name}` hands its inputs to host code as dense arrays, "
            "so quax "
            f"must materialise the {_describe(x)}, and that failed: {e}"
        ) from e


def _host_view(x: Any) -> Any:
    """How a value is shown to a debug callback: dense if it allows it, else itself
    (with its leaves on the host)."""
    if not isinstance(x, Value):
        return x
    try:
        return np.asarray(x.materialise())
    except Exception:
        return x


def _on_host(
    primitive: Primitive, args: Sequence[Any], params: dict[str, Any]
) -> list[Any]:
    """Run a debug primitive with its values rebuilt on the host, never densified on
    the device: the values' leaves travel, and the host shows them."""
    leaves, treedef = jtu.tree_flatten(list(args))

    def host(*host_leaves: Any) -> None:
        views = [_host_view(v) for v in jtu.tree_unflatten(treedef, host_leaves)]
        run_debug_on_host(primitive, views, params)

    jax.debug.callback(host, *leaves, ordered=bool(params.get("ordered", False)))
    return []


@register(debug_callback_p)
def _debug_callback(*args: ValueLike, **params: Any) -> list[Any]:
    return _on_host(debug_callback_p, args, params)


@register(debug_print_p)
def _debug_print(*args: ValueLike, **params: Any) -> list[Any]:
    return _on_host(debug_print_p, args, params)


# Primitives that act on every leaf alike ----------------------------------------------


def _leafwise(primitive: Primitive) -> None:
    @register(primitive)
    def _(x: Value, **params: Any) -> Value:
        return jtu.tree_map(lambda leaf: primitive.bind(leaf, **params), x)


for _p in (_prims.stop_gradient_p, _prims.copy_p):
    _leafwise(_p)


@register(optimization_barrier_p)
def _optimization_barrier(*args: ValueLike) -> list[Any]:
    leaves, treedef = jtu.tree_flatten(list(args))
    return jtu.tree_unflatten(treedef, lax.optimization_barrier(leaves))


@register(_prims.select_n_p)
def _select_n(which: ValueLike, *cases: ValueLike) -> Any:
    # With a scalar predicate, choosing between values of one structure is choosing
    # leaf by leaf; anything else goes to the types' own rules or fallback.
    if (
        not isinstance(which, Value)
        and np.ndim(which) == 0
        and all(isinstance(c, Value) for c in cases)
        and len({_structure(c) for c in cases}) == 1
    ):
        return jtu.tree_map(lambda *leaves: lax.select_n(which, *leaves), *cases)
    return fallback_rule(_prims.select_n_p, [which, *cases])([which, *cases], {})


HIGHER_ORDER = frozenset({jit_p, cond_p, while_p, scan_p, remat_p, linear_solve_p})


# custom_jvp / custom_vjp --------------------------------------------------------------
#
# Like `BatchTrace`, quax re-binds a custom-derivative call at the parent trace, over
# the leaves of the values, so that the custom rule still applies to whatever
# differentiates the program later. The rule then sees the values themselves, with
# tangents (cotangents) of the same type built from the leaves' tangents: that is
# exact when the represented array is a linear function of the leaves, which a type
# declares with the class attribute `linear_in_leaves = True` (a dense wrapper, a
# sparse array's data, a symbolic zero). Values of other types enter the call
# materialised, so the custom rule sees the dense array it was written for.


def _linear(x: Any) -> bool:
    return isinstance(x, Value) and type(x).linear_in_leaves


def _densify_nonlinear(x: Any, primitive: Primitive) -> Any:
    if not isinstance(x, Value) or _linear(x):
        return x
    try:
        return x.materialise()
    except Exception as e:
        raise TypeError(
            f"`{primitive.name}` (a function with a custom derivative) received or "
            f"returned a {_describe(x)}. Its custom rule is written for dense arrays, "
            f"and `{type(x).__qualname__}` does not declare `linear_in_leaves = True` "
            "(its array is not a linear function of its leaves), so quax must "
            f"materialise it, and that failed: {e}\nAllow the value to materialise, or "
            "declare `linear_in_leaves = True` on the type if it is linear."
        ) from e


def _is_float(leaf: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def _tangent_aval(leaf: Any) -> Any:
    return typeof(leaf).to_tangent_aval()


def _is_zero(t: Any) -> bool:
    return isinstance(t, SymbolicZero | AdZero)


def _tangent_value(primal: Any, leaves: Sequence[Any], symbolic: bool) -> Any:
    """The tangent of `primal` (a value) from its leaves' tangents: the same type,
    with the primal's integer leaves, or a `SymbolicZero` when every leaf's is."""
    primal_leaves, treedef = jtu.tree_flatten(primal)
    if symbolic and all(
        _is_zero(t) for p, t in zip(primal_leaves, leaves, strict=True) if _is_float(p)
    ):
        return SymbolicZero(primal.aval().to_tangent_aval())
    tangent = [
        (jnp.zeros(t.shape, t.dtype) if _is_zero(t) else t) if _is_float(p) else p
        for p, t in zip(primal_leaves, leaves, strict=True)
    ]
    return jtu.tree_unflatten(treedef, tangent)


def _leaf_tangents(primal: Any, tangent: Any, symbolic: bool) -> list[Any] | None:
    """The leaves' tangents of `primal` (a linear value) represented by `tangent`, or
    `None` when `tangent` has another structure."""
    primal_leaves, treedef = jtu.tree_flatten(primal)
    zero = (
        (lambda p: SymbolicZero(_tangent_aval(p)))
        if symbolic
        else (lambda p: AdZero(_tangent_aval(p)))
    )
    if _is_zero(tangent):
        return [zero(p) for p in primal_leaves]
    if type(tangent) is not type(primal):
        return None
    tangent_leaves, tangent_treedef = jtu.tree_flatten(tangent)
    if tangent_treedef != treedef:
        return None
    return [
        t if _is_float(p) else zero(p)
        for p, t in zip(primal_leaves, tangent_leaves, strict=True)
    ]


def _run(fun: Any, *values: Any) -> list[Any]:
    """Call a `lu.WrappedFun` on values, under a fresh quax trace."""
    from ._quaxify import quaxify

    return list(quaxify(lambda *v: call_fresh(fun, *v))(*values))


class _Flat:
    """How values flatten to leaves, input by input. It keeps no leaf, so closures
    holding it (which JAX may cache) leak no tracer."""

    def __init__(self, values: Sequence[Any]) -> None:
        flat = [jtu.tree_flatten(v) for v in values]
        self.treedefs = [t for _, t in flat]
        self.counts = [len(leaves) for leaves, _ in flat]

    def split(self, leaves: Sequence[Any]) -> list[list[Any]]:
        ends = np.cumsum(self.counts)
        return [list(leaves[e - n : e]) for n, e in zip(self.counts, ends, strict=True)]

    def unflatten(self, leaves: Sequence[Any]) -> list[Any]:
        return [
            jtu.tree_unflatten(t, part)
            for t, part in zip(self.treedefs, self.split(leaves), strict=True)
        ]


def _on_leaves(
    fun: Any,
    flat: _Flat,
    primitive: Primitive,
    out_tree: list[Any],
    known: Sequence[Any],
) -> Callable[..., list[Any]]:
    """`fun` as a function of the inputs' leaves, returning its outputs' leaves and
    recording their tree in `out_tree`. The leaves `known` now stay constants of it."""

    def fun_leaves(*leaves: Any) -> list[Any]:
        inputs = flat.unflatten(_with_known(leaves, known))
        outs = [_densify_nonlinear(o, primitive) for o in _run(fun, *inputs)]
        out_leaves, tree = jtu.tree_flatten(outs)
        out_tree[:] = [tree]
        return out_leaves

    return fun_leaves


def _leaves(values: Sequence[Any]) -> list[Any]:
    return jtu.tree_leaves(list(values))


def _known(leaves: Sequence[Any]) -> list[Any]:
    """Each leaf whose value is known now, else `None`: a leaf that is not traced,
    or a `_Fill` for a traced one that the trace shows to be a constant fill.

    Inside a custom derivative's primal function such leaves stay constants, as they
    are without the custom derivative (and as the `jit` rule keeps them): rules may
    need their values, and a loop inside may start a carry from one (the zeros or
    infinities a solver fills in), which quax lifts into a value type only when it
    is known."""
    return [_Fill.of(leaf) if isinstance(leaf, Tracer) else leaf for leaf in leaves]


def _with_known(leaves: Sequence[Any], known: Sequence[Any]) -> list[Any]:
    return [_known_or(x, k) for x, k in zip(leaves, known, strict=True)]


def _known_or(leaf: Any, known: Any) -> Any:
    if known is None:
        return leaf
    if isinstance(known, _Fill):
        # Rebuilt where it is used, as the broadcast of a constant that it is (cheap
        # at any size), rather than passed in as an unknown array.
        return jnp.full(known.shape, known.fill, known.dtype)
    return known


def custom_jvp_call(
    trace: Any,
    primitive: Primitive,
    fun: Any,
    jvp: Any,
    values: Sequence[Any],
    symbolic_zeros: bool,
) -> list[Any]:
    """`QuaxTrace.process_custom_jvp_call`: re-bind at the parent trace over leaves.

    **Arguments:**

    - `trace`: the quax trace; the call is bound at its parent.
    - `primitive`: `custom_jvp_call_p`.
    - `fun`, `jvp`: the function and its custom JVP, as `lu.WrappedFun`s.
    - `values`: the inputs, `Value`s or arrays.
    - `symbolic_zeros`: as for `jax.custom_jvp.defjvp`.

    **Returns:**

    The outputs, `Value`s or arrays.
    """
    with set_current_trace(trace.parent_trace):
        values = [_densify_nonlinear(v, primitive) for v in values]
    flat = _Flat(values)
    leaves = _leaves(values)
    n = len(leaves)
    out_tree: list[Any] = []

    fun_leaves = _on_leaves(fun, flat, primitive, out_tree, _known(_leaves(values)))

    def jvp_leaves(*args: Any) -> list[Any]:
        primals = flat.unflatten(args[:n])
        tangents = [
            _tangent_value(p, ts, symbolic_zeros) if isinstance(p, Value) else ts[0]
            for p, ts in zip(primals, flat.split(args[n:]), strict=True)
        ]
        outs = _run(jvp, *primals, *tangents)
        m = len(outs) // 2
        primal_out, tangent_out = [], []
        for p, t in zip(outs[:m], outs[m:], strict=True):
            p = _densify_nonlinear(p, primitive)
            leaf_ts = (
                _leaf_tangents(p, t, symbolic_zeros) if isinstance(p, Value) else None
            )
            if leaf_ts is None:
                # The tangent has another structure than the primal: go dense.
                p = _materialise(p, f"an output of `{primitive.name}`")
                leaf_ts = [_materialise(t, f"a tangent output of `{primitive.name}`")]
            primal_out.append(p)
            tangent_out.extend(leaf_ts)
        out_leaves, tree = jtu.tree_flatten(primal_out)
        out_tree[:] = [tree]
        return [*out_leaves, *tangent_out]

    out = bind_custom_jvp(
        trace.parent_trace,
        wrap_init(fun_leaves, fun.debug_info.with_unknown_names()),
        wrap_init(jvp_leaves, jvp.debug_info.with_unknown_names()),
        leaves,
        symbolic_zeros,
    )
    return jtu.tree_unflatten(out_tree[0], out)


def custom_vjp_call(
    trace: Any,
    primitive: Primitive,
    fun: Any,
    fwd: Any,
    bwd: Any,
    values: Sequence[Any],
    out_trees: Callable[[], Any],
    symbolic_zeros: bool,
) -> list[Any]:
    """`QuaxTrace.process_custom_vjp_call`: re-bind at the parent trace over leaves.

    **Arguments:**

    - `trace`: the quax trace; the call is bound at its parent.
    - `primitive`: `custom_vjp_call_p`.
    - `fun`, `fwd`, `bwd`: the function and its rules, as `lu.WrappedFun`s.
    - `values`: the inputs, `Value`s or arrays.
    - `out_trees`: JAX's thunk giving the trees `fwd` produced.
    - `symbolic_zeros`: as for `jax.custom_vjp.defvjp`.

    **Returns:**

    The outputs, `Value`s or arrays.
    """
    with set_current_trace(trace.parent_trace):
        values = [_densify_nonlinear(v, primitive) for v in values]
    flat = _Flat(values)
    out_tree: list[Any] = []
    fwd_trees: list[Any] = []

    known = _known(_leaves(values))
    fun_leaves = _on_leaves(fun, flat, primitive, out_tree, known)

    def fwd_leaves(*pairs: Any) -> list[Any]:
        inputs = flat.unflatten(_with_known(pairs[::2], known))
        nonzero = [any(part) for part in flat.split(pairs[1::2])]
        interleaved = [x for pair in zip(inputs, nonzero, strict=True) for x in pair]
        from ._quaxify import quaxify

        res_and_outs = list(quaxify(lambda *a: call_fresh(fwd, *a))(*interleaved))
        _, res_tree, input_fwds = out_trees()
        num_res = res_tree.num_leaves - sum(f is not None for f in input_fwds)
        fresh = iter(res_and_outs[:num_res])
        res = [next(fresh) if f is None else inputs[f] for f in input_fwds]
        outs = [_densify_nonlinear(o, primitive) for o in res_and_outs[num_res:]]
        # The residuals carry the inputs and outputs too: their integer leaves
        # rebuild the (co)tangents' structure in `bwd`.
        res_leaves, tree = jtu.tree_flatten((res, inputs, outs))
        out_leaves, otree = jtu.tree_flatten(outs)
        fwd_trees[:] = [tree]
        out_tree[:] = [otree]
        return [*res_leaves, *out_leaves]

    def leaf_out_trees() -> tuple[Any, Any, list[None]]:
        (tree,) = fwd_trees
        return out_tree[0], tree, [None] * tree.num_leaves

    def bwd_leaves(*args: Any) -> list[Any]:
        (tree,) = fwd_trees
        res, inputs, outs = jtu.tree_unflatten(tree, args[: tree.num_leaves])
        out_flat = _Flat(outs)
        cts = [
            _tangent_value(o, ts, symbolic_zeros) if isinstance(o, Value) else ts[0]
            for o, ts in zip(outs, out_flat.split(args[tree.num_leaves :]), strict=True)
        ]
        cts_in, logs = bwd_split(_run(bwd, *res, *cts))
        leaf_cts = [
            leaf
            for x, ct in zip(inputs, cts_in, strict=True)
            for leaf in _input_cotangents(x, ct, primitive)
        ]
        return bwd_result(leaf_cts, logs)

    out = bind_custom_vjp(
        trace.parent_trace,
        wrap_init(fun_leaves, fun.debug_info.with_unknown_names()),
        wrap_init(fwd_leaves, fwd.debug_info.with_unknown_names()),
        wrap_init(bwd_leaves, bwd.debug_info.with_unknown_names()),
        _leaves(values),
        leaf_out_trees,
        symbolic_zeros,
    )
    return jtu.tree_unflatten(out_tree[0], out)


def _input_cotangents(x: Any, ct: Any, primitive: Primitive) -> list[Any]:
    """The leaves' cotangents of the input `x` from the rule's cotangent `ct`."""
    if not isinstance(x, Value):
        return [_materialise(ct, f"a cotangent of `{primitive.name}`")]
    leaf_cts = _leaf_tangents(x, ct, symbolic=False)
    if leaf_cts is not None:
        return leaf_cts
    # A dense cotangent for a linear value: transpose `materialise` (the value is
    # linear in its float leaves, so this is the exact cotangent of the leaves).
    leaves, treedef = jtu.tree_flatten(x)
    floats = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]

    def dense_of(float_leaves: list[Any]) -> Any:
        full = list(leaves)
        for i, leaf in zip(floats, float_leaves, strict=True):
            full[i] = leaf
        return jtu.tree_unflatten(treedef, full).materialise()

    dense_ct = _materialise(ct, f"a cotangent of `{primitive.name}`")
    try:
        (float_cts,) = jax.linear_transpose(dense_of, [leaves[i] for i in floats])(
            dense_ct
        )
    except Exception as e:
        raise TypeError(
            f"The custom VJP of `{primitive.name}` returned a dense cotangent for a "
            f"{_describe(x)}; quax maps it onto the value's leaves by transposing "
            f"`{type(x).__qualname__}.materialise`, and that failed: {e}\nReturn a "
            f"cotangent of type `{type(x).__qualname__}` from the rule instead."
        ) from e
    out = [AdZero(_tangent_aval(leaf)) for leaf in leaves]
    for i, c in zip(floats, float_cts, strict=True):
        out[i] = c
    return out


# shard_map ----------------------------------------------------------------------------


def _leaf_spec(x: Any, leaf: Any, spec: Any) -> Any:
    """The `PartitionSpec` of one leaf of `x` when `x` is split by `spec`: the same
    spec for a leaf with the value's shape, replicated for a scalar leaf."""
    if np.shape(leaf) == x.aval().shape:
        return spec
    if np.ndim(leaf) == 0 or all(s is None for s in spec):
        return jax.sharding.PartitionSpec()
    raise TypeError(
        f"`shard_map` splits a {_describe(x)} by {spec}, but its leaf of shape "
        f"{np.shape(leaf)} does not have the value's shape, so quax cannot tell how to "
        "split it. Materialise the value before the `shard_map`, or pass it "
        "replicated (`P()`)."
    )


def shard_map_call(
    trace: Any,
    primitive: Primitive,
    fun: Any,
    values: Sequence[Any],
    params: dict[str, Any],
) -> Any:
    """`QuaxTrace.process_shard_map`: re-bind at the parent trace over leaves, each
    leaf split like the value it belongs to.

    **Arguments:**

    - `trace`: the quax trace; the call is bound at its parent.
    - `primitive`: `shard_map_p`.
    - `fun`: the body; it returns JAX's flat tree of outputs, with the out specs.
    - `values`: the inputs, `Value`s or arrays.
    - `params`: the primitive's other params (`mesh`, `in_specs`, ...).

    **Returns:**

    JAX's flat tree of the outputs (`Value`s or arrays), in the body's structure.
    """
    from ._trace import QuaxTrace

    flat = _Flat(values)
    in_specs = [
        _leaf_spec(v, leaf, spec) if isinstance(v, Value) else spec
        for v, spec, leaves in zip(
            values, params["in_specs"], flat.split(_leaves(values)), strict=True
        )
        for leaf in leaves
    ]
    out: dict[str, Any] = {}

    def body(*leaves: Any) -> Any:
        with take_current_trace() as parent:
            inner = QuaxTrace(parent, TraceTag())
            with set_current_trace(inner):
                ans_aux = fun(*[inner.wrap(v) for v in flat.unflatten(leaves)])
            ans, specs = ans_aux.unpack_aux()
            outs = [inner.to_value(o) for o in ans.vals]
        out["tree"] = ans.map(lambda _: None)
        out_flat = _Flat(outs)
        out["flat"] = out_flat
        out_leaves = _leaves(outs)
        out_specs = [
            _leaf_spec(o, leaf, spec) if isinstance(o, Value) else spec
            for o, spec, leaves in zip(
                outs, specs, out_flat.split(out_leaves), strict=True
            )
            for leaf in leaves
        ]
        if params["check_vma"]:
            # JAX made each output value vary along its out spec's axes; a value
            # varies where any of its leaves does, so some leaves may not yet.
            out_leaves = [
                pvary_to_spec(leaf, spec)
                for leaf, spec in zip(out_leaves, out_specs, strict=True)
            ]
        return FlatTree.flatten(out_leaves).with_aux(tuple(out_specs))

    new_params = dict(params, in_specs=tuple(in_specs))
    new_params["debug_info"] = params["debug_info"].with_unknown_names()
    with set_current_trace(trace.parent_trace):
        leaves_out = primitive.bind(*_leaves(values), subfuns=(body,), **new_params)
    outs = out["flat"].unflatten(list(leaves_out.vals))
    return out["tree"].update([trace.wrap(o) for o in outs])
