"""A value rebuilt without its constructor (`eqx.tree_at`, `jax.tree.map`) is
checked again where quaxify boxes it: its type's `__check_init__` runs before any
rule reads it, so a field of the wrong shape is refused rather than broadcast."""

from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax


class Outer(quax.ArrayValue):
    """`u[:, None] * v[None, :]`, shape `(n, m)`: `u` must have `n` entries. A `u`
    of shape `(1,)` would broadcast into a wrong matrix of the right shape."""

    u: jax.Array
    v: jax.Array
    n: int = eqx.field(static=True)

    def __check_init__(self) -> None:
        if jnp.shape(self.u) != (self.n,) or jnp.ndim(self.v) != 1:
            raise ValueError(
                f"Outer needs `u` of shape ({self.n},) and a vector `v`; got `u` of "
                f"shape {jnp.shape(self.u)}."
            )

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray((self.n, self.v.shape[-1]), self.v.dtype)

    def materialise(self) -> jax.Array:
        return jnp.broadcast_to(self.u[:, None] * self.v[None, :], self.aval().shape)


class Holder(quax.ArrayValue):
    """A value holding another in a field (as QLoRA's weight is a value)."""

    inner: tuple[Outer, ...]

    def aval(self) -> jax.core.ShapedArray:
        return self.inner[0].aval()

    def materialise(self) -> jax.Array:
        return self.inner[0].materialise()


@quax.register(lax.mul_p)
def _(x: Outer, y: jax.Array | float) -> Outer:
    return Outer(x.u * y, x.v, x.n)


def cast_any(x: Any) -> Any:
    return x


def _good() -> Outer:
    return Outer(jnp.arange(1.0, 4.0), jnp.arange(1.0, 5.0), 3)


def _bad() -> Outer:
    # The constructor refuses this `u`; `eqx.tree_at` does not run it.
    return eqx.tree_at(lambda o: o.u, _good(), jnp.ones(1))


def _dense(x: Outer) -> np.ndarray:
    return np.outer(np.asarray(x.u), np.asarray(x.v))


def test_constructor_refuses_and_tree_at_does_not() -> None:
    with pytest.raises(ValueError, match="Outer needs `u`"):
        Outer(jnp.ones(1), jnp.ones(4), 3)
    assert _bad().u.shape == (1,)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize(
    "program",
    [lambda o: o * 2.0, lambda o: jnp.sum(o), lambda o: o @ jnp.ones(4)],
    ids=["mul", "sum", "matmul"],
)
def test_argument_refused_before_any_rule(program, jit) -> None:
    f = quax.quaxify(program)
    f = jax.jit(f) if jit else f
    with pytest.raises(ValueError) as info:
        f(_bad())
    message = str(info.value)
    assert "`Outer`" in message and "`u`" in message
    assert "constructor" in message and "eqx.tree_at" in message
    assert "Outer needs `u`" in str(info.value.__cause__)


def test_consistent_values_still_run() -> None:
    good = _good()
    out = quax.quaxify(lambda o: o * 2.0)(good)
    np.testing.assert_allclose(out.materialise(), 2.0 * _dense(good))
    total = jax.jit(quax.quaxify(jnp.sum))(good)
    np.testing.assert_allclose(total, _dense(good).sum(), rtol=1e-6)
    # A consistent value rebuilt by `jax.tree.map` (an optimiser's update) passes.
    scaled = jax.tree.map(lambda leaf: 3.0 * leaf, good)
    out = quax.quaxify(lambda o: o @ jnp.ones(4))(scaled)
    np.testing.assert_allclose(out, _dense(scaled) @ np.ones(4), rtol=1e-6)


def test_vmap_sees_each_example() -> None:
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), _good(), _good())
    out = jax.vmap(quax.quaxify(lambda o: o @ jnp.ones(4)))(stacked)
    np.testing.assert_allclose(out, np.stack([_dense(_good()) @ np.ones(4)] * 2))


def test_closed_over_value_refused() -> None:
    bad = _bad()

    def meets_a_function(x):
        # Typed `Any`: JAX's signature takes arrays; a value converts itself.
        return jnp.add(cast_any(bad), x)

    def meets_an_operator(x):
        return bad * x

    for program in (meets_a_function, meets_an_operator):
        with pytest.raises(ValueError, match="`Outer` whose fields break"):
            quax.quaxify(program)(_good())
    with pytest.raises(ValueError, match="`Outer` whose fields break"):
        jax.jit(quax.quaxify(meets_a_function))(_good())


def test_bound_and_converted_value_refused() -> None:
    bad = _bad()
    with pytest.raises(ValueError, match="`Outer` whose fields break"):
        quax.quaxify(lambda x: lax.add_p.bind(x, bad))(_good())
    # Outside quaxify, JAX's conversion materialises it: the checks run first.
    with pytest.raises(ValueError, match="`Outer` whose fields break"):
        jnp.add(cast_any(bad), 1.0)


def test_value_staged_into_a_jit_refused() -> None:
    bad = _bad()
    inner = quax.quaxify(lambda a, b: a * b)

    def outer(o):
        return jax.jit(lambda t: inner(bad, t))(jnp.float32(2.0)) + o

    with pytest.raises(ValueError, match="`Outer` whose fields break"):
        quax.quaxify(outer)(_good())


def test_value_held_in_a_field_refused() -> None:
    good = Holder((_good(),))
    np.testing.assert_allclose(quax.quaxify(jnp.sum)(good), _dense(_good()).sum())
    bad = eqx.tree_at(lambda h: h.inner[0].u, good, jnp.ones(1))
    with pytest.raises(ValueError, match="`Outer` whose fields break"):
        quax.quaxify(jnp.sum)(bad)


def test_filter_spec_checks_the_selected_values() -> None:
    # `filter_spec` over `(fn, args, kwargs)`: the first argument only.
    selected = quax.quaxify(
        lambda a, b: a * 2.0, filter_spec=(False, (True, False), False)
    )
    with pytest.raises(ValueError, match="`Outer` whose fields break"):
        selected(_bad(), _good())
    # The value it leaves out reaches the nested quaxify, which checks it.
    nested = quax.quaxify(
        lambda a, b: quax.quaxify(lambda o: o * 2.0)(b),
        filter_spec=(False, (True, False), False),
    )
    with pytest.raises(ValueError, match="`Outer` whose fields break"):
        nested(_good(), _bad())


class ReadsValues(quax.ArrayValue):
    """A type whose check reads array values (against the contract): on tracers
    (under `jit`) it cannot run, and is skipped as before quax re-ran checks."""

    x: jax.Array

    def __check_init__(self) -> None:
        if bool(jnp.any(self.x < 0)):
            raise ValueError("ReadsValues needs non-negative entries")

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.x.shape, self.x.dtype)

    def materialise(self) -> jax.Array:
        return self.x


def test_check_reading_values_is_skipped_on_tracers() -> None:
    value = ReadsValues(jnp.arange(3.0))
    np.testing.assert_allclose(jax.jit(quax.quaxify(jnp.sum))(value), 3.0)
    # Eagerly the same check runs on concrete values, as at construction.
    bad = eqx.tree_at(lambda v: v.x, value, -jnp.ones(3))
    with pytest.raises(ValueError, match="`ReadsValues` whose fields break"):
        quax.quaxify(jnp.sum)(bad)
