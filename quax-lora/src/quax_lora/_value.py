"""The value type: `LoraArray`, a weight `w` plus a low-rank update `a @ b`."""

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
from jaxtyping import Array, PRNGKeyArray


__all__ = ["LoraArray", "LoraWarning", "MaterialisationError", "RankWarning"]


class LoraWarning(UserWarning):
    """The base of quax-lora's warnings: something works, but not as the user may
    expect (filter them all with `warnings.filterwarnings("ignore",
    category=quax_lora.LoraWarning)`)."""


class RankWarning(LoraWarning):
    """A `LoraArray` was made with a rank larger than its matrices can use
    (`min(n, m)`): it works, as in the published quax, but the extra rank adds
    parameters and work and no expressiveness."""


class MaterialisationError(quax.MaterialisationError):
    """A `LoraArray` with `allow_materialise=False` met an operation that has no
    LoRA rule and would need the dense `w + a @ b`. Its message starts with
    "Refusing to materialise `LoraArray`", as the published quax's refusals do;
    it is a [`quax.MaterialisationError`][] (a `RuntimeError`)."""


class LoraArray(quax.GuardedValue):
    """A weight `w` plus a low-rank adaptation: it stands for `w + s * (a @ b)`,
    stored as the three arrays, never summed.

    For a weight of shape `(*batch, n, m)`, `a` has shape `(*batch, n, rank)` and `b`
    shape `(*batch, rank, m)`; `s` is `alpha / rank` (as in peft), or `1` when `alpha`
    is not given (as in the published quax). Inside [`quax.quaxify`][], a product with
    it costs `w @ x + s * (a @ (b @ x))`: the `(n, m)` update `a @ b` is never formed.

    `b` starts at zero, so a fresh `LoraArray` computes exactly what `w` did; `a`
    starts at `Normal(0, scale^2)`. Fine-tuning trains `a` and `b` only: with
    `stop_gradient=True` the gradient with respect to `w` is a symbolic zero, so JAX
    does not compute it.

    **Fields:**

    - `w`: the original weight, shape `(*batch, n, *m)`: an array, or a
        `quax.ArrayValue` such as a quantised array (QLoRA).
    - `a`: shape `(*batch, n, rank)`.
    - `b`: shape `(*batch, rank, *m)`.
    - `alpha`, `allow_materialise`, `stop_gradient`: as passed to `__init__` (static).

    It follows the core's materialisation policy ([`quax.GuardedValue`][]): an
    operation without a LoRA rule raises a [`quax_lora.MaterialisationError`][]
    naming the primitive, the types and the way out, unless
    `allow_materialise=True` (or `.enable_materialise()`, which returns a copy
    sharing `w`, `a` and `b`).
    """

    # `w + s * a @ b` is not linear in the leaves (a, b) together: a custom
    # derivative meets it densified (or refused), never rebuilt from tangents.
    linear_in_leaves: ClassVar[bool] = False
    materialisation_error: ClassVar[type[quax.MaterialisationError]] = (
        MaterialisationError
    )

    w: Array | quax.ArrayValue
    a: Array
    b: Array
    alpha: float | None = eqx.field(static=True)
    stop_gradient: bool = eqx.field(static=True)

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
        - `alpha`: the update is multiplied by `alpha / rank` (peft's `lora_alpha`),
            finite and positive. `None` (the default) multiplies it by one.
        - `allow_materialise`: what to do on an operation without a LoRA rule:
            raise a `MaterialisationError` (a `RuntimeError` whose message starts
            "Refusing to materialise") naming it (`False`, the default), or form
            the dense `w + s * a @ b` and carry on (`True`).
        - `stop_gradient`: whether `w` is frozen (no gradient flows to it).
        - `batch_ndim`: how many leading axes of `weight` are batch axes, each with
            its own adaptation. The default, `weight.ndim - 2`, adapts the trailing
            matrices. `0` adapts a convolution kernel `(out, in, *spatial)` as the
            matrix `out x (in * prod(spatial))`, as peft does for convolutions:
            `a` is `(out, rank)` and `b` is `(rank, in, *spatial)`.
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
        n = weight.shape[batch_ndim]
        m = math.prod(weight.shape[batch_ndim + 1 :])
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
        for name, flag in (
            ("allow_materialise", allow_materialise),
            ("stop_gradient", stop_gradient),
        ):
            if not isinstance(flag, bool | np.bool_):
                raise ValueError(
                    f"LoraArray needs {name}=True or False, got {name}={flag!r}."
                )
        batch = weight.shape[:batch_ndim]
        rest = weight.shape[batch_ndim + 1 :]
        self.w = weight
        self.a = jr.normal(key, (*batch, n, rank), dtype=weight.dtype) * scale
        self.b = jnp.zeros((*batch, rank, *rest), dtype=weight.dtype)
        self.alpha = alpha
        self.allow_materialise = bool(allow_materialise)
        self.stop_gradient = bool(stop_gradient)

    @property
    def rank(self) -> int:
        """The rank of the adaptation."""
        return self.a.shape[-1]

    @property
    def batch_ndim(self) -> int:
        """How many leading axes are batch axes."""
        return self.a.ndim - 2

    @property
    def scaling(self) -> float:
        """The factor `s` of the update: `alpha / rank`, or `1`."""
        return 1.0 if self.alpha is None else self.alpha / self.rank

    def weight(self) -> Array | quax.ArrayValue:
        """`w`, behind `lax.stop_gradient` when `stop_gradient` is set: what every
        rule computes with, so that no gradient reaches a frozen weight. (For a
        `quax.ArrayValue` weight, every leaf of it is stopped.)"""
        return lax.stop_gradient(self.w) if self.stop_gradient else self.w

    def delta(self) -> Array:
        """The dense update `s * (a @ b)`, shape `w.shape`. Used by `materialise` and
        `quax_lora.merge`; rules never form it."""
        nb = self.batch_ndim
        batch = tuple(range(nb))
        out = lax.dot_general(
            self.a,
            self.b,
            (((nb + 1,), (nb,)), (batch, batch)),
            preferred_element_type=jnp.promote_types(self.w.dtype, jnp.float32),
        )
        return out * self.scaling

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.w.shape, self.w.dtype)

    def dense(self) -> Array:
        """The dense weight `w + s * a @ b`, in the dtype of `w`. A `w` that is
        itself a `quax.Value` is materialised by its own policy (or refuses)."""
        w = self.weight()
        if isinstance(w, quax.Value):
            w = w.materialise()  # the weight's own refusal, if it has one
        return (w + self.delta()).astype(self.w.dtype)

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
