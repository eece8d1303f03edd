"""The rules for `LoraArray`: products computed as `w @ x + s * a @ (b @ x)`, and the
cheap structural operations (`transpose`, `neg`, scalar `mul`, dtype conversion)
that keep the low-rank form, and the gathers and slices of rows
(`eqx.nn.Embedding`) as `w[i] + s * a[i] @ b`.

Every rule first takes the adapter a stacked `LoraArray` selects (`index`, gathered
from `a` and `b`); the products apply LoRA dropout to the adapter's input and DoRA's
factor per row (`LoraArray.row_scale`) to the output.

Operations without a rule fall back to `LoraArray.default`, which refuses (naming the
primitive) unless the array was created with `allow_materialise=True`.

The weight `w` may itself be a `quax.ArrayValue` (a quantised array, for QLoRA): every
rule passes it to a primitive inside `quax.quaxify`, so that its own rules run, and
never densifies it.

The adapter may be in another floating dtype than `w` (mixed precision, as peft's
float32 adapter on a bfloat16 base): the products compute `w`'s term in `w`'s
dtype, the adapter's with the input cast to the adapter's dtype, add them in the
wider dtype and cast back (`_add_delta`), as peft's `Linear.forward` does; the
structural rules keep each array in its own dtype. No rule casts `w` to the
adapter's dtype, which would be a dense copy of it.
"""

import string
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
from jax import lax
from jaxtyping import Array, ArrayLike

from ._value import LoraArray


# dot_general --------------------------------------------------------------------------


def _cost(subscripts: Sequence[str], sizes: dict[str, int]) -> int:
    return int(np.prod([sizes[c] for c in set("".join(subscripts))], dtype=np.int64))


def _factored_path(
    a_sub: str, b_sub: str, x_sub: str, out_sub: str, sizes: dict[str, int]
) -> str:
    """Which factor meets `x` first: `"b"` (`a @ (b @ x)`) or `"a"` (`(x @ a) @ b`),
    whichever does fewer multiplications. `a @ b` is never formed."""

    def cost(first: str, second: str) -> int:
        keep = set(second) | set(out_sub)
        middle = "".join(c for c in dict.fromkeys(first + x_sub) if c in keep)
        return _cost([first, x_sub], sizes) + _cost([second, middle], sizes)

    return "b" if cost(b_sub, a_sub) <= cost(a_sub, b_sub) else "a"


def _contract(
    factor: Any,
    f_sub: str,
    other: Any,
    o_sub: str,
    keep: set[str],
    factor_is_lhs: bool,
    params: dict[str, Any],
    out_sub: str | None = None,
) -> tuple[Any, str]:
    """One `dot_general` of two operands labelled by subscripts: a label on both is
    a batch axis if it is in `keep`, else contracted. Returns the result and its
    labels (batch, then the free labels of lhs and of rhs, as `dot_general` orders
    them). `params["out_sharding"]` applies when the labels are `out_sub`."""
    lhs, l_sub, rhs, r_sub = (
        (factor, f_sub, other, o_sub)
        if factor_is_lhs
        else (other, o_sub, factor, f_sub)
    )
    shared = [c for c in l_sub if c in r_sub]
    batch = [c for c in shared if c in keep]
    contract = [c for c in shared if c not in keep]
    names = "".join(
        batch
        + [c for c in l_sub if c not in shared]
        + [c for c in r_sub if c not in shared]
    )
    dimension_numbers = (
        (
            tuple(l_sub.index(c) for c in contract),
            tuple(r_sub.index(c) for c in contract),
        ),
        (tuple(l_sub.index(c) for c in batch), tuple(r_sub.index(c) for c in batch)),
    )
    out_sharding = params["out_sharding"] if names == out_sub else None
    out = lax.dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision=params["precision"],
        preferred_element_type=params["preferred_element_type"],
        out_sharding=out_sharding,
    )
    return out, names


def _dropped(x: Any, rate: float, key: Any) -> Any:
    """LoRA dropout of `x`: each element kept with probability `1 - rate` (drawn
    by `jax.random.bernoulli(key, 1 - rate, x.shape)`) and divided by it, as
    peft's `lora_dropout` (a `torch.nn.Dropout`) does in training."""
    if key is None or rate == 0:
        return x
    keep = jr.bernoulli(key, 1 - rate, np.shape(x))
    return jnp.where(keep, x / jnp.asarray(1 - rate, x.dtype), jnp.zeros((), x.dtype))


def _adapter_params(params: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """`params` of a product of the adapter, whose operands are of `dtype` (the
    adapter's): a `preferred_element_type` no narrower than `dtype`, so that the
    low-rank product accumulates in the adapter's precision at least."""
    preferred = params["preferred_element_type"]
    if preferred is None:
        return params
    return {**params, "preferred_element_type": jnp.promote_types(preferred, dtype)}


def _add_delta(
    dense: Any, delta: Array, dense_scale: Array | None = None, scale_axes: Any = None
) -> Any:
    """`dense + delta` in the dtype of `dense` (`w`'s term, `dense_scale * dense`
    with DoRA's factor per row, broadcast by `scale_axes(factor)`): when `delta`
    (the adapter's term) is wider, summed (and scaled) in its dtype and cast back
    once, as peft adds `lora_B(lora_A(x)) * scaling` to the base result and casts
    the sum to the base result's dtype."""
    wide = jnp.promote_types(dense.dtype, delta.dtype)
    out_dtype = dense.dtype
    if wide != out_dtype:
        dense = dense.astype(wide)
    if dense_scale is not None:
        dense = dense * scale_axes(dense_scale.astype(wide))
    out = dense + delta.astype(wide)
    return out if wide == out_dtype else out.astype(out_dtype)


def _broadcast_to(v: Array, v_sub: str, out_sub: str, shape: tuple[int, ...]) -> Array:
    """`v`, labelled by `v_sub` (each label in `out_sub`), broadcast to `shape`
    labelled by `out_sub`."""
    order = sorted(range(len(v_sub)), key=lambda i: out_sub.index(v_sub[i]))
    v = lax.transpose(v, tuple(order))
    dims = tuple(out_sub.index(v_sub[i]) for i in order)
    return lax.broadcast_in_dim(v, shape, dims)


def _lora_dot_general(
    w: Array | quax.ArrayValue,
    a: ArrayLike,
    b: ArrayLike,
    x: Any,
    row_scale: Array | None,
    dropout_key: Any,
    *,
    lora_is_lhs: bool,
    scaling: float,
    dropout: float,
    row_ndim: int,
    dimension_numbers: Any,
    params: dict[str, Any],
) -> Any:
    """`dot_general` of `w + scaling * a @ b` with `x` (on the side `lora_is_lhs`
    says), as `dot_general(w, x) + a (b x)` or `+ (x a) b`, whichever costs less;
    `a @ b` is never formed. With DoRA's `row_scale` `g` (one per row of `w`),
    of `g * (w + scaling * a @ b)`: `g` scales `a`, and the output of `w x` when
    the rows of `w` are axes of the output (else `w` itself). With a
    `dropout_key`, the adapter's product takes `x` dropped. The rows of `w`
    span `row_ndim` axes after its batch axes (`a` is `(*batch, *rows, rank)`).

    Quaxified by the caller, so `x` and `w` may themselves be `quax.Value`s: `w`
    only meets `dot_general` (and, for DoRA on a contracted row axis, `mul`), so
    its own rules compute `w @ x`.
    """
    w_: Any = w  # inside `quax.quaxify`: a value's `*` dispatches to its rules
    a_, b_ = (jnp.asarray(t) for t in (a, b))
    nb = a_.ndim - 1 - row_ndim
    split = nb + row_ndim  # the first column axis of `w`
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    if lora_is_lhs:
        l_contract, x_contract, l_batch, x_batch = (
            lhs_contract,
            rhs_contract,
            lhs_batch,
            rhs_batch,
        )
    else:
        l_contract, x_contract, l_batch, x_batch = (
            rhs_contract,
            lhs_contract,
            rhs_batch,
            lhs_batch,
        )
    # Whether the rows of `w` (its batch axes and `n`) are all axes of the output,
    # so that DoRA's factor per row can scale the output of `w x`.
    rows_in_output = all(i not in l_contract for i in range(split))
    if row_scale is not None and not rows_in_output:
        # In `w`'s dtype: a wider factor would make a dense copy of `w`.
        w_ = w_ * row_scale.astype(w_.dtype).reshape(
            row_scale.shape + (1,) * (w_.ndim - split)
        )
    if lora_is_lhs:
        dense = lax.dot_general_p.bind(
            w_, x, dimension_numbers=dimension_numbers, **params
        )
    else:
        dense = lax.dot_general_p.bind(
            x, w_, dimension_numbers=dimension_numbers, **params
        )
    letters = iter(string.ascii_letters)
    lora_sub = [next(letters) for _ in range(w_.ndim)]
    x_sub = [next(letters) for _ in range(np.ndim(x))]
    for i, j in zip(l_contract, x_contract, strict=True):
        x_sub[j] = lora_sub[i]
    for i, j in zip(l_batch, x_batch, strict=True):
        x_sub[j] = lora_sub[i]
    r = next(letters)
    a_sub = "".join(lora_sub[:split]) + r
    b_sub = "".join(lora_sub[:nb]) + r + "".join(lora_sub[split:])
    l_free = [
        c for i, c in enumerate(lora_sub) if i not in l_contract and i not in l_batch
    ]
    x_free = [
        c for j, c in enumerate(x_sub) if j not in x_contract and j not in x_batch
    ]
    batch = [lora_sub[i] for i in l_batch]
    out_sub = "".join(batch + (l_free + x_free if lora_is_lhs else x_free + l_free))
    sizes = dict(
        zip(
            lora_sub + x_sub + [r], (*w_.shape, *np.shape(x), a_.shape[-1]), strict=True
        )
    )
    first = _factored_path(a_sub, b_sub, "".join(x_sub), out_sub, sizes)
    dense_scale = None
    if row_scale is not None:
        if rows_in_output:
            dense_scale = row_scale
        a_ = a_ * row_scale[..., None].astype(a_.dtype)
    if scaling != 1.0:
        a_ = a_ * jnp.asarray(scaling, a_.dtype)
    # The adapter's product in its dtype, as peft's `x.to(lora_A.weight.dtype)`.
    if x.dtype != a_.dtype:
        x = x.astype(a_.dtype)
    x = _dropped(x, dropout, dropout_key)
    params = _adapter_params(params, a_.dtype)
    (f, f_sub), (g, g_sub) = (
        ((b_, b_sub), (a_, a_sub)) if first == "b" else ((a_, a_sub), (b_, b_sub))
    )
    # Two `dot_general`s with the factors on the side the LoRA array was on, as
    # `a @ (b @ x)` or `(x @ a) @ b` would be written by hand, so that XLA sees the
    # same program as for the hand-written LoRA layer.
    hidden, h_sub = _contract(
        f, f_sub, x, "".join(x_sub), set(g_sub) | set(out_sub), lora_is_lhs, params
    )
    delta, d_sub = _contract(
        g, g_sub, hidden, h_sub, set(out_sub), lora_is_lhs, params, out_sub
    )
    if d_sub != out_sub:
        delta = lax.transpose(delta, tuple(d_sub.index(c) for c in out_sub))
    return _add_delta(
        dense,
        delta,
        dense_scale,
        lambda g: _broadcast_to(g, "".join(lora_sub[:split]), out_sub, dense.shape),
    )


def _dot(
    lora: LoraArray,
    x: Any,
    *,
    lora_is_lhs: bool,
    dimension_numbers: Any,
    params: dict[str, Any],
) -> Any:
    lora = lora.selected()
    return quax.quaxify(_lora_dot_general)(
        lora.weight(),
        lora.a,
        lora.b,
        x,
        lora.row_scale(),
        lora.dropout_key,
        lora_is_lhs=lora_is_lhs,
        scaling=lora.scaling,
        dropout=lora.dropout,
        row_ndim=lora.row_ndim,
        dimension_numbers=dimension_numbers,
        params=params,
    )


@quax.register(lax.dot_general_p)
def _(
    lhs: LoraArray,
    rhs: ArrayLike | quax.ArrayValue,
    *,
    dimension_numbers: Any,
    **params: Any,
) -> Any:
    return _dot(
        lhs, rhs, lora_is_lhs=True, dimension_numbers=dimension_numbers, params=params
    )


@quax.register(lax.dot_general_p)
def _(
    lhs: ArrayLike | quax.ArrayValue,
    rhs: LoraArray,
    *,
    dimension_numbers: Any,
    **params: Any,
) -> Any:
    return _dot(
        rhs, lhs, lora_is_lhs=False, dimension_numbers=dimension_numbers, params=params
    )


@quax.register(lax.dot_general_p)
def _(lhs: LoraArray, rhs: LoraArray, *, dimension_numbers: Any, **params: Any) -> Any:
    # Factor the left one; products with the right one dispatch to the rule above.
    return _dot(
        lhs, rhs, lora_is_lhs=True, dimension_numbers=dimension_numbers, params=params
    )


# conv_general_dilated -----------------------------------------------------------------


def _lora_conv(
    w: Array | quax.ArrayValue,
    kernel: ArrayLike,
    mix: ArrayLike,
    x: Any,
    row_scale: Array | None,
    dropout_key: Any,
    *,
    scaling: float,
    dropout: float,
    params: dict[str, Any],
) -> Any:
    """`conv(x, w) + scaling * mix @ conv(x, kernel)`: `kernel` is the factor laid
    out as a kernel with `rank` output features, `mix` (`(out, rank)`) mixes them
    into the output features, like a 1x1 convolution. DoRA's `row_scale` (one
    per output feature) scales both terms; with a `dropout_key`,
    `conv(x, kernel)` takes `x` dropped."""
    dense = lax.conv_general_dilated_p.bind(x, w, **params)
    kernel_ = jnp.asarray(kernel)
    # The adapter's convolution in its dtype, as peft casts the input.
    x_ = x if x.dtype == kernel_.dtype else x.astype(kernel_.dtype)
    adapter_params = _adapter_params(params, kernel_.dtype)
    hidden = lax.conv_general_dilated_p.bind(
        _dropped(x_, dropout, dropout_key), kernel_, **adapter_params
    )
    feature = params["dimension_numbers"].out_spec[1]
    mix_ = jnp.asarray(mix)
    shape = [1] * dense.ndim
    shape[feature] = -1
    if row_scale is not None:
        mix_ = mix_ * row_scale[:, None].astype(mix_.dtype)
    if scaling != 1.0:
        mix_ = mix_ * jnp.asarray(scaling, mix_.dtype)
    delta = lax.dot_general(
        hidden,
        mix_.astype(hidden.dtype),
        (((feature,), (1,)), ((), ())),
        precision=params["precision"],
        preferred_element_type=adapter_params["preferred_element_type"],
    )
    return _add_delta(
        dense, jnp.moveaxis(delta, -1, feature), row_scale, lambda g: g.reshape(shape)
    )


@quax.register(lax.conv_general_dilated_p)
def _(lhs: ArrayLike | quax.ArrayValue, rhs: LoraArray, **params: Any) -> Any:
    rhs = rhs.selected()
    out_axis = params["dimension_numbers"].rhs_spec[0]
    ungrouped = params["feature_group_count"] == 1 and params["batch_group_count"] == 1
    if ungrouped and rhs.batch_ndim == 0 and rhs.row_ndim == 1 and out_axis == 0:
        # A kernel (out, in, *spatial) adapted along its output features (as
        # `loraify` makes for `eqx.nn.Conv`): `b` is a kernel, `a` mixes.
        kernel, mix = rhs.b, rhs.a
    elif ungrouped and rhs.batch_ndim == 0 and out_axis == rhs.ndim - 1 == rhs.row_ndim:
        # A kernel (*spatial, in, out) whose rows are all but the output features
        # (as `loraify` makes for Flax NNX's `nnx.Conv`): `a` is a kernel with
        # `rank` outputs, `b` (rank, out) mixes.
        kernel, mix = rhs.a, jnp.transpose(rhs.b)
    else:
        # Only a kernel whose output features are the rows or the columns of its
        # matrices factors; the rest (grouped convolutions too) falls back.
        return quax.fallback_rule(lax.conv_general_dilated_p, (lhs, rhs))(
            (lhs, rhs), params
        )
    return quax.quaxify(_lora_conv)(
        rhs.weight(),
        kernel,
        mix,
        lhs,
        rhs.row_scale(),
        rhs.dropout_key,
        scaling=rhs.scaling,
        dropout=rhs.dropout,
        params=params,
    )


# Structural operations ----------------------------------------------------------------


def _bind(primitive: Any, *args: Any, **params: Any) -> Any:
    """`primitive.bind(*args, **params)`, where `args` may hold the weight of a
    `LoraArray` that is itself a `quax.Value` (say a quantised array): the bind is
    then quaxified, so that the value's own rule (or its refusal) runs."""
    if any(isinstance(x, quax.Value) for x in args):
        return quax.quaxify(lambda *xs: primitive.bind(*xs, **params))(*args)
    return primitive.bind(*args, **params)


def _replace(lora: LoraArray, w: Any, a: Any, b: Any) -> LoraArray:
    return eqx.tree_at(lambda x: (x.w, x.a, x.b), lora, (w, a, b))


@quax.register(lax.transpose_p)
def _(operand: LoraArray, *, permutation: Sequence[int], **params: Any) -> Any:
    operand = operand.selected()
    nb = operand.batch_ndim
    if operand.magnitude is not None or operand.row_ndim != 1:
        # DoRA normalises the rows: a transposed weight normalises its columns,
        # which no `LoraArray` stands for. Rows of several axes (an NNX kernel)
        # are not permuted here either.
        return quax.fallback_rule(lax.transpose_p, (operand,))(
            (operand,), {"permutation": permutation, **params}
        )
    perm = tuple(permutation)
    batch, rest = perm[:nb], perm[nb:]

    def transpose(x: Any, permutation: tuple[int, ...]) -> Any:
        return _bind(lax.transpose_p, x, permutation=permutation, **params)

    if sorted(batch) == list(range(nb)) and operand.ndim == nb + 2:
        w = transpose(operand.weight(), perm)
        if rest == (nb, nb + 1):
            a = transpose(operand.a, perm)
            b = transpose(operand.b, perm)
        else:  # (w + a b)^T = w^T + b^T a^T
            a = transpose(operand.b, perm)
            b = transpose(operand.a, perm)
        return _replace(operand, w, a, b)
    if sorted(batch) == list(range(nb)) and rest[0] == nb:
        # A kernel (`batch_ndim=0`, more than one input axis): permute the input axes.
        w = transpose(operand.weight(), perm)
        a = transpose(operand.a, (*batch, nb, nb + 1))
        b = transpose(operand.b, perm)
        return _replace(operand, w, a, b)
    return quax.fallback_rule(lax.transpose_p, (operand,))(
        (operand,), {"permutation": permutation, **params}
    )


@quax.register(lax.neg_p)
def _(x: LoraArray, **params: Any) -> LoraArray:
    # -(w + s a b) = -w + s (-a) b; DoRA's rows keep their norms, so `magnitude`
    # is unchanged and the direction flips.
    x = x.selected()
    w = _bind(lax.neg_p, x.weight(), **params)
    a = lax.neg_p.bind(x.a, **params)
    return _replace(x, w, a, x.b)


def _scale(
    lora: LoraArray, c: Any, values: tuple[Any, Any], params: dict[str, Any]
) -> Any:
    if np.ndim(c) != 0:
        return quax.fallback_rule(lax.mul_p, values)(values, params)
    lora = lora.selected()
    w = _bind(lax.mul_p, lora.weight(), c, **params)
    # `c` is of `w`'s dtype (the array's); the adapter keeps its own.
    a = lax.mul_p.bind(lora.a, lax.convert_element_type(c, lora.a.dtype), **params)
    out = _replace(lora, w, a, lora.b)
    if lora.magnitude is not None:
        # c (m d) with d the direction of w + s a b: scaling w and a by c turns d
        # into sign(c) d, so the magnitude becomes |c| m.
        magnitude = lora.magnitude
        out = out.replace(magnitude=magnitude * jnp.abs(c).astype(magnitude.dtype))
    return out


@quax.register(lax.mul_p)
def _(x: LoraArray, y: ArrayLike, **params: Any) -> Any:
    return _scale(x, y, (x, y), params)


@quax.register(lax.mul_p)
def _(x: ArrayLike, y: LoraArray, **params: Any) -> Any:
    return _scale(y, x, (x, y), params)


@quax.register(lax.convert_element_type_p)
def _(operand: LoraArray, *, new_dtype: Any, sharding: Any, **params: Any) -> Any:
    operand = operand.selected()
    if not jnp.issubdtype(new_dtype, jnp.inexact):
        # Rounding does not distribute over the sum: only the dense value converts.
        return quax.fallback_rule(lax.convert_element_type_p, (operand,))(
            (operand,), {"new_dtype": new_dtype, "sharding": sharding, **params}
        )
    w = _bind(
        lax.convert_element_type_p,
        operand.weight(),
        new_dtype=new_dtype,
        sharding=sharding,
        **params,
    )
    # The adapter never loses precision: it takes the wider of its dtype and the
    # new one (float32 stays float32 when the array becomes bfloat16; bfloat16
    # becomes float32, or complex64 with the array).
    adapter_dtype = jnp.promote_types(operand.a.dtype, new_dtype)

    def convert(f: Array) -> Array:
        # The factors are not laid out like `w`: the sharding applies to `w` alone.
        if f.dtype == adapter_dtype:
            return f
        return lax.convert_element_type_p.bind(
            f, new_dtype=adapter_dtype, sharding=None, **params
        )

    out = _replace(operand, w, convert(operand.a), convert(operand.b))
    if operand.magnitude is not None:
        out = out.replace(magnitude=convert(operand.magnitude))
    return out


@quax.register(lax.rev_p)
def _(operand: LoraArray, *, dimensions: Sequence[int], **params: Any) -> LoraArray:
    # Batch axes flip in all three arrays, the row axes (an output axis; an NNX
    # kernel's spatial and input axes) in `a`, the column axes (e.g. a transposed
    # convolution's spatial axes) in `b`; DoRA's magnitude along the batch and
    # row axes.
    operand = operand.selected()
    nb = operand.batch_ndim
    split = nb + operand.row_ndim  # the first column axis

    def rev(x: Any, dims: Sequence[int]) -> Any:
        return _bind(lax.rev_p, x, dimensions=tuple(dims), **params)

    w = rev(operand.weight(), dimensions)
    a = rev(operand.a, [d for d in dimensions if d < split])
    # `b` is (*batch, rank, *columns): a column axis d of `w` is b's d - rows + 1.
    b = rev(
        operand.b,
        [d for d in dimensions if d < nb]
        + [d - operand.row_ndim + 1 for d in dimensions if d >= split],
    )
    out = _replace(operand, w, a, b)
    if operand.magnitude is not None:
        out = out.replace(
            magnitude=rev(operand.magnitude, [d for d in dimensions if d < split])
        )
    return out


# Rows gathered (`eqx.nn.Embedding`, `w[i]`) -------------------------------------------


def _gathers_rows(lora: LoraArray, slice_sizes: Sequence[int]) -> bool:
    """Whether a gather (or a dynamic or static slice) of `lora` with
    `slice_sizes` takes whole rows of a matrix, so that it factors as
    `w[i] + s a[i] b`. DoRA's rows are scaled by their norms: refused (it would
    need them per gathered row)."""
    return (
        lora.ndim == 2
        and lora.batch_ndim == 0
        and lora.magnitude is None
        and slice_sizes[1] == lora.shape[1]
    )


def _rows_times_b(
    rows_a: Array, b: Array, scaling: float, axis: int, dense: Array
) -> Array:
    """`dense + s * rows_a @ b`, where `rows_a` has `rank` at `axis` (where `dense`
    has the row's `m` entries): the update of the gathered rows, `a[i] b`, in
    the adapter's dtype, added as `_add_delta` does."""
    if scaling != 1.0:
        rows_a = rows_a * jnp.asarray(scaling, rows_a.dtype)
    delta = lax.dot_general(rows_a, b.astype(rows_a.dtype), (((axis,), (0,)), ((), ())))
    return _add_delta(dense, jnp.moveaxis(delta, -1, axis))


@quax.register(lax.gather_p)
def _(
    operand: LoraArray, indices: ArrayLike, *, dimension_numbers: Any, **params: Any
) -> Any:
    operand = operand.selected()
    slice_sizes = tuple(params["slice_sizes"])
    if (
        not _gathers_rows(operand, slice_sizes)
        or 1 in dimension_numbers.collapsed_slice_dims
        or dimension_numbers.operand_batching_dims
    ):
        return quax.fallback_rule(lax.gather_p, (operand, indices))(
            (operand, indices), {"dimension_numbers": dimension_numbers, **params}
        )
    dense = _bind(
        lax.gather_p,
        operand.weight(),
        indices,
        dimension_numbers=dimension_numbers,
        **params,
    )
    # A slice as long as the row starts at 0 along it, in `w` as in `a` (whose rows
    # are `rank` long): clamped there (`CLIP`), promised, or else out of bounds in
    # both. So the two gathers take the same rows, and where `FILL_OR_DROP` fills
    # one it fills the other: `a`'s with zeros, which the select below keeps out of
    # the result (whose filled rows are the fill value alone, as the dense
    # gather's are, whatever `b` holds) and out of the gradient.
    filling = params["mode"] == lax.GatherScatterMode.FILL_OR_DROP
    rows_a = lax.gather_p.bind(
        operand.a,
        indices,
        dimension_numbers=dimension_numbers,
        **{
            **params,
            "slice_sizes": (slice_sizes[0], operand.rank),
            **({"fill_value": 0} if filling else {}),
        },
    )
    # The row's axis is the last of the offset axes (axis 1 is never collapsed).
    row_axis = dimension_numbers.offset_dims[-1]
    out = _rows_times_b(rows_a, operand.b, operand.scaling, row_axis, dense)
    if not filling:
        return out
    # Which gathered rows are filled: the same gather of a column of `False`, one
    # entry along the row (it starts at 0 as the others do), filled with `True`.
    filled = lax.gather_p.bind(
        jnp.zeros((operand.shape[0], 1), bool),
        indices,
        dimension_numbers=dimension_numbers,
        **{**params, "slice_sizes": (slice_sizes[0], 1), "fill_value": True},
    )
    return jnp.where(filled, dense, out)


@quax.register(lax.dynamic_slice_p)
def _(operand: LoraArray, *starts: ArrayLike, slice_sizes: Sequence[int]) -> Any:
    operand = operand.selected()
    if not _gathers_rows(operand, slice_sizes):
        return quax.fallback_rule(lax.dynamic_slice_p, (operand, *starts))(
            (operand, *starts), {"slice_sizes": slice_sizes}
        )
    # A slice as long as the row starts at 0 along it (dynamic_slice clamps).
    dense = _bind(
        lax.dynamic_slice_p, operand.weight(), *starts, slice_sizes=tuple(slice_sizes)
    )
    rows_a = lax.dynamic_slice_p.bind(
        operand.a, starts[0], starts[1], slice_sizes=(slice_sizes[0], operand.rank)
    )
    return _rows_times_b(rows_a, operand.b, operand.scaling, 1, dense)


@quax.register(lax.slice_p)
def _(
    operand: LoraArray,
    *,
    start_indices: Sequence[int],
    limit_indices: Sequence[int],
    strides: Sequence[int] | None,
) -> Any:
    # A static slice of rows, what `w[i]` binds for a Python or NumPy integer
    # `i` (and `w[2:5]`, `w[::2]`): `w[rows] + s a[rows] b`.
    operand = operand.selected()
    params = {
        "start_indices": tuple(start_indices),
        "limit_indices": tuple(limit_indices),
        "strides": None if strides is None else tuple(strides),
    }
    sizes = [hi - lo for lo, hi in zip(start_indices, limit_indices, strict=True)]
    if not _gathers_rows(operand, sizes) or (strides is not None and strides[1] != 1):
        return quax.fallback_rule(lax.slice_p, (operand,))((operand,), params)
    dense = _bind(lax.slice_p, operand.weight(), **params)
    rows_a = lax.slice_p.bind(
        operand.a,
        start_indices=(start_indices[0], 0),
        limit_indices=(limit_indices[0], operand.rank),
        strides=None if strides is None else (strides[0], 1),
    )
    return _rows_times_b(rows_a, operand.b, operand.scaling, 1, dense)
