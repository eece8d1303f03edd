"""Values closed over, or built inside, a quaxified function join its trace.

An operator on a value (`G * t`) runs `quax.quaxify` on the operator. Inside another
quaxified function, that used to open a nested quax trace which took the outer
tracer `t` for a plain array and built a value of values
(`Quantity(Quantity(...))`). The value now joins the enclosing trace, as JAX lifts
a constant into the trace of the tracer it meets: tested with units, LoRA and zeros,
at several depths (vmap, grad, jit and quaxify inside quaxify). What needs no family
(a user's own types) is in quax-core's `tests/test_nesting.py`.
"""

import operator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
from quax.zero import Zero
from quax_lora import LoraArray
from quax_units import Quantity, ustrip


G = Quantity(9.81, "m/s2")


def _fall(t: Any) -> Any:
    return 0.5 * G * t**2


def _assert_metres(r: Any, expected: Any) -> None:
    assert type(r) is Quantity
    # The numbers are plain arrays (not quantities of quantities).
    assert not any(isinstance(x, quax.Value) for x in jax.tree.leaves(r.value))
    np.testing.assert_allclose(ustrip("m", r), expected, rtol=1e-6)


def test_closed_over_quantity_joins_the_trace() -> None:
    r = quax.quaxify(_fall)(Quantity(2.0, "s"))
    _assert_metres(r, 0.5 * 9.81 * 4.0)


def test_closed_over_quantity_under_jit_and_grad() -> None:
    r = jax.jit(quax.quaxify(_fall))(Quantity(2.0, "s"))
    _assert_metres(r, 19.62)
    g = jax.grad(lambda t: ustrip("m", quax.quaxify(_fall)(Quantity(t, "s"))))(2.0)
    np.testing.assert_allclose(g, 9.81 * 2.0, rtol=1e-6)


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param(lambda f, t: f(t), id="direct"),
        pytest.param(lambda f, t: jax.vmap(f)(t), id="vmap"),
        pytest.param(lambda f, t: jax.jit(f)(t), id="jit"),
        pytest.param(lambda f, t: quax.quaxify(f)(t), id="quaxify"),
        pytest.param(
            lambda f, t: quax.quaxify(lambda u: jax.vmap(f)(u))(t), id="quaxify-vmap"
        ),
    ],
)
def test_value_built_inside_at_every_depth(inner: Any) -> None:
    # The constant is built inside the quaxified function, and used at each depth.
    def outer(u: Any) -> Any:
        c = Quantity(2.0, "m/s")
        return inner(lambda t: c * t, u)

    t = Quantity(jnp.array([1.0, 2.0, 3.0]), "s")
    _assert_metres(quax.quaxify(outer)(t), [2.0, 4.0, 6.0])
    _assert_metres(jax.jit(quax.quaxify(outer))(t), [2.0, 4.0, 6.0])


def test_attributes_and_methods_of_traced_values() -> None:
    def f(t: Any) -> Any:
        v = G * t
        assert str(v.unit) == "m / s"
        km = v.to("km/s")
        assert str(km.unit) == "km / s"
        return km.to_value("km/s"), km

    for fn in (quax.quaxify(f), jax.jit(quax.quaxify(f))):
        numbers, km = fn(Quantity(2.0, "s"))
        np.testing.assert_allclose(numbers, 0.01962, rtol=1e-5)
        assert type(km) is Quantity and str(km.unit) == "km / s"
    g = jax.grad(lambda t: quax.quaxify(f)(Quantity(t, "s"))[0])(2.0)
    np.testing.assert_allclose(g, 0.00981, rtol=1e-5)


def test_no_loop_carry_blame_for_closed_over_values() -> None:
    # The units family blamed "a loop carry or a traced value" when the nested
    # trace handed it a tracer: ustrip of the result now simply works inside.
    out = quax.quaxify(lambda t: ustrip("m", _fall(t)))(Quantity(2.0, "s"))
    np.testing.assert_allclose(out, 19.62, rtol=1e-6)


def test_closed_over_lora_meets_traced_zero() -> None:
    lora = LoraArray(jnp.ones((3, 3)), rank=1, key=jr.key(0))

    def f(s: Any) -> Any:
        return quax.quaxify(operator.mul)(lora, s)

    r = quax.quaxify(f)(Zero((), jnp.float32))
    assert type(r) is Zero and r.shape == (3, 3)
    r = jax.jit(quax.quaxify(lambda s: quax.quaxify(f)(s)))(Zero((), jnp.float32))
    assert type(r) is Zero and r.shape == (3, 3)


def test_closed_over_zero_meets_traced_quantity() -> None:
    zero = Zero((2,), jnp.float32)
    r = quax.quaxify(lambda q: quax.quaxify(operator.add)(zero, q))(
        Quantity(jnp.array([1.0, 2.0]), "m")
    )
    _assert_metres(r, [1.0, 2.0])


# Values built inside a `jax.jit` (or `vmap`, `cond`) in the quaxified function: JAX
# traces the jit with the value types erased, so the values are staged and built
# where quax re-runs what JAX staged (see `quax._dispatch._staged`).


def _speed(s: Any) -> Any:
    return Quantity(2.0, "m/s") * s


@pytest.mark.parametrize(
    "program",
    [
        pytest.param(lambda t: jax.jit(_speed)(t), id="jit"),
        pytest.param(lambda t: jax.jit(lambda s: jax.jit(_speed)(s))(t), id="jit-jit"),
        pytest.param(
            lambda t: jax.jit(lambda s, k: _speed(s) * k, static_argnums=1)(t, 1.0),
            id="static-arg",
        ),
        pytest.param(lambda t: eqx.filter_jit(_speed)(t), id="filter_jit"),
        pytest.param(lambda t: jax.vmap(jax.jit(_speed))(t), id="jit-in-vmap"),
        pytest.param(lambda t: jax.jit(jax.vmap(_speed))(t), id="vmap-in-jit"),
    ],
)
def test_quantity_built_inside_jit(program: Any) -> None:
    t = Quantity(jnp.array([1.0, 3.0]), "s")
    _assert_metres(quax.quaxify(program)(t), [2.0, 6.0])
    _assert_metres(jax.jit(quax.quaxify(program))(t), [2.0, 6.0])


def test_issue_example_and_grad_through_jit() -> None:
    r = quax.quaxify(lambda t: jax.jit(lambda s: Quantity(2.0, "m/s") * s)(t))(
        Quantity(3.0, "s")
    )
    _assert_metres(r, 6.0)

    def f(t: Any) -> Any:
        jitted = jax.jit(lambda s, x: Quantity(2.0, "m/s") * s * x)
        return jax.grad(lambda x: ustrip("m", jitted(t, x)))(1.0)

    np.testing.assert_allclose(quax.quaxify(f)(Quantity(3.0, "s")), 6.0, rtol=1e-6)


def test_lora_and_zero_built_inside_jit() -> None:
    def lora_times(z: Any) -> Any:
        lora = LoraArray(jnp.ones((3, 3)), rank=1, key=jr.key(0))
        return quax.quaxify(operator.mul)(lora, z)

    r = quax.quaxify(lambda s: jax.jit(lora_times)(s))(Zero((), jnp.float32))
    assert type(r) is Zero and r.shape == (3, 3)

    def plus_zero(q: Any) -> Any:
        return quax.quaxify(operator.add)(Zero((2,), jnp.float32), q)

    r = quax.quaxify(lambda q: jax.jit(plus_zero)(q))(
        Quantity(jnp.array([1.0, 2.0]), "m")
    )
    _assert_metres(r, [1.0, 2.0])
