"""Derivatives in the right units: `grad`, `value_and_grad` and `jacobian`.

`jax.grad(f)(q)` outside `quax.quaxify` returns a cotangent with the pytree structure
of its input, so a `Quantity` input gives a gradient labelled with the *input's*
unit: JAX copies the static fields. These functions differentiate with respect to
the numbers of the quantities instead and label the result with the units of
output over input.
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu

from ._dimensions import Dimensions, dimensionless
from ._units import si_unit
from ._value import Quantity, make


__all__ = ["grad", "jacobian", "value_and_grad"]


def _is_quantity(x: Any) -> bool:
    return isinstance(x, Quantity)


class _Numbers:
    """The differentiated arguments with their quantities replaced by their
    SI-coherent arrays, and the way back."""

    def __init__(self, args: Sequence[Any], argnums: tuple[int, ...]) -> None:
        self.args = list(args)
        self.argnums = argnums
        self.treedefs = []
        # Per differentiated argument, per leaf: its (dimensions, display unit) if
        # it is a quantity, else `None`.
        self.quantities: list[list[tuple[Dimensions, Any] | None]] = []
        self.numbers = []
        for i in argnums:
            leaves, treedef = jtu.tree_flatten(args[i], is_leaf=_is_quantity)
            self.treedefs.append(treedef)
            self.quantities.append(
                [(x.units, x.display.unit) if _is_quantity(x) else None for x in leaves]
            )
            self.numbers.append([x.array if _is_quantity(x) else x for x in leaves])

    def arguments(self, numbers: Sequence[Any]) -> list[Any]:
        """The arguments of the function, with `numbers` for the differentiated ones."""
        args = list(self.args)
        for i, treedef, kinds, leaves in zip(
            self.argnums, self.treedefs, self.quantities, numbers, strict=True
        ):
            rebuilt = [
                n if kind is None else make(n, *kind)
                for n, kind in zip(leaves, kinds, strict=True)
            ]
            args[i] = jtu.tree_unflatten(treedef, rebuilt)
        return args

    def derivatives(self, numbers: Sequence[Any], out: Dimensions) -> list[Any]:
        """Derivatives of an output with dimensions `out`, one pytree of numbers per
        differentiated argument, as quantities in units of output over input."""
        results = []
        for treedef, kinds, leaves in zip(
            self.treedefs, self.quantities, numbers, strict=True
        ):
            wrapped = []
            for d, kind in zip(leaves, kinds, strict=True):
                ratio = out if kind is None else out / kind[0]
                wrapped.append(
                    d if ratio.is_dimensionless else make(d, ratio, si_unit(ratio))
                )
            results.append(jtu.tree_unflatten(treedef, wrapped))
        return results


def _argnums(argnums: int | Sequence[int]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def _pick(argnums: int | Sequence[int], results: list[Any]) -> Any:
    return results[0] if isinstance(argnums, int) else tuple(results)


def _split_output(out: Any, has_aux: bool, name: str) -> tuple[Any, Any]:
    if not has_aux:
        return out, None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            f"quax_units.{name} with has_aux=True needs the function to return a pair "
            f"(output, aux), but it returned {type(out).__name__}."
        )
    return out


def value_and_grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    *,
    has_aux: bool = False,
) -> Callable[..., Any]:
    """Like `jax.value_and_grad`, for functions of quantities, with the gradient in
    units of output over input.

    ```python
    E = quax.quaxify(lambda m, v: 0.5 * m * jnp.sum(v**2))
    energy, p = value_and_grad(lambda v: E(Quantity(2.0, "kg"), v))(
        Quantity(jnp.array([30.0, 40.0]), "m / s")
    )
    p  # Quantity(Array([60., 80.], dtype=float32), unit='kg m / s')
    ```

    The function may return a scalar quantity or a plain scalar (dimensionless, so
    the gradient of `ustrip("J", E)` is in `1 / (m / s)`: that of the number of
    joules). The differentiated arguments may be quantities, plain arrays, or pytrees
    of them; each gradient leaf is a quantity in SI-coherent units of output over
    input (a plain array where those are dimensionless).

    **Arguments:**

    - `fun`: the function; it runs outside `quax.quaxify`, so it may call quaxified
        functions and use the Python operators of quantities.
    - `argnums`: which positional arguments to differentiate, as for `jax.grad`.
    - `has_aux`: whether `fun` returns a pair `(output, aux)`.

    **Returns:**

    A function returning `(value, gradient)` (`((value, aux), gradient)` with
    `has_aux`), where `value` is what `fun` returned.
    """
    nums = _argnums(argnums)

    @functools.wraps(fun)
    def value_and_grad_fun(*args: Any, **kwargs: Any) -> Any:
        numbers = _Numbers(args, nums)
        out_dims: list[Dimensions] = []

        def on_numbers(*diff: Any) -> tuple[Any, Any]:
            out = fun(*numbers.arguments(diff), **kwargs)
            main, aux = _split_output(out, has_aux, "value_and_grad")
            out_dims[:] = [main.units if _is_quantity(main) else dimensionless]
            scalar = main.array if _is_quantity(main) else main
            return scalar, (main, aux)

        (_, (main, aux)), grads = jax.value_and_grad(
            on_numbers, argnums=tuple(range(len(nums))), has_aux=True
        )(*numbers.numbers)
        result = _pick(argnums, numbers.derivatives(grads, out_dims[0]))
        return ((main, aux) if has_aux else main), result

    return value_and_grad_fun


def grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    *,
    has_aux: bool = False,
) -> Callable[..., Any]:
    """Like `jax.grad`, for functions of quantities, with the gradient in units of
    output over input (`jax.grad` outside `quax.quaxify` labels it with the input's
    unit). See [`quax_units.value_and_grad`][].

    **Arguments:**

    - `fun`: the function, returning a scalar quantity or plain scalar.
    - `argnums`: which positional arguments to differentiate.
    - `has_aux`: whether `fun` returns a pair `(output, aux)`.

    **Returns:**

    A function returning the gradient (`(gradient, aux)` with `has_aux`).
    """
    value_and_grad_fun = value_and_grad(fun, argnums, has_aux=has_aux)

    @functools.wraps(fun)
    def grad_fun(*args: Any, **kwargs: Any) -> Any:
        value, gradient = value_and_grad_fun(*args, **kwargs)
        return (gradient, value[1]) if has_aux else gradient

    return grad_fun


def jacobian(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    *,
    has_aux: bool = False,
) -> Callable[..., Any]:
    """Like `jax.jacobian` (reverse mode), for functions of quantities: entry
    `[i..., j...]` is in units of output over input.

    **Arguments:**

    - `fun`: the function; its output is a quantity or a plain array.
    - `argnums`: which positional arguments to differentiate.
    - `has_aux`: whether `fun` returns a pair `(output, aux)`.

    **Returns:**

    A function returning the Jacobian, of shape `output.shape + input.shape` for
    each input leaf (`(jacobian, aux)` with `has_aux`).
    """
    nums = _argnums(argnums)

    @functools.wraps(fun)
    def jacobian_fun(*args: Any, **kwargs: Any) -> Any:
        numbers = _Numbers(args, nums)
        out_dims: list[Dimensions] = []

        def on_numbers(*diff: Any) -> tuple[Any, Any]:
            out = fun(*numbers.arguments(diff), **kwargs)
            main, aux = _split_output(out, has_aux, "jacobian")
            out_dims[:] = [main.units if _is_quantity(main) else dimensionless]
            return (main.array if _is_quantity(main) else main), aux

        jac, aux = jax.jacrev(
            on_numbers, argnums=tuple(range(len(nums))), has_aux=True
        )(*numbers.numbers)
        result = _pick(argnums, numbers.derivatives(jac, out_dims[0]))
        return (result, aux) if has_aux else result

    return jacobian_fun
