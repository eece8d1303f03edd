"""Host callbacks on a TPU get channels of their own at every place of a program
(`quax._foundation._tpu_callbacks`).

The first test is the program that gave a wrong result on a TPU v5e under plain JAX
0.10.2 (2026-12-07): on the CPU, where a callback takes no channel, it passes with or
without the fix; on a TPU it is the check (`scripts/accel-suite.txt`). The others check
the mechanism on any backend, with a primitive whose lowering counts as a host callback
lowered for a TPU.
"""

import itertools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax  # noqa: F401  (installs the fix)
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir
from quax._foundation import _tpu_callbacks


def _factor_on_host(d):
    return np.int32(7), (np.asarray(d[:2]) * 10).astype(np.float32)


def _solve_on_host(handle, d, x):
    return (np.asarray(x) / np.asarray(d[:2])).astype(np.float32)


def _solve(d, b):
    # A factorisation on the host (two outputs), then a `custom_linear_solve` whose
    # solve is a host callback, inside a `jit`: under `jax.jvp` JAX binds the solve
    # twice (the primal and the tangent) with the same parameters.
    held = lax.stop_gradient(d)
    shapes = (jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((2,), d.dtype))
    handle, pivots = jax.pure_callback(_factor_on_host, shapes, held)

    def solve(_, x):
        out = jax.ShapeDtypeStruct((2,), d.dtype)
        return jax.pure_callback(_solve_on_host, out, handle, held, x)

    def inner(b):
        return lax.custom_linear_solve(
            lambda x: d[:2] * x, b, solve=solve, transpose_solve=solve
        )

    return jax.jit(inner)(b) + 0 * pivots


@pytest.mark.parametrize("jit", [False, True])
def test_jvp_of_a_solve_on_the_host(jit):
    d = jnp.asarray([2.0, 4.0, 0.0], jnp.float32)
    b = jnp.asarray([5.0, 7.0], jnp.float32)
    t = jnp.asarray([0.5, -0.25, 3.0], jnp.float32)
    db = jnp.asarray([-1.25, 0.5], jnp.float32)

    def run(d, b):
        return jax.jvp(_solve, (d, b), (t, db))

    x, dx = (jax.jit(run) if jit else run)(d, b)
    # `x = b / d`, `dx = (db - t x) / d`: exact in float32.
    np.testing.assert_array_equal(x, np.array([2.5, 1.75], np.float32))
    np.testing.assert_array_equal(dx, np.array([-1.25, 0.234375], np.float32))


_lowerings = itertools.count()


def _primitive(counts_as_callback: bool) -> Primitive:
    """`x + 1`, whose lowering is counted in `_lowerings` and, where
    `counts_as_callback`, counts as a host callback lowered for a TPU."""
    p = Primitive(f"test_tpu_callbacks_{counts_as_callback}")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x + 1)

    def lowered(x):
        next(_lowerings)
        if counts_as_callback:
            _tpu_callbacks._lowered.count = _tpu_callbacks.tpu_callbacks_lowered() + 1
        return x + 1

    mlir.register_lowering(p, mlir.lower_fun(lowered, multiple_results=False))
    return p


_CALLBACK, _PLAIN = _primitive(True), _primitive(False)


def _times_lowered(fn, *args) -> int:
    start = next(_lowerings)
    jax.jit(fn).trace(*args).lower()
    return next(_lowerings) - start - 1


def _two_places(kind: str, p: Primitive):
    """A program with `p` at two places that JAX's lowering would serve from one."""
    body = lambda x: p.bind(x)
    if kind == "cond":
        return lambda x: (
            lax.cond(x[0] > 0, body, lambda x: x, x),
            lax.cond(x[0] > 0, body, lambda x: x, x * 2),
        )
    if kind == "jit":
        inner = jax.jit(body)
        return lambda x: (inner(x), inner(x * 2))
    if kind == "while":
        loop = lambda x: lax.while_loop(lambda c: c[0] < 3, body, x)
        return lambda x: (loop(x), loop(x * 2))
    if kind == "linear_solve":
        solve = lambda _, x: p.bind(x) - 1
        return lambda x: jax.jvp(
            lambda y: lax.custom_linear_solve(
                lambda v: v, y, solve=solve, transpose_solve=solve
            ),
            (x,),
            (x,),
        )
    raise ValueError(kind)


_KINDS = ["cond", "jit", "while", "linear_solve"]


@pytest.mark.parametrize("kind", _KINDS)
def test_a_lowering_with_a_tpu_callback_is_not_reused(kind):
    x = jnp.ones(3)
    assert _times_lowered(_two_places(kind, _CALLBACK), x) == 2
    # Without a TPU callback JAX reuses the lowering, as before.
    assert _times_lowered(_two_places(kind, _PLAIN), x) == 1


@pytest.mark.parametrize("kind", _KINDS)
def test_the_program_is_unchanged(kind):
    x = jnp.arange(3.0)
    got = jax.jit(_two_places(kind, _CALLBACK))(x)
    want = jax.jit(_two_places(kind, _PLAIN))(x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("emits", [False, True])
def test_a_called_jaxpr_with_a_tpu_callback_is_lowered_again(emits):
    # The function of a called jaxpr (`closed_call`, which JAX stages in a few of its
    # own transformations), kept under `(name, jaxpr, effects)` for the module's
    # later calls of the same jaxpr: dropped where lowering it lowered a callback
    # for a TPU. Checked on the wrapper itself, with JAX's lowering stood in for.
    called = jax.make_jaxpr(lambda x: x + 1)(1.0)
    module = SimpleNamespace(cached_primitive_lowerings={})
    key = ("body", called.jaxpr, ())

    def lower(ctx, fn_name, call_jaxpr, num_const_args, effects, **kwargs):
        ctx.cached_primitive_lowerings[(fn_name, call_jaxpr.jaxpr, tuple(effects))] = 1
        if emits:
            _tpu_callbacks._lowered.count = _tpu_callbacks.tpu_callbacks_lowered() + 1
        return "func"

    lowered = _tpu_callbacks._called_jaxpr_afresh(lower)
    assert lowered(module, "body", called, 0, [], in_avals=()) == "func"
    assert (key in module.cached_primitive_lowerings) is not emits
