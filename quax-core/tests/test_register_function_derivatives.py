"""`quax.register_function(..., jvp=...)`: the derivative of a rule whose function's
body does not stand in for it (`body_stands_in=False`), for `grad`, `jvp`,
`linearize`, `vjp`, `jacfwd`, `jacrev` and `hessian` inside `quaxify`.

The toy family: `Shown` holds its numbers in one base unit and a display label (as
quax-units' `Quantity` holds SI numbers and a display unit). `to_percent` (jitted,
inlined as `jax.numpy` functions are) multiplies plain numbers by 100; its rule for
`Shown` shows the same number in percent instead (a relabelling: the numbers are
unchanged), so the body's derivative (100) is not the rule's (1). Before the `jvp`
hook, every derivative inside `quaxify` below raised a `NotImplementedError` (the
refusal of a body that does not stand in); with it, each equals the same
computation on the numbers with the relabelling left out, in plain JAX.
"""

import functools as ft
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax

from .helpers import Refusing


class Shown(Refusing):
    """A `Refusing` with a display label (a static field), the same numbers in any
    label."""

    label: str = eqx.field(static=True, default="1")


@ft.partial(jax.jit, inline=True)
def to_percent(a: Any) -> Any:
    return a * 100.0


def _same_tangent(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> Any:
    del primals
    return tangents[0]


@quax.register_function(to_percent, body_stands_in=False, jvp=_same_tangent)
def _(a: Shown, *, call: Any) -> Any:
    # The same numbers, shown in percent: not what the body computes.
    return Shown(a.array, label="%")


# The same relabelling, registered without a `jvp`: still refused under `grad`.
@ft.partial(jax.jit, inline=True)
def to_permille(a: Any) -> Any:
    return a * 1000.0


@quax.register_function(to_permille, body_stands_in=False)
def _(a: Shown, *, call: Any) -> Any:
    return Shown(a.array, label="permille")


def _loss(a: Any) -> Any:
    return jnp.sum(jnp.sin(to_percent(a)) * a)


def _dense_loss(a: Any) -> Any:
    # `_loss` on the numbers: the relabelling leaves them as they are.
    return jnp.sum(jnp.sin(a) * a)


def _numbers(x: Any) -> Any:
    return jax.tree.map(
        lambda v: np.asarray(v.array if isinstance(v, Shown) else v),
        x,
        is_leaf=lambda v: isinstance(v, Shown),
    )


x = jnp.array([0.3, -1.2, 2.0])
u = jnp.array([0.5, -1.0, 2.0])

# Each transformation inside `quaxify`, and its dense reference.
_CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "grad": (jax.grad(_loss), jax.grad(_dense_loss)),
    "value_and_grad": (jax.value_and_grad(_loss), jax.value_and_grad(_dense_loss)),
    "vjp": (
        lambda a: jax.vjp(lambda b: jnp.sin(to_percent(b)) * b, a)[1](u),
        lambda a: jax.vjp(lambda b: jnp.sin(b) * b, a)[1](u),
    ),
    "linearize": (
        lambda a: jax.linearize(_loss, a)[1](u),
        lambda a: jax.linearize(_dense_loss, a)[1](u),
    ),
    "jvp of a plain tangent": (
        lambda a: jax.jvp(_loss, (a,), (u,)),
        lambda a: jax.jvp(_dense_loss, (a,), (u,)),
    ),
    "jacfwd": (
        jax.jacfwd(lambda a: jnp.cos(to_percent(a)) * a),
        jax.jacfwd(lambda a: jnp.cos(a) * a),
    ),
    "jacrev": (
        jax.jacrev(lambda a: jnp.cos(to_percent(a)) * a),
        jax.jacrev(lambda a: jnp.cos(a) * a),
    ),
    "hessian": (jax.hessian(_loss), jax.hessian(_dense_loss)),
    "filter_grad": (eqx.filter_grad(_loss), jax.grad(_dense_loss)),
    "vmap of grad": (
        jax.vmap(jax.grad(_loss)),
        jax.vmap(jax.grad(_dense_loss)),
    ),
    "grad of vmap": (
        jax.grad(lambda a: jnp.sum(jax.vmap(_loss)(a))),
        jax.grad(lambda a: jnp.sum(jax.vmap(_dense_loss)(a))),
    ),
}


@pytest.mark.parametrize("name", list(_CASES))
def test_derivatives_inside_quaxify_use_the_rules_jvp(name: str) -> None:
    transformed, dense = _CASES[name]
    batched = name.startswith(("vmap", "grad of vmap"))
    a = jnp.stack([x, 2 * x]) if batched else x
    got = quax.quaxify(transformed)(Shown(a))
    want = dense(a)
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6),
        _numbers(got),
        _numbers(want),
    )


def test_the_value_is_the_rules() -> None:
    # `value_and_grad` computes the output by the rule (the numbers unchanged,
    # shown in percent), not by the body (times 100).
    value, grad = quax.quaxify(jax.value_and_grad(lambda a: to_percent(a)))(
        Shown(jnp.float32(0.25))
    )
    assert isinstance(value, Shown) and value.label == "%"
    np.testing.assert_array_equal(value.array, 0.25)
    np.testing.assert_array_equal(_numbers(grad), 1.0)


def test_forward_equals_reverse_under_jit_and_vmap() -> None:
    def f(a: Any) -> Any:
        return jnp.cos(to_percent(a)) * a**2

    forward = jax.jit(quax.quaxify(jax.jacfwd(f)))(Shown(x))
    reverse = jax.jit(quax.quaxify(jax.jacrev(f)))(Shown(x))
    dense = jax.jacrev(lambda a: jnp.cos(a) * a**2)(x)
    np.testing.assert_allclose(_numbers(forward), dense, rtol=1e-6)
    np.testing.assert_allclose(_numbers(reverse), dense, rtol=1e-6)
    # `vmap` around the quaxified derivative.
    a = jnp.stack([x, -x, 0.5 * x])
    batched = jax.vmap(quax.quaxify(jax.grad(_loss)))(Shown(a))
    np.testing.assert_allclose(
        _numbers(batched), jax.vmap(jax.grad(_dense_loss))(a), rtol=1e-6
    )


def test_a_value_tangent() -> None:
    # `jvp` with a value tangent: the hook's tangent (the tangent itself).
    out, tangent = quax.quaxify(lambda a, t: jax.jvp(to_percent, (a,), (t,)))(
        Shown(x), Shown(u)
    )
    assert isinstance(out, Shown) and out.label == "%"
    np.testing.assert_array_equal(out.array, x)
    np.testing.assert_array_equal(_numbers(tangent), u)


@pytest.mark.parametrize("name", ["grad", "jacrev", "hessian"])
def test_plain_arrays_keep_jaxs_derivative(name: str) -> None:
    # No value reaches the function: JAX's derivative of the body (times 100).
    transformed, _ = _CASES[name]
    np.testing.assert_allclose(quax.quaxify(transformed)(x), transformed(x), rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(lambda a: jnp.sum(to_percent(a)))(x), jnp.full(3, 100.0)
    )


def test_a_rule_without_a_jvp_is_still_refused() -> None:
    with pytest.raises(NotImplementedError) as info:
        quax.quaxify(jax.grad(lambda a: jnp.sum(to_permille(a))))(Shown(x))
    message = str(info.value)
    assert "`to_permille` of Shown" in message
    assert "body_stands_in=False" in message
    # The way out names the hook.
    assert "jvp=..." in message


@pytest.mark.parametrize(
    "how",
    [
        lambda f: jax.jit(jax.grad(f)),
        lambda f: jax.grad(jax.jit(f)),
        lambda f: jax.grad(jax.checkpoint(f)),
    ],
    ids=["jit grad", "grad jit", "grad checkpoint"],
)
def test_a_derivative_traced_on_abstract_arguments_is_refused(how: Any) -> None:
    # JAX differentiates `to_percent` while it traces a body, before quax knows
    # that a `Shown` reaches it: the body's derivative would run, so quax raises,
    # naming the way out (the `jit` around the quaxified derivative).
    with pytest.raises(NotImplementedError) as info:
        quax.quaxify(how(_loss))(Shown(x))
    message = str(info.value)
    assert "`to_percent` of Shown" in message
    assert "jax.jit(quax.quaxify(jax.grad(f)))" in message
