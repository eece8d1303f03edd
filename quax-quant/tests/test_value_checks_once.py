"""The checks of a `QuantisedArray` that read array values (`act_scale` positive
and finite, `input_order` a permutation, integer `values` wider than int8 within
[-128, 127]) read each JAX array once: `quax.quaxify` re-runs `__check_init__`
each time it takes a value in, and an eager call would otherwise copy `act_scale`
to the host, sort `input_order` and reduce the whole `values` on every call. An
array rebuilt into the value (`eqx.tree_at`, an optimiser's update) is another
array and is read again, so no check is weaker: each refusal below is of a value
whose other arrays had passed before."""

import dataclasses

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_quant as qq
from quax_quant._value import _passed_value_checks


W = jnp.linspace(-1.0, 1.0, 48).reshape(8, 6)
X = jnp.linspace(-2.0, 1.5, 24).reshape(3, 8)
ORDER = jnp.array([5, 3, 1, 0, 2, 4])


def product(w, x):
    return x @ w


def _calibrated() -> qq.QuantisedArray:
    w = qq.quantise(W, bits=8, axis=1, matmul="int8")
    return dataclasses.replace(w, act_scale=jnp.float32(0.02))


def _ordered() -> qq.QuantisedArray:
    w = qq.quantise(W, bits=8, axis=1)
    return dataclasses.replace(w, input_order=ORDER)


def _wide() -> qq.QuantisedArray:
    w = qq.quantise(W, bits=8, axis=1)
    return dataclasses.replace(w, values=w.values.astype(jnp.int32))


CASES = {
    "act_scale": (
        _calibrated,
        "act_scale",
        lambda w: w.act_scale,
        jnp.float32(0.0),
        r"act_scale .* must be a positive finite",
    ),
    "input_order": (
        _ordered,
        "order",
        lambda w: w.input_order,
        jnp.array([5, 3, 1, 0, 2, 2]),
        r"input_order must be a permutation",
    ),
    "values": (
        _wide,
        "values",
        lambda w: w.values,
        None,
        r"values must lie in \[-128, 127\]",
    ),
}


def _reference(w: qq.QuantisedArray) -> np.ndarray:
    return np.asarray(X @ w.dequantise())


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_array_is_read_once_and_a_rebuilt_one_again(case) -> None:
    make, check, where, bad_leaf, message = CASES[case]
    w = make()
    # Read at construction, and remembered by identity.
    assert (check, where(w)) in _passed_value_checks
    f = quax.quaxify(product)
    for _ in range(3):
        np.testing.assert_allclose(f(w, X), _reference(w), atol=0.05)
    # The same value rebuilt with another array in that field is read again at
    # boxing, though its constructor never ran and the other arrays passed.
    if bad_leaf is None:
        bad_leaf = where(w).at[0, 0].set(300)
    bad = eqx.tree_at(where, w, bad_leaf)
    assert (check, where(bad)) not in _passed_value_checks
    with pytest.raises(ValueError, match=message):
        f(bad, X)
    # A rebuilt array with passing values is read once, then remembered.
    good = eqx.tree_at(where, w, where(w) + 0)
    np.testing.assert_allclose(f(good, X), _reference(w), atol=0.05)
    assert (check, where(good)) in _passed_value_checks


def test_numpy_arrays_are_read_every_time() -> None:
    # A NumPy array can change in place: it is never remembered.
    act = np.array(0.02, np.float32)
    w = dataclasses.replace(_calibrated(), act_scale=act)  # pyright: ignore[reportArgumentType]
    f = quax.quaxify(product)
    f(w, X)
    assert ("act_scale", act) not in _passed_value_checks
    act[...] = 0.0
    with pytest.raises(ValueError, match=r"act_scale .* must be a positive finite"):
        f(w, X)
