"""What the published quax's clients rely on in loops: a `while_loop` whose predicate
is a user's dense wrapper that refuses to materialise (quaxed's `MyArray`, through
`jnp.gcd`, `jnp.lcm`, `lax.linalg.qdwh`) runs on the wrapper's one boolean leaf, as
the published quax does; predicates whose leaf is not their array stay refused,
with the error naming the loop."""

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax

from .helpers import Wrapper


def _count_up(a: Any) -> Any:
    return lax.while_loop(lambda a: jnp.sum(a) < 10.0, lambda a: a + 1.0, a)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_while_predicate_is_read_from_the_wrappers_leaf(jit: bool) -> None:
    fn = quax.quaxify(_count_up)
    with quax.track_materialisation() as report:
        out = (jax.jit(fn) if jit else fn)(Wrapper(jnp.ones(2)))
    assert isinstance(out, Wrapper)
    np.testing.assert_array_equal(out.array, [5.0, 5.0])
    assert not report.counts


def test_batched_while_predicate_is_read_from_the_wrappers_leaf() -> None:
    # Under `vmap` the predicate is one boolean per batch element.
    def f(a: Any, c: Any) -> Any:
        return lax.while_loop(lambda a: (a < c).squeeze(), lambda a: a + 1.0, a)

    c = jnp.array([0.0, 1.0, 2.5, 4.0])
    out = quax.quaxify(jax.vmap(f, in_axes=(None, 0)))(
        Wrapper(jnp.zeros(1)), Wrapper(c)
    )
    np.testing.assert_array_equal(out.array, [[0.0], [1.0], [3.0], [4.0]])


@pytest.mark.parametrize(
    ("fn", "expected"),
    [(jnp.gcd, np.gcd), (jnp.lcm, np.lcm)],
    ids=["gcd", "lcm"],
)
def test_gcd_and_lcm_on_a_refusing_wrapper(fn: Any, expected: Any) -> None:
    x, y = np.array([12, 18, 7, 0], np.int32), np.array([8, 27, 5, 3], np.int32)
    out = quax.quaxify(fn)(Wrapper(jnp.asarray(x)), Wrapper(jnp.asarray(y)))
    assert isinstance(out, Wrapper)
    np.testing.assert_array_equal(out.array, expected(x, y))


class NonLinear(Wrapper):
    """A wrapper whose array is not (declared) linear in its leaf: its leaf may not
    stand for its array."""

    linear_in_leaves: ClassVar[bool] = False


class Masked(Wrapper):
    """A wrapper with a second leaf: which leaf is the predicate is not known."""

    mask: jax.Array

    @staticmethod
    def default(primitive: Any, values: Any, params: dict[str, Any]) -> Any:
        mask = next(v.mask for v in values if isinstance(v, Masked))
        arrays = [v.array if isinstance(v, Masked) else v for v in values]
        return Masked(primitive.bind(*arrays, **params), mask)


@pytest.mark.parametrize(
    "x",
    [NonLinear(jnp.ones(2)), Masked(jnp.ones(2), jnp.ones(2, bool))],
    ids=["non-linear", "two-leaves"],
)
def test_while_predicate_not_readable_from_a_leaf_is_refused_by_name(x: Any) -> None:
    with pytest.raises(
        RuntimeError, match=r"(?s)predicate of a `while_loop`.*Refusing to materialise"
    ) as e:
        quax.quaxify(_count_up)(x)
    assert "enable_materialise" in str(e.value)
