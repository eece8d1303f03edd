"""Every access to JAX's and equinox's private API, in one place.

A JAX upgrade should touch this file and no other. The rest of quax imports the names
below rather than reaching into `jax._src` or `equinox._module` itself. Nothing here
interprets a program or replaces a rule: the interpreters built on these names live in
`_transform/_interpreter.py` and `_foundation/_rounding.py`, quax's replacements of
JAX's rules for `jit_p` in `_foundation/_jit_rules.py`.
"""

import contextlib
import functools as ft
import importlib
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend.core as jexc
import jax.extend.core.primitives as jprim
import numpy as np
from equinox._module import _flatten as _eqx_flatten, _module as _eqx_module
from jax._src import (
    config as _config,
    core as _core,
    debugging as _debugging,
    dispatch as _dispatch,
    dtypes as _dtypes,
    linear_util as _lu,
    source_info_util as _source_info_util,
    util as _util,
)
from jax._src.callback import io_callback_p, pure_callback_p
from jax._src.core import ShapedArray
from jax._src.debugging import debug_callback_p, debug_print_p
from jax._src.interpreters import ad as _ad, batching as _batching, partial_eval as _pe
from jax._src.lax.lax import optimization_barrier_p
from jax._src.mesh import get_abstract_mesh as _get_abstract_mesh
from jax._src.shard_map import _spec_to_vma, shard_map_p
from jax._src.sharding_impls import (
    UNSPECIFIED as _UNSPECIFIED,
    UnspecifiedValue as _UnspecifiedValue,
)
from packaging.version import Version


__all__ = [
    "AdZero",
    "BODY_TRACING_METHODS",
    "atom_tracer",
    "batching",
    "bind_custom_jvp",
    "bind_custom_vjp",
    "bwd_result",
    "bwd_split",
    "call_at_trace",
    "call_fresh",
    "call_rule_at_trace",
    "callback_module",
    "ClosedJaxpr",
    "cond_p",
    "forget_called_jaxpr",
    "forget_equation_lowering",
    "forget_jit_body",
    "hide_from_source_info",
    "current_source_info",
    "current_trace",
    "custom_jvp_call_p",
    "custom_vjp_call_p",
    "debug_callback_p",
    "debug_print_p",
    "define_batching_rule",
    "DynamicJaxprTrace",
    "DynamicJaxprTracer",
    "eager_primitive_compiler",
    "eager_program",
    "emit_equation",
    "ensure_no_leaks",
    "eqn_context",
    "eqx_bound_method",
    "eqx_finish_init",
    "eqx_has_dataclass_init",
    "eqx_warn_transformed_function",
    "EQX_WRAPPER_FIELD_NAMES",
    "eval_context",
    "EVAL_TRACE",
    "FlatTree",
    "frozen_atom",
    "frozen_bytes",
    "holds_refs",
    "inline_jaxpr_into_trace",
    "instantiate_zeros",
    "io_callback_p",
    "is_eval_trace",
    "is_unspecified",
    "jax_jit_staging_rule",
    "JAX_VERSION",
    "Jaxpr",
    "jit_derivative_rules",
    "jit_inlines",
    "jit_may_inline",
    "jit_p",
    "jvp_body",
    "linear_solve_p",
    "Literal",
    "manual_axes_active",
    "NUMPY_ARRAYS",
    "optimization_barrier_p",
    "pinv_function",
    "primal_behind",
    "Primitive",
    "pure_callback_p",
    "pvary_to_spec",
    "reflected_operator",
    "register_bind_conversion",
    "register_tracer_type",
    "release_traces",
    "remat_p",
    "run_debug_on_host",
    "scan_p",
    "set_current_trace",
    "set_eager_primitive_compiler",
    "set_jit_derivative_rules",
    "set_jit_staging_rule",
    "set_staging_method",
    "ShapedArray",
    "shard_map_p",
    "staged_atom",
    "staged_count",
    "staged_equation",
    "staged_since",
    "staged_values_state",
    "staged_var",
    "stages_or_batches",
    "staging",
    "staging_method",
    "SymbolicZero",
    "tangent_pair",
    "Trace",
    "trace_context",
    "trace_context_size",
    "traced_jit",
    "Tracer",
    "TraceTag",
    "typeof",
    "user_context",
    "while_p",
    "with_leaf_vma",
    "with_tangent",
    "without_unused",
    "wrap_called_jaxpr_lowering",
    "wrap_equation_lowering_miss",
    "wrap_init",
    "wrap_jit_lowering",
    "wrap_module_lowering",
    "wrap_tpu_callback_lowering",
]

# Clients of the published quax import these two from `quax._compat` (quaxed's test
# suite does: `from quax._compat import JAX_VERSION, typeof`, and compares
# `Version("0.10") <= JAX_VERSION`), so they keep the published meaning: JAX's version
# as a `packaging.version.Version`, and `jax.typeof`.
JAX_VERSION: Version = Version(jax.__version__)
typeof = jax.typeof

# Trace machinery.
Trace = _core.Trace
Tracer = _core.Tracer
TraceTag = jexc.TraceTag
set_current_trace = jexc.set_current_trace
ClosedJaxpr = jexc.ClosedJaxpr
Jaxpr = jexc.Jaxpr
Primitive = jexc.Primitive
eval_context = _core.eval_context
# What `bind` makes the current trace while a trace processes a primitive.
EVAL_TRACE = _core.eval_trace

# Evaluating a jaxpr equation by equation, as `jax.core.eval_jaxpr` does.
Literal = _core.Literal
user_context = _source_info_util.user_context
current_source_info = _source_info_util.current  # its `name_stack` too
trace_context = _config.trace_context  # what JAX's tracing caches key on (hashable)


def traced_jit(jitted: Any, avals: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """The body (a closed jaxpr) that the `jax.jit`-decorated `jitted` traces on
    arguments of the abstract values `avals` (JAX's own, with their weak types,
    shardings and the manual axes they vary along, which `jax.ShapeDtypeStruct`
    cannot all carry) and the keyword arguments `kwargs`, in the current
    context (inside a `shard_map`, its axes)."""
    return jitted.trace(*avals, **kwargs).jaxpr


def trace_context_size() -> int:
    """How many values JAX's trace context holds: one more for each
    `jax.make_user_context` made (and each JAX option included in it defined)."""
    return len(_config.trace_context())


# Higher-order primitives that quax-core gives rules for.
jit_p = jprim.jit_p
cond_p = jprim.cond_p
while_p = jprim.while_p
scan_p = jprim.scan_p
remat_p = jprim.remat_p
linear_solve_p = jprim.linear_solve_p
custom_jvp_call_p = jprim.custom_jvp_call_p
custom_vjp_call_p = jprim.custom_vjp_call_p

# Custom derivatives and `shard_map`: re-binding at the parent trace over leaves.
AdZero = _ad.Zero
SymbolicZero = jax.custom_derivatives.SymbolicZero

# `FlatTree.flatten(leaves)`: a static method of the class `tree_util.FlatTree` up to
# JAX 0.10; from 0.11 a function of the module `flattree`, which stands in for it.
_tree_util = importlib.import_module("jax._src.tree_util")
FlatTree: Any = getattr(_tree_util, "FlatTree", None) or importlib.import_module(
    "jax._src.flattree"
)

# The jitted body of `jnp.linalg.pinv` (inside its `custom_jvp`), which a family
# catches with `quax.register_function`: the public `pinv` is a plain function that
# calls it (with `hermitian` static, `rtol` an array or `None`).
pinv_function: Any = importlib.import_module("jax._src.numpy.linalg")._pinv

# JAX 0.10 keeps the abstract mesh in `config` (`None` outside a mesh); 0.11 moved it
# to `mesh` (an empty mesh outside one). `manual_axes_active` reads either.
_abstract_mesh_state: Any = getattr(_config, "abstract_mesh_context_manager", None)
if _abstract_mesh_state is None:
    _abstract_mesh_state = importlib.import_module(
        "jax._src.mesh"
    ).abstract_mesh_context_manager

# Whether this JAX's equation contexts hold, and their manager sets, the settings
# `eqn_context` compares (JAX 0.10's).
_EQN_CONTEXT_KNOWN = " ".join(_core.JaxprEqnContextManager.__slots__) == (
    "context prev_compute_type prev_threefry_partitionable prev_xla_metadata "
    "prev_abstract_mesh prev_remove_size_one_mesh_axis"
)
_UNCHANGED_CONTEXT = contextlib.nullcontext()


def eqn_context(ctx: Any) -> Any:
    """The context manager that binds an equation in its own context, as
    `ctx.manager` (`ctx` an equation's `ctx`), or a no-op one when the current
    context is the equation's already (the abstract mesh read as JAX reads it):
    evaluating a jaxpr re-binds each equation, and this spares the usual case the
    manager's eight setting swaps."""
    if (
        _EQN_CONTEXT_KNOWN
        and not ctx.xla_metadata
        and ctx.threefry_partitionable is _config.threefry_partitionable.value
        and ctx.compute_type is _config.compute_on_context_manager.value
        and ctx.cur_abstract_mesh is _get_abstract_mesh()
        and ctx.remove_size_one_mesh_axis
        is _config.remove_size_one_mesh_axis_from_type.value
    ):
        return _UNCHANGED_CONTEXT
    return ctx.manager


# From JAX 0.11 a custom VJP's `bwd` (as `custom_vjp_call` holds it) returns the pair
# `(cotangents, logs)` (`jax.custom_vjp.defvjp_with_logs`), and so must one bound in
# its place; up to 0.10 it returns the cotangents alone.
_BWD_LOGS = hasattr(jax.custom_vjp, "defvjp_with_logs")

# The current trace, as `set_current_trace` keeps it: a strong reference, and a weak
# one that JAX's caches key on.
_trace_strong = _core.trace_state_strong_ref
_trace_weak = _core.trace_state

# Whether values built inside a function that JAX stages (`jit`, `cond`, ...) in the
# body of a quaxified function are staged as values (see `quax._dispatch._staged`). A
# thread-local setting that is part of JAX's trace context, as the functions JAX traces
# there give other jaxprs than elsewhere: JAX's tracing caches must not mix the two.
staged_values_state: Any = _config.config_ext.Config(
    "quax_staged_values", False, include_in_trace_context=True
)

# The attributes of a wrapped function (`__name__`, `__doc__`, ...) that equinox's
# `module_update_wrapper` copies onto a wrapper Module and its flattening keeps.
EQX_WRAPPER_FIELD_NAMES: tuple[str, ...] = _eqx_flatten.WRAPPER_FIELD_NAMES

DynamicJaxprTracer = _pe.DynamicJaxprTracer
DynamicJaxprTrace = _pe.DynamicJaxprTrace

# Replaying staged equations on a `DynamicJaxprTrace` (see `quax._caching._replay`).
# These primitives' staging rules are JAX's default one, with their params named.
_DEFAULT_STAGING = {jprim.broadcast_in_dim_p, jprim.reshape_p, jprim.iota_p}
_DEFAULT_STAGING.add(jprim.dynamic_slice_p)


def staged_count(trace: Any) -> int:
    """How many equations `trace` has staged so far."""
    return len(trace.frame.tracing_eqns)


def staged_since(trace: Any, start: int) -> list[Any] | None:
    """The live equations `trace` staged from `staged_count` `start` on (each with
    `in_tracers`, `outvars`, `primitive`, `params`, `effects`, `source_info`, `ctx`),
    or `None` if one has its own staging rule, which `emit_equation` would bypass."""
    eqns = trace.frame.tracing_eqns[start:]
    eqns = [e() if isinstance(e, weakref.ref) else e for e in eqns]
    eqns = [e for e in eqns if e is not None]
    own = _pe.custom_staging_rules.keys() - _DEFAULT_STAGING
    return None if any(e.primitive in own for e in eqns) else eqns


def without_unused(jaxpr: Any) -> Any:
    """The open `jaxpr` less the equations whose outputs nothing reads and that have
    no effect (JAX's dead-code elimination, inner jaxprs included), every input
    kept."""
    return _pe.dce_jaxpr(jaxpr, True, instantiate=True)[0]


def staged_atom(trace: Any, t: Any) -> tuple[str, Any]:
    """What the tracer `t` of `trace` is: `("literal", literal)`, `("const",
    value)`, or `("var", var)` (an input or an equation's output)."""
    if type(t.val) is Literal:
        return "literal", t.val
    consts = trace.frame.constvar_to_val
    return ("const", consts[t.val]) if t.val in consts else ("var", t.val)


def staged_var(trace: Any, t: Any) -> bool:
    """Whether the tracer `t` of `trace` is an input or an equation's output of it
    (`staged_atom` gives `"var"`), without building that pair: on every replay key."""
    val = t.val
    return type(val) is not Literal and val not in trace.frame.constvar_to_val


def atom_tracer(trace: Any, kind: str, atom: Any, source_info: Any) -> Any:
    """A tracer of `trace` for a literal or constant that `staged_atom` gave."""
    if kind == "literal":
        return DynamicJaxprTracer(trace, atom.aval, atom, source_info)
    return trace.new_const(atom, source_info)


def frozen_atom(kind: str, atom: Any) -> Any:
    """A literal or constant that `staged_atom` gave, as a recording keeps it: one
    holding a NumPy array (which JAX stages as it is, perhaps a view of an array its
    owner changes later) holds a read-only copy of it instead."""
    value = atom.val if kind == "literal" else atom
    if not isinstance(value, np.ndarray):
        return atom
    copy = value.copy()  # of its own class (JAX's typed array keeps its weak type)
    copy.flags.writeable = False
    return Literal(copy, atom.aval) if kind == "literal" else copy


# The NumPy array types that reach a primitive as a constant input: NumPy's, and
# JAX's typed host array (a view of a NumPy array carrying a weak type, which
# `jax.numpy` makes of a NumPy scalar it converts), where this JAX has it.
_literals = importlib.import_module("jax._src.literals")
NUMPY_ARRAYS = frozenset(
    t for t in (np.ndarray, getattr(_literals, "TypedNdArray", None)) if t is not None
)


def frozen_bytes(array: np.ndarray, data: bytes) -> np.ndarray:
    """A read-only array of the NumPy `array`'s class, shape and dtype (and weak
    type, for JAX's typed host array) over `data`, its bytes (`array.tobytes()`):
    a copy that its owner cannot change afterwards, made without copying again."""
    frozen = np.frombuffer(data, array.dtype).reshape(array.shape)
    if type(array) is np.ndarray:
        return frozen
    typed = getattr(_literals, "TypedNdArray", None)
    if typed is not None and type(array) is typed:
        return typed(frozen, typeof(array))
    copy = array.copy()  # another subclass: a copy of its own class
    copy.flags.writeable = False
    return copy


def emit_equation(
    trace: Any, eqn: Any, tracers: list[Any], names: Any, info: Any
) -> list[Any]:
    """Stage a copy of `eqn` (see `quax._replay._Equation`) on `tracers`, as `names`,
    with the source info `info` (`None`: `eqn`'s own)."""
    info = (info or eqn.source_info).replace(name_stack=names)
    p, params, effects, avals = eqn.primitive, eqn.params, eqn.effects, eqn.out_avals
    return trace.emit_eqn(tracers, avals, p, params, effects, info, eqn.ctx)


def ensure_no_leaks(trace: Any) -> Any:
    """JAX's leak check for a finished trace under `JAX_CHECK_TRACER_LEAKS`;
    otherwise `trace` is only invalidated, as that check does first."""
    if _config.check_tracer_leaks.value:
        return _core.ensure_no_leaks(trace)
    trace.invalidate()
    return _UNCHANGED_CONTEXT


def is_eval_trace(trace: Any) -> bool:
    """Whether `trace` evaluates eagerly (no transform or staging below it)."""
    return isinstance(trace, _core.EvalTrace)


def is_unspecified(sharding: Any) -> bool:
    """Whether a jit sharding parameter is JAX's 'unspecified' sentinel."""
    return isinstance(sharding, _UnspecifiedValue)


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
        and _all_unspecified(params["in_shardings"])
        and _all_unspecified(params["out_shardings"])
        and not any(params.get("in_layouts", ()))
        and not any(params.get("out_layouts", ()))
    )


def jit_may_inline(jitted: Any) -> tuple[bool, str]:
    """Whether the `jax.jit`-decorated `jitted` may be inlined into its callers
    (`jax.jit(inline=True)`, as `jnp.rad2deg` is): what JAX records of the
    decoration says so; where it records nothing quax can read, it may. And the
    name JAX gives its `jit` equations (their `name` param)."""
    info = getattr(jitted, "_jit_info", None)
    inline = getattr(info, "inline", True)
    if not isinstance(inline, bool):
        inline = getattr(inline, "value", None) == "jax_early"
    return inline, _util.fun_name(getattr(jitted, "__wrapped__", jitted))


# JAX's rules for `jit_p`, which quax replaces (see `quax._foundation._jit_rules`):
# its staging rule (how a `DynamicJaxprTrace` stages a `jit`: inlines it, or stages a
# call), and its `jvp` and `linearize` rules.
jax_jit_staging_rule = _pe.custom_staging_rules[jprim.jit_p]
inline_jaxpr_into_trace = _pe.inline_jaxpr_into_trace
instantiate_zeros = _ad.instantiate_zeros


def set_jit_staging_rule(rule: Any) -> None:
    """Make `rule` the staging rule of `jit_p` (JAX's is `jax_jit_staging_rule`)."""
    _pe.custom_staging_rules[jprim.jit_p] = rule


# Lowering host callbacks for a TPU (see `quax._foundation._tpu_callbacks`): JAX's
# function that lowers one (as send and receive operations on host-transfer channels,
# numbered once, at lowering), and the three places where JAX's lowering reuses what
# it lowered before: the lowering of an equation of a cacheable primitive (reused for
# an equation of the same primitive, parameters and input types), the function of a
# called jaxpr, and the function of a `jit` body (each called at every place).
_callback = importlib.import_module("jax._src.callback")
_mlir = importlib.import_module("jax._src.interpreters.mlir")


def wrap_tpu_callback_lowering(wrap: Any) -> None:
    """Replace JAX's function that lowers a host callback for a TPU by
    `wrap(function)`."""
    name = "_emit_tpu_python_callback"
    setattr(_callback, name, wrap(getattr(_callback, name)))


def wrap_equation_lowering_miss(wrap: Any) -> None:
    """Replace JAX's function that lowers an equation of a cacheable primitive on a
    miss of the module's lowering cache, `(module_context, eqn, cache_key, ...) ->
    entry`, which then keeps the entry under `cache_key` (`forget_equation_lowering`
    drops it), by `wrap(function)`."""
    name = "_cached_lowering_miss"
    setattr(_mlir, name, wrap(getattr(_mlir, name)))


def wrap_called_jaxpr_lowering(wrap: Any) -> None:
    """Replace JAX's function that lowers a called jaxpr to a function of the module,
    `(module_context, fn_name, closed_jaxpr, num_const_args, effects, ...)`, which
    keeps the function for the module's later calls (`forget_called_jaxpr` drops
    it), by `wrap(function)`."""
    name = "_lower_jaxpr_to_fun_cached"
    setattr(_mlir, name, wrap(getattr(_mlir, name)))


def wrap_jit_lowering(wrap: Any) -> None:
    """Replace the lowering rule of `jit_p`, `(ctx, *args, name, jaxpr, ...)`, which
    keeps the body's function for the module's later `jit`s of the same body
    (`forget_jit_body` drops it), by `wrap(rule)`."""
    entry = _mlir._lowerings[jprim.jit_p]
    _mlir.register_lowering(
        jprim.jit_p, wrap(entry.rule), inline=entry.inline, cacheable=False
    )


def wrap_module_lowering(wrap_context: Any, wrap_lowering: Any) -> None:
    """Replace JAX's function that makes a new MLIR context for each module it
    lowers, `make_ir_context()`, by `wrap_context(function)`, and JAX's function
    that lowers a jaxpr to a module, `lower_jaxpr_to_module(...)`, by
    `wrap_lowering(function)`. quax itself changes neither: the test suites' root
    `conftest.py` does, to share a context between the programs it lowers."""
    for name, wrap in [
        ("make_ir_context", wrap_context),
        ("lower_jaxpr_to_module", wrap_lowering),
    ]:
        setattr(_mlir, name, wrap(getattr(_mlir, name)))


def forget_equation_lowering(module_context: Any, cache_key: Any) -> None:
    """Drop the lowering of an equation that the module being lowered keeps under
    `cache_key` (given to the function `wrap_equation_lowering_miss` wraps), so
    that the module's next such equation is lowered again."""
    module_context.lowering_cache.pop(cache_key, None)


def forget_called_jaxpr(
    module_context: Any, fn_name: str, call_jaxpr: Any, effects: Any
) -> None:
    """Drop the function of the called jaxpr `call_jaxpr` (a closed jaxpr) that the
    module being lowered keeps (the arguments of the function
    `wrap_called_jaxpr_lowering` wraps), so that its next call is lowered again."""
    key = (fn_name, call_jaxpr.jaxpr, tuple(effects))
    module_context.cached_primitive_lowerings.pop(key, None)


def forget_jit_body(module_context: Any, jaxpr: Any) -> None:
    """Drop every function of the `jit` body `jaxpr` (the closed jaxpr of a `jit_p`
    equation) that the module being lowered keeps, under keys `(jit_p, name, jaxpr,
    ...)`, so that its next `jit` equation is lowered again."""
    functions = module_context.cached_primitive_lowerings
    for key in [
        k
        for k in functions
        if type(k) is tuple and len(k) > 2 and k[0] is jprim.jit_p and k[2] is jaxpr
    ]:
        del functions[key]


# The `DynamicJaxprTrace` methods that trace a sub-function while its primitive binds
# (`shard_map`, custom derivatives), rather than before as `jit`, `cond`, ... do:
# `bind` has made the eval trace current then, so the sub-function's trace would get
# the eval trace as its parent (see `quax._rules._custom`).
BODY_TRACING_METHODS = (
    "process_shard_map",
    "process_custom_jvp_call",
    "process_custom_vjp_call",
)


def staging_method(name: str) -> Any:
    """`DynamicJaxprTrace`'s method `name`, one of `BODY_TRACING_METHODS`."""
    return getattr(_pe.DynamicJaxprTrace, name)


def set_staging_method(name: str, method: Any) -> None:
    """Make `method` `DynamicJaxprTrace`'s method `name` (one of
    `BODY_TRACING_METHODS`)."""
    setattr(_pe.DynamicJaxprTrace, name, method)


def hide_from_source_info(path: str) -> None:
    """Leave the frames of the file `path` out of the source locations JAX records
    for equations (and writes into compiled programs' metadata), as it leaves out
    its own files."""
    _source_info_util.register_exclusion(path)


def jit_derivative_rules() -> tuple[Any, Any]:
    """The current `jvp` and `linearize` rules of `jit_p`."""
    return _ad.primitive_jvps[jprim.jit_p], _ad.primitive_linearizations[jprim.jit_p]


def set_jit_derivative_rules(jvp: Any, linearize: Any) -> None:
    """Make `jvp` and `linearize` the derivative rules of `jit_p`."""
    _ad.primitive_jvps[jprim.jit_p] = jvp
    _ad.primitive_linearizations[jprim.jit_p] = linearize


def holds_refs(jaxpr: Any) -> bool:
    """Whether the closed `jaxpr` holds mutable arrays (`Ref`s) among its constants,
    or takes or closes over any with an initial state (for which JAX moves constant
    `Ref`s out of a call before staging it)."""
    return (
        any(isinstance(c, _core.Ref) for c in jaxpr.consts)
        or any(v.initial_qdd for v in jaxpr.jaxpr.constvars)
        or any(v.initial_qdd for v in jaxpr.jaxpr.invars)
    )


def jvp_body(body: Any, nonzeros: Sequence[bool]) -> tuple[Any, list[bool]]:
    """What JAX's `jvp` of a `jit` whose body is the closed jaxpr `body` binds (its
    `jit` rule's `jvp_jaxpr`): the body of the primals then the tangents of the
    arguments where `nonzeros` is true, giving the outputs and their tangents where
    the second list is true (the others are symbolic zeros, not outputs)."""
    return _ad.jvp_jaxpr(body, list(nonzeros), instantiate=False)


def primal_behind(x: Any) -> Any:
    """The innermost primal behind `x`, through the tracers of `jax.jvp` and
    `jax.linearize` (their primals) and of `jax.vmap` (their batched values):
    where such transformations run inside `quaxify`, the tracer of the quax trace
    (or the plain array) that they transform; anything else unchanged (a staged
    tracer of `jit`, whose value is not known while JAX traces the body)."""
    while True:
        if isinstance(x, _ad.JVPTracer | _ad.LinearizeTracer):
            x = x.primal
        elif isinstance(x, _batching.BatchTracer):
            x = x.val
        else:
            return x


def _all_unspecified(shardings: tuple[Any, ...]) -> bool:
    # `count` compares with JAX's sentinel by identity first, in C: the usual case,
    # on every inlined `jit` quax traces; the loop for any other instance.
    return shardings.count(_UNSPECIFIED) == len(shardings) or all(
        map(is_unspecified, shardings)
    )


# Varying manual axes (vma): inside `shard_map`, an aval records the mesh axes along
# which its value varies, and collectives (`pcast`, the implicit `pvary` that
# `shard_map` puts on its outputs) read it from the operand's type.


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
    if not isinstance(spec, jax.sharding.PartitionSpec) or not _config.auto_pcast.value:
        return leaf
    mat = getattr(typeof(leaf), "manual_axis_type", None)
    if mat is None:
        return leaf
    missing = _spec_to_vma(spec) - mat.varying
    return _core.pvary(leaf, tuple(missing)) if missing else leaf


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


def eqx_has_dataclass_init(cls: type) -> bool:
    """Whether an equinox Module class uses the dataclass-generated `__init__`."""
    return bool(_eqx_module._has_dataclass_init.get(cls, False))


def eqx_finish_init(module: Any) -> None:
    """Mark a Module built without equinox's metaclass `__call__` as initialised."""
    _eqx_module._currently_initialising.remove(module)


def staged_equation(t: Any) -> Any:
    """The equation that computed the staged tracer `t` (under `jit`, `make_jaxpr`,
    ...), with `primitive`, `params`, `in_tracers` and `effects`, or `None` for an
    input of the staged program or another tracer."""
    return t.parent if isinstance(t, DynamicJaxprTracer) else None


def tangent_pair(t: Any) -> tuple[Any, Any] | None:
    """The primal and tangent of a tracer of `jax.jvp` or of `jax.linearize` (as
    `jax.grad` traces), or `None` for any other value. The tangent may be a
    symbolic zero (an `AdZero`)."""
    if isinstance(t, _ad.JVPTracer | _ad.LinearizeTracer):
        return t.primal, t.tangent
    return None


def with_tangent(t: Any, primal: Any, tangent: Any) -> Any:
    """A tracer of the trace of `t` (one `tangent_pair` reads) with this `primal`
    and `tangent` (a tracer of the trace that holds `t`'s tangent, or a concrete
    array under `jax.jvp`)."""
    return type(t)(t._trace, primal, tangent)


def current_trace() -> Any:
    """The current trace; its enclosing ones are reached through `parent_trace`."""
    return _core.trace_ctx.trace


def batching() -> bool:
    """Whether the current trace, or one it runs inside, is a `jax.vmap`."""
    trace = _core.trace_ctx.trace
    while trace is not None:
        if isinstance(trace, _batching.BatchTrace):
            return True
        trace = getattr(trace, "parent_trace", None)
    return False


def stages_or_batches(trace: Any) -> bool:
    """Whether `trace` stages a function into a jaxpr (`jit`, `cond`, ...) or
    batches it (`vmap`)."""
    return isinstance(trace, _pe.DynamicJaxprTrace | _batching.BatchTrace)


class _EagerProgram(threading.local):
    trace: Any = None


# The trace of the compiled eager program this thread traces now
# (`quax._caching._eager`): its tracers stand for arrays that, equation by equation,
# would be concrete.
eager_program = _EagerProgram()


def staging() -> bool:
    """Whether the current trace, or one it runs inside, stages a program (`jit`,
    `make_jaxpr`, ...) rather than computing eagerly. The `jit` of a compiled eager
    program (`quax._caching._eager`) counts as eager: its code runs eagerly as
    written."""
    trace = _core.trace_ctx.trace
    eager = eager_program.trace
    while (
        trace is not None
        and trace is not eager
        and not isinstance(trace, _core.EvalTrace)
    ):
        if isinstance(trace, _pe.DynamicJaxprTrace):
            return True
        trace = getattr(trace, "parent_trace", None)
    return False


def callback_module(x: Any) -> str | None:
    """The module of the host function whose `pure_callback` computed the traced
    array `x` (read from the trace), else `None`."""
    if not isinstance(x, _pe.DynamicJaxprTracer):
        return None
    eqn = x.parent
    if eqn is None or eqn.primitive is not pure_callback_p:
        return None
    callback = getattr(eqn.params["callback"], "callback_func", None)
    return getattr(callback, "__module__", None)


def eqx_warn_transformed_function(cls: type, value: Any) -> None:
    """Equinox's warning for a Module field that holds a JAX-transformed function
    (`jax.jit(f)`, ...), which its `__setattr__` gives during `__init__`."""
    _eqx_module._warn_jax_transformed_function(cls, value)


def eqx_bound_method(func: Any, module: Any) -> Any:
    """Equinox's pytree bound method, as `Module.__getattribute__` returns for a
    method of a Module instance."""
    return _eqx_module.BoundMethod(func, module)


def call_rule_at_trace(trace: Any, rule: Any, values: Any, params: Any) -> Any:
    """`call_at_trace` for a quax rule: the rule's own code stages no values (see
    `staged_values_state`)."""
    prev = _trace_strong.value
    staged = staged_values_state.value
    _trace_strong.set_local(trace)
    _trace_weak.set_local(trace._weakref)
    if staged:
        staged_values_state.set_local(False)
    try:
        return rule(values, params)
    finally:
        _trace_strong.set_local(prev)
        _trace_weak.set_local(None if prev is None else prev._weakref)
        if staged:
            staged_values_state.set_local(True)


def call_at_trace(trace: Any, rule: Any, values: Any, params: Any) -> Any:
    """`rule(values, params)` with `trace` as the current trace: `with
    set_current_trace(trace)` at a fraction of its cost, for quax's per-primitive
    hot path."""
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


def register_bind_conversion(cls: type, convert: Any) -> None:
    """How `Primitive.bind` takes an argument of type `cls` (or a subclass), which
    JAX otherwise refuses as "not a valid JAX type": `convert(x)` gives what it
    binds instead (an array, or a tracer of the current trace)."""
    _dtypes.canonicalize_value_handlers[cls] = convert


# The comparisons Python reflects onto the other operand's mirrored comparison; every
# other binary operator onto its `__r*__` form.
_MIRRORED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
_ARITHMETIC = [
    "add", "sub", "mul", "truediv", "floordiv", "divmod", "mod", "pow", "matmul",
    "and", "or", "xor", "lshift", "rshift",
]  # fmt: skip


@ft.cache
def _operator_reflections() -> dict[Any, str]:
    """The code object of each of JAX's forward binary array operators (the
    functions that `jax.Array` has as `__add__`, `__lt__`, ... and that a tracer's
    operators call through its aval's `_add`, `_lt`, ...) mapped to the method
    Python calls on the other operand when it returns `NotImplemented`."""
    names = {name: f"__{mirrored}__" for name, mirrored in _MIRRORED.items()}
    names.update({name: f"__r{name}__" for name in _ARITHMETIC})
    codes = {}
    for name, reflected in names.items():
        code = getattr(getattr(ShapedArray, f"_{name}", None), "__code__", None)
        if code is not None:
            codes[code] = reflected
    return codes


def reflected_operator(frame: Any) -> str | None:
    """Where `frame` runs one of JAX's forward binary array operators
    (`jax.Array.__add__`, a tracer's `__lt__`, ...), which ask their other operand
    for `__jax_array__` and return `NotImplemented` unless it gives an array: the
    method Python then calls on that operand (`__radd__`, `__gt__`, ...). Elsewhere
    (the reflected operators among them, which Python calls after the operand's
    own) `None`."""
    return _operator_reflections().get(frame.f_code)


def release_traces(error: BaseException) -> None:
    """Close the JAX traces that `error` abandoned, after quax caught it.

    JAX ends a trace (dropping the constants it captured) only when tracing
    returns: one that an exception left stays alive, through the finalizers of its
    constants, with every tracer of an enclosing trace it captured, which that
    trace's leak check then reports. Quax catches errors where it tries a body, so
    it ends the traces that the error unwound (JAX's `trace_to_*` frames).
    """
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name.startswith("trace_to_") and frame.f_globals.get(
            "__name__", ""
        ).startswith("jax."):
            trace = frame.f_locals.get("trace")
            if isinstance(trace, Trace):
                trace.invalidate()
        tb = tb.tb_next


def eager_primitive_compiler() -> Any:
    """The function with which JAX compiles a primitive applied outside any trace
    (`primitive, **params -> program`), without the cache in front of it, or `None`
    where JAX keeps none (see `quax.testing.cache_eager_primitive_programs`)."""
    return getattr(_dispatch.xla_primitive_callable, "__wrapped__", None)


def set_eager_primitive_compiler(compile: Any) -> None:
    """Make JAX compile a primitive applied outside any trace with `compile`
    (`primitive, **params -> program`)."""
    _dispatch.xla_primitive_callable = compile


def define_batching_rule(primitive: Any, rule: Any) -> None:
    """Define `primitive`'s batching rule, what `jax.vmap` calls for it: for a
    family that defines a primitive of its own (quax-units' `ustrip`). JAX keeps
    these rules in a private table, `batching.primitive_batchers`.

    **Arguments:**

    - `primitive`: a `jax.extend.core.Primitive`.
    - `rule`: as JAX's batching rules: `rule(args, dims, **params)` returns the
        output and its batch dimension (lists of them for a primitive with
        `multiple_results`).

    **Returns:**

    Nothing.
    """
    _batching.primitive_batchers[primitive] = rule
