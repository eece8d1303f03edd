"""`jax.eval_shape` and `eqx.filter_eval_shape` inside a quaxified function see value
types: they give the structure the rules give (types, static fields,
`jax.ShapeDtypeStruct` leaves), without computing anything."""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest
import quax


class Tagged(quax.ArrayValue):
    """An array with a static tag that every primitive keeps (and joins: `a+b`)."""

    array: jax.Array
    tag: str = eqx.field(static=True)

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Any:
        raise RuntimeError("Refusing to materialise a Tagged: it never materialises")

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        tags = sorted({v.tag for v in values if isinstance(v, Tagged)})
        arrays = [v.array if isinstance(v, Tagged) else v for v in values]
        out = primitive.bind(*arrays, **params)
        tag = "+".join(tags)
        if primitive.multiple_results:
            return [Tagged(o, tag) for o in out]
        return Tagged(out, tag)


x0 = jnp.array([1.0, 2.0, 3.0])


def _structure(tree: Any) -> Any:
    """`tree`'s structure and its leaves' shapes and dtypes."""
    leaves, treedef = jtu.tree_flatten(tree)
    return treedef, [(jnp.shape(x), jnp.result_type(x)) for x in leaves]


def _check_shapes(shapes: Any, values: Any) -> None:
    assert all(type(s) is jax.ShapeDtypeStruct for s in jtu.tree_leaves(shapes))
    assert _structure(shapes) == _structure(values)


@pytest.mark.parametrize("jit", [False, True])
def test_eval_shape_of_a_closure_sees_the_value_type(jit):
    seen = {}

    def f(q):
        seen["closure"] = jax.eval_shape(lambda: q)
        seen["computed"] = jax.eval_shape(lambda: jnp.sin(q) * Tagged(x0, "b"))
        return jnp.sin(q) * Tagged(x0, "b")

    out = (jax.jit if jit else lambda f: f)(quax.quaxify(f))(Tagged(x0, "a"))
    closure = seen["closure"]
    assert isinstance(closure, Tagged) and closure.tag == "a"
    assert closure.array == jax.ShapeDtypeStruct((3,), jnp.float32)
    computed = seen["computed"]
    assert isinstance(computed, Tagged) and computed.tag == "a+b"
    _check_shapes(computed, out)


def test_eval_shape_of_arguments_and_keywords():
    seen = {}

    def f(q):
        g = lambda a, *, b: (a @ b, jnp.stack([a, b]), a.shape)
        seen["out"] = jax.eval_shape(g, q, b=Tagged(x0, "k"))
        return g(q, b=Tagged(x0, "k"))

    out = quax.quaxify(f)(Tagged(x0, "a"))
    dot, stacked, _ = seen["out"]
    assert isinstance(dot, Tagged) and dot.tag == "a+k"
    assert dot.array == jax.ShapeDtypeStruct((), jnp.float32)
    assert isinstance(stacked, Tagged)
    assert stacked.array == jax.ShapeDtypeStruct((2, 3), jnp.float32)
    _check_shapes(seen["out"][:2], out[:2])


def test_filter_eval_shape_keeps_static_outputs():
    seen = {}

    def f(q):
        g = lambda a, name: {"y": a * 2, "name": name, "n": 3}
        seen["out"] = eqx.filter_eval_shape(g, q, "static")
        return g(q, "static")

    out = quax.quaxify(f)(Tagged(x0, "a"))
    shapes = seen["out"]
    assert shapes["name"] == "static" and shapes["n"] == 3
    assert isinstance(shapes["y"], Tagged) and shapes["y"].tag == "a"
    assert shapes["y"].array == jax.ShapeDtypeStruct((3,), jnp.float32)
    assert _structure(shapes["y"]) == _structure(out["y"])


def test_eval_shape_runs_no_computation():
    calls = []

    def f(q):
        def g():
            jax.debug.callback(lambda: calls.append(1))
            return q * 2

        shape = jax.eval_shape(g)
        assert isinstance(shape, Tagged)
        return q

    quax.quaxify(f)(Tagged(x0, "a"))
    assert calls == []


def test_eval_shape_of_plain_code_inside_is_jaxs():
    seen = {}

    def f(q):
        seen["plain"] = jax.eval_shape(lambda a: a + 1, jnp.ones((2, 2), jnp.int32))
        return q

    quax.quaxify(f)(Tagged(x0, "a"))
    assert seen["plain"] == jax.ShapeDtypeStruct((2, 2), jnp.int32)


def test_eval_shape_outside_quax_is_unchanged():
    # Outside a quax trace, values are pytrees to JAX, as before.
    out = jax.eval_shape(lambda t: t, Tagged(x0, "a"))
    assert isinstance(out, Tagged) and out.tag == "a"
    assert out.array == jax.ShapeDtypeStruct((3,), jnp.float32)
    out = jax.eval_shape(quax.quaxify(lambda t: t * 2), Tagged(x0, "a"))
    assert isinstance(out, Tagged) and out.tag == "a"


def test_eval_shape_inside_a_filter_spec_trace_is_jaxs():
    # A quaxify with a `filter_spec` leaves the values it does not select to nested
    # quaxifies; shape evaluation there is JAX's own.
    seen = {}

    def f(q, p):
        seen["out"] = jax.eval_shape(lambda: q)
        return q

    quax.quaxify(f, filter_spec=(False, (True, False), {}))(
        Tagged(x0, "a"), Tagged(x0, "b")
    )
    assert seen["out"] == jax.ShapeDtypeStruct((3,), jnp.float32)


def test_eval_shape_below_a_jit_inside_stays_on_avals():
    # Below `jax.jit` inside the quaxified function, values reach the code as the
    # jit's tracers of their avals: a probe of a closed-over value agrees with one
    # of an argument (both plain), and the quax trace types the staged program.
    seen = {}

    def f(q):
        def g(a):
            seen["argument"] = jax.eval_shape(lambda: a)
            seen["closure"] = jax.eval_shape(lambda: q * a)
            return q * a

        return jax.jit(g)(q)

    out = quax.quaxify(f)(Tagged(x0, "a"))
    assert isinstance(out, Tagged) and out.tag == "a"
    assert seen["argument"] == jax.ShapeDtypeStruct((3,), jnp.float32)
    assert seen["closure"] == jax.ShapeDtypeStruct((3,), jnp.float32)
