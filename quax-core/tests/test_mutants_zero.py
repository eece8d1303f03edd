"""Symbolic zeros: tests that kill mutants of `quax/zero/_rules.py` which the other
test files let through (`scripts/mutation.sh zero-rules`; docs/mutation.md lists each
surviving mutant and the test that kills it). References are plain JAX on the dense
zeros."""

import jax
import jax.numpy as jnp
import numpy as np
import quax
import quax.zero
from quax.zero import Zero


def test_strict_keeps_a_zero_times_a_traced_integer_symbolic() -> None:
    # Inside `ieee_strict()`, a zero times a floating operand known only at run time
    # is computed densely (it could be inf or NaN); an integer operand cannot be, so
    # the product stays a symbolic zero (mutants: `_could_be_nonfinite` answering
    # "could be" for integers).
    z = Zero((3,), jnp.int32)
    y = jnp.array([5, -7, 0], jnp.int32)
    with quax.zero.ieee_strict():
        out = jax.jit(quax.quaxify(jnp.multiply))(z, y)
    assert isinstance(out, Zero)
    assert (out.shape, out.dtype) == ((3,), jnp.int32)
    np.testing.assert_array_equal(out.materialise(), jnp.zeros(3, jnp.int32) * y)


def _sign_bits(x: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    array = np.asarray(x)
    return np.signbit(np.real(array)), np.signbit(np.imag(array))


def test_complex_zero_times_a_traced_operand_has_the_dense_signs() -> None:
    # A complex operand known only at run time is read as `1 + 0j` (positive finite,
    # documented). `(-0 - 0j) * (1 + 0j)` is `+0 - 0j`, while `(1 - 0j)` would give
    # `-0 + 0j` (mutant: the operand's imaginary sign). The reference is plain JAX on
    # the dense zeros and an operand that is `1 + 0j` times a positive number.
    z = Zero((2,), jnp.complex64, negative=(True, True))
    y = jnp.array([1 + 0j, 2.5 + 0j], jnp.complex64)
    out = jax.jit(quax.quaxify(jnp.multiply))(z, y)
    assert isinstance(out, Zero)
    dense = z.materialise() * y
    for got, want in zip(_sign_bits(out.materialise()), _sign_bits(dense), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_complex64_zero_times_a_traced_array_with_float64_on() -> None:
    """With float64 enabled, a `Zero` of complex64 times a traced complex64 array:
    the sign evaluation builds the traced operand as a signed one of complex64, its
    parts float32 whatever the default float is (mutant `_build` 38 built its
    imaginary part in the default dtype, float64 there, and `lax.complex`
    refused the pair)."""
    y = np.array([1.0 + 2.0j, -3.0 - 0.5j], np.complex64)
    with jax.enable_x64(True):
        out = jax.jit(quax.quaxify(lambda z, y: z * y))(Zero((2,), jnp.complex64), y)
        assert isinstance(out, Zero) and out.dtype == jnp.complex64
        np.testing.assert_array_equal(out.materialise(), np.zeros(2, np.complex64))


def test_a_zero_plus_a_numpy_array_gives_a_jax_array() -> None:
    """`Zero + y` is `y`: a JAX array, as plain JAX gives, where `y` is a NumPy
    array (mutant `_as` 7 returned JAX's typed literal of it)."""
    y = np.array([1.0, -2.0, 3.0], np.float32)
    for f in (lambda z, y: z + y, lambda z, y: y + z, lambda z, y: y - z):
        out = quax.quaxify(f)(Zero((3,), jnp.float32), y)
        assert type(out) is type(jnp.add(y, y)), type(out)
        np.testing.assert_array_equal(out, y)


def test_a_complex_zero_annihilates_non_finite_concrete_elements() -> None:
    """A zero times, or over, a concrete complex operand: outside `ieee_strict()` an
    element a zero annihilates (non-finite; zero as a divisor) counts as a one with
    the sign of its real part plus a zero with that of its imaginary part, so the
    product is the dense zeros times those units, with their signs, never NaN
    (mutant `_sanitised` 15 took every operand for a real one: NumPy's `copysign`
    refused the complex array). The reference is plain JAX on the dense zeros and
    the units written out."""
    inf = np.inf
    cases = [
        (
            jnp.multiply,
            np.array([inf + 1j, -inf - 2j, 3 - 4j], np.complex64),
            np.array([1 + 0j, complex(-1, -0.0), 3 - 4j], np.complex64),
        ),
        (
            jnp.divide,
            np.array([complex(-0.0, -0.0), 0j, -2 + 1j], np.complex64),
            np.array([complex(-1, -0.0), 1 + 0j, -2 + 1j], np.complex64),
        ),
    ]
    for op, y, units in cases:
        z = Zero((3,), jnp.complex64)
        out = quax.quaxify(op)(z, y)
        got = out.materialise() if isinstance(out, Zero) else out
        want = op(jnp.zeros(3, jnp.complex64), units)
        assert got.dtype == np.complex64
        np.testing.assert_array_equal(got, np.zeros(3, np.complex64))
        for got_bits, want_bits in zip(_sign_bits(got), _sign_bits(want), strict=True):
            np.testing.assert_array_equal(got_bits, want_bits)
