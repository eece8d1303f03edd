"""`quax.known_scaled_constant`: a plain operand as a (traced) scalar times a known
constant, `noise * jnp.eye(n)` with a traced `noise`, under `jit`, `vmap`, `grad`,
`jvp`, nested `jit`, with the caches on, off and in verify mode."""

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._caching._replay as quax_replay
import quax._foundation._caches
from jax import lax
from jaxtyping import ArrayLike

from .helpers import Dense


EYE = np.eye(3, dtype=np.float32)


def _rebuilt(x: Any) -> Any:
    """`scale * constant` as `known_scaled_constant` reads `x` (which must be
    readable), used in the program in place of `x`."""
    out = quax.known_scaled_constant(x)
    assert out is not None
    scale, constant = out
    assert np.shape(scale) == ()
    assert constant.shape == np.shape(x) and constant.dtype == x.dtype
    return scale * constant


def test_concrete_arrays_are_one_times_themselves():
    found = quax.known_scaled_constant(jnp.arange(3.0))
    assert found is not None
    scale, constant = found
    assert isinstance(scale, np.ndarray) and scale.dtype == np.float32 and scale == 1
    np.testing.assert_array_equal(constant, [0.0, 1.0, 2.0])
    assert quax.known_scaled_constant(jnp.zeros(2000)) is None  # over max_size


def test_traced_scales_times_constants_under_jit():
    """Each readable pattern is read with a traced scale that the program uses:
    `scale * constant` is `x` (against the arrays computed in plain JAX)."""
    patterns: dict[str, Callable[[Any, Any], Any]] = {
        "s * eye": lambda s, t: s * EYE,
        "eye * s": lambda s, t: jnp.eye(3) * s,
        "2 * (s * eye)": lambda s, t: 2.0 * (s * jnp.eye(3)),
        "(s * t) * diag": lambda s, t: (s * t) * np.diag(np.arange(1.0, 4.0)),
        "(s * eye) * (t * eye)": lambda s, t: (s * EYE) * (t * EYE),
        "s * eye / t": lambda s, t: s * EYE / t,
        "-(s * eye)": lambda s, t: -(s * EYE),
        "to float64": lambda s, t: (s * EYE).astype(jnp.float64),
        "reshaped": lambda s, t: (s * jnp.arange(6.0)).reshape(2, 3),
        "transposing reshape": lambda s, t: lax.reshape(
            s * np.arange(6.0).reshape(2, 3), (3, 2), dimensions=(1, 0)
        ),
        "a traced number": lambda s, t: s,
        "a constant": lambda s, t: 3 * EYE,
    }
    with jax.enable_x64(True):
        for name, make in patterns.items():
            run = jax.jit(lambda s, t, make=make: (make(s, t), _rebuilt(make(s, t))))
            want, got = run(np.float32(0.7), np.float32(-1.5))
            assert got.dtype == want.dtype, name
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)


def test_what_is_not_a_scalar_times_a_constant_is_not_read():
    """A traced factor that is not a scalar, a quotient by a zero, an integer
    quotient, conversions that truncate or drop an imaginary part: `None`."""
    seen = {}

    def f(s, v, i):
        seen["v * eye"] = quax.known_scaled_constant(v * EYE)
        seen["s * eye + v"] = quax.known_scaled_constant(s * EYE + v)
        seen["s * eye / 0"] = quax.known_scaled_constant(s * EYE / 0.0)
        seen["int quotient"] = quax.known_scaled_constant(i * jnp.ones(3, int) // i)
        seen["to int"] = quax.known_scaled_constant((s * EYE).astype(jnp.int32))
        with warnings.catch_warnings():  # JAX warns of the imaginary part dropped
            warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
            to_real = lax.convert_element_type(s * (1 + 1j) * EYE, jnp.float32)
        seen["to real"] = quax.known_scaled_constant(to_real)
        return s

    jax.jit(f)(np.float32(2.0), jnp.ones(3), 2)
    assert all(v is None for v in seen.values()), seen


def test_derivatives_flow_through_the_scale():
    """Under `grad` (eager, inside and outside `jit`), `jvp` and `grad` of `grad`,
    the rebuilt `scale * constant` has `x`'s derivative: the scale
    carries the tangent (against the derivative in plain JAX)."""
    loss = lambda s, x: jnp.sum(jnp.sin(x) * jnp.arange(9.0).reshape(3, 3))
    make = lambda s: (2 * s) * EYE
    plain = lambda s: loss(s, make(s))
    read = lambda s: loss(s, _rebuilt(make(s)))
    s = np.float32(0.4)
    want = jax.grad(plain)(s)
    assert want != 0
    for fn in (
        jax.grad(read),
        jax.jit(jax.grad(read)),
        jax.grad(jax.jit(read)),
        jax.jit(jax.grad(jax.jit(read))),
        lambda s: jax.jvp(read, (s,), (np.float32(1.0),))[1],
        lambda s: jax.jit(lambda s: jax.jvp(read, (s,), (np.float32(1.0),)))(s)[1],
    ):
        np.testing.assert_allclose(fn(s), want, rtol=1e-6)
    # The second derivative too: the primal of the tangent pair is one.
    np.testing.assert_allclose(
        jax.grad(jax.grad(read))(s), jax.grad(jax.grad(plain))(s), rtol=1e-5
    )


def test_vmap_and_nested_jit():
    """An unbatched scale under `vmap` is read (a batched one is not: each
    example's scale differs); a scale staged by an outer `jit` is read inside an
    inner one."""
    seen = {}

    def f(s, v):
        seen["unbatched"] = quax.known_scaled_constant(s * EYE) is not None
        seen["batched"] = quax.known_scaled_constant(v * EYE)
        return v

    jax.vmap(f, in_axes=(None, 0))(np.float32(2.0), jnp.ones(4))
    assert seen == {"unbatched": True, "batched": None}

    def outer(s, t):
        x = s * EYE
        inner = lambda t: (_rebuilt(x) + _rebuilt(t * EYE), x + t * EYE)
        return jax.jit(inner)(t)

    got, want = jax.jit(outer)(np.float32(0.25), np.float32(3.0))
    np.testing.assert_allclose(got, want, rtol=1e-6)


class Marked(Dense):
    """A `Dense` whose sum with a plain array depends on what
    `known_scaled_constant` reads: `a + b` for a scaled identity `b`, else `a + 2
    b`. Its rule stages equations on its inputs only: were the ask not counted,
    its first bind would be recorded and replayed for another `b` of the same
    aval (a constant of another pattern), giving that one's answer."""

    aval_leaf: ClassVar[str] = "array"


@quax.register(lax.add_p)
def _(a: Marked, b: ArrayLike) -> Marked:
    out = quax.known_scaled_constant(b)
    identity = out is not None and np.array_equal(out[1], np.eye(3))
    return Marked(a.array + b if identity else a.array + 2 * b)


@pytest.fixture
def fresh_recordings() -> Any:
    quax_replay._recordings.clear()
    yield
    quax_replay._recordings.clear()


@pytest.mark.caching_behaviour
@pytest.mark.parametrize("mode", ["on", "off", "verify"])
def test_a_rule_reading_a_scaled_constant_is_never_replayed(
    mode: str, fresh_recordings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Binds of one key (in one program, and in two programs) with other traced
    scales and other constants each get their own answer: the ask counts as
    `known_constant`'s does, so no bind is recorded and replayed for another."""
    caches = quax._foundation._caches
    monkeypatch.setattr(caches, "verifying", mode == "verify")
    a = Marked(jnp.arange(9.0, dtype=jnp.float32).reshape(3, 3))
    ones = np.ones((3, 3), np.float32)

    def three(a, s, t):
        return (a + s * EYE).array, (a + t * EYE).array, (a + s * ones).array

    with quax.caching(mode != "off"):
        for _ in range(2):  # the second time, from whatever the first recorded
            got = jax.jit(quax.quaxify(three))(a, 1.0, 10.0)
            want = (a.array + EYE, a.array + 10 * EYE, a.array + 2 * ones)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w)
            one = jax.jit(quax.quaxify(lambda a, s: (a + s * ones).array))
            np.testing.assert_allclose(one(a, -3.0), a.array - 6 * ones)


def test_known_constant_reads_held_arrays_and_larger_computations():
    """`known_constant` (which `known_scaled_constant` reads constants with) reads
    an array the program holds (`jnp.asarray` of a NumPy array under `jit`, a
    tangent program's array of its primal program) and computes constants of up
    to 2**20 elements (`jnp.eye(200)`: an `iota`, an `eq` and a conversion)."""
    held = np.arange(2000.0, dtype=np.float32)
    seen = {}

    def f(s):
        seen["held"] = quax.known_constant(jnp.asarray(held), 4096)
        seen["eye"] = quax.known_constant(jnp.eye(200), 2**62)
        scaled_eye = quax.known_scaled_constant(s * jnp.eye(200), 2**62)
        seen["scaled eye"] = None if scaled_eye is None else scaled_eye[1]
        return s

    jax.jit(f)(np.float32(2.0))
    np.testing.assert_array_equal(seen["held"], held)
    np.testing.assert_array_equal(seen["eye"], np.eye(200))
    np.testing.assert_array_equal(seen["scaled eye"], np.eye(200))


class Tagged(Dense):
    """A value whose `neg` rule negates only where `known_scaled_constant` reads
    a product of its leaf's sum and a constant with a concrete scale (else it
    keeps the leaf: an answer that changes the values, not only a static field,
    which a compiled eager program would check)."""


@quax.register(lax.neg_p)
def _(x: Tagged) -> Tagged:
    out = quax.known_scaled_constant(jnp.sum(x.array) * EYE)
    concrete = out is not None and isinstance(out[0], np.ndarray)
    return Tagged(-x.array if concrete else x.array)


@pytest.mark.parametrize("compiled", [True, False])
def test_eager_programs_answer_as_equation_by_equation(compiled: bool) -> None:
    """In library code that quax runs eagerly as one compiled program, a scale
    computed from a leaf makes that code run equation by equation, where it is
    concrete: the answer (a NumPy scale) is the one without compilation."""
    previous = quax.set_eager_compilation(compiled)
    try:
        for _ in range(3):  # the first call, the compiled program, then by equation
            out = quax.quaxify(jnp.negative)(Tagged(jnp.arange(3.0)))
            np.testing.assert_array_equal(out.array, -np.arange(3.0))
    finally:
        quax.set_eager_compilation(previous)
