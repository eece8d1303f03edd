"""A `LoraArray` rebuilt without its constructor (`eqx.tree_at`, `jax.tree.map`)
with a field of the wrong shape or dtype is refused by `quax.quaxify` before any
rule reads it: a factor `a` of shape `(1, rank)` used to broadcast silently into a
wrong product."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora


W = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4) / 10
X = jnp.arange(1.0, 5.0, dtype=jnp.float32)


def _lora(**kwargs) -> quax_lora.LoraArray:
    lora = quax_lora.LoraArray(W, rank=2, key=jr.key(0), **kwargs)
    # A trained `b` (it starts at zero), so that the update shows in every result.
    return eqx.tree_at(lambda v: v.b, lora, jnp.arange(8.0).reshape(2, 4) / 7)


def _dense(lora: quax_lora.LoraArray) -> np.ndarray:
    w, a, b = map(np.asarray, (lora.w, lora.a, lora.b))
    return w + lora.scaling * a @ b


SWAPS = {
    "a (1, rank)": (lambda v: v.a, jnp.ones((1, 2))),
    "a (n, n)": (lambda v: v.a, jnp.ones((3, 3))),
    "a 3-d": (lambda v: v.a, jnp.ones((1, 3, 2))),
    "b (rank, 1)": (lambda v: v.b, jnp.ones((2, 1))),
    "w (1, m)": (lambda v: v.w, jnp.ones((1, 4))),
    # An adapter in another floating dtype than `w` is accepted (mixed precision,
    # test_mixed_precision.py), but `a` and `b` must share it, and be floating,
    # and real with a real `w`.
    "a float16, b float32": (lambda v: v.a, jnp.ones((3, 2), jnp.float16)),
    "a, b int32": (
        lambda v: (v.a, v.b),
        (jnp.ones((3, 2), jnp.int32), jnp.ones((2, 4), jnp.int32)),
    ),
    "a, b bool": (
        lambda v: (v.a, v.b),
        (jnp.ones((3, 2), bool), jnp.ones((2, 4), bool)),
    ),
    "a, b complex64": (
        lambda v: (v.a, v.b),
        (jnp.ones((3, 2), jnp.complex64), jnp.ones((2, 4), jnp.complex64)),
    ),
}


@pytest.mark.parametrize("swap", SWAPS, ids=list(SWAPS))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_inconsistent_field_is_refused(swap, jit) -> None:
    where, leaf = SWAPS[swap]
    bad = eqx.tree_at(where, _lora(), leaf)
    for program in (lambda v: v @ X, lambda v: v.enable_materialise().materialise()):
        f = quax.quaxify(program)
        f = jax.jit(f) if jit else f
        with pytest.raises(ValueError) as info:
            f(bad)
        message = str(info.value)
        assert "`LoraArray` whose fields break its own checks" in message
        assert "LoraArray needs `" in message and "constructor" in message


def test_dora_without_magnitude_is_refused() -> None:
    dora = _lora(variant="dora")
    bad = eqx.tree_at(lambda v: v.magnitude, dora, jnp.ones(1))
    with pytest.raises(ValueError, match="`magnitude` of shape \\(3,\\)"):
        quax.quaxify(lambda v: v @ X)(bad)


@pytest.mark.parametrize("variant", ["lora", "dora"])
def test_consistent_updates_still_run(variant) -> None:
    lora = _lora(variant=variant)
    # An optimiser's update: every leaf changed, shapes and dtypes kept.
    updated = jax.tree.map(lambda x: x * 1.5 if x.dtype == jnp.float32 else x, lora)
    out = jax.jit(quax.quaxify(lambda v: v @ X))(updated)
    dense = quax.quaxify(lambda v: v.enable_materialise().materialise())(updated)
    np.testing.assert_allclose(out, np.asarray(dense) @ np.asarray(X), rtol=1e-5)
    if variant == "lora":
        np.testing.assert_allclose(out, _dense(updated) @ np.asarray(X), rtol=1e-5)


def test_stacked_adapters_and_vmap_pass() -> None:
    models = [_lora(), eqx.tree_at(lambda v: v.b, _lora(), jnp.ones((2, 4)))]
    stacked = quax_lora.stack_adapters(models)
    for i, model in enumerate(models):
        out = quax.quaxify(lambda v: v @ X)(quax_lora.select_adapter(stacked, i))
        np.testing.assert_allclose(out, _dense(model) @ np.asarray(X), rtol=1e-5)
    batch = jax.tree.map(lambda *xs: jnp.stack(xs), *models)
    out = jax.vmap(quax.quaxify(lambda v: v @ X))(batch)
    want = np.stack([_dense(m) @ np.asarray(X) for m in models])
    np.testing.assert_allclose(out, want, rtol=1e-5)
