"""quaxify and the registry: API compatibility, composition with JAX transforms,
dispatch resolution and its errors."""

import dataclasses
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
from jax import lax
from jaxtyping import ArrayLike


class Wrapped(quax.ArrayValue):
    """A dense wrapper: every primitive unwraps, binds and rewraps."""

    array: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> jax.Array:
        return self.array

    @staticmethod
    def default(primitive, values, params):
        arrays = [v.array if isinstance(v, Wrapped) else v for v in values]
        out = primitive.bind(*arrays, **params)
        if primitive.multiple_results:
            return [Wrapped(o) for o in out]
        return Wrapped(out)


class Refuses(quax.ArrayValue):
    """Refuses to materialise; knows only `mul` by a plain array."""

    array: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> jax.Array:
        raise RuntimeError("Refuses does not materialise; pass allow=True to allow it")


@quax.register(lax.mul_p)
def _(x: Refuses, y: ArrayLike, **params) -> Refuses:
    return Refuses(lax.mul_p.bind(x.array, y, **params))


class Other(Wrapped):
    @staticmethod
    def default(primitive, values, params):
        raise AssertionError("never used")


def f(x, y):
    """sin(x) * y + x"""
    return jnp.sin(x) * y + x


x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
y = jnp.arange(6.0).reshape(2, 3)


def test_runs_and_matches_dense() -> None:
    out = quax.quaxify(f)(Wrapped(x), y)
    assert isinstance(out, Wrapped)
    np.testing.assert_allclose(out.array, f(x, y), rtol=1e-6)


def test_api_shape() -> None:
    q = quax.quaxify(f)
    assert isinstance(q, eqx.Module)
    assert q.__wrapped__ is f
    assert (q.__name__, q.__qualname__, q.__module__) == ("f", "f", f.__module__)
    assert q.__doc__ == f.__doc__
    # As `eqx.module_update_wrapper` would build it: equinox's flattening keeps the
    # wrapped function's name through a round trip.
    leaves, treedef = jax.tree_util.tree_flatten(q)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert again.__name__ == "f" and again.fn is f
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.fn = jnp.sin  # type: ignore[misc]

    class Model(eqx.Module):
        w: jax.Array

        @quax.quaxify
        def __call__(self, v):
            return self.w * v

    out = Model(Wrapped(y))(x)
    np.testing.assert_allclose(out.array, y * x)


def test_no_value_runs_untraced() -> None:
    # Data-dependent shapes work because nothing is traced.
    out = quax.quaxify(jnp.unique)(jnp.array([3, 1, 3, 2]))
    np.testing.assert_array_equal(out, [1, 2, 3])
    out = quax.quaxify(jnp.compress)(jnp.array([True, False, True]), jnp.arange(3))
    np.testing.assert_array_equal(out, [0, 2])


@pytest.mark.parametrize(
    "transform",
    [jax.jit, eqx.filter_jit, jax.vmap, lambda g: jax.vmap(g, in_axes=(1, 1))],
    ids=["jit", "filter_jit", "vmap", "vmap_axis1"],
)
def test_transform_of_quaxify(transform) -> None:
    out = transform(quax.quaxify(f))(Wrapped(x), y)
    np.testing.assert_allclose(out.array, transform(f)(x, y), rtol=1e-6)


@pytest.mark.parametrize(
    "transform", [jax.jit, jax.vmap, eqx.filter_jit], ids=["jit", "vmap", "filter_jit"]
)
def test_quaxify_of_transform(transform) -> None:
    out = quax.quaxify(transform(f))(Wrapped(x), y)
    np.testing.assert_allclose(out.array, f(x, y), rtol=1e-6)


def loss(a, b):
    return jnp.sum(f(a, b) ** 2)


def test_grad_of_quaxify() -> None:
    g = jax.grad(lambda w: quax.quaxify(loss)(w, y).array)(Wrapped(x))
    np.testing.assert_allclose(g.array, jax.grad(loss)(x, y), rtol=1e-5)
    g = eqx.filter_grad(lambda w: quax.quaxify(loss)(w, y).array)(Wrapped(x))
    np.testing.assert_allclose(g.array, jax.grad(loss)(x, y), rtol=1e-5)


def test_quaxify_of_grad() -> None:
    out = quax.quaxify(jax.grad(loss))(Wrapped(x), y)
    np.testing.assert_allclose(quax_dense(out), jax.grad(loss)(x, y), rtol=1e-5)


def quax_dense(v):
    return v.array if isinstance(v, Wrapped) else v


def test_jvp_vjp_linearize() -> None:
    fq = quax.quaxify(lambda a: f(a, y))
    primal, tangent = jax.jvp(lambda a: fq(Wrapped(a)).array, (x,), (jnp.ones_like(x),))
    p2, t2 = jax.jvp(lambda a: f(a, y), (x,), (jnp.ones_like(x),))
    np.testing.assert_allclose(primal, p2, rtol=1e-6)
    np.testing.assert_allclose(tangent, t2, rtol=1e-6)
    out, pullback = jax.vjp(lambda a: fq(Wrapped(a)).array, x)
    (ct,) = pullback(jnp.ones_like(out))
    np.testing.assert_allclose(
        ct, jax.vjp(lambda a: f(a, y), x)[1](jnp.ones_like(out))[0], rtol=1e-6
    )
    out, lin = jax.linearize(lambda a: fq(Wrapped(a)).array, x)
    np.testing.assert_allclose(lin(jnp.ones_like(x)), t2, rtol=1e-6)
    # Inside quaxify: the transforms run on the values.
    t = quax.quaxify(
        lambda a: jax.jvp(lambda b: f(b, y), (a,), (jnp.ones_like(x),))[1]
    )(Wrapped(x))
    np.testing.assert_allclose(quax_dense(t), t2, rtol=1e-6)


def test_nested_quaxify_with_filter_spec() -> None:
    # The inner level dispatches on `Refuses`; the outer level leaves it alone.
    inner = quax.quaxify(lambda r, w: r * w)

    def outer(r, w):
        return inner(r, w)

    out = quax.quaxify(outer, filter_spec=(True, (False, True), True))(
        Refuses(x), Wrapped(y)
    )
    assert isinstance(out, Refuses)


def test_rule_returning_plain_array_and_multiple_results() -> None:
    out = quax.quaxify(lambda a: lax.sort((a, a), num_keys=1))(Wrapped(x))
    assert isinstance(out, tuple) and all(isinstance(o, Wrapped) for o in out)


def test_materialise_refusal_names_primitive() -> None:
    with pytest.raises(RuntimeError, match="does not materialise"):
        quax.quaxify(jnp.sin)(Refuses(x))
    # The allowed operation works.
    out = quax.quaxify(lambda a: a * 2.0)(Refuses(x))
    np.testing.assert_allclose(out.array, x * 2)


def test_two_defaults_is_type_error() -> None:
    with pytest.raises(
        TypeError,
        match=r"`.*Wrapped.* and `.*Other.* override `Value\.default` differently",
    ):
        quax.quaxify(lambda a, b: a + b)(Wrapped(x), Other(y))


def test_debug_check_names_the_rule() -> None:
    class Bad(Wrapped):
        pass

    @quax.register(lax.cos_p)
    def bad_cos(a: Bad, **params) -> Wrapped:
        return Wrapped(jnp.cos(a.array).astype(jnp.float16))

    quax.set_debug_checks(True)
    try:
        with pytest.raises(TypeError, match=r"rule for `cos`.*float16.*bad_cos"):
            quax.quaxify(jnp.cos)(Bad(x))
    finally:
        quax.set_debug_checks(bool(__import__("os").environ.get("QUAX_DEBUG_CHECKS")))


def test_dispatch_cache_invalidated_by_register() -> None:
    class Late(Wrapped):
        pass

    first = quax.quaxify(jnp.tan)(Late(x))
    assert isinstance(first, Wrapped) and not isinstance(first, Late)

    @quax.register(lax.tan_p)
    def _(a: Late, **params) -> Late:
        return Late(jnp.tan(a.array) + 1)

    second = quax.quaxify(jnp.tan)(Late(x))
    assert isinstance(second, Late)
    np.testing.assert_allclose(second.array, jnp.tan(x) + 1, rtol=1e-6)


def test_resolution_explains_itself() -> None:
    assert quax.resolve(lax.mul_p, [Refuses, jax.Array]).kind == "rule"
    assert quax.resolve(lax.sin_p, [Refuses]).kind == "materialise"
    assert quax.resolve(lax.sin_p, [Wrapped]).kind == "default"


def test_register_elementwise() -> None:
    class Counted(Wrapped):
        pass

    seen = []

    @quax.register_elementwise([lax.exp_p, lax.log_p])
    def _(primitive, a: Counted, **params) -> Counted:
        seen.append(primitive.name)
        return Counted(primitive.bind(a.array, **params))

    out = quax.quaxify(lambda a: jnp.log(jnp.exp(a)))(Counted(x))
    # Both primitives went to the rule (how many times it ran is no contract: a
    # compiled eager program traces it again beside the first call).
    assert isinstance(out, Counted) and set(seen) == {"exp", "log"}
    # `log(exp(x))` is `x` only within the backend's accuracy of both functions.
    np.testing.assert_allclose(out.array, x, **quax.testing.tolerance(x.dtype))


def test_materialisation_report() -> None:
    with quax.track_materialisation() as report:
        jax.eval_shape(quax.quaxify(lambda a: jnp.sin(a) + a), Wrapped(x))
    assert not report
    report = quax.plugins.materialisations(
        lambda a: jnp.tanh(a) + 1, _AllowsMaterialise(x)
    )
    assert report.counts == {("tanh", "_AllowsMaterialise"): 1}
    assert "tanh, _AllowsMaterialise: 1" in str(report)


class _AllowsMaterialise(Refuses):
    def materialise(self) -> jax.Array:
        return self.array


def test_no_warnings_on_plain_use() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quax.quaxify(f)(Wrapped(x), y)


class _Strict(quax.ArrayValue):
    array: jax.Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> jax.Array:
        raise RuntimeError("Refusing to materialise `_Strict`")


def test_materialisation_report_on_a_model_reports_every_refusal() -> None:
    # Any pytree (an MLP keeps its activation functions as fields), and a strict
    # model reports each of its three layers' refusals, not only the first.
    mlp = eqx.nn.MLP(2, 2, width_size=3, depth=2, key=jax.random.key(0))
    is_weight = lambda m: [layer.weight for layer in m.layers]
    strict = eqx.tree_at(is_weight, mlp, [_Strict(w) for w in is_weight(mlp)])
    report = quax.plugins.materialisations(lambda m, v: m(v), strict, jnp.ones(2))
    assert report.refusals == {("dot_general", "_Strict"): 3}
    assert report.total == 0 and report
    assert "refused to materialise" in str(report)
    # Outside the report, the refusal still raises.
    with pytest.raises(RuntimeError, match="Refusing to materialise"):
        quax.quaxify(lambda m, v: m(v))(strict, jnp.ones(2))
