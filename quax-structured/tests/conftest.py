"""Fixtures shared by the quax-structured tests."""

import functools as ft

import jax
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs


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
