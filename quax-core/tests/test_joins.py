"""Joins beyond a plain array and a value.

- The `quax.Value.join` hook: loop carries, branch outputs and linear-solve
  right-hand sides that keep their type but change a static field join through the
  type, without materialising (`Flagged` refuses to).
- A linear solve (`jnp.linalg.solve`, `cg`) whose right-hand side is a value the
  solve's rules do not keep: it is solved on its dense array, or refused with a
  `JoinError` naming the types and the way out.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import pytest
import quax
from jax import lax
from jaxtyping import Array, ArrayLike
from quax.zero import Zero

from .helpers import RefusedMaterialisation, Refusing, Scaled


class Flagged(quax.ArrayValue):
    """An array with a static promise `exact`: `sin` gives it, every other
    primitive drops it. Two sides join with the AND of their promises."""

    array: Array
    exact: bool = eqx.field(static=True, default=False)

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> Array:
        raise RefusedMaterialisation("Flagged values never materialise")

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        arrays = [v.array if isinstance(v, Flagged) else v for v in values]
        out = primitive.bind(*arrays, **params)
        if primitive.multiple_results:
            return [Flagged(o) for o in out]
        return Flagged(out) if jnp.issubdtype(out.dtype, jnp.inexact) else out

    @classmethod
    def join(cls, value: quax.Value, other: quax.Value) -> "Flagged | None":
        if not isinstance(value, Flagged) or not isinstance(other, Flagged):
            return None
        return Flagged(value.array, value.exact and other.exact)


@quax.register(lax.sin_p)
def _(x: Flagged, **params: Any) -> Flagged:
    return Flagged(lax.sin_p.bind(x.array, **params), exact=True)


class Unjoinable(Flagged):
    """A `Flagged` whose type declines to join."""

    @classmethod
    def join(cls, value: quax.Value, other: quax.Value) -> None:
        del value, other


class Reshaping(Flagged):
    """A `Flagged` whose join (wrongly) changes the array's shape."""

    @classmethod
    def join(cls, value: quax.Value, other: quax.Value) -> "Reshaping":
        del other
        assert isinstance(value, Flagged)
        return Reshaping(value.array[:1])


x = jnp.array([0.5, 1.0, 2.0, 3.0])

LOOPS = {
    "fori": lambda a: lax.fori_loop(0, 3, lambda i, c: jnp.sin(c), a),
    "fori_drops": lambda a: lax.fori_loop(0, 3, lambda i, c: c * 0.5, a),
    "while": lambda a: lax.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, a)
    )[1],
    "scan": lambda a: lax.scan(lambda c, xi: (jnp.sin(c) * xi, xi), a, x)[0],
    "cond": lambda a: lax.cond(
        jnp.sum(a.array if isinstance(a, Flagged) else a) > 0,
        jnp.sin,
        lambda b: b * 2.0,
        a,
    ),
}
# Whether each program's body keeps the promise (its output's is the AND of that
# and the start's).
KEEPS = {"fori": True, "fori_drops": False, "while": True, "scan": False}


def _dense_program(name: str):
    program = LOOPS[name]
    if name == "cond":
        return lambda a: lax.cond(jnp.sum(a) > 0, jnp.sin, lambda b: b * 2.0, a)
    return program


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("name", LOOPS)
def test_join_keeps_the_value(name, exact):
    program = LOOPS[name]
    if name == "cond":
        program = lambda a: lax.cond(jnp.sum(x) > 0, jnp.sin, lambda b: b * 2.0, a)
    out = quax.quaxify(program)(Flagged(x, exact))
    assert isinstance(out, Flagged) and out.exact == (exact and KEEPS.get(name, False))
    assert jnp.allclose(out.array, _dense_program(name)(x), atol=1e-6)


@pytest.mark.parametrize("name", ["fori", "scan"])
def test_join_under_jit_vmap_and_grad(name):
    program = LOOPS[name]
    dense = _dense_program(name)
    run = lambda a: quax.quaxify(program)(Flagged(a, True)).array
    assert jnp.allclose(jax.jit(run)(x), dense(x), atol=1e-6)
    xs = jnp.stack([x, x + 1])
    assert jnp.allclose(jax.vmap(run)(xs), jax.vmap(dense)(xs), atol=1e-6)
    loss = lambda f: lambda a: jnp.sum(f(a) ** 2)
    assert jnp.allclose(jax.grad(loss(run))(x), jax.grad(loss(dense))(x), rtol=1e-5)


def test_cond_on_a_runtime_predicate_joins_the_branches():
    f = lambda p, a: lax.cond(p, jnp.sin, lambda b: b * 2.0, a)
    for p in (True, False):
        out = jax.jit(quax.quaxify(f))(p, Flagged(x, True))
        assert isinstance(out, Flagged) and not out.exact
        assert jnp.allclose(out.array, f(p, x), atol=1e-6)
    # Branches that agree keep their promise.
    same = lambda p, a: lax.cond(p, jnp.sin, lambda b: jnp.sin(b * 2.0), a)
    out = jax.jit(quax.quaxify(same))(False, Flagged(x))
    assert isinstance(out, Flagged) and out.exact


def test_linear_solve_right_hand_side_joins():
    solve = lambda b: lax.custom_linear_solve(
        lambda v: v * 2.0, b, lambda mv, r: r / 2.0, symmetric=True
    )
    out = quax.quaxify(solve)(Flagged(x, True))
    assert isinstance(out, Flagged) and not out.exact
    assert jnp.allclose(out.array, x / 2.0)


def test_a_type_that_declines_does_not_join():
    fori = LOOPS["fori"]
    with pytest.raises(quax.JoinError, match=r"loop carry `c` of a .*Unjoinable"):
        quax.quaxify(fori)(Unjoinable(x))


def test_a_join_that_changes_the_array_is_refused():
    with pytest.raises(TypeError, match=r"`Reshaping.join` returned .*keep the array"):
        quax.quaxify(LOOPS["fori"])(Reshaping(x))


class DiagMatrix(quax.ArrayValue):
    """A user's diagonal matrix with the rules `jnp.linalg.solve` reaches for a plain
    right-hand side (`A @ x`, `lu`, `triangular_solve`); it never materialises."""

    diag: Array

    def aval(self) -> jax.core.ShapedArray:
        n = self.diag.shape[-1]
        return jax.core.ShapedArray((n, n), self.diag.dtype)

    def materialise(self) -> Array:
        raise RefusedMaterialisation("DiagMatrix never materialises")


def _rows(d: Array, ndim: int) -> Array:
    return d.reshape(-1, *([1] * (ndim - 1)))


@quax.register(lax.dot_general_p)
def _(a: DiagMatrix, x: ArrayLike, *, dimension_numbers: Any, **params: Any) -> Array:
    assert dimension_numbers == (((1,), (0,)), ((), ()))
    x = jnp.asarray(x)
    return _rows(a.diag, x.ndim) * x


@quax.register(lax.linalg.lu_p)
def _(a: DiagMatrix, **params: Any) -> list[Any]:
    iota = jnp.arange(a.diag.shape[-1], dtype=jnp.int32)
    return [a, iota, iota]


@quax.register(lax.linalg.triangular_solve_p)
def _(a: DiagMatrix, b: ArrayLike, *, unit_diagonal: bool, **params: Any) -> Array:
    assert params["left_side"]
    b = jnp.asarray(b)
    return b if unit_diagonal else b / _rows(a.diag, b.ndim)


d = jnp.array([2.0, 4.0, 5.0])
v = jnp.array([1.0, -2.0, 3.0])
RIGHT_HAND_SIDES = {
    "scaled": (lambda: Scaled(v, jnp.array(2.0)), 2 * v),
    "zero": (lambda: Zero((3,), jnp.float32), jnp.zeros(3)),
}


@pytest.mark.parametrize("rhs", RIGHT_HAND_SIDES)
@pytest.mark.parametrize("matrix", ["value", "plain"])
def test_solve_with_a_value_right_hand_side(rhs, matrix):
    make, b = RIGHT_HAND_SIDES[rhs]
    a = DiagMatrix(d) if matrix == "value" else jnp.diag(d)
    expected = jnp.linalg.solve(jnp.diag(d), b)
    out = quax.quaxify(jnp.linalg.solve)(a, make())
    assert jnp.allclose(out, expected, atol=1e-6)
    out = jax.jit(quax.quaxify(jnp.linalg.solve))(a, make())
    assert jnp.allclose(out, expected, atol=1e-6)


def test_solve_with_a_value_right_hand_side_grad():
    loss = lambda dd, b: jnp.sum(jnp.linalg.solve(jnp.diag(dd), b) ** 2)
    got = jax.grad(
        lambda dd: jnp.sum(
            quax.quaxify(jnp.linalg.solve)(DiagMatrix(dd), Scaled(v, jnp.array(2.0)))
            ** 2
        )
    )(d)
    assert jnp.allclose(got, jax.grad(loss)(d, 2 * v), rtol=1e-5)


@pytest.mark.parametrize("rhs", RIGHT_HAND_SIDES)
def test_cg_with_a_value_right_hand_side(rhs):
    make, b = RIGHT_HAND_SIDES[rhs]
    cg = lambda a, r: jax.scipy.sparse.linalg.cg(lambda x: a @ x, r)[0]
    out = quax.quaxify(cg)(DiagMatrix(d), make())
    assert jnp.allclose(out, b / d, atol=1e-5)


def test_solve_on_a_right_hand_side_that_refuses_names_it():
    with pytest.raises(
        quax.JoinError,
        match=r"(?s)right-hand side of a custom_linear_solve .* is a Refusing "
        r"float32\[3\], and the solve failed on it .*DiagMatrix never "
        r"materialises.*Refusing values never materialise.*Pass a plain right-hand "
        r"side",
    ) as info:
        quax.quaxify(jnp.linalg.solve)(DiagMatrix(d), Refusing(v))
    assert isinstance(info.value, RuntimeError)  # a refusal, as the contract says
