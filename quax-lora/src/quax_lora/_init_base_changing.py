"""Initialisations that change the base weight, as peft's `init_lora_weights`
defines them: PiSSA (the top singular vectors; the base becomes the residual),
OLoRA (a QR factorisation; the base becomes the residual) and LoftQ (the base
quantised, the adapter the best rank-`r` correction of the quantisation error,
alternated for a few iterations). [`quax_lora.loraify`][] applies them with
`init=`.

Every computation runs once, eagerly, on the dense base weight, in float32 (or
the base's dtype where wider), on the matrix as torch lays out a linear
layer's weight, `(out, in)`: an `eqx.nn.Linear` weight as it is, a Flax NNX
kernel `(in, out)` transposed, so that the factors are peft's for the same
layer. peft's `lora_B` `(out, r)` is then our `a` and its `lora_A` `(r, in)`
our `b` (for NNX, `b` and `a` transposed)."""

import re
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import quax
from jaxtyping import Array, PRNGKeyArray

from ._value import LoraArray


__all__ = [
    "BASE_CHANGING_INITS",
    "LOFTQ_BLOCK",
    "NF4_LEVELS",
    "apply_init",
    "check_init",
    "convert_to_lora",
    "loftq_quantise",
    "svd_lowrank",
]

# The `init=` values of `loraify` that change the base weight (peft's names);
# `"pissa_niter_<k>"` is PiSSA from a randomised SVD with `k` power iterations.
BASE_CHANGING_INITS = ("pissa", "pissa_niter_<k>", "olora", "loftq")
_PISSA_NITER = re.compile(r"pissa_niter_(\d+)")


# bitsandbytes' NF4 levels (QLoRA, appendix E; `get_4bit_type("nf4")`): the
# quantiles of a standard normal distribution, scaled to [-1, 1], with an exact
# zero. Its table as bitsandbytes hardcodes it (and quax-quant's `NF4_CODE`,
# which quax-lora cannot import): recomputed from the definition, some levels
# differ in the last bit of float32, and the quantised bases would then differ
# from bitsandbytes' where an entry falls near a midpoint.
NF4_LEVELS = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    np.float32,
)
# bitsandbytes' block of 4-bit quantisation (its `Params4bit` default): 64
# consecutive entries of the weight, flattened in torch's `(out, in)` order.
LOFTQ_BLOCK = 64


def check_init(
    init: str | None, loftq_bits: int, loftq_iters: int, loftq_format: str | None
) -> None:
    """Raise a `ValueError` naming the argument when `loraify`'s `init=` or its
    LoftQ settings are not ones it knows."""
    if init is None:
        return
    if not isinstance(init, str) or not (
        init in ("pissa", "olora", "loftq") or _PISSA_NITER.fullmatch(init)
    ):
        raise ValueError(
            f"loraify needs init=None (b = 0, the base weight unchanged) or one of "
            f"{', '.join(map(repr, BASE_CHANGING_INITS))}, got init={init!r}."
        )
    if init != "loftq":
        return
    if (
        isinstance(loftq_iters, bool)
        or not isinstance(loftq_iters, int)
        or (loftq_iters < 1)
    ):
        raise ValueError(
            f"loraify(init='loftq') needs an integer loftq_iters >= 1 (the "
            f"alternating steps), got loftq_iters={loftq_iters!r}."
        )
    if loftq_bits not in (4, 8) or isinstance(loftq_bits, bool):
        raise ValueError(
            f"loraify(init='loftq') needs loftq_bits=4 or 8, got "
            f"loftq_bits={loftq_bits!r}."
        )
    if loftq_format not in (None, "nf4", "int") or (
        loftq_format == "nf4" and loftq_bits != 4
    ):
        raise ValueError(
            f"loraify(init='loftq') needs loftq_format=None, 'nf4' (4 bits only) or "
            f"'int', got loftq_format={loftq_format!r} with loftq_bits={loftq_bits}."
        )


def _torch_matrix(x: Any, lora: LoraArray, transposed: bool) -> Array:
    """`x` (of the base weight's shape) as the stack of matrices torch's layer
    would hold, `(*batch, out, in)`, in float32 at least."""
    nb, split = lora.batch_ndim, lora.batch_ndim + lora.row_ndim
    shape = lora.shape
    n, m = int(np.prod(shape[nb:split])), int(np.prod(shape[split:]))
    dtype = jnp.promote_types(lora.dtype, jnp.float32)
    t = jnp.asarray(x, dtype).reshape(*shape[:nb], n, m)
    return jnp.swapaxes(t, -1, -2) if transposed else t


def _from_torch_matrix(t: Array, lora: LoraArray, transposed: bool) -> Array:
    """The inverse of `_torch_matrix`, in the base weight's dtype."""
    t = jnp.swapaxes(t, -1, -2) if transposed else t
    return t.reshape(lora.shape).astype(lora.dtype)


def svd_lowrank(t: Array, rank: int, niter: int, omega: Array) -> tuple[Array, ...]:
    """The randomised SVD of the matrices `t` `(*batch, p, q)` with `rank`
    components, as `torch.svd_lowrank(t, q=rank, niter=niter)` computes it
    (Halko, Martinsson and Tropp 2009, algorithm 5: a wide matrix is transposed
    first; the range is found from `t` times the Gaussian `omega`, refined by
    `niter` power iterations, each re-orthogonalised by a QR factorisation).
    `omega` is the Gaussian test matrix, of shape `(*batch, min(p, q), rank)`.

    **Returns:**

    `u` `(*batch, p, rank)`, `s` `(*batch, rank)` and `vh` `(*batch, rank, q)`,
    with `t ~ u diag(s) vh`."""
    wide = t.shape[-2] < t.shape[-1]
    a = jnp.swapaxes(t, -1, -2) if wide else t
    ah = jnp.swapaxes(a, -1, -2)
    basis = jnp.linalg.qr(a @ omega)[0]
    for _ in range(niter):
        basis = jnp.linalg.qr(ah @ basis)[0]
        basis = jnp.linalg.qr(a @ basis)[0]
    u, s, vh = jnp.linalg.svd(jnp.swapaxes(basis, -1, -2) @ a, full_matrices=False)
    u = basis @ u
    if wide:  # t = a^T = vh^T s u^T
        return jnp.swapaxes(vh, -1, -2), s, jnp.swapaxes(u, -1, -2)
    return u, s, vh


def _split(
    u: Array, s: Array, vh: Array, rank: int, scaling: float
) -> tuple[Array, Array]:
    """peft's `lora_B = u_r diag(sqrt(s_r / scaling))` and `lora_A =
    diag(sqrt(s_r / scaling)) vh_r`, so that `scaling * lora_B @ lora_A` is the
    rank-`rank` truncation `u_r diag(s_r) vh_r`."""
    root = jnp.sqrt(s[..., :rank] / scaling)
    return u[..., :, :rank] * root[..., None, :], root[..., :, None] * vh[..., :rank, :]


def _pissa(
    t: Array, rank: int, scaling: float, niter: int | None, key: Any
) -> tuple[Array, Array]:
    """PiSSA's `(lora_B, lora_A)` of the torch-laid matrices `t`: the top `rank`
    singular triples, split evenly between the factors, divided by the
    scaling (peft's `pissa_init`)."""
    if niter is None:
        u, s, vh = jnp.linalg.svd(t, full_matrices=False)
    else:
        p, q = t.shape[-2:]
        omega = jr.normal(key, (*t.shape[:-2], min(p, q), rank), t.dtype)
        u, s, vh = svd_lowrank(t, rank, niter, omega)
    return _split(u, s, vh, rank, scaling)


def _olora(t: Array, rank: int) -> tuple[Array, Array]:
    """OLoRA's `(lora_B, lora_A)` of the torch-laid matrices `t`: the first
    `rank` columns of `Q` and rows of `R` of `t = Q R` (peft's `olora_init`;
    not divided by the scaling, as peft's are not)."""
    q, r = jnp.linalg.qr(t)
    return q[..., :, :rank], r[..., :rank, :]


def loftq_quantise(t: Array, bits: int, format: str) -> Array:
    """`t` `(*batch, out, in)` quantised and dequantised as LoftQ's quantiser
    does it in peft (through bitsandbytes): for `format="nf4"` each block of 64
    consecutive entries (flattened `(out, in)`, the last block padded) scaled by
    its absmax and rounded to the nearest NF4 level; `format="int"` with 4 bits,
    the same blocks rounded to the 15 levels `k / 7`, `|k| <= 7`; with 8 bits,
    each row (output) scaled by its absmax and rounded to `k / 127`
    (bitsandbytes' int8 `vectorwise` quantisation). A block or row of zeros
    stays zero."""
    if bits == 8:
        absmax = jnp.max(jnp.abs(t), axis=-1, keepdims=True)
        unit = jnp.where(absmax == 0, 1, absmax) / 127
        return jnp.clip(jnp.round(t / unit), -127, 127) * unit
    batch, size = t.shape[:-2], t.shape[-2] * t.shape[-1]
    flat = t.reshape(*batch, size)
    pad = (-size) % LOFTQ_BLOCK
    blocks = jnp.pad(flat, [(0, 0)] * len(batch) + [(0, pad)]).reshape(
        *batch, -1, LOFTQ_BLOCK
    )
    absmax = jnp.max(jnp.abs(blocks), axis=-1, keepdims=True)
    unit = jnp.where(absmax == 0, 1, absmax)
    x = blocks / unit
    if format == "nf4":
        levels = jnp.asarray(NF4_LEVELS, t.dtype)
        nearest = jnp.argmin(jnp.abs(x[..., None] - levels), axis=-1)
        q = levels[nearest]
    else:
        q = jnp.clip(jnp.round(x * 7), -7, 7) / 7
    out = (q * unit).reshape(*batch, -1)[..., :size]
    return out.reshape(t.shape)


def _loftq(
    t: Array,
    rank: int,
    scaling: float,
    iters: int,
    quantise: Callable[[Array], tuple[Array, Any]],
) -> tuple[Array, Array, Any]:
    """LoftQ (Li et al. 2023, algorithm 1, as peft's `loftq_init` runs it):
    `Q = quantise(t - s B A)` (starting from `B A = 0`), then `s B A` the
    rank-`rank` truncated SVD of `t - Q`, `iters` times. Returns `lora_B`,
    `lora_A` and the last `quantise` result (its dequantised matrix and the
    base weight to store)."""
    residual = t
    for i in range(iters):
        deq, stored = quantise(residual)
        u, s, vh = jnp.linalg.svd(t - deq, full_matrices=False)
        lora_b, lora_a = _split(u, s, vh, rank, scaling)
        if i + 1 < iters:
            residual = t - scaling * lora_b @ lora_a
    return lora_b, lora_a, stored


def apply_init(
    lora: LoraArray,
    init: str,
    *,
    transposed: bool,
    key: PRNGKeyArray,
    loftq_bits: int,
    loftq_iters: int,
    loftq_format: str | None,
    loftq_quantiser: Callable[[Array], Any] | None,
) -> LoraArray:
    """`lora` (fresh from `LoraArray(...)`, its base weight the layer's) with
    the adapter and base weight of the initialisation `init` (see
    `loraify`). `transposed`: the weight is laid `(in, out)` (Flax NNX)."""
    w = lora.w
    if isinstance(w, quax.Value):
        raise ValueError(
            f"loraify(init={init!r}) computes the adapter from the dense base "
            f"weight, and this layer's weight of shape {lora.shape} is a "
            f"{type(w).__qualname__}. Loraify the float model (for LoftQ, with "
            "loftq_quantiser= the quantiser whose output is to be the base, say "
            "lambda w: quax_quant.quantise(w, format='nf4'))."
        )
    t = _torch_matrix(w, lora, transposed)
    rank, scaling = lora.rank, lora.scaling
    settings: tuple[tuple[str, Any], ...] = ()
    niter = _PISSA_NITER.fullmatch(init)
    if init == "pissa" or niter:
        lora_b, lora_a = _pissa(
            t, rank, scaling, None if niter is None else int(niter[1]), key
        )
        base: Any = None
    elif init == "olora":
        lora_b, lora_a = _olora(t, rank)
        base = None
    else:
        format = loftq_format or ("nf4" if loftq_bits == 4 else "int")

        def quantise(x: Array) -> tuple[Array, Any]:
            if loftq_quantiser is None:
                deq = loftq_quantise(x, loftq_bits, format)
                return deq, _from_torch_matrix(deq, lora, transposed)
            stored = loftq_quantiser(_from_torch_matrix(x, lora, transposed))
            if tuple(np.shape(stored)) != tuple(lora.shape):
                raise ValueError(
                    f"loraify(init='loftq'): loftq_quantiser returned shape "
                    f"{tuple(np.shape(stored))} for a weight of shape {lora.shape}; "
                    "it must return the quantised weight, of the weight's shape."
                )
            dequantise = getattr(stored, "dequantise", None)
            deq = dequantise() if callable(dequantise) else stored
            if isinstance(stored, quax.Value) and not isinstance(
                stored, quax.ArrayValue
            ):
                raise ValueError(
                    f"loraify(init='loftq'): loftq_quantiser returned a "
                    f"{type(stored).__qualname__}, a quax.Value without an array's "
                    "shape and dtype; return an array or a quax.ArrayValue (a "
                    "quax-quant QuantisedArray)."
                )
            return _torch_matrix(deq, lora, transposed), stored

        lora_b, lora_a, base = _loftq(t, rank, scaling, loftq_iters, quantise)
        settings = (
            ("bits", loftq_bits),
            ("iters", loftq_iters),
            ("quantiser", format if loftq_quantiser is None else "custom"),
        )
    if base is None:  # PiSSA and OLoRA: the residual `W - s B A`
        base = _from_torch_matrix(t - scaling * lora_b @ lora_a, lora, transposed)
    nb, split = lora.batch_ndim, lora.batch_ndim + lora.row_ndim
    rows, cols = lora.shape[nb:split], lora.shape[split:]
    batch = lora.shape[:nb]
    if transposed:  # rows are the inputs: a = lora_A^T, b = lora_B^T
        a, b = jnp.swapaxes(lora_a, -1, -2), jnp.swapaxes(lora_b, -1, -2)
    else:
        a, b = lora_b, lora_a
    dtype = lora.adapter_dtype
    return lora.replace(
        w=base,
        a=a.reshape(*batch, *rows, rank).astype(dtype),
        b=b.reshape(*batch, rank, *cols).astype(dtype),
        init=init,
        init_settings=settings,
    )


def convert_to_lora(tuned: Any, initial: Any) -> Any:
    """A PiSSA or OLoRA adapter as a plain LoRA adapter of twice the rank for the
    base weights before the change, as peft's `save_pretrained(...,
    path_initial_model_for_weight_conversion=...)` converts it: the update
    `s (a b - a0 b0)` (the trained adapter minus the initial one) is
    `s [a | -a0] [b ; b0]`, with `alpha` doubled so that the scaling stays
    (`alpha * sqrt(2)` for rsLoRA), on the base `w_res + s a0 b0` (the
    original weight, summed in float32 and rounded once to `w`'s dtype).

    ```python
    initial = quax_lora.loraify(model, rank=8, alpha=16.0, init="pissa", key=key)
    tuned = train(initial)
    plain = quax_lora.convert_to_lora(tuned, initial)
    quax_lora.save_adapter("adapter", plain, format="peft")  # for `model` itself
    ```

    **Arguments:**

    - `tuned`: the fine-tuned model (an Equinox PyTree), loraified with
        `init="pissa"`, `"pissa_niter_<k>"` or `"olora"`.
    - `initial`: the same model as `loraify` returned it, before training (its
        `a0`, `b0` and residual base weights).

    **Returns:**

    `tuned` with plain `LoraArray`s (`init=None`) of rank `2 * rank` on the
    original weights: it computes what `tuned` computes, and its adapter applies
    to the original model.

    **Raises:**

    `ValueError` when a layer was not initialised by PiSSA or OLoRA (LoftQ's
    base is quantised: the difference is not a low-rank update of the original
    weight), when `initial` is not `tuned`'s initial model (another init, rank
    or shape), or for stacked adapters or DoRA.
    """

    def leaf(new: Any, old: Any) -> Any:
        if not isinstance(new, LoraArray):
            return new
        problem = None
        if new.init is None or new.init == "loftq":
            problem = (
                f"it was initialised with init={new.init!r}, and only PiSSA and "
                "OLoRA adapters convert (LoftQ's base is quantised, so the "
                "difference from the original weight is not low-rank)"
            )
        elif not isinstance(old, LoraArray) or (
            old.init,
            old.shape,
            old.rank,
            old.scaling,
        ) != (new.init, new.shape, new.rank, new.scaling):
            problem = (
                "`initial` has no LoraArray of the same init, shape, rank and "
                "scaling there: pass the model loraify returned before training"
            )
        elif new.adapters is not None or new.variant == "dora":
            problem = "stacked adapters and DoRA do not convert"
        if problem is not None:
            raise ValueError(
                f"quax_lora.convert_to_lora: cannot convert the LoraArray of shape "
                f"{new.shape}: {problem}."
            )
        factor = np.sqrt(2.0) if new.variant == "rslora" else 2.0
        return new.replace(
            w=old.dense(),
            a=jnp.concatenate([new.a, -old.a.astype(new.a.dtype)], axis=-1),
            b=jnp.concatenate([new.b, old.b.astype(new.b.dtype)], axis=new.batch_ndim),
            alpha=None if new.alpha is None else new.alpha * factor,
            init=None,
            init_settings=(),
        )

    return jtu.tree_map(
        leaf, tuned, initial, is_leaf=lambda x: isinstance(x, LoraArray)
    )
