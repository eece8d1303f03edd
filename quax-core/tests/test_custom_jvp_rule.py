"""`Value.custom_jvp_rule`: a value type replaces a `jax.custom_jvp` function's own
JVP rule with one of its own (e.g. the derivative of its own algorithm), keeping
its structure; every other function keeps its own rule."""

from typing import Any, ClassVar

import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
import quax
import quax.testing
from jax import lax
from jaxtyping import Array


class Diagonal(quax.ArrayValue):
    """A diagonal matrix stored as its diagonal; its own rule covers `total`."""

    diag: Array
    seen: ClassVar[list[str]] = []

    def aval(self) -> jax.core.ShapedArray:
        n = self.diag.shape[-1]
        return jax.core.ShapedArray((*self.diag.shape, n), self.diag.dtype)

    def materialise(self) -> Array:
        return self.diag[..., :, None] * jnp.eye(self.diag.shape[-1])

    @staticmethod
    def custom_jvp_rule(name: str, fun: Any, values: Any) -> Any:
        if name == "total":
            return _sum_of_diagonal
        if name == "log_total":
            return _through(fun)
        return None


class WrongRule(Diagonal):
    @staticmethod
    def custom_jvp_rule(name: str, fun: Any, values: Any) -> Any:
        if name == "total":
            return lambda primals, tangents: [jnp.sum(primals[0].diag)]
        return lambda primals, tangents: ([jnp.sum(primals[0].diag)], [tangents[0]])


def _sum_of_diagonal(primals: list[Any], tangents: list[Any]) -> tuple[list, list]:
    (d,), (dot,) = primals, tangents
    Diagonal.seen.append(type(dot).__name__)
    return [jnp.sum(d.diag, axis=-1)], [jnp.sum(dot.diag, axis=-1)]


def _through(fun: Any) -> Any:
    """The rule that differentiates `fun` itself (its body through the rules)."""

    def rule(primals: list[Any], tangents: list[Any]) -> tuple[list, list]:
        leaves, treedef = jtu.tree_flatten(primals)
        outs, dots = jax.jvp(
            lambda *x: fun(*jtu.tree_unflatten(treedef, x)),
            leaves,
            jtu.tree_leaves(tangents),
        )
        return outs, dots

    return rule


@quax.register(lax.reduce_sum_p)
def _(x: Diagonal, *, axes: Any, **params: Any) -> Array:
    del params
    assert tuple(axes) == (x.ndim - 2, x.ndim - 1)
    return jnp.sum(x.diag, axis=-1)


# The functions' own rules double the derivative (and need the dense tangent), so a
# test that sees the true derivative saw the type's rule apply.
@jax.custom_jvp
def total(a):
    return jnp.sum(a, axis=(-2, -1))


total.defjvp(lambda p, t: (total(p[0]), 2 * jnp.sum(t[0], axis=(-2, -1))))


@jax.custom_jvp
def log_total(a):
    return jnp.log(jnp.sum(a, axis=(-2, -1)))


log_total.defjvp(lambda p, t: (log_total(p[0]), 2 * jnp.sum(t[0]) / total(p[0])))


@jax.custom_jvp
def doubled(a):
    return jnp.sum(a, axis=(-2, -1))


doubled.defjvp(lambda p, t: (doubled(p[0]), 2 * jnp.sum(t[0], axis=(-2, -1))))

d0 = np.array([1.0, 2.0, 3.0, 0.5], np.float32)


def test_own_rule_replaces_the_custom_rule():
    Diagonal.seen.clear()
    grad = jax.jit(jax.grad(lambda d: quax.quaxify(total)(Diagonal(d))))
    np.testing.assert_allclose(grad(d0), np.ones(4))
    _, tangent = jax.jvp(lambda d: quax.quaxify(total)(Diagonal(d)), (d0,), (d0,))
    np.testing.assert_allclose(tangent, d0.sum(), rtol=1e-6)
    # The rule saw the tangent as a value of the type, not a dense array.
    assert Diagonal.seen and set(Diagonal.seen) == {"Diagonal"}


def test_rule_through_the_function_itself():
    """`jax.jvp` of `fun` over the leaves: the derivative of the body as the
    rules compute it, under `jit`, `vmap` and `grad`."""
    loss = lambda d: quax.quaxify(log_total)(Diagonal(d))
    got = jax.jit(jax.vmap(jax.grad(loss)))(np.stack([d0, 2 * d0]))
    want = 1 / np.array([d0.sum(), 2 * d0.sum()])[:, None] * np.ones(4)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_other_functions_keep_their_own_rule():
    grad = jax.grad(lambda d: quax.quaxify(doubled)(Diagonal(d)))
    np.testing.assert_allclose(grad(d0), 2 * np.ones(4))


def test_own_rule_never_forms_the_dense_tangent():
    n = 256
    d = jnp.linspace(1.0, 2.0, n)
    for fn in (total, log_total):
        loss = lambda d, fn=fn: quax.quaxify(fn)(Diagonal(d))
        quax.testing.assert_hlo_lacks(jax.grad(loss), d, shapes=[(n, n)])


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (total, r"WrongRule.custom_jvp_rule.*`total` must return a pair"),
        (doubled, r"returned a tangent of shape \(4, 4\) for an output of shape \(\)"),
    ],
)
def test_malformed_rule_says_what_is_wrong(fn, match):
    with pytest.raises(TypeError, match=match):
        jax.grad(lambda d: quax.quaxify(fn)(WrongRule(d)))(d0)


class Squared(quax.ArrayValue):
    """`diag(s)²`: not linear in its leaf `s`; its own rule covers `square`."""

    s: Array
    linear_in_leaves: ClassVar[bool] = False

    def aval(self) -> jax.core.ShapedArray:
        n = self.s.shape[-1]
        return jax.core.ShapedArray((n, n), self.s.dtype)

    def materialise(self) -> Array:
        return jnp.diag(self.s**2)

    @staticmethod
    def custom_jvp_rule(name: str, fun: Any, values: Any) -> Any:
        return _through(fun) if name == "square" else None


@quax.register(lax.mul_p)
def _(x: Squared, y: Squared) -> Squared:
    return Squared(x.s * y.s)


@jax.custom_jvp
def square(a):
    return lax.mul(a, a)


square.defjvp(lambda p, t: (square(p[0]), 2 * p[0] * t[0]))


def test_own_rule_keeps_an_output_that_is_not_linear():
    """With a type's own rule, an output of a type that is not linear in its
    leaves leaves the call as it is (the rule gives its leaves' tangents), also
    under `jax.jvp`; without one it would be materialised."""
    s = jnp.asarray([1.0, 2.0, 3.0])
    out = quax.quaxify(square)(Squared(s))
    assert isinstance(out, Squared)
    np.testing.assert_allclose(out.materialise(), np.diag(s**4))
    primal, tangent = jax.jvp(
        lambda s: quax.quaxify(square)(Squared(s)).s, (s,), (jnp.ones(3),)
    )
    np.testing.assert_allclose(primal, s**2)
    np.testing.assert_allclose(tangent, 2 * s)
