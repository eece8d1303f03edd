"""Rules for JAX's loops: `while_loop`/`fori_loop` and `scan` (`lax.map`,
`associative_scan`, a `fori_loop` of known trip count).

Each rule runs the loop's body, quaxified, through `lax.while_loop` or `lax.scan`, so
that every value stays structured through the loop. Carries whose type changes are
joined (see `_joins.py`): the differing parts are lifted or materialised (the family
may refuse, giving an error that names the carry) and the body re-traced, until the
types are stable.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from .._compat import release_traces, scan_p, typeof, while_p
from .._dispatch._registry import register
from .._transform import _trace
from .._transform._interpreter import body_source
from .._transform._quaxify import quaxify
from .._values._value import Value, ValueLike, is_value
from ._bodies import decision, quaxified_jaxpr
from ._joins import (
    BodyFailed,
    Join,
    Rejoined,
    carry_names,
    catching,
    caught,
    join_fills,
    join_until_stable,
    materialise_to_join,
    noting_retries,
    skeleton,
    trying,
)


__all__: list[str] = []


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
    cond_fn = quaxified_jaxpr(cond_jaxpr)
    body_fn = quaxified_jaxpr(body_jaxpr)
    fori = (body_source(cond_jaxpr) or "").startswith("_fori_cond_fun")
    what = "fori_loop" if fori else "while_loop"

    # `vmap` of a loop whose predicate is batched binds `while` with one predicate
    # per batch element (the leading axes of every carry): each element stops on
    # its own, as JAX's lowering does it (loop while any is true, and keep the
    # carries of the elements that are done), whereas `lax.while_loop` wants one.
    batched = bool(cond_jaxpr.out_avals[0].shape)

    def predicate(c: list[Any]) -> Any:
        (pred,) = cond_fn(*cond_consts, *c)
        leaf = _predicate_leaf(pred)
        if leaf is not None:
            return leaf
        return decision(pred, f"the predicate of a `{what}` (its `cond_fun`'s output)")

    def cond(c: list[Any]) -> Any:
        pred = predicate(c)
        return jnp.any(pred) if batched else pred

    def body(c: list[Any]) -> list[Any]:
        new = body_fn(*body_consts, *c)
        if not batched:
            return new
        pred = predicate(c)
        return [_select_where(pred, n, o) for n, o in zip(new, c, strict=True)]

    return _stable_loop(
        carry,
        body,
        lambda body, c: lax.while_loop(cond, body, c),
        carry_names(body_jaxpr, body_nconsts, what),
    )


def _predicate_leaf(pred: Any) -> Any:
    """A loop predicate that is a value, read from its leaf without materialising
    it (as the published quax, which flattens it to its one leaf), where that is
    exact: the value's array is linear in its leaves (`linear_in_leaves`), and its
    only leaf is a boolean array of the value's own shape, so the leaf is that
    array. `None` where it is not (the predicate is materialised, or refused, as
    usual)."""
    if not (is_value(pred) and type(pred).linear_in_leaves):
        return None
    leaves = jtu.tree_leaves(pred)
    aval = pred.aval()
    if len(leaves) != 1 or aval.dtype != np.bool_:
        return None
    (leaf,) = leaves
    if not isinstance(leaf, jax.Array | np.ndarray):
        return None
    leaf_aval = typeof(leaf)
    if leaf_aval.shape != aval.shape or leaf_aval.dtype != aval.dtype:
        return None
    return leaf


def _select_where(pred: Any, new: Any, old: Any) -> Any:
    """`new` where `pred` (over the leading axes) is true, else `old`, dispatched on
    their types."""

    def select(p: Any, n: Any, o: Any) -> Any:
        mask = lax.broadcast_in_dim(p, jnp.shape(n), tuple(range(jnp.ndim(p))))
        return lax.select(mask, n, o)

    return quaxify(select)(pred, new, old)


def _stable_loop(
    carry: Sequence[Any],
    body: Callable[[list[Any]], list[Any]],
    run: Callable[[Callable[[list[Any]], list[Any]], list[Any]], Any],
    where: Callable[[int], str],
    num_carry: int | None = None,
    xs: Sequence[Any] = (),
    settled: Callable[[Any], bool] | None = None,
) -> Any:
    """Run a loop whose body maps `carry` (and, for scan, one slice of each of `xs`)
    to a new carry (and, for scan, outputs after the first `num_carry`), joining
    carry types until they are stable. `settled(result)`, when given, says whether
    the loop's result is final; when it is not, it has changed what the body does,
    and the loop is traced again."""
    n = len(carry) if num_carry is None else num_carry
    join = Join(where)
    carry = list(carry)
    seen: list[list[Any]] = []

    def attempt() -> Any:
        seen.clear()
        # Whether the body failed; and whether to catch that, letting the loop's
        # trace end normally (a trace left by an exception keeps the tracers it
        # closed over alive, which the leak checker reports once quax recovers).
        failed, catch = [False], [True]

        def stable_body(c: list[Any]) -> list[Any]:
            if catch[0]:
                try:
                    with catching():
                        out = list(body(c))
                        out[:n] = join.outputs(out[:n])
                except Exception as e:
                    release_traces(e)
                    caught(e)
                    failed[0] = True
                    return list(c)
            else:
                out = list(body(c))
                out[:n] = join.outputs(out[:n])
            seen.append([skeleton(o) for o in out[:n]])
            return out

        carry[:] = join.inputs(carry)
        result = run(stable_body, carry)
        if failed[0]:
            # The body failed, perhaps on a plain carry that starts as a constant
            # fill.
            if join_fills(carry, body, n, xs):
                raise Rejoined
            if trying():
                # Inside a body that an enclosing loop is trying: let it retry.
                raise BodyFailed
            # Raise the body's error. A new function, so that JAX's tracing cache
            # cannot answer with the stand-in body traced above.
            catch[0] = False
            result = run(lambda c: stable_body(c), carry)
        if settled is not None and not settled(result):
            raise Rejoined
        return result

    def rejoin() -> bool:
        # The body ran, and its outputs disagree with the carry.
        return bool(seen) and join.update(carry, seen[-1])

    with noting_retries():
        return join_until_stable(attempt, rejoin, limit=3 * n + 2)


# scan / map / fori_loop ---------------------------------------------------------------


def scan_counts(params: dict[str, Any]) -> tuple[int, int]:
    """`(num_consts, num_carry)` of a `scan` equation's params. JAX 0.10 records the
    counts; 0.11 records `ft_in`, a flat tree of `(consts, carry, xs)`."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


@register(scan_p)
def _scan(
    *args: ValueLike,
    jaxpr: Any,
    length: int,
    reverse: bool,
    unroll: Any,
    **params: Any,
) -> list[Any]:
    num_consts, num_carry = scan_counts(params)
    consts = args[:num_consts]
    carry = list(args[num_consts : num_consts + num_carry])
    xs = [
        x
        if _slices_leafwise(x, length)
        else materialise_to_join(x, f"scanned-over input {i}")
        for i, x in enumerate(args[num_consts + num_carry :])
    ]
    body_fn = quaxified_jaxpr(jaxpr)
    # Outputs stacked leafwise must still describe the stacked value; those that
    # would not are materialised in the body.
    dense_ys: set[int] = set()
    step_shapes: dict[int, tuple[int, ...]] = {}

    def body(c: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        out = body_fn(*consts, *c, *x)
        ys = [
            materialise_to_join(y, f"scan output {i}") if i in dense_ys else y
            for i, y in enumerate(out[num_carry:])
        ]
        step_shapes.update(
            (i, y.aval().shape) for i, y in enumerate(ys) if isinstance(y, Value)
        )
        return list(out[:num_carry]), ys

    def run(stable_body: Callable[[list[Any]], list[Any]], c: list[Any]) -> Any:
        def step(c: list[Any], x: list[Any]) -> Any:
            out = stable_body([*c, *x])
            return out[:num_carry], out[num_carry:]

        return lax.scan(step, c, xs, length=length, reverse=reverse, unroll=unroll)

    def settled(result: Any) -> bool:
        _, ys = result
        bad = {
            i
            for i, y in enumerate(ys)
            if isinstance(y, Value) and y.aval().shape != (length, *step_shapes[i])
        }
        dense_ys.update(bad)
        return not bad

    carry_out, ys = _stable_loop(
        carry,
        lambda cx: _flat_body(body, cx, num_carry),
        run,
        carry_names(jaxpr, num_consts, "scan" if xs else "scan or fori_loop"),
        num_carry=num_carry,
        xs=xs,
        settled=settled,
    )
    return [*carry_out, *ys]


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
    try:
        got = sliced.aval()
    except Exception:
        # A slice that is no value of its type at all (a `diag` that lost its last
        # axis): its own error would say nothing of the scan.
        return False
    return got.shape == expected.shape[1:] and got.dtype == expected.dtype


_trace.add_staging_rule(while_p, _while)
_trace.add_staging_rule(scan_p, _scan)
