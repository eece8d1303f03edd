"""Tests written for mutants of `quax/_dispatch/_known.py` that a sampled run of
`scripts/mutation.sh dispatch-known` let through (see `docs/mutation.md`), each
failing with its mutant planted: `known_scaled_constant` on a traced array of one
element that is not 0-dimensional, and under differentiation where the primal is all
zeros, and on a chain of products within its depth bound; and a concrete array
passed through two nested `jit`s to a rule that asks for its value."""

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jaxtyping import ArrayLike

from .test_known_scaled_constant import EYE, _rebuilt


@pytest.mark.parametrize("shape", [(1,), (1, 1), (1, 1, 1)])
def test_a_traced_number_of_any_rank_has_a_0_dimensional_scale(shape) -> None:
    """A traced array of one element is itself times one: its scale is the number,
    0-dimensional whatever the array's rank (`_rebuilt` checks that), and the
    constant is ones of its shape (mutant `_number` 3 kept the array's shape)."""
    s = np.full(shape, 0.7, np.float32)
    out = jax.jit(_rebuilt)(s)
    assert out.shape == shape
    np.testing.assert_array_equal(out, s)
    # Through a product with a constant: `(s * 3) * ones`.
    times = jax.jit(lambda s: _rebuilt(s * np.float32(3.0)))(s)
    np.testing.assert_allclose(times, 3 * s, rtol=1e-6)


def test_derivatives_where_the_primal_is_all_zeros() -> None:
    """At `s = 0` the primal `(2 * s) * EYE` is all zeros and only the tangent shows
    the constant: the scale is then `(0, tangent scale)` times the tangent's
    constant, and derivatives through it are plain JAX's (mutant
    `_ScaledReader.pair` 39 dropped the zero primal)."""
    loss = lambda x: jnp.sum(jnp.sin(x) * jnp.arange(9.0).reshape(3, 3))
    make = lambda s: (2 * s) * EYE
    plain = lambda s: loss(make(s))
    read = lambda s: loss(_rebuilt(make(s)))
    s = np.float32(0.0)
    want = jax.grad(plain)(s)
    assert want != 0  # cos(0) times the diagonal of arange(9): 2 * (0 + 4 + 8)
    np.testing.assert_allclose(want, 24.0, rtol=1e-6)
    for fn in (
        jax.grad(read),
        jax.jit(jax.grad(read)),
        lambda s: jax.jvp(read, (s,), (np.float32(1.0),))[1],
    ):
        np.testing.assert_allclose(fn(s), want, rtol=1e-6)
    value, tangent = jax.jvp(read, (s,), (np.float32(1.0),))
    assert value == 0.0 and tangent == want


def test_a_reshape_with_dimensions_keeps_their_permutation() -> None:
    """`lax.reshape(s * C, (3, 8), dimensions=(1, 0, 2))` transposes `C` by that
    permutation before reshaping it, not by reversing its axes (mutant `_reshaped`
    8 reversed them)."""
    c = np.arange(24, dtype=np.float32).reshape(2, 3, 4) + 1
    program = lambda s: lax.reshape(s * c, (3, 8), dimensions=(1, 0, 2))
    s = np.float32(0.5)
    out = jax.jit(lambda s: _rebuilt(program(s)))(s)
    want = np.transpose(0.5 * c, (1, 0, 2)).reshape(3, 8)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(program(s), want)


def test_a_constant_over_a_traced_number_has_its_reciprocal_as_scale() -> None:
    """`C / t`: the scale is `1 / t` (mutant `_scale_op` 7 gave `t`)."""
    c = np.array([[2.0, -4.0], [1.0, 8.0]], np.float32)
    t = np.float32(4.0)
    scale, constant = jax.jit(lambda t: quax.known_scaled_constant(c / t))(t)
    np.testing.assert_allclose(scale * constant, c / 4.0, rtol=1e-6)
    out = jax.jit(lambda t: _rebuilt(c / t))(t)
    np.testing.assert_allclose(out, c / 4.0, rtol=1e-6)


def test_the_zero_primal_keeps_the_dtype_with_float64_on() -> None:
    """With float64 enabled, the zero primal of a float32 `(2 s) I` at `s = 0` is
    float32, as the program's (mutant `_ScaledReader.pair` 24 made it float64)."""
    make = lambda s: (2 * s) * EYE
    with jax.enable_x64(True):
        s = np.float32(0.0)
        primal, tangent = jax.jvp(lambda s: _rebuilt(make(s)), (s,), (np.float32(1.0),))
        assert primal.dtype == tangent.dtype == np.float32
        np.testing.assert_array_equal(primal, np.zeros((3, 3), np.float32))
        np.testing.assert_array_equal(tangent, 2 * EYE)


class Added(quax.ArrayValue):
    """An array whose `add` rule says, in `added`, whether it knew the plain operand
    to be zeros (and kept the array) or not."""

    array: jax.Array
    added: str = eqx.field(static=True, default="")

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> jax.Array:
        return self.array


@quax.register(lax.add_p)
def _(x: Added, y: ArrayLike) -> Added:
    known = quax.known_constant(y, 1 << 20)
    if known is not None and not np.any(known):
        return Added(x.array, "known zeros")
    return Added(x.array + y, "unknown")


_inner = jax.jit(lambda p, c: p + c)
_outer = jax.jit(lambda p, c: _inner(p, c))


@pytest.mark.parametrize("caching", [True, False])
def test_a_concrete_array_through_two_nested_jits_is_known_to_the_rule(
    caching: bool,
) -> None:
    """A concrete array above `MAX_CONSTANT_SIZE` passed to a nested `jit` goes in
    by its aval, and a rule that asks `known_constant` for it gets its value as
    without the `jit` (the body runs again with it as a constant). Passed on to a
    second `jit` inside the first, it still stands in for the first call's
    argument: the rule in the inner body knows it as without any `jit` (mutant
    `stand_in_token` 2 gave no token to the inner call, and the rule was told
    nothing)."""
    p = Added(jnp.arange(100, dtype=jnp.float32))
    c = np.zeros(100, np.float32)
    with quax.caching(caching):
        for f in (lambda p, c: p + c, _inner, _outer):
            for _ in range(3):  # the later calls from the caches
                out = quax.quaxify(f)(p, c)
                assert out.added == "known zeros"
                np.testing.assert_array_equal(out.array, np.arange(100.0))
        # Traced by an enclosing `jit`, the array is not known, with or without the
        # nested ones.
        for f in (lambda p, c: p + c, _outer):
            out = jax.jit(quax.quaxify(f))(p, c)
            assert out.added == "unknown"
            np.testing.assert_array_equal(out.array, np.arange(100.0))


def test_a_chain_of_products_within_the_depth_bound_is_read() -> None:
    """`known_scaled_constant` looks through at most `_INVARIANCE_MAX_DEPTH` (32)
    equations in one chain, one per product: `s * EYE` times 2 twenty times more,
    22 equations deep with the broadcast of `s`, is read, and its scale times its
    constant is the program's value (mutant `_ScaledReader.read` 37 counted two
    equations for each product, and gave up on a chain half as long); a chain of 40
    is not read."""

    def chain(s, n):
        x = s * EYE
        for _ in range(n):
            x = x * np.float32(2.0)
        return x

    s = np.float32(0.75)
    out = jax.jit(lambda s: _rebuilt(chain(s, 20)))(s)
    np.testing.assert_array_equal(out, 0.75 * 2.0**20 * EYE)
    # Past the bound, not read.
    seen = []
    jax.jit(lambda s: seen.append(quax.known_scaled_constant(chain(s, 40))))(s)
    assert seen == [None]


def test_a_tangent_nearly_proportional_to_its_primal_is_not_read() -> None:
    """Under `jax.jvp`, the primal's and the tangent's constants must be
    proportional, element by element to the dtype's rounding: `[1, 1e-9]` is not
    `1` times `[1, 0]`, and a reading as that would give a tangent without its
    second element (mutant `_ScaledReader.pair` 75 compared them with NumPy's
    default absolute tolerance, `1e-8`, and read it so). Proportional, it is read,
    and the tangent is plain JAX's."""
    read: list[bool] = []

    def ask(x: jax.Array) -> jax.Array:
        read.append(quax.known_scaled_constant(x) is not None)
        return x

    primal = np.array([1.0, 0.0], np.float32)
    near = np.array([1.0, 1e-9], np.float32)
    assert near[1] != 0
    out, tangent = jax.jvp(ask, (primal,), (near,))
    assert read == [False]
    np.testing.assert_array_equal(tangent, near)
    out, tangent = jax.jvp(_rebuilt, (primal,), (2 * primal,))
    np.testing.assert_array_equal(out, primal)
    np.testing.assert_array_equal(tangent, [2.0, 0.0])


def test_scale_invariance_is_read_through_float64_equations() -> None:
    """With float64 on, a traced float64 array times zeros is shown to be all zeros
    and NaNs, as a product with such an array is one (the docstring's words), and
    so is a float32 one (mutant `known_scale_invariant` 42 read the equations of
    every dtype but float64, and told `False` for the first)."""
    seen: list[bool] = []

    def ask(x: jax.Array, y: jax.Array) -> None:
        seen.append(quax.known_scale_invariant(jnp.zeros(3, jnp.float64) * x))
        seen.append(quax.known_scale_invariant(jnp.zeros(3, jnp.float32) * y))

    with jax.enable_x64(True):
        x = np.array([1.0, -2.0, 3.5], np.float64)
        jax.jit(ask)(x, x.astype(np.float32))
    assert seen == [True, True]
