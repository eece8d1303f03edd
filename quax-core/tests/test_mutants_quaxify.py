"""Tests written for mutants of `quax/_transform/_quaxify.py` that a sampled run of
`scripts/mutation.sh transform-quaxify` let through (see `docs/mutation.md`), each
failing with its mutant planted."""

from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from quax.zero import Zero

from .helpers import Refusing


def test_a_leafless_value_out_of_vmap_is_refused() -> None:
    """`jax.vmap` of a quaxified function returning a value without array leaves
    (a `Zero`) would keep the per-example shape: refused, saying where to put the
    vmap (mutant `_check_batchable` 6 never refused)."""
    f = quax.quaxify(lambda z, x: z * x)
    with pytest.raises(ValueError, match=r"returned a Zero float32\[3\], which has no"):
        jax.vmap(f, in_axes=(None, 0))(Zero((3,), jnp.float32), jnp.ones((2, 3)))
    # Inside quaxify, the rules see the batch: a Zero of the batched shape.
    out = quax.quaxify(jax.vmap(lambda z, x: z * x, in_axes=(None, 0)))(
        Zero((3,), jnp.float32), jnp.ones((2, 3))
    )
    assert isinstance(out, Zero) and out.shape == (2, 3)


class Sine(quax.ArrayValue):
    """An array whose `sin` rule is plain JAX's on it."""

    array: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> jax.Array:
        return self.array


class SealedSine(Sine):
    """A `Sine` that refuses to materialise: only its rule can take its `sin`."""

    def materialise(self) -> jax.Array:
        raise RuntimeError("Refusing to materialise a SealedSine")


@quax.register(lax.sin_p)
def _(x: Sine) -> jax.Array:
    return jnp.sin(x.array)


X = jnp.arange(3.0)


@pytest.mark.parametrize("transform", ["none", "jit", "vmap", "grad"])
def test_a_function_called_without_values_inside_a_quaxified_one_runs_once(
    transform: str,
) -> None:
    """A quaxified function called with plain arrays inside another quaxified
    function (there under `jit`, `vmap` or `grad`) runs inside that function's
    trace: a value it builds and binds (`lax.sin`) needs no second run under quax,
    which only a value meeting JAX outside any quax trace calls for. Its Python
    runs once (mutant `_without_values` 1 ran it plainly, then again under a trace
    of its own), and its result is plain JAX's."""
    runs = []

    def build(a: jax.Array) -> jax.Array:
        runs.append(None)
        return lax.sin(Sine(a))

    inner = quax.quaxify(build)
    calls = {
        "none": lambda v: inner(v.array),
        "jit": lambda v: jax.jit(inner)(v.array),
        "vmap": lambda v: jax.vmap(inner)(v.array),
        "grad": lambda v: jax.vmap(jax.grad(inner))(v.array),
    }
    out = quax.quaxify(calls[transform])(Sine(X))
    want = jnp.cos(X) if transform == "grad" else jnp.sin(X)  # plain JAX
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert len(runs) == 1


def test_a_value_built_under_jvp_inside_a_quaxified_function() -> None:
    """A value built from `jax.jvp`'s tracers inside a quaxified function, passed
    to a nested quaxified function, cannot join the outer quax trace (its leaves
    are tracers of a trace inside it): a trace of its own runs its rules there, and
    the derivatives are plain JAX's (mutant `_trace_to_join` 22 looked only at the
    leaves, never at the values, joined the outer trace, and JAX reported a JVP
    tracer escaping)."""
    sin = quax.quaxify(lambda s: lax.sin(s))
    jvp = lambda v: jax.jvp(lambda a: sin(SealedSine(a)), (v.array,), (jnp.ones(3),))
    primal, tangent = quax.quaxify(jvp)(Sine(X))
    want_primal, want_tangent = jax.jvp(jnp.sin, (X,), (jnp.ones(3),))
    np.testing.assert_allclose(primal, want_primal, rtol=1e-6)
    np.testing.assert_allclose(tangent, want_tangent, rtol=1e-6)


class _Holding(eqx.Module):
    """A callable holding a value (a `Sine`: typed `Any`, as `lax.sin` is typed
    to take arrays), whose `sin` it takes under a transform."""

    w: Any
    transform: str = eqx.field(static=True)

    def __call__(self, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        if self.transform == "jit":
            held = jax.jit(lambda: lax.sin(self.w))()
        elif self.transform == "vmap":
            held = jax.vmap(lambda r: lax.sin(self.w) * r)(jnp.ones(2))[1]
        else:
            held = jax.grad(lambda r: (lax.sin(self.w) * r).sum())(1.0)
        return held, lax.sin(v)


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad"])
def test_the_values_a_quaxified_callable_holds_are_dispatched_on(
    transform: str,
) -> None:
    """`quaxify` dispatches on the values in `fn` as in its arguments: a value that
    an `eqx.Module` holds is a tracer of the quax trace in its `__call__`, so that
    its rules apply under a transform there too (mutant `_Quaxify.__call__` 36 took
    the path for functions called on values, which leaves `fn` as it is: the
    held value, closed over, met `lax.sin` under the transform's trace, where it
    was materialised, and refused)."""
    w = X + 1
    held, out = quax.quaxify(_Holding(SealedSine(w), transform))(SealedSine(X))
    want = jnp.sin(w).sum() if transform == "grad" else jnp.sin(w)  # plain JAX
    np.testing.assert_allclose(held, want, rtol=1e-6)
    np.testing.assert_allclose(out, jnp.sin(X), rtol=1e-6)


@pytest.mark.parametrize("transform", ["jit", "vmap"])
def test_a_value_staged_to_join_keeps_the_keyword_arguments(transform: str) -> None:
    """A value built from the tracers of a `jit` or `vmap` inside a quaxified
    function, passed to a nested quaxified function, is staged to join the outer
    quax trace; the nested function gets its keyword arguments as given, and its
    result is plain JAX's (mutant `_call_staged` 12 called it without them: a
    `TypeError`)."""
    shifted = quax.quaxify(lambda s, *, by: lax.sin(s) + by)
    inside = lambda a: shifted(SealedSine(a), by=2.0)
    calls = {
        "jit": lambda v: jax.jit(inside)(v.array),
        "vmap": lambda v: jax.vmap(inside)(v.array),
    }
    out = quax.quaxify(calls[transform])(Sine(X))
    np.testing.assert_allclose(out, jnp.sin(X) + 2.0, rtol=1e-6)


def test_an_eager_library_function_keeps_its_keyword_arguments() -> None:
    """`quaxify` of a jitted function, called eagerly with keyword arguments (a
    plain array and a value), takes the path that runs library code as one
    compiled program (`quax._caching._eager`: equation by equation on the first
    call, then compiled where the backend allows) and gets them on every call: its
    results are NumPy's (mutant `_Quaxify.__call__` 28 passed that path no keyword
    arguments: a `TypeError` on the first call)."""
    scale = jax.jit(lambda a, *, by, shift: a * by - shift)
    x = jnp.arange(6.0).reshape(2, 3)
    by, shift = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, 1.0, 1.5])
    want = np.arange(6.0).reshape(2, 3) * [1.0, 2.0, 3.0] - [0.5, 1.0, 1.5]
    f = quax.quaxify(scale)
    for _ in range(3):
        out = f(Refusing(x), by=by, shift=Refusing(shift))
        assert type(out) is Refusing
        np.testing.assert_allclose(out.array, want, rtol=1e-6)
