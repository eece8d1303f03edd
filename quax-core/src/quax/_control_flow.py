"""Rules for JAX's control-flow primitives: nested `jit`, `cond`/`switch`,
`while_loop`/`fori_loop`, `scan`, `checkpoint` and `custom_linear_solve`.

Each rule re-traces the primitive's inner jaxpr(s) under a fresh quax trace with the
values as inputs, and hands the result to JAX's public API (`jax.jit`, `lax.switch`,
`lax.while_loop`, ...), so that every value stays structured through the body. Loop
carries and branch outputs whose type changes are joined (see `_joins.py`): the
differing parts are lifted or materialised (the family may refuse, giving an error
that names the carry) and the body re-traced, until the types are stable.
"""

import contextlib
import functools as ft
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from . import _trace
from ._compat import (
    ClosedJaxpr,
    Tracer,
    body_source,
    cond_p,
    is_unspecified,
    jit_p,
    linear_solve_p,
    release_traces,
    remat_p,
    scan_counts,
    scan_p,
    staging,
    typeof,
    while_p,
)
from ._eager import ConstKey
from ._jaxpr import eval_quaxified, known_constant
from ._joins import (
    BodyFailed,
    Join,
    Rejoined,
    carry_names,
    catching,
    join_fills,
    join_until_stable,
    materialise_rhs,
    materialise_to_join,
    skeleton,
    trying,
)
from ._quaxify import quaxify
from ._registry import register
from ._staged import jaxpr_holds_staged_values, staged_values_into
from ._values import Value, ValueLike, is_value, materialise_or_explain


__all__: list[str] = []

_eval_cache: "weakref.WeakKeyDictionary[Any, Callable[..., list[Any]]]" = (
    weakref.WeakKeyDictionary()
)


def _quaxified(jaxpr: Any) -> Callable[..., list[Any]]:
    """A quaxified function evaluating `jaxpr` (closed or open), cached per jaxpr so
    that JAX's own tracing caches hit when the same jaxpr comes back. A jaxpr that
    stages values (see `quax._staged`) runs under a quax trace even on plain inputs,
    as only one gives those values their types."""
    try:
        return _eval_cache[jaxpr]
    except (KeyError, TypeError):
        pass
    if isinstance(jaxpr, ClosedJaxpr):
        fn = ft.partial(eval_quaxified, jaxpr.jaxpr, jaxpr.consts)
    else:
        fn = ft.partial(eval_quaxified, jaxpr, ())
    if jaxpr_holds_staged_values(jaxpr):
        out = ft.partial(_run_staging, fn)
    else:
        out = quaxify(fn)
    with contextlib.suppress(TypeError):  # unhashable jaxprs are not cached
        _eval_cache[jaxpr] = out
    return out


def _run_staging(fn: Callable[..., list[Any]], *args: Any) -> list[Any]:
    def body(trace: _trace.QuaxTrace) -> list[Any]:
        with staged_values_into(trace):
            return fn(*[trace.wrap(a) for a in args])

    return _trace.run_nested(body)


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
        tuple(ConstKey(a) if k else None for a, k in zip(args, known, strict=True)),
    )
    return _jitted(jaxpr, key)(*[args[i] for i in dynamic])


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


def _decision(x: ValueLike, what: str) -> Any:
    """A branch index or loop predicate as the plain array JAX decides on: a value
    there is materialised, or refused with an error naming the primitive."""
    return materialise_or_explain(
        x,
        lambda value: (
            f"{what} is a {value}: JAX decides on a plain array there, so quax must "
            "materialise it"
        ),
        "\nAllow the value to materialise (`allow_materialise=True` or "
        "`.enable_materialise()` where the type has it), or compute the decision "
        "from plain arrays (e.g. with `quax.quaxify` applied to a smaller function).",
    )


@register(cond_p)
def _cond(
    index: ValueLike, *ops: ValueLike, branches: Sequence[Any], **params: Any
) -> list[Any]:
    del params
    index = _decision(
        index, "the index of a `cond`/`switch` (`lax.cond`, `lax.switch`)"
    )
    fns = [_quaxified(b) for b in branches]
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
    must still join."""
    if isinstance(index, Tracer) and staging():
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

    # `vmap` of a loop whose predicate is batched binds `while` with one predicate
    # per batch element (the leading axes of every carry): each element stops on
    # its own, as JAX's lowering does it (loop while any is true, and keep the
    # carries of the elements that are done), whereas `lax.while_loop` wants one.
    batched = bool(cond_jaxpr.out_avals[0].shape)

    def predicate(c: list[Any]) -> Any:
        (pred,) = cond_fn(*cond_consts, *c)
        leaf = _predicate_leaf(pred)
        if leaf is not None:
            return leaf
        return _decision(pred, f"the predicate of a `{what}` (its `cond_fun`'s output)")

    def cond(c: list[Any]) -> Any:
        pred = predicate(c)
        return jnp.any(pred) if batched else pred

    def body(c: list[Any]) -> list[Any]:
        new = body_fn(*body_consts, *c)
        if not batched:
            return new
        pred = predicate(c)
        return [_select_where(pred, n, o) for n, o in zip(new, c, strict=True)]

    return _stable_loop(
        carry,
        body,
        lambda body, c: lax.while_loop(cond, body, c),
        carry_names(body_jaxpr, body_nconsts, what),
    )


def _predicate_leaf(pred: Any) -> Any:
    """A loop predicate that is a value, read from its leaf without materialising
    it (as the published quax, which flattens it to its one leaf), where that is
    exact: the value's array is linear in its leaves (`linear_in_leaves`), and its
    only leaf is a boolean array of the value's own shape, so the leaf is that
    array. `None` where it is not (the predicate is materialised, or refused, as
    usual)."""
    if not (is_value(pred) and type(pred).linear_in_leaves):
        return None
    leaves = jtu.tree_leaves(pred)
    aval = pred.aval()
    if len(leaves) != 1 or aval.dtype != np.bool_:
        return None
    (leaf,) = leaves
    if not isinstance(leaf, jax.Array | np.ndarray):
        return None
    leaf_aval = typeof(leaf)
    if leaf_aval.shape != aval.shape or leaf_aval.dtype != aval.dtype:
        return None
    return leaf


def _select_where(pred: Any, new: Any, old: Any) -> Any:
    """`new` where `pred` (over the leading axes) is true, else `old`, dispatched on
    their types."""

    def select(p: Any, n: Any, o: Any) -> Any:
        mask = lax.broadcast_in_dim(p, jnp.shape(n), tuple(range(jnp.ndim(p))))
        return lax.select(mask, n, o)

    return quaxify(select)(pred, new, old)


def _stable_loop(
    carry: Sequence[Any],
    body: Callable[[list[Any]], list[Any]],
    run: Callable[[Callable[[list[Any]], list[Any]], list[Any]], Any],
    where: Callable[[int], str],
    num_carry: int | None = None,
    xs: Sequence[Any] = (),
    settled: Callable[[Any], bool] | None = None,
) -> Any:
    """Run a loop whose body maps `carry` (and, for scan, one slice of each of `xs`)
    to a new carry (and, for scan, outputs after the first `num_carry`), joining
    carry types until they are stable. `settled(result)`, when given, says whether
    the loop's result is final; when it is not, it has changed what the body does,
    and the loop is traced again."""
    n = len(carry) if num_carry is None else num_carry
    join = Join(where)
    carry = list(carry)
    seen: list[list[Any]] = []

    def attempt() -> Any:
        seen.clear()
        # Whether the body failed; and whether to catch that, letting the loop's
        # trace end normally (a trace left by an exception keeps the tracers it
        # closed over alive, which the leak checker reports once quax recovers).
        failed, catch = [False], [True]

        def stable_body(c: list[Any]) -> list[Any]:
            if catch[0]:
                try:
                    with catching():
                        out = list(body(c))
                        out[:n] = join.outputs(out[:n])
                except Exception as e:
                    release_traces(e)
                    failed[0] = True
                    return list(c)
            else:
                out = list(body(c))
                out[:n] = join.outputs(out[:n])
            seen.append([skeleton(o) for o in out[:n]])
            return out

        carry[:] = join.inputs(carry)
        result = run(stable_body, carry)
        if failed[0]:
            # The body failed, perhaps on a plain carry that starts as a constant
            # fill.
            if join_fills(carry, body, n, xs):
                raise Rejoined
            if trying():
                # Inside a body that an enclosing loop is trying: let it retry.
                raise BodyFailed
            # Raise the body's error. A new function, so that JAX's tracing cache
            # cannot answer with the stand-in body traced above.
            catch[0] = False
            result = run(lambda c: stable_body(c), carry)
        if settled is not None and not settled(result):
            raise Rejoined
        return result

    def rejoin() -> bool:
        # The body ran, and its outputs disagree with the carry.
        return bool(seen) and join.update(carry, seen[-1])

    return join_until_stable(attempt, rejoin, limit=3 * n + 2)


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
        x
        if _slices_leafwise(x, length)
        else materialise_to_join(x, f"scanned-over input {i}")
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
            materialise_to_join(y, f"scan output {i}") if i in dense_ys else y
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

    def settled(result: Any) -> bool:
        _, ys = result
        bad = {
            i
            for i, y in enumerate(ys)
            if isinstance(y, Value) and y.aval().shape != (length, *step_shapes[i])
        }
        dense_ys.update(bad)
        return not bad

    carry_out, ys = _stable_loop(
        carry,
        lambda cx: _flat_body(body, cx, num_carry),
        run,
        carry_names(jaxpr, num_consts, "scan" if xs else "scan or fori_loop"),
        num_carry=num_carry,
        xs=xs,
        settled=settled,
    )
    return [*carry_out, *ys]


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
            run = lambda: joined(_quaxified(jaxprs.matvec)(*matvec_c, *x))
            return guarded(run, lambda: list(x), catch)

        def call(jaxpr: Any, consts: Sequence[Any]) -> Callable[..., Any]:
            fn = _quaxified(jaxpr)

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


# Higher-order primitives: their rules' outputs are not checked against the
# primitive's abstract evaluation (see `QuaxTrace`).
_trace.unchecked_primitives.update(
    {jit_p, cond_p, while_p, scan_p, remat_p, linear_solve_p}
)
_trace.staging_primitives.update(
    {jit_p, cond_p, while_p, scan_p, remat_p, linear_solve_p}
)
