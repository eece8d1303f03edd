"""A value of a family built inside a quaxified function, passed to the `jax.numpy`
functions that take several arrays (`Value.__jax_array__`): units, named arrays and
structured matrices, each compared with the plain computation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax_structured as qs
from quax_named import NamedArray
from quax_units import Quantity, UnitError, ustrip


x0 = jnp.array([1.0, 2.0, 3.0])
a = jnp.array([1.5, 0.5, 2.5])
b = jnp.array([0.25, 0.75, 1.25])

# Each case: `f(x, V)`, with `V(array)` the value built inside the function.
CASES = {
    "where": lambda x, V: jnp.where(x > V(a), x, V(b)),
    "clip": lambda x, V: jnp.clip(x, V(b), V(a)),
    "stack": lambda x, V: jnp.stack([x, V(a)]),
    "concatenate": lambda x, V: jnp.concatenate([x, V(a), V(b)]),
    "full_like": lambda x, V: jnp.full_like(x, V(jnp.array(4.0))),
    "select": lambda x, V: jnp.select([x > V(a), x < V(b)], [x, V(a)], V(b)),
    "maximum": lambda x, V: jnp.maximum(x, V(a)),
    "minimum": lambda x, V: jnp.minimum(V(a), x),
    "arctan2": lambda x, V: jnp.arctan2(x, V(a)),
    "vstack": lambda x, V: jnp.vstack([x, V(a)]),
    "append": lambda x, V: jnp.append(x, V(b)),
    "array": lambda x, V: jnp.array([x, V(a)]),
    "dot": lambda x, V: jnp.dot(x, V(a)),
    "greater_equal": lambda x, V: jnp.greater_equal(x, V(a)),
}


@pytest.mark.parametrize("case", CASES)
def test_quantity_built_inside(case):
    f = CASES[case]
    want = f(x0, lambda v: v)
    got = quax.quaxify(lambda x: f(x, lambda v: Quantity(v, "cm")))(Quantity(x0, "cm"))
    if jnp.issubdtype(jnp.result_type(want), jnp.bool_):
        np.testing.assert_array_equal(got, want)
    elif case == "arctan2":
        # An angle: dimensionless.
        np.testing.assert_allclose(ustrip("", got), want, rtol=1e-6)
    elif case == "dot":
        np.testing.assert_allclose(ustrip("cm2", got), want, rtol=1e-6)
    else:
        np.testing.assert_allclose(ustrip("cm", got), want, rtol=1e-6)


def test_quantity_built_inside_in_other_units_converts():
    # The program, with the threshold and fill in other units of length.
    f = lambda x: jnp.where(x > Quantity(1.5, "m"), x, Quantity(0.0, "km"))
    got = quax.quaxify(f)(Quantity(jnp.array([1.0, 2.0]), "m"))
    np.testing.assert_allclose(ustrip("m", got), [0.0, 2.0])
    jitted = jax.jit(quax.quaxify(f))(Quantity(jnp.array([1.0, 2.0]), "m"))
    np.testing.assert_allclose(ustrip("m", jitted), [0.0, 2.0])
    lo, hi = Quantity(120.0, "cm"), Quantity(1.8, "m")
    clip = quax.quaxify(lambda x: jnp.clip(x, lo, hi))
    np.testing.assert_allclose(
        ustrip("m", clip(Quantity(jnp.array([1.0, 2.0]), "m"))), [1.2, 1.8], rtol=1e-6
    )


def test_quantity_built_inside_checks_units():
    f = lambda x: jnp.where(x > Quantity(1.5, "m"), x, Quantity(0.0, "s"))
    with pytest.raises(UnitError):
        quax.quaxify(f)(Quantity(jnp.array([1.0, 2.0]), "m"))
    with pytest.raises(UnitError):
        quax.quaxify(lambda x: jnp.stack([x, Quantity(1.0, "kg")]))(
            Quantity(jnp.array(1.0), "m")
        )


def test_plain_array_times_quantity_outside_keeps_units():
    # A JAX array's operator asks the quantity for `__jax_array__` first; the
    # quantity defines `__rmul__`, so Python calls it, as before.
    out = jnp.array([1.0, 2.0]) * Quantity(jnp.array([3.0, 4.0]), "m")
    assert isinstance(out, Quantity)
    np.testing.assert_allclose(ustrip("m", out), [3.0, 8.0])


def test_quantity_outside_a_quax_trace_refuses_to_materialise():
    with pytest.raises(quax.MaterialisationError, match="Refusing to materialise"):
        jnp.where(x0 > 1.5, Quantity(a, "m"), x0)


def _named(array):
    return NamedArray(array, ("feature",) if jnp.ndim(array) else ())


# The operators (`x > V(a)`, where Python calls `NamedArray.__lt__` with the traced
# `x`) and the same comparisons as functions.
_SHARED = ("where", "select", "clip", "stack", "concatenate", "full_like", "maximum")
NAMED_CASES = {
    **{k: CASES[k] for k in _SHARED},
    "where_greater": lambda x, V: jnp.where(jnp.greater(x, V(a)), x, V(b)),
    "select_less": lambda x, V: jnp.select(
        [jnp.greater(x, V(a)), jnp.less(x, V(b))], [x, V(a)], V(b)
    ),
}


@pytest.mark.parametrize("case", NAMED_CASES)
def test_named_array_built_inside(case):
    f = NAMED_CASES[case]
    want = f(x0, lambda v: v)
    got = quax.quaxify(lambda x: f(x, _named))(_named(x0))
    if case == "full_like":
        # `full_like(x, fill)` takes only `x`'s shape: the fill (a named scalar with
        # no axes) gives a plain array.
        np.testing.assert_allclose(got, want, rtol=1e-6)
        return
    assert isinstance(got, NamedArray)
    np.testing.assert_allclose(got.array, want, rtol=1e-6)


def test_named_array_built_inside_keeps_names():
    x = NamedArray(jnp.arange(6.0).reshape(2, 3), ("batch", "feature"))
    fill = NamedArray(jnp.full((2, 3), -1.0), ("batch", "feature"))
    got = quax.quaxify(lambda x: jnp.where(jnp.greater(x, 2.0), x, fill))(x)
    assert got.names == ("batch", "feature")
    np.testing.assert_allclose(got.array, jnp.where(x.array > 2.0, x.array, -1.0))


def test_structured_operator_with_a_value_built_inside():
    # The program: `M + ScaledIdentity` where `ScaledIdentity` defines no
    # operator: the tracer's `__add__` lifts it.
    d = jnp.arange(1.0, 5.0)
    got = quax.quaxify(lambda M: M + qs.ScaledIdentity(0.1, 4))(qs.Diagonal(d))
    assert isinstance(got, qs.Diagonal)
    want = jnp.diag(d) + 0.1 * jnp.eye(4)
    np.testing.assert_allclose(got.enable_materialise().materialise(), want, rtol=1e-6)
    v = jnp.arange(4.0)
    got = quax.quaxify(lambda M: (M @ qs.ScaledIdentity(2.0, 4)) @ v)(qs.Diagonal(d))
    np.testing.assert_allclose(got, jnp.diag(d) @ (2.0 * v), rtol=1e-6)


@pytest.mark.parametrize("transform", ["eager", "vmap", "jit_vmap"])
def test_structure_built_inside_from_plain_arguments(transform):
    # The program: no value among the arguments, the structure built from
    # them inside; its O(n r^2) solve, not a refusal to materialise. Against NumPy's
    # dense solve, in float64 where the backend has it natively; on a TPU, whose
    # XLA has no float64 LU ("Only F32 and C64 types are implemented in
    # LuDecomposition", seen on a TPU v5e), in float32 at float32's tolerance, its
    # matrix products at full float32 precision (a TPU's default rounds them
    # through bfloat16).
    dtype = jnp.float32 if jax.default_backend() == "tpu" else jnp.float64
    rng = np.random.default_rng(0)
    d = rng.uniform(1.0, 2.0, (3, 5))
    u = rng.normal(size=(3, 5, 2))
    rhs = rng.normal(size=(3, 5))
    want = np.stack(
        [np.linalg.solve(np.diag(d[i]) + u[i] @ u[i].T, rhs[i]) for i in range(3)]
    )
    solve = quax.quaxify(
        lambda d, u, b: jnp.linalg.solve(qs.LowRankPlusDiagonal(d, u), b)
    )
    with jax.enable_x64(True), jax.default_matmul_precision("highest"):
        args = [jnp.asarray(x, dtype) for x in (d, u, rhs)]
        if transform == "eager":
            got = jnp.stack([solve(*(x[i] for x in args)) for i in range(3)])
        elif transform == "vmap":
            got = jax.vmap(solve)(*args)
        else:
            got = jax.jit(jax.vmap(solve))(*args)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, **quax.testing.tolerance(dtype))
