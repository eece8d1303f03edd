"""Custom derivatives (`custom_jvp`, `custom_vjp`) and `shard_map` on values.

Each re-binds its primitive at the parent of the quax trace, over the leaves of the
values, with its sub-functions run on the values under a nested quax trace. The
trace reaches these through its table of higher-order rules (see
`_transform/_trace.py`).

Below a quax trace, a `jit` stages these primitives with their sub-functions traced
while the primitive binds: here the staging trace is made current for that tracing
(`_nesting.py`), so that a value built in a sub-function finds the quax
trace above it.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._compat import (
    AdZero,
    FlatTree,
    Primitive,
    SymbolicZero,
    Tracer,
    bind_custom_jvp,
    bind_custom_vjp,
    bwd_result,
    bwd_split,
    call_fresh,
    custom_jvp_call_p,
    custom_vjp_call_p,
    pvary_to_spec,
    set_current_trace,
    shard_map_p,
    typeof,
    wrap_init,
)
from .._transform import _trace
from .._transform._quaxify import quaxify
from .._values._value import Value, describe, is_value, materialise_or_explain
from . import _nesting as _nesting  # `_nesting`: the bodies' traces nest
from ._joins import Fill, materialise_to_join


__all__: list[str] = []

# custom_jvp / custom_vjp --------------------------------------------------------------
#
# Like `BatchTrace`, quax re-binds a custom-derivative call at the parent trace, over
# the leaves of the values, so that the custom rule still applies to whatever
# differentiates the program later. The rule then sees the values themselves, with
# tangents (cotangents) of the same type built from the leaves' tangents: that is
# exact when the represented array is a linear function of the leaves, which a type
# declares with the class attribute `linear_in_leaves = True` (a dense wrapper, a
# sparse array's data, a symbolic zero). A type may give another tangent through
# `Value.tangent` (linear in the leaves' tangents); a type that is not linear enters
# whole only when it does. A type whose static fields scale its numbers (units)
# relabels the cotangents through `Value.cotangent` (a length's is per metre), and
# a rule's cotangent of an input in that structure gives the leaves' cotangents.
# Values of other types enter the call materialised, so
# the custom rule sees the dense array it was written for. Outputs of types that
# are not linear leave the call materialised: their tangents are not their leaves'.
#
# A value type may also take a custom-JVP function's derivative over: its
# `custom_jvp_rule` (see `own_rule`) returns a JVP rule that replaces the function's
# own, e.g. one that differentiates the structure's own algorithm. The call is still
# re-bound over the leaves; only the rule it differentiates by changes.


def _linear(x: Any) -> bool:
    return isinstance(x, Value) and type(x).linear_in_leaves


def _own_tangent(x: Any) -> bool:
    """Whether `x` is a value whose type overrides `Value.tangent`."""
    return isinstance(x, Value) and type(x).tangent is not Value.tangent


def _densify_input(x: Any, primitive: Primitive) -> Any:
    return x if _own_tangent(x) else _densify_nonlinear(x, primitive)


def _densify_nonlinear(x: Any, primitive: Primitive) -> Any:
    if _linear(x):
        return x
    return materialise_or_explain(
        x,
        lambda value: (
            f"`{primitive.name}` (a function with a custom derivative) received or "
            f"returned a {value}. Its custom rule is written for dense arrays, and "
            f"`{type(x).__qualname__}` does not declare `linear_in_leaves = True` "
            "(its array is not a linear function of its leaves), so quax must "
            "materialise it"
        ),
        "\nAllow the value to materialise, declare `linear_in_leaves = True` on "
        "the type if it is linear, or give the type a `tangent` method (see "
        "`quax.Value.tangent`).",
    )


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


def _input_tangent(primal: Any, leaves: Sequence[Any], symbolic: bool) -> Any:
    """The tangent a custom JVP rule receives for the input `primal` (a value or an
    array), from its leaves' tangents: through the type's `tangent`."""
    if not isinstance(primal, Value):
        return leaves[0]
    dot = _tangent_value(primal, leaves, symbolic)
    if _is_zero(dot) or not _own_tangent(primal):
        return dot
    return _checked_tangent(primal, primal.tangent(dot))


def _checked_tangent(primal: Value, tangent: Any) -> Any:
    shape = primal.aval().shape
    if jnp.shape(tangent) != shape:
        raise TypeError(
            f"`{type(primal).__qualname__}.tangent` returned a tangent of shape "
            f"{jnp.shape(tangent)} for a {describe(primal)}; it must have the "
            "value's shape."
        )
    return tangent


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
    return list(quaxify(lambda *v: call_fresh(fun, *v))(*values))


JVPRule = Callable[[list[Any], list[Any]], tuple[Sequence[Any], Sequence[Any]]]


def own_rule(
    name: str, fun: Callable[..., list[Any]], values: Sequence[Any]
) -> JVPRule | None:
    """The JVP rule that an input's type gives for the custom-JVP function `name`
    (`fun`, on values) in place of the function's own (see
    `Value.custom_jvp_rule`), or `None`."""
    for v in values:
        if is_value(v) and type(v).custom_jvp_rule is not Value.custom_jvp_rule:
            rule = type(v).custom_jvp_rule(name, fun, values)
            if rule is not None:
                return rule
    return None


def _instantiated_tangent(primal: Any, leaves: Sequence[Any]) -> Any:
    """The tangent an own rule receives for `primal`: a value of its type holding
    the leaves' tangents, or the array's tangent, zeros instantiated."""
    if isinstance(primal, Value):
        return _tangent_value(primal, leaves, symbolic=False)
    (t,) = leaves
    return jnp.zeros(t.shape, t.dtype) if _is_zero(t) else t


def _checked_rule_outputs(name: str, owner: str, out: Any) -> tuple[list, list]:
    try:
        outs, tangents = (list(x) for x in out)
    except (TypeError, ValueError):
        outs, tangents = None, None
    if outs is None or tangents is None or len(outs) != len(tangents):
        raise TypeError(
            f"The JVP rule that `{owner}.custom_jvp_rule` gave for `{name}` must "
            "return a pair `(outputs, output_tangents)` of sequences of equal "
            f"length; it returned {type(out).__name__}."
        )
    for o, t in zip(outs, tangents, strict=True):
        if jnp.shape(t) != jnp.shape(o):
            raise TypeError(
                f"The JVP rule that `{owner}.custom_jvp_rule` gave for `{name}` "
                f"returned a tangent of shape {jnp.shape(t)} for an output of "
                f"shape {jnp.shape(o)}; they must match."
            )
    return outs, tangents


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
    keep: bool = False,
) -> Callable[..., list[Any]]:
    """`fun` as a function of the inputs' leaves, returning its outputs' leaves and
    recording their tree in `out_tree`. The leaves `known` now stay constants of it.
    Outputs of types that are not linear in their leaves are materialised, unless
    `keep` (a type's own JVP rule differentiates the call: it gives their leaves'
    tangents itself)."""

    def fun_leaves(*leaves: Any) -> list[Any]:
        inputs = flat.unflatten(_with_known(leaves, known))
        outs = _run(fun, *inputs)
        if not keep:
            outs = [_densify_nonlinear(o, primitive) for o in outs]
        out_leaves, tree = jtu.tree_flatten(outs)
        out_tree[:] = [tree]
        return out_leaves

    return fun_leaves


def _leaves(values: Sequence[Any]) -> list[Any]:
    return jtu.tree_leaves(list(values))


def _known(leaves: Sequence[Any]) -> list[Any]:
    """Each leaf whose value is known now, else `None`: a leaf that is not traced,
    or a `Fill` for a traced one that the trace shows to be a constant fill.

    Inside a custom derivative's primal function such leaves stay constants, as they
    are without the custom derivative (and as the `jit` rule keeps them): rules may
    need their values, and a loop inside may start a carry from one (the zeros or
    infinities a solver fills in), which quax lifts into a value type only when it
    is known."""
    return [Fill.of(leaf) if isinstance(leaf, Tracer) else leaf for leaf in leaves]


def _with_known(leaves: Sequence[Any], known: Sequence[Any]) -> list[Any]:
    return [_known_or(x, k) for x, k in zip(leaves, known, strict=True)]


def _known_or(leaf: Any, known: Any) -> Any:
    if known is None:
        return leaf
    if isinstance(known, Fill):
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
    name = fun.debug_info.func_name
    calls = [0]

    def fun_values(*values: Any) -> list[Any]:
        calls[0] += 1
        return _run(fun, *values)

    rule = own_rule(name, fun_values, values)
    if rule is None:
        with set_current_trace(trace.parent_trace):
            values = [_densify_input(v, primitive) for v in values]
    owner = next((type(v).__qualname__ for v in values if is_value(v)), "")
    flat = _Flat(values)
    leaves = _leaves(values)
    n = len(leaves)
    out_tree: list[Any] = []

    # With a type's own rule, outputs of any type stay as they are: the rule gives
    # each output's tangent as a value of its type holding its leaves' tangents
    # (see `Value.custom_jvp_rule`), exact whether or not the type is linear.
    fun_leaves = _on_leaves(
        fun, flat, primitive, out_tree, _known(_leaves(values)), keep=rule is not None
    )

    def run_jvp(primals: list[Any], leaf_tangents: list[list[Any]]) -> tuple:
        if rule is not None:
            tangents = [
                _instantiated_tangent(p, ts)
                for p, ts in zip(primals, leaf_tangents, strict=True)
            ]
            before = calls[0]
            out = _checked_rule_outputs(name, owner, rule(primals, tangents))
            if calls[0] == before:
                # JAX reads the output tree that running `fun` (or `jvp`) records.
                jax.eval_shape(fun_values, *primals)
            return out
        tangents = [
            _input_tangent(p, ts, symbolic_zeros)
            for p, ts in zip(primals, leaf_tangents, strict=True)
        ]
        outs = _run(jvp, *primals, *tangents)
        m = len(outs) // 2
        return outs[:m], outs[m:]

    def jvp_leaves(*args: Any) -> list[Any]:
        primals = flat.unflatten(args[:n])
        outs, out_tangents = run_jvp(primals, flat.split(args[n:]))
        primal_out, tangent_out = [], []
        for p, t in zip(outs, out_tangents, strict=True):
            if rule is None:
                p = _densify_nonlinear(p, primitive)
            leaf_ts = (
                _leaf_tangents(p, t, symbolic_zeros) if isinstance(p, Value) else None
            )
            if leaf_ts is None:
                # The tangent has another structure than the primal: go dense.
                p = materialise_to_join(p, f"an output of `{primitive.name}`")
                leaf_ts = [
                    materialise_to_join(t, f"a tangent output of `{primitive.name}`")
                ]
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
        values = [_densify_input(v, primitive) for v in values]
    flat = _Flat(values)
    out_tree: list[Any] = []
    fwd_trees: list[Any] = []

    known = _known(_leaves(values))
    fun_leaves = _on_leaves(fun, flat, primitive, out_tree, known)

    def fwd_leaves(*pairs: Any) -> list[Any]:
        inputs = flat.unflatten(_with_known(pairs[::2], known))
        nonzero = [any(part) for part in flat.split(pairs[1::2])]
        interleaved = [x for pair in zip(inputs, nonzero, strict=True) for x in pair]
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
            _output_cotangent(o, ts, symbolic_zeros)
            for o, ts in zip(outs, out_flat.split(args[tree.num_leaves :]), strict=True)
        ]
        cts_in, logs = bwd_split(_run(bwd, *res, *cts))
        leaf_cts = [
            leaf
            for x, ct, k in zip(inputs, cts_in, flat.split(known), strict=True)
            for leaf in (
                [AdZero(_tangent_aval(x))]
                if _constant_input(x, ct, k)
                else _input_cotangents(x, ct, primitive)
            )
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


def _output_cotangent(out: Any, leaves: Sequence[Any], symbolic: bool) -> Any:
    """The cotangent a custom VJP rule receives for the output `out` (a value or
    an array), from its leaves' cotangents: through the type's `cotangent`."""
    if not isinstance(out, Value):
        return leaves[0]
    relabels = type(out).cotangent is not Value.cotangent
    # A type that relabels its cotangents gets a zero one as zeros of the
    # relabelled type, not a symbolic zero: the rule would fill that in itself
    # from a primal (equinox's loops start the cotangent carry from `zeros_like`
    # of the carry), in the primal's units or none, where the other cotangents
    # it meets are per those units.
    bar = _tangent_value(out, leaves, symbolic and not relabels)
    return bar if _is_zero(bar) else out.cotangent(bar)


def _constant_input(x: Any, ct: Any, known: Sequence[Any]) -> bool:
    """Whether the input `x` is a plain array known when the call was bound (a
    constant: `known` holds its one leaf's known value) with a cotangent `ct` of a
    value type. The rule saw the constant lifted into that type (a loop's carry
    started from zeros, given units inside); no derivative flows through a
    constant, so its cotangent is a zero."""
    return not isinstance(x, Value) and isinstance(ct, Value) and known[0] is not None


def _input_cotangents(x: Any, ct: Any, primitive: Primitive) -> list[Any]:
    """The leaves' cotangents of the input `x` from the rule's cotangent `ct`."""
    if not isinstance(x, Value):
        return [materialise_to_join(ct, f"a cotangent of `{primitive.name}`")]
    # The structure of a cotangent of `x` (its leaves are `x`'s, relabelled).
    leaf_cts = (
        _leaf_tangents(x.cotangent(x), ct, symbolic=False) if _linear(x) else None
    )
    if leaf_cts is not None:
        return leaf_cts
    # A dense cotangent: transpose the map from the float leaves' tangents to the
    # dense tangent (`materialise` for a linear value, else through the type's
    # `tangent`), the exact cotangent of the leaves.
    leaves, treedef = jtu.tree_flatten(x)
    floats = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]
    own = _own_tangent(x)

    def dense_of(float_leaves: list[Any]) -> Any:
        full = list(leaves)
        for i, leaf in zip(floats, float_leaves, strict=True):
            full[i] = leaf
        dot = jtu.tree_unflatten(treedef, full)
        if not own:
            return dot.materialise()
        tangent = _checked_tangent(x, x.tangent(dot))
        return materialise_to_join(tangent, f"the tangent of a {describe(x)}")

    dense_ct = materialise_to_join(ct, f"a cotangent of `{primitive.name}`")
    try:
        (float_cts,) = jax.linear_transpose(dense_of, [leaves[i] for i in floats])(
            dense_ct
        )
    except Exception as e:
        raise TypeError(
            f"The custom VJP of `{primitive.name}` returned a dense cotangent for a "
            f"{describe(x)}; quax maps it onto the value's leaves by transposing "
            f"`{type(x).__qualname__}.{'tangent' if own else 'materialise'}`, and "
            f"that failed: {e}\nReturn a "
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
        f"`shard_map` splits a {describe(x)} by {spec}, but its leaf of shape "
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
    flat = _Flat(values)
    in_specs = [
        _leaf_spec(v, leaf, spec) if isinstance(v, Value) else spec
        for v, spec, leaves in zip(
            values, params["in_specs"], flat.split(_leaves(values)), strict=True
        )
        for leaf in leaves
    ]
    out: dict[str, Any] = {}

    def run_body(inner: Any, leaves: Sequence[Any]) -> list[Any]:
        ans, specs = fun(*[inner.wrap(v) for v in flat.unflatten(leaves)]).unpack_aux()
        out["tree"] = ans.map(lambda _: None)
        out["specs"] = specs
        return list(ans.vals)

    def body(*leaves: Any) -> Any:
        outs = _trace.run_nested(lambda inner: run_body(inner, leaves))
        specs = out.pop("specs")
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


_trace.higher_order_rules[custom_jvp_call_p] = custom_jvp_call
_trace.higher_order_rules[custom_vjp_call_p] = custom_vjp_call
_trace.higher_order_rules[shard_map_p] = shard_map_call
