"""The three tutorials of the published quax (custom rules, default rules,
redispatch), written the way they write rules: without `**params` where they do,
against JAX 0.10's primitives (which bind `mul` with `out_dtype`, `sin` with
`accuracy`, ...). References are plain floats and plain JAX.

The tutorials' "mistakes" that quax-core deliberately answers differently (a value
built inside the quaxified function) are tested with that feature, not here.
"""

import functools as ft
from collections.abc import Sequence
from typing import Any, cast

import equinox as eqx
import jax
import jax.core
import jax.extend
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest
import quax
from jaxtyping import Array, ArrayLike


# Custom rules: a unitful type --------------------------------------------------------


def _units(x: str | dict[str, int]) -> dict[str, int]:
    return {x: 1} if isinstance(x, str) else dict(x)


class Unitful(quax.ArrayValue):
    array: ArrayLike
    units: dict[str, int] = eqx.field(static=True, converter=_units)

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> Any:
        raise ValueError("Refusing to materialise Unitful array.")


def _times(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


@quax.register(jax.lax.add_p)
def _(x: Unitful, y: Unitful):
    if x.units != y.units:
        raise ValueError(f"Cannot add units {x.units} and {y.units}.")
    return Unitful(x.array + y.array, x.units)


@quax.register(jax.lax.mul_p)
def _(x: Unitful, y: Unitful):
    return Unitful(x.array * y.array, _times(x.units, y.units))


@quax.register(jax.lax.mul_p)
def _(x: ArrayLike, y: Unitful):
    return Unitful(x * y.array, y.units)


@quax.register(jax.lax.mul_p)
def _(x: Unitful, y: ArrayLike):
    return Unitful(x.array * y, x.units)


@quax.register(jax.lax.integer_pow_p)
def _(x: Unitful, *, y: int):
    return Unitful(x.array**y, {k: v * y for k, v in x.units.items()})


def _energy(mass: Any, velocity: Any, height: Any, g: Any) -> Any:
    return 0.5 * mass * velocity**2 + g * mass * height


@pytest.mark.parametrize("jit", [False, True])
def test_custom_rules_tutorial(jit: bool) -> None:
    m = Unitful(jnp.array(3.0), "kg")
    v = Unitful(jnp.array(2.2), {"m": 1, "s": -1})
    h = Unitful(jnp.array(1.0), "m")
    g = Unitful(jnp.array(9.81), {"m": 1, "s": -2})
    fn = quax.quaxify(_energy)
    energy = (jax.jit(fn) if jit else fn)(m, v, h, g)
    assert energy.units == {"kg": 1, "m": 2, "s": -2}
    np.testing.assert_allclose(energy.array, 0.5 * 3.0 * 2.2**2 + 9.81 * 3.0, rtol=1e-6)


def test_custom_rules_tutorial_mistakes() -> None:
    m = Unitful(jnp.array(3.0), "kg")
    v = Unitful(jnp.array(2.2), {"m": 1, "s": -1})
    add = lambda x, y: x + y
    with pytest.raises(ValueError, match="Cannot add units"):
        quax.quaxify(add)(m, v)
    # No rule for Unitful + array: quax materialises, which the type refuses.
    with pytest.raises(ValueError, match="Refusing to materialise Unitful array"):
        quax.quaxify(add)(m, jnp.array(0.0))


# Default rules: a tag that follows the backward pass ----------------------------------


class BackwardTag(quax.ArrayValue):
    array: ArrayLike

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    @staticmethod
    def default(
        primitive: jax.extend.core.Primitive,
        values: Sequence[ArrayLike | quax.Value],
        params: dict,
    ) -> Any:
        raw = []
        for value in values:
            if isinstance(value, BackwardTag):
                raw.append(value.array)
            elif isinstance(value, quax.Value):
                raise ValueError("BackwardTag meets another quax type.")
            else:
                raw.append(value)
        out = primitive.bind(*raw, **params)
        if primitive.multiple_results:
            return [BackwardTag(x) for x in out]
        return BackwardTag(out)

    def materialise(self) -> Any:
        raise ValueError("Refusing to materialise and remove `BackwardTag`")


tagged_matmuls: list[str] = []


@quax.register(jax.lax.dot_general_p)
def _(lhs: BackwardTag, rhs: ArrayLike, **params):
    tagged_matmuls.append("lhs")
    return BackwardTag(jax.lax.dot_general_p.bind(lhs.array, rhs, **params))


@quax.register(jax.lax.dot_general_p)
def _(lhs: ArrayLike, rhs: BackwardTag, **params):
    tagged_matmuls.append("rhs")
    return BackwardTag(jax.lax.dot_general_p.bind(lhs, rhs.array, **params))


@quax.register(jax.lax.dot_general_p)
def _(lhs: BackwardTag, rhs: BackwardTag, **params):
    tagged_matmuls.append("both")
    return BackwardTag(jax.lax.dot_general_p.bind(lhs.array, rhs.array, **params))


def _tagged_value_and_grad(fn: Any) -> Any:
    @ft.wraps(fn)
    def wrapped(x: Any) -> Any:
        out, fn_vjp = jax.vjp(fn, x)
        (grad,) = quax.quaxify(fn_vjp)(BackwardTag(jnp.ones_like(out)))
        untag = lambda y: y.array if isinstance(y, BackwardTag) else y
        grad = jtu.tree_map(untag, grad, is_leaf=lambda y: isinstance(y, BackwardTag))
        return out, grad

    return wrapped


def test_default_rules_tutorial() -> None:
    mlp = eqx.nn.MLP(in_size=2, out_size="scalar", width_size=8, depth=3, key=jr.key(0))
    x = jnp.array([3.0, 4.0])
    tagged_matmuls.clear()
    out, grad = _tagged_value_and_grad(mlp)(x)
    expected_out, expected_grad = jax.value_and_grad(mlp)(x)
    np.testing.assert_allclose(out, expected_out, rtol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)
    # The backward pass multiplies the tagged cotangent by each of the 4 weights.
    assert tagged_matmuls == ["lhs"] * 4


# Redispatch: a rank-1 LoRA meets a one-hot sparse vector ------------------------------


class Rank1Lora(quax.ArrayValue):
    w: Array
    a: Array
    b: Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.w), jnp.result_type(self.w))

    def materialise(self) -> Any:
        raise ValueError("Refusing to materialise `Rank1Lora`")


def _rank1_matvec(w: Array, a: Array, b: Array, y: Any) -> Any:
    return w @ y + a * jnp.dot(b, y)


@quax.register(jax.lax.dot_general_p)
def _(x: Rank1Lora, y: ArrayLike | quax.ArrayValue, *, dimension_numbers, **params):
    if dimension_numbers != (((1,), (0,)), ((), ())) or jnp.ndim(y) != 1:
        raise NotImplementedError(f"Only matrix-vector products: {dimension_numbers}")
    return quax.quaxify(_rank1_matvec)(x.w, x.a, x.b, y)


class _OneHotBase(quax.ArrayValue):
    """A vector that is zero except for `value` at `index`."""

    index: ArrayLike
    value: ArrayLike
    length: int = eqx.field(static=True)

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray((self.length,), jnp.result_type(self.value))

    def materialise(self) -> Any:
        raise ValueError("Refusing to materialise `OneHot`")


class OneHot(_OneHotBase):
    pass


@quax.register(jax.lax.dot_general_p)
def _(x: Array, y: OneHot, *, dimension_numbers, **params):
    if jnp.ndim(x) == 1:
        return x[y.index] * y.value
    return x[:, y.index] * y.value


matmul = lambda a, b: a @ b


def test_redispatch_tutorial() -> None:
    w, a, b = jnp.ones((3, 4)), jnp.ones(3), jnp.ones(4)
    lora = Rank1Lora(w, a, b)
    y = jnp.arange(4.0)
    # (w + a b^T) y, computed by hand: each row is 0+1+2+3 twice.
    np.testing.assert_array_equal(quax.quaxify(matmul)(lora, y), [12.0, 12.0, 12.0])
    one_hot = OneHot(index=2, value=5.0, length=4)
    # y = 5 e_2: (w + a b^T) y = 5 + 5 in every row.
    np.testing.assert_array_equal(
        quax.quaxify(matmul)(lora, one_hot), [10.0, 10.0, 10.0]
    )


class AmbiguousOneHot(_OneHotBase):
    pass


@quax.register(jax.lax.dot_general_p)
def _(
    x: ArrayLike | quax.ArrayValue, y: AmbiguousOneHot, *, dimension_numbers, **params
):
    # The annotation makes the rules ambiguous, as in the tutorial; `x` arrives as an
    # array (the inner quaxify's tracer), which indexes.
    x = cast(Array, x)
    if jnp.ndim(x) == 1:
        return x[y.index] * y.value
    return x[:, y.index] * y.value


def test_redispatch_tutorial_ambiguity_and_nested_quaxify() -> None:
    lora = Rank1Lora(jnp.ones((3, 4)), jnp.ones(3), jnp.ones(4))
    one_hot = AmbiguousOneHot(index=2, value=5.0, length=4)
    with pytest.raises(TypeError, match=r"Ambiguous quax rules.*dot_general"):
        quax.quaxify(matmul)(lora, one_hot)
    # The tutorial's way out: quaxify for the LoRA first, then for the vector.
    is_lora = lambda x: isinstance(x, Rank1Lora)
    is_one_hot = lambda x: isinstance(x, AmbiguousOneHot)
    nested = quax.quaxify(
        quax.quaxify(matmul, filter_spec=is_lora), filter_spec=is_one_hot
    )
    np.testing.assert_array_equal(nested(lora, one_hot), [10.0, 10.0, 10.0])
