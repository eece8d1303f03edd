"""`jax.eval_shape` and `eqx.filter_eval_shape` inside a quaxified function.

JAX evaluates shapes by tracing the function with abstract arguments, in a trace of
its own: a value that the function is given, or closes over (`jax.eval_shape(lambda:
y)`, as diffrax and optimistix probe their states), reaches it as a tracer of a quax
trace, which JAX abstracts to its aval. The result would be plain
`jax.ShapeDtypeStruct`s where the program computes values (a `Quantity` state, a
structured matrix), and a library that builds its buffers from it would build plain
arrays.

Inside an active quax trace, shape evaluation gives what the rules give instead.
Quax traces the function as JAX would (`jax.make_jaxpr`, which keeps the tracers it
closes over among the jaxpr's constants), then evaluates the shapes of that jaxpr
under a new quax trace, with every quax tracer among its constants and arguments
(of whichever enclosing quax trace) replaced by the value it stands for. The output
holds values with `jax.ShapeDtypeStruct` leaves and their static fields, as
`jax.eval_shape` of a quaxified function gives outside; the function's other
outputs (the static half of `eqx.filter_eval_shape`'s) are what its trace gave.
Nothing is computed: both steps only trace.

This holds where the quax trace is the current one (the body of a quaxified
function). Below a transform inside it (`jax.jit`, `vmap`, `grad`, ...), values
reach the code as that transform's tracers of their avals (see
`quax._dispatch._staged`): there shape evaluation stays JAX's, on avals, as the rest of
that code sees them, so that a probe of an argument and of a closed-over value agree;
the quax trace gives the types back when it runs what the transform staged. Outside a
quax trace (or in one that dispatches only on the values a `filter_spec` selects), or
with no value among the function's arguments and constants, both functions are the
libraries' own.
"""

import functools as ft
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu

from .._caching._per_jaxpr import jaxpr_holds_staged_values
from .._dispatch._staged import staged_values_into
from .._transform._interpreter import eval_quaxified
from .._transform._trace import QuaxTrace, QuaxTracer, active_trace, run_nested


__all__ = ["eval_shape_with_values"]


def _every(x: Any) -> bool:
    del x
    return True


def _value_of(x: Any) -> Any:
    return x._quax_value if type(x) is QuaxTracer else x


def eval_shape_with_values(
    eval_shape: Callable[..., Any],
    arrays: Callable[[Any], bool],
    fun: Callable[..., Any],
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """`eval_shape(fun, *args, **kwargs)`, seeing the value types of the active
    quax traces (see the module's docstring).

    **Arguments:**

    - `eval_shape`: JAX's own `jax.eval_shape`, or equinox's `filter_eval_shape`.
    - `arrays`: which leaves of the arguments and of `fun`'s output are arrays,
        traced (the others stay as they are, and come back as the trace gave
        them): all for `jax.eval_shape`, `eqx.is_array` for
        `eqx.filter_eval_shape`.
    - `fun`, `args`, `kwargs`: as for `eval_shape`.

    **Returns:**

    The output's structure: values with `jax.ShapeDtypeStruct` leaves where the
    rules give values, `jax.ShapeDtypeStruct`s elsewhere.
    """
    trace, between = active_trace()
    if trace is None or between or trace.selective:
        return eval_shape(fun, *args, **kwargs)
    leaves, treedef = jtu.tree_flatten((args, kwargs))
    dynamic = [i for i, x in enumerate(leaves) if arrays(x)]
    outputs: list[Any] = []

    def flat_fun(*flat: Any) -> list[Any]:
        inputs = list(leaves)
        for i, x in zip(dynamic, flat, strict=True):
            inputs[i] = x
        fn_args, fn_kwargs = jtu.tree_unflatten(treedef, inputs)
        out_leaves, out_treedef = jtu.tree_flatten(fun(*fn_args, **fn_kwargs))
        # The output's structure and static leaves, without its tracers (which
        # must not outlive the trace).
        mask = list(map(arrays, out_leaves))
        static = [None if m else x for x, m in zip(out_leaves, mask, strict=True)]
        outputs.extend([static, mask, out_treedef])
        return [x for x, m in zip(out_leaves, mask, strict=True) if m]

    closed = jax.make_jaxpr(flat_fun)(*[leaves[i] for i in dynamic])
    static, mask, out_treedef = outputs
    consts = [_value_of(c) for c in closed.consts]
    flat = [_value_of(leaves[i]) for i in dynamic]
    if not any(type(x) is QuaxTracer for x in [*closed.consts, *leaves]):
        return eval_shape(fun, *args, **kwargs)
    shapes = iter(_jax_eval_shape(ft.partial(_evaluate, closed), consts, flat))
    out = [next(shapes) if m else x for x, m in zip(static, mask, strict=True)]
    return jtu.tree_unflatten(out_treedef, out)


def _evaluate(closed: Any, consts: list[Any], flat: list[Any]) -> list[Any]:
    """The outputs of the closed jaxpr `closed` on `consts` (its constants) and
    `flat` (its inputs), with the values among them dispatched under a new quax
    trace."""

    def body(trace: QuaxTrace) -> list[Any]:
        inputs = [trace.wrap(x) for x in flat]
        constants = [trace.wrap(c) for c in consts]
        if jaxpr_holds_staged_values(closed):
            with staged_values_into(trace):
                return eval_quaxified(closed.jaxpr, constants, *inputs, trace=trace)
        return eval_quaxified(closed.jaxpr, constants, *inputs, trace=trace)

    return run_nested(body)


# JAX's own `jax.eval_shape` and equinox's `filter_eval_shape`, before
# `_install` replaces them.
_jax_eval_shape = jax.eval_shape
_eqx_filter_eval_shape = eqx.filter_eval_shape


def _install() -> None:
    """Make `jax.eval_shape` and `eqx.filter_eval_shape` the functions above, given
    the libraries' own. JAX evaluates shapes without binding a primitive that a
    trace could see, so the public functions are replaced (the libraries that call
    them, equinox's `filter_eval_shape` calling `jax.eval_shape` among them, look
    them up when they call); outside a quax trace they are the libraries' own."""

    @ft.wraps(_jax_eval_shape)
    def eval_shape(fun: Any, *args: Any, **kwargs: Any) -> Any:
        return eval_shape_with_values(_jax_eval_shape, _every, fun, *args, **kwargs)

    @ft.wraps(_eqx_filter_eval_shape)
    def filter_eval_shape(fun: Any, *args: Any, **kwargs: Any) -> Any:
        return eval_shape_with_values(
            _eqx_filter_eval_shape, eqx.is_array, fun, *args, **kwargs
        )

    jax.eval_shape = eval_shape
    eqx.filter_eval_shape = filter_eval_shape


_install()
