"""The jaxpr interpreter: `eval_quaxified` runs a staged body at the current trace,
as `jax.core.eval_jaxpr` does, with constants folded, so that under a quax trace each
equation is dispatched to its rule.

Every higher-order rule evaluates its inner jaxprs with it, and so does an inlined
`jit` on the quax trace. How it binds each equation is worked out once per jaxpr
(its steps, kept in a table by `quax._caching._per_jaxpr.per_jaxpr`).
"""

import functools as ft
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax

from .._caching._per_jaxpr import MAX_JAXPRS, per_jaxpr
from .._compat import (
    EVAL_TRACE,
    Literal,
    Primitive,
    Tracer,
    call_at_trace,
    current_source_info,
    eqn_context,
    manual_axes_active,
    user_context,
)
from .._foundation._caches import Table
from .._foundation._evaluation import (
    HOST_CALLBACKS,
    binds_directly,
    calls_jaxpr,
    evaluations,
)
from .._values._value import Value


__all__ = [
    "FOLD_MAX_SIZE",
    "body_arg_names",
    "body_source",
    "eval_quaxified",
    "is_varying",
]

# Equations on constants only, with outputs this small, are computed at trace time.
FOLD_MAX_SIZE = 1024

# Tracers first: the common case, and `Value`'s check goes through its ABC.
_TRACED = (Tracer, Value)


def is_varying(aval: Any) -> bool:
    """Whether `aval` varies along some manual mesh axis (inside `shard_map`)."""
    mat = getattr(aval, "manual_axis_type", None)
    return mat is not None and bool(mat.varying)


def body_arg_names(jaxpr: Any) -> tuple[str, ...] | None:
    """The names of a traced body's arguments, as the user wrote them (`c[0]`, `i`),
    or `None` when JAX did not record them."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    return None if info is None else info.arg_names


def body_source(jaxpr: Any) -> str | None:
    """Where a traced body was defined (`f at file.py:12`), or `None`."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    return None if info is None else info.func_src_info


class _Step(NamedTuple):
    """How `eval_quaxified` binds one equation, worked out once per jaxpr."""

    primitive: Primitive
    invars: list[Any]
    outvars: list[Any]
    # The bind params, or `None` for a primitive with its own `get_bind_params`
    # (called on `eqn_params` each time: it may build new functions).
    params: dict[str, Any] | None
    eqn_params: dict[str, Any]
    # Whether the equation is computed now when its inputs are constants: it calls
    # no host callback and (bind params known) no sub-jaxpr, has no effects, and
    # its outputs are small and not device-varying (`pvary` of a constant, in
    # `shard_map`, has no value outside it).
    foldable: bool
    # Whether it may skip `bind`'s checks on tracers (see `binds_directly`).
    direct: bool
    traceback: Any
    names: Any
    ctx: Any
    multiple_results: bool


def _own_bind_params(primitive: Primitive) -> bool:
    return type(
        primitive
    ).get_bind_params is not Primitive.get_bind_params or "get_bind_params" in vars(
        primitive
    )


# Each jaxpr's steps, worked out once (the interpreter's hot path reads them).
_steps = Table("jaxpr interpreter: the steps of each jaxpr", MAX_JAXPRS)


def _steps_of(jaxpr: Any) -> list[_Step]:
    return per_jaxpr(_steps, jaxpr, _read_steps, _same_steps, "its equations' steps")


def _read_steps(jaxpr: Any) -> list[_Step]:
    """How `eval_quaxified` binds each equation of the open `jaxpr`."""
    steps = []
    for eqn in jaxpr.eqns:
        primitive = eqn.primitive
        params = None if _own_bind_params(primitive) else eqn.params
        foldable = (
            primitive not in HOST_CALLBACKS
            and not eqn.effects
            and (params is None or not calls_jaxpr(params))
            and all(
                getattr(v.aval, "size", FOLD_MAX_SIZE + 1) <= FOLD_MAX_SIZE
                for v in eqn.outvars
            )
            and not any(is_varying(v.aval) for v in eqn.outvars)
        )
        direct = (
            params is not None
            and binds_directly(primitive)
            and not (params and primitive.is_high(**params))
        )
        source_info = eqn.source_info
        steps.append(
            _Step(
                primitive,
                eqn.invars,
                eqn.outvars,
                params,
                eqn.params,
                foldable,
                direct,
                source_info.traceback,
                source_info.name_stack,
                eqn.ctx,
                primitive.multiple_results,
            )
        )
    return steps


def _same_steps(kept: list[_Step], fresh: list[_Step]) -> bool:
    """Whether two readings of a jaxpr's steps are of the same equations: every
    field the same object (the equation's own), or equal."""
    try:
        return len(kept) == len(fresh) and all(
            a is b or a == b
            for k, f in zip(kept, fresh, strict=True)
            for a, b in zip(k, f, strict=True)
        )
    except Exception:  # fields that cannot be compared: other equations
        return False


def _is_constant(x: Any) -> bool:
    return not isinstance(x, _TRACED)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, Tracer)


def eval_quaxified(
    jaxpr: Any, consts: Sequence[Any], *args: Any, trace: Any = None
) -> list[Any]:
    """Evaluate `jaxpr` at the current trace, as `jax.core.eval_jaxpr` does, except
    that an equation on constants only, calling no sub-jaxpr and no host callback,
    with every output of at most `FOLD_MAX_SIZE` elements, is computed now (as under
    `jax.ensure_compile_time_eval`): otherwise under an enclosing `jit` the
    constants a jaxpr computes (`convert_element_type(1.5)`, a `full` of NaNs) would
    reach the rules as tracers, whereas the Python program gave them as numbers.
    Under a quax trace, every other equation is dispatched.

    **Arguments:**

    - `jaxpr`: an open jaxpr.
    - `consts`: the values of its constvars.
    - `*args`: the values of its invars.
    - `trace`: the current trace, when the caller knows it and `args` passed a
        `bind` already (as an inlined `jit`'s did): equations on tracers then skip
        `bind`'s checks, which hold there.

    **Returns:**

    The values of its outvars.
    """
    if evaluations.reports:
        for report in evaluations.reports:
            report.total += 1
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    # Each equation's name stack extends the current one, which the loop leaves as it
    # finds it.
    outer_names = current_source_info().name_stack
    if trace is not None and manual_axes_active():
        trace = None  # `bind` may reshard inputs inside `shard_map`.
    for step in _steps_of(jaxpr):
        primitive = step.primitive
        invals = [v.val if type(v) is Literal else env[v] for v in step.invars]
        params = step.params
        if params is None:
            params = primitive.get_bind_params(step.eqn_params)
            # The constant check first: it usually declines at the first tracer.
            now = (
                step.foldable
                and all(map(_is_constant, invals))
                and not calls_jaxpr(params)
            )
        else:
            now = step.foldable and all(map(_is_constant, invals))
        names = step.names
        with (
            user_context(
                step.traceback,
                name_stack=outer_names + names if names else outer_names,
            ),
            eqn_context(step.ctx),
        ):
            if now:
                with jax.ensure_compile_time_eval():
                    ans = primitive.bind(*invals, **params)
            elif trace is not None and step.direct and all(map(_is_tracer, invals)):
                # What `bind` does after its checks.
                process = ft.partial(trace.process_primitive, primitive)
                ans = call_at_trace(EVAL_TRACE, process, invals, params)
            else:
                ans = primitive.bind(*invals, **params)
        if step.multiple_results:
            env.update(zip(step.outvars, ans, strict=True))
        else:
            env[step.outvars[0]] = ans
    return [v.val if type(v) is Literal else env[v] for v in jaxpr.outvars]
