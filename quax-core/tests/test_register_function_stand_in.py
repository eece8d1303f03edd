"""`quax.register_function(..., body_stands_in=False)`: a rule that computes what
the function's body, run under the rules, cannot (quax-units' `jnp.rad2deg` shows an
angle in degrees where its body multiplies the angle's number by 180 / pi). Where a
transformation inside `quaxify` (`grad`, `value_and_grad`, `vjp`, `linearize`,
`jacfwd`, `jacrev`, `hessian`, `eqx.filter_grad`, through `jit`, `scan` or
`checkpoint`) changed the body before quax met it, the rule cannot run, and the
body ran under the rules instead, silently giving the body's derivative (10 here,
where the rule's is 20). quax now raises there at trace time; where it recognises
the function (`jvp`, `vmap` of the function's own program, transformations outside
`quaxify`) the rule still runs."""

import functools as ft
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax

from .helpers import Refusing


@ft.partial(jax.jit, inline=True)
def tenfold(a: Any) -> Any:
    return a * 10.0


@quax.register_function(tenfold, body_stands_in=False)
def _(a: Refusing, *, call: Any) -> Any:
    # What the body does not compute: a rule whose derivative is 20, not 10.
    return Refusing(a.array * 20.0)


x = jnp.array([1.0, 2.0, -3.0])


def _loss(a: Any) -> Any:
    return jnp.sum(tenfold(a))


def _scan_grad(a: Any) -> Any:
    def body(carry: Any, _: Any) -> tuple[Any, Any]:
        return carry, jax.grad(_loss)(a)

    return lax.scan(body, 0.0, None, length=1)[1][0]


_TRANSFORMS: dict[str, Callable[[Any], Any]] = {
    "grad": jax.grad(_loss),
    "value_and_grad": jax.value_and_grad(_loss),
    "vjp": lambda a: jax.vjp(tenfold, a)[1](jnp.ones(3)),
    "linearize": lambda a: jax.linearize(tenfold, a)[1](jnp.ones(3)),
    "jacfwd": jax.jacfwd(tenfold),
    "jacrev": jax.jacrev(tenfold),
    "hessian": jax.hessian(_loss),
    "checkpoint grad": jax.grad(jax.checkpoint(_loss)),
    "jit grad": jax.jit(jax.grad(_loss)),
    "grad jit": jax.grad(jax.jit(_loss)),
    "scan grad": _scan_grad,
    "filter_grad": eqx.filter_grad(_loss),
    # A plain tangent of a value: the rule's `jvp` cannot take it.
    "jvp of a plain tangent": lambda a: jax.jvp(tenfold, (a,), (jnp.ones(3),)),
}


@pytest.mark.parametrize("name", list(_TRANSFORMS))
def test_a_transformed_body_that_stands_in_for_no_rule_raises(name: str) -> None:
    with pytest.raises(NotImplementedError) as info:
        quax.quaxify(_TRANSFORMS[name])(Refusing(x))
    message = str(info.value)
    assert "`tenfold` of Refusing" in message
    assert "body_stands_in=False" in message
    assert "outside `quaxify`" in message


@pytest.mark.parametrize("name", ["grad", "jacrev", "jit grad"])
def test_plain_arrays_keep_jaxs_derivative(name: str) -> None:
    # No value reaches the function: no rule, JAX's own derivative of the body.
    out = quax.quaxify(_TRANSFORMS[name])(x)
    np.testing.assert_array_equal(out, _TRANSFORMS[name](x))


def test_the_rule_runs_where_quax_recognises_the_function() -> None:
    t = jnp.array([0.5, -1.0, 2.0])
    # `jvp` inside `quaxify`: the rule's `jvp`.
    out, tangent = quax.quaxify(lambda a, u: jax.jvp(tenfold, (a,), (u,)))(
        Refusing(x), Refusing(t)
    )
    np.testing.assert_array_equal(out.array, x * 20.0)
    np.testing.assert_array_equal(tangent.array, t * 20.0)
    # `vmap` of the function's own (elementwise) program inside `quaxify`.
    out = quax.quaxify(jax.vmap(tenfold))(Refusing(x))
    np.testing.assert_array_equal(out.array, x * 20.0)
    # `grad` outside `quaxify`: the rule's derivative, against the dense one.
    got = jax.grad(lambda a: jnp.sum(quax.quaxify(tenfold)(Refusing(a)).array))(x)
    np.testing.assert_array_equal(got, jax.grad(lambda a: jnp.sum(a * 20.0))(x))
