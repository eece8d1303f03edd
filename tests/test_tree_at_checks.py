"""Values of every family rebuilt without their constructors (`eqx.tree_at`) with a
leaf of the wrong shape or dtype are refused by `quax.quaxify` before any rule
reads them: the core re-runs each type's `__check_init__` (and those of the values
and Equinox modules held in its fields) where it boxes a value from outside. The
structured, named and quantised checks already ran at construction; these cases
ran through quaxify unchecked before (silently, for the double-quantised scale)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
import quax_named
import quax_quant
import quax_structured as st


def _quantised() -> quax_quant.QuantisedArray:
    w = jr.normal(jr.key(0), (8, 512))
    return quax_quant.quantise(w, bits=4, group_size=64, double_quant=True)


def _qlora() -> quax_lora.LoraArray:
    return quax_lora.LoraArray(_quantised(), rank=2, key=jr.key(1))


CASES = {
    "quant scale codes int16": (
        _quantised,
        lambda v: v.scale.codes,
        lambda v: v.scale.codes.astype(jnp.int16),
        "QuantisedScale",
    ),
    "quant block_scale (2,)": (
        _quantised,
        lambda v: v.scale.block_scale,
        lambda v: jnp.ones(2, jnp.float32),
        "QuantisedScale",
    ),
    "qlora weight's block_scale (2,)": (
        _qlora,
        lambda v: v.w.scale.block_scale,
        lambda v: jnp.ones(2, jnp.float32),
        "QuantisedScale",
    ),
    "named array of one axis fewer": (
        lambda: quax_named.NamedArray(jnp.ones((3, 4)), ("i", "j")),
        lambda v: v.array,
        lambda v: jnp.ones(4),
        "NamedArray",
    ),
    "tridiagonal lower of length n": (
        lambda: st.TridiagonalMatrix(jnp.ones(3), 2 * jnp.ones(4), jnp.ones(3)),
        lambda v: v.lower_diag,
        lambda v: jnp.ones(4),
        "TridiagonalMatrix",
    ),
    "low rank v (1, r)": (
        lambda: st.LowRank(jnp.ones((4, 2)), jnp.ones((4, 2))),
        lambda v: v.v,
        lambda v: jnp.ones((1, 2)),
        "LowRank",
    ),
    "diagonal scalar": (
        lambda: st.Diagonal(jnp.arange(4.0)),
        lambda v: v.diag,
        lambda v: jnp.ones(()),
        "Diagonal",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_inconsistent_leaf_is_refused(case) -> None:
    make, where, leaf, name = CASES[case]
    good = make()
    bad = eqx.tree_at(where, good, leaf(good))
    for f in (quax.quaxify(jnp.sum), jax.jit(quax.quaxify(lambda v: v * 2.0))):
        with pytest.raises(ValueError) as info:
            f(bad)
        message = str(info.value)
        assert f"`{name}` whose fields break its own checks" in message
        assert "constructor" in message


def test_consistent_update_of_a_qlora_weight_still_runs() -> None:
    lora = _qlora()
    lora = eqx.tree_at(lambda v: v.b, lora, jnp.ones_like(lora.b) / 64)
    x = jnp.linspace(-1.0, 1.0, 512)
    dense = np.asarray(lora.w.dequantise()) + lora.scaling * np.asarray(lora.a @ lora.b)
    out = jax.jit(quax.quaxify(lambda v: v @ x))(lora)
    np.testing.assert_allclose(out, dense @ np.asarray(x), rtol=2e-4, atol=2e-4)
