"""The quax transform: a `Trace`/`Tracer` pair, as `jax.vmap`'s `BatchTrace`.

A `QuaxTracer` stands for one [`quax.Value`][] inside a quaxified function. When a
primitive is bound with at least one of them, `QuaxTrace.process_primitive` looks up a
rule for the input types (through the registry's cache) and runs it under the parent
trace. Control-flow primitives (`jit`, `cond`, `while`, ...) have registered rules
like any other (`_rules/_functions.py`, `_rules/_control_flow.py`, `_rules/_loops.py`).
Custom derivatives and `shard_map` reach the trace through its `process_*` methods
instead; their rules are in the table `higher_order_rules`, which the modules defining
them fill, as JAX's `batching.primitive_batchers` is filled: this module imports none
of them.

`run_nested` is the one way quax runs a function under a new quax trace.
"""

import functools as ft
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax.tree_util as jtu
import numpy as np
from jax import Array

from .._caching import _replay
from .._caching._eager import call_compiled
from .._caching._per_jaxpr import holds_staged_values, jaxpr_holds_staged_values
from .._compat import (
    DynamicJaxprTrace,
    Primitive,
    Trace,
    Tracer,
    TraceTag,
    call_at_trace,
    call_rule_at_trace,
    current_trace,
    ensure_no_leaks,
    is_eval_trace,
    jit_inlines,
    jit_p,
    manual_axes_active,
    register_bind_conversion,
    register_tracer_type,
    staged_values_state,
    typeof,
    with_leaf_vma,
)
from .._dispatch import _registry
from .._dispatch._staged import (
    lift,
    staged_value_p,
    staged_values_into,
    unstage,
)
from .._foundation import _debug
from .._foundation._jit_rules import kept_inline_jits
from .._values import _value
from .._values._checks import check_value
from .._values._value import (
    Value,
    is_value,
    materialise_outside_quax,
    plain_running,
    value_classes,
)
from ._interpreter import body_source, eval_quaxified


__all__ = [
    "QuaxTrace",
    "QuaxTracer",
    "active_trace",
    "add_staging_rule",
    "higher_order_rules",
    "run_nested",
    "staging_rules",
    "unchecked_primitives",
]

_T = TypeVar("_T")

# The rules for the primitives that reach the trace through a `process_*` method
# rather than `process_primitive`: `custom_jvp_call`, `custom_vjp_call` and
# `shard_map` (filled by `_rules/_custom.py`). Each takes the trace, the primitive, its
# sub-functions, the input values and params, as the method that calls it shows.
higher_order_rules: dict[Primitive, Callable[..., Any]] = {}
# Primitives whose rules' outputs the debug checks do not compare with the
# primitive's abstract evaluation (higher-order ones: filled by
# `_rules/_control_flow.py`).
unchecked_primitives: set[Primitive] = set()
# Primitives with sub-jaxprs whose rules re-run them, and the core's rule for each
# (filled by the modules of `_rules/` defining them): one whose jaxprs stage a value
# (see `quax._dispatch._staged`) goes to that rule even without a value among its
# inputs, as only a quax trace can give that value its type.
staging_rules: dict[Primitive, _registry.Rule] = {}


def add_staging_rule(primitive: Primitive, function: Callable[..., Any]) -> None:
    """Make `function` (the core's registered rule for `primitive`, called with the
    inputs and the params) `primitive`'s entry in `staging_rules`."""
    staging_rules[primitive] = lambda values, params: function(*values, **params)


# Read on every primitive without a function call: the registry's dispatch cache
# (`rule_for` fills it; `register` clears it in place) and the materialisation
# reports' state (non-empty while `quax.track_materialisation` runs).
_rule_cache = _registry._cache
_materialisations = _value._state


class QuaxTracer(Tracer):
    """A [`quax.Value`][] inside a quaxified function.

    Besides the array interface of a JAX tracer, it forwards attribute access to the
    value it stands for (`q.unit`, `q.to("km")`, ...): values in the result, also
    those that a method returns, come back as tracers of the same trace.
    """

    __slots__ = ("_quax_value",)

    def __init__(self, trace: "QuaxTrace", value: Value, checked: bool = False) -> None:
        self._trace = trace
        self._quax_value = value
        # The aval is computed now, so that a value whose `aval` raises is refused
        # here, with its own error. A `checked` value (a compiled eager program's
        # output, whose structure that program's first call checked) may never have
        # its aval read, as the next library call runs compiled on it too: its `aval`
        # slot is filled on first read (by `__getattr__`).
        if not checked:
            self.aval = _aval(trace, value)

    @property
    def quax_value(self) -> Value:
        """The value this tracer stands for."""
        return self._quax_value

    def full_lower(self) -> "QuaxTracer":
        return self

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that neither the tracer nor its aval has, and for
        # an `aval` not read yet.
        if name == "aval":
            aval = self.aval = _aval(self._trace, self._quax_value)
            return aval
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_"):
                raise
        out = getattr(self._quax_value, name)
        if callable(out) and not is_value(out):
            return ft.wraps(out)(ft.partial(_call_rewrapped, self._trace, out))
        return _rewrap(self._trace, out)

    def __repr__(self) -> str:
        return f"QuaxTracer({self._quax_value!r})"


def _aval(trace: "QuaxTrace", value: Value) -> Any:
    """The aval of a tracer of `trace` for `value`."""
    # `type(value).aval(value)`, not `value.aval()`: equinox would build a bound
    # method module on every access, which costs more than the call itself.
    aval = type(value).aval(value)
    if trace.manual:
        # Inside `shard_map`: the aval must vary along the manual axes its leaves
        # vary along, as collectives (`pcast`, ...) read that from its type.
        aval = with_leaf_vma(aval, jtu.tree_leaves(value))
    return aval


def _rewrap(trace: "QuaxTrace", out: Any) -> Any:
    """`out` with every value in it a tracer of `trace`."""
    return jtu.tree_map(trace.wrap, out, is_leaf=is_value)


def _call_rewrapped(trace: "QuaxTrace", method: Any, *args: Any, **kwargs: Any) -> Any:
    return _rewrap(trace, method(*args, **kwargs))


# Python operators on a tracer of an eager quax trace, with another one of it or a
# small plain operand, run as one compiled program (see `quax._caching._eager`) rather
# than through `jax.numpy`'s inlined `jit`, equation by equation; otherwise as on any
# tracer.
_PLAIN = (Array, np.ndarray, np.generic, int, float, complex)


def _eager_operator(name: str, op: Callable[[Any, Any], Any], reflected: bool) -> Any:
    def default(self: QuaxTracer, other: Any) -> Any:
        # Looked up when called: `jax.numpy` installs the tracers' operators.
        return getattr(Tracer, name)(self, other)

    def method(self: QuaxTracer, other: Any) -> Any:
        trace = self._trace
        if trace.eager:
            if type(other) is QuaxTracer and other._trace is trace:
                operand = other._quax_value
            elif isinstance(other, _PLAIN) and not isinstance(other, Tracer):
                operand = other
            else:
                return default(self, other)
            value = self._quax_value
            args = [operand, value] if reflected else [value, operand]
            done, out = call_rule_at_trace(
                trace.parent_trace, _compiled_operator, args, op
            )
            if done:
                return QuaxTracer(trace, out, True) if is_value(out) else out
        return default(self, other)

    method.__name__ = method.__qualname__ = name
    return method


def _compiled_operator(args: list[Any], op: Any) -> tuple[bool, Any]:
    return call_compiled(op, lambda: ft.partial(_run_operator, op), args)


def _run_operator(op: Callable[..., Any], *args: Any) -> Any:
    return run_nested(lambda trace: op(*[trace.wrap(a) for a in args]))


for _name, _op in [
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("truediv", operator.truediv),
    ("matmul", operator.matmul),
    ("pow", operator.pow),
]:
    setattr(QuaxTracer, f"__{_name}__", _eager_operator(f"__{_name}__", _op, False))
    setattr(QuaxTracer, f"__r{_name}__", _eager_operator(f"__r{_name}__", _op, True))

# `jax.typeof` reads every tracer bound with a primitive: one lookup, not an MRO walk.
register_tracer_type(QuaxTracer)


class QuaxTrace(Trace):
    """Reinterprets every primitive bound on a `QuaxTracer` by dispatching on types."""

    __slots__ = ("eager", "manual", "parent_trace", "replays", "selective", "tag")

    def __init__(
        self, parent_trace: Trace, tag: TraceTag, selective: bool = False
    ) -> None:
        super().__init__()
        self.parent_trace = parent_trace
        self.tag = tag
        # Whether it dispatches only on the values a `filter_spec` selects, leaving
        # the others to a nested `quaxify` (then values do not join it).
        self.selective = selective
        # Whether this trace runs inside `shard_map`, where its tracers' avals carry
        # the varying manual axes of their values' leaves. Checked once here, so that
        # tracers outside `shard_map` pay one attribute test.
        self.manual = manual_axes_active()
        # Whether it runs eagerly: then an inlined `jit` (every `jax.numpy` function)
        # runs as one compiled program, as JAX runs it on plain arrays.
        self.eager = is_eval_trace(parent_trace)
        # Whether it stages a program, outside `shard_map`: then an inlined `jit`
        # replays the equations its body staged before (see `quax._caching._replay`).
        self.replays = type(parent_trace) is DynamicJaxprTrace and not self.manual

    def to_value(self, x: Any) -> Any:
        """The `Value` behind one of this trace's tracers; anything else unchanged."""
        if isinstance(x, QuaxTracer) and x._trace.tag is self.tag:
            return x._quax_value
        return x

    def wrap(self, x: Any) -> Any:
        """A tracer of this trace for a `Value`; anything else unchanged."""
        if is_value(x):
            return QuaxTracer(self, x)
        return x

    def box(self, x: Any) -> Any:
        """`wrap` for a value that comes in from outside quax (an argument of a
        quaxified function, a value it closes over), which JAX or Equinox may have
        rebuilt without its constructor: its type's checks run first (see
        `quax._values._checks`)."""
        if is_value(x):
            check_value(x)
            return QuaxTracer(self, x)
        return x

    def stage_value(self, val: Any) -> Any:
        if isinstance(val, QuaxTracer) and val._trace.tag is self.tag:
            return val
        return self.parent_trace.stage_value(val)

    def process_primitive(
        self, primitive: Primitive, tracers: Sequence[Any], params: dict[str, Any], /
    ) -> Any:
        """Bind `primitive` on `tracers`, some of them this trace's, as JAX's own
        traces do (`BatchTrace.process_primitive`): the inputs' values out of this
        trace's tracers, then one of three routes: a staged value, the parent
        trace, or the rule (with the caches around it: `apply_rule`).

        Python's operators on a tracer of an eager trace (`x * y`) take a route
        beside this one: `QuaxTracer.__mul__` runs the operator as one compiled
        program (see `_eager_operator`), in which `jax.numpy`'s `multiply` binds
        its inlined `jit` and then `mul` on a trace that stages it, each reaching
        this method."""
        # The hot path of quax: kept to plain loops, one dict lookup (the registry's
        # dispatch cache, read in `_run_rule` rather than through `rule_for`), and
        # JAX's trace switch without its context manager.
        tag = self.tag
        values = []
        found = False
        for t in tracers:
            if type(t) is QuaxTracer and t._trace.tag is tag:
                values.append(t._quax_value)
                found = True
            else:
                values.append(t)
        # 1. A staged value: a value built inside a function that JAX staged, which
        # only this trace can give its type back (see `quax._dispatch._staged`).
        if primitive is staged_value_p:
            return QuaxTracer(self, unstage(values, **params))
        if not found:
            # 2. The parent trace: no input is this trace's, and no sub-jaxpr stages
            # a value, which only this trace can type.
            if primitive not in staging_rules or not holds_staged_values(params):
                return self.parent_trace.process_primitive(primitive, values, params)
            # Only a sub-jaxpr's staged value brings the primitive here: the core's
            # rule, which re-runs the sub-jaxprs on a quax trace. A family's rule
            # taking its values or arrays (`NamedArray | ArrayLike`) matches these
            # plain inputs too, but was written for calls with its values: it
            # would run the sub-jaxprs as plain JAX, without the trace that gives
            # the staged value its type.
            rule = staging_rules[primitive]
            return self.apply_rule(primitive, tracers, values, params, rule)
        # 3. The rule, with the caches around it (`apply_rule`) where there are any
        # for it: for an inlined `jit`, and while a program is staged. Otherwise
        # it runs as it is, one call less on every eager primitive.
        if primitive is jit_p or self.replays:
            return self.apply_rule(primitive, tracers, values, params)
        return self._run_rule(primitive, values, params)

    def apply_rule(
        self,
        primitive: Primitive,
        tracers: Sequence[Any],
        values: list[Any],
        params: dict[str, Any],
        rule: _registry.Rule | None = None,
    ) -> Any:
        """`primitive`'s rule for `values` (`tracers`' values, some of them this
        trace's; `rule` where given, else the one the registry resolves), with the
        caches around it; its output values as this trace's tracers.

        The rule of an inlined `jit` (every `jax.numpy` function, but those with
        `register_function` rules: see `kept_inline_jits`) is its equations, bound
        one by one on this trace (`_inline_jit`); any other primitive's is the one
        the registry resolves (`_run_rule`). The caches around it: eagerly, an
        inlined `jit` runs as one compiled program (see `quax._caching._eager`);
        while a program is staged, a rule's equations recorded for the same key
        are replayed (see `quax._caching._replay`)."""
        # Whether the `jit` is inlined into this trace: JAX inlines it, and no
        # `register_function` rule keeps it (see `kept_inline_jits`).
        inline = primitive is jit_p and jit_inlines(params)
        if inline:
            sources = kept_inline_jits.get(params["name"])
            inline = sources is None or body_source(params["jaxpr"]) not in sources
        if inline and self.eager:
            done, out = call_rule_at_trace(
                self.parent_trace, _compiled_inline, values, params
            )
            if done:
                return [QuaxTracer(self, o, True) if is_value(o) else o for o in out]
        if inline:
            run = ft.partial(call_at_trace, self, _inline_jit, tracers, params)
            if self.replays:
                return _replay.inline(self, values, params["jaxpr"], run)
            return run()
        if self.replays and primitive not in unchecked_primitives:
            run = ft.partial(self._run_rule, primitive, values, params, rule)
            return _replay.bind(self, primitive, values, params, run)
        return self._run_rule(primitive, values, params, rule)

    def _run_rule(
        self,
        primitive: Primitive,
        values: list[Any],
        params: dict[str, Any],
        rule: _registry.Rule | None = None,
    ) -> Any:
        """`primitive`'s rule for `values` (`rule` where given, else its registered
        one), run under the parent trace; its output values as this trace's
        tracers."""
        if rule is None:
            rule = _rule_cache.get((primitive, tuple(map(type, values))))
            if rule is None:
                rule = _registry.rule_for(primitive, values)
        if _debug.is_enabled() or _materialisations.reports:  # `_value.tracking()`
            checked = ft.partial(_apply_checked, primitive, rule)
            out = call_rule_at_trace(self.parent_trace, checked, values, params)
        else:
            out = call_rule_at_trace(self.parent_trace, rule, values, params)
        if primitive.multiple_results:
            return [QuaxTracer(self, o) if is_value(o) else o for o in out]
        if type(out) in value_classes or isinstance(out, Value):  # `is_value`, inlined
            return QuaxTracer(self, out)
        return out

    def process_custom_jvp_call(
        self,
        primitive: Primitive,
        fun: Any,
        jvp: Any,
        tracers: Sequence[Any],
        /,
        *,
        symbolic_zeros: bool,
    ) -> Any:
        values = [self.to_value(t) for t in tracers]
        rule = higher_order_rules[primitive]
        outs = rule(self, primitive, fun, jvp, values, symbolic_zeros)
        return [self.wrap(o) for o in outs]

    def process_custom_vjp_call(
        self,
        primitive: Primitive,
        fun: Any,
        fwd: Any,
        bwd: Any,
        tracers: Sequence[Any],
        /,
        *,
        out_trees: Any,
        symbolic_zeros: bool,
    ) -> Any:
        values = [self.to_value(t) for t in tracers]
        rule = higher_order_rules[primitive]
        outs = rule(self, primitive, fun, fwd, bwd, values, out_trees, symbolic_zeros)
        return [self.wrap(o) for o in outs]

    def process_shard_map(
        self, primitive: Primitive, fun: Any, tracers: Sequence[Any], /, **params: Any
    ) -> Any:
        values = [self.to_value(t) for t in tracers]
        return higher_order_rules[primitive](self, primitive, fun, values, params)


def _bound_value(value: Value) -> Any:
    """A value passed to `Primitive.bind` as it is, not as a quaxified function's
    argument (`lax.add(x, y)` with `y` a value the function closes over), which JAX
    would refuse as "not a valid JAX type". Inside a quax trace, also below the
    `jit`, `vmap`, `grad`, ... traces in a quaxified function's body, the value joins
    it as `__jax_array__` lifts it (see `quax._dispatch._staged.lift`), so that its
    rules apply, or its refusal to materialise says what to do, as on a `jax.numpy`
    function. Outside any, it is materialised, as a primitive binds arrays, or
    refuses with the value's own error. Neither refusal is a `TypeError`:
    `Primitive.bind` replaces one raised here with its own message, which would
    lose the refusal's."""
    check_value(value)
    trace, between = active_trace()
    if trace is None:
        return materialise_outside_quax(value, type_error=False)
    if between and trace.selective:
        return type(value).materialise(value)
    return lift(value, trace, between, RuntimeError)


register_bind_conversion(Value, _bound_value)


def _jax_array(value: Value) -> Any:
    """`Value.__jax_array__`: the value lifted into the active quax trace (see
    `quax._dispatch._staged.lift`); outside one, or in a trace that dispatches only on
    the values a `filter_spec` selects, its materialisation under its policy."""
    check_value(value)
    trace, between = active_trace()
    if trace is None:
        return materialise_outside_quax(value)
    if trace.selective:
        return type(value).materialise(value)
    return lift(value, trace, between)


_value.set_jax_array_conversion(_jax_array)


def active_trace() -> tuple[QuaxTrace | None, list[Trace]]:
    """The innermost quax trace that the current trace is, or runs inside (through
    `vmap`, `grad`, `jit`, ... traces, which keep their parent), or `None`; and the
    traces between it and the current one (innermost first)."""
    trace = current_trace()
    between = []
    while trace is not None:
        if type(trace) is QuaxTrace:
            return trace, between
        between.append(trace)
        trace = getattr(trace, "parent_trace", None)
    return None, between


def run_nested(body: Callable[[QuaxTrace], _T], selective: bool = False) -> _T:
    """Run `body(trace)` with `trace` a new quax trace, nested in the current one and
    current while `body` runs. `body` makes its inputs tracers of it with
    `trace.wrap`; the tracers of it in `body`'s output come back as their values.
    Afterwards the trace must be unreachable: under `JAX_CHECK_TRACER_LEAKS`, JAX
    reports any tracer of it that leaked.

    **Arguments:**

    - `body`: the function to run; it must not keep `trace`.
    - `selective`: whether the trace dispatches only on values that a `filter_spec`
        selected (see `QuaxTrace.selective`).

    **Returns:**

    `body`'s output (any pytree), with this trace's tracers replaced by values.
    """
    staged = staged_values_state.value
    trace = QuaxTrace(current_trace(), TraceTag(), selective)
    staged_values_state.set_local(not selective)
    # Inside, a value meeting JAX outside this trace (in a rule's own code) is no
    # value of a quaxified function running plain (see `_value.plain_running`).
    # Set only where it is on (one C call to read it, rather than two to set and
    # reset it on every quaxified call).
    plain = plain_running.set(False) if plain_running.get() else None
    out: Any
    try:
        # `body(trace)`, at `trace`.
        out = call_at_trace(trace, operator.call, body, trace)
    finally:
        if plain is not None:
            plain_running.reset(plain)
        staged_values_state.set_local(staged)
    to_value = trace.to_value
    if type(out) is QuaxTracer:
        out = to_value(out)
    elif type(out) is tuple and all(type(o) is QuaxTracer for o in out):
        out = tuple(map(to_value, out))
    else:
        out = jtu.tree_map(to_value, out)
    with ensure_no_leaks(trace):
        del trace, to_value
    return out


def _inline_jit(tracers: Sequence[Any], params: dict[str, Any]) -> list[Any]:
    """An inlined `jit` (as every `jax.numpy` function is): its equations are bound
    on the current quax trace, each dispatched on its own, as JAX inlines them into
    the trace that stages it. The `jit_p` rule is for kept (not inlined) calls."""
    jaxpr = params["jaxpr"]
    trace = current_trace()
    # `jaxpr` is the only sub-jaxpr among a `jit`'s params.
    if jaxpr_holds_staged_values(jaxpr):
        with staged_values_into(trace):
            return eval_quaxified(jaxpr.jaxpr, jaxpr.consts, *tracers, trace=trace)
    return eval_quaxified(jaxpr.jaxpr, jaxpr.consts, *tracers, trace=trace)


def _compiled_inline(values: list[Any], params: dict[str, Any]) -> tuple[bool, Any]:
    """An inlined `jit` in eager mode, as one compiled program (see
    `quax._caching._eager`)."""
    jaxpr = params["jaxpr"]
    return call_compiled(jaxpr, lambda: ft.partial(_run_jaxpr, jaxpr), values)


def _run_jaxpr(jaxpr: Any, *args: Any) -> list[Any]:
    return run_nested(
        lambda trace: eval_quaxified(
            jaxpr.jaxpr, jaxpr.consts, *[trace.wrap(a) for a in args]
        )
    )


def _apply_checked(
    primitive: Primitive,
    rule: _registry.Rule,
    values: list[Any],
    params: dict[str, Any],
) -> Any:
    """`rule(values, params)`, with materialisations attributed to `primitive` and,
    under debug checks, its output checked."""
    if _value.tracking():
        with _value.current_primitive(primitive):
            out = rule(values, params)
    else:
        out = rule(values, params)
    if _debug.is_enabled():
        _check_rule_output(primitive, values, params, out)
    return out


def _check_rule_output(
    primitive: Primitive, values: Sequence[Any], params: dict[str, Any], out: Any
) -> None:
    """Compare a rule's output avals with the primitive's abstract evaluation."""
    if primitive in unchecked_primitives:
        return
    in_avals = [v.aval() if isinstance(v, Value) else typeof(v) for v in values]
    try:
        expected, _ = primitive.abstract_eval(*in_avals, **params)
    except Exception:
        return
    outs = out if primitive.multiple_results else [out]
    expected = expected if primitive.multiple_results else [expected]
    got = [o.aval() if isinstance(o, Value) else typeof(o) for o in outs]
    for i, (g, e) in enumerate(zip(got, expected, strict=False)):
        if getattr(g, "shape", None) != getattr(e, "shape", None) or getattr(
            g, "dtype", None
        ) != getattr(e, "dtype", None):
            rule = _registry.resolve(primitive, values)
            raise TypeError(
                f"The quax rule for `{primitive.name}` on input types "
                f"({_value.describe_types(values)}) "
                f"returned output {i} "
                f"with aval {g.str_short()}, but `{primitive.name}` gives "
                f"{e.str_short()} for these inputs. Rule: {rule.reason}."
            )
    if len(got) != len(expected):
        raise TypeError(
            f"The quax rule for `{primitive.name}` returned {len(got)} outputs; "
            f"`{primitive.name}` has {len(expected)}."
        )
