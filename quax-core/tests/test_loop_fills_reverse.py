"""Loop carries that start as constant fills, used the way a reverse-mode loop
uses its cotangent carries (equinox's checkpointed loop, as diffrax's adjoint
runs it): read at a stage only known at run time, selected against a fresh zero,
or passed through one branch of a `cond` while the other adds a value to them.

While quax traces the first iteration to find the carries' types, the carry's
stand-in (`Fill`) must stay a fill through each of these, so that the body does not
meet an unknown plain array beside a value (which `Tagged`, like quax-units,
refuses). Each program is compared with the same program on plain arrays.
"""

from typing import Any

import jax.numpy as jnp
from jax import lax

from .test_loop_fills import _check


def test_a_fill_carry_read_at_a_traced_index():
    # `buf[k]` at an index only known at run time (under `jit`) is a
    # `dynamic_slice` of the carry: a slice of a zero buffer is zeros wherever it
    # starts (the start is clamped into the buffer).
    def program(v: Any, k: Any) -> Any:
        def body(i: Any, c: Any) -> Any:
            buf, acc = c
            acc = acc + buf[k]
            return buf.at[i].set(v * i), acc

        buf, acc = lax.fori_loop(0, 3, body, (jnp.zeros((3, 2)), v))
        return buf + acc

    _check(program, 2)


def test_a_fill_carry_selected_against_a_fresh_zero():
    # `where(p, buf, 0)` with a traced `p`: either case is the same zeros, so the
    # selection is the carry's fill, which then meets the value it is added to.
    def program(v: Any, p: Any) -> Any:
        def body(i: Any, c: Any) -> Any:
            buf, acc = c
            acc = acc + jnp.where(p, buf, jnp.zeros(2))
            return buf + v * i, acc

        buf, acc = lax.fori_loop(0, 3, body, (jnp.zeros(2), v))
        return buf + acc

    _check(program, jnp.array(True))


def test_a_fill_carry_through_one_branch_of_a_cond():
    # One branch adds a value to the carry (a reverse loop's U-turn accumulating a
    # cotangent), the other passes it through: the fill joins the value's type.
    def program(v: Any, p: Any) -> Any:
        def body(i: Any, acc: Any) -> Any:
            return lax.cond(p, lambda a: a + v * i, lambda a: a, acc)

        return lax.fori_loop(0, 3, body, jnp.zeros(2))

    _check(program, jnp.array(True))
