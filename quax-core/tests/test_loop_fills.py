"""Loop carries that start as constant fills and then receive values, and
`eqx.error_if` on values.

A solver writes its results into buffers that start as plain zeros or NaNs
(`jnp.zeros((n, *y.shape)).at[i].set(y)`). A family that refuses traced plain
operands (as quax-units does: their units are unknown) cannot run the body on the
plain carry; quax traces the first iteration with the fills known, finds the type
the body gives the carry, and lifts the start into it. `Tagged` below behaves like
such a family: it joins a plain float operand only when it is a known constant of
zeros, infinities or NaNs.
"""

from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jaxtyping import Array, ArrayLike


class TagError(TypeError):
    pass


# Primitives whose operands must agree (as add or select do for units).
_JOINING = {
    lax.add_p,
    lax.sub_p,
    lax.select_n_p,
    lax.scatter_p,
    lax.dynamic_update_slice_p,
    lax.concatenate_p,
}


def _fits_any_tag(x: Any) -> bool:
    if isinstance(x, jax.core.Tracer):
        return False
    values = np.asarray(x)
    return bool(np.all((values == 0) | ~np.isfinite(values)))


class Tagged(quax.ArrayValue):
    """An array with a static tag, which refuses to materialise."""

    array: Array
    tag: str = eqx.field(static=True)
    linear_in_leaves: ClassVar[bool] = True

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(jnp.shape(self.array), jnp.result_type(self.array))

    def materialise(self) -> Array:
        raise TagError(f"a {self.tag!r} array never materialises")

    @classmethod
    def lift(cls, array: ArrayLike, like: "Tagged") -> "Tagged | None":
        return cls(jnp.asarray(array), like.tag) if _fits_any_tag(array) else None

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        (tag,) = {v.tag for v in values if isinstance(v, Tagged)}
        if primitive in _JOINING:
            for v in values:
                plain_float = not isinstance(v, Tagged) and jnp.issubdtype(
                    jnp.result_type(v), jnp.inexact
                )
                if plain_float and not _fits_any_tag(v):
                    raise TagError(f"`{primitive.name}` of {tag!r} and plain")
        arrays = [v.array if isinstance(v, Tagged) else v for v in values]
        out = primitive.bind(*arrays, **params)

        def wrap(o: Any) -> Any:
            return Tagged(o, tag) if jnp.issubdtype(o.dtype, jnp.inexact) else o

        return [wrap(o) for o in out] if primitive.multiple_results else wrap(out)


y = jnp.array([1.0, 2.0])


def _check(program: Any, *args: Any) -> None:
    expected = program(y, *args)
    for run in (quax.quaxify(program), jax.jit(quax.quaxify(program))):
        out = run(Tagged(y, "m"), *args)
        assert isinstance(out, Tagged) and out.tag == "m"
        np.testing.assert_array_equal(out.array, expected)


def test_fori_loop_fills_a_zeros_buffer():
    def program(v):
        return lax.fori_loop(0, 3, lambda i, b: b.at[i].set(v * i), jnp.zeros((3, 2)))

    _check(program)


def test_while_loop_with_traced_bound_fills_a_nan_buffer():
    def program(v, n):
        buffer = jnp.full((3, 2), jnp.nan)
        return lax.fori_loop(0, n, lambda i, b: b.at[i].set(v * i), buffer)

    _check(program, 2)


def test_scan_fills_an_inf_buffer():
    def program(v):
        def step(b, i):
            return lax.dynamic_update_slice(b, v[None] * i, (i, 0)), None

        return lax.scan(step, jnp.full((3, 2), jnp.inf), jnp.arange(3))[0]

    _check(program)


def test_nested_loops_fill_buffers_from_products_of_zeros():
    # The outer carry `f` starts as zeros and is only known to be zero inside the
    # first iteration; the inner stage buffer is built from `dt * f` (zero), as an
    # FSAL Runge-Kutta step builds its stages.
    def program(v):
        def outer(i, c):
            f, out = c
            dt = 0.1 * (i + 1)
            stages = jnp.zeros((2, 2)).at[0].set(dt * f)

            def inner(j, s):
                return s.at[j].set(v + jnp.sum(s, axis=0) * dt)

            stages = lax.fori_loop(1, 2, inner, stages)
            return stages[1], out.at[i].set(stages[1])

        return lax.fori_loop(0, 3, outer, (jnp.zeros(2), jnp.zeros((3, 2))))[1]

    _check(program)


def test_a_buffer_passed_into_a_custom_vjp_under_jit():
    # A solver's checkpointed loop is a `custom_vjp` taking the buffer as an input:
    # under `jit` the buffer is traced, but the trace shows it is a fill, so it
    # stays one inside, where the loop lifts it.
    @jax.custom_vjp
    def record(buffer, v):
        return lax.fori_loop(0, 3, lambda i, b: b.at[i].set(v * i), buffer)

    def record_fwd(buffer, v):
        return record(buffer, v), None

    def record_bwd(_, ct):
        return jnp.zeros_like(ct), jnp.sum(ct * jnp.arange(3.0)[:, None], axis=0)

    record.defvjp(record_fwd, record_bwd)
    _check(lambda v: record(jnp.full((3, 2), jnp.inf), v))


def test_a_genuine_error_in_the_body_is_reported():
    traced = lambda v: lax.fori_loop(
        0, 3, lambda i, b: b.at[i].set(v) + i * jnp.ones(2), jnp.zeros((3, 2))
    )
    with pytest.raises(TagError, match="`add` of 'm' and plain"):
        quax.quaxify(traced)(Tagged(y, "m"))


def test_a_buffer_of_other_values_is_not_lifted():
    # A start of ones is no fill of zeros or NaNs: the type declines to lift it.
    program = lambda v: lax.fori_loop(
        0, 2, lambda i, b: b.at[i].set(v), jnp.ones((2, 2))
    )
    with pytest.raises(TagError, match="`scatter` of 'm' and plain"):
        quax.quaxify(program)(Tagged(y, "m"))


def test_error_if_keeps_the_value_type():
    # equinox issue 1257: `error_if`'s error branch is built from a shape. JAX's
    # tracer-leak checker crashes (IndexError in `leaked_tracer_error`) on Equinox's
    # error primitives, without quax too, so it is off here.
    guarded = lambda v: eqx.error_if(v, v.sum() < 0, "negative total") * 2
    with jax.check_tracer_leaks(False):
        out = eqx.filter_jit(quax.quaxify(guarded))(Tagged(y, "m"))
        assert isinstance(out, Tagged) and out.tag == "m"
        np.testing.assert_array_equal(out.array, y * 2)
        with pytest.raises(eqx.EquinoxRuntimeError, match="negative total"):
            eqx.filter_jit(quax.quaxify(guarded))(Tagged(-y, "m"))


_PARTLY_FILLED = jnp.array([[0.0, 0.0], [7.0, 7.0]])


@pytest.mark.parametrize(
    "start",
    [
        pytest.param(lambda: _PARTLY_FILLED, id="constant"),
        pytest.param(lambda: jnp.zeros((2, 2)).at[1].set(7.0), id="built"),
        pytest.param(lambda: jnp.zeros((2, 2)).at[1, 1].set(7.0), id="last-entry"),
    ],
)
def test_a_partly_filled_buffer_is_not_lifted(start: Any) -> None:
    # Row 0 matches the fill (zeros fit any tag) and the body overwrites it; row 1
    # holds plain 7s. Lifting the start would tag the 7s: it must stay an error.
    def program(v: Any) -> Any:
        return lax.fori_loop(0, 1, lambda i, b: b.at[0].set(v), start())

    for run in (quax.quaxify(program), jax.jit(quax.quaxify(program))):
        with pytest.raises(TagError, match="`scatter` of 'm' and plain"):
            run(Tagged(y, "m"))


class Copying(Tagged):
    """A `Tagged` whose `lift` stores a copy of the array it is given."""

    @classmethod
    def lift(cls, array: ArrayLike, like: "Tagged") -> "Tagged | None":
        return cls(jnp.array(array), like.tag) if _fits_any_tag(array) else None


def test_a_buffer_of_signed_zeros_keeps_its_signs() -> None:
    # Zeros of both signs fit any tag, but they are not one fill: the -0.0 entries
    # the body leaves alone stay -0.0 (as dense JAX keeps them: `1 / x` is -inf).
    start = jnp.zeros((2, 2)).at[1].set(-0.0)

    def program(v: Any) -> Any:
        return lax.fori_loop(0, 1, lambda i, b: b.at[0].set(v), start)

    expected = program(y)
    for run in (quax.quaxify(program), jax.jit(quax.quaxify(program))):
        out = run(Copying(y, "m"))
        assert isinstance(out, Tagged) and out.tag == "m"
        np.testing.assert_array_equal(out.array, expected)
        np.testing.assert_array_equal(np.signbit(out.array), np.signbit(expected))


def test_fills_of_nans_with_other_signs_are_other_fills() -> None:
    # A select between two fills is one of them only when they are the same array
    # bit for bit: +NaN and -NaN (and 0.0 and -0.0) are not (their `repr`s once
    # made +NaN and -NaN one key, and the select gave the first fill's sign).
    from quax._rules._joins import Fill

    nan = float("nan")
    plus = Fill(nan, (3,), jnp.dtype(jnp.float32))
    minus = Fill(-nan, (3,), jnp.dtype(jnp.float32))
    assert plus.key == Fill(nan, (3,), jnp.dtype(jnp.float32)).key
    assert plus.key != minus.key
    assert Fill(0.0, (3,), jnp.dtype(jnp.float32)).key != (
        Fill(-0.0, (3,), jnp.dtype(jnp.float32)).key
    )
    which = jnp.array([0, 1, 1])
    out = Fill.default(lax.select_n_p, [which, plus, minus], {})
    got = np.signbit(np.asarray(out.materialise() if isinstance(out, Fill) else out))
    np.testing.assert_array_equal(got, [False, True, True])


def _state_through_a_nested_loop(start: Any) -> Any:
    """A solver's step loop whose carry `state` (a root finder's state) starts as
    `start` and is only passed through: each step reinitialises it on the first
    step (a `cond` that computes the same constant, as a solver recomputes its
    Jacobian) and hands it to an inner loop (the root finder), whose body selects
    between a new tagged value and the old state."""

    def program(v: Any) -> Any:
        def step(i: Any, carry: Any) -> Any:
            total, state = carry
            state = lax.cond(i == 0, lambda: jnp.full((2,), jnp.inf), lambda: state)

            def iterate(c: Any) -> Any:
                k, d = c
                return k + 1, jnp.where(k < 1, v * (k + 1.0), d)

            _, found = lax.while_loop(lambda c: c[0] < 2, iterate, (0, state))
            return total + found, state

        return lax.fori_loop(0, 3, step, (jnp.zeros(2), start))

    return program


def test_a_carry_passed_to_a_nested_loop_takes_the_type_it_gets_there() -> None:
    # The step loop's `state` starts as infinities and the step returns it
    # unchanged, so its own outputs say nothing of its type; the inner loop, where
    # it meets `v`, lifts it into `v`'s type, which is then the carry's. (Without
    # this, the inner loop's body meets a plain carry that is only known at run
    # time: a `select_n` of 'm' and plain.)
    program = _state_through_a_nested_loop(jnp.full((2,), jnp.inf))
    want_total, want_state = program(y)
    for run in (quax.quaxify(program), jax.jit(quax.quaxify(program))):
        total, state = run(Tagged(y, "m"))
        assert isinstance(total, Tagged) and total.tag == "m"
        np.testing.assert_array_equal(total.array, want_total)
        np.testing.assert_array_equal(total.array, 3 * y)
        # The infinities, now tagged: a fill of infinities fits any tag.
        assert isinstance(state, Tagged) and state.tag == "m"
        np.testing.assert_array_equal(state.array, want_state)


def test_a_carry_of_other_values_passed_to_a_nested_loop_is_not_lifted() -> None:
    # The same program with a state of 5s (a fill, but of numbers that fit no tag)
    # and with a plain argument as the state: both stay errors, never tagged.
    def program(v: Any, start: Any) -> Any:
        return _state_through_a_nested_loop(start)(v)

    for start in (jnp.full((2,), 5.0), jnp.array([5.0, 6.0])):
        for run in (quax.quaxify(program), jax.jit(quax.quaxify(program))):
            with pytest.raises(TagError, match="of 'm' and plain"):
                run(Tagged(y, "m"), start)
