"""Joining types: where a loop carry, branch output or linear-solve right-hand side
is a value of one type on one side and of another (or a plain array) on the other.

Quax lifts a plain array into the value's type where the type says how
([`quax.Value.lift`][]), joins two values whose structures differ where their type
says how ([`quax.Value.join`][]), and materialises otherwise. A carry that starts as
a plain constant fill (the zeros a solver writes its results into) is traced
abstractly as a `Fill` to find its type. `join_until_stable` is the one loop that
retries a higher-order primitive until its types join.
"""

import contextlib
import contextvars
import dataclasses
import functools as ft
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from .._caching._keys import add_setting, static_key
from .._compat import Primitive, Tracer, callback_module, release_traces, typeof
from .._dispatch._known import known_constant
from .._transform._interpreter import FOLD_MAX_SIZE, body_arg_names, body_source
from .._transform._quaxify import quaxify
from .._values._value import Value, materialise_or_explain, structure


__all__ = [
    "BodyFailed",
    "Fill",
    "Join",
    "JoinError",
    "Rejoined",
    "carry_names",
    "caught",
    "catching",
    "join_fills",
    "join_until_stable",
    "join_values",
    "lift",
    "lift_fill",
    "materialise_rhs",
    "materialise_to_join",
    "noting_retries",
    "skeleton",
    "trying",
]

_T = TypeVar("_T")


class JoinError(TypeError):
    """A loop carry or branch output changes type and cannot be joined."""


class Rejoined(Exception):
    """Raised by an attempt of `join_until_stable` that found new joins itself."""


def join_until_stable(
    attempt: Callable[[], _T],
    rejoin: Callable[[], bool],
    limit: int,
    errors: tuple[type[Exception], ...] = (TypeError,),
) -> _T:
    """The one loop that retries a higher-order primitive until its types join.

    `attempt()` traces the primitive with the joins decided so far. When JAX rejects
    it with a `TypeError` (a body's outputs disagree with its inputs, or branches with
    each other), `rejoin()` updates the joins from what the body returned, and the
    primitive is traced again if anything changed; otherwise the error stands. An
    attempt that finds new joins itself raises `Rejoined`. Each position's join
    changes a bounded number of times, so `limit` attempts suffice.

    **Arguments:**

    - `attempt`: traces the primitive; returns its outputs.
    - `rejoin`: after a `TypeError`, whether the joins changed.
    - `limit`: the most attempts.
    - `errors`: the errors JAX rejects disagreeing types with (`custom_linear_solve`
        checks leaf shapes first, with a `ValueError`).

    **Returns:**

    What the first accepted attempt returns.
    """
    for _ in range(limit):
        try:
            return attempt()
        except Rejoined:
            continue
        except errors as e:
            release_traces(e)  # JAX raised some of them inside the body's trace
            if not rejoin():
                raise
    raise AssertionError(f"the types did not join in {limit} attempts")


def skeleton(x: Any) -> Any:
    """`x` with every leaf a `jax.ShapeDtypeStruct`: its type and static metadata,
    without the (possibly traced) arrays, so it may outlive the trace it came from."""
    return jtu.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf)), x
    )


def materialise_to_join(x: Any, where: str) -> Any:
    """`x` materialised to join the types at `where` (a value; anything else
    unchanged), or a `JoinError` saying why quax had to and how to avoid it."""
    return materialise_or_explain(
        x,
        lambda value: (
            f"{where}: its type changes, so quax must join the types by "
            f"materialising the {value}"
        ),
        "\nKeep the type stable in the body (return the same kind of value it "
        "receives), give the type a `lift` classmethod that turns the plain array "
        "into one, allow the value to materialise, or register a rule for the "
        "primitive.",
        JoinError,
    )


def lift(x: Any, like: Any) -> Any:
    """The plain array `x` as a value of `like`'s type, when the type says how.

    Calls the value type's `quax.Value.lift` (see there), also with the known value
    of a tracer that JAX built from a constant.

    **Returns:**

    The lifted value, or `None` when the type's `lift` declines or returns a
    value of another structure than `like`.
    """
    fill = x if isinstance(x, Fill) else None
    if fill is not None:
        x = fill.materialise()
    if isinstance(x, Value):
        return None
    lift = type(like).lift
    out = lift(x, like)
    if out is None:
        # Under `jit`, a constant JAX made (the zero a reverse-mode loop starts its
        # cotangent carry with) is a tracer: offer the type its known value.
        known = known_constant(x, FOLD_MAX_SIZE)
        out = None if known is None else lift(known, like)
    if out is None and _raised_by_equinox(x):
        out = lift_fill(x, Fill(np.nan, *_shape_dtype(x)), like, keep=True)
    if out is None or structure(out) != structure(like):
        return None
    if fill is not None:
        fill.lifted_to(out)
    return out


def join_values(x: Any, other: Any) -> Any:
    """The value `x` converted by its type's [`quax.Value.join`][] to a structure it
    shares with the value `other`, or `None` where either is not a value or the type
    declines. A join that changes the array's shape or dtype is a `TypeError`."""
    if not (isinstance(x, Value) and isinstance(other, Value)):
        return None
    out = type(x).join(x, other)
    if out is None:
        return None
    before, after = x.aval(), out.aval()
    if (before.shape, before.dtype) != (after.shape, after.dtype):
        raise TypeError(
            f"`{type(x).__qualname__}.join` returned a `{type(out).__qualname__}` "
            f"of shape {after.shape} and dtype {after.dtype} for a value of shape "
            f"{before.shape} and dtype {before.dtype}: a join must keep the array."
        )
    return out


def _join_skeletons(column: Sequence[Any]) -> Any:
    """One structure that every value among the skeletons `column` joins to, as a
    skeleton, or `None`. A `Fill` (a carry's constant start, while quax finds its
    type) joins by being lifted into the others' type, as a plain output would."""
    values = [o for o in column if isinstance(o, Value) and not isinstance(o, Fill)]
    if not values:
        values = [o for o in column if isinstance(o, Value)]
    target = values[0]
    for o in values[1:]:
        if structure(o) == structure(target):
            continue
        target = jax.eval_shape(ft.partial(join_values, other=o), target)
        if target is None:
            return None
    return target


def _raised_by_equinox(x: Any) -> bool:
    """Whether `x` is the output of `eqx.error_if`'s error branch: a host callback
    that raises (or, on TPU, returns NaNs). Equinox builds that output from the
    guarded value's shape alone (equinox issue 1257), so it is plain where the other
    branch returns the value; quax joins it as a NaN fill of the value's type."""
    module = callback_module(x)
    return module is not None and module.split(".")[0] == "equinox"


def _shape_dtype(x: Any) -> tuple[tuple[int, ...], Any]:
    return np.shape(x), jnp.result_type(x)


class Join:
    """The joins decided so far for a function whose outputs must have the types of
    its inputs (a loop body, a linear operator) or of each other (branches).

    At a position whose types differ, quax tries, in order: lifting a plain input to
    the output's value type (`lift`); joining a value input and a value output of
    different structures through their type (`join`), converting the outputs in the
    body too; lifting a plain output to the input's (or the other branches') value
    type in the body; and materialising both sides. Each step is taken once per
    position, so the joins settle after a few re-traces.
    """

    def __init__(self, where: Callable[[int], str]) -> None:
        self.where = where
        self.dense: set[int] = set()
        # Per position, the skeleton that the body's outputs are converted to.
        self.out_like: dict[int, Any] = {}

    def outputs(self, out: Sequence[Any]) -> list[Any]:
        """The body's outputs with the joins applied (inside the body's trace)."""
        out = list(out)
        for i, like in self.out_like.items():
            # A fill joins a value type by being lifted into it, as a plain array.
            into_value = isinstance(out[i], Fill) and not isinstance(like, Fill)
            converted = (
                join_values(out[i], like)
                if isinstance(out[i], Value) and not into_value
                else lift(out[i], like)
            )
            if converted is not None and structure(converted) == structure(like):
                out[i] = converted
        return self._dense(out)

    def inputs(self, xs: Sequence[Any]) -> list[Any]:
        return self._dense(xs)

    def _dense(self, xs: Sequence[Any]) -> list[Any]:
        return [
            materialise_to_join(x, self.where(i)) if i in self.dense else x
            for i, x in enumerate(xs)
        ]

    def update(self, xs: list[Any], outs: Sequence[Any]) -> bool:
        """Join the inputs `xs` (updated in place) with the skeletons `outs` of what
        the body returned for them. Whether anything changed."""
        changed = False
        for i, (x, o) in enumerate(zip(xs, outs, strict=True)):
            if i in self.dense or structure(x) == structure(o):
                continue
            lifted = lift(x, o) if isinstance(o, Value) else None
            joined = None if lifted is not None else join_values(x, o)
            if lifted is not None:
                xs[i] = lifted
            elif joined is not None and not self._tried(i, joined):
                xs[i] = joined
                self.out_like[i] = skeleton(joined)
            elif (
                isinstance(x, Value)
                and not isinstance(o, Value)
                and (i not in self.out_like)
            ):
                self.out_like[i] = skeleton(x)
            else:
                self.dense.add(i)
            changed = True
        return changed

    def _tried(self, i: int, like: Any) -> bool:
        """Whether position `i`'s outputs are already converted to `like`'s
        structure (so joining again would not change anything)."""
        return i in self.out_like and structure(self.out_like[i]) == structure(like)

    def update_branches(self, outs: Sequence[Sequence[Any]]) -> bool:
        """Join the skeletons `outs[k]` of each branch's outputs with each other.
        Whether anything changed."""
        changed = False
        for i, column in enumerate(zip(*outs, strict=True)):
            if i in self.dense or len({structure(o) for o in column}) == 1:
                continue
            target = None
            if i not in self.out_like and any(isinstance(o, Value) for o in column):
                target = _join_skeletons(column)
            if target is not None:
                self.out_like[i] = target
            else:
                self.dense.add(i)
            changed = True
        return changed


def materialise_rhs(b: Sequence[Any], failure: str) -> list[Any]:
    """The right-hand side `b` of a `custom_linear_solve` materialised, after the
    solve failed on its values with `failure`, or a `JoinError` naming both."""
    return [
        materialise_or_explain(
            x,
            lambda value: (
                "the right-hand side of a custom_linear_solve (`jnp.linalg.solve`, "
                f"`jax.scipy.sparse.linalg.cg`, ...) is a {value}, and the solve "
                f"failed on it ({failure}); quax solves on its dense array instead"
            ),
            "\nPass a plain right-hand side, allow the value to materialise "
            "(`allow_materialise=True` or `.enable_materialise()` where the type has "
            "it), or register rules that apply the matrix and its solve to it.",
            JoinError,
        )
        for x in b
    ]


def carry_names(jaxpr: Any, first: int, what: str) -> Callable[[int], str]:
    """How an error names loop carry `i` (JAX's numbering): by the body's argument as
    the user wrote it (`c[0]`), and where the body is defined, when JAX recorded it."""
    names = body_arg_names(jaxpr)
    source = body_source(jaxpr)

    def where(i: int) -> str:
        name = names[first + i] if names and first + i < len(names) else ""
        if not name:
            return (
                f"carry {i} of a {what} (counted over JAX's loop state, which for a "
                "fori_loop starts with the counter)"
            )
        at = f" (body {source})" if source else ""
        return f"loop carry `{name}` of a {what}{at}"

    return where


class BodyFailed(Exception):
    """A nested loop's body failed inside a body that quax is trying."""


class _Trying(threading.local):
    """How many loop bodies this thread is tracing with their errors caught; and,
    while a loop's types are being found (`noting_retries`), the errors its tries
    caught."""

    depth = 0
    caught: list[str] | None = None


_trying = _Trying()


@contextlib.contextmanager
def catching() -> Iterator[None]:
    """Mark a loop body being tried (its errors caught). A nested loop whose body
    fails there only signals it (`BodyFailed`): re-tracing its body to raise the
    error would leave a trace holding the enclosing body's tracers."""
    _trying.depth += 1
    try:
        yield
    finally:
        _trying.depth -= 1


def trying() -> bool:
    """Whether this thread is inside a loop body being tried (see `catching`)."""
    return _trying.depth > 0


def caught(error: Exception) -> None:
    """Record `error`, which a try of a loop body caught (see `noting_retries`), by
    its type and message: the error itself would keep the tracers of its traceback
    alive."""
    if _trying.caught is not None and not isinstance(error, BodyFailed | Rejoined):
        _trying.caught.append(_quoted(error))


@contextlib.contextmanager
def noting_retries() -> Iterator[None]:
    """Around a loop rule that tries its body to find its carries' types: where the
    loop fails in the end with an error other than one its tries caught, that error
    gets a note quoting the ones caught (the first may be the one to fix: an `atol`
    in seconds added to a state in metres, caught while quax traced the first
    iteration, after which the loop ran on a plain carry and failed on that). The
    errors that a nested loop caught are dropped once that loop's types are
    found."""
    outermost = _trying.caught is None
    if outermost:
        _trying.caught = []
    errors = _trying.caught
    assert errors is not None
    start = len(errors)
    try:
        yield
    except Exception as e:
        if outermost:
            _note_caught(e, errors)
        raise
    else:
        del errors[start:]
    finally:
        if outermost:
            _trying.caught = None


def _quoted(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _note_caught(error: Exception, errors: list[str]) -> None:
    """Add to `error` a note quoting the distinct `errors` (caught before it, see
    `caught`) that differ from it."""
    others = [e for e in dict.fromkeys(errors) if e != _quoted(error)]
    if others:
        quoted = "\n".join(f"- {e}" for e in others)
        error.add_note(
            "(quax: while it tried the loop's body to find the types of its "
            "carries, the body failed first with the following, which may be the "
            f"error to fix:\n{quoted})"
        )


# A loop carry that starts as a plain constant fill (the zeros or NaNs a solver
# writes its results into) and is then given values: its type is known only once
# the body has run, and the body may fail on the plain array (a unit error on
# `buffer.at[i].set(quantity)`). Quax then traces the first iteration abstractly,
# with such carries as `Fill`s that take the type of whatever value they meet, and
# lifts the carries' starts into the types found.


class Fill(Value):
    """A plain array whose every element is `fill`, standing for a loop carry's
    constant start while quax finds the carry's type. It holds no array, so it stays
    static (known) through tracing.

    A carry's stand-in has an `origin` (a number, unique to the trace that finds
    the carry's type), kept while the fill passes unchanged through the body (a
    `cond` whose every branch gives this array keeps it too): where a nested loop
    lifts it into a value type, that type is the carry's (see `join_fills`)."""

    fill: Any = eqx.field(static=True)
    shape: tuple[int, ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    origin: int | None = eqx.field(static=True, default=None)

    # Settle this type's inputs before any other type's `default` (see
    # `quax._dispatch._registry`): it only stands in for a plain array.
    settles_first: ClassVar[bool] = True

    @classmethod
    def of(cls, x: Any, exact: bool = False) -> "Fill | None":
        """`x` as a `Fill`, when it is a plain array known to be a constant fill:
        its elements equal (NaNs of any sign, and zeros of both signs, count as one
        for a loop's start, whose own array is kept), or with `exact`, the same bit
        for bit (for a computed array that the `Fill` will stand for)."""
        if isinstance(x, Value):
            return None
        aval = typeof(x)
        known = (
            known_constant(x, _FILL_MAX_SIZE)
            if isinstance(x, Tracer)
            else np.asarray(x, aval.dtype)
        )
        if known is None or known.size == 0:
            return None
        first = known.flat[0]
        if exact:
            # The same element bit for bit: NaNs of one sign and payload, and no
            # `-0.0` among `0.0`s.
            flat = np.ascontiguousarray(known).reshape(-1)
            raw = flat.view(np.uint8).reshape(flat.size, -1)
            same = raw == raw[0]
        else:
            same = known == first
            if np.issubdtype(known.dtype, np.inexact):
                same |= np.isnan(known) & np.isnan(first)
        if not np.all(same):
            return None
        return cls(first.item(), aval.shape, aval.dtype)

    @property
    def key(self) -> tuple[Any, ...]:
        """Equal for fills of the same array, bit for bit: NaN equals NaN of the
        same sign and payload, and `0.0` is not `-0.0` (the fill by its bits, as
        every cache key holds a float)."""
        return static_key(self.fill), self.shape, self.dtype

    @classmethod
    def lift(cls, array: Any, like: Value) -> "Fill | None":
        """`like` (a `Fill`) itself where `array` is known to be its array, bit for
        bit: where one branch of a `cond` passes a fill through and another
        computes the same constant, the `cond` gives that fill."""
        known = cls.of(array, exact=True)
        if isinstance(like, Fill) and known is not None and known.key == like.key:
            return like
        return None

    @classmethod
    def join(cls, value: Value, other: Value) -> "Fill | None":
        """Fills of the same array join whatever their origins, to the first
        origin: a `cond` that passes a carry's fill through in one branch and
        computes the same fill in another gives the carry's."""
        if not (isinstance(value, Fill) and isinstance(other, Fill)):
            return None
        if value.key != other.key:
            return None
        origins = [o for o in (value.origin, other.origin) if o is not None]
        return dataclasses.replace(value, origin=min(origins, default=None))

    def lifted_to(self, value: Value) -> None:
        """Record that this fill was lifted into `value` (a join in a nested loop
        or `cond`), as the type of the carry it stands for, if it stands for one."""
        needed = _fills.needed
        if self.origin in needed and needed[self.origin] is None:
            needed[self.origin] = skeleton(value)

    def aval(self) -> Any:
        return jax.core.ShapedArray(self.shape, self.dtype)

    def materialise(self) -> Any:
        with jax.ensure_compile_time_eval():  # a known array, also inside a trace
            return jnp.full(self.shape, self.fill, self.dtype)

    @staticmethod
    def default(
        primitive: Primitive, values: Sequence[Any], params: dict[str, Any]
    ) -> Any:
        """Compute on the known arrays where every input is known; else bind on the
        plain arrays (a family may accept a known constant of zeros or NaNs, as
        quax-units does); where that fails, lift fills to the other inputs' types."""
        cases = values[1:]
        case_fill = next((c for c in cases if isinstance(c, Fill)), None)
        if primitive in _SELECTS and case_fill is not None:
            # The same fill whichever case is selected: a fill, or a plain array
            # known to be that fill bit for bit (a reverse loop selects between a
            # slice of its cotangent buffer and a fresh zero).
            fills = [
                c if isinstance(c, Fill) else Fill.of(c, exact=True) for c in cases
            ]
            if all(f is not None and f.key == case_fill.key for f in fills):
                return case_fill
        operand = values[0]
        if (
            primitive is lax.dynamic_slice_p
            and isinstance(operand, Fill)
            and not any(isinstance(v, Value) for v in cases)
        ):
            # Every element of a slice (its start clamped into the array) is an
            # element of the fill, wherever the start: a fill (a new one, not the
            # carry's start), also at a start only known at run time (a reverse
            # loop reads its cotangent buffer at the stage it is at).
            return Fill(operand.fill, tuple(params["slice_sizes"]), operand.dtype)
        dense = [v.materialise() if isinstance(v, Fill) else v for v in values]
        if not any(isinstance(v, Value | Tracer) for v in dense):
            with jax.ensure_compile_time_eval():
                out = primitive.bind(*dense, **params)
            # The output stands for the computed array: a fill only where that is
            # one bit for bit (a select between +NaN and -NaN fills is not).
            if primitive.multiple_results:
                return [_computed_fill(o, values) for o in out]
            return _computed_fill(out, values)
        bind = quaxify(lambda *vs: primitive.bind(*vs, **params))
        if primitive in _ANNIHILATED and any(
            isinstance(v, Fill) and v.fill == 0 for v in values
        ):
            # Products with zeros are zeros: what the body's types may hinge on
            # (`dt * f0` with `f0` zeros is added to a quantity). Only types are
            # taken from this trace, so the zero need not hold for a NaN factor.
            out = bind(*dense)
            if isinstance(out, Value) and not _zero_products.get():
                return out
            aval = out.aval() if isinstance(out, Value) else out
            return Fill(0, aval.shape, aval.dtype)
        try:
            return bind(*dense)
        except Exception as e:
            error = e
        fills = [i for i, v in enumerate(values) if isinstance(v, Fill)]
        likes = [v for v in values if isinstance(v, Value) and not isinstance(v, Fill)]
        for like in likes:
            for chosen in [*([i] for i in fills), fills]:
                lifted = list(dense)
                for i in chosen:
                    lifted[i] = lift_fill(dense[i], values[i], skeleton(like))
                if any(v is None for v in lifted):
                    continue
                with contextlib.suppress(Exception):
                    return bind(*lifted)
        raise error


def _computed_fill(out: Any, values: Sequence[Any]) -> Any:
    """The known array `out`, computed from `values`, as a `Fill` where it is one
    bit for bit: an input fill of a carry's start where `out` is that same array (a
    copy, or a select between it and itself, is still the carry's start), else a
    new fill; or `out` itself."""
    fill = Fill.of(out, exact=True)
    if fill is None:
        return out
    for v in values:
        if isinstance(v, Fill) and v.origin is not None and v.key == fill.key:
            return v
    return fill


# Primitives that select between their operands after the first (a predicate):
# equinox's loops select the new carry or the old with `select_if_vmap`.
_SELECTS = frozenset({lax.select_n_p, eqxi.select_if_vmap_p})

# Primitives whose output is zero when an input is.
_ANNIHILATED = frozenset({lax.mul_p, lax.dot_general_p})


class _Fills(threading.local):
    """By the `origin` of each carry's stand-in in the traces that find carries'
    types, the value type a nested join lifted it into, if any (see
    `join_fills`)."""

    def __init__(self) -> None:
        self.needed: dict[int, Any] = {}


_origins = itertools.count()


_fills = _Fills()
# Whether a product with a zero `Fill` is a zero `Fill` whatever the other factor
# (see `join_fills`). Rules give such a product another type in the two traces of
# `join_fills`: what they staged under one (a nested `jit`'s body) is not reused
# under the other. Its bound `get` is the setting's read: one C call per key.
_zero_products = contextvars.ContextVar("quax_zero_products", default=False)
add_setting(_zero_products.get)

# Largest carry recognised as a constant fill (the known value is a broadcast view).
_FILL_MAX_SIZE = 2**26


def lift_fill(x: Any, fill: Fill, like: Any, keep: bool = False) -> Any:
    """The plain array `x`, known to equal `fill`, lifted to `like`'s type (of any
    shape), or `None` when the type declines, or when `keep` and the lifted value
    does not hold `x` itself."""
    dense = fill.materialise()
    out = type(like).lift(dense, like)
    if not isinstance(out, Value) or out.aval().shape != fill.shape:
        return None
    # Keep `x` itself (traced, cheap; and what computes it stays in the program)
    # where the type stored the array unchanged, rather than a constant.
    leaves, treedef = jtu.tree_flatten(out)
    if keep and not any(leaf is dense for leaf in leaves):
        return None
    kept = [x if leaf is dense else leaf for leaf in leaves]
    return jtu.tree_unflatten(treedef, kept)


def join_fills(
    carry: list[Any],
    body: Callable[[list[Any]], list[Any]],
    n: int,
    xs: Sequence[Any],
) -> bool:
    """After the body failed on `carry`: trace its first iteration abstractly with
    the plain constant-fill carries as `Fill`s, and lift those carries (updated in
    place) to the value types the body gives them. Whether anything changed.

    A carry whose fill the body returns unchanged, but which a nested loop (or a
    `cond`) inside the body lifts into a value type, takes that type: a root
    finder's state started at infinity in a solver's stage loop, which the root
    finder's own loop gives the units of the state. Lifting a fill into another
    type is exact (zeros, infinities and NaNs fit any unit), and the lifted carries
    are then traced, and checked, by the rules as usual."""
    known = {i: f for i, x in enumerate(carry) if (f := Fill.of(x)) is not None}
    if not known:
        return False
    origins = {i: next(_origins) for i in known}
    fills = {i: dataclasses.replace(f, origin=origins[i]) for i, f in known.items()}
    trial = [fills.get(i, x) for i, x in enumerate(carry)]
    for origin in origins.values():
        _fills.needed[origin] = None
    try:
        found = _first_iteration(trial, body, n, xs)
        needed = {i: _fills.needed[origin] for i, origin in origins.items()}
    finally:
        for origin in origins.values():
            del _fills.needed[origin]
    if found is None:
        return False
    changed = False
    for i, fill in fills.items():
        like = found[i]
        if isinstance(like, Fill) and like.origin == origins[i]:
            like = needed[i]  # returned unchanged: the type a nested join found
        if not isinstance(like, Value) or isinstance(like, Fill):
            continue
        lifted = lift_fill(carry[i], fill, like)
        if lifted is not None and structure(lifted) == structure(like):
            carry[i] = lifted
            changed = True
    return changed


def _first_iteration(
    trial: list[Any],
    body: Callable[[list[Any]], list[Any]],
    n: int,
    xs: Sequence[Any],
) -> list[Any] | None:
    """The skeletons of the carries that the body gives in its first iteration,
    traced abstractly from the carries `trial` (constant fills as `Fill`s), or
    `None` where the body fails there."""

    def first(c: list[Any], xs: Sequence[Any]) -> list[Any] | None:
        try:
            with catching():
                step = [jtu.tree_map(lambda leaf: leaf[0], x) for x in xs]
                return list(body([*c, *step]))[:n]
        except Exception as e:  # caught inside, so that the trace ends normally
            caught(e)
            return None

    found = jax.eval_shape(first, trial, list(xs))
    if found is None:
        # A product with a zero fill took the other factor's type (a zero times a
        # dimensionless quantity, `polyval`'s `0 * t + p` with `p` in metres),
        # where the type of the carry's start, which the product has, is what is
        # being found. Trace again with such products as zero fills, which take
        # the type of whatever value they meet next. (The lifted carries are then
        # traced, and checked, by the rules as usual.) A new function, so that
        # JAX's tracing cache cannot answer with the trace above.
        token = _zero_products.set(True)
        try:
            found = jax.eval_shape(lambda c, x: first(c, x), trial, list(xs))
        finally:
            _zero_products.reset(token)
    return found
