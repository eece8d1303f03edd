"""How `assert_matches_dense` compares an output with the dense reference: within a
tolerance per dtype, NaN where the reference has NaN, the same infinities, and (where
asked) the same signs of zeros."""

from typing import Any, TypedDict

import jax
import jax.numpy as jnp
import numpy as np


__all__ = ["Tolerance", "difference", "tolerance"]


class Tolerance(TypedDict):
    """What [`quax.testing.tolerance`][] returns: the keyword arguments of
    `numpy.testing.assert_allclose` (and `numpy.allclose`) for one dtype, typed so
    that `np.testing.assert_allclose(got, want, **quax.testing.tolerance(dtype))`
    type-checks.
    """

    rtol: float
    atol: float


# Per-dtype (rtol, atol), by item size of the floating-point (or complex) type.
_TOLERANCES = {
    "bfloat16": (1.6e-2, 1.6e-2),
    "float16": (1e-2, 1e-2),
    "float32": (1e-5, 1e-5),
    "complex64": (1e-5, 1e-5),
    "float64": (1e-10, 1e-10),
    "complex128": (1e-10, 1e-10),
}

# Where an accelerator's arithmetic is coarser than the CPU's, per backend and dtype.
# A TPU's float32 `exp`, `log` and the like are approximations good to about 1e-5
# relative (`log(exp(1.0))` is 0.999988 on a TPU v5e), and two programs that compute
# the same result through other fusions differ by that much; its matrix products are
# float32-accurate only at `jax.default_matmul_precision("highest")` (by default they
# multiply in bfloat16 passes, which no float32 tolerance covers: the test suites set
# "highest" on accelerators). GPUs' float32 products use TensorFloat-32 by default,
# likewise.
_ACCELERATOR_TOLERANCES = {
    "tpu": {"float32": (1e-4, 1e-4), "complex64": (1e-4, 1e-4)},
    "gpu": {"float32": (1e-4, 1e-4), "complex64": (1e-4, 1e-4)},
}


def tolerance(dtype: Any) -> Tolerance:
    """The tolerance `assert_matches_dense` uses for results of `dtype`, on the
    backend that runs them (JAX's default backend).

    A result `got` matches `want` where `|got - want| <= atol * max(1, max|want|) +
    rtol * |want|` elementwise: `atol` is relative to the largest magnitude of the
    whole result, so that entries which cancel to near zero are judged on the scale
    of the computation.

    **Arguments:**

    - `dtype`: a NumPy/JAX dtype (or anything `jnp.dtype` accepts).

    **Returns:**

    `{"rtol": ..., "atol": ...}` (a [`quax.testing.Tolerance`][]): `1e-10` for
    float64/complex128, `1e-5` for float32/complex64 (`1e-4` on a TPU or GPU, whose
    float32 transcendental functions are approximations good to about 1e-5; their
    matrix products need `jax.default_matmul_precision("highest")` to be compared at
    a float32 tolerance at all), `1e-2` for float16, `1.6e-2` for bfloat16 (two
    ulps), and `0.0` (exact) for integer and boolean dtypes.
    """
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return {"rtol": 0.0, "atol": 0.0}
    coarser = _ACCELERATOR_TOLERANCES.get(jax.default_backend(), {})
    try:
        rtol, atol = coarser.get(dtype.name) or _TOLERANCES[dtype.name]
    except KeyError:  # float8 and the like: a few of their ulps.
        eps = float(jnp.finfo(dtype).eps)
        rtol, atol = 2 * eps, 2 * eps
    return {"rtol": rtol, "atol": atol}


def _zero_signs_differ(g: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Where `g` and `w` are both zero (a complex number: in a part) of opposite
    signs."""
    parts = (np.real, np.imag) if np.iscomplexobj(w) else (np.asarray,)
    differ = np.zeros(w.shape, bool)
    for part in parts:
        gp, wp = part(g), part(w)
        differ |= (gp == 0) & (wp == 0) & (np.signbit(gp) != np.signbit(wp))
    return differ


def difference(
    got: Any,
    want: Any,
    rtol: float | None = None,
    atol: float | None = None,
    signed_zeros: bool = False,
) -> str:
    """How the array `got` differs from the dense reference `want` (a phrase whose
    subject is `got`), or `""`.

    They must have one shape and dtype, and agree elementwise within `tolerance`
    of the dtype (or `rtol`, `atol`), NaN where `want` has NaN (a NaN elsewhere, or
    a number where `want` has NaN, differs) and the same infinities; with
    `signed_zeros`, a zero of `want` must be a zero of the same sign.

    **Returns:**

    A sentence naming the number of entries that differ, the largest errors and an
    example, or `""` when they match.
    """
    g = np.asarray(got)
    w = np.asarray(want)
    if g.shape != w.shape or g.dtype != w.dtype:
        return (
            f"is a {g.dtype}{list(g.shape)} where the dense reference is a "
            f"{w.dtype}{list(w.shape)}"
        )
    if g.dtype == jax.dtypes.float0 or g.size == 0:
        return ""
    tol = tolerance(w.dtype)
    rtol = tol["rtol"] if rtol is None else rtol
    atol = tol["atol"] if atol is None else atol
    if np.issubdtype(w.dtype, np.complexfloating):
        g, w = g.astype(np.complex128), w.astype(np.complex128)
    else:
        g, w = g.astype(np.float64), w.astype(np.float64)
    finite = np.isfinite(w)
    scale = max(1.0, float(np.max(np.abs(w[finite]), initial=0.0)))
    # inf - inf is NaN: such entries are compared below.
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - w)
    both_nan = np.isnan(g) & np.isnan(w)
    same_inf = np.isinf(w) & (g == w)
    bad = ~(both_nan | same_inf | (err <= atol * scale + rtol * np.abs(w)))
    signs = signed_zeros and np.issubdtype(np.asarray(want).dtype, np.inexact)
    if signs:
        bad |= _zero_signs_differ(g, w)
    if not bad.any():
        return ""
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(w != 0, err / np.abs(w), np.inf)
    worst = np.where(bad, np.nan_to_num(err, nan=np.inf), -1)
    i = np.unravel_index(np.argmax(worst), bad.shape)
    zeros = ", or a zero of the other sign" if signs else ""
    return (
        f"differs from the dense reference at {int(bad.sum())} of {bad.size} "
        f"entries{zeros}: max abs error "
        f"{float(np.nanmax(np.where(bad, err, 0)))}, max rel error "
        f"{float(np.nanmax(np.where(bad, rel, 0)))} (rtol={rtol}, atol={atol} "
        f"x {scale:.3g}); e.g. at {tuple(map(int, i))}: quaxified {g[i]}, dense {w[i]}"
    )
