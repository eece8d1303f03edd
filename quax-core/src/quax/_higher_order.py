"""Rules for JAX's higher-order primitives: nested `jit`, `cond`, `while`, `scan`,
`checkpoint`, `custom_linear_solve`, callbacks, and primitives that act on every leaf
of any value alike.

Each rule re-traces the primitive's inner jaxpr(s) under a fresh quax trace with the
values as inputs, and hands the result to JAX's public API (`jax.jit`, `lax.switch`,
`lax.while_loop`, ...), so that every value stays structured through the body. Loop
carries and branch outputs whose type changes are joined: the differing parts are
materialised (the family may refuse, giving an error that names the carry) and the
body re-traced, until the types are stable.
"""

import functools as ft
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.extend.core import primitives as _prims

from ._compat import (
    ClosedJaxpr,
    Primitive,
    cond_p,
    debug_callback_p,
    debug_print_p,
    eval_jaxpr,
    is_unspecified,
    jit_p,
    linear_solve_p,
    optimization_barrier_p,
    pure_callback_p,
    remat_p,
    scan_p,
    typeof,
    while_p,
)
from ._registry import fallback_rule, register
from ._values import Value, ValueLike, is_value


__all__ = ["HIGHER_ORDER", "JoinError"]


class JoinError(TypeError):
    """A loop carry or branch output changes type and cannot be joined."""


# Evaluating a jaxpr on values ---------------------------------------------------------

_eval_cache: "weakref.WeakKeyDictionary[Any, Callable[..., list[Any]]]" = (
    weakref.WeakKeyDictionary()
)


def _quaxified(jaxpr: Any) -> Callable[..., list[Any]]:
    """A quaxified function evaluating `jaxpr` (closed or open), cached per jaxpr so
    that JAX's own tracing caches hit when the same jaxpr comes back."""
    try:
        return _eval_cache[jaxpr]
    except (KeyError, TypeError):
        pass
    from ._quaxify import quaxify

    if isinstance(jaxpr, ClosedJaxpr):
        fn = ft.partial(eval_jaxpr, jaxpr.jaxpr, jaxpr.consts)
    else:
        fn = ft.partial(eval_jaxpr, jaxpr, ())
    out = quaxify(fn)
    try:
        _eval_cache[jaxpr] = out
    except TypeError:
        pass
    return out


def _structure(tree: Any) -> Any:
    """What must agree between loop iterations or branches: the pytree structure
    (value types and static metadata included) and each leaf's shape and dtype."""
    leaves, treedef = jtu.tree_flatten(tree)
    return treedef, tuple((np.shape(x), jnp.result_type(x)) for x in leaves)


def _describe(x: Any) -> str:
    if isinstance(x, Value):
        return f"{type(x).__qualname__} {x.aval().str_short()}"
    return f"array {typeof(x).str_short()}"


def _materialise(x: Any, where: str) -> Any:
    if not isinstance(x, Value):
        return x
    try:
        return x.materialise()
    except Exception as e:
        raise JoinError(
            f"{where}: its type changes, so quax must join the types by materialising "
            f"the {_describe(x)}, and that failed: {e}\nKeep the type stable in the "
            "body (return the same kind of value it receives), allow the value to "
            "materialise, or register a rule for the primitive."
        ) from e


def _materialise_at(xs: Sequence[Any], indices: set[int], where: Callable[[int], str]) -> list[Any]:
    return [_materialise(x, where(i)) if i in indices else x for i, x in enumerate(xs)]


# jit ----------------------------------------------------------------------------------


@register(jit_p)
def _jit(
    *args: ValueLike,
    jaxpr: Any,
    inline: bool,
    name: str,
    donated_invars: tuple[bool, ...],
    in_shardings: tuple[Any, ...],
    out_shardings: tuple[Any, ...],
    keep_unused: bool,
    **params: Any,
) -> list[Any]:
    fn = _quaxified(jaxpr)
    if inline:
        return fn(*args)
    body = _named(fn, name)
    donate = tuple(i for i, d in enumerate(donated_invars) if d)
    kwargs: dict[str, Any] = {}
    if not all(is_unspecified(s) for s in in_shardings):
        kwargs["in_shardings"] = tuple(
            None if is_unspecified(s) or is_value(a) else s
            for s, a in zip(in_shardings, args, strict=True)
        )
    del out_shardings  # outputs' types are only known after tracing the body
    return jax.jit(body, donate_argnums=donate, keep_unused=keep_unused, **kwargs)(*args)


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fn` under the jitted function's own name (kept in the jaxpr and HLO)."""

    def body(*args: Any) -> Any:
        return fn(*args)

    body.__name__ = body.__qualname__ = name
    return body


# cond / switch ------------------------------------------------------------------------


@register(cond_p)
def _cond(index: ValueLike, *ops: ValueLike, branches: Sequence[Any], **params: Any) -> list[Any]:
    del params
    if isinstance(index, Value):
        index = index.materialise()
    fns = [_quaxified(b) for b in branches]
    dense: set[int] = set()
    for _ in range(2):
        seen: list[Any] = []

        def branch(fn: Callable[..., Any], *operands: Any) -> Any:
            out = _materialise_at(fn(*operands), dense, lambda i: f"output {i} of a cond/switch")
            seen.append(out)
            return out

        try:
            return lax.switch(index, [ft.partial(branch, fn) for fn in fns], *ops)
        except TypeError:
            differing = _differing_outputs(seen)
            if not differing or differing <= dense:
                raise
            dense |= differing
    raise AssertionError("unreachable")


def _differing_outputs(outputs: list[Any]) -> set[int]:
    if len(outputs) < 2:
        return set()
    first = outputs[0]
    return {
        i
        for i in range(len(first))
        if any(_structure(o[i]) != _structure(first[i]) for o in outputs[1:])
    }


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

    def cond(c: list[Any]) -> Any:
        (pred,) = cond_fn(*cond_consts, *c)
        return pred.materialise() if isinstance(pred, Value) else pred

    return _stable_loop(
        carry,
        lambda c: body_fn(*body_consts, *c),
        lambda body, c: lax.while_loop(cond, body, c),
        "while_loop",
    )


def _stable_loop(
    carry: list[Any],
    body: Callable[[list[Any]], list[Any]],
    run: Callable[[Callable[[list[Any]], list[Any]], list[Any]], Any],
    what: str,
    num_carry: int | None = None,
) -> Any:
    """Run a loop whose body maps `carry` to a new carry (and, for scan, outputs
    after the first `num_carry`), joining carry types until they are stable."""
    n = len(carry) if num_carry is None else num_carry
    dense: set[int] = set()
    where = lambda i: f"carry {i} of a {what}"  # noqa: E731
    for _ in range(n + 1):
        seen: list[list[Any]] = []

        def stable_body(c: list[Any]) -> list[Any]:
            out = list(body(c))
            out[:n] = _materialise_at(out[:n], dense, where)
            seen.append(out[:n])
            return out

        carry = _materialise_at(carry, dense, where)
        try:
            return run(stable_body, carry)
        except TypeError:
            if not seen:
                raise
            differing = {
                i for i in range(n) if _structure(seen[-1][i]) != _structure(carry[i])
            }
            if not differing or differing <= dense:
                raise
            dense |= differing
    raise AssertionError("unreachable")


# scan / map / fori_loop ---------------------------------------------------------------


@register(scan_p)
def _scan(
    *args: ValueLike,
    jaxpr: Any,
    length: int,
    reverse: bool,
    unroll: Any,
    num_consts: int,
    num_carry: int,
    **params: Any,
) -> list[Any]:
    del params
    consts = args[:num_consts]
    carry = list(args[num_consts : num_consts + num_carry])
    xs = [
        x if _slices_leafwise(x, length) else _materialise(x, f"scanned-over input {i}")
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
            _materialise(y, f"scan output {i}") if i in dense_ys else y
            for i, y in enumerate(out[num_carry:])
        ]
        step_shapes.update((i, y.aval().shape) for i, y in enumerate(ys) if isinstance(y, Value))
        return list(out[:num_carry]), ys

    def run(stable_body: Callable[[list[Any]], list[Any]], c: list[Any]) -> Any:
        def step(c: list[Any], x: list[Any]) -> Any:
            out = stable_body([*c, *x])
            return out[:num_carry], out[num_carry:]

        return lax.scan(step, c, xs, length=length, reverse=reverse, unroll=unroll)

    for _ in range(2):
        carry_out, ys = _stable_loop(
            carry,
            lambda cx: _flat_body(body, cx, num_carry),
            run,
            "scan",
            num_carry=num_carry,
        )
        bad = {
            i
            for i, y in enumerate(ys)
            if isinstance(y, Value) and y.aval().shape != (length, *step_shapes[i])
        }
        if not bad:
            return [*carry_out, *ys]
        dense_ys |= bad
    raise AssertionError("unreachable")


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
def _remat(*args: ValueLike, jaxpr: Any, prevent_cse: bool, policy: Any, **params: Any) -> list[Any]:
    del params
    return jax.checkpoint(_quaxified(jaxpr), prevent_cse=prevent_cse, policy=policy)(*args)


# custom_linear_solve ------------------------------------------------------------------


@register(linear_solve_p)
def _linear_solve(*args: ValueLike, const_lengths: Any, jaxprs: Any) -> list[Any]:
    ends = np.cumsum(list(const_lengths))
    starts = ends - np.asarray(list(const_lengths))
    matvec_c, vecmat_c, solve_c, tr_solve_c = (args[s:e] for s, e in zip(starts, ends, strict=True))
    b = list(args[int(ends[-1]) :])
    num_aux = len(jaxprs.solve.out_avals) - len(jaxprs.matvec.out_avals)

    def call(jaxpr: Any, consts: Sequence[Any]) -> Callable[..., Any]:
        fn = _quaxified(jaxpr)

        def f(_: Any, x: list[Any]) -> Any:
            out = fn(*consts, *x)
            if num_aux:
                return out[: len(b)], out[len(b) :]
            return out

        return f

    def matvec(x: list[Any]) -> list[Any]:
        return _quaxified(jaxprs.matvec)(*matvec_c, *x)

    symmetric = jaxprs.vecmat is jaxprs.matvec
    transpose_solve = None if jaxprs.transpose_solve is None else call(jaxprs.transpose_solve, tr_solve_c)
    out = lax.custom_linear_solve(
        matvec,
        b,
        call(jaxprs.solve, solve_c),
        transpose_solve,
        symmetric=symmetric,
        has_aux=bool(num_aux),
    )
    if num_aux:
        x, aux = out
        return [*x, *aux]
    return list(out)


# callbacks ----------------------------------------------------------------------------


@register(pure_callback_p)
def _pure_callback(*args: ValueLike, **params: Any) -> Any:
    # The callback is host code written for arrays: it gets the dense arrays,
    # materialised at trace time so that a value that refuses says so now.
    dense = [_materialise_for(pure_callback_p, x) for x in args]
    return pure_callback_p.bind(*dense, **params)


def _materialise_for(primitive: Primitive, x: Any) -> Any:
    if not isinstance(x, Value):
        return x
    try:
        return x.materialise()
    except Exception as e:
        raise TypeError(
            f"`{primitive.name}` hands its inputs to host code as dense arrays, so quax "
            f"must materialise the {_describe(x)}, and that failed: {e}"
        ) from e


def _host_view(x: Any) -> Any:
    """How a value is shown to a debug callback: dense if it allows it, else itself."""
    if not isinstance(x, Value):
        return x
    try:
        return np.asarray(x.materialise())
    except Exception:  # noqa: BLE001 - the value refuses to densify: show its structure
        return x


def _on_host(primitive: Primitive, args: Sequence[Any], params: dict[str, Any]) -> list[Any]:
    """Run a debug primitive with its values rebuilt on the host, never densified on
    the device: the values' leaves travel, and the host shows them."""
    leaves, treedef = jtu.tree_flatten(list(args))

    def host(*host_leaves: Any) -> None:
        values = jtu.tree_unflatten(treedef, host_leaves)
        primitive.bind(*[_host_view(v) for v in values], **params)

    jax.debug.callback(host, *leaves, ordered=bool(params.get("ordered", False)))
    return []


@register(debug_callback_p)
def _debug_callback(*args: ValueLike, **params: Any) -> list[Any]:
    return _on_host(debug_callback_p, args, params)


@register(debug_print_p)
def _debug_print(*args: ValueLike, **params: Any) -> list[Any]:
    return _on_host(debug_print_p, args, params)


# Primitives that act on every leaf alike ----------------------------------------------


def _leafwise(primitive: Primitive) -> None:
    @register(primitive)
    def _(x: Value, **params: Any) -> Value:
        return jtu.tree_map(lambda leaf: primitive.bind(leaf, **params), x)


for _p in (_prims.stop_gradient_p, _prims.copy_p):
    _leafwise(_p)


@register(optimization_barrier_p)
def _optimization_barrier(*args: ValueLike) -> list[Any]:
    leaves, treedef = jtu.tree_flatten(list(args))
    return jtu.tree_unflatten(treedef, lax.optimization_barrier(leaves))


@register(_prims.select_n_p)
def _select_n(which: ValueLike, *cases: ValueLike) -> Any:
    # With a scalar predicate, choosing between values of one structure is choosing
    # leaf by leaf; anything else goes to the types' own rules or fallback.
    if (
        not isinstance(which, Value)
        and np.ndim(which) == 0
        and all(isinstance(c, Value) for c in cases)
        and len({_structure(c) for c in cases}) == 1
    ):
        return jtu.tree_map(lambda *leaves: lax.select_n(which, *leaves), *cases)
    return fallback_rule(_prims.select_n_p, [which, *cases])([which, *cases], {})


HIGHER_ORDER = frozenset({jit_p, cond_p, while_p, scan_p, remat_p, linear_solve_p})
