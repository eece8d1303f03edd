"""`LoraArray`: the published constructor and example, its fields, the checks of
its inputs (a `ValueError` naming the argument; a rank above `min(n, m)` works and
warns), NaN in is NaN out, and the core's materialisation policy (the published
refusal text, `enable_materialise`, not linear in its leaves)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from lora_helpers import normal
from quax_lora import LoraArray


KEY = jr.key(0)


def test_seed_example():
    # `quax.examples` finds the installed families when it is imported: no
    # module file for pyright to read.
    import quax.examples.lora as lora  # pyright: ignore[reportMissingImports]

    key1, key2, key3 = jr.split(jr.PRNGKey(0), 3)
    linear = eqx.nn.Linear(10, 12, key=key1)
    vector = normal(key2, (10,))

    def run(model, x):
        return model(x)

    lora_weight = lora.LoraArray(linear.weight, rank=2, key=key3)
    lora_linear = eqx.tree_at(lambda lr: lr.weight, linear, lora_weight)
    out = quax.quaxify(run)(lora_linear, vector)
    lora_linear = lora.loraify(linear, rank=2, key=key3)

    assert lora is quax_lora
    assert out.shape == (12,)
    # `b` starts at zero: the adapted layer computes what the original did.
    np.testing.assert_allclose(out, linear(vector), rtol=1e-6, atol=1e-6)
    assert isinstance(lora_linear.weight, lora.LoraArray)
    np.testing.assert_array_equal(lora_linear.weight.w, linear.weight)
    np.testing.assert_array_equal(lora_linear.weight.b, jnp.zeros((2, 10)))


def test_constructor_fields():
    weight = jnp.ones((3, 5, 4))
    lora = quax_lora.LoraArray(weight, rank=2, scale=0.5, alpha=4.0, key=jr.PRNGKey(1))
    assert lora.shape == (3, 5, 4)
    assert lora.dtype == jnp.float32
    assert lora.w.shape == (3, 5, 4)
    assert lora.a.shape == (3, 5, 2)
    assert lora.b.shape == (3, 2, 4)
    assert lora.rank == 2
    assert lora.scaling == 2.0
    assert lora.batch_ndim == 1
    np.testing.assert_allclose(jnp.std(lora.a), 0.5, rtol=0.5)


@pytest.mark.parametrize(
    "weight, rank, match",
    [
        (jnp.ones(3), 1, "at least 2 axes"),
        (jnp.ones((3, 3)), 0, "rank >= 1"),
        (jnp.ones((3, 3), int), 1, "floating-point"),
    ],
)
def test_constructor_errors(weight, rank, match):
    with pytest.raises(ValueError, match=match):
        quax_lora.LoraArray(weight, rank=rank, key=jr.PRNGKey(0))


@pytest.mark.parametrize(
    "weight, kwargs, match",
    [
        (jnp.ones((4, 4)), {"rank": 0}, "integer rank >= 1, got 0"),
        (jnp.ones((4, 4)), {"rank": 2.5}, "integer rank >= 1, got 2.5"),
        (jnp.ones((4, 4)), {"rank": True}, "integer rank >= 1, got True"),
        (jnp.ones(4), {"rank": 1}, "at least 2 axes"),
        (jnp.ones((4, 4)), {"rank": 1, "batch_ndim": 1}, "batch_ndim=1"),
        (jnp.ones((4, 4), jnp.int32), {"rank": 1}, "floating-point weight"),
        (jnp.ones((4, 4)), {"rank": 2, "scale": 0.0}, r"finite scale > 0.*scale=0\.0"),
        (jnp.ones((4, 4)), {"rank": 2, "scale": -1.0}, "finite scale > 0"),
        (jnp.ones((4, 4)), {"rank": 2, "scale": float("nan")}, "finite scale > 0"),
        (jnp.ones((4, 4)), {"rank": 2, "alpha": 0.0}, r"finite alpha > 0.*alpha=0\.0"),
        (jnp.ones((4, 4)), {"rank": 2, "alpha": float("inf")}, "finite alpha > 0"),
        (
            jnp.ones((4, 4)),
            {"rank": 2, "stop_gradient": "no"},
            "stop_gradient=True or False, got stop_gradient='no'",
        ),
        (
            jnp.ones((4, 4)),
            {"rank": 2, "allow_materialise": None},
            "allow_materialise=True or False, got allow_materialise=None",
        ),
    ],
)
def test_constructor_rejects_nonsense(weight: Any, kwargs: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LoraArray(weight, key=KEY, **kwargs)


@pytest.mark.parametrize(
    "weight, kwargs, match",
    [
        (jnp.ones((4, 4)), {"rank": 11}, r"rank=11.*min\(4, 4\) = 4.*rank <= 4"),
        (jnp.ones((8, 3)), {"rank": 4}, r"8 x 3 matrices.*1 extra rank.*11 param"),
        (
            jnp.ones((4, 3, 3, 3)),
            {"rank": 5, "batch_ndim": 0},
            r"4 x 27 .*1 extra rank.*31 parameters.*rank <= 4",
        ),
        (jnp.ones((2, 5, 3)), {"rank": 4}, r"1 extra rank.*16 parameters.*rank <= 3"),
    ],
)
def test_a_rank_above_the_matrix_rank_warns_and_works(
    weight: Any, kwargs: Any, match: str
) -> None:
    # The published quax accepts a rank larger than min(n, m); so does quax-lora,
    # warning of what it costs.
    with pytest.warns(quax_lora.RankWarning, match=match):
        lora = LoraArray(weight, key=KEY, **kwargs)
    assert lora.rank == kwargs["rank"]
    assert issubclass(quax_lora.RankWarning, quax_lora.LoraWarning)
    assert issubclass(quax_lora.LoraWarning, UserWarning)


def test_a_rank_above_the_matrix_rank_computes_the_product() -> None:
    w = normal(jr.key(1), (4, 3))
    with pytest.warns(quax_lora.RankWarning):
        lora = LoraArray(w, rank=11, alpha=22.0, key=KEY)
    b = normal(jr.key(2), (11, 3))
    lora = eqx.tree_at(lambda x: x.b, lora, b)
    x = normal(jr.key(3), (3, 2))
    # Plain JAX, with the literal scaling 22 / 11 = 2.
    expected = w @ x + 2.0 * (lora.a @ (b @ x))
    got = quax.quaxify(lambda m, v: m @ v)(lora, x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_nan_in_is_nan_out() -> None:
    # A NaN in the weight, or in the input, is a NaN where the dense product has
    # one (dense: plain JAX on the summed weight).
    w = jnp.ones((3, 4)).at[1, 2].set(jnp.nan)
    lora = LoraArray(w, rank=2, key=KEY)
    lora = eqx.tree_at(lambda x: x.b, lora, jnp.full((2, 4), 0.5))
    x = jnp.arange(8.0).reshape(4, 2).at[0, 1].set(jnp.nan)
    dense = w + lora.a @ lora.b
    for got, want in [
        (quax.quaxify(lambda m, v: m @ v)(lora, x), dense @ x),
        (quax.quaxify(lambda v, m: v @ m.T)(x.T, lora), x.T @ dense.T),
    ]:
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.isnan(got).any() and not np.isnan(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_constructor_accepts_the_largest_rank() -> None:
    lora = LoraArray(jnp.ones((4, 3)), rank=3, key=KEY)
    assert lora.a.shape == (4, 3) and lora.b.shape == (3, 3)
    lora = LoraArray(jnp.ones((4, 4)), rank=np.int64(2), key=KEY)
    assert lora.rank == 2 and isinstance(lora.rank, int)


def test_constructor_rejects_a_lora_weight() -> None:
    lora = LoraArray(jnp.ones((4, 4)), rank=2, key=KEY)
    with pytest.raises(ValueError, match="plain array as its weight, got a LoraArray"):
        LoraArray(lora, rank=2, key=KEY)


# Refusing to materialise --------------------------------------------------------------


def _lora(allow: bool = False) -> LoraArray:
    lora = LoraArray(
        jnp.arange(12.0).reshape(4, 3),
        rank=2,
        alpha=1.0,
        allow_materialise=allow,
        key=KEY,
    )
    return eqx.tree_at(lambda lr: lr.b, lora, jnp.ones((2, 3)))


def test_refusal_is_a_runtime_error_with_the_published_text() -> None:
    # The published quax's text is "Refusing to materialise `LoraArray` with
    # `allow_materialise=False`."; the core's policy gives it, and every family's
    # refusal is a `quax.MaterialisationError`.
    assert issubclass(quax_lora.LoraMaterialisationError, RuntimeError)
    assert issubclass(quax_lora.LoraMaterialisationError, quax.MaterialisationError)
    with pytest.raises(
        RuntimeError, match=r"Refusing to materialise `LoraArray` for primitive `sin`"
    ):
        quax.quaxify(jnp.sin)(_lora())
    with pytest.raises(
        RuntimeError,
        match=r"^Refusing to materialise `LoraArray` with `allow_materialise=False`",
    ):
        _lora().materialise()


def test_refusal_inside_relu_keeps_the_contract() -> None:
    with pytest.raises(RuntimeError, match="Refusing to materialise"):
        quax.quaxify(jax.nn.relu)(_lora())


def test_enable_materialise_returns_an_allowing_copy() -> None:
    lora = _lora()
    allowed = lora.enable_materialise()
    assert allowed.allow_materialise and not lora.allow_materialise
    assert allowed.w is lora.w and allowed.a is lora.a and allowed.b is lora.b
    assert isinstance(lora.w, jax.Array)  # not a value (a quantised weight)
    # w + 0.5 * a @ b, written out (alpha 1, rank 2).
    expected = lora.w + 0.5 * (lora.a @ lora.b)
    np.testing.assert_allclose(allowed.materialise(), expected, rtol=1e-6)
    np.testing.assert_allclose(
        quax.quaxify(jnp.sin)(allowed), jnp.sin(expected), rtol=1e-6
    )
    assert not allowed.enable_materialise(False).allow_materialise


def test_lora_is_not_linear_in_its_leaves() -> None:
    assert LoraArray.linear_in_leaves is False
