"""`quax.quaxify`: run a JAX program with its primitives dispatched on value types."""

import functools as ft
from collections.abc import Callable, Sequence
from types import FunctionType
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np
from jaxtyping import PyTree

from .._caching._eager import call_compiled
from .._compat import (
    EQX_WRAPPER_FIELD_NAMES,
    DynamicJaxprTrace,
    Tracer,
    batching,
    current_trace,
    eqx_warn_transformed_function,
    is_eval_trace,
    stages_or_batches,
)
from .._dispatch import _plugins
from .._dispatch._staged import stage_value, staging_joins
from .._values._checks import check_value
from .._values._value import (
    PlainRunMetValue,
    describe,
    is_value,
    plain_running,
    value_classes,
)
from ._trace import QuaxTrace, active_trace, run_nested


__all__ = ["quaxify"]

# The function `quaxify` wraps. Calls of the wrapper are not checked against its
# signature: they pass values where `fn`'s annotations say arrays, and what they
# return is what the rules return (a `LoraArray`, a `NamedArray`, ... where `fn` is
# annotated to return an array), hence `Any`.
_CT = TypeVar("_CT", bound=Callable[..., Any])
_attribute = object.__getattribute__
_JitFunction = type(jax.jit(lambda: None))


def _is_library_function(fn: Any) -> bool:
    """Whether `fn` is a jitted function (`jax.jit`'s, `jax.numpy`'s) or a function
    of the `operator` module: code whose Python runs only when JAX traces it."""
    return (
        isinstance(fn, _JitFunction | jax.numpy.ufunc)
        or getattr(fn, "__module__", None) == "_operator"
    )


def _call(trace: QuaxTrace, filter_spec: Any, leaves: list[Any], treedef: Any) -> Any:
    """Call `fn(*args, **kwargs)` (flattened in `leaves`, `treedef`) with its values
    (those `filter_spec` selects) as `trace`'s tracers."""
    if filter_spec is True:
        fn, args, kwargs = jtu.tree_unflatten(treedef, [trace.box(x) for x in leaves])
    else:
        tree = jtu.tree_unflatten(treedef, leaves)
        wrap = ft.partial(jtu.tree_map, trace.box, is_leaf=is_value)
        dynamic, static = eqx.partition(tree, filter_spec, is_leaf=is_value)
        fn, args, kwargs = eqx.combine(wrap(dynamic), static, is_leaf=is_value)
    return fn(*args, **kwargs)


# What `_trace_to_join` answers when the values must be staged to join the trace.
_STAGE = object()


def _trace_to_join(leaves: Sequence[Any]) -> Any:
    """The active quax trace that values meeting its tracers must join; `_STAGE`
    when they must be staged to join it; or `None`.

    A value closed over or built inside a quaxified function, which meets a traced
    input there (`G * t`, whose operator quaxifies `mul`), is a constant of that
    trace, as JAX lifts a constant into the trace of the tracer it meets: it joins
    the trace rather than opening a nested one, which would take the outer tracer
    for a plain array and build a value of values. A value built from tracers of a
    `jit` or `vmap` (or `cond`, ...) inside the quaxified function cannot become a
    tracer of the quax trace; there it is staged (see `quax._dispatch._staged`): the
    quax trace builds it when it re-runs what JAX staged or batched. Unless no plain
    operand is traced there and JAX stages (not batches) the value's tracers, as for
    a loop carry built from constants: then the rules run on it there, in a nested
    trace (`_rebuilt_in_a_body`). A trace opened with a `filter_spec` leaves the
    values it did not select to nested quaxifies, so nothing joins it.
    """
    trace, between = active_trace()
    if trace is None or trace.selective:
        return None
    tracers = [x for x in jtu.tree_leaves(leaves) if isinstance(x, Tracer)]
    if not tracers:
        return None
    inside = {id(t) for t in between}
    if (
        staging_joins()
        and any(id(t._trace) in inside for t in tracers)
        and any(map(stages_or_batches, between))
    ):
        if _rebuilt_in_a_body(leaves, trace, inside):
            return None
        # Staged rather than closed over: a long-lived jitted function would keep
        # the quax trace's tracers among its jaxpr's constants.
        return _STAGE
    for x in jtu.tree_leaves(leaves, is_leaf=is_value):
        if is_value(x) and any(
            isinstance(leaf, Tracer) and id(leaf._trace) in inside
            for leaf in jtu.tree_leaves(x)
        ):
            return None
    return trace


def _rebuilt_in_a_body(leaves: Sequence[Any], trace: Any, inside: set[int]) -> bool:
    """Whether the values among `leaves` are dispatched on now, in a nested quax
    trace, rather than staged: their tracers of the traces inside `trace` are all
    of traces that stage a body (`jit`, `scan`, `cond`, ..., not `vmap`), and no
    operand outside a value is a tracer of `trace` or of those traces.

    Such a value crossed into a staged body as a pytree (a loop carry or `xs`, a
    `cond` operand, a `jit` argument, built from constants in the quaxified
    function's body), so JAX rebuilt it around the body's tracers; or the body
    built it. JAX requires a loop body to give its carry back with the structure it
    got, so the body's operators must give a value, as they do on the same pytree
    outside any quax trace: the rules act on its leaves, which the quax trace
    re-running the body dispatches again. A plain operand of those traces may stand
    for a value whose type JAX erased (a traced input, a closed-over tracer of
    `trace`), on which a rule run now would take it for an array: the operator is
    then staged (see `quax._dispatch._staged`).
    """
    for x in jtu.tree_leaves(leaves, is_leaf=is_value):
        if not is_value(x):
            if isinstance(x, Tracer) and (x._trace is trace or id(x._trace) in inside):
                return False
            continue
        for leaf in jtu.tree_leaves(x):
            if isinstance(leaf, Tracer) and (
                leaf._trace is trace
                or (
                    id(leaf._trace) in inside
                    and not isinstance(leaf._trace, DynamicJaxprTrace)
                )
            ):
                return False
    return True


def _call_staged(leaves: list[Any], treedef: Any) -> Any:
    """Call `fn(*args, **kwargs)` (flattened in `leaves`, `treedef`) with its values
    staged as plain arrays, for the quax trace below to dispatch on."""
    staged = [_staged(x) if is_value(x) else x for x in leaves]
    fn, args, kwargs = jtu.tree_unflatten(treedef, staged)
    return fn(*args, **kwargs)


def _staged(value: Any) -> Any:
    """`value`, an argument from outside quax, staged once its checks have run."""
    check_value(value)
    return stage_value(value)


def _check_batchable(out: Any) -> None:
    """Refuse a value without array leaves in the output of a quaxified function
    that `jax.vmap` maps: vmap stacks outputs along their leaves, so it would return
    one unbatched value (a `Zero` of the per-example shape) where a batch of them
    was meant."""
    for x in jtu.tree_leaves(out, is_leaf=is_value):
        if is_value(x) and not jtu.tree_leaves(x):
            raise ValueError(
                f"A quaxified function under `jax.vmap` returned a {describe(x)}, "
                "which has no array leaves, so `jax.vmap` cannot give it a batch "
                "axis: the result would silently keep the per-example shape. Put "
                "the vmap inside quaxify (`quax.quaxify(jax.vmap(f))`, where the "
                "rules see the batched shapes), or materialise the value in `f`."
            )


def _without_values(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], eager: bool
) -> Any:
    """`fn(*args, **kwargs)`, called with no value among them (at the eval trace
    where `eager`): as plain JAX where no value meets JAX in it, the rules applying
    to those that do (see `quaxify`)."""
    if not eager:
        trace, _ = active_trace()
        if trace is not None and not trace.selective:
            # Inside a quaxified function: a value built here joins its trace.
            return fn(*args, **kwargs)
    # Plain JAX, at plain JAX's cost (eagerly, a quax trace would take every
    # `jax.jit` off JAX's fast path; while JAX stages a program, it would cost
    # tracing time), so that functions with data-dependent shapes (`jnp.unique`,
    # ...) keep working too, and values that `fn` passes to a nested `quaxify` are
    # left to it. A value meeting JAX outside any quax trace ends the plain run
    # (`PlainRunMetValue`), and `fn` runs again from the start under quax.
    plain = plain_running.set(True)
    try:
        return fn(*args, **kwargs)
    except PlainRunMetValue:
        pass
    finally:
        plain_running.reset(plain)
    leaves, treedef = jtu.tree_flatten((fn, args, kwargs), is_leaf=is_value)
    out = run_nested(lambda trace: _call(trace, True, leaves, treedef))
    if batching():
        _check_batchable(out)
    return out


# How JAX's loops and branches refuse a body whose output's structure differs from its
# carry's, or from another branch's.
_STRUCTURE_MISMATCH = "must have the same pytree structure"
# How those refusals name a plain array on one side (a value of one type on both
# sides, differing in its static fields, is no staging's doing).
_PLAIN_SIDES = ("pytree leaf", "ShapedArray'>")
_STRUCTURE_NOTE = (
    "quax: a quax value crossed into this loop or branch as a pytree (built from "
    "constants, or closed over, inside a quaxified function), where the body, or "
    "another branch, gives a plain array: an input of the quaxified function, which "
    "JAX traces there with its type erased, or a value that quax staged as a plain "
    "array, as it stages one that meets a `jax.numpy` function or an array that JAX "
    "traces there (a loop index, an array made in the body, such an input), whose "
    "type it cannot know while JAX traces the body. Pass the value through "
    "`jnp.asarray` where it is built, before the loop (`lax.fori_loop(0, n, body, "
    "jnp.asarray(value))`) or in the branch that builds it: inside a quaxified "
    "function that keeps the value and joins it to the quax trace, whose loop and "
    "branch rules then dispatch on it, as on the function's inputs."
)


def _explain_structure_mismatch(error: TypeError) -> None:
    """Add to JAX's refusal of a loop or branch whose output structure differs, a
    value on one side and a plain array on the other, what to do, once."""
    message = str(error)
    if _STRUCTURE_MISMATCH not in message or _STRUCTURE_NOTE in getattr(
        error, "__notes__", ()
    ):
        return
    plain = any(side in message for side in _PLAIN_SIDES)
    # A copy: another thread may define a value type meanwhile.
    types = tuple(value_classes)
    if plain and any(
        f"'{cls.__module__}.{cls.__qualname__}'" in message for cls in types
    ):
        error.add_note(_STRUCTURE_NOTE)


# The types of the arguments `_is_plain` found to be arrays (JAX's, tracers, NumPy's)
# or scalars: one set lookup each on the next call.
_plain_types: set[type] = set()
_ARRAYS_AND_SCALARS = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def _is_plain(x: Any) -> bool:
    """Whether `x` is an array or a scalar, not a value (nor holding one)."""
    cls = type(x)
    if issubclass(cls, _ARRAYS_AND_SCALARS) and not is_value(x):
        _plain_types.add(cls)
        return True
    return False


class _Quaxify(eqx.Module, Generic[_CT]):
    fn: _CT
    filter_spec: PyTree[bool | Callable[[Any], bool]]

    @property
    def __wrapped__(self) -> _CT:
        return self.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            _plugins.autoload()
            # The fields without equinox's attribute lookup (this is the eager hot
            # path).
            fields = _attribute(self, "__dict__")
            fn, filter_spec = fields["fn"], fields["filter_spec"]
            eager = is_eval_trace(current_trace())
            if filter_spec is True and eager and _is_library_function(fn):
                # Eagerly, library code runs as one compiled program
                # (`quax._caching._eager`).
                done, out = call_compiled(fn, lambda: self, args, kwargs)
                if done:
                    return out
            if filter_spec is True and not kwargs and type(fn) is FunctionType:
                if (
                    args
                    and value_classes.issuperset(map(type, args))
                    and _trace_to_join(args) is None
                ):
                    # The common case, a function called on values: nothing to flatten.
                    out = run_nested(lambda trace: fn(*map(trace.box, args)), False)
                    if batching():
                        _check_batchable(out)
                    return out
                if all(type(x) in _plain_types or _is_plain(x) for x in args):
                    # A function called on arrays alone: nothing to flatten either.
                    return _without_values(fn, args, kwargs, eager)
            leaves, treedef = jtu.tree_flatten((fn, args, kwargs), is_leaf=is_value)
            if filter_spec is True:
                if not any(map(is_value, leaves)):
                    return _without_values(fn, args, kwargs, eager)
                outer = _trace_to_join(leaves)
                if outer is _STAGE:
                    return _call_staged(leaves, treedef)
                if outer is not None:
                    return _call(outer, True, leaves, treedef)
            selective = filter_spec is not True
            out = run_nested(
                lambda trace: _call(trace, filter_spec, leaves, treedef), selective
            )
            if batching():
                _check_batchable(out)
            return out
        except TypeError as error:
            _explain_structure_mismatch(error)
            raise

    def __get__(self, instance: Any, owner: Any) -> Any:
        if instance is None:
            return self
        return eqx.Partial(self, instance)


def quaxify(
    fn: _CT, filter_spec: PyTree[bool | Callable[[Any], bool]] = True
) -> _Quaxify[_CT]:
    """Make `fn` understand [`quax.Value`][]s: each primitive it binds on one is
    dispatched to the rule registered for the input types.

    ```python
    lora_linear = eqx.tree_at(lambda l: l.weight, linear, lora.LoraArray(...))
    y = quax.quaxify(lambda m, x: m(x))(lora_linear, x)
    ```

    It composes with JAX's transforms in both orders (`jax.jit(quax.quaxify(f))` and
    `quax.quaxify(jax.jit(f))`, likewise `grad`, `vmap`, ...), and with itself.

    Called inside another quaxified function on values that meet that function's
    traced inputs (a closed-over `G * t`, whose operator runs `quaxify`), the values
    join the enclosing quax trace, as JAX lifts a constant into the trace of the
    tracer it meets. A `filter_spec` other than `True`, on either level, keeps the
    levels apart instead: the outer one leaves the unselected values to the inner.

    **Arguments:**

    - `fn`: the function to transform; it need not know about quax.
    - `filter_spec`: which of `(fn, args, kwargs)` to dispatch on, as for
        `eqx.partition`. Values that it leaves out pass through unchanged, typically to
        reach a nested `quaxify`.

    **Returns:**

    A callable `equinox.Module` with the signature of `fn`, typed as taking any
    arguments and returning `Any`: it is called with values where `fn`'s annotations
    say arrays, and returns what the rules return (a `LoraArray` where `fn` is
    annotated to return an array). `__wrapped__` is `fn`.

    **Called with no value.** Called with no `Value` among its arguments (with the
    default `filter_spec`), it runs `fn` as plain JAX, at plain JAX's cost
    (functions with data-dependent shapes, such as `jnp.unique`, work eagerly), and
    a value that `fn` builds inside still has its rules applied
    (`jax.vmap(quax.quaxify(lambda d, u, b: jnp.linalg.solve(LowRankPlusDiagonal(d,
    u), b)))`): where such a value meets a JAX function outside any quax trace,
    `fn` runs again, from the start, under quax. Its Python before that point,
    side effects included, then runs twice, and the work before it is done twice:
    eagerly, computed twice; while JAX stages a program (`jax.jit`), staged
    twice, and XLA drops the first, unused copy when it compiles the program,
    except its effects (`jax.debug.print`, callbacks) and what they read, which
    then run twice each time the program runs. Build the values before such
    effects, or pass one in as an argument. Inside another quaxified function,
    values built in `fn` join that function's trace.
    """
    # What `eqx.module_update_wrapper(_Quaxify(fn, filter_spec))` builds, at a
    # fraction of its cost (see `benchmarks/README.md`), as `quax.quaxify(f)(x)` is
    # often written inline: the fields, then `fn`'s name, docstring, ... where
    # equinox's flattening keeps them.
    eqx_warn_transformed_function(_Quaxify, fn)
    wrapper = object.__new__(_Quaxify)
    attributes: dict[str, Any] = vars(wrapper)
    attributes["fn"] = fn
    attributes["filter_spec"] = filter_spec
    for name in EQX_WRAPPER_FIELD_NAMES:
        value = getattr(fn, name, _MISSING)
        if value is not _MISSING:
            attributes[name] = value
    return wrapper


_MISSING = object()
