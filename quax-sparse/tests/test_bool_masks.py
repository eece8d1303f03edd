"""Bool sparse arrays (masks): entries add by logical or, as JAX adds bools, through
`todense`, `sum_duplicates`, products, conversions and `where`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax.experimental import sparse as jsparse
from quax_sparse import BCOO, SparseMaterialisationError


EYE = np.eye(3, dtype=bool)


# A bool mask with position (0, 0) stored twice: bool entries add up as JAX adds
# bools (logical or), so the dense mask is `[[T, F, F], [F, F, F], [F, F, T]]`.
MASK = np.array([[True, False, False], [False, False, False], [False, False, True]])


def _bool_masks() -> dict[str, tuple[BCOO, np.ndarray]]:
    twice = BCOO(
        jnp.array([True, True, True, False]),
        jnp.array([[0, 0], [0, 0], [2, 2], [1, 1]]),
        (3, 3),
    )
    return {
        "eye": (BCOO.fromdense(jnp.eye(3, dtype=bool), nse=3), EYE),
        "padded": (BCOO.fromdense(jnp.eye(3, dtype=bool), nse=5), EYE),
        "twice": (twice, MASK),
    }


@pytest.mark.parametrize("name", ["eye", "padded", "twice"])
def test_bool_mask_todense(name):
    m, want = _bool_masks()[name]
    assert m.dtype == jnp.bool_
    for got in (m.todense(), jax.jit(lambda m: m.todense())(m)):
        assert got.dtype == jnp.bool_
        np.testing.assert_array_equal(got, want)
    merged = m.sum_duplicates()
    assert merged.dtype == jnp.bool_
    np.testing.assert_array_equal(merged.todense(), want)


@pytest.mark.parametrize("name", ["eye", "padded", "twice"])
def test_bool_mask_operations_against_dense(name):
    m, want = _bool_masks()[name]
    v = np.array([1.0, 10.0, 100.0], np.float32)
    w = np.array([True, False, True])
    x = np.arange(9.0, dtype=np.float32).reshape(3, 3) + 1
    # Each reference is the same function on the dense bool mask, in plain JAX.
    for fn in [
        lambda a, v, w, x: a @ v,
        lambda a, v, w, x: a @ w,
        lambda a, v, w, x: a.astype(jnp.float32).sum(),
        lambda a, v, w, x: (a * x).sum(0),
        lambda a, v, w, x: a.sum(),
    ]:
        got = jax.jit(quax.quaxify(fn))(m, v, w, x)
        np.testing.assert_array_equal(got, fn(jnp.asarray(want), v, w, x))
    mul = jax.jit(quax.quaxify(lambda a, w: a * w))(m, w)
    assert isinstance(mul, BCOO) and mul.dtype == jnp.bool_
    np.testing.assert_array_equal(mul.todense(), want * w)
    as_float = jax.jit(quax.quaxify(lambda a: a.astype(jnp.float32)))(m)
    np.testing.assert_array_equal(as_float.todense(), want.astype(np.float32))


def test_bool_mask_matmul_as_jax_experimental_sparse():
    # jsparse stores a bool `fromdense` as int32 entries; its products agree.
    m, _ = _bool_masks()["padded"]
    j = jsparse.BCOO.fromdense(jnp.eye(3, dtype=bool), nse=5)
    v = jnp.array([1.0, 10.0, 100.0])
    np.testing.assert_array_equal(quax.quaxify(lambda a, v: a @ v)(m, v), j @ v)


def test_bool_mask_in_where():
    # `jnp.where(mask, x, 0)` with a sparse mask keeps the mask's pattern (an
    # entry stored twice counts once); against a nonzero it is refused, naming
    # `select_n` and the way out, and allowed it is the dense `where`.
    m, want = _bool_masks()["twice"]
    x = np.arange(9.0, dtype=np.float32).reshape(3, 3) + 1
    where = quax.quaxify(lambda m, x: jnp.where(m, x, 0.0))
    out = where(m, x)
    assert isinstance(out, BCOO)
    np.testing.assert_array_equal(out.todense(), np.where(want, x, 0.0))
    other = quax.quaxify(lambda m, x: jnp.where(m, x, 1.0))
    with pytest.raises(
        SparseMaterialisationError, match=r"select_n.*allow_materialise"
    ):
        other(m, x)
    np.testing.assert_array_equal(
        other(m.enable_materialise(), x), np.where(want, x, 1.0)
    )
