"""A value built inside a quaxified function works in every `jax.numpy` function that
takes several arrays (`Value.__jax_array__`): it joins the active quax trace, and
outside one it is materialised under its policy.

The user type is `Liftable` (it never materialises, so a passing test proves the
function ran on the value; loops that start from a plain array, as `jnp.polyval`'s,
lift it); `quax.zero.Zero` is the core's own family. Each case is
compared with the same function on the dense arrays.
"""

import operator
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax.zero import Zero

from .helpers import Dense, Liftable, RefusedMaterialisation, Refusing
from .test_clients_bind import Guarded


x0 = jnp.array([0.5, 1.0, 2.0])
a = jnp.array([1.5, -0.5, 0.25])
b = jnp.array([0.75, 2.0, -1.0])
s = jnp.array(3.0)
m = jnp.arange(9.0).reshape(3, 3) / 4


def _as_user(array: Any) -> Any:
    return Liftable(array)


def _as_zero(array: Any) -> Any:
    return Zero(jnp.shape(array), jnp.result_type(array))


def _as_dense_zero(array: Any) -> Any:
    return jnp.zeros(jnp.shape(array), jnp.result_type(array))


def _identity(array: Any) -> Any:
    return array


# Each case: `f(x, V)`, with `x` the function's input and `V` the constructor of the
# value built inside (`V(a)` stands for the constant array `a`).
CASES: dict[str, Callable[[Any, Callable[[Any], Any]], Any]] = {
    # The functions of the issue.
    "where": lambda x, V: jnp.where(x > V(a), x, V(b)),
    "clip": lambda x, V: jnp.clip(x, V(a - 1), V(a + 1)),
    "stack": lambda x, V: jnp.stack([x, V(a)]),
    "concatenate": lambda x, V: jnp.concatenate([x, V(a), V(b)]),
    "full_like": lambda x, V: jnp.full_like(x, V(s)),
    "select": lambda x, V: jnp.select([x > V(a), x < V(b)], [x, V(a)], V(b)),
    # Joins.
    "hstack": lambda x, V: jnp.hstack([V(a), x]),
    "vstack": lambda x, V: jnp.vstack([x, V(a)]),
    "dstack": lambda x, V: jnp.dstack([x, V(a)]),
    "column_stack": lambda x, V: jnp.column_stack([x, V(a)]),
    "append": lambda x, V: jnp.append(x, V(a)),
    "array": lambda x, V: jnp.array([x, V(a)]),
    "asarray": lambda x, V: x * jnp.asarray(V(a)),
    "broadcast_arrays": lambda x, V: jnp.broadcast_arrays(x[:, None], V(a))[1],
    # Elementwise functions of two arrays: below.
    # Products and contractions.
    "dot": lambda x, V: jnp.dot(V(m), x),
    "matmul": lambda x, V: jnp.matmul(x, V(m)),
    "outer": lambda x, V: jnp.outer(x, V(a)),
    "inner": lambda x, V: jnp.inner(V(a), x),
    "vdot": lambda x, V: jnp.vdot(x, V(a)),
    "kron": lambda x, V: jnp.kron(x, V(a)),
    "tensordot": lambda x, V: jnp.tensordot(V(m), x, axes=1),
    "einsum": lambda x, V: jnp.einsum("ij,j->i", V(m), x),
    "cross": lambda x, V: jnp.cross(x, V(a)),
    "polyval": lambda x, V: jnp.polyval(V(a), x),
    "convolve": lambda x, V: jnp.convolve(x, V(a)),
    "average": lambda x, V: jnp.average(V(a), weights=x),
    # Python operators of a tracer, with a value that defines none.
    "operator_add": lambda x, V: x + V(a),
    "operator_rmul": lambda x, V: V(a) * x,
    "operator_matmul": lambda x, V: x @ V(m),
    "operator_gt": lambda x, V: x > V(a),
    "operator_plain_array": lambda x, V: (jnp.ones(3) + V(a)) * x,
}

# Elementwise functions of two arrays, with the value second and first.
_ELEMENTWISE = [
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "fmax", "fmin",
    "arctan2", "hypot", "copysign", "logaddexp", "logaddexp2", "power",
    "float_power", "heaviside", "equal", "less", "greater_equal", "isclose",
]  # fmt: skip


def _value_second(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda x, V: fn(x, V(a))


def _value_first(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda x, V: fn(V(a), x)


for _name in _ELEMENTWISE:
    CASES[_name] = _value_second(getattr(jnp, _name))
    CASES[f"{_name}_reflected"] = _value_first(getattr(jnp, _name))

VALUES = {
    "user": (_as_user, _identity),
    "zero": (_as_zero, _as_dense_zero),
}


def _unwrap(x: Any) -> Any:
    """A test value's array (`Refusing` unwrapped, not materialised); a zero's."""
    if isinstance(x, Dense):
        return x.array
    return x.materialise() if quax.is_value(x) else x


def _check(got: Any, want: Any) -> None:
    got = jax.tree.map(_unwrap, got, is_leaf=quax.is_value)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert jnp.shape(g) == jnp.shape(w)
        assert jnp.result_type(g) == jnp.result_type(w)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def _input(make: Any) -> Any:
    # `x` of the user type too, so that the function's arrays are all values: the
    # user type can only pass by running on them.
    return Liftable(x0) if make is _as_user else Dense(x0)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("case", CASES)
def test_value_built_inside(case, value):
    make, reference = VALUES[value]
    f = CASES[case]
    want = f(x0, reference)
    x = _input(make)
    _check(quax.quaxify(lambda x: f(x, make))(x), want)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize(
    "case", ["where", "clip", "stack", "concatenate", "full_like", "select", "dot"]
)
@pytest.mark.parametrize("transform", ["jit_outside", "jit_inside", "vmap_inside"])
def test_value_built_inside_under_transforms(case, value, transform):
    make, reference = VALUES[value]
    f = CASES[case]
    x = _input(make)
    g = lambda x: f(x, make)
    if transform == "jit_outside":
        got = jax.jit(quax.quaxify(g))(x)
        want = f(x0, reference)
    elif transform == "jit_inside":
        # The value is built in a function that JAX stages: it is staged there and
        # built again when the quax trace re-runs the jaxpr.
        got = quax.quaxify(jax.jit(g))(x)
        want = f(x0, reference)
    else:
        xs = jnp.stack([x0, 2 * x0])
        got = quax.quaxify(jax.vmap(g))(type(x)(xs))
        want = jax.vmap(lambda x: f(x, reference))(xs)
    _check(got, want)


def test_value_built_inside_a_cond_branch():
    f = lambda x: jax.lax.cond(
        True, lambda x: jnp.where(x > Refusing(a), x, Refusing(b)), lambda x: x, x
    )
    got = quax.quaxify(f)(Refusing(x0))
    assert isinstance(got, Refusing)
    _check(got, jnp.where(x0 > a, x0, b))


def test_value_built_inside_gradient():
    # `jnp.where` with a value built inside, differentiated by `jax.grad` outside.
    f = lambda x: jnp.sum(jnp.where(x > 0.75, x**2, Dense(b)))
    got = jax.grad(lambda x: _unwrap(quax.quaxify(f)(Dense(x))))(x0)
    want = jax.grad(lambda x: jnp.sum(jnp.where(x > 0.75, x**2, b)))(x0)
    _check(got, want)


# No value among the arguments --------------------------------------------------------
#
# A quaxified function called on plain arrays alone builds its values inside: they
# work as they do beside a value argument. It runs as plain JAX until a value meets
# JAX, then again from the start under quax (its Python before that point runs
# twice).


def _built_inside(x: Any) -> Any:
    return jnp.where(x > Refusing(a), x, Refusing(b))


_TRANSFORMS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "eager": lambda f: f,
    "jit": jax.jit,
    "vmap": jax.vmap,
    "jit_vmap": lambda f: jax.jit(jax.vmap(f)),
}


@pytest.mark.parametrize("transform", _TRANSFORMS)
def test_plain_inputs_value_built_inside(transform):
    # `Refusing` never materialises: the result can only come from its rules.
    run = _TRANSFORMS[transform](quax.quaxify(_built_inside))
    batched = "vmap" in transform
    x = jnp.stack([x0, 2 * x0]) if batched else x0
    got = run(x)
    assert isinstance(got, Refusing)
    dense = lambda x: jnp.where(x > a, x, b)
    _check(got, jax.vmap(dense)(x) if batched else dense(x))


def test_plain_inputs_value_built_inside_a_solve():
    # The program: a value built from the vmapped arguments, then a
    # `jax.numpy` function of it (a `Liftable` solve runs by its `default`, which
    # never materialises; the solve's plain right-hand side is lifted into it).
    d = jnp.array([[1.0, 2.0, 4.0], [2.0, 2.0, 3.0]])
    rhs = jnp.array([[1.0, 1.0, 1.0], [1.0, -1.0, 2.0]])

    def solve(d: Any, rhs: Any) -> Any:
        return jnp.linalg.solve(Liftable(jnp.diag(d)), rhs)

    got = jax.vmap(quax.quaxify(solve))(d, rhs)
    _check(got, rhs / d)


def test_plain_inputs_value_built_inside_gradient():
    g = quax.quaxify(lambda x: x * Dense(b) + x)
    types = []

    def loss(x: Any) -> Any:
        out = g(x)
        types.append(type(out))
        return jnp.sum(_unwrap(out))

    _check(jax.grad(loss)(x0), b + 1)
    assert types == [Dense]  # by the rules, not materialised


def test_plain_inputs_without_a_value_run_once_as_plain_jax():
    calls = []

    def f(x: Any) -> Any:
        calls.append(None)
        return jnp.unique(x)  # a data-dependent shape: eager plain JAX only

    got = quax.quaxify(f)(jnp.array([2.0, 1.0, 2.0]))
    assert type(got) is type(x0)
    _check(got, jnp.array([1.0, 2.0]))
    assert len(calls) == 1
    jax.jit(quax.quaxify(lambda x: (calls.append(None), x * 2.0)[1]))(x0)
    assert len(calls) == 2


def test_plain_inputs_value_met_late_runs_the_function_again():
    # Documented: the Python before a value meets JAX runs twice.
    before, after = [], []

    def f(x: Any) -> Any:
        before.append(None)
        y = jnp.sin(x)
        out = jnp.where(y > 0.5, y, Refusing(b))
        after.append(None)
        return out

    got = quax.quaxify(f)(x0)
    _check(got, jnp.where(jnp.sin(x0) > 0.5, jnp.sin(x0), b))
    assert (len(before), len(after)) == (2, 1)


def test_plain_inputs_value_met_inside_an_except_exception_block():
    # The function's own `except Exception` never takes the signal to run again.
    def f(x: Any) -> Any:
        try:
            return jnp.where(x > 1.0, x, Refusing(b))
        except Exception:
            return x

    got = quax.quaxify(f)(x0)
    assert isinstance(got, Refusing)
    _check(got, jnp.where(x0 > 1.0, x0, b))


class Densifying(Dense):
    """A `Dense` whose `mul` rule densifies a value of its own with a `jax.numpy`
    function, in the rule's own code: outside the quax trace it runs under."""

    def __mul__(self, other: Any) -> Any:
        return quax.quaxify(operator.mul)(self, other)


@quax.register(jax.lax.mul_p)
def _(x: Densifying, y: jax.Array | float) -> Any:
    return jnp.asarray(Dense(x.array)) * y


def test_a_rules_own_value_is_no_value_of_the_plain_run():
    # The value enters through its own operator (a quax trace of its own), whose
    # rule materialises a value outside it: the plain run goes on, once.
    calls = []

    def f(x: Any) -> Any:
        calls.append(None)
        return Densifying(x) * 2.0

    got = quax.quaxify(f)(x0)
    _check(got, 2 * x0)
    assert len(calls) == 1


# Outside any quax trace -------------------------------------------------------------


def test_outside_a_quax_trace_materialises():
    got = jnp.asarray(Dense(a))
    assert isinstance(got, jax.Array)
    _check(got, a)
    _check(jnp.where(x0 > 1, Dense(a), x0), jnp.where(x0 > 1, a, x0))
    _check(jnp.stack([Zero((3,), jnp.float32), x0]), jnp.stack([jnp.zeros(3), x0]))
    # A JAX array's operator: the value defines none, so it is materialised.
    _check(x0 + Dense(a), x0 + a)


def test_outside_a_quax_trace_a_refusal_is_the_values_own():
    with pytest.raises(RefusedMaterialisation, match="never materialise"):
        jnp.where(x0 > 1, Refusing(a), x0)
    with pytest.raises(RefusedMaterialisation, match="never materialise"):
        _ = x0 * Refusing(a)


def test_outside_a_quax_trace_guarded_value_follows_its_policy():
    with pytest.raises(quax.MaterialisationError, match="Refusing to materialise"):
        jnp.concatenate([x0, Guarded(a)])
    with pytest.raises(quax.MaterialisationError, match="Refusing to materialise"):
        jnp.asarray(Guarded(a))
    allowed = Guarded(a, allow_materialise=True)
    _check(jnp.concatenate([x0, allowed]), jnp.concatenate([x0, a]))


class WithOperators(Dense):
    """A `Dense` whose type defines Python operators, as a family's does."""

    def __mul__(self, other: Any) -> Any:
        return quax.quaxify(operator.mul)(self, other)

    def __rmul__(self, other: Any) -> Any:
        return quax.quaxify(operator.mul)(other, self)

    def __lt__(self, other: Any) -> Any:
        return quax.quaxify(operator.lt)(self, other)

    def __gt__(self, other: Any) -> Any:
        return quax.quaxify(operator.gt)(self, other)


class _OperatorMixin:
    """Operators from a mixin that a value type lists after its `quax.ArrayValue`
    base, so that they come after `quax.Value` in its method resolution order (as
    unxt's `Quantity` gains its operators from quaxed's mixins)."""

    def __rmul__(self, other: Any) -> Any:
        return quax.quaxify(operator.mul)(other, self)

    def __gt__(self, other: Any) -> Any:
        return quax.quaxify(operator.gt)(self, other)


class WithMixinOperators(Dense, _OperatorMixin):
    pass


class RefusingWithMixinOperators(Refusing, _OperatorMixin):
    pass


@pytest.mark.parametrize(
    "cls", [WithOperators, WithMixinOperators, RefusingWithMixinOperators]
)
def test_a_jax_arrays_operator_defers_to_the_values_own(cls):
    # `jnp_array * value` asks the value for `__jax_array__` first; a type that
    # defines `__rmul__` (itself, or through a mixin after `quax.Value`) keeps it,
    # outside and inside a quax trace. A mixin's operator was not seen as the
    # type's own: the value was materialised and the result a plain array.
    out = x0 * cls(a)
    assert isinstance(out, cls)
    _check(out, x0 * a)
    out = quax.quaxify(lambda y: x0 * y)(cls(a))
    assert isinstance(out, cls)
    _check(out, x0 * a)
    # Mirrored comparisons defer to the mirrored method.
    out = x0 < cls(a)
    assert isinstance(out, jax.Array)
    _check(out, x0 < a)


def test_a_jax_arrays_comparison_materialises_beside_inherited_ones():
    # `object`'s and `eqx.Module`'s comparisons are not the type's own: the value
    # is materialised, and the comparison is elementwise.
    out = x0 == WithMixinOperators(a.at[1].set(x0[1]))
    assert isinstance(out, jax.Array)
    _check(out, jnp.array([False, True, False]))
    _check(x0 <= WithMixinOperators(a), x0 <= a)


def test_value_joins_through_a_transform_as_a_constant():
    # Built inside `jax.grad` inside the quaxified function, from constants: it is
    # a constant there, and joins the quax trace outside the transform.
    def f(x):
        g = jax.grad(lambda t: jnp.sum(jnp.where(t > 0, t * Refusing(a), 0.0)))
        return g(x)

    got = quax.quaxify(f)(Dense(x0))
    _check(got, jnp.where(x0 > 0, a, 0.0))


def test_value_built_from_a_transforms_tracers_says_what_to_do():
    # Built inside `jax.jvp` from its tracers: it cannot join the quax trace outside
    # the transform, so it is materialised, and a refusal says why.
    def f(x):
        return jax.jvp(lambda t: jnp.stack([Refusing(t), x]), (jnp.ones(3),), (a,))[1]

    with pytest.raises(RuntimeError, match=r"(?s)built inside a transform.*never"):
        quax.quaxify(f)(Dense(x0))
    f_allowed = lambda x: jax.jvp(
        lambda t: jnp.stack([Dense(t), x]), (jnp.ones(3),), (a,)
    )[1]
    _check(quax.quaxify(f_allowed)(Dense(x0)), jnp.stack([a, jnp.zeros(3)]))


def test_eqx_module_holding_value_built_inside():
    # An equinox module built inside the function holds a value; its method passes
    # the value to `jnp.concatenate`.
    class Pad(eqx.Module):
        pad: Any

        def __call__(self, x):
            return jnp.concatenate([self.pad, x, self.pad])

    got = quax.quaxify(lambda x: Pad(Refusing(a))(x))(Refusing(x0))
    assert isinstance(got, Refusing)
    _check(got, jnp.concatenate([a, x0, a]))
