"""Scanning over named arrays: what `jax.lax.scan` (in positional code) and
`quax_named.scan` (by name) share. A scan slices its inputs along one axis, runs
the body on each slice with the other names, keeps each carry's names from one
step to the next, and stacks the body's outputs under the scanned axis."""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import quax
from jax import lax
from jax.extend.core import jaxpr_as_fun

from ._axes import Axis, Broadcast, labels
from ._kernels import array_shape, relayout, uniform_value
from ._value import NamedArray, make


__all__ = ["body_of", "match_carry", "run_scan", "scanned_axis"]


def scanned_axis(xs: Sequence[Any], length: int, fn: str) -> Axis:
    """The axis a scan slices: the leading axis that the `NamedArray`s of `xs` share
    (plain arrays among them are sliced alongside), or a new anonymous axis of size
    `length` when none is named. Different names there are refused: quax_named
    never pairs two names by position."""
    leading = [x.axes[0] for x in xs if isinstance(x, NamedArray)]
    real = [a for a in leading if not isinstance(a, Broadcast)]
    for a in real[1:]:
        if a.key != real[0].key:
            shown = " and ".join(
                labels(x.axes) for x in xs if isinstance(x, NamedArray)
            )
            raise ValueError(
                f"{fn} slices the leading axis of every scanned-over input together, "
                f"and those are {real[0].label()!r} and {a.label()!r} ({shown}): "
                "quax_named never pairs two names by position. Give them one name "
                "(`quax_named.rename`), or scan by name over one axis with "
                "`quax_named.scan(f, init, xs, axis=...)`."
            )
    if real:
        return real[0].resized(length)
    return Axis(length)


def _slice_axes(x: NamedArray, fn: str) -> tuple[Axis, ...]:
    if quax.is_value(x.array):
        raise TypeError(
            f"{fn} slices the stored array of each scanned-over NamedArray, and this "
            f"one {labels(x.axes)} stores a `{type(x.array).__name__}`, whose "
            "leaves sliced one by one need not be the slices of the array it "
            "stands for. Scan over a NamedArray of a plain array (materialise the "
            "inner value first), or run the loop in positional code inside "
            "`quax.quaxify` over the inner value alone."
        )
    return x.axes[1:]


def match_carry(new: Any, old: Any, i: int, fn: str) -> Any:
    """The carry `new` that the body returned, laid out as the carry `old` it
    received (a scan's carry keeps one type and layout from step to step). A
    `NamedArray` with the same axes in another order is transposed back by name;
    anything else that does not match is refused, naming the carry."""
    if isinstance(old, NamedArray) and isinstance(new, NamedArray):
        own = {a.key for a in old.axes if not isinstance(a, Broadcast)}
        got = {a.key for a in new.axes if not isinstance(a, Broadcast)}
        if got <= own:
            if new.axes != old.axes:
                array = relayout(new, old.axes, array_shape(old.array))
            else:
                array = new.array
            return NamedArray._unchecked(array, old.axes, old.allow_materialise)
        raise ValueError(
            f"{fn}: carry {i} comes in with axes {labels(old.axes)} and the body "
            f"returns it with axes {labels(new.axes)}; a loop's carry keeps its "
            "axes from one step to the next. Return the carry with the axes it came "
            "in with (`quax_named.rename`, `quax_named.broadcast_to`)."
        )
    if isinstance(new, NamedArray) and not quax.is_value(old):
        raise ValueError(
            f"{fn}: carry {i} starts as an unnamed array of shape "
            f"{array_shape(old)} and the body returns it with axes "
            f"{labels(new.axes)}; a loop's carry keeps its type from one step to "
            "the next. Name the initial carry (`NamedArray(init, axes)`)."
        )
    if isinstance(old, NamedArray) and not quax.is_value(new):
        raise ValueError(
            f"{fn}: carry {i} comes in with axes {labels(old.axes)} and the body "
            f"returns an unnamed array of shape {array_shape(new)}; a loop's carry "
            "keeps its type from one step to the next. Return it as a NamedArray "
            "with the axes it came in with."
        )
    return new


def _named_fills(
    body: Callable[[list[Any], list[Any]], list[Any]],
    carry: list[Any],
    xs: Sequence[Any],
) -> list[Any]:
    """`carry`, where an unnamed carry that starts as a constant fill
    (`jnp.zeros(n)`) takes the names the body gives it.

    Positional code starts a carry as a plain array (`lax.scan(cell, jnp.zeros(h),
    xs)`), and the body meets it with named slices. A constant fill is constant along
    every axis, so it may carry any names of its shape: the body's first step is
    traced abstractly with each fill as a `NamedArray` of broadcast axes, and the
    fill takes the axes that step returns it with. Anything else is left as it is
    (and refused by the body's rules, or by `match_carry`, if it meets names).
    """
    fills = [
        i
        for i, c in enumerate(carry)
        if not quax.is_value(c) and np.ndim(c) >= 1 and uniform_value(c) is not None
    ]
    for _ in fills:
        trial = list(carry)
        for i in fills:
            if not isinstance(carry[i], NamedArray):
                shape = array_shape(carry[i])
                axes = tuple(Broadcast(n) for n in shape)
                trial[i] = NamedArray._unchecked(carry[i], axes, False)

        def first(c: list[Any], xs: Sequence[Any]) -> list[Any] | None:
            step = [x[0] for x in xs]
            try:
                return list(body(c, step))
            except Exception:
                # The body refuses the fills named (a fill used only with plain
                # arrays, `c @ m`): leave the carry unnamed. Caught inside, so that
                # the trace ends normally.
                return None

        found = jax.eval_shape(first, trial, list(xs))
        if found is None:
            return carry
        changed = False
        for i in fills:
            new = found[i]
            if (
                not isinstance(carry[i], NamedArray)
                and isinstance(new, NamedArray)
                and tuple(new.array.shape) == array_shape(carry[i])
                and any(not isinstance(a, Broadcast) for a in new.axes)
            ):
                carry[i] = NamedArray._unchecked(
                    carry[i], new.axes, new.allow_materialise
                )
                changed = True
        if not changed:
            break
    return carry


def run_scan(
    body: Callable[[list[Any], list[Any]], tuple[list[Any], list[Any]]],
    carry: Sequence[Any],
    xs: Sequence[Any],
    *,
    length: int,
    reverse: bool,
    unroll: Any,
    fn: str,
) -> tuple[list[Any], list[Any]]:
    """`jax.lax.scan` of `body` over `xs` (flat lists of carries and inputs, named or
    not), with names. Each `NamedArray` of `xs` is sliced along its leading storage
    axis, and `body` receives each slice with the other names. A `NamedArray`
    output of `body` is stacked under the scanned axis (see `scanned_axis`), and so
    is a plain scalar output when that axis has a name (a scalar is a value with no
    axes left: the slices of a 1-D NamedArray are plain scalars, and stacking them
    gives the named array back); a plain output with axes of its own stays plain.

    **Arguments:**

    - `body`: `(carry, slices) -> (carry, outputs)`, on flat lists.
    - `carry`, `xs`: flat lists.
    - `length`, `reverse`, `unroll`: as for `jax.lax.scan`.
    - `fn`: what is scanning, for error messages.

    **Returns:**

    The final carry and the stacked outputs, as flat lists.
    """
    scanned = scanned_axis(xs, length, fn)
    axes = [_slice_axes(x, fn) if isinstance(x, NamedArray) else None for x in xs]
    allow = [x.allow_materialise if isinstance(x, NamedArray) else False for x in xs]
    plain = [x.array if isinstance(x, NamedArray) else x for x in xs]
    # The policy of a stack named by the scanned axis alone: densifying is allowed
    # only where every named input allows it.
    scan_policy = all(x.allow_materialise for x in xs if isinstance(x, NamedArray))

    def sliced(slices: list[Any]) -> list[Any]:
        return [
            NamedArray._unchecked(s, a, m) if a is not None else s
            for s, a, m in zip(slices, axes, allow, strict=True)
        ]

    carry = _named_fills(lambda c, s: body(c, sliced(s))[0], list(carry), plain)
    # What each output of the body is: its axes and policy if named, else `None`.
    outputs: dict[int, tuple[tuple[Axis, ...], bool] | None] = {}

    def step(c: list[Any], slices: list[Any]) -> tuple[list[Any], list[Any]]:
        new, ys = body(c, sliced(slices))
        pairs = enumerate(zip(new, c, strict=True))
        new = [match_carry(n, o, i, fn) for i, (n, o) in pairs]
        out = []
        for i, y in enumerate(ys):
            if isinstance(y, NamedArray):
                if quax.is_value(y.array):
                    _slice_axes(y, fn)  # refuses, naming the stored type
                if scanned.key in [a.key for a in y.axes]:
                    raise ValueError(
                        f"{fn}: output {i} of the body has axes {labels(y.axes)}, "
                        f"and its outputs are stacked under the scanned axis "
                        f"{scanned.label()!r}, which it already holds. Rename that "
                        "axis of the output (`quax_named.rename`)."
                    )
                outputs[i] = (y.axes, y.allow_materialise)
                out.append(y.array)
            else:
                outputs[i] = None
                out.append(y)
        return new, out

    new, ys = lax.scan(
        step, list(carry), plain, length=length, reverse=reverse, unroll=unroll
    )
    stacked = []
    for i, y in enumerate(ys):
        named = outputs[i]
        if named is None:
            # A scalar output per step is a value with no axes left (`make` gives
            # those as plain scalars, as a slice of a 1-D NamedArray is), so its
            # stack is indexed by the scanned axis alone and takes its name. A
            # plain output with axes of its own stays plain: those axes have no
            # names to give.
            if scanned.name is not None and not quax.is_value(y) and np.ndim(y) == 1:
                stacked.append(make(y, (scanned,), scan_policy))
            else:
                stacked.append(y)
        else:
            own, policy = named
            stacked.append(make(y, (scanned, *own), policy))
    return list(new), stacked


def body_of(jaxpr: Any) -> Callable[..., list[Any]]:
    """The scan body `jaxpr` (a closed jaxpr) as a quaxified function."""
    return quax.quaxify(jaxpr_as_fun(jaxpr))
