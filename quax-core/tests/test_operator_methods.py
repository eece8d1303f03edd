"""`quax.OperatorMethods` and `quax.BitwiseOperatorMethods`: Python's operators on a
value type, each calling the type's `_binary_operator` with the function of
`operator` it stands for."""

import operator
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import quax

from .helpers import Dense


ARITHMETIC = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "matmul": operator.matmul,
}
COMPARISONS = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}
BITWISE = {"and": operator.and_, "or": operator.or_, "xor": operator.xor}


class Recording(quax.OperatorMethods, quax.BitwiseOperatorMethods, Dense):
    """A `Dense` that records each operator call and runs it by the rules."""

    __hash__ = None  # pyright: ignore[reportAssignmentType]

    def _binary_operator(self, op: Any, other: Any, reflected: bool) -> Any:
        seen.append((op, reflected))
        run = quax.quaxify(op)
        return run(other, self) if reflected else run(self, other)


class Declining(quax.OperatorMethods, Dense):
    """A `Dense` with the operators but the default `_binary_operator`."""


seen: list[Any] = []
a = jnp.array([[1.0, 2.0], [3.0, 4.0]])
b = jnp.array([[0.5, -1.0], [2.0, 3.0]])


def _cases() -> list[tuple[str, Any, bool]]:
    cases = []
    for table in (ARITHMETIC, BITWISE):
        for name, op in table.items():
            cases += [(f"__{name}__", op, False), (f"__r{name}__", op, True)]
    cases += [(f"__{name}__", op, False) for name, op in COMPARISONS.items()]
    return cases


@pytest.mark.parametrize(("method", "op", "reflected"), _cases())
def test_each_operator_calls_the_hook_with_its_function(
    method: str, op: Any, reflected: bool
) -> None:
    x, y = (a > 2, b > 0) if op in BITWISE.values() else (a, b)
    seen.clear()
    out = getattr(Recording(x), method)(y)
    assert seen == [(op, reflected)]
    want = op(y, x) if reflected else op(x, y)
    np.testing.assert_array_equal(out.array if isinstance(out, Dense) else out, want)


def test_a_jax_array_on_the_left_defers_to_the_reflected_method() -> None:
    seen.clear()
    out = b - Recording(a)
    assert seen == [(operator.sub, True)]
    np.testing.assert_array_equal(out.array, b - a)


def test_the_default_hook_declines() -> None:
    with pytest.raises(TypeError, match="unsupported operand"):
        Declining(a) + 1.0  # pyright: ignore[reportOperatorIssue, reportUnusedExpression]
    # Comparisons that both operands decline fall back to identity, as Python's do.
    assert (Declining(a) == "a") is False
    with pytest.raises(TypeError):
        hash(Recording(a))
