"""Values built inside a function that JAX stages in a quaxified function.

Inside `quax.quaxify(f)`, `jax.jit(g)(t)` traces `g` with `t`'s value type erased:
`g` sees a plain tracer, and the quax trace re-runs the jaxpr JAX recorded (the
`jit` rule) with the value. A value that `g` builds (`Quantity(2., "m/s") * s`) runs
its operator through `quax.quaxify`, which would dispatch then, on the erased type,
and fix a wrong output type (a quantity of quantities) outside the jaxpr. Instead the
value is *staged*: the primitive `staged_value_p` records its leaves and structure in
the jaxpr, the operator is recorded on it as on a plain array, and the quax trace
that re-runs the jaxpr rebuilds the value there and dispatches on the real types.
So the value joins the enclosing quax trace through the staging, as a constant
joins a `vmap`.

This holds in the body of a quaxified function (and below it), never in a rule's
own code, whose stagings are the programs quax compiles: a thread-local setting in
JAX's trace context (`staged_values_state`) says which, so that JAX's tracing caches
keep the two kinds of jaxprs apart. Whether a jaxpr stages a value is worked out once
per jaxpr, in a table beside the interpreter's steps
(`quax._caching._per_jaxpr.jaxpr_holds_staged_values`).
"""

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
from jax.interpreters import ad, batching, mlir

from .._compat import (
    Primitive,
    ShapedArray,
    Tracer,
    staged_values_state,
    stages_or_batches,
)
from .._values._value import Value, describe, materialise_or_explain


__all__ = [
    "StagedValueError",
    "lift",
    "stage_value",
    "staged_value_p",
    "staged_values_into",
    "staging_joins",
    "unstage",
]


class StagedValueError(RuntimeError):
    """A value staged inside a quaxified function was evaluated without quax."""


staged_value_p = Primitive("quax_staged_value")


def stage_value(value: Value) -> Any:
    """`value` as a plain array of its aval in the function being staged: an
    equation that the quax trace re-running the jaxpr turns back into the value."""
    leaves, treedef = jtu.tree_flatten(value)
    aval = type(value).aval(value)
    aval = ShapedArray(aval.shape, aval.dtype, aval.weak_type)
    return staged_value_p.bind(*leaves, treedef=treedef, aval=aval)


def unstage(leaves: list[Any], treedef: Any, aval: Any) -> Value:
    """The value that `stage_value` staged, from its leaves as the re-run gives them;
    a `ValueError` when its aval is not the staged one (leaves batched by a `vmap`
    that does not batch the value with them)."""
    value = jtu.tree_unflatten(treedef, leaves)
    got = type(value).aval(value)
    if got.shape != aval.shape or got.dtype != aval.dtype:
        raise ValueError(
            f"A {describe(value)} built inside a function that JAX staged (`jax.jit`, "
            "`lax.cond`, ...) in a quaxified function, from arrays that a `jax.vmap` "
            f"batches, has the aval {got.str_short()} where {aval.str_short()} was "
            "staged: its type does not batch leaf by leaf. Build the value outside "
            "the `vmap`, or put the `vmap` inside `quax.quaxify`."
        )
    return value


class _Targets(threading.local):
    """The quax traces re-running jaxprs that hold staged values, innermost last."""

    def __init__(self) -> None:
        self.stack: list[Any] = []


_targets = _Targets()


@contextlib.contextmanager
def staged_values_into(trace: Any) -> Iterator[None]:
    """Staged values that are evaluated inside the block, with constant leaves (as
    quax computes constants while it re-runs a jaxpr), become tracers of `trace`."""
    _targets.stack.append(trace)
    try:
        yield
    finally:
        _targets.stack.pop()


def _without_quax(treedef: Any) -> StagedValueError:
    return StagedValueError(
        "A quax value built inside a function that JAX staged (`jax.jit`, "
        "`lax.cond`, ...) inside a quaxified function reached JAX without the quax "
        f"trace that gives it its type ({treedef}). Call the staged function inside "
        "`quax.quaxify`, or build the value outside it."
    )


def _impl(*leaves: Any, treedef: Any, aval: Any) -> Any:
    if not _targets.stack:
        raise _without_quax(treedef)
    return _targets.stack[-1].wrap(unstage(list(leaves), treedef, aval))


def _abstract_eval(*leaves: Any, treedef: Any, aval: Any) -> Any:
    del leaves, treedef
    return aval


def _lowering(ctx: Any, *leaves: Any, treedef: Any, aval: Any) -> Any:
    del ctx, leaves, aval
    raise _without_quax(treedef)


def _batch(args: list[Any], dims: list[Any], *, treedef: Any, aval: Any) -> Any:
    """Leafwise: a staged value of batched leaves stands for the batch of values
    (checked by `unstage` where the value is rebuilt)."""
    sizes = {x.shape[d] for x, d in zip(args, dims, strict=True) if d is not None}
    if not sizes:
        return staged_value_p.bind(*args, treedef=treedef, aval=aval), None
    (size,) = sizes
    moved = [
        jnp.broadcast_to(x, (size, *jnp.shape(x)))
        if d is None
        else jnp.moveaxis(x, d, 0)
        for x, d in zip(args, dims, strict=True)
    ]
    batched = ShapedArray((size, *aval.shape), aval.dtype, aval.weak_type)
    return staged_value_p.bind(*moved, treedef=treedef, aval=batched), 0


def _jvp(primals: list[Any], tangents: list[Any], *, treedef: Any, aval: Any) -> Any:
    out = staged_value_p.bind(*primals, treedef=treedef, aval=aval)
    if all(type(t) is ad.Zero for t in tangents):
        return out, ad.Zero(aval.to_tangent_aval())
    raise NotImplementedError(
        f"A quax value ({treedef}) built inside a function that JAX staged in a "
        "quaxified function is differentiated with respect to its leaves there. "
        "Build the value outside the staged function (or outside the "
        "differentiated one), or put the transform inside `quax.quaxify`."
    )


staged_value_p.def_impl(_impl)
staged_value_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(staged_value_p, _lowering)
batching.primitive_batchers[staged_value_p] = _batch
ad.primitive_jvps[staged_value_p] = _jvp


def staging_joins() -> bool:
    """Whether values built here, in a function that JAX stages inside a quaxified
    function's body, are staged (see the module's docstring)."""
    return bool(staged_values_state.value)


# Values that JAX asks for an array -----------------------------------------------


def lift(
    value: Value,
    trace: Any,
    between: list[Any],
    error: type[Exception] = TypeError,
) -> Any:
    """`value`, which a JAX function running under the quax trace `trace` asks for
    an array (`Value.__jax_array__`), or a primitive binds, as an operand of the
    current trace.

    With `trace` current, the value becomes its tracer. Below a `jit`, `cond`,
    `vmap`, ... inside the quaxified function's body, the value is staged, as
    operators stage the values they meet there. Below other traces (`grad`,
    `jvp`), a value of constants is a constant of theirs: it becomes a tracer of
    `trace`, which they lift as any outer tracer. A value built there from their
    tracers cannot join `trace` (nor be staged in a `jit` or `vmap` outside them):
    it is materialised under its policy, or explained.

    **Arguments:**

    - `value`: the value.
    - `trace`: the innermost quax trace, which the current trace is or runs inside.
    - `between`: the traces between `trace` and the current one (innermost first),
        as `quax._transform._trace.active_trace` gives them.
    - `error`: the exception type explaining a value that failed to materialise
        (see `materialise_or_explain`): a `TypeError` for `__jax_array__`, as JAX
        refuses an argument that is not an array; another for `Primitive.bind`,
        which replaces a `TypeError` of its arguments' conversion with its own.

    **Returns:**

    A tracer of the current trace (or of one it lifts from), or a dense array.
    """
    if not between:
        return trace.wrap(value)
    built_from = {
        id(leaf._trace) for leaf in jtu.tree_leaves(value) if isinstance(leaf, Tracer)
    }
    if staging_joins():
        for i, t in enumerate(between):
            if stages_or_batches(t):
                # Staged in the innermost `jit`, `vmap`, ..., unless built from the
                # tracers of a `grad`, `jvp` inside it, whose derivative rules would
                # refuse the staged value (`_jvp`).
                if not any(id(inner) in built_from for inner in between[:i]):
                    return stage_value(value)
                break
    if not any(id(t) in built_from for t in between):
        return trace.wrap(value)
    return materialise_or_explain(
        value,
        lambda described: (
            f"A {described} built inside a transform (`jax.grad`, `jax.jvp`, ...) "
            "within a quaxified function, from that transform's tracers, met a JAX "
            "function that takes arrays there; it cannot join the quax trace "
            "outside the transform, so quax materialised it"
        ),
        " Build the value outside the transform, or apply the transform outside "
        "`quax.quaxify`.",
        error,
    )
