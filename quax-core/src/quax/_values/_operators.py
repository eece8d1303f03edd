"""Python's binary operator methods for value types (`quax.OperatorMethods`,
`quax.BitwiseOperatorMethods`): the table of Python operators and the functions of
`operator` they call, written once for every family. A family says how one operator
runs on its type (`_binary_operator`); the mixins give it `+`, `-`, ... and their
reflected forms, as explicit methods that type checkers see."""

import operator
from collections.abc import Callable
from typing import Any

import equinox as eqx


__all__ = ["BitwiseOperatorMethods", "OperatorMethods"]


class _BinaryOperatorHook(eqx.Module):
    def _binary_operator(
        self, op: Callable[[Any, Any], Any], other: Any, reflected: bool
    ) -> Any:
        """`op(self, other)` (`op(other, self)` where `reflected`: `2 - x` calls
        `x.__rsub__(2)`) for this value type, or `NotImplemented` where the type does
        not take `other` (Python then tries `other`'s method, and raises its usual
        `TypeError` if that declines too). `op` is the function of `operator` the
        Python operator stands for (`operator.sub` for `-`). The default declines.

        **Arguments:**

        - `op`: the function of `operator`, such as `operator.add`.
        - `other`: the other operand.
        - `reflected`: whether `self` is the right operand.

        **Returns:**

        The result, or `NotImplemented`.
        """
        del op, other, reflected
        return NotImplemented


class OperatorMethods(_BinaryOperatorHook):
    """A mixin giving a value type Python's arithmetic operators (`+`, `-`, `*`,
    `/`, `//`, `%`, `**`, `@`), their reflected forms (`__radd__`, ...), and the
    comparisons (`<`, `<=`, `>`, `>=`, `==`, `!=`; `==` elementwise, as for arrays),
    each calling the type's `_binary_operator(op, other, reflected)` with the
    function of `operator` it stands for.

    ```python
    class MyArray(quax.OperatorMethods, quax.ArrayValue):
        array: jax.Array

        def _binary_operator(self, op, other, reflected):
            run = quax.quaxify(op)
            return run(other, self) if reflected else run(self, other)
    ```

    List it before the value's base (`quax.ArrayValue`, `quax.GuardedValue`), so
    that its `==` comes before `equinox.Module`'s. A type that defines `==`
    elementwise is not hashable: set `__hash__ = None` in its body, as a JAX array
    is not hashable. A method the type defines in its own body (`__matmul__` that
    does something else) takes precedence, as any method of a subclass does.
    """

    def __add__(self, other: Any) -> Any:
        return self._binary_operator(operator.add, other, False)

    def __radd__(self, other: Any) -> Any:
        return self._binary_operator(operator.add, other, True)

    def __sub__(self, other: Any) -> Any:
        return self._binary_operator(operator.sub, other, False)

    def __rsub__(self, other: Any) -> Any:
        return self._binary_operator(operator.sub, other, True)

    def __mul__(self, other: Any) -> Any:
        return self._binary_operator(operator.mul, other, False)

    def __rmul__(self, other: Any) -> Any:
        return self._binary_operator(operator.mul, other, True)

    def __truediv__(self, other: Any) -> Any:
        return self._binary_operator(operator.truediv, other, False)

    def __rtruediv__(self, other: Any) -> Any:
        return self._binary_operator(operator.truediv, other, True)

    def __floordiv__(self, other: Any) -> Any:
        return self._binary_operator(operator.floordiv, other, False)

    def __rfloordiv__(self, other: Any) -> Any:
        return self._binary_operator(operator.floordiv, other, True)

    def __mod__(self, other: Any) -> Any:
        return self._binary_operator(operator.mod, other, False)

    def __rmod__(self, other: Any) -> Any:
        return self._binary_operator(operator.mod, other, True)

    def __pow__(self, other: Any) -> Any:
        return self._binary_operator(operator.pow, other, False)

    def __rpow__(self, other: Any) -> Any:
        return self._binary_operator(operator.pow, other, True)

    def __matmul__(self, other: Any) -> Any:
        return self._binary_operator(operator.matmul, other, False)

    def __rmatmul__(self, other: Any) -> Any:
        return self._binary_operator(operator.matmul, other, True)

    # Comparisons have no reflected methods: Python tries the mirrored comparison
    # of the other operand (`a < b` becomes `b > a`).

    def __lt__(self, other: Any) -> Any:
        return self._binary_operator(operator.lt, other, False)

    def __le__(self, other: Any) -> Any:
        return self._binary_operator(operator.le, other, False)

    def __gt__(self, other: Any) -> Any:
        return self._binary_operator(operator.gt, other, False)

    def __ge__(self, other: Any) -> Any:
        return self._binary_operator(operator.ge, other, False)

    def __eq__(self, other: Any) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        return self._binary_operator(operator.eq, other, False)

    def __ne__(self, other: Any) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        return self._binary_operator(operator.ne, other, False)


class BitwiseOperatorMethods(_BinaryOperatorHook):
    """A mixin giving a value type Python's bitwise operators `&`, `|`, `^` and
    their reflected forms, each calling the type's `_binary_operator(op, other,
    reflected)` as [`quax.OperatorMethods`][] does (with `operator.and_`,
    `operator.or_`, `operator.xor`). A separate mixin, as not every value type has
    them: a quantity has no `&`."""

    def __and__(self, other: Any) -> Any:
        return self._binary_operator(operator.and_, other, False)

    def __rand__(self, other: Any) -> Any:
        return self._binary_operator(operator.and_, other, True)

    def __or__(self, other: Any) -> Any:
        return self._binary_operator(operator.or_, other, False)

    def __ror__(self, other: Any) -> Any:
        return self._binary_operator(operator.or_, other, True)

    def __xor__(self, other: Any) -> Any:
        return self._binary_operator(operator.xor, other, False)

    def __rxor__(self, other: Any) -> Any:
        return self._binary_operator(operator.xor, other, True)
