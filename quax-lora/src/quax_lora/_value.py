"""The value type: `LoraArray`, a weight `w` plus a low-rank update `a @ b`."""

import dataclasses
import math
import sys
import warnings
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
from jax import lax
from jaxtyping import Array, DTypeLike, PRNGKeyArray


__all__ = [
    "CorruptAdapterError",
    "LoraArray",
    "LoraWarning",
    "LoraMaterialisationError",
    "RankWarning",
]

# The variants of the update `loraify` and `LoraArray` make: plain LoRA, rsLoRA
# (scaled by `alpha / sqrt(rank)`) and DoRA (a learnt magnitude per output times
# the direction of `w + s a b`).
VARIANTS = ("lora", "rslora", "dora")


class LoraWarning(UserWarning):
    """The base of quax-lora's warnings: something works, but not as the user may
    expect (filter them all with `warnings.filterwarnings("ignore",
    category=quax_lora.LoraWarning)`)."""


class RankWarning(LoraWarning):
    """A `LoraArray` was made with a rank larger than its matrices can use
    (`min(n, m)`): it works, as in the published quax, but the extra rank adds
    parameters and work and no expressiveness."""


class LoraMaterialisationError(quax.MaterialisationError):
    """A `LoraArray` with `allow_materialise=False` met an operation that has no
    LoRA rule and would need the dense `w + a @ b`. Its message starts with
    "Refusing to materialise `LoraArray`", as the published quax's refusals do;
    it is a [`quax.MaterialisationError`][] (a `RuntimeError`)."""


class CorruptAdapterError(ValueError):
    """[`quax_lora.load_adapter`][] read a file that is not as
    [`quax_lora.save_adapter`][] (or peft) writes one: cut short, or changed. Its
    message names the file and the field (a header, a layer's `a`, a key of
    peft's config). Lengths are checked against the file's size before anything
    is read, and nothing in the file is executed."""


class LoraArray(quax.GuardedValue):
    """A weight `w` plus a low-rank adaptation: it stands for `w + s * (a @ b)`,
    stored as the three arrays, never summed.

    For a weight of shape `(*batch, n, m)`, `a` has shape `(*batch, n, rank)` and `b`
    shape `(*batch, rank, m)` (the rows `n` and the columns `m` may each span
    several axes, see `batch_ndim` and `row_ndim`); `s` is `alpha / rank` (as in
    peft), or `1` when `alpha` is not given (as in the published quax). Inside
    [`quax.quaxify`][], a product with it costs `w @ x + s * (a @ (b @ x))`: the
    `(n, m)` update `a @ b` is never formed.

    `b` starts at zero, so a fresh `LoraArray` computes exactly what `w` did; `a`
    starts at `Normal(0, scale^2)`. Fine-tuning trains `a` and `b` only: with
    `stop_gradient=True` the gradient with respect to `w` is a symbolic zero, so JAX
    does not compute it.

    **Fields:**

    - `w`: the original weight, shape `(*batch, *n, *m)` (`n` one axis unless
        `row_ndim` says more): an array, or a `quax.ArrayValue` such as a
        quantised array (QLoRA).
    - `a`: shape `(*batch, *n, rank)`.
    - `b`: shape `(*batch, rank, *m)`, of `a`'s dtype: the adapter's dtype, that
        of `w` unless `adapter_dtype` said otherwise (see "Mixed precision"
        below).
    - `magnitude`: DoRA's magnitude, shape `(*batch, n)` (one per row of `w`, that
        is per output of a layer), in the adapter's dtype, or `None` for the other
        variants.
    - `dropout_key`: the key of LoRA dropout on the adapter's input, or `None`
        (no dropout, as at inference); set by [`quax_lora.with_dropout_key`][].
    - `index`: which of the `adapters` stacked adapters to use (an integer array
        of shape `()`; under `jax.vmap`, one per row of a batch), or `None`; set by
        [`quax_lora.select_adapter`][].
    - `alpha`, `allow_materialise`, `stop_gradient`, `variant`, `dropout`,
        `row_ndim`: as passed to `__init__` (static).
    - `adapters`: how many adapters `a` and `b` stack along a leading axis (made
        by [`quax_lora.stack_adapters`][]), or `None` for one (static).
    - `init`: `None` for `b = 0` (the base weight as it was), or the
        initialisation that changed the base weight `w` (peft's
        `init_lora_weights`: `"pissa"`, `"pissa_niter_<k>"`, `"olora"`,
        `"loftq"`), set by `quax_lora.loraify(..., init=...)`; `init_settings`
        its settings (LoftQ's bits, iterations and quantiser) as `(name, value)`
        pairs (both static). Saved with the adapter: an adapter trained on a
        changed base only loads into a model whose base was changed alike.

    It follows the core's materialisation policy ([`quax.GuardedValue`][]): an
    operation without a LoRA rule raises a [`quax_lora.LoraMaterialisationError`][]
    naming the primitive, the types and the way out, unless
    `allow_materialise=True` (or `.enable_materialise()`, which returns a copy
    sharing `w`, `a` and `b`).

    **Mixed precision.** The adapter (`a`, `b`, DoRA's `magnitude`) may be kept in
    another floating dtype than `w`, as peft keeps it in float32 for a bfloat16 or
    float16 base (its `autocast_adapter_dtype`, and QLoRA): pass
    `adapter_dtype=jnp.float32`. The array's dtype stays that of `w`. A product
    computes `w @ x` in `w`'s dtype, the adapter's `s * a @ (b @ x)` with `x` cast
    to the adapter's dtype (as peft's `x.to(lora_A.weight.dtype)`), adds the two
    in the wider dtype and casts the sum back to the dtype of `w @ x` (as peft's
    `result.to(torch_result_dtype)`): the dtype dense JAX gives for the merged
    weight in `w`'s dtype. `materialise` and [`quax_lora.merge`][] form
    `w + s * a @ b` in the wider dtype and round it once to `w`'s dtype. An
    integer or boolean adapter, `a` and `b` of different dtypes, or a complex
    adapter with a real `w` (or the reverse) is refused.
    """

    # `w + s * a @ b` is not linear in the leaves (a, b) together: a custom
    # derivative meets it densified (or refused), never rebuilt from tangents.
    linear_in_leaves: ClassVar[bool] = False
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        LoraMaterialisationError
    )

    w: Array | quax.ArrayValue
    a: Array
    b: Array
    magnitude: Array | None
    dropout_key: PRNGKeyArray | None
    index: Array | None
    alpha: float | None = eqx.field(static=True)
    stop_gradient: bool = eqx.field(static=True)
    variant: str = eqx.field(static=True)
    dropout: float = eqx.field(static=True)
    row_ndim: int = eqx.field(static=True)
    adapters: int | None = eqx.field(static=True)
    init: str | None = eqx.field(static=True)
    init_settings: tuple[tuple[str, Any], ...] = eqx.field(static=True)

    def __init__(
        self,
        weight: Array | quax.ArrayValue,
        *,
        rank: int,
        scale: float = 0.01,
        alpha: float | None = None,
        allow_materialise: bool = False,
        stop_gradient: bool = True,
        batch_ndim: int | None = None,
        row_ndim: int = 1,
        variant: str = "lora",
        dropout: float = 0.0,
        adapter_dtype: DTypeLike | None = None,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `weight`: the weight to adapt, shape `(*batch, n, m)`: a JAX array, or a
            `quax.ArrayValue` other than a `LoraArray` (say a quantised array, for
            QLoRA). A value is kept as it is, never materialised: its shape and
            dtype are read from it, and the LoRA rules pass it to primitives, so
            its own rules compute `w @ x`.
        - `rank`: the rank of the adaptation: an integer >= 1, usually far below
            `min(n, m)` for `(n, m)` matrices (for a kernel, `m` is
            `in * prod(spatial)`). A larger rank than `min(n, m)` works, as in
            the published quax, and warns with a [`quax_lora.RankWarning`][]: it
            adds parameters and no expressiveness.
        - `scale`: `a` is initialised from `Normal(0, scale^2)`; `b` is zero.
            Finite and positive.
        - `alpha`: the update is multiplied by `alpha / rank` (peft's `lora_alpha`;
            `alpha / sqrt(rank)` for `variant="rslora"`), finite and positive: a
            Python number or a concrete scalar (stored as a Python float; it is
            static, so not a traced one). `None` (the default) multiplies it by
            one.
        - `allow_materialise`: what to do on an operation without a LoRA rule:
            raise a `LoraMaterialisationError` (a `RuntimeError` whose message starts
            "Refusing to materialise") naming it (`False`, the default), or form
            the dense `w + s * a @ b` and carry on (`True`).
        - `stop_gradient`: whether `w` is frozen (no gradient flows to it).
        - `batch_ndim`: how many leading axes of `weight` are batch axes, each with
            its own adaptation. The default, `weight.ndim - 2`, adapts the trailing
            matrices. `0` adapts a convolution kernel `(out, in, *spatial)` as the
            matrix `out x (in * prod(spatial))`, as peft does for convolutions:
            `a` is `(out, rank)` and `b` is `(rank, in, *spatial)`.
        - `row_ndim`: how many axes (after the batch axes) the rows `n` span,
            `1` by default; the columns `m` are the axes after them. A Flax NNX
            convolution kernel `(*spatial, in, out)` is adapted with
            `batch_ndim=0` and `row_ndim=weight.ndim - 1`, as the matrix
            `(prod(spatial) * in) x out`, peft's factoring of a convolution:
            `a` is `(*spatial, in, rank)` (a kernel with `rank` outputs) and `b`
            is `(rank, out)`. With more than one row axis, DoRA (which
            normalises the rows) is refused, and so are the rules that need
            one row axis (a transpose moving them, a gather of rows): they fall
            back to the dense weight or refuse.
        - `variant`: `"lora"` (the default); `"rslora"`, whose update is scaled by
            `alpha / sqrt(rank)` (rank-stabilised LoRA, peft's `use_rslora`); or
            `"dora"` (weight-decomposed LoRA, peft's `use_dora`): the weight is
            `magnitude * (w + s a b) / ||w + s a b||`, the norm taken over each row
            (each output: the axes after `n`), `magnitude` starting at the row
            norms of `w` (so that a fresh array computes `w`) and trained with `a`
            and `b`. As in peft (and the DoRA paper, section 4.3), no gradient
            flows through the norm.
        - `dropout`: the probability of LoRA dropout, in `[0, 1)`: the adapter's
            input (not `w`'s) is dropped, as peft's `lora_dropout`, when a key is
            set with [`quax_lora.with_dropout_key`][]. `0` (the default) never
            drops.
        - `adapter_dtype`: the dtype of `a`, `b` and DoRA's `magnitude`: a
            floating dtype, complex exactly when `w`'s is. `None` (the default)
            takes `w`'s. `jnp.float32` for a bfloat16 or float16 `w` is peft's
            default (its `autocast_adapter_dtype=True`): the optimiser then
            updates the adapter in float32, while `w @ x` stays in `w`'s dtype.
        - `key`: a `jax.random` key, used to initialise `a`.

        Invalid arguments raise a `ValueError` that names the argument and says
        what is wrong.
        """
        if isinstance(weight, LoraArray):
            raise ValueError(
                "LoraArray needs a plain array as its weight, got a LoraArray (a "
                "quax.ArrayValue of another type, such as a quantised array, is "
                "accepted). To adapt a LoraArray again, merge it "
                "first (quax_lora.merge); loraify skips weights that already are one."
            )
        if isinstance(weight, quax.Value) and not isinstance(weight, quax.ArrayValue):
            raise ValueError(
                f"LoraArray needs a plain array or a quax.ArrayValue as its weight, "
                f"got a {type(weight).__qualname__}, a quax.Value without an array's "
                "shape and dtype."
            )
        if not isinstance(weight, quax.ArrayValue):
            weight = jnp.asarray(weight)
        if batch_ndim is None:
            batch_ndim = weight.ndim - 2
        if (
            isinstance(batch_ndim, bool)
            or not isinstance(batch_ndim, int)
            or not 0 <= batch_ndim <= weight.ndim - 2
        ):
            raise ValueError(
                f"LoraArray needs a weight with at least 2 axes and an integer "
                f"0 <= batch_ndim <= weight.ndim - 2; got shape {weight.shape} and "
                f"batch_ndim={batch_ndim!r}."
            )
        if not jnp.issubdtype(weight.dtype, jnp.inexact):
            raise ValueError(
                f"LoraArray needs a floating-point weight, got dtype {weight.dtype}."
            )
        if (
            isinstance(row_ndim, bool)
            or not isinstance(row_ndim, int)
            or not 1 <= row_ndim <= weight.ndim - batch_ndim - 1
        ):
            raise ValueError(
                f"LoraArray needs an integer 1 <= row_ndim <= weight.ndim - "
                f"batch_ndim - 1 (the rows and the columns each at least one "
                f"axis); got shape {weight.shape}, batch_ndim={batch_ndim} and "
                f"row_ndim={row_ndim!r}."
            )
        split = batch_ndim + row_ndim
        n = math.prod(weight.shape[batch_ndim:split])
        m = math.prod(weight.shape[split:])
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or rank < 1:
            raise ValueError(f"LoraArray needs an integer rank >= 1, got {rank!r}.")
        rank = int(rank)
        if rank > min(n, m):
            # The published quax accepts it (the update `a @ b` is then any matrix,
            # as with rank `min(n, m)`), so it is accepted here too, with a warning.
            extra = rank - min(n, m)
            matrices = math.prod(weight.shape[:batch_ndim])
            warnings.warn(
                f"LoraArray(rank={rank}) exceeds what the weight can use: the weight "
                f"of shape {weight.shape} adapts {n} x {m} matrices, whose rank is at "
                f"most min({n}, {m}) = {min(n, m)}. The {extra} extra rank(s) add "
                f"{extra * (n + m) * matrices} parameters to `a` and `b` (and their "
                "share of every product's work and of the adapter's file) and no "
                "expressiveness; the scaling alpha / rank also divides by the "
                f"larger rank. Pass rank <= {min(n, m)} (loraify caps the rank of "
                "each layer so)",
                RankWarning,
                stacklevel=_user_stacklevel(),
            )
        if not _positive_finite(scale):
            raise ValueError(
                f"LoraArray needs a finite scale > 0 (the standard deviation of `a` "
                f"at initialisation; with `b` starting at zero, scale=0 would leave "
                f"both factors without gradient), got scale={scale!r}."
            )
        if alpha is not None and not _positive_finite(alpha):
            raise ValueError(
                f"LoraArray needs alpha=None or a finite alpha > 0 (the update is "
                f"scaled by alpha / rank), got alpha={alpha!r}."
            )
        if variant not in VARIANTS:
            raise ValueError(
                f"LoraArray needs variant= one of {', '.join(map(repr, VARIANTS))}, "
                f"got variant={variant!r}."
            )
        if not (isinstance(dropout, int | float) and 0 <= dropout < 1) or isinstance(
            dropout, bool
        ):
            raise ValueError(
                f"LoraArray needs a dropout probability 0 <= dropout < 1, got "
                f"dropout={dropout!r}."
            )
        if variant == "dora" and row_ndim != 1:
            raise ValueError(
                f"LoraArray(variant='dora') needs row_ndim=1, got row_ndim="
                f"{row_ndim}: DoRA keeps one magnitude per row, and rows spanning "
                "several axes (an NNX convolution kernel's window and inputs) "
                "would normalise its outputs, the columns. Use variant='lora' or "
                "'rslora'."
            )
        if adapter_dtype is None:
            adapter_dtype = weight.dtype
        else:
            problem = _adapter_dtype_problem(jnp.dtype(adapter_dtype), weight.dtype)
            if problem is not None:
                raise ValueError(
                    f"LoraArray needs adapter_dtype= a floating dtype, complex "
                    f"exactly when the weight's ({weight.dtype}) is; got "
                    f"adapter_dtype={jnp.dtype(adapter_dtype)}: {problem}"
                )
        for name, flag in (
            ("allow_materialise", allow_materialise),
            ("stop_gradient", stop_gradient),
        ):
            if not isinstance(flag, bool | np.bool_):
                raise ValueError(
                    f"LoraArray needs {name}=True or False, got {name}={flag!r}."
                )
        batch = weight.shape[:batch_ndim]
        rows = weight.shape[batch_ndim:split]
        rest = weight.shape[split:]
        self.w = weight
        self.a = jr.normal(key, (*batch, *rows, rank), dtype=adapter_dtype) * scale
        self.b = jnp.zeros((*batch, rank, *rest), dtype=adapter_dtype)
        # DoRA's magnitude starts at the row norms of `w`: with `b` zero, the
        # weight is then `w` itself.
        self.magnitude = (
            quax.quaxify(_row_norms)(weight, batch_ndim, jnp.dtype(adapter_dtype))
            if variant == "dora"
            else None
        )
        self.dropout_key = None
        self.index = None
        # A Python float: a JAX scalar as this static field warned, and failed
        # under `jax.jit` (its comparison is an array).
        self.alpha = None if alpha is None else float(alpha)
        self.allow_materialise = bool(allow_materialise)
        self.stop_gradient = bool(stop_gradient)
        self.variant = variant
        self.dropout = float(dropout)
        self.row_ndim = row_ndim
        self.adapters = None
        self.init = None
        self.init_settings = ()

    def __check_init__(self) -> None:
        """The shapes and dtypes of the fields against each other, as `__init__`
        makes them: run after `__init__`, and by `quax.quaxify` on an array rebuilt
        without it (`eqx.tree_at`, `jax.tree.map`), whose rules would otherwise
        broadcast a factor of the wrong shape silently. Reads shapes, dtypes and
        static fields only."""
        w, a, b = self.w, self.a, self.b
        stacked = self.adapters is not None
        nb = a.ndim - 1 - self.row_ndim - stacked
        w_shape = tuple(w.shape)
        if nb < 0 or w.ndim < nb + self.row_ndim + 1:
            raise ValueError(
                f"LoraArray needs `a` of shape (*batch, *rows, rank) with "
                f"row_ndim={self.row_ndim} row axes{' after the adapters' * stacked} "
                f"for `w` of shape {w_shape}; got `a` of shape {a.shape}."
            )
        lead = (self.adapters,) if stacked else ()
        rows_end = nb + self.row_ndim
        rank = a.shape[-1]
        want_a = (*lead, *w_shape[:rows_end], rank)
        want_b = (*lead, *w_shape[:nb], rank, *w_shape[rows_end:])
        for name, got, want in (("a", a.shape, want_a), ("b", b.shape, want_b)):
            if tuple(got) != want:
                raise ValueError(
                    f"LoraArray needs `{name}` of shape {want} for `w` of shape "
                    f"{w_shape} and rank {rank} (batch_ndim={nb}, "
                    f"row_ndim={self.row_ndim}, adapters={self.adapters}); got "
                    f"`{name}` of shape {tuple(got)}."
                )
        if a.dtype != b.dtype:
            raise ValueError(
                f"LoraArray needs `a` and `b` of one dtype (the adapter's); got `a` "
                f"of dtype {a.dtype} and `b` of dtype {b.dtype}. Cast both to one "
                f"floating dtype (that of `w`, {w.dtype}, or a wider one such as "
                "float32, as peft keeps the adapter of a bfloat16 base)."
            )
        problem = _adapter_dtype_problem(a.dtype, w.dtype)
        if problem is not None:
            raise ValueError(
                f"LoraArray needs `a` and `b` of a floating dtype, complex exactly "
                f"when `w`'s is; got `a` and `b` of dtype {a.dtype} for `w` of "
                f"dtype {w.dtype}: {problem}"
            )
        magnitude = self.magnitude
        if (magnitude is None) != (self.variant != "dora"):
            raise ValueError(
                f"LoraArray(variant={self.variant!r}) needs `magnitude` "
                f"{'an array' if self.variant == 'dora' else 'None'}; got "
                f"{'None' if magnitude is None else 'an array'}."
            )
        if magnitude is not None:
            want = (*lead, *w_shape[: nb + 1])
            if tuple(magnitude.shape) != want or magnitude.dtype != a.dtype:
                raise ValueError(
                    f"LoraArray needs `magnitude` of shape {want} and dtype "
                    f"{a.dtype} (one per row of `w`, in the adapter's dtype, that "
                    f"of `a`); got shape {tuple(magnitude.shape)} and dtype "
                    f"{magnitude.dtype}."
                )

    @property
    def adapter_dtype(self) -> jnp.dtype:
        """The dtype of the adapter (`a`, `b` and DoRA's `magnitude`): that of `w`,
        or another floating one (see "Mixed precision")."""
        return jnp.dtype(self.a.dtype)

    @property
    def rank(self) -> int:
        """The rank of the adaptation."""
        return self.a.shape[-1]

    @property
    def batch_ndim(self) -> int:
        """How many leading axes of `w` are batch axes."""
        return self.a.ndim - 1 - self.row_ndim - (self.adapters is not None)

    @property
    def scaling(self) -> float:
        """The factor `s` of the update: `alpha / rank` (`alpha / sqrt(rank)` for
        rsLoRA), or `1` without `alpha`."""
        if self.alpha is None:
            return 1.0
        if self.variant == "rslora":
            return self.alpha / math.sqrt(self.rank)
        return self.alpha / self.rank

    def replace(self, **fields: Any) -> "LoraArray":
        """A copy with the given fields replaced, built field by field (as JAX
        rebuilds a pytree: `__init__` does not run again)."""
        out = object.__new__(type(self))
        for field in dataclasses.fields(self):
            object.__setattr__(
                out, field.name, fields.pop(field.name, getattr(self, field.name))
            )
        if fields:
            raise TypeError(f"LoraArray has no field(s) {', '.join(fields)}.")
        return out

    def selected(self) -> "LoraArray":
        """The array with the one adapter that `index` selects, gathered from the
        stacked `a` and `b` (and `magnitude`): itself when it holds one adapter.

        **Raises:**

        `ValueError` when it stacks adapters and none is selected.
        """
        if self.adapters is None:
            return self
        if self.index is None:
            raise ValueError(
                f"A LoraArray of shape {self.shape} holds {self.adapters} adapters "
                "and none is selected: call the model as "
                "quax.quaxify(quax_lora.select_adapter(model, i))(x), with `i` the "
                "adapter of each row (inside jax.vmap, one per row), or take one "
                "out with quax_lora.unstack_adapters."
            )
        index = jnp.asarray(self.index)
        return self.replace(
            a=self.a[index],
            b=self.b[index],
            magnitude=None if self.magnitude is None else self.magnitude[index],
            index=None,
            adapters=None,
        )

    def row_scale(self) -> Array | None:
        """DoRA's factor per row, `magnitude / ||w + s a b||` (the norm over each
        row, kept out of the gradient), shape `(*batch, n)`; `None` for the other
        variants. For an array holding one adapter (see `selected`).

        The squared norm is summed from factors, never from `a @ b`:
        `||w_i||^2 + 2 s <w_i b^T, a_i> + s^2 a_i (b b^T) a_i^T`, which costs a
        product of `w` with `b` (`n m rank` multiplications) and `n m` for the
        norms of `w`, on every call.
        """
        if self.magnitude is None:
            return None
        norm_sq = quax.quaxify(_factored_row_norms_sq)(
            self.weight(), self.a, self.b, self.scaling
        )
        norm = lax.stop_gradient(jnp.sqrt(norm_sq))
        return (self.magnitude / norm).astype(self.magnitude.dtype)

    def weight(self) -> Array | quax.ArrayValue:
        """`w`, behind `lax.stop_gradient` when `stop_gradient` is set: what every
        rule computes with, so that no gradient reaches a frozen weight. (For a
        `quax.ArrayValue` weight, every leaf of it is stopped.)"""
        return lax.stop_gradient(self.w) if self.stop_gradient else self.w

    def delta(self) -> Array:
        """The dense update `s * (a @ b)`, shape `w.shape` (of the selected adapter
        when it stacks several), in the widest of float32, `w`'s dtype and the
        adapter's. Used by `materialise` and `quax_lora.merge`; rules never form
        it."""
        self = self.selected()
        nb = self.batch_ndim
        batch = tuple(range(nb))
        out = lax.dot_general(
            self.a,
            self.b,
            (((nb + self.row_ndim,), (nb,)), (batch, batch)),
            preferred_element_type=jnp.promote_types(
                jnp.promote_types(self.w.dtype, self.a.dtype), jnp.float32
            ),
        )
        return out * self.scaling

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.w.shape, self.w.dtype)

    def dense(self) -> Array:
        """The dense weight `w + s * a @ b` (for DoRA, `magnitude` times its
        rows normalised), in the dtype of `w`. A `w` that is itself a
        `quax.Value` is materialised by its own policy (or refuses)."""
        w = self.weight()
        if isinstance(w, quax.Value):
            w = w.materialise()  # the weight's own refusal, if it has one
        return self.dense_from(w)

    def dense_from(self, w: Array) -> Array:
        """The dense weight of this array with the dense base weight `w`
        (`self.w` densified): `w + s * a @ b`, for DoRA scaled per row to
        `magnitude`, in the dtype of `self.w`: summed (and scaled) in the widest
        of float32, `w`'s dtype and the adapter's, then rounded once."""
        one = self.selected()
        full = w + one.delta()
        if one.magnitude is not None:
            nb = one.batch_ndim
            norm = jnp.sqrt(
                jnp.sum(jnp.square(full), axis=tuple(range(nb + 1, full.ndim)))
            )
            scale = one.magnitude / lax.stop_gradient(norm)
            full = full * scale.reshape(scale.shape + (1,) * (full.ndim - nb - 1))
        return full.astype(self.w.dtype)

    def refusal_reason(self) -> str:
        return (
            f"forming its dense weight w + s * a @ b (shape {self.w.shape}, dtype "
            f"{self.w.dtype}) would cost what LoRA saves"
        )

    def way_out(self, primitive: Any = None) -> str:
        del primitive
        return (
            "Pass allow_materialise=True to LoraArray / quax_lora.loraify (or call "
            ".enable_materialise()) to allow it, or use quax_lora.merge(model) to "
            "get dense weights."
        )


def _adapter_dtype_problem(adapter: jnp.dtype, w: jnp.dtype) -> str | None:
    """What is wrong with an adapter of dtype `adapter` for a `w` of dtype `w`
    (why, and the way out), or `None` when it is fine: a floating dtype, complex
    exactly when `w`'s is."""
    if not jnp.issubdtype(adapter, jnp.inexact):
        return (
            f"the adapter is trained, so it must be floating. Use a floating "
            f"dtype for `a` and `b` (adapter_dtype= in LoraArray / loraify), "
            f"such as {w} (that of `w`) or float32."
        )
    adapter_complex = jnp.issubdtype(adapter, jnp.complexfloating)
    if adapter_complex != jnp.issubdtype(w, jnp.complexfloating):
        return (
            "a complex adapter needs a complex `w`, and a complex `w` a complex "
            "adapter. Make both real or both complex: the adapter in "
            f"{w} (adapter_dtype={w} in LoraArray / loraify), or convert `w`."
        )
    return None


def _row_norms(w: Any, batch_ndim: int, dtype: jnp.dtype) -> Array:
    """The norm of each row of `w` (an array, or a `quax.ArrayValue` inside
    `quax.quaxify`; over the axes after `batch_ndim`), in `dtype` (the
    adapter's): DoRA's initial magnitude."""
    axes = tuple(range(batch_ndim + 1, w.ndim))
    w32 = w.astype(jnp.promote_types(jnp.promote_types(w.dtype, dtype), jnp.float32))
    return jnp.sqrt(jnp.sum(w32 * w32, axis=axes)).astype(dtype)


def _factored_row_norms_sq(w: Any, a: Array, b: Array, scaling: float) -> Array:
    """`||w_i + s a_i b||^2` for every row `i`, from the factors: `a @ b` is never
    formed. In float32 at least (and the adapter's dtype), but for `w b^T`, whose
    `b` is cast to `w`'s dtype (a wider `w` would be a dense copy of it), and
    accumulated in that wider dtype."""
    nb = a.ndim - 2
    dtype = jnp.promote_types(a.dtype, jnp.float32)
    batch = tuple(range(nb))
    w_rest = tuple(range(nb + 1, w.ndim))
    b_rest = tuple(range(nb + 1, b.ndim))
    a32, b32 = a.astype(dtype), b.astype(dtype)
    ww = jnp.sum(jnp.square(w.astype(dtype)), axis=w_rest)
    # <w_i, a_i b> = sum_r a_ir <w_i, b_r>: `w b^T` is (*batch, n, rank).
    wb = lax.dot_general(
        w,
        b.astype(w.dtype),
        ((w_rest, b_rest), (batch, batch)),
        preferred_element_type=dtype,
    )
    cross = jnp.sum(a32 * wb.astype(dtype), axis=-1)
    # ||a_i b||^2 = a_i (b b^T) a_i^T: `b b^T` is (*batch, rank, rank).
    gram = lax.dot_general(b32, b32, ((b_rest, b_rest), (batch, batch)))
    ab = jnp.sum(jnp.einsum("...nr,...rs->...ns", a32, gram) * a32, axis=-1)
    return ww + 2 * scaling * cross + scaling**2 * ab


def _user_stacklevel() -> int:
    """The `stacklevel` of a warning raised by the caller of this function that
    points at the user's code: the first frame outside quax-lora, quax and
    equinox (which wrap a value's `__init__` in frames of their own)."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[
        0
    ] in ("quax_lora", "quax", "equinox"):
        frame = frame.f_back
        level += 1
    return level


def _positive_finite(x: Any) -> bool:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return False
    return math.isfinite(value) and value > 0
