"""Fixtures shared by the quax-structured tests."""

import functools as ft
import pathlib

import jax
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
import scipy.linalg


def _densify(x):
    if isinstance(x, qs.StructuredMatrix):
        return x.enable_materialise().materialise()
    return x


@ft.cache
def _compiled(fn):
    """`jax.jit(quax.quaxify(fn))` and `fn` on the densified arguments under
    `jax.jit`, one pair per function: hypothesis examples of one shape share them."""
    dense = lambda *args: fn(*(_densify(x) for x in args))
    return jax.jit(quax.quaxify(fn)), jax.jit(dense)


def _jit_matches_dense(fn, *args):
    """`jax.jit(quax.quaxify(fn))` against `fn` on the dense arrays, also under
    `jax.jit` (eager runs, as the kit's `eval` check and its dense references do,
    cost a compilation per small op). Pass a function defined once (at module
    level), not a fresh lambda per call, so that its compilations are shared."""
    structured, dense = _compiled(fn)
    got, want = structured(*args), dense(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, **quax.testing.tolerance(w.dtype))


@pytest.fixture(scope="session")
def jit_matches_dense():
    """The function `jit_matches_dense(fn, *args)` (asserts; returns nothing)."""
    return _jit_matches_dense


_HERE = pathlib.Path(__file__).parent
_DOUBLE = {np.dtype(np.float64), np.dtype(np.complex128)}


def _dtype_of(value: object) -> np.dtype | None:
    """The dtype a test parameter names (`np.float64`, `jnp.complex64`, a
    `np.dtype`) or holds (an array), else `None`."""
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value)
    dtype = getattr(value, "dtype", value)
    return dtype if isinstance(dtype, np.dtype) else None


def _runs_in_float64(item: pytest.Item) -> bool:
    """Whether `item` computes in float64: when it runs under the `x64` fixture, is
    parametrised by `x64=True`, or by a float64 or complex128 dtype (or array). A
    test that enables float64 inside its body carries the marker itself."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "x64" in getattr(item, "fixturenames", ()) or params.get("x64") is True:
        return True
    return any(_dtype_of(value) in _DOUBLE for value in params.values())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of this folder that compute in float64 carry the `float64` marker,
    which `quax.testing`'s pytest plugin turns into a skip, with its reason, on a
    backend with no native float64 (a TPU: its XLA has no float64 LU nor FFT, and
    aborts the process compiling some complex128 programs, seen on a TPU v5e with
    JAX 0.10.2, 2026-12-08). Their subject is a structure's algebra checked to
    float64's precision; the float32 tests (conformance, solvers, the float32
    parametrisations) run there."""
    for item in items:
        if _HERE in item.path.parents and _runs_in_float64(item):
            item.add_marker(pytest.mark.float64)


@pytest.fixture
def x64():
    """Runs a test in float64, without changing the setting for the other tests
    of the session (a module opts in with
    `pytestmark = pytest.mark.usefixtures("x64")`)."""
    with jax.enable_x64(True):
        yield


def _close(got, want, dtype, scale=10.0):
    tol = quax.testing.tolerance(np.dtype(dtype))
    np.testing.assert_allclose(
        np.asarray(got),
        np.asarray(want),
        rtol=tol["rtol"] * scale,
        atol=tol["atol"] * scale,
    )


@pytest.fixture(scope="session")
def close():
    """The function `close(got, want, dtype, scale=10.0)`: asserts that `got`
    matches `want` within `quax.testing.tolerance(dtype)` times `scale`."""
    return _close


def _toeplitz_guarantee(column, row, b, x, slogdet=()):
    """Asserts the accuracy that quax-structured's documentation page states
    (Pivoting) for an untagged `Toeplitz` of the leaves `column`, `row` (shape
    `(*batch, n)`):
    the answer `x` of `T x = b` (`b`, `x` of shape `(*batch, n)` or `(*batch,
    n, k)`) has a backward error `‖b - T x‖₂ / (N ‖x‖₂ + ‖b‖₂)` of at most `τ =
    (16 + n / 4) eps` (`N ≥ ‖T‖₂` the largest eigenvalue modulus of the `2n`
    circulant matrix whose top-left block `T` is, the bound the check uses),
    plus the rounding of the check itself in the working precision (`T x` by the
    FFT: `2 log₂(2n) eps`); then the forward error is at most `2 κ τ / (1 - κ τ)`
    (`κ = N ‖T⁻¹‖₂`) plus the float64 reference's own error (estimated by a step
    of iterative refinement with the residual in extended precision), and
    `slogdet` (where given: `(sign, logdet)`), the determinant of a matrix that
    close to `T`, within `-n log(1 - κ τ)` of NumPy's (plus NumPy's own error,
    `n² κ eps₆₄`). Computed in float64 from the leaves (not by quax)."""
    column, row, b, x = (np.asarray(a) for a in (column, row, b, x))
    if column.ndim > 1:
        b = np.broadcast_to(b, x.shape)
        parts = [np.asarray(s) for s in slogdet]
        for i in range(column.shape[0]):
            batch = tuple(p[i] for p in parts)
            _toeplitz_guarantee(column[i], row[i], b[i], x[i], batch)
        return
    complex_ = np.iscomplexobj(column) or np.iscomplexobj(x)
    wide = np.complex128 if complex_ else np.float64
    extended = np.clongdouble if complex_ else np.longdouble
    eps = float(np.finfo(column.dtype).eps)
    n = column.shape[-1]
    dense = scipy.linalg.toeplitz(column.astype(wide), row.astype(wide))
    embedding = np.concatenate([column, [0], row[1:][::-1]]).astype(wide)
    bound = np.abs(np.fft.fft(embedding)).max()
    kappa = bound * np.linalg.norm(np.linalg.inv(dense), 2)
    tau = (16 + n / 4) * eps + 2 * np.log2(2 * n) * eps
    b, x = (a.astype(wide).reshape(n, -1) for a in (b, x))

    def residual(y):
        return (
            b.astype(extended) - dense.astype(extended) @ y.astype(extended)
        ).astype(wide)

    norm = lambda a: np.linalg.norm(a, axis=0)
    backward = norm(residual(x)) / (bound * norm(x) + norm(b))
    assert np.all(backward <= tau), ("backward error / eps", backward / eps, tau / eps)
    approximate = np.linalg.solve(dense, b)
    correction = np.linalg.solve(dense, residual(approximate))
    reference = approximate + correction
    reference_error = norm(correction) / norm(reference)
    if kappa * tau < 1:
        forward = norm(x - reference) / norm(reference)
        allowed = 2 * kappa * tau / (1 - kappa * tau) + reference_error
        assert np.all(forward <= allowed), ("forward error", forward, allowed, kappa)
    if slogdet and kappa * tau < 1:
        sign, logdet = (np.asarray(s) for s in slogdet)
        want_sign, want_logdet = np.linalg.slogdet(dense)
        allowed = -n * np.log1p(-kappa * tau) + n**2 * kappa * np.finfo(np.float64).eps
        assert abs(logdet - want_logdet) <= allowed, ("logdet", logdet, want_logdet)
        # The determinant's phase moves by at most as much (a real sign not at all).
        assert abs(sign - want_sign) <= allowed, ("sign", sign, want_sign)


@pytest.fixture(scope="session")
def toeplitz_guarantee():
    """The function `toeplitz_guarantee(column, row, b, x, slogdet=())` (asserts
    the accuracy the documentation page states for an untagged `Toeplitz`'s solve and
    `slogdet`; returns nothing)."""
    return _toeplitz_guarantee
