"""A value that a `lax` function binds as it is (`lax.add(a, y)` with `y` a value
the quaxified function closes over, or builds), below a `jax.jit`, `jax.vmap` or
`jax.grad` inside the quaxified function: it joins the quax trace as it does for a
`jax.numpy` function (`jnp.add(a, y)`), so that its rules run, or its refusal to
materialise says what to do. Outside any quaxified function, it is materialised or
refuses with its own error, as before."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax

from .helpers import Dense, RefusedMaterialisation, Refusing, Wrapper


X = jnp.arange(6.0).reshape(2, 3) / 4.0
Y = jnp.linspace(-1.0, 1.0, 9).reshape(3, 3)


def _matmul(a: Any, b: Any) -> Any:
    """`a @ b` for `a` a matrix or (under `vmap`) a row."""
    return lax.dot_general(a, b, (((jnp.ndim(a) - 1,), (0,)), ((), ())))


# Binary `lax` functions of an array and a value, and `jax.numpy`'s for the same
# computation.
LAX_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lax.add,
    "mul": lambda a, b: lax.mul(b, a),
    "dot_general": _matmul,
}
JNP_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": jnp.add,
    "mul": lambda a, b: jnp.multiply(b, a),
    "dot_general": jnp.matmul,
}


def _operand(name: str, transform: str) -> jax.Array:
    """The dense array of the value for `LAX_OPS[name]` under `transform`: of the
    shape of its operand (`X`, or a row of it under `vmap`) for `add` and `mul`
    (`lax` does not broadcast); a matrix for `dot_general`."""
    if name == "dot_general":
        return Y
    return Y[0] if "vmap" in transform else Y[:2]


def _summed(g: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda a: g(a).sum()


# Each transform of a function of one array, alone and nested.
TRANSFORMS: dict[str, Callable[[Callable[[Any], Any]], Callable[[Any], Any]]] = {
    "jit": jax.jit,
    "vmap": jax.vmap,
    "grad": lambda g: jax.grad(_summed(g)),
    "jit-vmap": lambda g: jax.jit(jax.vmap(g)),
    "vmap-jit": lambda g: jax.vmap(jax.jit(g)),
    "grad-jit": lambda g: jax.grad(jax.jit(_summed(g))),
    "jit-grad": lambda g: jax.jit(jax.grad(_summed(g))),
    "vmap-grad": lambda g: jax.vmap(jax.grad(_summed(g))),
}
# Those whose output is the transformed function's (not a gradient).
KEEPS_OUTPUT = {"jit", "vmap", "jit-vmap", "vmap-jit"}


def _dense(out: Any) -> Any:
    return out.array if isinstance(out, Dense | Wrapper) else out


def _quaxified(transform: str, op: Callable[[Any, Any], Any], y: Any) -> Any:
    """`transform` of `a -> op(a, y)`, inside `quax.quaxify`, on `X`."""
    return quax.quaxify(lambda x: TRANSFORMS[transform](lambda a: op(a, y))(x))(X)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("name", LAX_OPS)
@pytest.mark.parametrize("cls", [Dense, Refusing, Wrapper])
def test_closed_over_value_runs_its_rule(cls: type, name: str, transform: str) -> None:
    # `Dense` may materialise: its rule keeping the wrapper, and no materialisation,
    # show that it ran. The others refuse: a result at all shows it.
    operand = _operand(name, transform)
    with quax.track_materialisation() as report:
        out = _quaxified(transform, LAX_OPS[name], cls(operand))
    assert report.total == 0, str(report)
    expected = TRANSFORMS[transform](lambda a: LAX_OPS[name](a, operand))(X)
    if transform in KEEPS_OUTPUT:
        assert type(out) is cls
    np.testing.assert_allclose(_dense(out), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("name", LAX_OPS)
def test_lax_as_jax_numpy(name: str, transform: str) -> None:
    # The same computation through `jax.numpy`, which meets the value through
    # `__jax_array__`, gives the same type and values.
    operand = _operand(name, transform)
    lax_out = _quaxified(transform, LAX_OPS[name], Wrapper(operand))
    jnp_out = _quaxified(transform, JNP_OPS[name], Wrapper(operand))
    assert type(lax_out) is type(jnp_out)
    np.testing.assert_allclose(_dense(lax_out), _dense(jnp_out), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("transform", ["jit", "vmap", "jit-vmap", "vmap-jit"])
def test_value_built_inside_the_transform_runs_its_rule(transform: str) -> None:
    # Built there from the transform's tracers: staged, and its rule runs where the
    # quax trace re-runs the staged function.
    out = quax.quaxify(
        lambda x: TRANSFORMS[transform](lambda a: lax.mul(Wrapper(a), 2.0))(x)
    )(X)
    assert type(out) is Wrapper
    np.testing.assert_allclose(out.array, 2.0 * X, rtol=1e-6)


@pytest.mark.parametrize("transform", ["grad", "jit-grad", "vmap-grad"])
def test_value_built_from_gradient_tracers_refuses_saying_what_to_do(
    transform: str,
) -> None:
    # Built from the tracers of a `grad` inside the quaxified function, it cannot
    # join the quax trace outside the `grad`, nor be staged in a `jit` or `vmap`
    # outside it: its refusal says why and what to do, and stays a `RuntimeError`
    # saying "Refusing to materialise".
    f = quax.quaxify(lambda x: TRANSFORMS[transform](lambda a: lax.sin(Wrapper(a)))(x))
    with pytest.raises(RuntimeError, match="Refusing to materialise") as info:
        f(X)
    message = str(info.value)
    assert "outside any quax trace" not in message
    assert "Build the value outside the transform" in message
    # Not a `TypeError`: `Primitive.bind` would replace it with its own message.
    assert not isinstance(info.value, TypeError)


@pytest.mark.parametrize("transform", ["grad", "jit-grad", "vmap-grad"])
def test_value_built_from_gradient_tracers_materialises(transform: str) -> None:
    # One that may materialise is, there: the derivative is plain JAX's.
    out = quax.quaxify(lambda x: TRANSFORMS[transform](lambda a: lax.sin(Dense(a)))(x))(
        X
    )
    expected = TRANSFORMS[transform](lax.sin)(X)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad"])
def test_value_built_inside_from_constants_runs_its_rule(transform: str) -> None:
    operand = _operand("add", transform)
    out = quax.quaxify(
        lambda x: TRANSFORMS[transform](lambda a: lax.add(a, Refusing(operand)))(x)
    )(X)
    expected = TRANSFORMS[transform](lambda a: lax.add(a, operand))(X)
    np.testing.assert_allclose(_dense(out), expected, rtol=1e-6)


def test_outside_quaxify_unchanged() -> None:
    # A `lax` function binds the value: materialised, or the value's own refusal
    # (`Primitive.bind` replaces a `TypeError` with its own message, which would
    # lose the refusal's), saying that it met JAX outside any quax trace.
    np.testing.assert_allclose(lax.add(X[0], Dense(Y[0])), X[0] + Y[0])
    with pytest.raises(RefusedMaterialisation, match="outside any quax trace"):
        lax.add(X[0], Refusing(Y[0]))
    with pytest.raises(RuntimeError, match="Refusing to materialise") as info:
        jax.jit(lambda a: lax.mul(a, Wrapper(Y[0])))(X[0])
    assert "outside any quax trace" in str(info.value)
    with pytest.raises(RuntimeError, match="outside any quax trace"):
        jax.vmap(lambda a: lax.add(a, Wrapper(Y[0])))(X)
    # A `jax.numpy` function asks for an array: a `TypeError` too (issue 45, 23).
    with pytest.raises(TypeError, match="Refusing to materialise") as info:
        jnp.add(X, Wrapper(Y[0]))
    assert isinstance(info.value, RuntimeError)
