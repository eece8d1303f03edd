"""`quax.register_function` inside a transformation: where `vmap`, `grad`, `jvp` or
`linearize` runs inside `quaxify`, the `jit` quax meets keeps the function's source
but is another function (the batched body, its derivative, its transpose), whose
arguments a rule cannot read; the body runs under the rules instead."""

import functools as ft
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax.core import ShapedArray

from .helpers import Dense, RefusedMaterialisation, dense


@jax.jit
def weighted(a: Any, b: Any) -> Any:
    return a + 2 * b


@jax.jit
def running(a: Any) -> Any:
    return jnp.cumsum(a)


calls: list[str] = []


@quax.register_function(weighted)
def _(a: Dense, b: Dense, *, call: Any) -> Any:
    calls.append("weighted")
    # What the body computes, on the arrays as the rule reads them.
    return Dense(a.array + 2 * b.array)


@quax.register_function(running)
def _(a: Dense, *, call: Any) -> Any:
    calls.append("running")
    return Dense(jnp.cumsum(a.array))


a = jnp.arange(9.0).reshape(3, 3)
b = jnp.array([10.0, 20.0, 30.0])


@pytest.mark.parametrize(
    "in_axes, out_axes", [((1, None), 0), ((1, 0), 1), ((0, None), 1)]
)
def test_a_batched_body_is_not_given_to_the_rule(
    in_axes: tuple[Any, ...], out_axes: int
) -> None:
    def f(a: Any, b: Any) -> Any:
        return jax.vmap(weighted, in_axes=in_axes, out_axes=out_axes)(a, b)

    calls.clear()
    out = quax.quaxify(f)(Dense(a), Dense(b))
    # Before: the rule read the batched `(3, 3)` against `(3,)` as unbatched
    # arrays, broadcasting `b` along the wrong axis.
    np.testing.assert_array_equal(dense(out), f(a, b))
    assert calls == []


def test_vmap_outside_quaxify_still_runs_the_rule() -> None:
    # `quaxify` inside `vmap` meets the function's own body, per example.
    calls.clear()
    f = jax.vmap(quax.quaxify(weighted), in_axes=(1, None))
    np.testing.assert_array_equal(
        dense(f(Dense(a), Dense(b))), jax.vmap(weighted, in_axes=(1, None))(a, b)
    )
    assert calls == ["weighted"]


def test_a_transposed_body_is_not_given_to_the_rule() -> None:
    w = jnp.array([1.0, 2.0, 4.0])

    def loss(x: Any, w: Any) -> Any:
        return jax.grad(lambda x: jnp.vdot(running(x), w))(x)

    calls.clear()
    out = quax.quaxify(loss)(Dense(jnp.zeros(3)), Dense(w))
    # Before: the transpose of `cumsum` (a reversed cumsum, [7, 6, 4]) ran the
    # rule's forward cumsum, [1, 3, 7].
    np.testing.assert_array_equal(dense(out), loss(jnp.zeros(3), w))
    np.testing.assert_array_equal(dense(out), [7.0, 6.0, 4.0])


def test_derivatives_of_the_function_match_plain_jax() -> None:
    x = jnp.array([1.0, -2.0, 0.5])
    t = jnp.array([0.3, 0.1, -1.0])

    def jvp(x: Any, t: Any) -> Any:
        return jax.jvp(running, (x,), (t,))

    def linearized(x: Any, t: Any) -> Any:
        return jax.linearize(running, x)[1](t)

    for f in (jvp, linearized):
        out = quax.quaxify(f)(Dense(x), Dense(t))
        assert jax.tree.all(jax.tree.map(np.array_equal, dense(out), f(x, t))), (
            f.__name__
        )


class Opaque(quax.ArrayValue):
    """An array that no primitive rule takes and that never materialises: only a
    function's rule computes on it."""

    array: jax.Array

    def aval(self) -> ShapedArray:
        return ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> jax.Array:
        raise RefusedMaterialisation("Opaque values never materialise")


@jax.jit
def halved(a: Any) -> Any:
    return a / 2


@quax.register_function(halved)
def _(a: Opaque, *, call: Any) -> Any:
    return Opaque(a.array / 2)


@jax.jit
def column_sums(a: Any) -> Any:
    return jnp.sum(a, axis=0)


@quax.register_function(column_sums)
def _(a: Opaque, *, call: Any) -> Any:
    return Opaque(jnp.sum(a.array, axis=0))


def test_a_transformed_body_that_fails_says_why_the_rule_did_not_run() -> None:
    # Batched along axis 0, the body sums along axis 1 of the batched array: not
    # the function's program on a (3, 3) array, which sums along axis 0.
    def f(a: Any) -> Any:
        return jax.vmap(column_sums)(a)

    with pytest.raises(RefusedMaterialisation) as info:
        quax.quaxify(f)(Opaque(a))
    assert "`vmap`, `grad`, `jvp` or `linearize` inside `quaxify`" in str(
        info.value.__notes__
    )
    # Outside `quaxify`, the rule sees the function's own arguments.
    out = jax.vmap(quax.quaxify(column_sums))(Opaque(a))
    assert isinstance(out, Opaque)
    np.testing.assert_array_equal(out.array, jnp.sum(a, axis=1))


@pytest.mark.parametrize(
    "f, expected",
    [
        (jax.vmap(halved), a / 2),
        (jax.vmap(halved, in_axes=1, out_axes=1), a / 2),
    ],
    ids=["halved", "halved-axis-1"],
)
def test_a_batched_body_that_is_the_functions_own_program_runs_the_rule(
    f: Any, expected: Any
) -> None:
    # Before, every body `vmap` batched inside `quaxify` ran under the rules, which
    # refused here (and on quantities, `vmap(jnp.rad2deg)` multiplied the angle).
    out = quax.quaxify(f)(Opaque(a))
    assert isinstance(out, Opaque)
    np.testing.assert_array_equal(out.array, expected)


@jax.jit
def blend(a: Any, b: Any, w: Any = 0.5, shift: Any = 0.0) -> Any:
    return a * w + b * (1 - w) + shift


@jax.jit
def total(first: Any, *rest: Any) -> Any:
    return first + sum(rest)


@quax.register_function(blend)
def _(a: Dense, b: Dense, w: Any = 0.5, shift: Any = 0.0, *, call: Any) -> Any:
    calls.append("blend")
    return Dense(a.array * w + b.array * (1 - w) + shift)


@quax.register_function(total)
def _(first: Dense, *rest: Any, call: Any) -> Any:
    calls.append("total")
    return Dense(first.array + sum(dense(r) for r in rest))


u = jnp.array([1.0, 2.0])
v = jnp.array([10.0, 30.0])


@pytest.mark.parametrize(
    "f",
    [
        lambda a, b: blend(a, b, shift=1.0),
        lambda a, b: blend(shift=1.0, b=b, a=a),
        lambda a, b: jax.jit(blend, static_argnums=2)(a, b, 0.25, 1.0),
        lambda a, b: jax.jit(ft.partial(blend, a))(b, 0.25),
    ],
    ids=["keyword", "keywords", "static", "partial"],
)
def test_arguments_out_of_order_run_the_body(f: Any) -> None:
    out = quax.quaxify(f)(Dense(u), Dense(v))
    # Before, `shift=1.0` reached the rule as its third argument, `w`. (Where the
    # outer `jit`'s body runs, it calls `blend` with every argument in order: the
    # rule may run there.)
    np.testing.assert_array_equal(dense(out), f(u, v))


@pytest.mark.parametrize(
    "f",
    [
        lambda a, b: blend(a, b, 0.25, 1.0),
        lambda a, b: blend(a, b=b, w=0.25),
        lambda a, b: total(a, b, b),
    ],
    ids=["positional", "keywords-in-order", "varargs"],
)
def test_arguments_in_order_reach_the_rule(f: Any) -> None:
    calls.clear()
    out = quax.quaxify(f)(Dense(u), Dense(v))
    np.testing.assert_array_equal(dense(out), f(u, v))
    assert calls in (["blend"], ["total"])


def _scaled_by(k: float) -> Any:
    @jax.jit
    def scaled(x: Any) -> Any:
        return x * k

    return scaled


def test_a_closure_is_refused() -> None:
    double, triple = _scaled_by(2.0), _scaled_by(3.0)
    # Both have one source: a rule for `double` would run in place of `triple`
    # (2 x where plain JAX gives 3 x).
    with pytest.raises(TypeError, match=r"`scaled`: it is a closure \(over k\)"):
        quax.register_function(double)
    np.testing.assert_array_equal(dense(quax.quaxify(triple)(Dense(u))), 3.0 * u)
