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
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._caching._nested import call_body
from .._compat import (
    cond_p,
    jit_p,
    linear_solve_p,
    release_traces,
    remat_p,
    scan_p,
    staging,
    typeof,
    while_p,
)
from .._dispatch._known import known_constant
from .._dispatch._registry import register
from .._transform import _trace
from .._values._value import Value, ValueLike
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
    # them ran: the call is then kept, its body quaxified as any other's, and its
    # jitted body kept by the nested-jit cache (`quax._caching._nested`).
    del inline, out_shardings  # outputs' types are only known after tracing the body
    return call_body(
        quaxified_jaxpr, jaxpr, args, name, donated_invars, in_shardings, keep_unused
    )


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
_trace.add_staging_rule(cond_p, _cond)
_trace.add_staging_rule(remat_p, _remat)
_trace.add_staging_rule(linear_solve_p, _linear_solve)
