"""Values built inside a function that JAX stages (`jit`, `cond`, ...) or batches
(`vmap`) in a quaxified function join the quax trace (see `quax._dispatch._staged`).

`jax.jit(g)(t)` inside `quax.quaxify` traces `g` with `t`'s type erased; a value
that `g` builds and multiplies with `t` used to dispatch on that erased type and
come back as a value of values. A tiny user type whose products combine static tags
shows which types met; symbolic zeros are the core's own type. A user's dense wrapper
with quaxified operators, as the published tutorials write it, is closed over at two
depths, passed through nested `quaxify` levels that a `filter_spec` keeps apart, and
built inside a `jit`. The same with the families' types (units, LoRA) is in the
repository's root `tests/test_families_nesting.py`.
"""

import operator
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jaxtyping import Array, ArrayLike
from quax.zero import Zero


class Tagged(quax.ArrayValue):
    """An array with a static tag; a product's tag names both factors' tags (a plain
    array counts as `1`), so the result says which types the rule saw. Other
    primitives keep the tag."""

    array: Array
    tag: str = eqx.field(static=True)

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        raise RuntimeError("Refusing to materialise `Tagged`")

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        # Other primitives (broadcasts, conversions) keep the first tag.
        tag = next(v.tag for v in values if isinstance(v, Tagged))
        out = primitive.bind(*map(_array, values), **params)
        if primitive.multiple_results:
            return [Tagged(o, tag) for o in out]
        return Tagged(out, tag)

    __mul__ = quax.quaxify(operator.mul)
    __rmul__ = quax.quaxify(lambda a, b: b * a)


def _tag(x: Any) -> str:
    return x.tag if isinstance(x, Tagged) else "1"


def _array(x: Any) -> Any:
    return x.array if isinstance(x, Tagged) else x


@quax.register(lax.mul_p)
def _mul(x: Tagged | ArrayLike, y: Tagged | ArrayLike, **params: Any) -> Tagged:
    return Tagged(lax.mul(_array(x), _array(y), **params), f"{_tag(x)}*{_tag(y)}")


class Diagonal(quax.ArrayValue):
    """A diagonal matrix from its diagonal: its aval is not its leaf's, so a batch of
    diagonals is not a diagonal of the batched leaf."""

    diag: Array

    def aval(self) -> Any:
        n = self.diag.shape[0]
        return jax.core.ShapedArray((n, n), self.diag.dtype)

    def materialise(self) -> Array:
        return jnp.diag(self.diag)

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        raise NotImplementedError(primitive)

    __mul__ = quax.quaxify(operator.mul)


def _assert_tagged(r: Any, tag: str, expected: Any) -> None:
    assert type(r) is Tagged, r
    assert not isinstance(r.array, quax.Value), r
    assert r.tag == tag
    np.testing.assert_allclose(r.array, expected, rtol=1e-6)


T = Tagged(jnp.array([1.0, 2.0]), "t")


def _build_inside(s: Any) -> Any:
    return Tagged(2.0, "c") * s


@pytest.mark.parametrize(
    ("program", "tag"),
    [
        pytest.param(lambda t: jax.jit(_build_inside)(t), "c*t", id="jit"),
        pytest.param(
            lambda t: jax.jit(jax.jit(_build_inside))(t), "c*t", id="nested-jit"
        ),
        pytest.param(
            lambda t: jax.jit(lambda s: jax.jit(_build_inside)(s * 1.0))(t),
            "c*t*1",
            id="jit-of-derived",
        ),
        pytest.param(
            lambda t: eqx.filter_jit(_build_inside)(t), "c*t", id="filter_jit"
        ),
        pytest.param(
            lambda t: jax.jit(lambda s, n: _build_inside(s) * n, static_argnums=1)(
                t, 1.0
            ),
            "c*t*1",
            id="static-arg",
        ),
        pytest.param(
            lambda t: jax.vmap(jax.jit(_build_inside))(t), "c*t", id="jit-in-vmap"
        ),
        pytest.param(
            lambda t: jax.jit(jax.vmap(_build_inside))(t), "c*t", id="vmap-in-jit"
        ),
        pytest.param(lambda t: jax.vmap(_build_inside)(t), "c*t", id="vmap"),
        pytest.param(
            lambda t: lax.cond(True, _build_inside, lambda s: Tagged(2.0, "c") * s, t),
            "c*t",
            id="cond",
        ),
        pytest.param(
            lambda t: quax.quaxify(lambda u: jax.jit(_build_inside)(u))(t),
            "c*t",
            id="quaxify-jit",
        ),
    ],
)
def test_value_built_inside_a_staged_function(program: Any, tag: str) -> None:
    _assert_tagged(quax.quaxify(program)(T), tag, [2.0, 4.0])
    _assert_tagged(jax.jit(quax.quaxify(program))(T), tag, [2.0, 4.0])


def test_value_built_inside_jit_meets_plain_arrays_only() -> None:
    # Inside the quaxified function the jit's arguments are plain: the value still
    # gets its type (and the jit, which has no value input, is run by quax).
    x = jnp.array([3.0, 4.0])
    r = quax.quaxify(lambda t, x: jax.jit(_build_inside)(x))(T, x)
    _assert_tagged(r, "c*1", [6.0, 8.0])
    r = quax.quaxify(lambda t: jax.jit(lambda: Tagged(2.0, "c") * jnp.ones(2))())(T)
    _assert_tagged(r, "c*1", [2.0, 2.0])


def test_the_same_jitted_function_inside_and_outside() -> None:
    # JAX caches what it traced: quax keeps the two kinds of traces apart.
    jitted = jax.jit(_build_inside)
    x = jnp.array([3.0, 4.0])
    _assert_tagged(jitted(x), "c*1", [6.0, 8.0])
    _assert_tagged(quax.quaxify(jitted)(T), "c*t", [2.0, 4.0])
    _assert_tagged(jitted(x), "c*1", [6.0, 8.0])


def test_jit_inside_grad_inside_quaxify() -> None:
    def f(t: Any, x: Any) -> Any:
        def g(x: Any) -> Any:
            y = jax.jit(lambda s, x: jnp.sum((Tagged(2.0, "c") * s).array) * x)
            return y(t, x)

        return jax.grad(g)(x)

    # `.array` is read on the plain tracer in the jit: it fails there, clearly.
    with pytest.raises(AttributeError, match="array"):
        quax.quaxify(f)(T, 1.0)

    def h(t: Any, x: Any) -> Any:
        del t
        product = quax.quaxify(lambda z, x: z * x + x * x)
        return jax.grad(jax.jit(lambda x: product(Zero((), jnp.float32), x)))(x)

    np.testing.assert_allclose(quax.quaxify(h)(T, 3.0), 6.0)


def test_zero_built_inside_jit() -> None:
    def f(t: Any) -> Any:
        return jax.jit(
            lambda s: quax.quaxify(operator.mul)(Zero((2,), jnp.float32), s)
        )(t)

    r = quax.quaxify(f)(T)
    assert type(r) is Zero and r.shape == (2,)


def test_staged_value_without_quax_raises() -> None:
    def f(t: Any) -> Any:
        return jax.make_jaxpr(_build_inside)(jnp.ones(2)), t

    jaxpr, _ = quax.quaxify(f)(T)
    with pytest.raises(RuntimeError, match="without the quax trace"):
        jax.extend.core.jaxpr_as_fun(jaxpr)(jnp.ones(2))


def test_staged_value_batched_where_its_type_does_not_batch() -> None:
    def f(t: Any, d: Any) -> Any:
        return jax.jit(jax.vmap(lambda d, s: Diagonal(d) * s, in_axes=(0, None)))(d, t)

    with pytest.raises(ValueError, match="does not batch leaf by leaf"):
        quax.quaxify(f)(Tagged(jnp.ones(()), "t"), jnp.ones((3, 2)))


def test_staged_value_differentiated_raises() -> None:
    def f(t: Any) -> Any:
        return jax.jit(lambda s: jax.jvp(lambda y: Tagged(y, "c") * s, (1.0,), (1.0,)))(
            t
        )

    with pytest.raises(NotImplementedError, match="differentiated"):
        quax.quaxify(f)(T)


# A user's wrapper as the published tutorials write it, closed over or built inside.


class Boxed(quax.ArrayValue):
    """A user's dense wrapper with quaxified operators, as the published tutorials
    write them."""

    array: Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        raise RuntimeError("Refusing to materialise `Boxed`")

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        arrays = [v.array if isinstance(v, Boxed) else v for v in values]
        out = primitive.bind(*arrays, **params)
        if primitive.multiple_results:
            return [Boxed(o) for o in out]
        return Boxed(out)

    __mul__ = quax.quaxify(operator.mul)
    __rmul__ = quax.quaxify(lambda a, b: b * a)


def test_user_type_closed_over_at_two_depths() -> None:
    c = Boxed(jnp.array([2.0, 3.0]))
    x = Boxed(jnp.array([5.0, 7.0]))
    r = quax.quaxify(lambda b: c * b)(x)
    assert type(r) is Boxed and type(r.array) is not Boxed
    np.testing.assert_allclose(r.array, [10.0, 21.0])
    r = quax.quaxify(lambda b: quax.quaxify(lambda u: jax.vmap(lambda v: c * v)(u))(b))(
        Boxed(jnp.ones((4, 2)))
    )
    assert type(r) is Boxed and type(r.array) is not Boxed
    np.testing.assert_allclose(r.array, np.tile([2.0, 3.0], (4, 1)))


def test_filter_spec_keeps_levels_apart() -> None:
    # The published tutorials' nesting: an outer level with a filter_spec leaves the
    # unselected values to the inner level, which takes the outer tracer for an array.
    c = Boxed(jnp.array([2.0, 3.0]))
    inner = quax.quaxify(lambda a, b: a * b)
    r = quax.quaxify(lambda a, b: inner(a, b), filter_spec=(True, (False, True), True))(
        c, Boxed(jnp.array([5.0, 7.0]))
    )
    assert type(r) is Boxed and type(r.array) is Boxed


def test_user_type_built_inside_jit() -> None:
    def f(b: Any) -> Any:
        return jax.jit(lambda u: Boxed(jnp.array([2.0, 3.0])) * u)(b)

    for fn in (quax.quaxify(f), jax.jit(quax.quaxify(f))):
        r = fn(Boxed(jnp.array([5.0, 7.0])))
        assert type(r) is Boxed and type(r.array) is not Boxed
        np.testing.assert_allclose(r.array, [10.0, 21.0])
