"""The refusals: the core's materialisation policy on `BCOO` and `CSR`, a refusal
for every operation without a sparse rule (naming the primitive and the way out),
never a dense array by accident, and the policy on broadcasting a sparse operand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from quax_sparse import BCOO, CSR, SparseMaterialisationError, fromdense
from sparse_helpers import DENSE, assert_close, random_sparse


def test_materialise_refuses_with_published_message():
    x = fromdense(DENSE, nse=4)
    with pytest.raises(RuntimeError, match="Refusing to materialise `BCOO`"):
        x.materialise()
    with pytest.raises(SparseMaterialisationError, match="allow_materialise=True"):
        x.materialise()
    assert_close(x.enable_materialise().materialise(), DENSE)


@pytest.mark.parametrize("kind", ["BCOO", "CSR"])
def test_the_core_materialisation_policy(kind):
    # BCOO and CSR follow quax.GuardedValue: a refusal any family's `except` catches,
    # naming the type, the primitive, what densifying costs, and the way out. (A CSR
    # acts as its BCOO form, so the refusal is its BCOO form's.)
    x = (fromdense if kind == "BCOO" else CSR.fromdense)(DENSE, nse=4)
    assert isinstance(x, quax.GuardedValue)
    assert issubclass(SparseMaterialisationError, quax.MaterialisationError)
    message = (
        r"Refusing to materialise `BCOO` for primitive `exp` on input types \(BCOO\)"
        r".*\(shape \(3, 4\), dtype float32\) would hold all 12 elements of this "
        r"sparse array, which stores 4 entries\. Pass `allow_materialise=True` to "
        r"`BCOO` or call `\.enable_materialise\(\)`.* Or call `\.todense\(\)`"
    )
    with pytest.raises(quax.MaterialisationError, match=message):
        quax.quaxify(jnp.exp)(x)
    with pytest.raises(
        SparseMaterialisationError, match=f"Refusing to materialise `{kind}`"
    ):
        x.materialise()
    allowed = x.enable_materialise(allow=True)
    assert allowed.allow_materialise and not x.allow_materialise
    assert_close(quax.quaxify(jnp.exp)(allowed), np.exp(DENSE))
    assert_close(allowed.materialise(), DENSE)
    assert not allowed.enable_materialise(allow=False).allow_materialise


@pytest.mark.parametrize(
    ("fn", "primitive"),
    [
        (jnp.exp, "exp"),
        (jnp.cos, "cos"),
        (lambda x: x + 1.0, None),
        (lambda x: x**0, "integer_pow"),
        (lambda x: 1.0 / x, "div"),
        (lambda x: jnp.maximum(x, x), "max"),
        (lambda x: jnp.max(x), "reduce_max"),
        (lambda x: jnp.cumsum(x, 0), "cumsum"),
        (lambda x: jnp.broadcast_to(x[:, :1], (4, 6)), "broadcast_in_dim"),
    ],
)
def test_refusals_name_the_primitive(fn, primitive):
    rng = np.random.default_rng(3)
    dense, x = random_sparse(rng, (4, 6), 0.3)
    if primitive is None:  # sparse + dense is dense, at the dense operand's cost
        assert_close(quax.quaxify(fn)(x), fn(dense))
        return
    with pytest.raises(
        SparseMaterialisationError, match=f"Refusing to materialise.*`{primitive}`"
    ):
        quax.quaxify(fn)(x)
    with pytest.raises(RuntimeError, match="allow_materialise=True"):
        jax.jit(quax.quaxify(fn))(x)
    # Allowed: the dense computation.
    with quax.track_materialisation() as report:
        out = quax.quaxify(fn)(x.enable_materialise())
    assert report
    assert_close(out, fn(jnp.asarray(dense)))


def test_large_matrix_is_never_densified():
    n = 10**6  # a dense f32 matrix would need 4 TB
    idx = jnp.stack([jnp.arange(n), jnp.arange(n)], -1)
    x = BCOO(jnp.full(n, 2.0), idx, (n, n))
    v = jnp.ones(n)
    out = jax.jit(quax.quaxify(lambda a, v: jnp.tanh(2 * a).T @ v + a.sum(0)))(x, v)
    assert out.shape == (n,)
    np.testing.assert_allclose(out[:3], np.tanh(4.0) + 2.0, rtol=1e-6)
    with pytest.raises(
        SparseMaterialisationError, match=r"`exp`.*shape \(1000000, 1000000\)"
    ):
        jax.eval_shape(quax.quaxify(jnp.exp), x)
    # Its row-major positions would overflow int32: `reshape` is refused.
    with pytest.raises(SparseMaterialisationError, match="`reshape`"):
        jax.eval_shape(quax.quaxify(lambda a: a.reshape(-1)), x)


def test_broadcasting_a_sparse_operand_is_refused_with_the_way_out():
    # The published quax's own tests add a (2, 5, 1, 4) BCOO to a (3, 2, 5, 1, 4)
    # dense array and BCOO; quax-sparse refuses to stretch a sparse operand, and the
    # refusal says how to get the sum.
    rng = np.random.default_rng(0)
    dense, x = random_sparse(rng, (2, 5, 1, 4), 0.4, n_batch=1)
    dense3, x3 = random_sparse(rng, (3, 2, 5, 1, 4), 0.4, n_batch=2)
    y = rng.normal(size=(3, 2, 5, 1, 4)).astype(np.float32)
    add = quax.quaxify(lambda a, b: a + b)
    way_out = r"jnp\.broadcast_to\(x, \(3, 2, 5, 1, 4\)\)` keeps a sparse `x` sparse"
    for other in (y, x3):
        with pytest.raises(
            SparseMaterialisationError, match=r"primitive `add`.*" + way_out
        ):
            add(x, other)
        with pytest.raises(SparseMaterialisationError, match=way_out):
            add(other, x)
    # The way out: broadcast explicitly (sparse, new leading axes), then add.
    add_broadcast = jax.jit(quax.quaxify(lambda a, b: jnp.broadcast_to(a, b.shape) + b))
    assert_close(add_broadcast(x, y), dense + y)
    both = add_broadcast(x, x3)
    assert isinstance(both, BCOO)
    assert_close(both, dense + dense3)
    # Or allow materialising: the dense sum.
    assert_close(add(x.enable_materialise(), y), dense + y)
    # Stretching an axis of size 1 in place is refused the same way, in `mul` too.
    _, row = random_sparse(rng, (1, 4), 0.5)
    stretched = r"`mul`.*shape \(1, 4\) to \(5, 4\)"
    with pytest.raises(SparseMaterialisationError, match=stretched):
        quax.quaxify(lambda a, b: a * b)(row, np.ones((5, 4), np.float32))
