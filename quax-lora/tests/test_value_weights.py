"""A `LoraArray` over a base weight that is itself a `quax.ArrayValue` (as QLoRA's
quantised base is), with a local value type: `Base`, a dense wrapper whose rules
keep it wrapped and record that they ran, and which refuses to materialise unless
allowed. The references are written out as `w + s * a @ b` in plain JAX."""

from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing as qt
import quax_lora
from jax import lax
from jaxtyping import Array, ArrayLike


RAN: list[str] = []  # the primitives `Base`'s own rules ran for


class Base(quax.ArrayValue):
    """A dense array in a wrapper; `allow` says whether it may materialise."""

    array: Array
    allow: bool = eqx.field(static=True, default=False)

    def aval(self) -> jax.core.ShapedArray:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        if not self.allow:
            raise RuntimeError(
                "Refusing to materialise Base: pass allow=True (or call "
                ".enable_materialise())."
            )
        return self.array

    def enable_materialise(self, allow: bool = True) -> "Base":
        return Base(self.array, allow)


def _keep(primitive: Any) -> None:
    @quax.register(primitive)
    def _(x: Base, **params: Any) -> Base:
        RAN.append(primitive.name)
        return Base(primitive.bind(x.array, **params), x.allow)


for _p in (lax.transpose_p, lax.neg_p, lax.convert_element_type_p):
    _keep(_p)


@quax.register(lax.mul_p)
def _(x: Base, y: ArrayLike, **params: Any) -> Base:
    RAN.append("mul")
    return Base(lax.mul_p.bind(x.array, y, **params), x.allow)


@quax.register(lax.dot_general_p)
def _(lhs: Base, rhs: ArrayLike, **params: Any) -> Array:
    RAN.append("dot_general")
    return lax.dot_general_p.bind(lhs.array, rhs, **params)


@quax.register(lax.dot_general_p)
def _(lhs: ArrayLike, rhs: Base, **params: Any) -> Array:
    RAN.append("dot_general")
    return lax.dot_general_p.bind(lhs, rhs.array, **params)


class Opaque(quax.Value):
    """A value that is not an array value."""

    array: Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        return self.array


TOL: qt.Tolerance = {"rtol": 1e-5, "atol": 1e-5}  # float32, with some cancellation
W = np.arange(30, dtype=np.float32).reshape(6, 5) / 10 - 1


def _lora(allow: bool = False, alpha: float = 4.0) -> quax_lora.LoraArray:
    with quax.track_materialisation() as report:
        lora = quax_lora.LoraArray(
            Base(jnp.asarray(W), allow), rank=2, alpha=alpha, key=jr.key(0)
        )
    assert not report, str(report)
    b = jnp.asarray(np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5))
    return eqx.tree_at(lambda y: y.b, lora, b)


def _dense(lora: quax_lora.LoraArray) -> np.ndarray:
    # w + s * a @ b with s = alpha / rank = 4 / 2, written out.
    return W + 2.0 * np.asarray(lora.a) @ np.asarray(lora.b)


def test_construction_reads_the_value_and_keeps_it():
    lora = _lora()
    assert isinstance(lora.w, Base) and lora.w.array is not None
    assert lora.shape == (6, 5) and lora.dtype == jnp.float32
    assert lora.a.shape == (6, 2) and lora.b.shape == (2, 5)
    assert lora.a.dtype == jnp.float32


def test_product_runs_the_base_rule_and_never_materialises():
    lora = _lora()  # `Base` refuses: any materialisation would raise
    x = jnp.asarray(np.linspace(-2, 2, 18, dtype=np.float32).reshape(3, 6))
    RAN.clear()
    with quax.track_materialisation() as report:
        out = jax.jit(quax.quaxify(lambda w, x: x @ w))(lora, x)
    assert not report, str(report)
    assert "dot_general" in RAN
    np.testing.assert_allclose(out, np.asarray(x) @ _dense(lora), **TOL)


def test_structural_rules_go_through_the_base_rules():
    lora = _lora()
    x = jnp.asarray(np.linspace(-2, 2, 20, dtype=np.float32).reshape(5, 4))
    y = jnp.asarray(np.linspace(-1, 1, 18, dtype=np.float32).reshape(6, 3))
    RAN.clear()
    fn = lambda w, x, y: (
        (-w) @ x,
        (2.5 * w) @ x,
        w.T @ y,
        w.astype(jnp.float16) @ x.astype(jnp.float16),
    )
    neg, scaled, transposed, half = quax.quaxify(fn)(lora, x, y)
    assert {"neg", "mul", "transpose", "convert_element_type"} <= set(RAN)
    dense = _dense(lora)
    np.testing.assert_allclose(neg, -dense @ np.asarray(x), **TOL)
    np.testing.assert_allclose(scaled, 2.5 * dense @ np.asarray(x), **TOL)
    np.testing.assert_allclose(transposed, dense.T @ np.asarray(y), **TOL)
    np.testing.assert_allclose(half, dense @ np.asarray(x), rtol=2e-2, atol=2e-2)


def test_matches_dense_through_the_conformance_kit():
    # The kit densifies its reference with `enable_materialise()`: the base allows
    # it, and the kit checks that the quaxified run materialised nothing.
    lora = _lora(allow=True)
    x = jnp.asarray(np.linspace(-2, 2, 18, dtype=np.float32).reshape(3, 6))
    qt.assert_matches_dense(lambda w, x: x @ (-w), lora, x, vmap=False)


def test_a_base_without_a_rule_refuses_through_its_own_contract():
    lora = _lora()  # `Base` has no `rev` rule and refuses to materialise
    x = jnp.ones((5,), jnp.float32)
    with pytest.raises(RuntimeError, match="Refusing to materialise Base"):
        quax.quaxify(lambda w, x: jnp.flip(w, 0) @ x)(lora, x)


def test_loraify_count_and_merge_over_value_weights():
    mlp = eqx.nn.MLP(4, 3, 6, depth=1, key=jr.key(1))
    based = jax.tree.map(
        lambda x: Base(x) if eqx.is_array(x) and x.ndim == 2 else x, mlp
    )
    model = quax_lora.loraify(based, rank=2, key=jr.key(2))
    plain = quax_lora.loraify(mlp, rank=2, key=jr.key(2))
    for layer, ref in zip(model.layers, plain.layers, strict=True):
        assert isinstance(layer.weight.w, Base)
        np.testing.assert_array_equal(layer.weight.a, ref.weight.a)
    x = jnp.linspace(-1, 1, 4)
    # `b` starts at zero: the model computes what the plain MLP did.
    np.testing.assert_allclose(quax.quaxify(model)(x), mlp(x), **TOL)
    # The base weights count by their shapes, frozen: as for the plain weights.
    count = quax_lora.count_parameters(model)
    assert count == quax_lora.count_parameters(plain)
    adapters = (6 * 2 + 2 * 4) + (3 * 2 + 2 * 6)
    assert count.trainable == adapters
    assert count.total == (6 * 4 + 6) + (3 * 6 + 3) + adapters
    # A base value that refuses to be densified cannot be merged.
    with pytest.raises(quax_lora.LoraMaterialisationError, match="cannot be densified"):
        quax_lora.merge(model)
    lora = _lora(allow=True)
    merged = quax_lora.merge({"w": lora})["w"]
    np.testing.assert_allclose(merged, _dense(lora), **TOL)


def test_count_of_an_unadapted_value_and_a_trainable_base():
    frozen = {"base": Base(jnp.zeros((3, 4))), "bias": jnp.zeros(3)}
    count = quax_lora.count_parameters(frozen)
    assert (count.trainable, count.total) == (0, 15)
    lora = quax_lora.LoraArray(
        Base(jnp.asarray(W)), rank=1, stop_gradient=False, key=jr.key(0)
    )
    count = quax_lora.count_parameters(lora)
    assert (count.trainable, count.total) == (30 + 6 + 5, 30 + 6 + 5)


def test_a_value_that_is_not_an_array_value_is_refused():
    with pytest.raises(ValueError, match=r"got a Opaque, a quax\.Value without"):
        quax_lora.LoraArray(Opaque(jnp.asarray(W)), rank=2, key=jr.key(0))
