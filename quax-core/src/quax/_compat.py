"""Every access to JAX's private API, in one place.

A JAX upgrade should touch this file and no other. The rest of quax imports the names
below rather than reaching into `jax._src` itself.
"""

import functools as ft
import importlib
from typing import Any

import jax
import jax.extend.core as jexc
import jax.extend.core.primitives as jprim
from jax._src import core as _core
from jax._src.core import ShapedArray
from jax._src.debugging import debug_callback_p, debug_print_p
from jax._src.interpreters import ad as _ad
from jax._src.lax.lax import optimization_barrier_p


__all__ = [
    "ClosedJaxpr",
    "Jaxpr",
    "FlatTree",
    "Primitive",
    "ShapedArray",
    "Trace",
    "TraceTag",
    "Tracer",
    "AdZero",
    "SymbolicZero",
    "bind_custom_jvp",
    "bind_custom_vjp",
    "bwd_result",
    "bwd_split",
    "call_at_trace",
    "callback_module",
    "call_fresh",
    "clean_trace_state",
    "cond_p",
    "custom_jvp_call_p",
    "custom_vjp_call_p",
    "debug_callback_p",
    "debug_print_p",
    "eval_jaxpr",
    "eval_jaxpr_folding",
    "jit_inlines",
    "known_constant",
    "staging",
    "manual_axes_active",
    "with_leaf_vma",
    "pvary_to_spec",
    "body_arg_names",
    "body_source",
    "jit_p",
    "optimization_barrier_p",
    "linear_solve_p",
    "io_callback_p",
    "pure_callback_p",
    "remat_p",
    "register_tracer_type",
    "run_debug_on_host",
    "scan_counts",
    "scan_p",
    "set_current_trace",
    "take_current_trace",
    "typeof",
    "while_p",
    "wrap_init",
]

# Trace machinery.
Trace = _core.Trace
Tracer = _core.Tracer
TraceTag = jexc.TraceTag
take_current_trace = jexc.take_current_trace
set_current_trace = jexc.set_current_trace
typeof = jax.typeof
ClosedJaxpr = jexc.ClosedJaxpr
Jaxpr = jexc.Jaxpr
Primitive = jexc.Primitive
eval_jaxpr = _core.eval_jaxpr

# Higher-order primitives that quax-core gives rules for.
jit_p = jprim.jit_p
cond_p = jprim.cond_p
while_p = jprim.while_p
scan_p = jprim.scan_p
remat_p = jprim.remat_p
linear_solve_p = jprim.linear_solve_p
custom_jvp_call_p = jprim.custom_jvp_call_p
custom_vjp_call_p = jprim.custom_vjp_call_p
from jax._src.callback import io_callback_p, pure_callback_p  # noqa: E402


def clean_trace_state() -> bool:
    """Whether no trace is active (used by tests to check for leaks)."""
    return _core.trace_state_clean()


def zeros_like_aval(aval: Any) -> Any:
    """A dense zero of the given abstract value (used to materialise symbolic zeros)."""
    return _ad.zeros_like_aval(aval)


def ensure_no_leaks(trace: Any) -> Any:
    """JAX's leak check for a finished trace (active under `JAX_CHECK_TRACER_LEAKS`)."""
    return _core.ensure_no_leaks(trace)


def is_unspecified(sharding: Any) -> bool:
    """Whether a jit sharding parameter is JAX's 'unspecified' sentinel."""
    from jax._src.sharding_impls import UnspecifiedValue

    return isinstance(sharding, UnspecifiedValue)


def jit_inlines(params: dict[str, Any]) -> bool:
    """Whether a `jit` equation's body is inlined into its caller's jaxpr: its
    `inline` param says so, and it gives no sharding or layout (as JAX's own staging
    rule decides). `inline` is a bool up to JAX 0.10; from 0.11 a `jax.Inline`, where
    `JAX_EARLY` (every `jax.numpy` function) inlines, and `JAX_LATE` (what `True`
    reads) keeps the call for lowering to inline."""
    inline = params["inline"]
    if not isinstance(inline, bool):
        inline = getattr(inline, "value", None) == "jax_early"
    return (
        inline
        and all(map(is_unspecified, params["in_shardings"]))
        and all(map(is_unspecified, params["out_shardings"]))
        and all(layout is None for layout in params.get("in_layouts", ()))
        and all(layout is None for layout in params.get("out_layouts", ()))
    )


def scan_counts(params: dict[str, Any]) -> tuple[int, int]:
    """`(num_consts, num_carry)` of a `scan` equation's params. JAX 0.10 records the
    counts; 0.11 records `ft_in`, a flat tree of `(consts, carry, xs)`."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


# Varying manual axes (vma): inside `shard_map`, an aval records the mesh axes along
# which its value varies, and collectives (`pcast`, the implicit `pvary` that
# `shard_map` puts on its outputs) read it from the operand's type.


from jax._src import config as _config  # noqa: E402
from jax._src.mesh import get_abstract_mesh as _get_abstract_mesh  # noqa: E402


# JAX 0.10 keeps the abstract mesh in `config` (`None` outside a mesh); 0.11 moved it
# to `mesh` (an empty mesh outside one). `manual_axes_active` reads either.
_abstract_mesh_state: Any = getattr(_config, "abstract_mesh_context_manager", None)
if _abstract_mesh_state is None:
    _mesh_module = importlib.import_module("jax._src.mesh")
    _abstract_mesh_state = _mesh_module.abstract_mesh_context_manager


def manual_axes_active() -> bool:
    """Whether some mesh axis is manual here: whether code runs inside `shard_map`,
    the only place avals carry varying manual axes. Called for every `QuaxTrace`, so
    kept to one context-variable read outside a mesh context."""
    mesh = _abstract_mesh_state.value
    return mesh is not None and bool(mesh.manual_axes)


def with_leaf_vma(aval: Any, leaves: Any) -> Any:
    """`aval`, varying along every manual axis along which one of `leaves` varies.

    A value's own `aval()` knows nothing of `shard_map`; the vma of the value is
    that of its leaves (their union)."""
    vma: frozenset = frozenset()
    for leaf in leaves:
        mat = getattr(getattr(leaf, "aval", None), "manual_axis_type", None)
        if mat is not None:
            vma |= mat.varying
    mat = getattr(aval, "manual_axis_type", None)
    if not vma or mat is None or vma <= mat.varying:
        return aval
    # A varying type needs the manual mesh (a value's `aval()` has none), as `pvary`.
    return aval.update(
        sharding=aval.sharding.update(mesh=_get_abstract_mesh()),
        manual_axis_type=mat.update(varying=mat.varying | vma),
    )


def pvary_to_spec(leaf: Any, spec: Any) -> Any:
    """`leaf`, made varying along the axes of the `PartitionSpec` `spec` it does not
    vary along yet, as `shard_map` does to each output."""
    from jax._src.shard_map import _spec_to_vma

    if not isinstance(spec, jax.sharding.PartitionSpec) or not _config.auto_pcast.value:
        return leaf
    mat = getattr(typeof(leaf), "manual_axis_type", None)
    if mat is None:
        return leaf
    missing = _spec_to_vma(spec) - mat.varying
    return _core.pvary(leaf, tuple(missing)) if missing else leaf


# Custom derivatives and `shard_map`: re-binding at the parent trace over leaves.
AdZero = _ad.Zero
SymbolicZero = jax.custom_derivatives.SymbolicZero
from jax._src import linear_util as _lu  # noqa: E402


# `FlatTree.flatten(leaves)`: a static method of the class `tree_util.FlatTree` up to
# JAX 0.10; from 0.11 a function of the module `flattree`, which stands in for it.
_tree_util = importlib.import_module("jax._src.tree_util")
FlatTree: Any = getattr(_tree_util, "FlatTree", None) or importlib.import_module(
    "jax._src.flattree"
)


def wrap_init(fn: Any, debug_info: Any) -> Any:
    """`fn` as a `lu.WrappedFun`, the form `bind_with_trace` takes for sub-functions."""
    return _lu.wrap_init(fn, debug_info=debug_info)


def call_fresh(fun: Any, *args: Any) -> Any:
    """Call a `lu.WrappedFun` whose output stores may be filled from an earlier call."""
    for store in fun.stores:
        if store:
            store.reset()
    return fun.call_wrapped(*args)


def bind_custom_jvp(
    trace: Any, fun: Any, jvp: Any, args: Any, symbolic_zeros: bool
) -> Any:
    """Bind `custom_jvp_call` with the given sub-functions at `trace`."""
    return jprim.custom_jvp_call_p.bind_with_trace(
        trace,
        tuple(args),
        tuple(typeof(a) for a in args),
        dict(subfuns=(fun, jvp), symbolic_zeros=symbolic_zeros),
    )


def bind_custom_vjp(
    trace: Any,
    fun: Any,
    fwd: Any,
    bwd: Any,
    args: Any,
    out_trees: Any,
    symbolic_zeros: bool,
) -> Any:
    """Bind `custom_vjp_call` with the given sub-functions at `trace`."""
    return jprim.custom_vjp_call_p.bind_with_trace(
        trace,
        tuple(args),
        tuple(typeof(a) for a in args),
        dict(
            subfuns=(fun, fwd, bwd), out_trees=out_trees, symbolic_zeros=symbolic_zeros
        ),
    )


# From JAX 0.11 a custom VJP's `bwd` (as `custom_vjp_call` holds it) returns the pair
# `(cotangents, logs)` (`jax.custom_vjp.defvjp_with_logs`), and so must one bound in
# its place; up to 0.10 it returns the cotangents alone.
_BWD_LOGS = hasattr(jax.custom_vjp, "defvjp_with_logs")


def bwd_split(out: Any) -> tuple[list[Any], Any]:
    """The cotangents and the logs (`None` before 0.11) of what a `bwd` returned."""
    if _BWD_LOGS:
        cts, logs = out
        return list(cts), logs
    return list(out), None


def bwd_result(cts: list[Any], logs: Any) -> Any:
    """What a `bwd` bound in `custom_vjp_call` returns, for `cts` and `logs`."""
    return (cts, logs) if _BWD_LOGS else cts


def run_debug_on_host(primitive: Any, args: Any, params: dict[str, Any]) -> None:
    """What `debug_callback_p` / `debug_print_p` do on the host, for arguments that
    may be non-array objects (values that refuse to materialise)."""
    from jax._src import debugging as _debugging

    if primitive is debug_callback_p:
        params["callback"](*args)
        return
    callback = ft.partial(
        _debugging._format_print_callback,
        params["fmt"],
        dict(params["np_printoptions"]),
        params["has_placeholders"],
        params["logging_record"],
    )
    _debugging._make_flat_callback(params["in_tree"], callback, params["static_args"])(
        *args
    )


# Equinox internals used by the fast `Value` constructor (see `_values.py`) and by
# `quaxify` (see `_quaxify.py`).
from equinox._module import (  # noqa: E402
    _flatten as _eqx_flatten,
    _module as _eqx_module,
)


def eqx_has_dataclass_init(cls: type) -> bool:
    """Whether an equinox Module class uses the dataclass-generated `__init__`."""
    return bool(_eqx_module._has_dataclass_init.get(cls, False))


def eqx_finish_init(module: Any) -> None:
    """Mark a Module built without equinox's metaclass `__call__` as initialised."""
    _eqx_module._currently_initialising.remove(module)


def body_arg_names(jaxpr: Any) -> tuple[str, ...] | None:
    """The names of a traced body's arguments, as the user wrote them (`c[0]`, `i`),
    or `None` when JAX did not record them."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    return None if info is None else info.arg_names


def body_source(jaxpr: Any) -> str | None:
    """Where a traced body was defined (`f at file.py:12`), or `None`."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    return None if info is None else info.func_src_info


def _varying(aval: Any) -> bool:
    mat = getattr(aval, "manual_axis_type", None)
    return mat is not None and bool(mat.varying)


def eval_jaxpr_folding(
    jaxpr: Any, consts: Any, *args: Any, fold: Any, max_size: int
) -> list[Any]:
    """`eval_jaxpr`, except that an equation `fold(eqn, inputs)` accepts, with every
    output of at most `max_size` elements, is evaluated now (as under
    `jax.ensure_compile_time_eval`) rather than bound at the current trace: constants
    computed inside the jaxpr stay concrete under an enclosing `jit`."""
    from jax._src import source_info_util

    env: dict[Any, Any] = {}
    literal = _core.Literal

    def read(v: Any) -> Any:
        return v.val if type(v) is literal else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        primitive = eqn.primitive
        invals = [read(v) for v in eqn.invars]
        params = primitive.get_bind_params(eqn.params)
        # `fold` first: it usually declines at the first traced input.
        now = (
            fold(primitive, invals, params)
            and not eqn.effects
            and all(
                getattr(v.aval, "size", max_size + 1) <= max_size for v in eqn.outvars
            )
            # A device-varying output (`pvary` of a constant, in `shard_map`) has no
            # value outside `shard_map`.
            and not any(_varying(v.aval) for v in eqn.outvars)
        )
        name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        with (
            source_info_util.user_context(
                eqn.source_info.traceback, name_stack=name_stack
            ),
            eqn.ctx.manager,
        ):
            if now:
                with jax.ensure_compile_time_eval():
                    ans = primitive.bind(*invals, **params)
            else:
                ans = primitive.bind(*invals, **params)
        if primitive.multiple_results:
            env.update(zip(eqn.outvars, ans, strict=True))
        else:
            env[eqn.outvars[0]] = ans
    return [read(v) for v in jaxpr.outvars]


# Largest output that `known_constant` computes (rather than views, as it does a
# broadcast), so that the trace-time work stays small.
_KNOWN_COMPUTE_MAX_SIZE = 1024


def known_constant(x: Any, max_size: int) -> Any:
    """The value of the jit-traced array `x`, as a NumPy array, when the trace shows
    it is a constant of at most `max_size` elements: a literal, a broadcast, copy or
    conversion of one (as JAX makes an instantiated zero), or a small effect-free
    equation on such constants (`lax.switch` clamps a constant index); else `None`."""
    import numpy as np
    from jax._src.interpreters import partial_eval as _pe

    known: dict[int, Any] = {}  # by tracer id: each shared input is looked at once

    def value(t: Any) -> Any:
        if not isinstance(t, _pe.DynamicJaxprTracer):
            return None
        if id(t) not in known:
            known[id(t)] = evaluate(t)
        return known[id(t)]

    def evaluate(t: Any) -> Any:
        aval: Any = t.aval
        if aval.size > max_size:
            return None
        if isinstance(t.val, _core.Literal):
            return np.asarray(t.val.val)
        eqn = t.parent
        if eqn is None:
            return None
        primitive = eqn.primitive
        if primitive is jprim.copy_p:
            return value(eqn.in_tracers[0])
        if primitive is jprim.convert_element_type_p:
            operand = value(eqn.in_tracers[0])
            return None if operand is None else operand.astype(aval.dtype)
        if primitive is jprim.broadcast_in_dim_p and len(eqn.in_tracers) == 1:
            operand = value(eqn.in_tracers[0])
            if operand is None:
                return None
            dims = eqn.params["broadcast_dimensions"]
            kept = [
                operand.shape[dims.index(d)] if d in dims else 1
                for d in range(aval.ndim)
            ]
            return np.broadcast_to(operand.reshape(kept), aval.shape).astype(aval.dtype)
        if (
            aval.size > _KNOWN_COMPUTE_MAX_SIZE
            or primitive.multiple_results
            or eqn.effects
            or any(
                isinstance(p, _core.Jaxpr | _core.ClosedJaxpr)
                for p in eqn.params.values()
            )
        ):
            return None
        operands = []
        for operand_tracer in eqn.in_tracers:
            operand = value(operand_tracer)
            if operand is None:
                return None
            operands.append(operand)
        # Evaluated now, whatever the current trace (none while a primitive is bound).
        with _core.eval_context():
            return np.asarray(primitive.bind(*operands, **eqn.params))

    return value(x)


def staging() -> bool:
    """Whether the current trace, or one it runs inside, stages a program (`jit`,
    `make_jaxpr`, ...) rather than computing eagerly."""
    from jax._src.interpreters import partial_eval as _pe

    trace = _core.trace_ctx.trace
    while trace is not None and not isinstance(trace, _core.EvalTrace):
        if isinstance(trace, _pe.DynamicJaxprTrace):
            return True
        trace = getattr(trace, "parent_trace", None)
    return False


def callback_module(x: Any) -> str | None:
    """The module of the host function whose `pure_callback` computed the traced
    array `x` (read from the trace), else `None`."""
    from jax._src.interpreters import partial_eval as _pe

    if not isinstance(x, _pe.DynamicJaxprTracer):
        return None
    eqn = x.parent
    if eqn is None or eqn.primitive is not pure_callback_p:
        return None
    callback = getattr(eqn.params["callback"], "callback_func", None)
    return getattr(callback, "__module__", None)


# The attributes of a wrapped function (`__name__`, `__doc__`, ...) that equinox's
# `module_update_wrapper` copies onto a wrapper Module and its flattening keeps.
EQX_WRAPPER_FIELD_NAMES: tuple[str, ...] = _eqx_flatten.WRAPPER_FIELD_NAMES


def eqx_warn_transformed_function(cls: type, value: Any) -> None:
    """Equinox's warning for a Module field that holds a JAX-transformed function
    (`jax.jit(f)`, ...), which its `__setattr__` gives during `__init__`."""
    _eqx_module._warn_jax_transformed_function(cls, value)


def eqx_bound_method(func: Any, module: Any) -> Any:
    """Equinox's pytree bound method, as `Module.__getattribute__` returns for a
    method of a Module instance."""
    return _eqx_module.BoundMethod(func, module)


# The current trace, as `set_current_trace` keeps it: a strong reference, and a weak
# one that JAX's caches key on.
_trace_strong = _core.trace_state_strong_ref
_trace_weak = _core.trace_state


def call_at_trace(trace: Any, rule: Any, values: Any, params: Any) -> Any:
    """`rule(values, params)` with `trace` as the current trace: `with
    set_current_trace(trace)` at a third of its cost, for quax's per-primitive hot
    path."""
    prev = _trace_strong.value
    _trace_strong.set_local(trace)
    _trace_weak.set_local(trace._weakref)
    try:
        return rule(values, params)
    finally:
        _trace_strong.set_local(prev)
        _trace_weak.set_local(None if prev is None else prev._weakref)


def register_tracer_type(cls: type) -> None:
    """Let `jax.typeof` find the `Tracer` subclass `cls` in one dict lookup, as JAX
    registers its own tracers, rather than by walking its MRO to `Tracer`."""
    _core.pytype_aval_mappings[cls] = _core.pytype_aval_mappings[_core.Tracer]
